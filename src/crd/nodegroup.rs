//! `NodeGroup`: one per kops master or worker group, written by the user.
// Each `printcolumn(...)` repeats `type_`; clippy mistakes that for a duplicate.
#![allow(clippy::duplicated_attributes)]

use super::condition::{Condition, list_map_by_type};
use crate::duration;
use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
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
        name = "Last Interruption",
        type_ = "date",
        json_path = ".status.lastInterruption.noticed",
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
    #[serde(default)]
    pub replenish: ReplenishSpec,
    /// How interruption notices for this group's nodes are handled (when the
    /// manager reads an interruption queue).
    #[serde(default)]
    pub interruption: InterruptionSpec,
    /// Scheduled rolling replacement; no refresh when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<RefreshSpec>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Role {
    Master,
    Worker,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct AutoScalingGroupRef {
    #[schemars(length(min = 1, max = 255))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplenishSpec {
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Minimum time between two ASG modifications.
    #[serde(default = "default_cooldown")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub cooldown: String,
    /// An instance that has not joined as a Node after this long is removed.
    #[serde(default = "default_join_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub join_timeout: String,
}

/// The bounds of each duration of the spec, inclusive: (field, least, most).
/// `validate` reports one outside them as `SpecValid=False` naming the
/// field. The least guard against settings that turn a slow boot or a slow
/// drain into a termination (a 30 s join timeout removes every node that
/// boots slowly); the most are far above any sensible setting, far below
/// where time arithmetic could overflow.
pub const DURATION_BOUNDS: [(&str, std::time::Duration, std::time::Duration); 6] = [
    ("replenish.cooldown", secs(10), HOURS_24),
    ("replenish.joinTimeout", secs(120), HOURS_24),
    ("refresh.drainTimeout", secs(30), HOURS_24),
    ("refresh.readyTimeout", secs(60), HOURS_24),
    ("refresh.masterSettleTime", secs(0), secs(3600)),
    ("refresh.maxNodeAge", secs(3600), secs(8760 * 3600)),
];

const fn secs(s: u64) -> std::time::Duration {
    std::time::Duration::from_secs(s)
}

/// Set once a process talks to the emulator: see [`lift_duration_minima`].
static MINIMA_LIFTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lifts the least durations for this process. Tests compress time against
/// the emulator (a 3 s join timeout stands for minutes), so the manager calls
/// this only when `aws.emulatorAccount` is set, which a product build
/// refuses: a real cluster always gets the minimums.
pub fn lift_duration_minima() {
    MINIMA_LIFTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn minima_lifted() -> bool {
    MINIMA_LIFTED.load(std::sync::atomic::Ordering::Relaxed)
}

const HOURS_24: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// The most nodes a group may ask for (`desired`; the schema says so too).
pub const MAX_DESIRED: i32 = 10_000;
/// The most surplus nodes a refresh may add (`refresh.surplusNodes`).
pub const MAX_SURPLUS: i32 = 100;

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
}

fn default_drain_deadline() -> String {
    "90s".into()
}

impl Default for ReplenishSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            cooldown: default_cooldown(),
            join_timeout: default_join_timeout(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefreshSpec {
    /// Cron expression (seconds field optional), evaluated in `timeZone`.
    #[schemars(length(min = 1))]
    pub schedule: String,
    /// IANA time zone name, e.g. Asia/Tokyo.
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// Extra nodes added before replacing old ones. Default 1 for workers;
    /// must be 0 for masters (kops cannot run an extra master).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub surplus_nodes: Option<i32>,
    /// Only nodes older than this are replaced; every node when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub max_node_age: Option<String>,
    #[serde(default = "default_drain_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub drain_timeout: String,
    /// What to do when a drain times out.
    #[serde(default)]
    pub drain_timeout_action: DrainTimeoutAction,
    /// How long a new node may take to become Ready.
    #[serde(default = "default_ready_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub ready_timeout: String,
    /// Masters: after a replacement's control-plane pods (kube-apiserver,
    /// etcd-manager) are Ready, wait this long before the next master.
    #[serde(default = "default_master_settle_time")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub master_settle_time: String,
}

fn default_master_settle_time() -> String {
    "2m".into()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DrainTimeoutAction {
    /// Terminate the node anyway.
    Proceed,
    /// Stop the refresh, leaving the node in service.
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
fn default_time_zone() -> String {
    "UTC".into()
}
fn default_drain_timeout() -> String {
    "5m".into()
}
fn default_ready_timeout() -> String {
    "15m".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    #[schemars(transform = list_map_by_type)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_nodes: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_nodes: Option<i32>,
    #[serde(default)]
    pub nodes: Vec<NodeStatus>,
    #[serde(default)]
    pub not_joined: Vec<NotJoinedInstance>,
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
}

/// What `kubectl get nodegroups` says of a group, the first that holds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum GroupState {
    /// `SpecValid` is False: the group does nothing until its spec is fixed.
    InvalidSpec,
    /// `spec.suspend`: the group does nothing by request.
    Suspended,
    /// An ASG is missing or cannot launch, or the circuit breaker is open.
    Degraded,
    /// A refresh run holds the group's lock.
    Refreshing,
    /// The replenisher holds the group's lock, or fewer nodes are Ready than
    /// desired (before the lock, e.g. while new nodes join).
    Replenishing,
    /// None of the above: the desired count is Ready and nothing is running.
    Ready,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastInterruption {
    pub node: String,
    pub instance_id: String,
    pub kind: String,
    /// When AWS emitted the notice.
    pub noticed: DateTime<Utc>,
    /// When the node's drain ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<DateTime<Utc>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_scaling_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// spot or on-demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_time: Option<DateTime<Utc>>,
    pub ready: bool,
    pub unschedulable: bool,
    /// Why this node could not be matched to an instance (e.g. a bad providerID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The interruption notice recorded on the node (by the interruption
    /// handler): the node is leaving and no longer counts as Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption: Option<NodeInterruption>,
}

/// An interruption notice as the node records it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeInterruption {
    /// spot_interruption, scheduled_change, state_change,
    /// terminate_lifecycle_action or rebalance_recommendation.
    pub kind: String,
    /// When AWS emitted the notice.
    pub noticed: DateTime<Utc>,
    /// The drain must be finished by then.
    pub deadline: DateTime<Utc>,
    /// When the drain ended (drained, or its deadline passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<DateTime<Utc>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotJoinedInstance {
    pub instance_id: String,
    pub auto_scaling_group: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_time: Option<DateTime<Utc>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoScalingGroupStatus {
    pub name: String,
    pub desired: i32,
    pub min: i32,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Since when it has been seen below its desired count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind_since: Option<DateTime<Utc>>,
    /// The newest launch activity's failure, while below desired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_failure: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspended_processes: Vec<String>,
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
    pub holder: OperationKind,
    /// Name of the Refresher or Replenisher holding the lock.
    pub holder_name: String,
    pub since: DateTime<Utc>,
}

/// The SpecValid reason of a group naming an ASG another group names.
pub const ASG_CONFLICT: &str = "AutoScalingGroupConflict";

/// The circuit breaker's default share of NotReady nodes, in percent.
pub const DEFAULT_MAX_NOT_READY_PERCENT: i32 = 50;
/// The NodeGroup condition that is True while the circuit breaker is open.
pub const CIRCUIT_BREAKER: &str = "CircuitBreakerOpen";

impl NodeGroup {
    /// Why nothing in the group may be terminated now (the inventory's
    /// circuit breaker condition is True), if so.
    pub fn breaker_open(&self) -> Option<String> {
        self.status.as_ref()?.conditions.iter().find_map(|c| {
            (c.type_ == CIRCUIT_BREAKER && c.status == crate::crd::condition::ConditionStatus::True)
                .then(|| c.message.clone())
        })
    }

    /// Why the group must not act because another group names one of its
    /// ASGs (the inventory's SpecValid condition says so), if it must not.
    pub fn asg_conflict(&self) -> Option<String> {
        self.status.as_ref()?.conditions.iter().find_map(|c| {
            (c.type_ == "SpecValid"
                && c.status == crate::crd::condition::ConditionStatus::False
                && c.reason == ASG_CONFLICT)
                .then(|| c.message.clone())
        })
    }
}

/// A problem in a NodeGroup's spec that the schema cannot express.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// The field, as a path from `spec`.
    pub field: String,
    /// CamelCase reason for the condition.
    pub reason: &'static str,
    pub message: String,
}

/// The spec's settings with defaults applied and strings parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedRefresh {
    pub schedule: cron::Schedule,
    pub time_zone: chrono_tz::Tz,
    pub surplus_nodes: i32,
    pub max_node_age: Option<std::time::Duration>,
    pub drain_timeout: std::time::Duration,
    pub drain_timeout_action: DrainTimeoutAction,
    pub ready_timeout: std::time::Duration,
    pub master_settle_time: std::time::Duration,
}

impl RefreshSpec {
    /// Surplus with the role's default (1 for workers, 0 for masters).
    pub fn effective_surplus(&self, role: Role) -> i32 {
        self.surplus_nodes.unwrap_or(match role {
            Role::Worker => 1,
            Role::Master => 0,
        })
    }
}

impl NodeGroupSpec {
    /// The names of the group's Auto Scaling Groups.
    pub fn asg_names(&self) -> Vec<String> {
        self.auto_scaling_groups
            .iter()
            .map(|a| a.name.clone())
            .collect()
    }

    /// Checks what the CRD schema cannot: cron syntax, time zone names, duration
    /// strings, surplus for masters, duplicate ASGs. Pure: no I/O, never panics.
    pub fn validate(&self) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        let mut push = |field: &str, reason: &'static str, message: String| {
            problems.push(SpecProblem {
                field: field.to_string(),
                reason,
                message,
            })
        };
        if !(0..=MAX_DESIRED).contains(&self.desired) {
            push(
                "desired",
                "InvalidDesired",
                format!(
                    "desired must be between 0 and {MAX_DESIRED}, got {}",
                    self.desired
                ),
            );
        }
        if self.auto_scaling_groups.is_empty() {
            push(
                "autoScalingGroups",
                "NoAutoScalingGroups",
                "at least one Auto Scaling Group is required".into(),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, asg) in self.auto_scaling_groups.iter().enumerate() {
            if asg.name.trim().is_empty() {
                push(
                    &format!("autoScalingGroups[{i}].name"),
                    "InvalidAutoScalingGroup",
                    "name must not be empty".into(),
                );
            } else if !seen.insert(asg.name.as_str()) {
                push(
                    &format!("autoScalingGroups[{i}].name"),
                    "DuplicateAutoScalingGroup",
                    format!("Auto Scaling Group {:?} is listed twice", asg.name),
                );
            }
        }
        let mut durations: Vec<(&str, &String)> = vec![
            ("replenish.cooldown", &self.replenish.cooldown),
            ("replenish.joinTimeout", &self.replenish.join_timeout),
        ];
        if let Some(refresh) = &self.refresh {
            durations.push(("refresh.drainTimeout", &refresh.drain_timeout));
            durations.push(("refresh.readyTimeout", &refresh.ready_timeout));
            durations.push(("refresh.masterSettleTime", &refresh.master_settle_time));
            if let Some(age) = &refresh.max_node_age {
                durations.push(("refresh.maxNodeAge", age));
            }
        }
        for (field, value) in durations {
            let Some((_, least, most)) = DURATION_BOUNDS.iter().find(|(f, _, _)| *f == field)
            else {
                continue;
            };
            match duration::parse(value) {
                Err(e) => push(field, "InvalidDuration", e.to_string()),
                Ok(d) if d > *most => push(
                    field,
                    "InvalidDuration",
                    format!(
                        "{value} is longer than the most allowed, {}",
                        duration::format(*most)
                    ),
                ),
                Ok(d) if d < *least && !minima_lifted() => push(
                    field,
                    "InvalidDuration",
                    format!(
                        "{value} is shorter than the least allowed, {}",
                        duration::format(*least)
                    ),
                ),
                Ok(_) => {}
            }
        }
        match duration::parse(&self.interruption.drain_deadline) {
            Err(e) => push(
                "interruption.drainDeadline",
                "InvalidDuration",
                e.to_string(),
            ),
            Ok(d) if !(DRAIN_DEADLINE_BOUNDS.0..=DRAIN_DEADLINE_BOUNDS.1).contains(&d) => push(
                "interruption.drainDeadline",
                "InvalidDuration",
                format!(
                    "must be between {} and {} (a spot warning gives two minutes), got {}",
                    duration::format(DRAIN_DEADLINE_BOUNDS.0),
                    duration::format(DRAIN_DEADLINE_BOUNDS.1),
                    self.interruption.drain_deadline
                ),
            ),
            Ok(_) => {}
        }
        if let Some(refresh) = &self.refresh {
            if let Err(e) = parse_schedule(&refresh.schedule) {
                push("refresh.schedule", "InvalidSchedule", e);
            }
            if let Err(e) = refresh.time_zone.parse::<chrono_tz::Tz>() {
                push(
                    "refresh.timeZone",
                    "InvalidTimeZone",
                    format!("unknown IANA time zone {:?}: {e}", refresh.time_zone),
                );
            }
            match (self.role, refresh.surplus_nodes) {
                (_, Some(n)) if !(0..=MAX_SURPLUS).contains(&n) => push(
                    "refresh.surplusNodes",
                    "InvalidSurplus",
                    format!("surplusNodes must be between 0 and {MAX_SURPLUS}, got {n}"),
                ),
                (Role::Master, Some(n)) if n > 0 => push(
                    "refresh.surplusNodes",
                    "SurplusForMasters",
                    format!(
                        "surplusNodes must be 0 for masters (kops cannot run an extra master), got {n}"
                    ),
                ),
                _ => {}
            }
        }
        problems
    }

    /// The refresh settings, parsed; `None` when refresh is unset or invalid
    /// (callers report [`NodeGroupSpec::validate`] problems instead).
    pub fn resolved_refresh(&self) -> Option<ResolvedRefresh> {
        let refresh = self.refresh.as_ref()?;
        Some(ResolvedRefresh {
            schedule: parse_schedule(&refresh.schedule).ok()?,
            time_zone: refresh.time_zone.parse().ok()?,
            surplus_nodes: refresh.effective_surplus(self.role),
            max_node_age: match &refresh.max_node_age {
                Some(v) => Some(duration::parse(v).ok()?),
                None => None,
            },
            drain_timeout: duration::parse(&refresh.drain_timeout).ok()?,
            drain_timeout_action: refresh.drain_timeout_action,
            ready_timeout: duration::parse(&refresh.ready_timeout).ok()?,
            master_settle_time: duration::parse(&refresh.master_settle_time).ok()?,
        })
    }
}

/// Parses a cron expression. The cron crate wants 6 or 7 fields (seconds first,
/// optional year); users mostly write the classic 5-field form, so a 5-field
/// expression gets "0" seconds prepended.
pub fn parse_schedule(expr: &str) -> Result<cron::Schedule, String> {
    use std::str::FromStr;
    let fields = expr.split_whitespace().count();
    let normalized = match fields {
        5 => format!("0 {}", expr.trim()),
        6 | 7 => expr.trim().to_string(),
        n => {
            return Err(format!(
                "cron expression {expr:?} has {n} fields; expected 5 (min hour day month weekday), 6 (with seconds) or 7 (with year)"
            ));
        }
    };
    cron::Schedule::from_str(&normalized)
        .map_err(|e| format!("invalid cron expression {expr:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn worker_spec() -> NodeGroupSpec {
        NodeGroupSpec {
            role: Role::Worker,
            region: None,
            auto_scaling_groups: vec![
                AutoScalingGroupRef {
                    name: "nodes-a".into(),
                },
                AutoScalingGroupRef {
                    name: "nodes-c".into(),
                },
            ],
            node_selector: None,
            desired: 3,
            max_not_ready_percent: None,
            suspend: false,
            replenish: ReplenishSpec::default(),
            interruption: InterruptionSpec::default(),
            refresh: Some(RefreshSpec {
                schedule: "0 3 * * 1".into(),
                time_zone: "Asia/Tokyo".into(),
                surplus_nodes: None,
                max_node_age: Some("168h".into()),
                drain_timeout: "5m".into(),
                drain_timeout_action: DrainTimeoutAction::Abort,
                ready_timeout: "15m".into(),
                master_settle_time: "2m".into(),
            }),
        }
    }

    fn problems_of(spec: &NodeGroupSpec) -> Vec<(&'static str, String)> {
        spec.validate()
            .into_iter()
            .map(|p| (p.reason, p.field))
            .collect()
    }

    #[test]
    fn a_valid_spec_has_no_problems_and_resolves() {
        let spec = worker_spec();
        assert!(spec.validate().is_empty(), "{:?}", spec.validate());
        let resolved = spec.resolved_refresh().expect("resolves");
        assert_eq!(resolved.surplus_nodes, 1);
        assert_eq!(resolved.time_zone, chrono_tz::Asia::Tokyo);
        assert_eq!(
            resolved.max_node_age,
            Some(std::time::Duration::from_secs(168 * 3600))
        );
    }

    #[test]
    fn invalid_cron_is_reported_on_the_schedule_field() {
        let mut spec = worker_spec();
        spec.refresh.as_mut().unwrap().schedule = "every monday".into();
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidSchedule", "refresh.schedule".to_string())]
        );
        spec.refresh.as_mut().unwrap().schedule = "61 * * * *".into();
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidSchedule", "refresh.schedule".to_string())]
        );
        assert!(spec.resolved_refresh().is_none());
    }

    #[test]
    fn cron_with_and_without_seconds_is_accepted() {
        assert!(parse_schedule("0 3 * * Mon").is_ok());
        assert!(parse_schedule("30 0 3 * * Mon").is_ok());
        assert!(parse_schedule("0 0 3 * * Mon 2027").is_ok());
        assert!(parse_schedule("* *").is_err());
    }

    #[test]
    fn unknown_time_zone_is_reported() {
        let mut spec = worker_spec();
        spec.refresh.as_mut().unwrap().time_zone = "Mars/Olympus".into();
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidTimeZone", "refresh.timeZone".to_string())]
        );
    }

    #[test]
    fn surplus_for_masters_is_rejected_but_defaults_to_zero() {
        let mut spec = worker_spec();
        spec.role = Role::Master;
        assert!(spec.validate().is_empty());
        assert_eq!(spec.resolved_refresh().map(|r| r.surplus_nodes), Some(0));
        spec.refresh.as_mut().unwrap().surplus_nodes = Some(1);
        assert_eq!(
            problems_of(&spec),
            vec![("SurplusForMasters", "refresh.surplusNodes".to_string())]
        );
    }

    #[test]
    fn a_huge_duration_or_count_is_refused_naming_its_field() {
        // Accepted by the schema's pattern: 9999999999h once panicked every
        // controller (DateTime + TimeDelta overflow).
        for (field, _, _) in DURATION_BOUNDS {
            let mut spec = worker_spec();
            let huge = "9999999999h".to_string();
            let refresh = spec.refresh.as_mut().expect("refresh");
            match field {
                "replenish.cooldown" => spec.replenish.cooldown = huge,
                "replenish.joinTimeout" => spec.replenish.join_timeout = huge,
                "refresh.drainTimeout" => refresh.drain_timeout = huge,
                "refresh.readyTimeout" => refresh.ready_timeout = huge,
                "refresh.masterSettleTime" => refresh.master_settle_time = huge,
                "refresh.maxNodeAge" => refresh.max_node_age = Some(huge),
                other => panic!("no such field {other}"),
            }
            assert_eq!(
                problems_of(&spec),
                vec![("InvalidDuration", field.to_string())],
                "{field}"
            );
        }
        // At the maximum is fine; just past it is not.
        let mut spec = worker_spec();
        spec.replenish.join_timeout = "24h".into();
        assert!(spec.validate().is_empty());
        spec.replenish.join_timeout = "24h1ms".into();
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidDuration", "replenish.joinTimeout".to_string())]
        );
        let mut spec = worker_spec();
        spec.desired = MAX_DESIRED + 1;
        spec.refresh.as_mut().expect("refresh").surplus_nodes = Some(i32::MAX);
        assert_eq!(
            problems_of(&spec),
            vec![
                ("InvalidDesired", "desired".to_string()),
                ("InvalidSurplus", "refresh.surplusNodes".to_string())
            ]
        );
    }

    #[test]
    fn a_duration_below_its_least_is_refused_naming_its_field() {
        // Each process has the minimums unless it talks to the emulator;
        // this test process never lifts them.
        assert!(!minima_lifted());
        for (field, least, _) in DURATION_BOUNDS {
            let Some(below) = least.checked_sub(std::time::Duration::from_millis(1)) else {
                continue; // no least (masterSettleTime)
            };
            let below = format!("{}ms", below.as_millis());
            let at = format!("{}ms", least.as_millis());
            let set = |value: &str| {
                let mut spec = worker_spec();
                let refresh = spec.refresh.as_mut().expect("refresh");
                match field {
                    "replenish.cooldown" => spec.replenish.cooldown = value.into(),
                    "replenish.joinTimeout" => spec.replenish.join_timeout = value.into(),
                    "refresh.drainTimeout" => refresh.drain_timeout = value.into(),
                    "refresh.readyTimeout" => refresh.ready_timeout = value.into(),
                    "refresh.maxNodeAge" => refresh.max_node_age = Some(value.into()),
                    other => panic!("no such field {other}"),
                }
                problems_of(&spec)
            };
            assert_eq!(set(&at), vec![], "{field} at its least");
            assert_eq!(
                set(&below),
                vec![("InvalidDuration", field.to_string())],
                "{field} below its least"
            );
        }
        // The issue's case: a 30 s join timeout.
        let mut spec = worker_spec();
        spec.replenish.join_timeout = "30s".into();
        let problems = spec.validate();
        assert!(
            problems[0]
                .message
                .contains("shorter than the least allowed, 2m"),
            "{problems:?}"
        );
    }

    proptest::proptest! {
        /// Whatever a user writes that the schema's pattern lets through,
        /// validation answers without panicking, and a spec it accepts
        /// resolves to durations within the documented bounds.
        #[test]
        fn validation_never_panics_and_what_it_accepts_is_bounded(
            cooldown in "([0-9]{1,20}(ms|s|m|h)){1,3}",
            join in "([0-9]{1,20}(ms|s|m|h)){1,3}",
            drain in "([0-9]{1,20}(ms|s|m|h)){1,3}",
            age in proptest::option::of("([0-9]{1,20}(ms|s|m|h)){1,3}"),
            desired in proptest::num::i32::ANY,
            surplus in proptest::option::of(proptest::num::i32::ANY),
        ) {
            let mut spec = worker_spec();
            spec.replenish.cooldown = cooldown;
            spec.replenish.join_timeout = join;
            spec.desired = desired;
            let refresh = spec.refresh.as_mut().expect("refresh");
            refresh.drain_timeout = drain;
            refresh.max_node_age = age;
            refresh.surplus_nodes = surplus;
            let problems = spec.validate();
            if problems.is_empty() {
                let r = spec.resolved_refresh().expect("resolves when valid");
                proptest::prop_assert!(r.drain_timeout <= HOURS_24);
                proptest::prop_assert!(r.max_node_age.is_none_or(|a| a <= DURATION_BOUNDS[5].2));
                proptest::prop_assert!((0..=MAX_DESIRED).contains(&spec.desired));
                for d in [&spec.replenish.cooldown, &spec.replenish.join_timeout] {
                    let parsed = crate::duration::parse(d).expect("valid");
                    proptest::prop_assert!(parsed <= HOURS_24);
                    proptest::prop_assert!(parsed >= std::time::Duration::from_secs(10));
                }
                proptest::prop_assert!(r.drain_timeout >= std::time::Duration::from_secs(30));
            }
        }
    }

    #[test]
    fn negative_counts_and_bad_durations_are_reported() {
        let mut spec = worker_spec();
        spec.desired = -1;
        spec.replenish.cooldown = "5 minutes".into();
        spec.refresh.as_mut().unwrap().surplus_nodes = Some(-2);
        spec.refresh.as_mut().unwrap().max_node_age = Some("7d".into());
        let got = problems_of(&spec);
        assert!(
            got.contains(&("InvalidDesired", "desired".into())),
            "{got:?}"
        );
        assert!(
            got.contains(&("InvalidDuration", "replenish.cooldown".into())),
            "{got:?}"
        );
        assert!(
            got.contains(&("InvalidSurplus", "refresh.surplusNodes".into())),
            "{got:?}"
        );
        assert!(
            got.contains(&("InvalidDuration", "refresh.maxNodeAge".into())),
            "{got:?}"
        );
    }

    #[test]
    fn duplicate_and_missing_asgs_are_reported() {
        let mut spec = worker_spec();
        spec.auto_scaling_groups.push(AutoScalingGroupRef {
            name: "nodes-a".into(),
        });
        assert_eq!(
            problems_of(&spec),
            vec![(
                "DuplicateAutoScalingGroup",
                "autoScalingGroups[2].name".to_string()
            )]
        );
        spec.auto_scaling_groups.clear();
        assert_eq!(
            problems_of(&spec),
            vec![("NoAutoScalingGroups", "autoScalingGroups".to_string())]
        );
    }

    #[test]
    fn defaults_apply_when_fields_are_omitted() {
        let spec: NodeGroupSpec = serde_json::from_value(serde_json::json!({
            "role": "Worker",
            "autoScalingGroups": [{"name": "nodes-a"}],
            "desired": 2,
            "refresh": {"schedule": "0 3 * * *"}
        }))
        .expect("parses");
        assert!(spec.replenish.enabled);
        assert_eq!(spec.replenish.cooldown, "5m");
        assert_eq!(spec.replenish.join_timeout, "15m");
        let refresh = spec.refresh.as_ref().expect("refresh");
        assert_eq!(refresh.time_zone, "UTC");
        assert_eq!(refresh.drain_timeout, "5m");
        assert_eq!(refresh.drain_timeout_action, DrainTimeoutAction::Abort);
        assert_eq!(refresh.ready_timeout, "15m");
        assert_eq!(refresh.effective_surplus(spec.role), 1);
    }

    #[test]
    fn the_drain_deadline_must_fit_in_a_spot_warning() {
        let mut spec = worker_spec();
        assert_eq!(spec.interruption.drain_deadline(), DEFAULT_DRAIN_DEADLINE);
        for bad in ["5s", "3m", "soon"] {
            spec.interruption.drain_deadline = bad.into();
            let problems = spec.validate();
            assert!(
                problems
                    .iter()
                    .any(|p| p.field == "interruption.drainDeadline"),
                "{bad}: {problems:?}"
            );
            assert_eq!(spec.interruption.drain_deadline(), DEFAULT_DRAIN_DEADLINE);
        }
        spec.interruption.drain_deadline = "60s".into();
        assert!(spec.validate().is_empty(), "{:?}", spec.validate());
        assert_eq!(
            spec.interruption.drain_deadline(),
            std::time::Duration::from_secs(60)
        );
    }
}
