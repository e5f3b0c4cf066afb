//! PodDisruptionBudgets as a drain meets them: which govern the pods a
//! drain of a node would evict, and which of those would refuse an eviction
//! now (0 disruptions allowed). Said ahead of a disruption (the preview,
//! `status.next`); the drain itself learns it from the Eviction API.

use crate::context::Context;
use crate::crd::next::NextNode;
use crate::k8s::drain::{PodAction, classify};
use crate::k8s::node::selector_matches;
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A PodDisruptionBudget as a drain meets it (policy/v1, or v1beta1 on an
/// apiserver older than 1.21: same fields).
pub struct Budget {
    namespace: String,
    name: String,
    selector: LabelSelector,
    allowed: i64,
}

/// Every budget of the cluster (read from the watch cache).
pub async fn list(ctx: &Context) -> Result<Vec<Budget>> {
    let mut last = None;
    for version in ["v1", "v1beta1"] {
        let gvk = GroupVersionKind::gvk("policy", version, "PodDisruptionBudget");
        let api: Api<DynamicObject> =
            Api::all_with(ctx.client.clone(), &ApiResource::from_gvk(&gvk));
        match api.list(&ListParams::default().match_any()).await {
            Ok(list) => return Ok(list.items.iter().filter_map(budget_of).collect()),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(Error::kube("list PodDisruptionBudgets")(e)),
        None => Ok(vec![]),
    }
}

fn budget_of(o: &DynamicObject) -> Option<Budget> {
    let selector = serde_json::from_value(o.data.get("spec")?.get("selector")?.clone()).ok()?;
    let allowed = o
        .data
        .get("status")
        .and_then(|s| s.get("disruptionsAllowed"))
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0);
    Some(Budget {
        namespace: o.namespace().unwrap_or_default(),
        name: o.name_any(),
        selector,
        allowed,
    })
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MovedPod {
    /// namespace/name.
    pub pod: String,
    /// Kind/name of its controller; none: nothing recreates it.
    pub owner: Option<String>,
    /// namespace/name of each PodDisruptionBudget that governs it, with the
    /// disruptions it allows now (0: an eviction would be refused now).
    pub budgets: Vec<(String, i64)>,
}

/// The pods a drain of `node` would evict, with their owners and budgets.
pub fn moved_pods(node: &str, pods: &[Pod], budgets: &[Budget]) -> Vec<MovedPod> {
    pods.iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| matches!(classify(p), PodAction::Evict))
        .map(|p| {
            let namespace = p.namespace().unwrap_or_default();
            let owner = p
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| format!("{}/{}", o.kind, o.name));
            let budgets = budgets
                .iter()
                .filter(|b| b.namespace == namespace && selector_matches(&b.selector, p.labels()))
                .map(|b| (format!("{}/{}", b.namespace, b.name), b.allowed))
                .collect();
            MovedPod {
                pod: format!("{namespace}/{}", p.name_any()),
                owner,
                budgets,
            }
        })
        .collect()
}

/// The budgets that would refuse an eviction of one of `pods` now, each
/// once, in one line; None: none would.
pub fn refusing(pods: &[MovedPod]) -> Option<String> {
    let refusing: BTreeSet<String> = pods
        .iter()
        .flat_map(|p| &p.budgets)
        .filter(|(_, allowed)| *allowed == 0)
        .map(|(budget, _)| format!("pdb {budget} allows 0 disruptions now"))
        .collect();
    (!refusing.is_empty()).then(|| refusing.into_iter().collect::<Vec<_>>().join("; "))
}

/// Of the nodes `names`, those a budget would hold now, with which.
pub fn holds(
    names: &BTreeSet<String>,
    pods: &[Pod],
    budgets: &[Budget],
) -> BTreeMap<String, String> {
    names
        .iter()
        .filter_map(|n| Some((n.clone(), refusing(&moved_pods(n, pods, budgets))?)))
        .collect()
}

/// A node a budget would hold now says so after what else holds it (the
/// drain would wait on it, up to `drainTimeout`).
pub fn mark(node: &mut NextNode, held: Option<&String>) {
    let Some(held) = held else {
        return;
    };
    node.blocked_by = Some(match node.blocked_by.take() {
        Some(other) => format!("{other}; {held}"),
        None => held.clone(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pod(name: &str, node: &str, app: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some([("app".to_string(), app.to_string())].into()),
                owner_references: Some(vec![OwnerReference {
                    kind: "ReplicaSet".into(),
                    name: format!("{app}-rs"),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn budget(name: &str, app: &str, allowed: i64) -> Budget {
        Budget {
            namespace: "default".into(),
            name: name.into(),
            selector: LabelSelector {
                match_labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            },
            allowed,
        }
    }

    #[test]
    fn a_node_is_held_only_by_a_budget_at_zero_that_governs_one_of_its_pods() {
        let pods = [pod("web-1", "n1", "web"), pod("db-0", "n2", "db")];
        let budgets = [budget("web", "web", 0), budget("db", "db", 1)];
        let names: BTreeSet<String> = ["n1", "n2", "n3"].map(String::from).into();
        let held = holds(&names, &pods, &budgets);
        assert_eq!(
            held,
            BTreeMap::from([(
                "n1".to_string(),
                "pdb default/web allows 0 disruptions now".to_string()
            )])
        );
        let moved = moved_pods("n2", &pods, &budgets);
        assert_eq!(moved[0].owner.as_deref(), Some("ReplicaSet/db-rs"));
        assert_eq!(moved[0].budgets, vec![("default/db".to_string(), 1)]);
        let mut node = NextNode {
            node: "n1".into(),
            blocked_by: Some("protected".into()),
            ..Default::default()
        };
        mark(&mut node, held.get("n1"));
        assert_eq!(
            node.blocked_by.as_deref(),
            Some("protected; pdb default/web allows 0 disruptions now")
        );
    }
}
