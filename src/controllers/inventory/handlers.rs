//! Another termination handler in the cluster: the
//! `OtherTerminationHandler` condition. kops runs aws-node-termination-
//! handler on AWS by default (a Deployment in queue mode, or a DaemonSet
//! reading the instance metadata): it answers the same spot warnings,
//! rebalance recommendations and lifecycle actions, and cordons and drains
//! the same nodes a second time, without this manager's rules. Found by
//! its labels (kops's manifest and the Helm chart set both), listed at most
//! once a minute for every group; nothing of it is changed.

use crate::crd::condition::{ConditionStatus, OTHER_TERMINATION_HANDLER, set_condition};
use crate::crd::{NodeGroup, NodeGroupStatus};
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::warn;

/// Its name, and the value of the labels it is found by.
pub const NTH: &str = "aws-node-termination-handler";
const LABELS: [&str; 2] = ["app.kubernetes.io/name", "k8s-app"];
/// How long one listing serves every group.
pub const FRESH: Duration = Duration::from_secs(60);

/// What a listing of other controllers' workloads last found, shared by
/// every group's reconcile and made again at most once a minute: another
/// termination handler here, a cluster-autoscaler (`autoscalers`).
pub struct Listed<T>(tokio::sync::Mutex<Option<(Instant, Arc<T>)>>);

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Listed(tokio::sync::Mutex::new(None))
    }
}

impl<T> Listed<T> {
    /// What was found, listed by `list` when the last listing is older
    /// than a minute; None while it cannot be listed (`what`: for the
    /// warning), and the conditions then stay as they were.
    pub async fn get(
        &self,
        list: impl std::future::Future<Output = Result<T, kube::Error>>,
        what: &str,
    ) -> Option<Arc<T>> {
        let mut cached = self.0.lock().await;
        if let Some((at, found)) = cached.as_ref()
            && at.elapsed() < FRESH
        {
            return Some(found.clone());
        }
        match list.await {
            Ok(found) => {
                let found = Arc::new(found);
                *cached = Some((Instant::now(), found.clone()));
                Some(found)
            }
            Err(e) => {
                warn!(error = %e, "cannot list {what}");
                None
            }
        }
    }
}

/// The running handlers, each described, in the whole cluster or only in
/// namespace `scope`.
pub async fn handlers(
    seen: &Listed<Vec<String>>,
    client: &kube::Client,
    scope: Option<&str>,
) -> Option<Arc<Vec<String>>> {
    let what = "Deployments and DaemonSets to find another termination handler (RBAC: list on apps deployments, daemonsets)";
    seen.get(list(client, scope), what).await
}

/// Where another controller's workloads are listed: the whole cluster, or
/// namespace `scope`.
pub fn api<K>(client: &kube::Client, scope: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match scope {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Listed now, without the cache (`check`).
pub async fn list(client: &kube::Client, scope: Option<&str>) -> Result<Vec<String>, kube::Error> {
    let (mut deployments, mut daemon_sets) = (vec![], vec![]);
    for label in LABELS {
        let params = ListParams::default().labels(&format!("{label}={NTH}"));
        deployments.extend(api::<Deployment>(client, scope).list(&params).await?.items);
        daemon_sets.extend(api::<DaemonSet>(client, scope).list(&params).await?.items);
    }
    Ok(running(&deployments, &daemon_sets))
}

/// Pure: the handlers that run (a Deployment scaled to 0, or a DaemonSet
/// that schedules no pod, does not), each once, as "<Kind> ns/name (mode)".
pub fn running(deployments: &[Deployment], daemon_sets: &[DaemonSet]) -> Vec<String> {
    let mut found: Vec<String> = deployments
        .iter()
        .filter(|d| d.spec.as_ref().and_then(|s| s.replicas) != Some(0))
        .map(|d| format!("Deployment {} (queue mode)", named(d)))
        .chain(
            daemon_sets
                .iter()
                .filter(|d| {
                    d.status
                        .as_ref()
                        .is_none_or(|s| s.desired_number_scheduled > 0)
                })
                .map(|d| format!("DaemonSet {} (instance metadata mode)", named(d))),
        )
        .collect();
    found.sort();
    found.dedup();
    found
}

/// "namespace/name".
fn named<K: ResourceExt>(o: &K) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

/// Pure: the condition's (status, reason, message), from the handlers
/// running and the group's terminate hooks nothing of ours completes
/// (`hooks::uncompleted`). A running handler is named first: its hooks are
/// its own.
pub fn condition(found: &[String], hooks: &[String]) -> (ConditionStatus, &'static str, String) {
    if found.is_empty() && !hooks.is_empty() {
        return (
            ConditionStatus::True,
            "UncompletedLifecycleHook",
            hooks.join("; "),
        );
    }
    if found.is_empty() {
        return (
            ConditionStatus::False,
            "None",
            format!(
                "no {NTH} runs in the cluster, and no terminate lifecycle hook of the group's ASGs waits on anything but the manager"
            ),
        );
    }
    (
        ConditionStatus::True,
        "OtherHandlerRunning",
        format!(
            "{NTH} runs in the cluster ({}): it answers the same spot warnings, rebalance recommendations and lifecycle actions and cordons and drains the same nodes a second time, without this manager's rules (windows, do-not-disrupt, the masters' rule); kops runs it by default on AWS: turn it off in the cluster spec (spec.nodeTerminationHandler.enabled: false; kops edit cluster, then kops update cluster --yes), then delete what kops leaves running ({}; kubectl delete clusterrole,clusterrolebinding {NTH} --ignore-not-found); docs/kops.md says what else it leaves (its queue, rules and lifecycle hooks)",
            found.join(", "),
            delete_commands(found).join("; ")
        ),
    )
}

/// The command that deletes each handler found ("<Kind> ns/name (...)")
/// and what kops's manifest makes beside it in its namespace, as
/// docs/kops.md gives it.
fn delete_commands(found: &[String]) -> Vec<String> {
    let mut commands: Vec<String> = found
        .iter()
        .filter_map(|f| {
            let (ns, name) = f.split_whitespace().nth(1)?.split_once('/')?;
            Some(format!(
                "kubectl -n {ns} delete deployment,daemonset,poddisruptionbudget,serviceaccount {name} --ignore-not-found"
            ))
        })
        .collect();
    commands.dedup();
    commands
}

/// Sets the condition on `status` from `found` and `hooks` (None: not
/// known now; the condition stays as it was, unless a running handler says
/// enough without the hooks).
pub fn set_handlers(
    group: &NodeGroup,
    found: Option<&[String]>,
    hooks: Option<&[String]>,
    status: &mut NodeGroupStatus,
    now: DateTime<Utc>,
) {
    let (value, reason, message) = match (found, hooks) {
        (Some(found), _) if !found.is_empty() => condition(found, &[]),
        (Some(found), Some(hooks)) => condition(found, hooks),
        _ => return,
    };
    set_condition(
        &mut status.conditions,
        OTHER_TERMINATION_HANDLER,
        value,
        reason,
        message,
        group.metadata.generation,
        now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(ns: &str, replicas: Option<i32>) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": NTH, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {}, "template": {}},
        }))
        .expect("deployment")
    }

    fn daemon_set(ns: &str, desired: Option<i32>) -> DaemonSet {
        let mut d: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": NTH, "namespace": ns},
        }))
        .expect("daemon set");
        if let Some(n) = desired {
            d.status = Some(
                serde_json::from_value(serde_json::json!({
                    "currentNumberScheduled": n, "desiredNumberScheduled": n,
                    "numberMisscheduled": 0, "numberReady": n,
                }))
                .expect("status"),
            );
        }
        d
    }

    #[test]
    fn a_running_handler_is_named_once_with_its_mode_and_what_to_do() {
        // Found by both labels: named once.
        let d = deployment("kube-system", Some(1));
        let found = running(&[d.clone(), d], &[daemon_set("nth", Some(3))]);
        assert_eq!(
            found,
            vec![
                "DaemonSet nth/aws-node-termination-handler (instance metadata mode)".to_string(),
                "Deployment kube-system/aws-node-termination-handler (queue mode)".to_string(),
            ]
        );
        let (value, reason, message) = condition(&found, &["a hook".to_string()]);
        assert_eq!(
            (value, reason),
            (ConditionStatus::True, "OtherHandlerRunning")
        );
        for said in [
            "Deployment kube-system/aws-node-termination-handler (queue mode)",
            "a second time",
            "spec.nodeTerminationHandler.enabled: false",
        ] {
            assert!(message.contains(said), "{said}: {message}");
        }
    }

    /// Issue 69: the condition gives the guide's commands for what kops
    /// leaves running once its handler is turned off, for each handler
    /// found, word for word. kops lists the addon in its channel only
    /// while it is enabled and prunes nothing of an addon it no longer
    /// lists (upup/pkg/fi/cloudup/bootstrapchannelbuilder/
    /// bootstrapchannelbuilder.go, read at 268927e2); its manifest names
    /// every object aws-node-termination-handler, in kube-system
    /// (upup/models/cloudup/resources/addons/node-termination-handler.aws/
    /// k8s-1.11.yaml.template, same commit).
    #[test]
    fn the_message_gives_the_guides_commands_to_delete_what_kops_leaves() {
        let guide = include_str!("../../../docs/kops.md");
        let found = running(&[deployment("kube-system", Some(1))], &[]);
        let (_, _, message) = condition(&found, &[]);
        for command in [
            "kubectl -n kube-system delete deployment,daemonset,poddisruptionbudget,serviceaccount aws-node-termination-handler --ignore-not-found",
            "kubectl delete clusterrole,clusterrolebinding aws-node-termination-handler --ignore-not-found",
        ] {
            assert!(guide.contains(command), "not in docs/kops.md: {command}");
            assert!(message.contains(command), "{command}: {message}");
        }
        // A handler elsewhere: the command names its namespace.
        let found = running(&[], &[daemon_set("nth", Some(3))]);
        let (_, _, message) = condition(&found, &[]);
        assert!(
            message.contains("kubectl -n nth delete deployment,daemonset"),
            "{message}"
        );
    }

    #[test]
    fn a_handler_scaled_to_nothing_is_not_running() {
        let found = running(
            &[deployment("kube-system", Some(0))],
            &[daemon_set("x", Some(0))],
        );
        assert_eq!(found, Vec::<String>::new());
        assert_eq!(condition(&found, &[]).0, ConditionStatus::False);
        // With no handler, a hook nothing completes is the reason.
        let (value, reason, message) = condition(&found, &["nodes-a has ...".to_string()]);
        assert_eq!(
            (value, reason, message.as_str()),
            (
                ConditionStatus::True,
                "UncompletedLifecycleHook",
                "nodes-a has ..."
            )
        );
        // A Deployment that does not say its replicas runs one.
        assert_eq!(running(&[deployment("a", None)], &[]).len(), 1);
    }

    #[test]
    fn not_known_leaves_the_condition_as_it_was() {
        let group = NodeGroup::new(
            "g",
            serde_json::from_value(serde_json::json!(
                {"role": "Worker", "autoScalingGroups": [{"name": "a"}], "desired": 1}
            ))
            .expect("spec"),
        );
        let mut status = NodeGroupStatus::default();
        let now = Utc::now();
        set_handlers(
            &group,
            Some(&["Deployment a/b (queue mode)".to_string()]),
            None,
            &mut status,
            now,
        );
        assert_eq!(status.conditions.len(), 1, "a handler says enough");
        let before = status.clone();
        set_handlers(&group, None, None, &mut status, now);
        assert_eq!(status, before);
        // No handler, the hooks not known: nothing said.
        set_handlers(&group, Some(&[]), None, &mut status, now);
        assert_eq!(status, before);
    }
}
