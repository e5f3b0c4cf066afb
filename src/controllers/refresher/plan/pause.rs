//! A run in progress that may not step now is paused, for at most
//! `refresh.pauseTimeout`: past it the run is set aside (a node in hand put
//! back in service, the lock and the disruption slot given back, the rest
//! recorded in `status.pendingRun` and resumed later). Its surplus is left
//! to the replenisher, which takes extra Ready nodes back under its usual
//! rules. A paused run whose group has fewer Ready nodes than desired (a
//! spot loss while it waits) is set aside at once, so the replenisher can
//! replace them: Ready never stays below desired because a run waits.

use super::{Command, Deciding, Decision, Happening, IDLE, LOCK_RETRY, SOON, SlotState};
use crate::controllers::group_view::{LockState, after, until};
use crate::crd::nodegroup::ResolvedRefresh;
use std::time::Duration;

impl Deciding<'_> {
    /// A run in progress that may not step now (the group suspended or its
    /// spec invalid, a kops rolling update, the breaker open, the slots
    /// full, the lock another's), or the lock to take back. None: it steps.
    pub(super) fn paused(&mut self, settings: &ResolvedRefresh) -> Option<Decision> {
        let input = self.input;
        if input.dry_run {
            // A run started by a manager without --dry-run: stepping it here
            // would only record steps that are not made (nor a set-aside).
            return Some(Decision::wait(
                "run paused: this manager runs with --dry-run; a manager without it resumes the run",
                IDLE,
            ));
        }
        let (why, requeue) = if input.group.suspended {
            ("the group is suspended".to_string(), IDLE)
        } else if let Some(why) = &input.group.invalid_spec {
            (format!("the NodeGroup spec is invalid: {why}"), IDLE)
        } else if let Some(why) = &input.group.external_update {
            (why.clone(), IDLE)
        } else if let Some(why) = &input.group.breaker {
            (format!("circuit breaker open: {why}"), IDLE)
        } else if let SlotState::Full(why) = &input.slot {
            (format!("waiting for a disruption slot: {why}"), LOCK_RETRY)
        } else {
            match &input.group.lock {
                LockState::Ours if input.slot == SlotState::Ours => return None,
                // The lock first, then the slot (one order for every path).
                LockState::Ours => {
                    return Some(Decision::act(
                        Command::TakeSlot,
                        "retaking a disruption slot",
                        Duration::ZERO,
                    ));
                }
                LockState::Free => {
                    return Some(Decision::act(
                        Command::TakeLock,
                        "retaking the group's lock",
                        Duration::ZERO,
                    ));
                }
                LockState::Other(holder) => {
                    (format!("{holder} holds the group's lock"), LOCK_RETRY)
                }
            }
        };
        Some(self.pause(
            format!("run paused: {why}"),
            requeue,
            settings.pause_timeout,
        ))
    }

    /// Waits, paused for `why`, until the pause timeout (counted from the
    /// pause's start); past it, or at once while Ready is below desired,
    /// sets the run aside.
    pub(super) fn pause(&mut self, why: String, requeue: Duration, timeout: Duration) -> Decision {
        let now = self.input.group.now;
        self.paused = true;
        let since = *self.status.paused_since.get_or_insert(now);
        let limit = after(since, timeout);
        // Nodes the run itself took and is replacing are not a loss (a
        // master, which has no surplus, while its replacement boots).
        let replacing = self
            .status
            .batch()
            .filter(|t| t.terminated.is_some())
            .count() as i32;
        let (ready, desired) = (self.ready(), self.input.group.desired);
        if ready + replacing < desired {
            return self.set_aside_paused(format!(
                "{ready} of {desired} nodes Ready while it waits ({why}): the replenisher replaces them"
            ));
        }
        if now >= limit {
            let timeout = crate::duration::format(timeout);
            return self.set_aside_paused(format!("paused for over {timeout} ({why})"));
        }
        Decision::wait(
            format!("{why}; set aside at {} if still paused", limit.to_rfc3339()),
            requeue.min(until(now, limit)),
        )
    }

    /// Sets a paused run aside: a node in hand (cordoned, not terminated)
    /// is put back in service first, one per step; then the rest is
    /// recorded, the run's records cleared, the lock and slot given back.
    fn set_aside_paused(&mut self, why: String) -> Decision {
        let in_hand = self
            .status
            .batch()
            .find(|t| t.terminated.is_none())
            .cloned();
        if let Some(target) = in_hand {
            self.leave_batch(&target.instance_id);
            let label = target.node.clone().unwrap_or(target.instance_id.clone());
            return Decision::back_in_service(
                target.clone(),
                format!("setting the run aside ({why}): {label} back in service"),
            );
        }
        self.set_aside();
        let remaining = self.close_leg();
        self.happenings.push(Happening::SetAside {
            remaining,
            opens: None,
            why: Some(why.clone()),
        });
        Decision::act(
            Command::ReleaseLock,
            format!("run set aside: {why}; {remaining} node(s) left, resumed later"),
            SOON,
        )
    }
}
