//! The manager's own pod on a node it drains (a masters' refresh, a master
//! interrupted): every other pod goes first, then leadership goes to a
//! standby replica, which takes over at once and evicts our pod like any
//! other. Evicted while leading, we would stop mid-drain and everything
//! would wait for our lease to expire; with no standby to hand over to,
//! our pod is evicted last and the lease released at shutdown.

pub use crate::config::OwnPod;
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
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

/// Pure: whether a replica of `ours` could run on a node other than
/// `node`: one Ready, schedulable, carrying every label of our pod's
/// `nodeSelector` and no `NoSchedule`/`NoExecute` taint our pod does not
/// tolerate. None (the manager on the only control-plane node, as in a
/// cluster of one master): evicted, our pod would wait Pending on the
/// cordoned node while nobody terminates it; it stays and goes with the
/// instance, and the Deployment's next pod resumes from status once the
/// replacement has joined. (Node affinity is not read: our Deployment
/// places by `nodeSelector`.)
pub fn room_elsewhere(nodes: &[Node], ours: &Pod, node: &str) -> bool {
    let spec = ours.spec.as_ref();
    let selector = spec.and_then(|s| s.node_selector.as_ref());
    let tolerations = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    nodes.iter().any(|n| {
        let labels = n.labels();
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let schedulable = n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true);
        let selected = selector
            .into_iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v));
        let taints = n.spec.as_ref().and_then(|s| s.taints.as_deref());
        let tolerated = taints
            .unwrap_or_default()
            .iter()
            .filter(|t| t.effect != "PreferNoSchedule")
            .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)));
        n.name_any() != node && ready && schedulable && selected && tolerated
    })
}

/// Whether `tol` tolerates `taint`, as the scheduler matches them.
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect = tol
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = tol
        .key
        .as_deref()
        .is_none_or(|k| k.is_empty() || k == taint.key);
    let value = match tol.operator.as_deref() {
        Some("Exists") => true,
        _ => tol.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
    };
    // An empty key matches every taint only with Exists.
    let any_key = tol.key.as_deref().is_none_or(str::is_empty);
    effect && key && value && (!any_key || tol.operator.as_deref() == Some("Exists"))
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

    fn node(name: &str, labels: &[(&str, &str)], ready: bool) -> Node {
        use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    /// Our Deployment's placement (manifests/deployment.yaml): the
    /// control plane's label, kops's taint tolerated.
    fn placed(mut p: Pod) -> Pod {
        let spec = p.spec.get_or_insert_with(Default::default);
        spec.node_selector = Some(BTreeMap::from([(
            "node-role.kubernetes.io/control-plane".to_string(),
            String::new(),
        )]));
        spec.tolerations = Some(vec![Toleration {
            key: Some("node-role.kubernetes.io/control-plane".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        p
    }

    fn taint(mut n: Node, key: &str, effect: &str) -> Node {
        let spec = n.spec.get_or_insert_with(Default::default);
        spec.taints.get_or_insert_with(Vec::new).push(Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        });
        n
    }

    #[test]
    fn our_pod_has_room_elsewhere_only_on_another_ready_schedulable_node_it_may_run_on() {
        let ours = placed(pod("spot-node-manager", "snm-a", "m-1", true));
        let cp = [("node-role.kubernetes.io/control-plane", "")];
        let master = |name: &str| {
            taint(
                node(name, &cp, true),
                "node-role.kubernetes.io/control-plane",
                "NoSchedule",
            )
        };
        // One master: only the node being drained.
        let workers = [
            node("w-1", &[("node-role.kubernetes.io/node", "")], true),
            master("m-1"),
        ];
        assert!(!room_elsewhere(&workers, &ours, "m-1"), "the only master");
        // A second master, Ready and schedulable: room.
        assert!(room_elsewhere(
            &[master("m-1"), master("m-2")],
            &ours,
            "m-1"
        ));
        // ... not when it is NotReady, cordoned, or tainted otherwise.
        let mut down = master("m-2");
        down = Node {
            status: node("m-2", &cp, false).status,
            ..down
        };
        let mut cordoned = master("m-2");
        cordoned
            .spec
            .get_or_insert_with(Default::default)
            .unschedulable = Some(true);
        let tainted = taint(master("m-2"), "example.com/maintenance", "NoExecute");
        for other in [down, cordoned, tainted] {
            assert!(
                !room_elsewhere(&[master("m-1"), other.clone()], &ours, "m-1"),
                "{other:?}"
            );
        }
        // A preference is not a refusal; without a nodeSelector any Ready
        // node will do.
        let soft = taint(master("m-2"), "example.com/soon", "PreferNoSchedule");
        assert!(room_elsewhere(&[soft], &ours, "m-1"));
        let anywhere = pod("spot-node-manager", "snm-a", "m-1", true);
        assert!(room_elsewhere(&workers, &anywhere, "m-1"));
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
