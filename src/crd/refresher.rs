//! `Refresher`: created by the manager, one per NodeGroup with `refresh` set.
//! Its status is the persisted memory of a rolling replacement, so a restarted
//! manager resumes exactly where it was.
// Each `printcolumn(...)` repeats `type_`; clippy mistakes that for a duplicate.
#![allow(clippy::duplicated_attributes)]

use super::condition::{Condition, list_map_by_type};
use super::nodegroup::{DrainTimeoutAction, Role};
use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodemanager.dev",
    version = "v1alpha1",
    kind = "Refresher",
    namespaced,
    shortname = "rf",
    category = "nodemanager",
    status = "RefresherStatus",
    printcolumn(name = "Group", type_ = "string", json_path = ".spec.nodeGroup"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Trigger", type_ = "string", json_path = ".status.trigger"),
    printcolumn(name = "Next Run", type_ = "string", json_path = ".status.nextRun"),
    printcolumn(name = "Progress", type_ = "string", json_path = ".status.progress"),
    printcolumn(name = "Window", type_ = "string", json_path = ".status.window"),
    printcolumn(name = "Next", type_ = "string", json_path = ".status.next.summary"),
    printcolumn(
        name = "Last Result",
        type_ = "string",
        json_path = ".status.lastRun.result"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RefresherSpec {
    /// Name of the owning NodeGroup (same namespace).
    pub node_group: String,
    /// Copied from the NodeGroup (the manager writes this spec), as are the fields
    /// below: see the NodeGroup reference.
    pub role: Role,
    /// Cron expression; absent for a group with no scheduled refresh (its
    /// Refresher only rolls drifted nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The NodeGroup's `refresh.timeZone`.
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// The NodeGroup's `refresh.surplusNodes`, resolved (1 for workers, 0 for
    /// masters when unset).
    #[schemars(range(min = 0))]
    pub surplus_nodes: i32,
    /// The NodeGroup's `refresh.maxNodeAge`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_node_age: Option<String>,
    /// The NodeGroup's `refresh.drainTimeout`.
    pub drain_timeout: String,
    /// The NodeGroup's `refresh.drainTimeoutAction`.
    pub drain_timeout_action: DrainTimeoutAction,
    /// The NodeGroup's `refresh.readyTimeout`.
    pub ready_timeout: String,
    /// The NodeGroup's `refresh.masterSettleTime`.
    #[serde(default = "default_master_settle_time")]
    pub master_settle_time: String,
    /// The NodeGroup's `refresh.validationTimeout`.
    #[serde(default = "super::nodegroup::default_validation_timeout")]
    pub validation_timeout: String,
    /// The NodeGroup's `refresh.validationTimeoutAction`.
    #[serde(default)]
    pub validation_timeout_action: DrainTimeoutAction,
    /// The NodeGroup's `refresh.settleTime`.
    #[serde(default = "super::nodegroup::default_settle_time")]
    pub settle_time: String,
    /// The NodeGroup's `refresh.maxSurge`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// The NodeGroup's `refresh.pauseTimeout`.
    #[serde(default = "super::nodegroup::default_pause_timeout")]
    pub pause_timeout: String,
    /// The NodeGroup's `suspend`.
    #[serde(default)]
    pub suspend: bool,
    /// The group's `drift.action` is `Replace`: drifted nodes are rolled
    /// without waiting for the schedule.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drift_replace: bool,
}

fn default_time_zone() -> String {
    "UTC".into()
}

fn default_master_settle_time() -> String {
    "2m".into()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RefreshPhase {
    /// Waiting for the next scheduled run.
    #[default]
    Idle,
    /// Due, waiting for the group's operation lock.
    WaitingForLock,
    /// Due, waiting for a manager-wide disruption slot (another group is
    /// disrupting; `--max-concurrent-disruptions`, one Master group at a time).
    WaitingForSlot,
    /// Due (or set aside), waiting for a maintenance window to open.
    WaitingForWindow,
    /// Adding surplus nodes and waiting for them to be Ready.
    ScalingUp,
    /// Draining the current target.
    Draining,
    /// Target terminated, waiting for its replacement to be Ready.
    WaitingForReplacement,
    /// Removing the surplus nodes.
    ScalingDown,
    /// Nothing will run: the spec is invalid or the group suspended.
    Blocked,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefresherStatus {
    /// The spec generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where the refresher is; the conditions and the Events say why it
    /// waits or is blocked.
    #[serde(default)]
    pub phase: RefreshPhase,
    /// The next scheduled run (`kubectl get rf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run: Option<DateTime<Utc>>,
    /// The schedule and zone `nextRun` was computed from ("<cron> in <zone>"),
    /// so an edited schedule is re-evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_from: Option<String>,
    /// Since when the run in progress has been paused (see
    /// `refresh.pauseTimeout`); absent while it steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_since: Option<DateTime<Utc>>,
    /// When the current phase began (its timeouts count from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_since: Option<DateTime<Utc>>,
    /// Start of the run in progress; absent when idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_start: Option<DateTime<Utc>>,
    /// What started the run in progress: its schedule, or drifted nodes
    /// (a drift roll, whose planned instances follow the drift).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<RunTrigger>,
    /// The node being replaced now, recorded before its drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_target: Option<RefreshTarget>,
    /// Planned nodes drained at the same time as the current target
    /// (`maxSurge` above 1): each has its replacement launched ahead and
    /// Ready beside it. Each is terminated once drained (recorded here
    /// first); the batch is validated as one step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alongside: Vec<RefreshTarget>,
    /// Since when the current replacement is being validated (its node
    /// Ready again; `validationTimeout` runs from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validating_since: Option<DateTime<Utc>>,
    /// Since when every validation check has passed (`settleTime` runs
    /// from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validated_since: Option<DateTime<Utc>>,
    /// Masters: since when every master's control-plane pods are Ready
    /// after a replacement (the settle time runs from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ready_since: Option<DateTime<Utc>>,
    /// Each ASG's desired count before the run raised it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub original_desired: Vec<AsgDesired>,
    /// Surplus nodes this run added, per ASG (removed before the run ends).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surplus: Vec<AsgDesired>,
    /// Planned nodes whose replacements were launched ahead (their ASG
    /// raised by one each, recorded before the raise): each is terminated
    /// with decrement once drained. At most `maxSurge` at a time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub launched_ahead: Vec<LaunchedAhead>,
    /// The instances to replace, oldest first, fixed when the run started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub planned_instances: Vec<String>,
    /// Instances this run terminated (never terminated twice).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced_instances: Vec<String>,
    /// Nodes replaced so far in the run in progress.
    #[serde(default)]
    pub replaced: i32,
    /// Nodes the run in progress replaces.
    #[serde(default)]
    pub total: i32,
    /// "replaced/total" for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Why the run in progress is failing (it is removing its surplus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Nodes the run (or the last one) left alone, protected from voluntary
    /// disruption, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedNode>,
    /// Since when the run has had only protected nodes left to replace
    /// (it waits for them up to `disruption.doNotDisruptTimeout`, at most
    /// the refresh's `pauseTimeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_since: Option<DateTime<Utc>>,
    /// The rest of a run whose maintenance window closed, with
    /// `disruption.onWindowClose: ScaleDown`: its surplus was removed, and
    /// it resumes in the next window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_run: Option<PendingRun>,
    /// The surplus the last run (or leg of one) left in its ASGs when it
    /// ended: a failed run that could not remove it while keeping the
    /// Ready count, surplus on protected nodes, a run set aside. The
    /// replenisher takes it over as a raise of its own (once per `at`),
    /// so it goes back, and the layout with it, once the count allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surplus_left: Option<SurplusLeft>,
    /// Surplus nodes this run kept (their drain given up): their ASGs'
    /// counts became the layout it ends at, and what they add is part of
    /// `surplusLeft` when it ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surplus_kept: Vec<super::replenisher::AsgCount>,
    /// The group's maintenance windows now: `Open until <time>` or `Closed
    /// until <time>`; absent without windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// The next disruption this Refresher will make on its own, as its plan
    /// sees it now: what, when, why, the nodes in order, what would hold them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<super::next::NextDisruption>,
    /// What the refresher is doing or waiting for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last run's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunOutcome>,
    /// ScheduleValid, ScheduleInWindow, ScalingProcesses, LastRunSucceeded: see docs/operations.md.
    #[serde(default)]
    #[schemars(transform = list_map_by_type)]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefreshTarget {
    /// The Node; absent for an instance that never joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The target's EC2 instance.
    pub instance_id: String,
    /// Its ASG.
    pub auto_scaling_group: String,
    /// Why it is taken: `Replace` (an old node) or `Surplus` (the run's surplus,
    /// removed at the end).
    pub purpose: TargetPurpose,
    /// Why the run takes it away, in the rule book's terms (`refresh`,
    /// `drift_roll`, `refresh_surplus`): decided once, when it is chosen,
    /// and carried to every step; a step of a target that carries none,
    /// or one its purpose does not fit, is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When work on it began (the drain).
    pub since: DateTime<Utc>,
    /// When its termination was decided; set before the call is made, so a
    /// restart retries this termination and never picks a second node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<DateTime<Utc>>,
    /// What last refused an eviction from its node (the PodDisruptionBudget,
    /// in the apiserver's words), so a drain given up says what held it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// Its node is unhealthy (NotReady past the unhealthy timeout): drained
    /// best effort, as a repair, and never given up on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unhealthy: bool,
    /// The controllers of the pods its drain moves (`<namespace>/<Kind>/<name>`),
    /// recorded before any is evicted: the step after its replacement waits
    /// until none of their pods is Pending or not Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<String>,
    /// When its replacement was launched ahead (see
    /// `RefresherStatus::launched_ahead`): it is then terminated with
    /// decrement, and its replacement is a node launched since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launched_ahead: Option<DateTime<Utc>>,
}

impl RefreshTarget {
    /// Whether its termination lowers its ASG's desired count: a surplus
    /// node, or a node whose replacement was launched ahead.
    pub fn decrements(&self) -> bool {
        self.purpose == TargetPurpose::RemoveSurplus || self.launched_ahead.is_some()
    }
}

impl RefresherStatus {
    /// The targets being worked on: the current one, then those drained
    /// alongside it.
    pub fn batch(&self) -> impl Iterator<Item = &RefreshTarget> + '_ {
        self.current_target.iter().chain(&self.alongside)
    }

    /// The target of the batch that is `instance_id`.
    pub fn batch_member_mut(&mut self, instance_id: &str) -> Option<&mut RefreshTarget> {
        self.current_target
            .iter_mut()
            .chain(&mut self.alongside)
            .find(|t| t.instance_id == instance_id)
    }
}

/// A planned node whose replacement was launched ahead of its termination.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaunchedAhead {
    /// The node whose replacement was launched ahead.
    pub instance_id: String,
    /// The ASG raised by one for it.
    pub auto_scaling_group: String,
    /// When its ASG was raised for it.
    pub since: DateTime<Utc>,
}

/// A run set aside until the next maintenance window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingRun {
    /// When the run first started.
    pub started: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<RunTrigger>,
    /// The planned instances not yet replaced, oldest first.
    pub remaining: Vec<String>,
    /// Nodes the run replaced before it was set aside.
    pub replaced: i32,
    /// Nodes the run had to replace in all.
    pub total: i32,
}

/// A planned node a run did not replace: protected (do-not-disrupt, a
/// foreign cordon, a pod nothing would recreate).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkippedNode {
    /// A protected node the run left alone.
    pub node: String,
    /// Its EC2 instance.
    pub instance_id: String,
    /// What protects it (a do-not-disrupt pod or Node, a foreign cordon, a pod
    /// nothing recreates).
    pub reason: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TargetPurpose {
    /// An old node, terminated without decrement so its ASG replaces it.
    Replace,
    /// A surplus node, terminated with decrement.
    RemoveSurplus,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsgDesired {
    /// The ASG.
    pub auto_scaling_group: String,
    /// Its desired count (recorded at the run's start, or the surplus added).
    pub desired: i32,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RunResult {
    Succeeded,
    Failed,
    Skipped,
}

impl RunResult {
    pub const ALL: [RunResult; 3] = [RunResult::Succeeded, RunResult::Failed, RunResult::Skipped];

    /// As status, Events and metrics write it.
    pub const fn label(self) -> &'static str {
        match self {
            RunResult::Succeeded => "Succeeded",
            RunResult::Failed => "Failed",
            RunResult::Skipped => "Skipped",
        }
    }
}

/// What started a run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RunTrigger {
    /// The cron schedule (every node, or those older than `maxNodeAge`).
    Schedule,
    /// Drifted nodes (`drift.action: Replace`): only those, and the ones
    /// that drift while it runs.
    Drift,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SurplusLeft {
    /// When the run (or leg) ended.
    pub at: DateTime<Utc>,
    /// Per ASG, how far its desired count was left above the run's record.
    pub asgs: Vec<super::replenisher::AsgCount>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunOutcome {
    /// When the run started.
    pub started: DateTime<Utc>,
    /// `Schedule` or `Drift`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<RunTrigger>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<DateTime<Utc>>,
    /// Nodes it replaced.
    pub replaced: i32,
    /// `Succeeded`, `Failed` or `Skipped`.
    pub result: RunResult,
    /// Why it failed or was skipped (or, in dry-run, what it would have done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl RefresherSpec {
    /// The settings parsed, or what is wrong with them. The owning NodeGroup's
    /// validation normally rejects these first; a hand-edited Refresher can
    /// still carry them.
    pub fn resolve(&self) -> Result<super::nodegroup::ResolvedRefresh, String> {
        use crate::duration;
        let duration_of =
            |field: &str, v: &str| duration::parse(v).map_err(|e| format!("spec.{field}: {e}"));
        Ok(super::nodegroup::ResolvedRefresh {
            schedule: match self.schedule.as_deref().map(str::trim) {
                None | Some("") => None,
                Some(cron) => Some(
                    super::nodegroup::parse_schedule(cron)
                        .map_err(|e| format!("spec.schedule: {e}"))?,
                ),
            },
            time_zone: self.time_zone.parse().map_err(|e| {
                format!(
                    "spec.timeZone: unknown IANA time zone {:?}: {e}",
                    self.time_zone
                )
            })?,
            surplus_nodes: match (self.role, self.surplus_nodes) {
                (_, n) if n < 0 => return Err(format!("spec.surplusNodes: {n} is negative")),
                (Role::Master, n) if n > 0 => {
                    return Err(format!(
                        "spec.surplusNodes: must be 0 for masters (kops cannot run an extra master), got {n}"
                    ));
                }
                (_, n) => n,
            },
            max_node_age: match &self.max_node_age {
                Some(v) => Some(duration_of("maxNodeAge", v)?),
                None => None,
            },
            drain_timeout: duration_of("drainTimeout", &self.drain_timeout)?,
            drain_timeout_action: self.drain_timeout_action,
            ready_timeout: duration_of("readyTimeout", &self.ready_timeout)?,
            master_settle_time: duration_of("masterSettleTime", &self.master_settle_time)?,
            validation_timeout: duration_of("validationTimeout", &self.validation_timeout)?,
            validation_timeout_action: self.validation_timeout_action,
            settle_time: duration_of("settleTime", &self.settle_time)?,
            max_surge: super::nodegroup::MaxSurge::parse(self.max_surge.as_ref())
                .map_err(|e| format!("spec.{e}"))?,
            pause_timeout: duration_of("pauseTimeout", &self.pause_timeout)?,
        })
    }

    /// Identifies the schedule `nextRun` was computed from.
    pub fn schedule_key(&self) -> String {
        match self.schedule.as_deref().map(str::trim) {
            None | Some("") => "no schedule".into(),
            Some(cron) => format!("{cron} in {}", self.time_zone),
        }
    }
}

/// The surplus a run added to `asg`.
pub fn surplus_of(surplus: &[AsgDesired], asg: &str) -> i32 {
    surplus
        .iter()
        .find(|s| s.auto_scaling_group == asg)
        .map_or(0, |s| s.desired)
}
