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
    pub role: Role,
    #[schemars(range(min = 0))]
    pub desired: i32,
    pub cooldown: String,
    pub join_timeout: String,
    #[serde(default)]
    pub suspend: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReplenishPhase {
    /// Ready nodes match the desired count.
    #[default]
    Steady,
    /// Raising desired capacity on launching ASGs.
    ScalingUp,
    /// Removing explicitly chosen surplus instances.
    ScalingDown,
    /// Removing instances that never joined.
    CleaningUp,
    /// Repairing an unhealthy node: draining it (best effort) and
    /// terminating it once its replacement is Ready (a master: in its ASG).
    Repairing,
    /// Waiting out the cooldown or for launched nodes to become Ready.
    Waiting,
    /// Not acting: suspended, or a refresh holds the lock.
    Paused,
    /// Cannot act: no ASG can launch, or the spec is invalid.
    Blocked,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplenisherStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub phase: ReplenishPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_action: Option<LastAction>,
    /// ASGs left out of scale-up, and why.
    #[serde(default)]
    pub excluded: Vec<ExcludedAsg>,
    /// How many instances this replenisher added to each ASG: the surplus to
    /// take back, from these ASGs, once the shortage is over.
    #[serde(default)]
    pub raised: Vec<AsgCount>,
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
    #[serde(default)]
    #[schemars(transform = list_map_by_type)]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastAction {
    pub description: String,
    pub time: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsgCount {
    pub auto_scaling_group: String,
    pub count: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleInTarget {
    pub node: String,
    pub instance_id: String,
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
}

fn yes() -> bool {
    true
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Replacement {
    /// The interrupted node and its instance.
    pub node: String,
    pub instance_id: String,
    /// Where its replacement was launched (its own ASG when that one could).
    pub auto_scaling_group: String,
    pub since: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retirement {
    pub node: String,
    pub instance_id: String,
    /// The instance's own ASG.
    pub auto_scaling_group: String,
    /// Its replacement was launched in this ASG: take that raise back.
    pub decrement: bool,
    pub since: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Raise {
    pub auto_scaling_group: String,
    pub from: i32,
    pub to: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CleanupTarget {
    pub instance_id: String,
    pub auto_scaling_group: String,
    pub reason: String,
    /// Lower the ASG's desired count with it (only while above its min;
    /// otherwise the ASG launches a fresh instance in its place).
    pub decrement: bool,
    pub since: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotJoinedRemovals {
    pub auto_scaling_group: String,
    pub count: i32,
    pub last: DateTime<Utc>,
    /// No further removal in this ASG before then.
    pub retry_after: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsgSince {
    pub auto_scaling_group: String,
    pub since: DateTime<Utc>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExcludedAsg {
    pub auto_scaling_group: String,
    pub reason: String,
    pub since: DateTime<Utc>,
    /// Not retried before this time (backoff grows while it keeps failing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<DateTime<Utc>>,
    #[serde(default)]
    pub failures: i32,
}
