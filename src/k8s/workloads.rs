//! The workloads a drain moves, and whether they are back: a refresh
//! records the controllers of the pods on a node before it evicts any, and
//! after the node's replacement waits until none of their pods is Pending
//! or not Ready (the evicted pods came back, on other nodes).

use crate::context::Context;
use crate::k8s::control_plane::is_pod_ready;
use crate::k8s::drain::{PodAction, cached_pods_on, classify};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use std::collections::{BTreeMap, BTreeSet};

/// `<namespace>/<Kind>/<name>` of the pod's controller, if it has one (a
/// pod without one is not recreated: nothing to wait for).
pub fn controller_of(pod: &Pod) -> Option<String> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))?;
    Some(format!(
        "{}/{}/{}",
        pod.namespace().unwrap_or_default(),
        owner.kind,
        owner.name
    ))
}

/// Pure: the controllers of the pods a drain of these pods moves (evicted,
/// or already terminating), each once, sorted.
pub fn moved_by_drain(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter(|p| !matches!(classify(p), PodAction::Skip(_)))
        .filter_map(controller_of)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Pure: of `workloads`, those with a pod (not being deleted) that is
/// Pending or not Ready, with how many. A finished pod does not count.
pub fn unsettled(workloads: &[String], pods: &[Pod]) -> BTreeMap<String, String> {
    let mut waiting: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(key) = controller_of(pod).filter(|k| workloads.contains(k)) else {
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let counts = waiting.entry(key).or_default();
        match phase {
            Some("Succeeded") | Some("Failed") => {}
            Some("Pending") | None => counts.0 += 1,
            _ if !is_pod_ready(pod) => counts.1 += 1,
            _ => {}
        }
    }
    waiting
        .into_iter()
        .filter(|(_, (pending, not_ready))| pending + not_ready > 0)
        .map(|(key, (pending, not_ready))| {
            (
                key,
                format!("{pending} pod(s) Pending, {not_ready} not Ready"),
            )
        })
        .collect()
}

/// The controllers of the pods a drain of `node` would move now (from the
/// watch cache: a controller seen a moment late is recorded at the next
/// drain step, before its pod is evicted).
pub async fn on_node(ctx: &Context, node: &str) -> Result<Vec<String>> {
    Ok(moved_by_drain(&cached_pods_on(ctx, node).await?))
}

/// Of `workloads`, those whose pods are not all back (Pending or not Ready),
/// read from the watch cache of their namespaces.
pub async fn observe_unsettled(
    ctx: &Context,
    workloads: &[String],
) -> Result<BTreeMap<String, String>> {
    let namespaces: BTreeSet<&str> = workloads
        .iter()
        .filter_map(|w| w.split('/').next())
        .collect();
    let mut pods = vec![];
    for namespace in namespaces {
        pods.extend(
            Api::<Pod>::namespaced(ctx.client.clone(), namespace)
                .list(&ListParams::default().match_any())
                .await
                .map_err(Error::kube(format!("list pods in {namespace}")))?
                .items,
        );
    }
    Ok(unsettled(workloads, &pods))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, owner: Option<&str>, phase: Option<&str>, ready: bool) -> Pod {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1"},
        }))
        .expect("pod");
        if let Some(owner) = owner {
            pod.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "ReplicaSet".into(),
                    name: owner.into(),
                    uid: "u".into(),
                    controller: Some(true),
                    ..Default::default()
                },
            ]);
        }
        if let Some(phase) = phase {
            pod.status = Some(serde_json::from_value(serde_json::json!({
                "phase": phase,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            })).expect("status"));
        }
        pod
    }

    #[test]
    fn a_drain_moves_the_controllers_of_its_pods_once_each() {
        let pods = [
            pod("web-1", Some("web"), Some("Running"), true),
            pod("web-2", Some("web"), Some("Running"), true),
            pod("bare", None, Some("Running"), true),
        ];
        assert_eq!(moved_by_drain(&pods), ["team/ReplicaSet/web"]);
    }

    #[test]
    fn a_workload_is_unsettled_while_one_of_its_pods_is_pending_or_not_ready() {
        let workloads = vec![
            "team/ReplicaSet/web".to_string(),
            "team/ReplicaSet/db".to_string(),
        ];
        let pods = [
            pod("web-1", Some("web"), Some("Running"), true),
            pod("web-2", Some("web"), Some("Pending"), false),
            pod("db-1", Some("db"), Some("Running"), false),
            pod("other", Some("other"), Some("Pending"), false),
        ];
        let waiting = unsettled(&workloads, &pods);
        assert_eq!(waiting.len(), 2, "{waiting:?}");
        assert_eq!(
            waiting["team/ReplicaSet/web"],
            "1 pod(s) Pending, 0 not Ready"
        );
        assert_eq!(
            waiting["team/ReplicaSet/db"],
            "0 pod(s) Pending, 1 not Ready"
        );
        let back = [
            pod("web-1", Some("web"), Some("Running"), true),
            pod("db-1", Some("db"), Some("Running"), true),
            pod("done", Some("db"), Some("Succeeded"), false),
        ];
        assert!(unsettled(&workloads, &back).is_empty());
    }
}
