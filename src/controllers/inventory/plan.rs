//! The node inventory, pure: from the group, the cluster's Nodes and the AWS
//! view of the group's ASGs, compute the group's status. No I/O, no clock.

use super::{drift, external_update};
use crate::cloud::{AsgDescription, InstanceDescription, TemplateVersions};
use crate::controllers::group_view::AsgView;
use crate::crd::condition::{ConditionStatus, set_condition};
use crate::crd::labels::INSTANCE_GROUP_LABEL;
use crate::crd::nodegroup::{
    AutoScalingGroupStatus, GroupState, LastInterruption, NodeStatus, NotJoinedInstance,
    OperationKind,
};
use crate::crd::{NodeGroup, NodeGroupStatus};
use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet};

pub use crate::k8s::node::selector_matches;
use crate::k8s::node::{NodeView, parse_provider_id};

use crate::crd::condition::{DEGRADED, INVENTORY_SYNCED, SPEC_VALID};

/// Pure: the circuit breaker over the group's nodes: open (True) when more
/// than `max_percent` of them is NotReady. A node leaving on an interruption
/// notice is not counted (it is going, not broken). An empty group is closed.
pub fn circuit_breaker(
    nodes: &[NodeStatus],
    max_percent: i32,
) -> (ConditionStatus, &'static str, String) {
    let total = nodes.len();
    let not_ready = nodes
        .iter()
        .filter(|n| !n.ready && n.interruption.is_none())
        .count();
    let max = max_percent.clamp(0, 100) as usize;
    if total > 0 && not_ready * 100 > total * max {
        (
            ConditionStatus::True,
            "TooManyNotReady",
            format!(
                "{not_ready} of {total} node(s) NotReady, more than {max}%: nothing in the group is terminated until fewer are (replacements are still launched)"
            ),
        )
    } else {
        (
            ConditionStatus::False,
            "Closed",
            format!("{not_ready} of {total} node(s) NotReady (at most {max}%)"),
        )
    }
}

/// How the group's Nodes are chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Membership {
    Selector(LabelSelector),
    /// Default: the kops instance groups named by the ASGs' tags.
    InstanceGroups(BTreeSet<String>),
    /// Default when the ASGs exist but carry no kops tag: the Nodes whose
    /// instance is in one of the group's ASGs (per this sync's describe).
    /// Never every Node of the role: that would claim other groups' nodes,
    /// inflate Ready and could scale in the group's own.
    Instances(BTreeSet<String>),
    /// None of the group's ASGs exists: nothing to infer membership from, so
    /// no Node is claimed (rather than every Node of the role).
    Nothing,
}

impl Membership {
    pub fn of(group: &NodeGroup, asgs: &[AsgDescription]) -> Membership {
        if let Some(selector) = &group.spec.node_selector {
            return Membership::Selector(selector.clone());
        }
        if asgs.is_empty() {
            return Membership::Nothing;
        }
        let instance_groups: BTreeSet<String> = asgs
            .iter()
            .filter_map(|a| a.tags.get(INSTANCE_GROUP_LABEL).cloned())
            .collect();
        if instance_groups.is_empty() {
            Membership::Instances(
                asgs.iter()
                    .flat_map(|a| a.instances.iter().map(|i| i.instance_id.clone()))
                    .collect(),
            )
        } else {
            Membership::InstanceGroups(instance_groups)
        }
    }

    pub fn includes(&self, node: &(impl NodeView + ?Sized)) -> bool {
        let labels = node.node_labels();
        match self {
            Membership::Selector(s) => selector_matches(s, labels),
            Membership::InstanceGroups(groups) => labels
                .label(INSTANCE_GROUP_LABEL)
                .is_some_and(|g| groups.contains(g)),
            Membership::Instances(ids) => node.instance_id().is_some_and(|id| ids.contains(&id)),
            Membership::Nothing => false,
        }
    }
}

/// The newest interruption notice among the group's nodes, kept after the
/// node is gone (the newer of the remembered one and the nodes' own).
fn last_interruption(
    previous: Option<&LastInterruption>,
    members: &[NodeStatus],
) -> Option<LastInterruption> {
    let newest = members
        .iter()
        .filter_map(LastInterruption::of)
        .max_by(|a, b| (a.noticed, &a.node).cmp(&(b.noticed, &b.node)));
    match (previous, newest) {
        (Some(p), Some(n)) if (p.noticed, &p.node) > (n.noticed, &n.node) => Some(p.clone()),
        (p, n) => n.or_else(|| p.cloned()),
    }
}

/// The AWS view of a group, as observed in one sync.
#[derive(Debug, Clone, Default)]
pub struct AwsView {
    pub asgs: Vec<AsgDescription>,
    pub instances: Vec<InstanceDescription>,
    /// The version numbers of the templates the ASGs name symbolically.
    pub templates: Vec<TemplateVersions>,
    /// Why those versions could not be read now (DescribeLaunchTemplates
    /// failed, as when the IAM policy lacks it), if so: `templates` then
    /// holds only what was known before, and a member whose drift cannot
    /// be told keeps what the previous status said.
    pub drift_unknown: Option<String>,
}

/// Pure: the group's next status from what was observed. `previous` supplies
/// fields this function does not own (conditions of others, the lock).
pub fn inventory_status<N: NodeView>(
    group: &NodeGroup,
    nodes: &[N],
    aws: &AwsView,
    previous: &NodeGroupStatus,
    now: DateTime<Utc>,
) -> NodeGroupStatus {
    let mut status = previous.clone();
    let membership = Membership::of(group, &aws.asgs);
    let instances: BTreeMap<&str, &InstanceDescription> = aws
        .instances
        .iter()
        .map(|i| (i.instance_id.as_str(), i))
        .collect();
    let asg_of: BTreeMap<&str, &str> = aws
        .asgs
        .iter()
        .flat_map(|a| {
            a.instances
                .iter()
                .map(move |i| (i.instance_id.as_str(), a.name.as_str()))
        })
        .collect();
    let drift_of = drift::by_instance(&aws.asgs, &aws.templates);
    let mut members: Vec<NodeStatus> = nodes
        .iter()
        .filter(|n| membership.includes(*n) && !drift::detached_by_kops(*n, &aws.asgs))
        .map(|node| member_status(node, &instances, &asg_of, &drift_of))
        .map(|member| keep_unhealthy_since(member, &previous.nodes))
        .map(|member| drift::keep_drifted(member, aws.drift_unknown.as_deref(), &previous.nodes))
        .collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    let asg_statuses: Vec<AutoScalingGroupStatus> = group
        .spec
        .asg_names()
        .iter()
        .filter_map(|r| aws.asgs.iter().find(|a| a.name == *r))
        .map(|a| {
            let before = previous
                .auto_scaling_groups
                .iter()
                .find(|p| p.name == a.name);
            let view = AsgView {
                fallback: group.spec.is_fallback(&a.name),
                ..AsgView::from(a).judge(before.and_then(|p| p.behind_since), now)
            };
            let recent = super::asg_health::pool_record(&a.name, &view, before, &members, now);
            AutoScalingGroupStatus {
                recent,
                // Kept until the next reading of prices (the cost accounting).
                spot_price: before.and_then(|p| p.spot_price.clone()),
                on_demand_price: before.and_then(|p| p.on_demand_price.clone()),
                ..view.into()
            }
        })
        .collect();

    status.ready_nodes = Some(members.iter().filter(|m| m.ready).count() as i32);
    status.desired_nodes = Some(group.spec.desired);
    status.last_interruption = last_interruption(previous.last_interruption.as_ref(), &members);
    let drifted = members.iter().filter(|m| m.drifted.is_some()).count();
    status.drifted_nodes = Some(drifted as i32);
    status.nodes = members;
    status.not_joined = not_joined(nodes, aws, &instances);
    status.auto_scaling_groups = asg_statuses;
    set_conditions(group, aws, &mut status, now);
    let tainted = nodes
        .iter()
        .filter(|n| membership.includes(*n))
        .filter(|n| n.scheduled_for_update());
    // Ready as the replenisher counts it (its instance InService too): a
    // replacement whose Node joined while its ASG still has it Pending
    // would end the hold early, and the replenisher answer kops's gap.
    let serving = crate::controllers::group_view::group_nodes(&status.nodes, &aws.asgs, now)
        .iter()
        .filter(|n| n.ready)
        .count();
    let seen = external_update::KopsUpdate {
        tainted: tainted.count(),
        drifted,
        ready: i32::try_from(serving).unwrap_or(i32::MAX),
        desired: group.spec.desired,
    };
    external_update::set_external_update(&mut status, seen, group.metadata.generation, now);
    status
}

/// One member Node's status: its instance (from `providerID`), what AWS
/// says of it, and its interruption record.
fn member_status<N: NodeView>(
    node: &N,
    instances: &BTreeMap<&str, &InstanceDescription>,
    asg_of: &BTreeMap<&str, &str>,
    drift_of: &BTreeMap<&str, String>,
) -> NodeStatus {
    let parsed = match node.provider_id() {
        None | Some("") => Err("node has no providerID".to_string()),
        Some(p) => parse_provider_id(p),
    };
    let (zone, instance_id, problem) = match parsed {
        Ok((zone, id)) => (Some(zone), Some(id), None),
        Err(problem) => (None, None, Some(problem)),
    };
    let instance = instance_id.as_deref().and_then(|id| instances.get(id));
    let interruption = crate::k8s::interruption_record::record_of(node)
        .filter(|r| instance_id.as_deref() == Some(r.instance_id.as_str()))
        .map(|r| r.interruption());
    let marked = node.annotation(drift::NEEDS_UPDATE_ANNOTATION).is_some();
    let drifted = drift::of_node(marked, instance_id.as_deref(), drift_of);
    NodeStatus {
        name: node.node_name().to_string(),
        auto_scaling_group: instance_id
            .as_deref()
            .and_then(|id| asg_of.get(id))
            .map(|s| s.to_string()),
        availability_zone: instance.and_then(|i| i.availability_zone.clone()).or(zone),
        instance_type: instance.and_then(|i| i.instance_type.clone()),
        lifecycle: instance.map(|i| i.lifecycle.as_str().to_string()),
        launch_time: instance.and_then(|i| i.launch_time),
        instance_id,
        ready: node.ready(),
        unhealthy_since: node.not_ready_since(),
        unschedulable: node.cordoned(),
        problem,
        drifted,
        interruption,
    }
}

/// Unhealthy since the earlier of what the Node says and what was recorded
/// while it stayed not Ready: a Ready condition going from False to Unknown
/// (or back) moves its lastTransitionTime, but the node was never Ready in
/// between.
fn keep_unhealthy_since(mut member: NodeStatus, previous: &[NodeStatus]) -> NodeStatus {
    let recorded = previous
        .iter()
        .find(|p| p.name == member.name && p.instance_id == member.instance_id)
        .and_then(|p| p.unhealthy_since);
    if let (Some(now), Some(before)) = (member.unhealthy_since, recorded) {
        member.unhealthy_since = Some(now.min(before));
    }
    member
}

/// Not joined: in the ASGs, alive, and no Node anywhere in the cluster runs
/// on it. An instance EC2 already reports as terminated is leaving, not late.
fn not_joined<N: NodeView>(
    nodes: &[N],
    aws: &AwsView,
    instances: &BTreeMap<&str, &InstanceDescription>,
) -> Vec<NotJoinedInstance> {
    let joined: BTreeSet<String> = nodes.iter().filter_map(|n| n.instance_id()).collect();
    let mut not_joined: Vec<NotJoinedInstance> = aws
        .asgs
        .iter()
        .flat_map(|asg| {
            asg.instances
                .iter()
                .filter(|i| i.is_active() && !joined.contains(&i.instance_id))
                .map(|i| NotJoinedInstance {
                    instance_id: i.instance_id.clone(),
                    auto_scaling_group: asg.name.clone(),
                    availability_zone: i.availability_zone.clone(),
                    launch_time: instances
                        .get(i.instance_id.as_str())
                        .and_then(|d| d.launch_time),
                })
        })
        .filter(|n| {
            instances.get(n.instance_id.as_str()).is_none_or(|d| {
                !matches!(
                    d.state.as_str(),
                    "shutting-down" | "terminated" | "stopping" | "stopped"
                )
            })
        })
        .collect();
    not_joined.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    not_joined
}

/// The inventory's own conditions on `status` (its nodes, not-joined
/// instances and ASG figures already set): synced, degraded, breaker.
fn set_conditions(
    group: &NodeGroup,
    aws: &AwsView,
    status: &mut NodeGroupStatus,
    now: DateTime<Utc>,
) {
    let generation = group.metadata.generation;
    let bad_nodes = status.nodes.iter().filter(|m| m.problem.is_some()).count();
    let mut synced = format!(
        "{} node(s), {} ready, {} instance(s) not joined",
        status.nodes.len(),
        status.ready_nodes.unwrap_or(0),
        status.not_joined.len()
    );
    if bad_nodes > 0 {
        synced.push_str(&format!(
            "; {bad_nodes} node(s) with an unusable providerID"
        ));
    }
    set_condition(
        &mut status.conditions,
        INVENTORY_SYNCED,
        ConditionStatus::True,
        "Synced",
        synced,
        generation,
        now,
    );
    if group.spec.fallback.is_some() {
        let (on, reason, message) = super::asg_health::fallback(&status.auto_scaling_groups);
        set_condition(
            &mut status.conditions,
            crate::crd::condition::FALLBACK_ON_DEMAND,
            on,
            reason,
            message,
            generation,
            now,
        );
    }
    let (degraded, reason, message) =
        super::asg_health::degradation(group, &aws.asgs, &status.auto_scaling_groups);
    set_condition(
        &mut status.conditions,
        DEGRADED,
        degraded,
        reason,
        message,
        generation,
        now,
    );
    drift::set_drift_known(status, aws.drift_unknown.as_deref(), generation, now);
    super::room::set_room(group, &aws.asgs, status, now);
    let (open, reason, message) = circuit_breaker(
        &status.nodes,
        group
            .spec
            .max_not_ready_percent
            .unwrap_or(crate::crd::nodegroup::DEFAULT_MAX_NOT_READY_PERCENT),
    );
    set_condition(
        &mut status.conditions,
        crate::crd::condition::CIRCUIT_BREAKER,
        open,
        reason,
        message,
        generation,
        now,
    );
}

/// Pure: the group's state for `kubectl get`: what is wrong first, then
/// what it is doing. A group short of its desired Ready nodes is never
/// "Ready", even before the replenisher takes the lock (nodes still joining).
/// A node is NotReady past the unhealthy timeout and repair is on: with
/// the replenisher holding the lock, it is repairing.
fn repairing(group: &NodeGroup, status: &NodeGroupStatus, now: DateTime<Utc>) -> bool {
    let timeout = group.spec.replenish.unhealthy_timeout();
    group.spec.replenish.repair
        && status.nodes.iter().any(|n| {
            !n.ready
                && n.interruption.as_ref().is_none_or(|i| !i.in_force(now))
                && n.unhealthy_since
                    .is_some_and(|t| now >= crate::controllers::group_view::after(t, timeout))
        })
}

pub fn group_state(group: &NodeGroup, status: &NodeGroupStatus, now: DateTime<Utc>) -> GroupState {
    let holds = |type_: &str, value: ConditionStatus| {
        crate::crd::condition::find(&status.conditions, type_).is_some_and(|c| c.status == value)
    };
    if holds(SPEC_VALID, ConditionStatus::False) {
        GroupState::InvalidSpec
    } else if group.spec.suspend {
        GroupState::Suspended
    } else if holds(
        crate::crd::condition::EXTERNAL_UPDATE,
        ConditionStatus::True,
    ) {
        GroupState::ExternalUpdate
    } else if holds(
        crate::crd::condition::FALLBACK_ON_DEMAND,
        ConditionStatus::True,
    ) {
        GroupState::FallbackOnDemand
    } else if holds(DEGRADED, ConditionStatus::True)
        || holds(
            crate::crd::condition::CIRCUIT_BREAKER,
            ConditionStatus::True,
        )
    {
        GroupState::Degraded
    } else {
        match status.operation.as_ref().map(|l| &l.holder) {
            Some(OperationKind::Refresh) => GroupState::Refreshing,
            Some(OperationKind::Replenish) if repairing(group, status, now) => {
                GroupState::Repairing
            }
            Some(OperationKind::Replenish) => GroupState::Replenishing,
            None if status.ready_nodes.unwrap_or(0) < group.spec.desired => {
                GroupState::Replenishing
            }
            None => GroupState::Ready,
        }
    }
}

/// Pure: the status after a failed AWS sync. The last inventory is kept (it
/// is the best knowledge we have) and the failure is reported.
pub fn sync_failed_status(
    group: &NodeGroup,
    previous: &NodeGroupStatus,
    error: &str,
    now: DateTime<Utc>,
) -> NodeGroupStatus {
    let mut status = previous.clone();
    set_condition(
        &mut status.conditions,
        INVENTORY_SYNCED,
        ConditionStatus::False,
        "AwsError",
        error.to_string(),
        group.metadata.generation,
        now,
    );
    status
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cloud::{AsgInstance, Lifecycle};
    use crate::crd::condition::EXTERNAL_UPDATE;
    use crate::crd::labels::WORKER_LABEL;
    use chrono::TimeZone;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus as K8sNodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};
    use kube::ResourceExt;

    pub fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap()
    }

    /// A kops-like Node for an instance.
    pub fn node(name: &str, instance_group: &str, zone: &str, instance: &str, ready: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    (INSTANCE_GROUP_LABEL.to_string(), instance_group.to_string()),
                    (WORKER_LABEL.to_string(), String::new()),
                ])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///{zone}/{instance}")),
                ..Default::default()
            }),
            status: Some(K8sNodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    pub fn asg(
        name: &str,
        instance_group: &str,
        zone: &str,
        ids: &[&str],
        desired: i32,
    ) -> AsgDescription {
        AsgDescription {
            name: name.into(),
            desired,
            min: 0,
            max: 5,
            instances: ids
                .iter()
                .map(|id| AsgInstance {
                    instance_id: id.to_string(),
                    availability_zone: Some(zone.into()),
                    instance_type: Some("m5.large".into()),
                    lifecycle_state: "InService".into(),
                    health_status: "Healthy".into(),
                    launched_from: None,
                })
                .collect(),
            launches_from: None,
            tags: BTreeMap::from([(INSTANCE_GROUP_LABEL.to_string(), instance_group.to_string())]),
            recent_failure: None,
            suspended_processes: vec![],
            capacity_rebalance: false,
            max_instance_lifetime: None,
            zones: vec![],
        }
    }

    pub fn instance(id: &str, zone: &str) -> InstanceDescription {
        InstanceDescription {
            instance_id: id.into(),
            launch_time: Some(t0()),
            availability_zone: Some(zone.into()),
            instance_type: Some("m5.large".into()),
            lifecycle: Lifecycle::Spot,
            state: "running".into(),
            private_dns_name: None,
            tags: BTreeMap::new(),
        }
    }

    pub fn group(asgs: &[&str], desired: i32) -> NodeGroup {
        let spec = serde_json::from_value(serde_json::json!({
            "role": "Worker",
            "autoScalingGroups": asgs.iter().map(|a| serde_json::json!({"name": a})).collect::<Vec<_>>(),
            "desired": desired,
        }))
        .unwrap();
        let mut g = NodeGroup::new("workers", spec);
        g.metadata.generation = Some(1);
        g
    }

    fn cond<'a>(s: &'a NodeGroupStatus, t: &str) -> &'a crate::crd::Condition {
        crate::crd::condition::find(&s.conditions, t).expect(t)
    }

    #[test]
    fn the_state_says_what_is_wrong_before_what_is_happening() {
        use crate::crd::nodegroup::OperationLock;
        let set = |s: &mut NodeGroupStatus, type_: &str, value: ConditionStatus| {
            set_condition(&mut s.conditions, type_, value, "R", "m", Some(1), t0());
        };
        let lock = |holder| OperationLock {
            holder,
            holder_name: "workers".into(),
            since: t0(),
        };
        let mut g = group(&["a"], 1);
        let mut s = NodeGroupStatus::default();
        set(&mut s, SPEC_VALID, ConditionStatus::True);
        set(&mut s, DEGRADED, ConditionStatus::False);
        assert_eq!(
            group_state(&g, &s, t0()),
            GroupState::Replenishing,
            "short of desired (0 of 1 Ready), with no lock yet"
        );
        s.ready_nodes = Some(1);
        assert_eq!(group_state(&g, &s, t0()), GroupState::Ready);
        s.operation = Some(lock(OperationKind::Replenish));
        assert_eq!(group_state(&g, &s, t0()), GroupState::Replenishing);
        // A node NotReady past the unhealthy timeout (10m): a repair.
        let mut dead = crate::controllers::group_view::tests::status_node("n", "a", "i-1");
        dead.ready = false;
        dead.unhealthy_since = Some(t0() - chrono::Duration::minutes(11));
        s.nodes = vec![dead];
        assert_eq!(group_state(&g, &s, t0()), GroupState::Repairing);
        g.spec.replenish.repair = false;
        assert_eq!(group_state(&g, &s, t0()), GroupState::Replenishing);
        g.spec.replenish.repair = true;
        s.nodes[0].unhealthy_since = Some(t0() - chrono::Duration::minutes(9));
        assert_eq!(
            group_state(&g, &s, t0()),
            GroupState::Replenishing,
            "a blip"
        );
        s.nodes.clear();
        s.operation = Some(lock(OperationKind::Refresh));
        assert_eq!(group_state(&g, &s, t0()), GroupState::Refreshing);
        set(
            &mut s,
            crate::crd::condition::CIRCUIT_BREAKER,
            ConditionStatus::True,
        );
        assert_eq!(
            group_state(&g, &s, t0()),
            GroupState::Degraded,
            "breaker open"
        );
        set(
            &mut s,
            crate::crd::condition::CIRCUIT_BREAKER,
            ConditionStatus::False,
        );
        set(&mut s, DEGRADED, ConditionStatus::True);
        assert_eq!(group_state(&g, &s, t0()), GroupState::Degraded);
        g.spec.suspend = true;
        assert_eq!(group_state(&g, &s, t0()), GroupState::Suspended);
        set(&mut s, SPEC_VALID, ConditionStatus::False);
        assert_eq!(group_state(&g, &s, t0()), GroupState::InvalidSpec);
    }

    #[test]
    fn provider_ids_are_parsed_or_rejected() {
        assert_eq!(
            parse_provider_id("aws:///ap-northeast-1a/i-0abc"),
            Ok(("ap-northeast-1a".into(), "i-0abc".into()))
        );
        for bad in [
            "",
            "aws://i-1",
            "aws:///zone",
            "gce:///a/i-1",
            "aws:///a/not-an-id",
            "aws:///a/i-1/x",
            "aws:////i-1",
        ] {
            assert!(parse_provider_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_interruption_recorded_on_a_node_is_in_the_status_and_remembered_after_it_goes() {
        let g = group(&["nodes-a"], 2);
        let mut marked = node("n1", "nodes-a", "zone-a", "i-1", true);
        let record = serde_json::json!({
            "kind": "spot_interruption", "instanceId": "i-1",
            "noticed": t0().to_rfc3339(), "deadline": (t0() + chrono::Duration::seconds(90)).to_rfc3339(),
        });
        marked.metadata.annotations = Some(BTreeMap::from([(
            crate::crd::labels::INTERRUPTION_ANNOTATION.to_string(),
            record.to_string(),
        )]));
        // A record naming another instance (a reused name) is not this node's.
        let mut stale = node("n2", "nodes-a", "zone-a", "i-2", true);
        stale.metadata.annotations = Some(BTreeMap::from([(
            crate::crd::labels::INTERRUPTION_ANNOTATION.to_string(),
            record.to_string(),
        )]));
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1", "i-2"], 2)],
            instances: vec![],
            templates: vec![],
            drift_unknown: None,
        };
        let s = inventory_status(
            &g,
            &[marked, stale.clone()],
            &aws,
            &NodeGroupStatus::default(),
            t0(),
        );
        let interruption = s.nodes[0].interruption.clone().expect("recorded");
        assert_eq!(interruption.kind, "spot_interruption");
        assert_eq!(interruption.deadline, t0() + chrono::Duration::seconds(90));
        assert_eq!(s.nodes[1].interruption, None);
        let last = s.last_interruption.clone().expect("last interruption");
        assert_eq!(
            (last.node.as_str(), last.instance_id.as_str()),
            ("n1", "i-1")
        );
        // The node gone: still the last one handled.
        let after = inventory_status(&g, &[stale], &aws, &s, t0());
        assert_eq!(after.last_interruption, Some(last));
    }

    #[test]
    fn nodes_are_mapped_to_instances_asgs_and_zones() {
        let g = group(&["nodes-a", "nodes-c", "nodes-d"], 3);
        let nodes = vec![
            node("n1", "nodes-a", "zone-a", "i-1", true),
            node("n2", "nodes-c", "zone-c", "i-2", true),
            node("n3", "nodes-d", "zone-d", "i-3", false),
            node("other", "gpu", "zone-a", "i-9", true),
        ];
        let aws = AwsView {
            asgs: vec![
                asg("nodes-a", "nodes-a", "zone-a", &["i-1"], 1),
                asg("nodes-c", "nodes-c", "zone-c", &["i-2"], 1),
                asg("nodes-d", "nodes-d", "zone-d", &["i-3"], 1),
            ],
            instances: vec![
                instance("i-1", "zone-a"),
                instance("i-2", "zone-c"),
                instance("i-3", "zone-d"),
            ],
            templates: vec![],
            drift_unknown: None,
        };
        let s = inventory_status(&g, &nodes, &aws, &NodeGroupStatus::default(), t0());
        let names: Vec<_> = s.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            ["n1", "n2", "n3"],
            "a node of another instance group is not a member"
        );
        let n2 = &s.nodes[1];
        assert_eq!(n2.instance_id.as_deref(), Some("i-2"));
        assert_eq!(n2.auto_scaling_group.as_deref(), Some("nodes-c"));
        assert_eq!(n2.availability_zone.as_deref(), Some("zone-c"));
        assert_eq!(n2.lifecycle.as_deref(), Some("spot"));
        assert_eq!(n2.launch_time, Some(t0()));
        assert_eq!(s.ready_nodes, Some(2), "the NotReady node is not counted");
        assert_eq!(s.desired_nodes, Some(3));
        assert!(s.not_joined.is_empty());
        assert!(s.auto_scaling_groups.iter().all(|a| a.launching));
        assert_eq!(cond(&s, DEGRADED).status, ConditionStatus::False);
        assert_eq!(cond(&s, INVENTORY_SYNCED).status, ConditionStatus::True);
    }

    #[test]
    fn cordoned_and_deleting_nodes() {
        let g = group(&["nodes-a"], 2);
        let mut cordoned = node("n1", "nodes-a", "zone-a", "i-1", true);
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        let mut deleting = node("n2", "nodes-a", "zone-a", "i-2", true);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1", "i-2"], 2)],
            instances: vec![],
            templates: vec![],
            drift_unknown: None,
        };
        let s = inventory_status(
            &g,
            &[cordoned, deleting],
            &aws,
            &NodeGroupStatus::default(),
            t0(),
        );
        assert!(s.nodes[0].unschedulable);
        assert!(s.nodes[0].ready, "cordoned but Ready");
        assert!(!s.nodes[1].ready, "a node being deleted is not ready");
        assert_eq!(s.ready_nodes, Some(1));
    }

    #[test]
    fn instances_without_a_node_are_not_joined_with_launch_time() {
        let g = group(&["nodes-a"], 2);
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1", "i-2"], 2)],
            instances: vec![instance("i-1", "zone-a"), instance("i-2", "zone-a")],
            templates: vec![],
            drift_unknown: None,
        };
        let s = inventory_status(
            &g,
            &[node("n1", "nodes-a", "zone-a", "i-1", true)],
            &aws,
            &Default::default(),
            t0(),
        );
        assert_eq!(s.not_joined.len(), 1);
        assert_eq!(s.not_joined[0].instance_id, "i-2");
        assert_eq!(s.not_joined[0].auto_scaling_group, "nodes-a");
        assert_eq!(s.not_joined[0].launch_time, Some(t0()));
    }

    #[test]
    fn terminating_instances_are_not_reported_as_not_joined() {
        let g = group(&["nodes-a"], 1);
        let mut a = asg("nodes-a", "nodes-a", "zone-a", &["i-1", "i-2"], 1);
        a.instances[1].lifecycle_state = "Terminating".into();
        let mut gone = instance("i-1", "zone-a");
        gone.state = "shutting-down".into();
        let aws = AwsView {
            asgs: vec![a],
            instances: vec![gone],
            templates: vec![],
            drift_unknown: None,
        };
        let s = inventory_status::<Node>(&g, &[], &aws, &Default::default(), t0());
        assert!(s.not_joined.is_empty(), "{:?}", s.not_joined);
    }

    #[test]
    fn a_bad_provider_id_is_reported_on_the_node_and_does_not_break_the_group() {
        let g = group(&["nodes-a"], 2);
        let mut bad = node("bad", "nodes-a", "zone-a", "i-x", true);
        bad.spec.as_mut().unwrap().provider_id = Some("kind://docker/bad".into());
        let mut none = node("none", "nodes-a", "zone-a", "i-y", true);
        none.spec.as_mut().unwrap().provider_id = None;
        let good = node("good", "nodes-a", "zone-a", "i-1", true);
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1"], 1)],
            instances: vec![instance("i-1", "zone-a")],
            templates: vec![],
            drift_unknown: None,
        };
        let s = inventory_status(&g, &[bad, none, good], &aws, &Default::default(), t0());
        let bad = s.nodes.iter().find(|n| n.name == "bad").unwrap();
        assert!(bad.instance_id.is_none());
        assert!(
            bad.problem
                .as_deref()
                .unwrap()
                .contains("kind://docker/bad")
        );
        let none = s.nodes.iter().find(|n| n.name == "none").unwrap();
        assert_eq!(none.problem.as_deref(), Some("node has no providerID"));
        let good = s.nodes.iter().find(|n| n.name == "good").unwrap();
        assert_eq!(good.auto_scaling_group.as_deref(), Some("nodes-a"));
        assert!(
            cond(&s, INVENTORY_SYNCED)
                .message
                .contains("2 node(s) with an unusable providerID")
        );
    }

    #[test]
    fn a_missing_asg_degrades_the_group_naming_it() {
        let g = group(&["nodes-a", "nodes-typo"], 1);
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1"], 1)],
            instances: vec![instance("i-1", "zone-a")],
            templates: vec![],
            drift_unknown: None,
        };
        let s = inventory_status::<Node>(&g, &[], &aws, &Default::default(), t0());
        let c = cond(&s, DEGRADED);
        assert_eq!(
            (c.status.clone(), c.reason.as_str()),
            (ConditionStatus::True, "AutoScalingGroupNotFound")
        );
        assert!(c.message.contains("nodes-typo"));
        assert_eq!(s.auto_scaling_groups.len(), 1);
        // A group none of whose ASGs exists claims no Node at all.
        let lost = group(&["nodes-typo"], 1);
        let nodes = [node("n1", "nodes-a", "zone-a", "i-1", true)];
        let s = inventory_status(
            &lost,
            &nodes,
            &AwsView::default(),
            &Default::default(),
            t0(),
        );
        assert!(s.nodes.is_empty(), "{:?}", s.nodes);
    }

    #[test]
    fn an_asg_behind_launches_within_the_grace_and_is_short_after_it_or_on_a_failure() {
        let g = group(&["nodes-a", "nodes-c"], 3);
        let mut failing = asg("nodes-c", "nodes-c", "zone-c", &["i-3"], 2);
        failing.recent_failure = Some("InsufficientInstanceCapacity".into());
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1"], 2), failing],
            instances: vec![],
            templates: vec![],
            drift_unknown: None,
        };
        // First seen behind: a launch in flight counts as launching; a
        // failed launch does not.
        let first = inventory_status::<Node>(&g, &[], &aws, &Default::default(), t0());
        let a = &first.auto_scaling_groups[0];
        assert!(a.launching, "{a:?}");
        assert_eq!(a.behind_since, Some(t0()));
        assert_eq!((a.desired, a.instances), (2, 1));
        let c = &first.auto_scaling_groups[1];
        assert!(!c.launching);
        assert!(
            c.reason
                .as_deref()
                .unwrap_or_default()
                .contains("InsufficientInstanceCapacity"),
            "{c:?}"
        );
        assert_eq!(cond(&first, DEGRADED).reason, "NotLaunching");

        // Still behind past the grace: short, and since when is remembered.
        let later = t0() + chrono::Duration::from_std(crate::cloud::LAUNCH_GRACE).unwrap();
        let s = inventory_status::<Node>(&g, &[], &aws, &first, later);
        let a = &s.auto_scaling_groups[0];
        assert!(!a.launching);
        assert_eq!(a.behind_since, Some(t0()));
        assert_eq!(
            a.reason.as_deref(),
            Some("desired 2 but 1 instance(s) for 1m")
        );

        // Caught up: no longer behind, and the memory goes.
        let mut caught_up = aws.clone();
        caught_up.asgs[0] = asg("nodes-a", "nodes-a", "zone-a", &["i-1", "i-2"], 2);
        let s = inventory_status::<Node>(&g, &[], &caught_up, &s, later);
        assert!(s.auto_scaling_groups[0].launching);
        assert_eq!(s.auto_scaling_groups[0].behind_since, None);
    }

    #[test]
    fn explicit_selectors_and_role_defaults_choose_members() {
        let mut g = group(&["nodes-a"], 1);
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        g.spec.node_selector = Some(LabelSelector {
            match_labels: Some(labels(&[("pool", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["batch".into()]),
            }]),
        });
        let membership = Membership::of(&g, &[]);
        let with = |pairs: &[(&str, &str)]| {
            let mut n = node("n", "x", "z", "i-1", true);
            n.metadata.labels = Some(labels(pairs));
            n
        };
        assert!(membership.includes(&with(&[("pool", "web")])));
        assert!(!membership.includes(&with(&[("pool", "web"), ("tier", "batch")])));
        assert!(!membership.includes(&with(&[("pool", "db")])));
        // No selector and no kops tags: only the Nodes on the group's own
        // instances, never every Node of the role (another group's would be
        // claimed, Ready inflated, and the group's own scaled in).
        g.spec.node_selector = None;
        let untagged = AsgDescription {
            tags: BTreeMap::new(),
            ..asg("nodes-a", "", "z", &["i-1"], 1)
        };
        let membership = Membership::of(&g, &[untagged]);
        assert_eq!(
            membership,
            Membership::Instances(BTreeSet::from(["i-1".to_string()]))
        );
        assert!(membership.includes(&with(&[(WORKER_LABEL, "")])));
        let mut elsewhere = node("m", "x", "z", "i-2", true);
        elsewhere.metadata.labels = Some(labels(&[(WORKER_LABEL, "")]));
        assert!(
            !membership.includes(&elsewhere),
            "a worker of another group's ASG is not ours"
        );
        let mut no_provider = with(&[(WORKER_LABEL, "")]);
        no_provider.spec = None;
        assert!(!membership.includes(&no_provider));
    }

    #[test]
    fn an_unchanged_world_gives_an_identical_status() {
        let g = group(&["nodes-a"], 1);
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1"], 1)],
            instances: vec![instance("i-1", "zone-a")],
            templates: vec![],
            drift_unknown: None,
        };
        let nodes = [node("n1", "nodes-a", "zone-a", "i-1", true)];
        let first = inventory_status(&g, &nodes, &aws, &Default::default(), t0());
        let second = inventory_status(
            &g,
            &nodes,
            &aws,
            &first,
            t0() + chrono::Duration::minutes(1),
        );
        assert_eq!(first, second, "nothing is written when nothing changed");
    }

    #[test]
    fn an_aws_failure_keeps_the_last_inventory_and_says_so() {
        let g = group(&["nodes-a"], 1);
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1"], 1)],
            instances: vec![],
            templates: vec![],
            drift_unknown: None,
        };
        let before = inventory_status(
            &g,
            &[node("n1", "nodes-a", "zone-a", "i-1", true)],
            &aws,
            &Default::default(),
            t0(),
        );
        let after = sync_failed_status(
            &g,
            &before,
            "AWS DescribeAutoScalingGroups failed: throttled",
            t0(),
        );
        assert_eq!(after.nodes, before.nodes);
        let c = cond(&after, INVENTORY_SYNCED);
        assert_eq!(
            (c.status.clone(), c.reason.as_str()),
            (ConditionStatus::False, "AwsError")
        );
    }

    #[test]
    fn a_member_tainted_by_kops_for_update_says_an_external_update_is_in_progress() {
        let g = group(&["nodes-a"], 2);
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1", "i-2"], 2)],
            instances: vec![instance("i-1", "zone-a"), instance("i-2", "zone-a")],
            templates: vec![],
            drift_unknown: None,
        };
        let mut nodes = vec![
            node("n1", "nodes-a", "zone-a", "i-1", true),
            node("n2", "nodes-a", "zone-a", "i-2", true),
        ];
        let s = inventory_status(&g, &nodes, &aws, &Default::default(), t0());
        assert_eq!(cond(&s, EXTERNAL_UPDATE).status, ConditionStatus::False);
        nodes[1].spec.get_or_insert_with(Default::default).taints =
            Some(vec![k8s_openapi::api::core::v1::Taint {
                key: crate::crd::labels::SCHEDULED_FOR_UPDATE_TAINT.into(),
                effect: "PreferNoSchedule".into(),
                ..Default::default()
            }]);
        let s = inventory_status(&g, &nodes, &aws, &Default::default(), t0());
        let c = cond(&s, EXTERNAL_UPDATE);
        assert_eq!(c.status, ConditionStatus::True);
        assert_eq!(c.reason, super::external_update::KOPS_ROLLING_UPDATE);
        assert!(c.message.contains("1 node(s) tainted"), "{}", c.message);
        assert_eq!(group_state(&g, &s, t0()), GroupState::ExternalUpdate);
        let mut with = g.clone();
        with.status = Some(s);
        assert!(with.external_update().is_some());

        // kops detached the tainted node's instance from its ASG (the
        // replacement not yet launched): no longer a member, still the
        // update's.
        let aws = AwsView {
            asgs: vec![asg("nodes-a", "nodes-a", "zone-a", &["i-1"], 2)],
            ..aws
        };
        let s = inventory_status(&g, &nodes, &aws, &Default::default(), t0());
        let names: Vec<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["n1"]);
        assert_eq!(s.ready_nodes, Some(1));
        assert_eq!(cond(&s, EXTERNAL_UPDATE).status, ConditionStatus::True);
        // Untainted, a node whose instance left its ASG is still reported
        // (a terminated instance's Node lingers until its kubelet stops).
        nodes[1].spec = None;
        let s = inventory_status(&g, &nodes, &aws, &Default::default(), t0());
        assert_eq!(s.nodes.len(), 2);
    }

    #[test]
    fn the_circuit_breaker_opens_above_its_share_of_not_ready_nodes() {
        let nodes = |ready: usize, not_ready: usize, interrupted: usize| {
            let mut v = vec![];
            for i in 0..ready + not_ready + interrupted {
                let mut n: NodeStatus = serde_json::from_value(serde_json::json!({
                    "name": format!("n{i}"), "ready": i < ready, "unschedulable": false
                }))
                .expect("node");
                if i >= ready + not_ready {
                    n.interruption = Some(
                        serde_json::from_value(serde_json::json!({
                            "kind": "spot_interruption", "noticed": t0().to_rfc3339(),
                            "deadline": t0().to_rfc3339()
                        }))
                        .expect("interruption"),
                    );
                }
                v.push(n);
            }
            v
        };
        let open = |n: &[NodeStatus], max| circuit_breaker(n, max).0 == ConditionStatus::True;
        assert!(!open(&nodes(3, 3, 0), 50), "half is not more than half");
        assert!(open(&nodes(2, 4, 0), 50));
        assert!(circuit_breaker(&nodes(2, 4, 0), 50).2.contains("4 of 6"));
        assert!(
            !open(&nodes(2, 1, 3), 50),
            "leaving on a notice is not broken"
        );
        assert!(!open(&[], 50), "an empty group");
        assert!(open(&nodes(5, 1, 0), 0), "0%: any NotReady node opens it");
        assert!(!open(&nodes(0, 4, 0), 100), "100%: never");
        assert!(open(&nodes(0, 1, 0), 50), "one node of one");
    }

    /// Any instant chrono can hold.
    fn any_time() -> impl proptest::strategy::Strategy<Value = DateTime<Utc>> {
        use proptest::prelude::*;
        prop_oneof![
            Just(DateTime::<Utc>::MIN_UTC),
            Just(DateTime::<Utc>::MAX_UTC),
            (DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp())
                .prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or(DateTime::<Utc>::MIN_UTC)),
        ]
    }

    proptest::proptest! {
        /// Whatever the cluster and AWS say (counts of any size, states of
        /// any kind, providerIDs and interruption notes that do not parse,
        /// times at the ends of representable time), the status is computed
        /// without panicking, lists only the group's own Nodes, and never
        /// calls an instance with a Node "not joined".
        #[test]
        fn any_observation_gives_a_status_without_panicking(
            nodes in proptest::collection::vec(
                (0usize..6, 0usize..3, proptest::bool::ANY, proptest::option::of(any_time()),
                 proptest::bool::ANY),
                0..8,
            ),
            asgs in proptest::collection::vec(
                (proptest::num::i32::ANY, proptest::num::i32::ANY, proptest::num::i32::ANY,
                 proptest::collection::vec((0usize..8, 0usize..5), 0..6),
                 proptest::option::of(any_time())),
                0..3,
            ),
            launch in proptest::collection::vec(proptest::option::of(any_time()), 8),
            now in any_time(),
            max_not_ready in proptest::option::of(proptest::num::i32::ANY),
        ) {
            const STATES: [&str; 5] = ["InService", "Pending", "Terminating", "Standby", "???"];
            let groups = ["nodes-a", "nodes-c", "other"];
            let mut g = group(&["nodes-a", "nodes-c"], 3);
            g.spec.max_not_ready_percent = max_not_ready;
            let ids: Vec<String> = (0..8).map(|i| format!("i-{i}")).collect();
            let nodes: Vec<Node> = nodes
                .iter()
                .enumerate()
                .map(|(n, (instance, ig, ready, noticed, bad_provider))| {
                    let mut node = node(
                        &format!("n{n}"),
                        groups[*ig],
                        "zone-a",
                        &ids.get(*instance).cloned().unwrap_or_default(),
                        *ready,
                    );
                    if *bad_provider {
                        node.spec.as_mut().expect("spec").provider_id = Some("gce://x".into());
                    }
                    if let Some(t) = noticed {
                        let record = serde_json::json!({
                            "kind": "spot_interruption", "instanceId": ids[*instance % 8],
                            "noticed": t, "deadline": DateTime::<Utc>::MAX_UTC,
                        });
                        node.metadata.annotations = Some(BTreeMap::from([(
                            crate::crd::labels::INTERRUPTION_ANNOTATION.to_string(),
                            record.to_string(),
                        )]));
                    }
                    node
                })
                .collect();
            let mut previous = NodeGroupStatus::default();
            let described: Vec<AsgDescription> = asgs
                .iter()
                .enumerate()
                .map(|(i, (desired, min, max, members, behind))| {
                    let name = groups[i];
                    if let Some(since) = behind {
                        previous.auto_scaling_groups.push(AutoScalingGroupStatus {
                            name: name.to_string(),
                            behind_since: Some(*since),
                            ..Default::default()
                        });
                    }
                    let mut a = asg(name, name, "zone-a", &[], *desired);
                    a.min = *min;
                    a.max = *max;
                    a.instances = members
                        .iter()
                        .map(|(id, state)| AsgInstance {
                            instance_id: ids[*id].clone(),
                            availability_zone: None,
                            instance_type: None,
                            lifecycle_state: STATES[*state].into(),
                            health_status: "Healthy".into(),
                            launched_from: None,
                        })
                        .collect();
                    a
                })
                .collect();
            let instances: Vec<InstanceDescription> = ids
                .iter()
                .zip(&launch)
                .map(|(id, t)| InstanceDescription {
                    launch_time: *t,
                    ..instance(id, "zone-a")
                })
                .collect();
            let view = AwsView {
                asgs: described,
                instances,
                templates: vec![],
                drift_unknown: None,
            };
            let status = inventory_status(&g, &nodes, &view, &previous, now);
            for member in &status.nodes {
                proptest::prop_assert!(nodes.iter().any(|n| n.name_any() == member.name));
            }
            let joined: BTreeSet<String> = nodes.iter().filter_map(|n| n.instance_id()).collect();
            for n in &status.not_joined {
                proptest::prop_assert!(!joined.contains(&n.instance_id));
            }
            for a in &status.auto_scaling_groups {
                proptest::prop_assert!(g.spec.asg_names().contains(&a.name));
            }
            // Each member says what its Node says of readiness, and the
            // count is of those members, never of a node outside the group.
            for member in &status.nodes {
                let node = nodes.iter().find(|n| n.name_any() == member.name);
                proptest::prop_assert_eq!(Some(member.ready), node.map(|n| n.ready()));
            }
            let ready_members = status.nodes.iter().filter(|m| m.ready).count() as i32;
            proptest::prop_assert_eq!(status.ready_nodes, Some(ready_members));
        }
    }
}
