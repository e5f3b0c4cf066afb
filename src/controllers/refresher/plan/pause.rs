//! A run in progress that may not step now is paused, for at most
//! `refresh.pauseTimeout`: past it the run is set aside (a node in hand put
//! back in service, the lock and the disruption slot given back, the rest
//! recorded in `status.pendingRun` and resumed later). Its surplus is left
//! to the replenisher, which takes extra Ready nodes back under its usual
//! rules. A paused run whose group has fewer Ready nodes than desired (a
//! spot loss while it waits) is set aside at once, so the replenisher can
//! replace them: Ready never stays below desired because a run waits.
//! While it waits on time with nothing in hand it keeps its lock, its place
//! and its surplus, not the manager-wide slot: the executor gives a slot
//! back whenever nothing is in hand, and takes one before the next drain.

use super::{Command, Deciding, Decision, Happening, IDLE, LOCK_RETRY, SOON};
use crate::controllers::group_view::{LockState, after, until};
use crate::crd::nodegroup::ResolvedRefresh;
use std::time::Duration;

impl Deciding<'_> {
    /// A run's step that acts while every disruption slot is held by
    /// others waits, paused, instead of being made (and, for a node taken
    /// away, refused): the executor takes a free slot itself before the effect,
    /// and gives it back whenever nothing is in hand, so a run waiting on
    /// time holds none. The slot so bounds disruptions, not runs: two runs
    /// may be under way at once, never two groups' nodes out at once
    /// beyond the limit. Master groups too: the slot still refuses a second
    /// Master group at every take, and the masters' rule serialises master
    /// removals. Paused only when it would act: a run waiting on time
    /// without the slot says what it waits for, and its pause clock does
    /// not run because others hold the slots.
    pub(super) fn slot_for_step(&mut self, decided: Decision) -> Decision {
        if self.input.status.run_start.is_none() || self.status.run_start.is_none() {
            return decided;
        }
        // Any step of its own, not only a node's: a run does not raise or
        // lower its surplus while it could take no node away.
        let acts =
            decided.command.mutates() && !matches!(decided.command, Command::GiveBack { .. });
        let input = self.input;
        match input.rules.slots_full() {
            Some(why) if acts => {
                self.undecide();
                let timeout = match input.settings {
                    Ok(settings) => settings.pause_timeout,
                    Err(_) => input.invalid_pause,
                };
                let why = format!("run paused: waiting for a disruption slot: {why}");
                self.pause(why, LOCK_RETRY, timeout)
            }
            _ => decided,
        }
    }

    /// Forgets what this step decided (its records and happenings): it is
    /// made again, on what is seen then, once a slot is free.
    fn undecide(&mut self) {
        self.status = self.input.status.clone();
        self.happenings.clear();
        self.paused = self.status.paused_since.is_some();
    }

    /// A run in progress that may not step now (the group suspended or its
    /// spec invalid, a kops rolling update, the breaker open, the lock
    /// another's), or the lock to take back. None: it steps (and waits for
    /// the slot only if the step acts: `slot_for_step`).
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
        } else {
            match &input.group.lock {
                // The lock lost mid-run (free) is taken again by the
                // executor before the run's next step, as the slot given
                // back while it waited on time: when it acts, not to wait.
                LockState::Ours | LockState::Free => return None,
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
        Decision::wait(
            format!("run set aside: {why}; {remaining} node(s) left, resumed later"),
            SOON,
        )
    }
}
