//! Each NodeGroup's state and troubles as gauges, for alerts: its
//! one-word state (the `STATE` column) and each condition in its troubled
//! polarity, by reason.

use super::Metrics;
use crate::crd::NodeGroupStatus;
use crate::crd::condition::{self, ConditionStatus};
use crate::crd::nodegroup::GroupState;
use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub namespace: String,
    pub group: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub namespace: String,
    pub group: String,
    pub condition: &'static str,
    pub reason: String,
}

/// Every state, as `kubectl get nodegroups` says it.
pub const STATES: [(GroupState, &str); 9] = [
    (GroupState::InvalidSpec, "InvalidSpec"),
    (GroupState::Suspended, "Suspended"),
    (GroupState::ExternalUpdate, "ExternalUpdate"),
    (GroupState::FallbackOnDemand, "FallbackOnDemand"),
    (GroupState::Degraded, "Degraded"),
    (GroupState::Refreshing, "Refreshing"),
    (GroupState::Repairing, "Repairing"),
    (GroupState::Replenishing, "Replenishing"),
    (GroupState::Ready, "Ready"),
];

/// The NodeGroup conditions that say something is wrong, and the status
/// that says so (SpecValid is troubled when False, the others when True).
pub const TROUBLES: [(&str, ConditionStatus); 9] = [
    (condition::SPEC_VALID, ConditionStatus::False),
    (condition::INVENTORY_SYNCED, ConditionStatus::False),
    (condition::DEGRADED, ConditionStatus::True),
    (condition::CIRCUIT_BREAKER, ConditionStatus::True),
    (condition::FALLBACK_ON_DEMAND, ConditionStatus::True),
    (condition::COMPETING_ASG_SETTINGS, ConditionStatus::True),
    (condition::NO_ROOM_ABOVE_DESIRED, ConditionStatus::True),
    (condition::OTHER_TERMINATION_HANDLER, ConditionStatus::True),
    (condition::COST_KNOWN, ConditionStatus::False),
];

impl Metrics {
    pub(super) fn register_group_state(&mut self) {
        self.registry.register(
            "group_state",
            "1 for each NodeGroup's state now (the STATE column of kubectl get nodegroups), 0 for the others",
            self.group_state.clone(),
        );
        self.registry.register(
            "group_condition",
            "1 while a NodeGroup condition says something is wrong (SpecValid or InventorySynced False; Degraded, CircuitBreakerOpen, FallbackOnDemand, CompetingAsgSettings, NoRoomAboveDesired or OtherTerminationHandler True; CostKnown False), or its Replenisher holds repairs back (RepairAllowed False, e.g. reason ControlPlaneQuorumAtRisk), by its reason; no series otherwise",
            self.group_condition.clone(),
        );
    }

    /// Sets the group's state and troubled conditions from its status.
    pub(super) fn group_state_observed(
        &self,
        namespace: &str,
        group: &str,
        status: &NodeGroupStatus,
    ) {
        for (state, name) in STATES {
            let labels = StateLabels {
                namespace: namespace.into(),
                group: group.into(),
                state: name,
            };
            let now = i64::from(status.state == Some(state));
            self.group_state.get_or_create(&labels).set(now);
        }
        for (type_, troubled) in TROUBLES {
            let found = condition::find(&status.conditions, type_);
            let reason = found
                .filter(|c| c.status == troubled)
                .map(|c| c.reason.clone());
            self.set_trouble(namespace, group, type_, reason);
        }
    }

    /// The group's replenisher holds repairs back (its Replenisher's
    /// `RepairAllowed` False, with this reason, e.g.
    /// `ControlPlaneQuorumAtRisk`), or does not (None).
    pub fn repair_held(&self, namespace: &str, group: &str, reason: Option<&str>) {
        let reason = reason.map(str::to_string);
        self.set_trouble(namespace, group, condition::REPAIR_ALLOWED, reason);
    }

    /// The series of condition `type_` of a group: 1 with `reason`, none
    /// when None. A reason that changed or cleared leaves no series behind.
    fn set_trouble(
        &self,
        namespace: &str,
        group: &str,
        type_: &'static str,
        reason: Option<String>,
    ) {
        let mut seen = self.troubles_set.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), group.to_string(), type_);
        if let Some(old) = seen.get(&key)
            && Some(old) != reason.as_ref()
        {
            self.group_condition.remove(&ConditionLabels {
                namespace: namespace.into(),
                group: group.into(),
                condition: type_,
                reason: old.clone(),
            });
            seen.remove(&key);
        }
        if let Some(reason) = reason {
            let labels = ConditionLabels {
                namespace: namespace.into(),
                group: group.into(),
                condition: type_,
                reason: reason.clone(),
            };
            self.group_condition.get_or_create(&labels).set(1);
            seen.insert(key, reason);
        }
    }

    /// The group is gone: none of its series stay.
    pub(super) fn group_state_forgotten(&self, namespace: &str, group: &str) {
        for (_, name) in STATES {
            self.group_state.remove(&StateLabels {
                namespace: namespace.into(),
                group: group.into(),
                state: name,
            });
        }
        let mut seen = self.troubles_set.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|(ns, g, type_), reason| {
            let mine = ns == namespace && g == group;
            if mine {
                self.group_condition.remove(&ConditionLabels {
                    namespace: namespace.into(),
                    group: group.into(),
                    condition: type_,
                    reason: reason.clone(),
                });
            }
            !mine
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::condition::set_condition;

    #[test]
    fn the_state_is_one_series_at_one_and_a_trouble_follows_its_reason() {
        let metrics = Metrics::default();
        let mut status = NodeGroupStatus {
            state: Some(GroupState::Degraded),
            ..Default::default()
        };
        let now = chrono::Utc::now();
        let set = |s: &mut NodeGroupStatus, value, reason: &str| {
            set_condition(
                &mut s.conditions,
                condition::DEGRADED,
                value,
                reason,
                "m",
                None,
                now,
            )
        };
        set(&mut status, ConditionStatus::True, "NotLaunching");
        metrics.group_state_observed("ns", "workers", &status);
        let text = metrics.encode();
        let state = |s: &str, v: i32| {
            format!(
                "spot_node_manager_group_state{{namespace=\"ns\",group=\"workers\",state=\"{s}\"}} {v}"
            )
        };
        assert!(text.contains(&state("Degraded", 1)), "{text}");
        assert!(text.contains(&state("Ready", 0)), "{text}");
        assert_eq!(
            text.matches("spot_node_manager_group_state{").count(),
            STATES.len()
        );
        let trouble = |r: &str| {
            format!(
                "spot_node_manager_group_condition{{namespace=\"ns\",group=\"workers\",condition=\"Degraded\",reason=\"{r}\"}} 1"
            )
        };
        assert!(text.contains(&trouble("NotLaunching")), "{text}");
        // Another reason replaces it; cleared, nothing is left.
        set(&mut status, ConditionStatus::True, "AsgMissing");
        metrics.group_state_observed("ns", "workers", &status);
        let text = metrics.encode();
        assert!(
            text.contains(&trouble("AsgMissing")) && !text.contains("NotLaunching"),
            "{text}"
        );
        set(&mut status, ConditionStatus::False, "Healthy");
        metrics.group_state_observed("ns", "workers", &status);
        assert!(
            !metrics
                .encode()
                .contains("spot_node_manager_group_condition{")
        );
        // A repair held back, by the Replenisher's reason, until it is not;
        // an inventory sync does not clear it.
        metrics.repair_held("ns", "workers", Some("ControlPlaneQuorumAtRisk"));
        metrics.group_state_observed("ns", "workers", &status);
        let held = "spot_node_manager_group_condition{namespace=\"ns\",group=\"workers\",condition=\"RepairAllowed\",reason=\"ControlPlaneQuorumAtRisk\"} 1";
        assert!(metrics.encode().contains(held), "{}", metrics.encode());
        metrics.repair_held("ns", "workers", None);
        assert!(
            !metrics
                .encode()
                .contains("spot_node_manager_group_condition{")
        );
        metrics.repair_held("ns", "workers", Some("CircuitBreakerOpen"));
        // Forgotten: no state series either, nor a held repair's.
        metrics.group_state_forgotten("ns", "workers");
        assert!(!metrics.encode().contains("spot_node_manager_group_state{"));
        assert!(
            !metrics
                .encode()
                .contains("spot_node_manager_group_condition{")
        );
    }
}
