//! kops's control plane on a master node: the static kube-apiserver and
//! etcd-manager pods (mirror pods in kube-system, labelled `k8s-app`). A
//! replaced master is only back once they are Ready. Where no master of
//! the cluster shows any such pod (pods labelled otherwise, a cluster not
//! made by kops), masters are counted by Node Ready instead, and the
//! count says so ([`CountedBy::Nodes`]): never a silent stop.

use crate::context::Context;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use std::collections::{BTreeMap, BTreeSet};

/// The nodes whose control plane is Ready, each with since when: the
/// latest of its control-plane pods' Ready transitions (etcd has joined
/// by then; a settle time counts from it). A pod that does not say when
/// counts as Ready for long ([`DateTime::MIN_UTC`]).
pub type Serving = BTreeMap<String, DateTime<Utc>>;

pub const NAMESPACE: &str = "kube-system";
pub const APP_LABEL: &str = "k8s-app";
/// Every master runs these; `etcd-manager-events` too when present.
pub const REQUIRED_APPS: [&str; 2] = ["kube-apiserver", "etcd-manager-main"];
pub const OPTIONAL_APPS: [&str; 1] = ["etcd-manager-events"];

/// How the masters' control planes were counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CountedBy {
    /// By kops's control-plane pods (etcd-manager, kube-apiserver).
    #[default]
    Pods,
    /// By Node Ready: no master of the cluster shows a control-plane pod.
    Nodes,
}

/// The control planes of `masters` (Node names: every master of the
/// cluster): serving by their control-plane pods, or, where none of them
/// shows any, by Node Ready (each since its Ready condition turned: a
/// settle time counts from it).
pub async fn observe(ctx: &Context, masters: &BTreeSet<String>) -> Result<(Serving, CountedBy)> {
    let pods = list_pods(ctx).await?;
    if masters.is_empty() || shows_pods(&pods, masters) {
        return Ok((ready_since(&pods), CountedBy::Pods));
    }
    let api = Api::<Node>::all(ctx.client.clone());
    let mut nodes = vec![];
    for name in masters {
        if let Some(node) = api
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("get master node {name}")))?
        {
            nodes.push(node);
        }
    }
    Ok((ready_by_node(&nodes), CountedBy::Nodes))
}

/// Pure: whether any of `masters` runs a control-plane pod, Ready or not.
pub fn shows_pods(pods: &[Pod], masters: &BTreeSet<String>) -> bool {
    pods.iter().any(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some_and(|n| masters.contains(n))
    })
}

/// Pure: the Ready nodes, each since its Ready condition last turned (a
/// Node that does not say when counts from the earliest time).
pub fn ready_by_node(nodes: &[Node]) -> Serving {
    nodes
        .iter()
        .filter(|n| super::node::is_ready(n))
        .filter_map(|n| {
            let since = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .and_then(|c| c.last_transition_time.as_ref())
                .and_then(|t| super::node::time_of(&t.0));
            Some((
                n.metadata.name.clone()?,
                since.unwrap_or(DateTime::<Utc>::MIN_UTC),
            ))
        })
        .collect()
}

/// A Node labelled as kops labels its masters, as the masters' rule
/// cross-checks the Master groups' count against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterNode {
    pub name: String,
    /// From its providerID (None: it does not say).
    pub instance: Option<String>,
    pub ready: bool,
}

/// The cluster's Nodes labelled `node-role.kubernetes.io/control-plane` or
/// `node-role.kubernetes.io/master` (kops's two labels for a master,
/// `crd::labels`), narrowed by the `controlPlane.nodeSelector` setting.
pub async fn master_nodes(ctx: &Context) -> Result<Vec<MasterNode>> {
    use crate::crd::labels::{CONTROL_PLANE_LABEL, LEGACY_MASTER_LABEL};
    use crate::k8s::node::NodeView;
    let api = Api::<Node>::all(ctx.client.clone());
    let extra = ctx.settings.control_plane_node_selector.as_deref();
    let mut found: BTreeMap<String, MasterNode> = BTreeMap::new();
    for label in [CONTROL_PLANE_LABEL, LEGACY_MASTER_LABEL] {
        let selector = match extra {
            Some(extra) => format!("{label},{extra}"),
            None => label.to_string(),
        };
        let nodes = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube(format!(
                "list control-plane Nodes ({selector})"
            )))?;
        for node in nodes.items {
            let name = node.node_name().to_string();
            let seen = MasterNode {
                instance: node.instance_id(),
                ready: node.ready(),
                name: name.clone(),
            };
            found.insert(name, seen);
        }
    }
    Ok(found.into_values().collect())
}

/// kops's control-plane pods of every master.
pub async fn list_pods(ctx: &Context) -> Result<Vec<Pod>> {
    let apps: Vec<&str> = REQUIRED_APPS
        .iter()
        .chain(&OPTIONAL_APPS)
        .copied()
        .collect();
    let selector = format!("{APP_LABEL} in ({})", apps.join(","));
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube("list control-plane pods"))?;
    Ok(pods.items)
}

/// Not being deleted, and its Ready condition True.
pub fn is_pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When its Ready condition last turned (None: not said).
fn ready_transition(pod: &Pod) -> Option<DateTime<Utc>> {
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    super::node::time_of(&condition.last_transition_time.as_ref()?.0)
}

/// Pure: nodes with every required app's pod, and every control-plane pod
/// on them, Ready.
pub fn nodes_with_ready_control_plane(pods: &[Pod]) -> BTreeSet<String> {
    ready_since(pods).into_keys().collect()
}

/// Pure: [`nodes_with_ready_control_plane`], each with since when.
pub fn ready_since(pods: &[Pod]) -> Serving {
    // Each node's control-plane pods: (app, Ready, since when).
    type Seen<'a> = Vec<(&'a str, bool, Option<DateTime<Utc>>)>;
    let mut by_node: BTreeMap<&str, Seen> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        let Some(app) = pod.metadata.labels.as_ref().and_then(|l| l.get(APP_LABEL)) else {
            continue;
        };
        by_node.entry(node).or_default().push((
            app.as_str(),
            is_pod_ready(pod),
            ready_transition(pod),
        ));
    }
    by_node
        .into_iter()
        .filter(|(_, pods)| {
            pods.iter().all(|(_, ready, _)| *ready)
                && REQUIRED_APPS
                    .iter()
                    .all(|app| pods.iter().any(|(a, _, _)| a == app))
        })
        .map(|(node, pods)| {
            let since = pods.iter().filter_map(|(_, _, at)| *at).max();
            (node.to_string(), since.unwrap_or(DateTime::<Utc>::MIN_UTC))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use kube::api::ObjectMeta;

    fn pod(app: &str, node: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("{app}-{node}")),
                labels: Some([(APP_LABEL.to_string(), app.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn masters_without_control_plane_pods_are_counted_by_node_ready_since_its_turn() {
        let pods = [pod("kube-apiserver", "elsewhere", true)];
        let masters: BTreeSet<String> = ["m1".to_string(), "m2".to_string()].into();
        assert!(!shows_pods(&pods, &masters), "another cluster's pod");
        assert!(shows_pods(
            &[pod("etcd-manager-main", "m2", false)],
            &masters
        ));
        let node = |name: &str, ready: &str, at: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": at}]}
            }))
            .expect("node")
        };
        let serving = ready_by_node(&[
            node("m1", "True", "2026-06-01T12:00:00Z"),
            node("m2", "False", "2026-06-01T12:05:00Z"),
        ]);
        let at = "2026-06-01T12:00:00Z"
            .parse::<DateTime<Utc>>()
            .expect("time");
        assert_eq!(serving, Serving::from([("m1".to_string(), at)]));
    }

    #[test]
    fn a_node_counts_once_every_control_plane_pod_on_it_is_ready() {
        let pods = [
            pod("kube-apiserver", "m1", true),
            pod("etcd-manager-main", "m1", true),
            pod("etcd-manager-events", "m1", true),
            // Not Ready yet.
            pod("kube-apiserver", "m2", true),
            pod("etcd-manager-main", "m2", false),
            // etcd-manager missing.
            pod("kube-apiserver", "m3", true),
            // An optional pod not Ready holds the node back too.
            pod("kube-apiserver", "m4", true),
            pod("etcd-manager-main", "m4", true),
            pod("etcd-manager-events", "m4", false),
        ];
        assert_eq!(
            nodes_with_ready_control_plane(&pods),
            BTreeSet::from(["m1".to_string()])
        );
    }
}
