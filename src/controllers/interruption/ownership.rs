//! Which notices are ours: an instance belongs to a managed group when the
//! inventory lists it in a NodeGroup's status (as a node's instance or as an
//! instance that never joined). No AWS call per message.

use super::message::Notice;
pub use crate::config::ForeignMessages;
use crate::crd::NodeGroup;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use std::borrow::Borrow;
use std::collections::HashMap;

/// The group (and node) an instance belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub namespace: String,
    pub group: String,
    /// The instance's Node; None for an instance that never joined.
    pub node: Option<String>,
    pub auto_scaling_group: Option<String>,
}

#[derive(Debug, Default)]
pub struct Ownership(HashMap<String, Owner>);

impl Ownership {
    pub fn of<G: Borrow<NodeGroup>>(groups: &[G]) -> Ownership {
        let mut index = HashMap::new();
        for group in groups {
            let group = group.borrow();
            let Some(status) = &group.status else {
                continue;
            };
            let owner = |node: Option<&str>, asg: Option<&str>| Owner {
                namespace: group.namespace().unwrap_or_default(),
                group: group.name_any(),
                node: node.map(str::to_string),
                auto_scaling_group: asg.map(str::to_string),
            };
            for n in &status.nodes {
                if let Some(id) = &n.instance_id {
                    index.insert(
                        id.clone(),
                        owner(Some(&n.name), n.auto_scaling_group.as_deref()),
                    );
                }
            }
            for n in &status.not_joined {
                index
                    .entry(n.instance_id.clone())
                    .or_insert_with(|| owner(None, Some(&n.auto_scaling_group)));
            }
        }
        Ownership(index)
    }

    pub fn from_entries(entries: impl IntoIterator<Item = (String, Owner)>) -> Ownership {
        Ownership(entries.into_iter().collect())
    }

    pub fn owner(&self, instance_id: &str) -> Option<&Owner> {
        self.0.get(instance_id)
    }
}

/// Nodes of this cluster that no NodeGroup lists (a kops instance group
/// nobody named), by instance id: looked up only for a notice naming an
/// instance no group has.
#[derive(Debug, Default)]
pub struct Unmanaged(HashMap<String, String>);

impl Unmanaged {
    /// From the cluster's Nodes, leaving out every instance a group lists.
    pub fn of_nodes(nodes: &[Node], ownership: &Ownership) -> Unmanaged {
        Unmanaged(
            nodes
                .iter()
                .filter_map(|n| {
                    let provider = n.spec.as_ref()?.provider_id.as_deref()?;
                    let (_, id) = crate::k8s::node::parse_provider_id(provider).ok()?;
                    (ownership.owner(&id).is_none()).then(|| (id, n.name_any()))
                })
                .collect(),
        )
    }

    pub fn node(&self, instance_id: &str) -> Option<&str> {
        self.0.get(instance_id).map(String::as_str)
    }
}

/// What to do with a notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Act on these instances of ours (and nodes of this cluster no group
    /// lists, instance → node); delete the message once each action is
    /// persisted.
    Act {
        ours: Vec<(String, Owner)>,
        unmanaged: Vec<(String, String)>,
    },
    /// None of its instances is ours.
    Foreign(ForeignMessages),
}

/// Pure: whose instances a notice names.
pub fn dispose(
    notice: &Notice,
    ownership: &Ownership,
    unmanaged: &Unmanaged,
    foreign: ForeignMessages,
) -> Disposition {
    let ours: Vec<(String, Owner)> = notice
        .instance_ids
        .iter()
        .filter_map(|id| ownership.owner(id).map(|o| (id.clone(), o.clone())))
        .collect();
    let others: Vec<(String, String)> = notice
        .instance_ids
        .iter()
        .filter(|id| ownership.owner(id).is_none())
        .filter_map(|id| unmanaged.node(id).map(|n| (id.clone(), n.to_string())))
        .collect();
    if ours.is_empty() && others.is_empty() {
        Disposition::Foreign(foreign)
    } else {
        Disposition::Act {
            ours,
            unmanaged: others,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::interruption::message::NoticeKind;
    use crate::crd::nodegroup::{NodeGroupStatus, NodeStatus, NotJoinedInstance};
    use chrono::{TimeZone, Utc};

    fn group(name: &str, nodes: &[(&str, &str)], not_joined: &[&str]) -> NodeGroup {
        let spec = serde_json::from_value(serde_json::json!({
            "role": "Worker", "autoScalingGroups": [{"name": "asg-a"}], "desired": 1
        }))
        .expect("spec");
        let mut g = NodeGroup::new(name, spec);
        g.metadata.namespace = Some("ns".into());
        g.status = Some(NodeGroupStatus {
            nodes: nodes
                .iter()
                .map(|(node, id)| NodeStatus {
                    name: node.to_string(),
                    instance_id: Some(id.to_string()),
                    auto_scaling_group: Some("asg-a".into()),
                    ..serde_json::from_value(
                        serde_json::json!({"name": node, "ready": true, "unschedulable": false}),
                    )
                    .expect("node status")
                })
                .collect(),
            not_joined: not_joined
                .iter()
                .map(|id| {
                    serde_json::from_value::<NotJoinedInstance>(serde_json::json!({
                        "instanceId": id, "autoScalingGroup": "asg-a"
                    }))
                    .expect("not joined")
                })
                .collect(),
            ..Default::default()
        });
        g
    }

    fn notice(ids: &[&str]) -> Notice {
        Notice {
            kind: NoticeKind::ScheduledChange {
                event_type: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".into(),
                start: None,
            },
            instance_ids: ids.iter().map(|s| s.to_string()).collect(),
            time: Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap(),
            id: None,
        }
    }

    #[test]
    fn instances_are_ours_through_the_inventory_only() {
        let groups = vec![
            group("workers", &[("n1", "i-1"), ("n2", "i-2")], &["i-9"]),
            group("masters", &[("m1", "i-5")], &[]),
        ];
        let ownership = Ownership::of(&groups);
        let d = dispose(
            &notice(&["i-2", "i-404", "i-5", "i-9"]),
            &ownership,
            &Unmanaged::default(),
            ForeignMessages::Delete,
        );
        let Disposition::Act { ours, unmanaged } = d else {
            panic!("{d:?}")
        };
        assert!(unmanaged.is_empty());
        let named: Vec<(&str, &str, Option<&str>)> = ours
            .iter()
            .map(|(id, o)| (id.as_str(), o.group.as_str(), o.node.as_deref()))
            .collect();
        assert_eq!(
            named,
            vec![
                ("i-2", "workers", Some("n2")),
                ("i-5", "masters", Some("m1")),
                ("i-9", "workers", None),
            ]
        );
    }

    #[test]
    fn a_foreign_notice_is_deleted_or_left_as_configured() {
        let ownership = Ownership::of(&[group("workers", &[("n1", "i-1")], &[])]);
        for foreign in [ForeignMessages::Delete, ForeignMessages::Leave] {
            assert_eq!(
                dispose(
                    &notice(&["i-other"]),
                    &ownership,
                    &Unmanaged::default(),
                    foreign
                ),
                Disposition::Foreign(foreign)
            );
        }
    }

    fn node(name: &str, provider: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "spec": {"providerID": provider}
        }))
        .expect("node")
    }

    #[test]
    fn a_node_of_this_cluster_no_group_lists_is_unmanaged_not_foreign() {
        let ownership = Ownership::of(&[group("workers", &[("n1", "i-1")], &[])]);
        let unmanaged = Unmanaged::of_nodes(
            &[
                node("n1", "aws:///az-a/i-1"),
                node("bastion", "aws:///az-a/i-7"),
                node("odd", "gce://x/y"),
            ],
            &ownership,
        );
        assert_eq!(unmanaged.node("i-1"), None, "a group's node is the group's");
        assert_eq!(unmanaged.node("i-7"), Some("bastion"));
        let d = dispose(
            &notice(&["i-7", "i-1", "i-other"]),
            &ownership,
            &unmanaged,
            ForeignMessages::Delete,
        );
        let Disposition::Act { ours, unmanaged } = d else {
            panic!("{d:?}")
        };
        assert_eq!(ours.len(), 1);
        assert_eq!(unmanaged, vec![("i-7".to_string(), "bastion".to_string())]);
    }
}
