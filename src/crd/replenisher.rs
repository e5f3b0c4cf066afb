//! `Replenisher`: created by the manager, one per NodeGroup with replenish
//! enabled. Status records its last action and the ASGs it is avoiding.
// Each `printcolumn(...)` repeats `type_`; clippy mistakes that for a duplicate.
#![allow(clippy::duplicated_attributes)]

use super::condition::{Condition, list_map_by_type};
use super::nodegroup::Role;
use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodemanager.dev",
    version = "v1alpha1",
    kind = "Replenisher",
    namespaced,
    shortname = "rp",
    category = "nodemanager",
    status = "ReplenisherStatus",
    printcolumn(name = "Group", type_ = "string", json_path = ".spec.nodeGroup"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Last Action",
        type_ = "string",
        json_path = ".status.lastAction.description"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ReplenisherSpec {
    /// Name of the owning NodeGroup (same namespace).
    pub node_group: String,
    /// Copied from the NodeGroup (the manager writes this spec), as are the fields
    /// below: see the NodeGroup reference.
    pub role: Role,
    /// The NodeGroup's `desired`.
    #[schemars(range(min = 0))]
    pub desired: i32,
    /// The NodeGroup's `replenish.cooldown`.
    pub cooldown: String,
    /// The NodeGroup's `replenish.joinTimeout`.
    pub join_timeout: String,
    /// The NodeGroup's `suspend`.
    #[serde(default)]
    pub suspend: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReplenishPhase {
    /// Ready nodes match the desired count.
    #[default]
    Steady,
    /// Raising desired capacity on launching ASGs, until what was raised
    /// joins (the group's lock is kept meanwhile).
    ScalingUp,
    /// Removing explicitly chosen surplus instances.
    ScalingDown,
    /// Removing instances that never joined.
    CleaningUp,
    /// Repairing an unhealthy node: draining it (best effort) and
    /// terminating it once its replacement is Ready (a master: in its ASG).
    Repairing,
    /// Waiting on time (the cooldown, a backoff, a window, protected
    /// nodes, a disruption slot), holding neither the group's lock nor a
    /// slot.
    Waiting,
    /// Not acting: suspended, or a refresh holds the lock.
    Paused,
    /// Cannot act: no ASG can launch, or the spec is invalid.
    Blocked,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplenisherStatus {
    /// The spec generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where the replenisher is; the `Replenished` condition says why it
    /// waits, pauses or is blocked.
    #[serde(default)]
    pub phase: ReplenishPhase,
    /// The last thing it did (`kubectl get rp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_action: Option<LastAction>,
    /// ASGs left out of scale-up, and why.
    #[serde(default)]
    pub excluded: Vec<ExcludedAsg>,
    /// How many instances this replenisher added to each ASG: the surplus to
    /// take back, from these ASGs, once the shortage is over.
    #[serde(default)]
    pub raised: Vec<AsgCount>,
    /// How many instances this replenisher's removals left each ASG below
    /// its count (a never-joined instance or a repaired node removed with
    /// decrement, nothing raised there to take back): raised again once
    /// Ready is at desired and another ASG's raise can be taken back, so
    /// the original layout comes back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lowered: Vec<AsgCount>,
    /// The Refresher's `surplusLeft` taken over into `raised` (its `at`):
    /// each is taken over once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_over: Option<DateTime<Utc>>,
    /// The instance being removed (drained, then terminated with decrement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in: Option<ScaleInTarget>,
    /// Raises recorded before they are made: after a restart, each is
    /// checked against the ASG's desired count (landed or not), never redone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raising: Vec<Raise>,
    /// The never-joined instance being removed, recorded before the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<CleanupTarget>,
    /// Never-joined instances removed per ASG in a row (reset once one of
    /// its instances joins): the next removal backs off while it grows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removals: Vec<NotJoinedRemovals>,
    /// Since when each ASG has been below its desired count: the launch
    /// grace runs from here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<AsgSince>,
    /// Capacity raised for interrupted nodes before their loss, one entry per
    /// node: never raised twice, and a termination decrements only the ASG
    /// that was raised for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replacing: Vec<Replacement>,
    /// Interrupted instances being terminated (drained or at their
    /// deadline), recorded before the call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retiring: Vec<Retirement>,
    /// Time of the last ASG modification, for the cooldown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modification: Option<DateTime<Utc>>,
    /// With `spec.fallback`: since when Ready has been below desired with
    /// no spot ASG able to launch (the fallback is raised `after` it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_since: Option<DateTime<Utc>>,
    /// With `spec.fallback`: each spot ASG able to launch, since when
    /// (without a failure since); a fallback node is replaced by spot once
    /// one has been so for `returnAfter`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spot_launching: Vec<AsgSince>,
    /// The next disruption this Replenisher will make on its own, as its
    /// plan sees it now: a repair, a removal of a surplus or at-risk node or
    /// of an instance that never joined; when, why, the nodes, what would
    /// hold them. Interrupted nodes are not here (AWS takes them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<super::next::NextDisruption>,
    /// Replenished, RepairAllowed: see docs/operations.md.
    #[serde(default)]
    #[schemars(transform = list_map_by_type)]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastAction {
    /// What was done, e.g. `raised nodes-a from 1 to 2: 1 Ready node short`.
    pub description: String,
    /// When.
    pub time: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsgCount {
    /// The ASG.
    pub auto_scaling_group: String,
    /// How many.
    pub count: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleInTarget {
    /// The node being removed.
    pub node: String,
    /// Its EC2 instance.
    pub instance_id: String,
    /// Its ASG.
    pub auto_scaling_group: String,
    /// When the drain started (its timeout runs from here).
    pub since: DateTime<Utc>,
    /// Set (and the raise record taken back) before the termination is
    /// made: a restart retries that termination, never a second node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminating: Option<DateTime<Utc>>,
    /// Terminate with decrement (a surplus node, or an at-risk node replaced
    /// in its own ASG); without, its ASG launches one in its place.
    #[serde(default = "yes")]
    pub decrement: bool,
    /// A repair of an unhealthy node: drained best effort (a pod counts as
    /// gone once its deletion is asked; evictions are tried for at most
    /// `REPAIR_DRAIN_TIMEOUT`), then terminated; never abandoned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
    /// Why it is removed, in the rule book's terms: a reason's label
    /// (`scale_in`, `at_risk`, `fallback_return`, `worker_repair`,
    /// `master_repair`). Decided once, when it is chosen; the executor's
    /// check before each of its steps asks that reason's rules. A record
    /// written before this field gets it on its next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Replacement {
    /// The interrupted node and its instance.
    pub node: String,
    /// The instance a replacement was raised for (interrupted, at risk or
    /// unhealthy).
    pub instance_id: String,
    /// Where its replacement was launched (its own ASG when that one could).
    pub auto_scaling_group: String,
    /// When.
    pub since: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retirement {
    /// The interrupted node being terminated by the manager.
    pub node: String,
    /// Its EC2 instance.
    pub instance_id: String,
    /// The instance's own ASG.
    pub auto_scaling_group: String,
    /// Its replacement was launched in this ASG: take that raise back.
    pub decrement: bool,
    /// When its termination was recorded.
    pub since: DateTime<Utc>,
    /// The ASG's desired count then, less this decrement: found unchanged
    /// once the instance is gone, AWS took it first (the ASG launches in its
    /// place), and the raise the decrement was to take back is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_before: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Raise {
    /// The ASG being raised (recorded before the call).
    pub auto_scaling_group: String,
    /// Its desired count before.
    pub from: i32,
    /// Its desired count after.
    pub to: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CleanupTarget {
    /// The never-joined instance being removed (recorded before the call).
    pub instance_id: String,
    /// Its ASG.
    pub auto_scaling_group: String,
    /// Why (joined too late, or a master beyond the count).
    pub reason: String,
    /// Lower the ASG's desired count with it (only while above its min;
    /// otherwise the ASG launches a fresh instance in its place).
    pub decrement: bool,
    /// When it was chosen.
    pub since: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotJoinedRemovals {
    /// An ASG whose instances keep not joining.
    pub auto_scaling_group: String,
    /// Removals in a row there.
    pub count: i32,
    /// The last one (the next waits 1m, 2m, 4m .. 30m after it).
    pub last: DateTime<Utc>,
    /// No further removal in this ASG before then.
    pub retry_after: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsgSince {
    /// The ASG.
    pub auto_scaling_group: String,
    /// Since when.
    pub since: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExcludedAsg {
    /// An ASG not counted on to launch.
    pub auto_scaling_group: String,
    /// Why (a failed launch, behind its desired count past the grace, Launch
    /// suspended, at max).
    pub reason: String,
    /// Since when.
    pub since: DateTime<Utc>,
    /// Not retried before this time (backoff grows while it keeps failing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<DateTime<Utc>>,
    /// Failures in a row: the re-check backs off from 1m, doubling to 30m.
    #[serde(default)]
    pub failures: i32,
}
