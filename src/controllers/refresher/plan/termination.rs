//! When a target may go, and its termination: recorded in the status
//! before it is made, retried after a restart only while still safe.

use super::{Command, Deciding, Decision, Removal, SOON, removal};
use crate::controllers::authority::rules::Reason;
use crate::controllers::authority::{self, Blocked, ControlPlane, Request};
use crate::crd::Role;
use crate::crd::refresher::RefresherStatus;
use crate::crd::refresher::{RefreshPhase, RefreshTarget, TargetPurpose};
use chrono::{DateTime, Utc};

impl Deciding<'_> {
    pub(super) fn terminate_now(&mut self, instance_id: &str, message: String) -> Decision {
        match after_drain(&mut self.status, instance_id, self.input.group.now) {
            Some(target) => Decision::act(Command::Terminate(target), message, SOON),
            None => Decision::wait(message, SOON),
        }
    }

    pub(super) fn removal_safety(&self, target: &RefreshTarget) -> Removal {
        removal(
            target,
            self.reason_of(target),
            self.input.group.nodes,
            (self.input.group.desired, self.surplus_total()),
        )
    }

    /// A termination recorded but not made (the manager died in between):
    /// make it if it is still safe; otherwise take the record back and let
    /// the drain logic hold or give up, so a restart never removes a node
    /// the group can no longer spare.
    pub(super) fn retry_termination(&mut self, target: RefreshTarget) -> Decision {
        let Removal {
            safe,
            ready_besides,
            needed,
        } = self.removal_safety(&target);
        // The authority refuses it now (another master went down since):
        // its guard would refuse the call at every step. Taken back, the
        // node is drained again, where the refusal sets the run aside.
        let refused = self.refused(&target);
        if safe && refused.is_none() {
            let message = format!("terminating {}", target.instance_id);
            return Decision::act(Command::Terminate(target), message, SOON);
        }
        let lead = self.is_lead(&target.instance_id);
        if let Some(t) = self.status.batch_member_mut(&target.instance_id) {
            t.terminated = None;
        }
        self.status
            .replaced_instances
            .retain(|id| *id != target.instance_id);
        // Drained again (its drain finds nothing left) once safe; a node
        // drained alongside is taken up by the batch where it is.
        if target.purpose == TargetPurpose::Replace && lead {
            self.status.phase = RefreshPhase::Draining;
        }
        let why = match refused {
            Some(blocked) => format!("refusing to {blocked}"),
            None => {
                format!("terminating it now would leave {ready_besides} Ready, fewer than {needed}")
            }
        };
        Decision::wait(format!("holding {}: {why}", target.instance_id), SOON)
    }
}

/// The disruption authority's answer for taking `target` away for the
/// reason it carries (a master: only while every other master of the
/// cluster is Ready): the one rule the plan and the guard both ask.
pub fn authority(
    target: &RefreshTarget,
    reason: Reason,
    role: Role,
    control_plane: Option<&ControlPlane>,
) -> Result<(), Blocked> {
    let request = Request {
        reason,
        role,
        instance: &target.instance_id,
    };
    authority::decide(control_plane, &request)
}

/// The drain of a target of the batch (the current one, or one drained
/// alongside it) is complete, or given up with `Proceed`: record its
/// termination in the status before it is made. Returns the target to
/// terminate, or None when it is not being drained. The current target's
/// termination moves the run on to `WaitingForReplacement`.
pub fn after_drain(
    status: &mut RefresherStatus,
    instance_id: &str,
    now: DateTime<Utc>,
) -> Option<RefreshTarget> {
    let lead = status
        .current_target
        .as_ref()
        .is_some_and(|t| t.instance_id == instance_id);
    let target = status.batch_member_mut(instance_id)?;
    if target.terminated.is_some() {
        return None;
    }
    target.terminated = Some(now);
    let target = target.clone();
    if target.purpose == TargetPurpose::Replace
        && !status.replaced_instances.contains(&target.instance_id)
    {
        status.replaced_instances.push(target.instance_id.clone());
    }
    if target.purpose == TargetPurpose::RemoveSurplus {
        // Terminated with decrement: one less surplus there by the run's
        // own record (its ASG may leave the spec before it is seen again).
        if let Some(s) = status
            .surplus
            .iter_mut()
            .find(|s| s.auto_scaling_group == target.auto_scaling_group)
        {
            s.desired = (s.desired - 1).max(0);
        }
        status.surplus.retain(|s| s.desired > 0);
    }
    if lead {
        if target.purpose == TargetPurpose::Replace {
            status.phase = RefreshPhase::WaitingForReplacement;
        }
        status.phase_since = Some(now);
    } else if status.phase == RefreshPhase::WaitingForReplacement {
        // The wait for Ready runs from the batch's last termination.
        status.phase_since = Some(now);
    }
    Some(target)
}
