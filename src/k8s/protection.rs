//! Which nodes voluntary disruption must not take, and why: a Node or one of
//! its pods annotated `nodemanager.dev/do-not-disrupt: "true"`, a cordon
//! someone else placed, or (unless `evictUnmanagedPods`) a pod no controller
//! would recreate, as `kubectl drain` without `--force` refuses.

use crate::context::Context;
use crate::crd::labels::{CORDONED_BY_US, INTERRUPTION_ANNOTATION};
use crate::crd::nodegroup::DO_NOT_DISRUPT;
use crate::k8s::drain::{PodAction, classify};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use std::collections::{BTreeMap, BTreeSet};

fn annotated(annotations: &BTreeMap<String, String>) -> bool {
    annotations.get(DO_NOT_DISRUPT).is_some_and(|v| v == "true")
}

/// Pure: of the nodes `names`, those protected, with the reason.
pub fn protected_nodes(
    names: &BTreeSet<String>,
    nodes: &[Node],
    pods: &[Pod],
    evict_unmanaged_pods: bool,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for node in nodes.iter().filter(|n| names.contains(&n.name_any())) {
        let name = node.name_any();
        let annotations = node.annotations();
        if annotated(annotations) {
            out.insert(name, format!("the Node is annotated {DO_NOT_DISRUPT}"));
            continue;
        }
        let cordoned = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let ours = annotations.contains_key(CORDONED_BY_US)
            || annotations.contains_key(INTERRUPTION_ANNOTATION);
        if cordoned && !ours {
            out.insert(name, "cordoned by someone else".into());
        }
    }
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
            continue;
        };
        if !names.contains(node) || out.contains_key(node) || classify(pod) != PodAction::Evict {
            continue;
        }
        let label = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        if annotated(pod.annotations()) {
            out.insert(
                node.clone(),
                format!("pod {label} is annotated {DO_NOT_DISRUPT}"),
            );
        } else if !evict_unmanaged_pods
            && !pod
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true))
        {
            out.insert(
                node.clone(),
                format!(
                    "pod {label} has no controller: nothing would recreate it (spec.disruption.evictUnmanagedPods)"
                ),
            );
        }
    }
    out
}

/// Of the nodes `names`: those protected now, and (`with_budgets`: for a
/// preview) those a PodDisruptionBudget would hold now (Nodes, pods and
/// budgets read from the apiserver's watch cache: a protection seen a
/// moment late only delays the run's next pick, which looks again).
pub async fn observe(
    ctx: &Context,
    names: &BTreeSet<String>,
    evict_unmanaged_pods: bool,
    with_budgets: bool,
) -> Result<Protections> {
    if names.is_empty() {
        return Ok(Protections::default());
    }
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default().match_any())
        .await
        .map_err(Error::kube("list nodes for do-not-disrupt"))?
        .items;
    let pods = Api::<Pod>::all(ctx.client.clone())
        .list(&ListParams::default().match_any())
        .await
        .map_err(Error::kube("list pods for do-not-disrupt"))?
        .items;
    let held_by_budgets = match with_budgets {
        true => crate::k8s::budgets::holds(names, &pods, &crate::k8s::budgets::list(ctx).await?),
        false => BTreeMap::new(),
    };
    Ok(Protections {
        protected: protected_nodes(names, &nodes, &pods, evict_unmanaged_pods),
        held_by_budgets,
    })
}

/// What [`observe`] found.
#[derive(Debug, Clone, Default)]
pub struct Protections {
    /// Protected from voluntary disruption, with why.
    pub protected: BTreeMap<String, String>,
    /// Held now by a budget at 0 (a drain would wait), with which.
    pub held_by_budgets: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, annotations: &[(&str, &str)], cordoned: bool) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "spec": {"unschedulable": cordoned},
        }))
        .expect("node")
    }

    fn pod(name: &str, node: &str, annotations: &[(&str, &str)], controlled: bool) -> Pod {
        let owners = match controlled {
            true => {
                serde_json::json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}])
            }
            false => serde_json::json!([]),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "app", "ownerReferences": owners,
                         "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running"},
        }))
        .expect("pod")
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_kind_of_protection_is_found_with_its_reason() {
        let nodes = [
            node("annotated", &[(DO_NOT_DISRUPT, "true")], false),
            node("theirs", &[], true),
            node("ours", &[(CORDONED_BY_US, "refresh")], true),
            node("pod-annotated", &[], false),
            node("bare-pod", &[], false),
            node("plain", &[], false),
            node("other-group", &[(DO_NOT_DISRUPT, "true")], false),
        ];
        let pods = [
            pod("keep", "pod-annotated", &[(DO_NOT_DISRUPT, "true")], true),
            pod("bare", "bare-pod", &[], false),
            pod("web", "plain", &[], true),
            pod("web2", "ours", &[], true),
        ];
        let group = names(&[
            "annotated",
            "theirs",
            "ours",
            "pod-annotated",
            "bare-pod",
            "plain",
        ]);
        let found = protected_nodes(&group, &nodes, &pods, false);
        let keys: Vec<&str> = found.keys().map(String::as_str).collect();
        assert_eq!(keys, ["annotated", "bare-pod", "pod-annotated", "theirs"]);
        assert!(found["theirs"].contains("someone else"));
        assert!(found["pod-annotated"].contains("pod app/keep"));
        assert!(found["bare-pod"].contains("no controller"));
        // With evictUnmanagedPods, a bare pod protects nothing.
        let found = protected_nodes(&group, &nodes, &pods, true);
        assert!(!found.contains_key("bare-pod"));
    }

    #[test]
    fn a_false_annotation_and_finished_pods_protect_nothing() {
        let nodes = [node("n", &[(DO_NOT_DISRUPT, "false")], false)];
        let mut done = pod("job", "n", &[(DO_NOT_DISRUPT, "true")], false);
        if let Some(s) = done.status.as_mut() {
            s.phase = Some("Succeeded".into());
        }
        assert!(protected_nodes(&names(&["n"]), &nodes, &[done], false).is_empty());
    }
}
