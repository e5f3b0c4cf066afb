//! `disruption.onWindowClose: ScaleDown`: a run whose maintenance window
//! closes with nodes left removes its surplus (the original layout back),
//! ends this leg with the rest recorded in `status.pendingRun`, and resumes
//! it, with a new surplus, in the next open window.

use super::{Happening, IDLE, Planner, SOON, Step};
use crate::controllers::refresher::plan::Command;
use crate::crd::nodegroup::ResolvedRefresh;
use crate::crd::refresher::{PendingRun, RefreshPhase, RunResult, RunTrigger};

impl Planner<'_> {
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

    /// The surplus of a run set aside is gone: the leg ends without a
    /// result (the run is not over), the lock and slot are given back.
    pub(super) fn end_leg(&mut self) -> Step {
        let remaining = self
            .status
            .pending_run
            .as_ref()
            .map_or(0, |p| p.remaining.len());
        self.clear_run();
        self.status.trigger = None;
        let opens = self.input.window.opens();
        self.happenings
            .push(Happening::SetAside { remaining, opens });
        let when = opens.map_or("when a window opens".to_string(), |t| {
            format!("at {}", t.to_rfc3339())
        });
        Step::act(
            Command::ReleaseLock,
            format!("window closed: surplus removed; {remaining} node(s) left, resuming {when}"),
            SOON,
        )
    }

    /// No run in progress and one set aside: it resumes once a window is
    /// open and it may start (it waits, never skipped). None once resumed.
    pub(super) fn resume(
        &mut self,
        pending: PendingRun,
        settings: &ResolvedRefresh,
    ) -> Option<Step> {
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
            return Some(Step::act(
                self.release_if_ours(),
                format!("{what}; waiting: {why}"),
                IDLE,
            ));
        }
        if let Some(step) = self.outside_windows(&what) {
            return Some(step);
        }
        let (surplus, short) = self.surplus_to_add(settings);
        if let Some(why) = short {
            return Some(Step::wait(format!("{what}; waiting: {why}"), IDLE));
        }
        if self.input.dry_run {
            return Some(Step::wait(
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
    fn end_set_aside(&mut self, pending: PendingRun, settings: &ResolvedRefresh) -> Step {
        let now = self.input.group.now;
        self.status.trigger = pending.trigger;
        self.status.replaced = pending.replaced;
        self.happenings.push(Happening::Finished {
            result: RunResult::Succeeded,
            replaced: pending.replaced,
            took: (now - pending.started).to_std().unwrap_or_default(),
        });
        self.finish_idle(pending.started, RunResult::Succeeded, None, settings);
        self.status.progress = Some(format!("{}/{}", pending.replaced, pending.total));
        Step::act(
            self.release_if_ours(),
            format!(
                "run succeeded: replaced {} of {}; the rest left the group meanwhile",
                pending.replaced, pending.total
            ),
            SOON,
        )
    }
}
