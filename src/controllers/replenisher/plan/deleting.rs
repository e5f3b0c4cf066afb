//! The NodeGroup is being deleted: what is under way is finished or given
//! back, nothing new starts.

use super::interrupted::retire;
use super::scale_in::scale_in_in_progress;
use super::{Command, Deciding, Plan};
use crate::crd::replenisher::ReplenishPhase;

/// The NodeGroup is being deleted; its finalizer waits until nothing is
/// under way here. A scale-in whose termination is recorded is finished (the
/// node is already drained); one still draining is abandoned (its node
/// uncordoned and kept); a recorded cleanup or termination of interrupted
/// instances is carried out. Then idle, lock released.
pub(super) fn unwinding(s: &Deciding) -> Option<Plan> {
    const REASON: &str = "the NodeGroup is being deleted";
    if !s.input.group.deleting {
        return None;
    }
    if !s.status.retiring.is_empty() {
        return retire(s);
    }
    if let Some(target) = &s.status.scale_in {
        if target.terminating.is_some() {
            return scale_in_in_progress(s);
        }
        let command = Command::GiveBack {
            target: target.clone(),
            reason: REASON.into(),
        };
        return Some(s.act(
            s.status.clone(),
            ReplenishPhase::ScalingDown,
            command,
            format!("{REASON}: keeping {}", target.node),
        ));
    }
    if let Some(cleanup) = &s.status.cleanup {
        let message = format!(
            "{REASON}: finishing the recorded removal of {}",
            cleanup.instance_id
        );
        return Some(s.act(
            s.status.clone(),
            ReplenishPhase::CleaningUp,
            Command::RemoveNotJoined(cleanup.clone()),
            message,
        ));
    }
    Some(s.idle(
        s.status.clone(),
        ReplenishPhase::Paused,
        format!("{REASON}: starting nothing"),
    ))
}
