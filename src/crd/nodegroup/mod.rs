//! `NodeGroup`: one per kops master or worker group, written by the user.
// Each `printcolumn(...)` repeats `type_`; clippy mistakes that for a duplicate.
#![allow(clippy::duplicated_attributes)]

use crate::duration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodemanager.dev",
    version = "v1alpha1",
    kind = "NodeGroup",
    namespaced,
    shortname = "ng",
    category = "nodemanager",
    status = "NodeGroupStatus",
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.desired"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyNodes"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(
        name = "Drifted",
        type_ = "integer",
        json_path = ".status.driftedNodes"
    ),
    printcolumn(
        name = "Operation",
        type_ = "string",
        json_path = ".status.operation.holder"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "ASGs",
        type_ = "integer",
        json_path = ".status.autoScalingGroupCount",
        priority = 1
    ),
    printcolumn(
        name = "Next Refresh",
        type_ = "string",
        json_path = ".status.nextRefresh",
        priority = 1
    ),
    printcolumn(
        name = "Savings",
        type_ = "string",
        json_path = ".status.cost.savings",
        priority = 1
    ),
    printcolumn(
        name = "Last Interruption",
        type_ = "date",
        json_path = ".status.lastInterruption.noticed",
        priority = 1
    ),
    printcolumn(
        name = "Next",
        type_ = "string",
        json_path = ".status.next",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupSpec {
    /// Whether the group holds control-plane (Master) or worker (Worker) nodes.
    pub role: Role,
    /// AWS region of the ASGs; the manager's configured region when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The group's Auto Scaling Groups (kops creates one per availability zone).
    #[schemars(length(min = 1))]
    pub auto_scaling_groups: Vec<AutoScalingGroupRef>,
    /// Selects the group's Nodes. Default: the ASGs' kops instance-group labels,
    /// or the Nodes on the ASGs' own instances when those are unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// How many Ready nodes the group should have; 0 to 10000.
    #[schemars(range(min = 0, max = 10000))]
    pub desired: i32,
    /// The circuit breaker: when more than this share of the group's nodes
    /// (in percent) is NotReady at once (a network partition, a broken
    /// kubelet fleet), nothing in the group is terminated until it closes;
    /// replacements are still launched. 0 to 100; default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_not_ready_percent: Option<i32>,
    /// Pause every action on this group (the inventory keeps reporting).
    #[serde(default)]
    pub suspend: bool,
    /// The replenisher: keeps Ready nodes at `desired` by launching in the
    /// ASGs that can, removes instances that never joined, repairs
    /// unhealthy nodes, and goes back to the original layout afterwards.
    #[serde(default)]
    pub replenish: ReplenishSpec,
    /// How interruption notices for this group's nodes are handled (when the
    /// manager reads an interruption queue).
    #[serde(default)]
    pub interruption: InterruptionSpec,
    /// Scheduled rolling replacement; no refresh when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<RefreshSpec>,
    /// What is done with nodes whose instance was launched from another
    /// launch template version than their ASG launches now (after `kops
    /// update cluster`), or that kops marks `kops.k8s.io/needs-update`.
    #[serde(default)]
    pub drift: DriftSpec,
    /// When, and what, voluntary disruption may touch: maintenance windows,
    /// do-not-disrupt, pods nothing would recreate.
    #[serde(default, skip_serializing_if = "is_default")]
    pub disruption: DisruptionSpec,
    /// On-demand ASGs to fall back to when every spot ASG is short, and to
    /// return from once spot launches again (workers only); none when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSpec>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftSpec {
    /// `Report` (default): status, Event and metric only. `Replace`: drifted
    /// nodes are rolled within a minute of detection, with `refresh`'s
    /// surplus, drain and ready settings (their defaults without `refresh`).
    #[serde(default)]
    pub action: DriftAction,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DriftAction {
    #[default]
    Report,
    Replace,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Role {
    Master,
    Worker,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct AutoScalingGroupRef {
    /// The ASG's name, e.g. kops's `nodes-ap-northeast-1a.example.com`. An
    /// ASG that another NodeGroup also names (in one region) makes both
    /// groups invalid until one lets go.
    #[schemars(length(min = 1, max = 255))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplenishSpec {
    /// Run the replenisher (and create the group's Replenisher). Default true.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Minimum time between two ASG capacity changes; 10s to 24h.
    #[serde(default = "default_cooldown")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub cooldown: String,
    /// An instance that has not joined as a Node after this long is removed
    /// (for masters: any instance beyond the configured count, at once);
    /// 2m to 24h (shorter removes nodes that merely boot slowly).
    #[serde(default = "default_join_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub join_timeout: String,
    /// A node whose Ready condition has been False or Unknown this long
    /// (from the condition's lastTransitionTime) is unhealthy: it no longer
    /// counts as on its way, and is repaired. 1m to 24h; default 10m.
    #[serde(default = "default_unhealthy_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub unhealthy_timeout: String,
    /// Repair unhealthy nodes: a worker is replaced, then drained (best
    /// effort) and terminated with decrement; a master is terminated in its
    /// ASG, one at a time. `false` keeps them running (a replacement is
    /// still launched beside a worker). Default true.
    #[serde(default = "default_true")]
    pub repair: bool,
}

/// The time from a notice (AWS's time) by which a doomed node's drain must be
/// finished, unless the group says otherwise.
pub const DEFAULT_DRAIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(90);
/// Bounds of `interruption.drainDeadline`: a spot warning gives two minutes.
pub const DRAIN_DEADLINE_BOUNDS: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_secs(10),
    std::time::Duration::from_secs(120),
);

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterruptionSpec {
    /// From the notice's time (AWS's, not receipt), by when the drain of an
    /// interrupted node must be finished; 10s to 2m.
    #[serde(default = "default_drain_deadline")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub drain_deadline: String,
    /// How long before AWS takes an instance on a scheduled change (a
    /// retirement or stop, announced days ahead) its node is cordoned,
    /// replaced and drained; until then it serves on. 10m to 720h; a notice
    /// nearer than this is acted on at once.
    #[serde(default = "default_scheduled_change_lead")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub scheduled_change_lead: String,
    /// What a rebalance recommendation (elevated risk of interruption) does:
    /// `Ignore` writes an Event; `Replace` launches a replacement and, once
    /// it is Ready, drains and removes the node.
    #[serde(default)]
    pub on_rebalance_recommendation: OnRebalance,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OnRebalance {
    #[default]
    Ignore,
    Replace,
}

impl Default for InterruptionSpec {
    fn default() -> Self {
        Self {
            drain_deadline: default_drain_deadline(),
            scheduled_change_lead: default_scheduled_change_lead(),
            on_rebalance_recommendation: OnRebalance::Ignore,
        }
    }
}

impl InterruptionSpec {
    /// The drain deadline; the default when invalid (validation reports it).
    pub fn drain_deadline(&self) -> std::time::Duration {
        duration::parse(&self.drain_deadline)
            .ok()
            .filter(|d| (DRAIN_DEADLINE_BOUNDS.0..=DRAIN_DEADLINE_BOUNDS.1).contains(d))
            .unwrap_or(DEFAULT_DRAIN_DEADLINE)
    }

    /// The scheduled change lead; the default when invalid (validation
    /// reports it).
    pub fn scheduled_change_lead(&self) -> std::time::Duration {
        duration::parse(&self.scheduled_change_lead)
            .ok()
            .filter(|d| {
                (SCHEDULED_CHANGE_LEAD_BOUNDS.0..=SCHEDULED_CHANGE_LEAD_BOUNDS.1).contains(d)
            })
            .unwrap_or(DEFAULT_SCHEDULED_CHANGE_LEAD)
    }
}

fn default_drain_deadline() -> String {
    "90s".into()
}

/// A scheduled change's node is replaced and drained this long before AWS
/// takes it, unless the group says otherwise: time for a replacement to
/// launch, join (a master's etcd too) and take the pods, with room for a
/// launch that fails a few times.
pub const DEFAULT_SCHEDULED_CHANGE_LEAD: std::time::Duration = std::time::Duration::from_secs(3600);
/// Bounds of `interruption.scheduledChangeLead`.
pub const SCHEDULED_CHANGE_LEAD_BOUNDS: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_secs(600),
    std::time::Duration::from_secs(30 * 24 * 3600),
);

fn default_scheduled_change_lead() -> String {
    "1h".into()
}

/// The unhealthy timeout when `replenish.unhealthyTimeout` does not parse
/// (validation reports it).
pub const DEFAULT_UNHEALTHY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

impl ReplenishSpec {
    /// `unhealthyTimeout`; the default when invalid (validation reports it).
    pub fn unhealthy_timeout(&self) -> std::time::Duration {
        duration::parse(&self.unhealthy_timeout).unwrap_or(DEFAULT_UNHEALTHY_TIMEOUT)
    }
}

impl Default for ReplenishSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            cooldown: default_cooldown(),
            join_timeout: default_join_timeout(),
            unhealthy_timeout: default_unhealthy_timeout(),
            repair: true,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefreshSpec {
    /// Cron, evaluated in `timeZone`: 5 fields (`min hour day month
    /// weekday`), or 6 with seconds first, or 7 with a trailing year;
    /// day and month names allowed (`Mon`, `Jan`).
    #[schemars(length(min = 1))]
    pub schedule: String,
    /// IANA time zone the schedule is read in, e.g. `Asia/Tokyo`.
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// Extra nodes added before replacing old ones. Default 1 for workers;
    /// must be 0 for masters (kops cannot run an extra master). At most 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub surplus_nodes: Option<i32>,
    /// Only nodes older than this are replaced; every node when unset. 1h
    /// to 8760h (a year).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub max_node_age: Option<String>,
    /// Bound on one node's drain; 30s to 24h.
    #[serde(default = "default_drain_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub drain_timeout: String,
    /// What to do when a drain times out: `Proceed` (terminate anyway) or
    /// `Abort` (stop the run; the failure names the PodDisruptionBudget that
    /// held the drain). Healthy nodes only: an unhealthy node is drained
    /// best effort and terminated.
    #[serde(default)]
    pub drain_timeout_action: DrainTimeoutAction,
    /// How long a new node may take to become Ready; 1m to 24h.
    #[serde(default = "default_ready_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub ready_timeout: String,
    /// Masters: a master counts as up only this long after its
    /// control-plane pods (kube-apiserver, etcd-manager) turned Ready, on
    /// every path: no other master is refreshed, rolled, repaired or
    /// retired by the manager before (the group's own; 2m for a group with
    /// no refresh settings); at most 1h.
    #[serde(default = "default_master_settle_time")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub master_settle_time: String,
    /// After each replacement, how long the run may wait for the group to
    /// be whole again before the next node: the replacement itself Ready
    /// and schedulable, and no pod the drain moved Pending or not Ready;
    /// 30s to 24h.
    #[serde(default = "default_validation_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub validation_timeout: String,
    /// What to do when that validation times out: `Abort` (default: the run
    /// fails, its surplus removed, the remaining old nodes kept) or
    /// `Proceed` (go on with the next node, with a Warning Event).
    #[serde(default)]
    pub validation_timeout_action: DrainTimeoutAction,
    /// How long a validated replacement must stay so before the next node;
    /// at most 1h.
    #[serde(default = "default_settle_time")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub settle_time: String,
    /// Workers: how many replacements may be launched ahead of their old
    /// node's termination (its ASG raised by one while the node drains,
    /// then terminated with decrement), so a node costs the longer of its
    /// drain and its replacement's launch, not both. A count or a
    /// percentage of `desired` (rounded up), e.g. `2` or `25%`; default 1;
    /// 0 launches each replacement only once its old node is gone. Masters
    /// are always replaced one at a time, terminated first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    /// How long a run may stay paused (the group suspended or its spec
    /// invalid, its circuit breaker open, a kops rolling update, a closed
    /// window with `onWindowClose: Wait`, another holder of the lock or the
    /// disruption slots) before it is set aside: its lock and slot given
    /// back, its surplus left for the replenisher to take back, the rest
    /// resumed later. A paused run with fewer Ready nodes than desired is
    /// set aside at once, so the replenisher can replace them. While the
    /// refresh settings themselves are invalid (an edit, another NodeGroup
    /// naming one of its ASGs), the default applies. 1m to 168h; default 1h.
    #[serde(default = "default_pause_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub pause_timeout: String,
}

pub(crate) fn default_pause_timeout() -> String {
    "1h".into()
}

/// `pauseTimeout`'s default, as a duration: what bounds a pause while the
/// settings themselves are invalid.
pub const DEFAULT_PAUSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// `masterSettleTime`'s default, as a duration: what the disruption
/// authority waits after a master's control plane is Ready in a group with
/// no refresh settings.
pub const DEFAULT_MASTER_SETTLE_TIME: std::time::Duration = std::time::Duration::from_secs(120);

fn default_master_settle_time() -> String {
    "2m".into()
}

pub(crate) fn default_validation_timeout() -> String {
    "10m".into()
}

pub(crate) fn default_settle_time() -> String {
    "5s".into()
}

impl RefreshSpec {
    /// The refresh defaults with no schedule: what a drift roll of a group
    /// without `refresh` runs with.
    pub fn unscheduled() -> Self {
        Self {
            schedule: String::new(),
            time_zone: default_time_zone(),
            surplus_nodes: None,
            max_node_age: None,
            drain_timeout: default_drain_timeout(),
            drain_timeout_action: DrainTimeoutAction::default(),
            ready_timeout: default_ready_timeout(),
            master_settle_time: default_master_settle_time(),
            validation_timeout: default_validation_timeout(),
            validation_timeout_action: DrainTimeoutAction::default(),
            settle_time: default_settle_time(),
            max_surge: None,
            pause_timeout: default_pause_timeout(),
        }
    }
}

/// What a timeout does: for a drain (`drainTimeoutAction`) and for the
/// validation after a replacement (`validationTimeoutAction`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DrainTimeoutAction {
    /// Go on anyway: terminate the node (a drain), take the next node (a
    /// validation).
    Proceed,
    /// Stop the refresh: its surplus removed, the old nodes left kept.
    #[default]
    Abort,
}

fn default_true() -> bool {
    true
}
fn default_cooldown() -> String {
    "5m".into()
}
fn default_join_timeout() -> String {
    "15m".into()
}
fn default_unhealthy_timeout() -> String {
    "10m".into()
}
fn default_time_zone() -> String {
    "UTC".into()
}
fn default_drain_timeout() -> String {
    "5m".into()
}
fn default_ready_timeout() -> String {
    "15m".into()
}

mod cost;
mod disruption;
mod fallback;
mod pool;
mod status;
mod validation;

pub use cost::*;
pub use disruption::*;
pub use fallback::*;
pub use pool::*;
pub use status::*;
pub use validation::*;
