//! `disruption.onWindowClose: ScaleDown`: a run whose maintenance window
//! closes with nodes left removes its surplus (the original layout back),
//! ends this leg with the rest recorded in `status.pendingRun`, and resumes
//! it, with a new surplus, in the next open window.
//!
//! A master run the disruption authority stops (another master of the
//! cluster went down) is set aside the same way: waiting with its lock and
//! slot would keep the other group's repair, which needs the slot, from
//! ever bringing that master back.

use super::{Deciding, Decision, Happening, IDLE, SOON};
use crate::controllers::authority::Blocked;
use crate::crd::Role;
use crate::crd::nodegroup::ResolvedRefresh;
use crate::crd::refresher::{PendingRun, RefreshPhase, RefreshTarget, RunResult, RunTrigger};

/// Why a master run does not start when the control plane was not looked at.
pub(super) const CONTROL_PLANE_UNOBSERVED: &str = "the control plane was not observed";

impl Deciding<'_> {
    /// The window closed with nodes left: record what is left before the
    /// surplus goes (`ScalingDown` then ends the leg, see [`Self::end_leg`]).
    pub(super) fn set_aside(&mut self) {
        let st = &self.status;
        let remaining = st
            .planned_instances
            .iter()
            .filter(|id| !st.replaced_instances.contains(id) && !self.skipped(id))
            .filter(|id| self.active(id))
            .cloned()
            .collect();
        self.status.pending_run = Some(PendingRun {
            started: st.run_start.unwrap_or(self.input.group.now),
            trigger: st.trigger,
            remaining,
            replaced: st.replaced,
            total: st.total,
        });
    }

    /// The authority refuses the target now: put it back in service and set
    /// the run aside (lock and slot given back); it resumes once every
    /// master of the cluster is Ready (`start_blocker`).
    pub(super) fn yield_to_authority(
        &mut self,
        target: &RefreshTarget,
        blocked: Blocked,
    ) -> Decision {
        self.leave_batch(&target.instance_id);
        self.set_aside();
        self.enter(RefreshPhase::ScalingDown);
        Decision::back_in_service(
            target.clone(),
            format!("run set aside: refusing to {blocked}; it resumes once every master is Ready"),
        )
    }

    /// A Master group: a run starts (or resumes) only while every master
    /// of the cluster is Ready, counted by instance across every Master
    /// group. Why not, if not.
    pub(super) fn control_plane_not_whole(&self) -> Option<String> {
        if self.input.group.role != Role::Master {
            return None;
        }
        let Some(cp) = self.input.group.control_plane else {
            return Some(CONTROL_PLANE_UNOBSERVED.into());
        };
        if cp.whole() {
            return None;
        }
        let down: Vec<String> = cp.down.iter().map(|d| d.to_string()).collect();
        Some(format!(
            "not every master of the cluster is Ready ({} of {}); down: {}",
            cp.ready.len(),
            cp.expected,
            down.join(", ")
        ))
    }

    /// The authority's refusal to replace `target` now, if it refuses.
    pub(super) fn refused(&self, target: &RefreshTarget) -> Option<Blocked> {
        let group = &self.input.group;
        let reason = self.reason_of(target);
        super::authority(target, reason, group.role, group.control_plane).err()
    }

    /// Forgets the leg of a run set aside (its rest is in `pendingRun`):
    /// how many nodes are left.
    pub(super) fn close_leg(&mut self) -> usize {
        let remaining = self
            .status
            .pending_run
            .as_ref()
            .map_or(0, |p| p.remaining.len());
        self.clear_run();
        self.status.trigger = None;
        remaining
    }

    /// The surplus of a run set aside is gone: the leg ends without a
    /// result (the run is not over), the lock and slot are given back.
    pub(super) fn end_leg(&mut self) -> Decision {
        let remaining = self.close_leg();
        let opens = self.run_window().opens();
        // Set aside in an open window: the authority stopped it.
        let why = match self.run_window().closed_reason() {
            Some(_) => None,
            None => self
                .control_plane_not_whole()
                .map(|why| format!("{why}; it resumes once every master is Ready")),
        };
        let message = match &why {
            Some(why) => format!("run set aside: {why}; {remaining} node(s) left"),
            None => {
                let when = opens.map_or("when a window opens".to_string(), |t| {
                    format!("at {}", t.to_rfc3339())
                });
                format!("window closed: surplus removed; {remaining} node(s) left, resuming {when}")
            }
        };
        self.happenings.push(Happening::SetAside {
            remaining,
            opens,
            why,
        });
        Decision::wait(message, SOON)
    }

    /// No run in progress and one set aside: it resumes once a window is
    /// open and it may start (it waits, never skipped). None once resumed.
    pub(super) fn resume(
        &mut self,
        pending: PendingRun,
        settings: &ResolvedRefresh,
    ) -> Option<Decision> {
        self.status.phase = RefreshPhase::Idle;
        let left: Vec<String> = pending
            .remaining
            .iter()
            .filter(|id| self.active(id))
            .cloned()
            .collect();
        let what = format!("{} node(s) left of a run set aside", left.len());
        if left.is_empty() {
            // Everything left was replaced or removed by someone else meanwhile.
            return Some(self.end_set_aside(pending, settings));
        }
        if let Some(why) = self.start_blocker() {
            return Some(Decision::wait(format!("{what}; waiting: {why}"), IDLE));
        }
        if let Some(step) = self.outside_windows(&what) {
            return Some(step);
        }
        let (surplus, short) = self.surplus_to_add(settings);
        if let Some(why) = short {
            return Some(Decision::wait(format!("{what}; waiting: {why}"), IDLE));
        }
        if self.input.dry_run {
            return Some(Decision::wait(
                format!(
                    "{what}; this manager runs with --dry-run; a manager without it resumes the run"
                ),
                IDLE,
            ));
        }
        if let Some(step) = self.lock_to_start(&what) {
            return Some(step);
        }
        let n = left.len();
        let trigger = pending.trigger.unwrap_or(RunTrigger::Schedule);
        self.begin(left, surplus, trigger);
        let st = &mut self.status;
        st.run_start = Some(pending.started);
        st.replaced = pending.replaced;
        st.total = pending.total;
        st.progress = Some(format!("{}/{}", st.replaced, st.total));
        self.happenings.push(Happening::Resumed { remaining: n });
        None
    }

    /// Nothing of the run set aside is left to replace: it ends, succeeded.
    fn end_set_aside(&mut self, pending: PendingRun, settings: &ResolvedRefresh) -> Decision {
        let now = self.input.group.now;
        self.status.trigger = pending.trigger;
        self.status.replaced = pending.replaced;
        self.happenings.push(Happening::Finished {
            result: RunResult::Succeeded,
            replaced: pending.replaced,
            took: (now - pending.started).to_std().unwrap_or_default(),
        });
        self.end_run(pending.started, RunResult::Succeeded, None, settings);
        self.status.progress = Some(format!("{}/{}", pending.replaced, pending.total));
        Decision::wait(
            format!(
                "run succeeded: replaced {} of {}; the rest left the group meanwhile",
                pending.replaced, pending.total
            ),
            SOON,
        )
    }
}
