//! The manager's own pod on a node it drains (a masters' refresh, a master
//! interrupted): every other pod goes first, then leadership goes to a
//! standby replica, which takes over at once and evicts our pod like any
//! other. Evicted while leading, we would stop mid-drain and everything
//! would wait for our lease to expire; with no standby to hand over to,
//! our pod is evicted last and the lease released at shutdown.

pub use crate::config::OwnPod;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Where our pod stands in a drain step of the node it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Not on this node, or terminating already: nothing to order.
    NotHere,
    /// Other pods still to move: ours waits, and goes last.
    Last,
    /// Only ours is left.
    Alone,
}

/// Pure: our pod's turn among the `pods` on the node being drained;
/// `to_move`: a pod the drain must move (evict, or wait for).
pub fn turn(pods: &[Pod], own: &OwnPod, to_move: impl Fn(&Pod) -> bool) -> Turn {
    let Some(ours) = pods.iter().find(|p| own.is(p)) else {
        return Turn::NotHere;
    };
    if !to_move(ours) || ours.metadata.deletion_timestamp.is_some() {
        return Turn::NotHere;
    }
    let others = pods.iter().filter(|p| !own.is(p)).any(to_move);
    match others {
        true => Turn::Last,
        false => Turn::Alone,
    }
}

/// The labels that select our replicas: our pod's, but the hash a
/// Deployment's rollout adds (a standby of the previous rollout is one too).
pub fn replica_selector(ours: &Pod) -> Option<String> {
    let labels: Vec<String> = ours
        .labels()
        .iter()
        .filter(|(k, _)| k.as_str() != "pod-template-hash")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    (!labels.is_empty()).then(|| labels.join(","))
}

/// Pure: a standby among `replicas` (pods with our labels in our
/// namespace): not ours, Ready, not terminating, and not on `node`.
pub fn standby<'a>(replicas: &'a [Pod], own: &OwnPod, node: &str) -> Option<&'a Pod> {
    replicas.iter().find(|p| {
        let status = p.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let elsewhere = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node);
        !own.is(p) && ready && elsewhere && p.metadata.deletion_timestamp.is_none()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::drain::{PodAction, classify};
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use std::collections::BTreeMap;

    fn own() -> OwnPod {
        OwnPod {
            namespace: "spot-node-manager".into(),
            name: "snm-a".into(),
        }
    }

    fn pod(ns: &str, name: &str, node: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    (
                        "app.kubernetes.io/name".to_string(),
                        "spot-node-manager".to_string(),
                    ),
                    ("pod-template-hash".to_string(), "abc".to_string()),
                ])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn moves(p: &Pod) -> bool {
        !matches!(classify(p), PodAction::Skip(_))
    }

    fn daemon(name: &str) -> Pod {
        let mut p = pod("kube-system", name, "m-1", true);
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            name: "ds".into(),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn our_pod_goes_after_every_other_pod_that_must_move() {
        let ours = pod("spot-node-manager", "snm-a", "m-1", true);
        let app = pod("default", "web-1", "m-1", true);
        assert_eq!(
            turn(&[ours.clone(), app.clone()], &own(), moves),
            Turn::Last
        );
        // Terminating pods still have to go first.
        let mut leaving = app.clone();
        leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(turn(&[leaving, ours.clone()], &own(), moves), Turn::Last);
        // A DaemonSet's pod stays with the node: ours is alone.
        assert_eq!(
            turn(&[ours.clone(), daemon("cni")], &own(), moves),
            Turn::Alone
        );
        // A pod of the same name in another namespace is not ours.
        let namesake = pod("default", "snm-a", "m-1", true);
        assert_eq!(turn(&[namesake, app], &own(), moves), Turn::NotHere);
        // Ours terminating already: nothing left to order.
        let mut going = ours;
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(turn(&[going], &own(), moves), Turn::NotHere);
    }

    #[test]
    fn a_standby_is_a_ready_replica_on_another_node() {
        let ours = pod("spot-node-manager", "snm-a", "m-1", true);
        assert_eq!(
            replica_selector(&ours).as_deref(),
            Some("app.kubernetes.io/name=spot-node-manager")
        );
        let same_node = pod("spot-node-manager", "snm-b", "m-1", true);
        let not_ready = pod("spot-node-manager", "snm-c", "m-2", false);
        let mut leaving = pod("spot-node-manager", "snm-d", "m-2", true);
        leaving.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        let none = [ours.clone(), same_node, not_ready, leaving];
        assert_eq!(standby(&none, &own(), "m-1"), None);
        let good = pod("spot-node-manager", "snm-e", "m-3", true);
        let replicas = [ours, good];
        assert_eq!(
            standby(&replicas, &own(), "m-1").map(|p| p.name_any()),
            Some("snm-e".to_string())
        );
    }
}
