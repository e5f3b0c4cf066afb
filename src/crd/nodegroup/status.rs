//! What the inventory writes of a NodeGroup: its nodes, instances that never
//! joined, per-ASG figures, conditions, the operation lock.

use super::super::condition::{
    CIRCUIT_BREAKER, Condition, ConditionStatus, SPEC_VALID, list_map_by_type,
};
use super::NodeGroup;
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupStatus {
    /// The spec generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// SpecValid, InventorySynced, Degraded, CircuitBreakerOpen, ExternalUpdate,
    /// DriftKnown, Deleting: see docs/operations.md for each reason.
    #[serde(default)]
    #[schemars(transform = list_map_by_type)]
    pub conditions: Vec<Condition>,
    /// `spec.desired`, as the inventory last read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_nodes: Option<i32>,
    /// Members whose Node is Ready (and not being deleted) and whose instance is
    /// InService in its ASG, with no interruption notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_nodes: Option<i32>,
    /// Every member Node, with its instance, ASG, zone and readiness. A Node with
    /// no or a malformed providerID is listed with a `problem`, never guessed at.
    #[serde(default)]
    pub nodes: Vec<NodeStatus>,
    /// How many nodes are drifted (see `nodes[].drifted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drifted_nodes: Option<i32>,
    /// The last time a member carried kops's `kops.k8s.io/scheduled-for-update`
    /// taint. kops rolls one instance group after another and validates the
    /// cluster between two, when no node carries it (with maxSurge 0 it also
    /// waits, untainted, for the ASG's replacement): while the group is not
    /// whole again (members drifted, or fewer Ready than desired), the
    /// update is taken as running for up to 5 minutes after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kops_update_seen: Option<DateTime<Utc>>,
    /// Instances in the group's ASGs that no Node runs on (an instance EC2 already
    /// ended is not listed: it is leaving, not late).
    #[serde(default)]
    pub not_joined: Vec<NotJoinedInstance>,
    /// Each ASG as last described: its counts, suspended processes, and whether it
    /// can be counted on to launch.
    #[serde(default)]
    pub auto_scaling_groups: Vec<AutoScalingGroupStatus>,
    /// The refresh/replenish lock; absent when idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationLock>,
    /// The newest interruption notice handled for one of the group's nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_interruption: Option<LastInterruption>,
    /// In one word, what is wrong with the group or what it is doing (the
    /// `kubectl get` column), from its conditions, spec and lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<GroupState>,
    /// How many ASGs the spec names (`kubectl get -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_scaling_group_count: Option<i32>,
    /// When the group's Refresher next runs, if a refresh is scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_refresh: Option<DateTime<Utc>>,
    /// What the group's instances cost and what spot saved, this month,
    /// in each of the 13 before it, and in all (docs/concepts/cost.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<super::CostRecord>,
    /// The next disruption the manager will make on its own in the group,
    /// in one line: the sooner of its Refresher's and its Replenisher's
    /// (their `status.next` has the detail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// What `kubectl get nodegroups` says of a group, the first that holds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum GroupState {
    /// `SpecValid` is False: the group does nothing until its spec is fixed.
    InvalidSpec,
    /// `spec.suspend`: the group does nothing by request.
    Suspended,
    /// A kops rolling update is replacing the group's nodes (condition
    /// `ExternalUpdate`): the manager makes no AWS mutation of its own.
    ExternalUpdate,
    /// Instances run on the on-demand fallback ASGs (every spot ASG was
    /// short): condition `FallbackOnDemand` says how many and why.
    FallbackOnDemand,
    /// An ASG is missing or cannot launch, or the circuit breaker is open.
    Degraded,
    /// A refresh run holds the group's lock.
    Refreshing,
    /// The replenisher holds the group's lock while a node is NotReady past
    /// `replenish.unhealthyTimeout`: it is repairing it.
    Repairing,
    /// The replenisher holds the group's lock, or fewer nodes are Ready than
    /// desired (before the lock, e.g. while new nodes join).
    Replenishing,
    /// None of the above: the desired count is Ready and nothing is running.
    Ready,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastInterruption {
    /// The Node the notice was for.
    pub node: String,
    /// Its EC2 instance.
    pub instance_id: String,
    /// The notice's kind: `spot_interruption`, `rebalance_recommendation`,
    /// `state_change`, `scheduled_change`, `scheduled_maintenance` or
    /// `terminate_lifecycle_action`.
    pub kind: String,
    /// When AWS emitted the notice.
    pub noticed: DateTime<Utc>,
    /// By when the node's drain had to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// When AWS said the instance goes (a scheduled retirement or stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_at: Option<DateTime<Utc>>,
    /// The notice reached us after its drain deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<bool>,
    /// When the node's drain ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<DateTime<Utc>>,
}

impl LastInterruption {
    /// The notice `node` records, if any.
    pub fn of(node: &NodeStatus) -> Option<LastInterruption> {
        let i = node.interruption.as_ref()?;
        Some(LastInterruption {
            node: node.name.clone(),
            instance_id: node.instance_id.clone().unwrap_or_default(),
            kind: i.kind.clone(),
            noticed: i.noticed,
            deadline: Some(i.deadline),
            loss_at: i.loss_at,
            late: i.late,
            drained: i.drained,
        })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The Node's name.
    pub name: String,
    /// From `spec.providerID` (`aws:///<zone>/<instance-id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The ASG the instance is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_scaling_group: Option<String>,
    /// The instance's zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// The instance's type, e.g. `m5.large`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// spot or on-demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<String>,
    /// When EC2 launched the instance (what `maxNodeAge` measures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_time: Option<DateTime<Utc>>,
    /// Ready condition True and the Node not being deleted.
    pub ready: bool,
    /// Since when the node's Ready condition has not been True (False or
    /// Unknown, continuously): its lastTransitionTime, kept across a
    /// change between False and Unknown. Absent while Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_since: Option<DateTime<Utc>>,
    /// Cordoned (by anyone).
    pub unschedulable: bool,
    /// Why this node could not be matched to an instance (e.g. a bad providerID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Why the node is drifted, when it is: its instance was launched from
    /// another launch template version (or template, or launch
    /// configuration) than its ASG launches from now, or the Node carries
    /// kops's `kops.k8s.io/needs-update` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drifted: Option<String>,
    /// The interruption notice recorded on the node (by the interruption
    /// handler): the node is leaving and no longer counts as Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption: Option<NodeInterruption>,
}

/// An interruption notice as the node records it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeInterruption {
    /// `spot_interruption`, `rebalance_recommendation`, `state_change`,
    /// `scheduled_change`, `scheduled_maintenance` or
    /// `terminate_lifecycle_action`.
    pub kind: String,
    /// When AWS emitted the notice.
    pub noticed: DateTime<Utc>,
    /// The drain must be finished by then.
    pub deadline: DateTime<Utc>,
    /// When AWS said the instance goes (a scheduled retirement or stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_at: Option<DateTime<Utc>>,
    /// From when the node is replaced and drained, when not at once (a
    /// scheduled change days away); until then it counts as Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_from: Option<DateTime<Utc>>,
    /// The notice reached us after its drain deadline (drained anyway, in
    /// a short window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<bool>,
    /// When the drain ended (drained, or its deadline passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<DateTime<Utc>>,
}

/// The kind of a notice recorded on a node (`NodeInterruption::kind`, the
/// interruption handler's metric label), typed: what a plan decides from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeClass {
    SpotInterruption,
    RebalanceRecommendation,
    StateChange,
    ScheduledChange,
    ScheduledMaintenance,
    TerminateLifecycleAction,
    /// A kind this version does not know (written by a newer one).
    Unknown,
}

impl NoticeClass {
    /// Every kind this version knows (not `Unknown`).
    pub const ALL: [NoticeClass; 6] = [
        NoticeClass::SpotInterruption,
        NoticeClass::RebalanceRecommendation,
        NoticeClass::StateChange,
        NoticeClass::ScheduledChange,
        NoticeClass::ScheduledMaintenance,
        NoticeClass::TerminateLifecycleAction,
    ];

    /// The label recorded in status and used in metrics.
    pub const fn label(self) -> &'static str {
        match self {
            NoticeClass::SpotInterruption => "spot_interruption",
            NoticeClass::RebalanceRecommendation => "rebalance_recommendation",
            NoticeClass::StateChange => "state_change",
            NoticeClass::ScheduledChange => "scheduled_change",
            NoticeClass::ScheduledMaintenance => "scheduled_maintenance",
            NoticeClass::TerminateLifecycleAction => "terminate_lifecycle_action",
            NoticeClass::Unknown => "unknown",
        }
    }

    pub fn of_label(label: &str) -> NoticeClass {
        Self::ALL
            .into_iter()
            .find(|c| c.label() == label)
            .unwrap_or(NoticeClass::Unknown)
    }
}

impl NodeInterruption {
    pub fn class(&self) -> NoticeClass {
        NoticeClass::of_label(&self.kind)
    }

    /// The notice is in force at `now`: its node is leaving or at risk (a
    /// scheduled change before its `drainFrom` is not yet; a rebalance
    /// recommendation older than [`AT_RISK_FOR`] is no longer).
    pub fn in_force(&self, now: DateTime<Utc>) -> bool {
        match self.class() {
            NoticeClass::RebalanceRecommendation => at_risk_at(self.noticed, now),
            _ => self.drain_from.is_none_or(|from| now >= from),
        }
    }

    /// When, after `now`, the notice comes into force (a scheduled change
    /// at its `drainFrom`) or leaves it (a rebalance recommendation at the
    /// end of its hold); None when it never changes again.
    pub fn changes_after(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let at = match self.class() {
            NoticeClass::RebalanceRecommendation => at_risk_until(self.noticed)?,
            _ => self.drain_from?,
        };
        (now < at).then_some(at)
    }
}

/// How long a rebalance recommendation holds its node at risk: time to
/// replace and remove it. A node still there after that (no ASG could
/// launch its replacement, or it was kept: protected, or every window
/// closed) is no longer taken for at risk; it counts as Ready again, and
/// what was raised for it is surplus the scale-in takes back. AWS never
/// withdraws a recommendation, and one that ended in no interruption must
/// not hold a node out of the count for its whole life.
pub const AT_RISK_FOR: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// A rebalance recommendation AWS sent at `noticed` still holds at `now`.
pub fn at_risk_at(noticed: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    at_risk_until(noticed).is_none_or(|end| now < end)
}

/// When a rebalance recommendation AWS sent at `noticed` stops holding its
/// node at risk (None: past any representable time).
fn at_risk_until(noticed: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let held = chrono::Duration::from_std(AT_RISK_FOR).ok()?;
    noticed.checked_add_signed(held)
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotJoinedInstance {
    /// The EC2 instance.
    pub instance_id: String,
    /// Its ASG.
    pub auto_scaling_group: String,
    /// Its zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// When it launched (`joinTimeout` counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_time: Option<DateTime<Utc>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoScalingGroupStatus {
    /// The ASG's name.
    pub name: String,
    /// Its desired capacity.
    pub desired: i32,
    /// Its minimum size.
    pub min: i32,
    /// Its maximum size.
    pub max: i32,
    /// Capacity as AWS counts it: InService and Pending instances.
    pub instances: i32,
    /// Of which Pending (launched, not yet InService).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending: i32,
    /// False when the ASG cannot be counted on to launch: Launch suspended,
    /// its newest launch failed, or below desired for longer than the launch
    /// grace. A launch in flight (lag, Pending) within the grace is launching.
    pub launching: bool,
    /// Why it is not launching, when `launching` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Since when it has been seen below its desired count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind_since: Option<DateTime<Utc>>,
    /// The newest launch activity's failure, while below desired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_failure: Option<String>,
    /// Its suspended scaling processes (a group with Launch or Terminate suspended
    /// starts no refresh).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspended_processes: Vec<String>,
    /// An on-demand fallback ASG (`spec.fallback`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fallback: bool,
    /// The spot price of this pool, in US dollars an hour (the instance
    /// type most of its instances run, in its zone), as last read: a raise
    /// prefers the cheaper of two pools alike in record and size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_price: Option<String>,
    /// The on-demand price of the same instance type, in US dollars an hour
    /// (what an hour of a fallback node costs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand_price: Option<String>,
    /// What happened to this pool over the last 24 hours (interruption
    /// warnings, rebalance recommendations, launch failures; at most 50):
    /// a raise elsewhere prefers the ASG with the fewest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<super::PoolEvent>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum OperationKind {
    Refresh,
    Replenish,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationLock {
    /// `Refresh` or `Replenish`: which child controller holds the group's lock.
    pub holder: OperationKind,
    /// Name of the Refresher or Replenisher holding the lock.
    pub holder_name: String,
    /// When it took the lock.
    pub since: DateTime<Utc>,
}

/// The SpecValid reason of a group naming an ASG another group names.
pub const ASG_CONFLICT: &str = "AutoScalingGroupConflict";
/// The SpecValid reason of a fallback ASG whose MinSize is above 0.
pub const FALLBACK_MIN_SIZE: &str = "FallbackMinSizeAboveZero";
/// SpecValid reasons found against what AWS or the other groups say, not
/// in the spec alone: `spec.validate()` does not see them.
pub const FOUND_OUTSIDE_THE_SPEC: [&str; 2] = [ASG_CONFLICT, FALLBACK_MIN_SIZE];

/// The circuit breaker's default share of NotReady nodes, in percent.
pub const DEFAULT_MAX_NOT_READY_PERCENT: i32 = 50;

impl NodeGroup {
    /// Why nothing in the group may be terminated now (the inventory's
    /// circuit breaker condition is True), if so.
    pub fn breaker_open(&self) -> Option<String> {
        self.status.as_ref()?.conditions.iter().find_map(|c| {
            (c.type_ == CIRCUIT_BREAKER && c.status == ConditionStatus::True)
                .then(|| c.message.clone())
        })
    }

    /// Why the group must make no AWS mutation of its own now: a kops
    /// rolling update is replacing its nodes (the inventory's
    /// `ExternalUpdate` condition is True), if so.
    pub fn external_update(&self) -> Option<String> {
        self.status.as_ref()?.conditions.iter().find_map(|c| {
            (c.type_ == crate::crd::condition::EXTERNAL_UPDATE && c.status == ConditionStatus::True)
                .then(|| c.message.clone())
        })
    }

    /// Why the group must not act because another group names one of its
    /// ASGs (the inventory's SpecValid condition says so), if it must not.
    /// Why the spec may not be acted on, if so: its own validation, or
    /// another group naming one of its ASGs.
    pub fn invalid_spec(&self) -> Option<String> {
        let problems: Vec<String> = self
            .spec
            .validate()
            .into_iter()
            .map(|p| format!("spec.{}: {}", p.field, p.message))
            .collect();
        if !problems.is_empty() {
            return Some(problems.join("; "));
        }
        self.invalid_outside_spec()
    }

    /// Why the group is invalid by what the inventory found outside its
    /// spec (another group naming one of its ASGs, a fallback ASG whose
    /// MinSize is above 0), if it is.
    pub fn invalid_outside_spec(&self) -> Option<String> {
        self.status.as_ref()?.conditions.iter().find_map(|c| {
            (c.type_ == SPEC_VALID
                && c.status == ConditionStatus::False
                && FOUND_OUTSIDE_THE_SPEC.contains(&c.reason.as_str()))
            .then(|| c.message.clone())
        })
    }
}

#[cfg(test)]
mod notice_tests {
    use super::NoticeClass;

    #[test]
    fn every_notice_class_round_trips_through_its_recorded_label() {
        for class in NoticeClass::ALL {
            assert_eq!(NoticeClass::of_label(class.label()), class);
        }
        assert_eq!(
            NoticeClass::of_label("from_a_newer_manager"),
            NoticeClass::Unknown
        );
    }

    /// The reference says the kinds the manager writes (it once listed
    /// kinds it never wrote).
    #[test]
    fn the_schema_names_every_kind_written() {
        for schema in [
            schemars::schema_for!(super::LastInterruption),
            schemars::schema_for!(super::NodeInterruption),
        ] {
            let said = schema
                .as_value()
                .pointer("/properties/kind/description")
                .and_then(|d| d.as_str())
                .unwrap_or_default()
                .to_string();
            for class in NoticeClass::ALL {
                assert!(
                    said.contains(&format!("`{}`", class.label())),
                    "{class:?}: {said}"
                );
            }
        }
    }
}
