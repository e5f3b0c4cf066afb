//! Conditions in the standard Kubernetes shape, plus a helper that keeps
//! `lastTransitionTime` stable unless the status actually flips.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition types, on the resource whose status carries them.
/// NodeGroup: the spec is valid (the manager's own checks, beyond the schema).
pub const SPEC_VALID: &str = "SpecValid";
/// NodeGroup: set once the group is being deleted: what its deletion waits for.
pub const DELETING: &str = "Deleting";
/// NodeGroup: the inventory's last sync succeeded.
pub const INVENTORY_SYNCED: &str = "InventorySynced";
/// NodeGroup: an ASG is not launching, or too much of the group is NotReady.
pub const DEGRADED: &str = "Degraded";
/// NodeGroup: an ASG setting that makes AWS or another controller replace
/// or remove instances the manager manages (Capacity Rebalancing, a
/// maximum instance lifetime, cluster-autoscaler's discovery tag).
pub const COMPETING_ASG_SETTINGS: &str = "CompetingAsgSettings";
/// NodeGroup (workers): the ASGs' MaxSize leaves no room above the group's
/// count for a node launched ahead (a refresh's surplus, a replacement
/// before a removal).
pub const NO_ROOM_ABOVE_DESIRED: &str = "NoRoomAboveDesired";
/// NodeGroup: another termination handler (aws-node-termination-handler,
/// which kops runs by default) answers the same notices in the cluster.
pub const OTHER_TERMINATION_HANDLER: &str = "OtherTerminationHandler";
/// NodeGroup: every price its cost record needs is known (False: which
/// cannot be read, and why; the figures leave those hours unpriced).
pub const COST_KNOWN: &str = "CostKnown";
/// Refresher: the schedule and time zone parse.
pub const SCHEDULE_VALID: &str = "ScheduleValid";
/// Refresher: the outcome of the last run.
pub const LAST_RUN_SUCCEEDED: &str = "LastRunSucceeded";
/// Refresher: False while an ASG of the group has Launch or Terminate suspended.
pub const SCALING_PROCESSES: &str = "ScalingProcesses";
/// Refresher: the schedule fires inside a maintenance window (False: its
/// runs would wait for the next window).
pub const SCHEDULE_IN_WINDOW: &str = "ScheduleInWindow";
/// NodeGroup: True while the circuit breaker is open (too much of the group
/// is NotReady to terminate anything).
pub const CIRCUIT_BREAKER: &str = "CircuitBreakerOpen";
/// NodeGroup: True while a kops rolling update replaces the group's nodes
/// (a member carries kops's `kops.k8s.io/scheduled-for-update` taint): the
/// replenisher and the refresher make no AWS mutation of their own.
pub const EXTERNAL_UPDATE: &str = "ExternalUpdate";
/// NodeGroup: the launch templates the ASGs name can be read, so drift can
/// be told (False: DescribeLaunchTemplates fails, as when the IAM policy
/// lacks it; each node's drift stays as last seen).
pub const DRIFT_KNOWN: &str = "DriftKnown";
/// NodeGroup (with `spec.fallback`): True while instances run on the
/// on-demand fallback ASGs: how many, and the spot ASGs that are short.
pub const FALLBACK_ON_DEMAND: &str = "FallbackOnDemand";
/// Replenisher: the group has its desired count of Ready nodes.
pub const REPLENISHED: &str = "Replenished";
/// Replenisher: False while an unhealthy node is not repaired (the circuit
/// breaker is open, repair is off, or a master waits for the others).
pub const REPAIR_ALLOWED: &str = "RepairAllowed";
/// Replenisher of a Master group: how the masters are counted (True, by
/// kops's control-plane pods; False, reason `CountedByNode`, where no
/// master shows any).
pub const CONTROL_PLANE_COUNTED: &str = "ControlPlaneCounted";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, e.g. `SpecValid`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// CamelCase machine-readable reason.
    pub reason: String,
    /// Human-readable detail.
    #[serde(default)]
    // apiserver 1.20 reads an empty-string schema default as null and rejects the CRD.
    #[schemars(transform = no_default)]
    pub message: String,
    /// When the status last changed (not when the reason or message did).
    pub last_transition_time: DateTime<Utc>,
    /// The spec generation the condition was set from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Sets (or replaces) the condition of `type_` in `conditions`. The transition
/// time only moves when the status changes, as kubectl users expect.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: DateTime<Utc>,
) {
    let message = message.into();
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status != status {
            existing.last_transition_time = now;
        }
        existing.status = status;
        existing.reason = reason.to_string();
        existing.message = message;
        existing.observed_generation = observed_generation;
    } else {
        conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            last_transition_time: now,
            observed_generation,
        });
    }
}

pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// Schema extension making `conditions` a list-map keyed by `type`, so server-side
/// apply merges conditions by type instead of replacing the list.
pub fn list_map_by_type(schema: &mut schemars::Schema) {
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let t1 = t0 + chrono::Duration::minutes(5);
        let t2 = t1 + chrono::Duration::minutes(5);
        let mut conds = vec![];
        set_condition(
            &mut conds,
            "Ready",
            ConditionStatus::True,
            "Ok",
            "",
            Some(1),
            t0,
        );
        set_condition(
            &mut conds,
            "Ready",
            ConditionStatus::True,
            "StillOk",
            "x",
            Some(2),
            t1,
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, t0);
        assert_eq!(conds[0].reason, "StillOk");
        set_condition(
            &mut conds,
            "Ready",
            ConditionStatus::False,
            "Broken",
            "y",
            Some(2),
            t2,
        );
        assert_eq!(conds[0].last_transition_time, t2);
        assert_eq!(
            find(&conds, "Ready").map(|c| &c.status),
            Some(&ConditionStatus::False)
        );
    }
}
