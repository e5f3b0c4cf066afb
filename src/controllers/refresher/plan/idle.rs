//! No run in progress: wait for the schedule, skip a run that cannot start
//! (with the reason), or start one and record what it will do.

use super::targets::{drifted_targets, targets};
use super::{Deciding, Decision, Happening, IDLE, LOCK_RETRY, SOON, surplus_of};
use crate::controllers::authority::Reason;
use crate::controllers::group_view::{AsgView, LockState, after, until};
use crate::crd::Role;
use crate::crd::nodegroup::ResolvedRefresh;
use crate::crd::refresher::RefresherStatus;
use crate::crd::refresher::{AsgDesired, RefreshPhase, RunOutcome, RunResult, RunTrigger};
use crate::schedule::next_run;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// Drifted nodes whose roll may not start yet: looked at again this often.
const DRIFT_RETRY: Duration = Duration::from_secs(15);
/// After a failed drift roll, the next one waits this long.
pub const DRIFT_BACKOFF: Duration = Duration::from_secs(3600);

impl Deciding<'_> {
    /// Not running. Some(step) unless a run starts now.
    pub(super) fn idle(&mut self, settings: &ResolvedRefresh) -> Option<Decision> {
        let input = self.input;
        let now = input.group.now;
        if self.status.next_run_from.as_deref() != Some(input.schedule_key) {
            self.schedule_next(settings);
        }
        if let Some(pending) = self.status.pending_run.clone() {
            return self.resume(pending, settings);
        }
        let due = self.status.next_run.is_some_and(|t| now >= t);
        if !due {
            self.status.phase = RefreshPhase::Idle;
            let drifted = match input.drift_replace {
                true => drifted_targets(input),
                false => vec![],
            };
            if !drifted.is_empty() {
                return self.start_drift_roll(drifted, settings);
            }
            let (message, requeue) = match (self.status.next_run, &settings.schedule) {
                (Some(t), _) => (
                    format!("next run at {}", t.to_rfc3339()),
                    until(now, t).min(IDLE),
                ),
                (None, None) => (
                    "no schedule: only drifted nodes are rolled".to_string(),
                    IDLE,
                ),
                (None, Some(_)) => ("the schedule never fires again".to_string(), IDLE),
            };
            // A lock still held here was left by a run that ended just before a restart.
            return Some(Decision::wait(message, requeue));
        }
        // Another group's master coming back: a due master run waits for
        // it (as for a slot), never skipped.
        if let Some(why) = self.control_plane_not_whole() {
            // Without the lock (taken for a start a master then stopped):
            // the other group's repair, and this group's, may need it.
            let message = format!("due; waiting: {why}");
            return Some(Decision::wait(message, SOON));
        }
        // Outside every window the run waits for the next one, whatever
        // else holds it now: a blocker that passes before the window opens
        // (a spot loss replaced, a node NotReady for a minute) does not
        // skip it, as its preview says; blockers are judged when it may
        // start.
        if let Some(step) = self.outside_windows("due") {
            return Some(step);
        }
        if let Some(why) = self.start_blocker() {
            return Some(self.skip(why, settings));
        }
        let planned = targets(input, settings.max_node_age);
        if planned.is_empty() {
            let why = match settings.max_node_age {
                Some(age) => format!("no node is older than {}", crate::duration::format(age)),
                None => "the group has no node to replace".into(),
            };
            return Some(self.skip(why, settings));
        }
        let (surplus, short) = self.surplus_to_add(settings);
        if let Some(why) = short {
            return Some(self.skip(why, settings));
        }
        if input.dry_run {
            let plan = format!(
                "dry run: would add {} and replace {} node(s) in this order: {}",
                describe_counts(&surplus),
                planned.len(),
                planned.join(", ")
            );
            self.happenings.push(Happening::Planned(plan.clone()));
            self.end_run(now, RunResult::Skipped, Some(plan.clone()), settings);
            return Some(Decision::wait(plan, SOON));
        }
        if let Some(step) = self.lock_to_start("due") {
            return Some(step);
        }
        self.start(planned, surplus, RunTrigger::Schedule);
        None
    }

    /// Drifted members and `drift.action: Replace`: a drift roll of them
    /// starts now, or waits (with the reason) while one may not. A wait is
    /// not a skipped run: it is looked at again until the drift is gone.
    fn start_drift_roll(
        &mut self,
        drifted: Vec<String>,
        settings: &ResolvedRefresh,
    ) -> Option<Decision> {
        let n = drifted.len();
        // No lock (or slot) is held while the roll waits (the status
        // records no run): held, it would keep the group's replenisher
        // from repairing the very node whose NotReady the roll waits on.
        let wait = |why: String| {
            Some(Decision::wait(
                format!("{n} drifted node(s); the drift roll waits: {why}"),
                DRIFT_RETRY,
            ))
        };
        // A drift roll that failed (a new template whose nodes never get
        // Ready) is not retried at once: each try costs a surplus node for
        // the whole ready timeout.
        if let Some((again, why)) = self.drift_backoff() {
            return Some(Decision::wait(
                format!(
                    "{n} drifted node(s); the last drift roll failed ({why}); the next one starts at {}",
                    again.to_rfc3339()
                ),
                until(self.input.group.now, again).min(IDLE),
            ));
        }
        if let Some(why) = self.start_blocker() {
            return wait(why);
        }
        if let Some(why) = self.input.rules.window(Reason::DriftRoll).closed_reason() {
            self.status.phase = RefreshPhase::WaitingForWindow;
            return wait(why);
        }
        let (surplus, short) = self.surplus_to_add(settings);
        if let Some(why) = short {
            return wait(why);
        }
        if self.input.dry_run {
            return wait(format!(
                "dry run: would add {} and replace {}",
                describe_counts(&surplus),
                drifted.join(", ")
            ));
        }
        if let Some(step) = self.lock_to_start("drifted nodes") {
            return Some(step);
        }
        self.start(drifted, surplus, RunTrigger::Drift);
        None
    }

    /// A due run outside every maintenance window waits for the next one
    /// (not skipped: it starts when the window opens). Releases a slot or
    /// lock taken just before the window closed.
    pub(super) fn outside_windows(&mut self, why: &str) -> Option<Decision> {
        let window = self.input.rules.window(Reason::Refresh);
        let reason = window.closed_reason()?;
        self.status.phase = RefreshPhase::WaitingForWindow;
        let requeue = window.recheck_in(self.input.group.now);
        Some(Decision::wait(format!("{why}; waiting: {reason}"), requeue))
    }

    /// After a failed drift roll, when the next may start (and why it
    /// failed), while that is still ahead.
    pub(super) fn drift_backoff(&self) -> Option<(DateTime<Utc>, String)> {
        let last = self.status.last_run.as_ref()?;
        let finished = last.finished?;
        let failed_roll =
            last.trigger == Some(RunTrigger::Drift) && last.result == RunResult::Failed;
        let again = after(finished, DRIFT_BACKOFF);
        (failed_roll && self.input.group.now < again).then(|| {
            let why = last.reason.as_deref().unwrap_or("no reason recorded");
            (again, why.to_string())
        })
    }

    /// Why no run may start now, if so.
    pub(super) fn start_blocker(&self) -> Option<String> {
        let input = self.input;
        if input.group.suspended {
            return Some("the group is suspended".into());
        }
        if input.group.deleting {
            return Some("the NodeGroup is being deleted".into());
        }
        if let Some(why) = &input.group.invalid_spec {
            return Some(format!("the NodeGroup spec is invalid: {why}"));
        }
        if let Some(why) = self.control_plane_not_whole() {
            return Some(why);
        }
        // A master run in a cluster of one or two masters would stop the
        // API at its first master: skipped with why, not started to be
        // refused at its first drain.
        if input.group.role == Role::Master
            && let Some(why) = input.group.control_plane.and_then(|cp| cp.outage())
        {
            return Some(why);
        }
        if let Some(why) = &input.group.external_update {
            return Some(why.clone());
        }
        if let Some(why) = &input.group.breaker {
            return Some(format!("circuit breaker open: {why}"));
        }
        if let Some(why) = blocking_processes(input.group.asgs) {
            return Some(why);
        }
        let ready = self.ready();
        (ready < input.group.desired)
            .then(|| format!("only {ready} of {} nodes are Ready", input.group.desired))
    }

    /// The surplus a run adds, per ASG, and why it cannot all be placed.
    pub(super) fn surplus_to_add(
        &self,
        settings: &ResolvedRefresh,
    ) -> (Vec<AsgDesired>, Option<String>) {
        let wanted = match self.input.group.role {
            Role::Worker => settings.surplus_nodes,
            Role::Master => 0,
        };
        let surplus = distribute(wanted, self.input.group.asgs);
        let placed: i32 = surplus.iter().map(|s| s.desired).sum();
        let short = (placed < wanted).then(|| format!(
            "cannot add {wanted} surplus node(s): only {placed} fit on ASGs that are launching and below their max"
        ));
        (surplus, short)
    }

    /// A run may start (`why`): Some(step) while it waits for the group's
    /// lock or a disruption slot. It does not start while every
    /// disruption slot is held by others: it would raise its surplus only
    /// to wait. The executor takes the lock (then, for the first node, a
    /// slot) itself when the run starts; a wait for either holds neither,
    /// as the status records no run.
    pub(super) fn lock_to_start(&mut self, why: &str) -> Option<Decision> {
        // Looked at before the lock is taken: a group waiting for a slot
        // must not hold its lock meanwhile (that would stall its
        // replenisher).
        if let Some(holders) = self.input.rules.slots_full() {
            self.status.phase = RefreshPhase::WaitingForSlot;
            let waiting = format!("{why}; waiting for a disruption slot: {holders}");
            return Some(Decision::wait(waiting, LOCK_RETRY));
        }
        match &self.input.group.lock {
            LockState::Other(holder) => {
                self.status.phase = RefreshPhase::WaitingForLock;
                Some(Decision::wait(
                    format!("{why}; waiting for the group's lock, held by {holder}"),
                    LOCK_RETRY,
                ))
            }
            LockState::Free | LockState::Ours => None,
        }
    }

    fn start(&mut self, planned: Vec<String>, surplus: Vec<AsgDesired>, trigger: RunTrigger) {
        let placed = surplus.iter().map(|s| s.desired).sum();
        self.begin(planned, surplus, trigger);
        self.status.skipped = vec![];
        self.happenings.push(Happening::Started {
            total: self.status.planned_instances.len(),
            surplus: placed,
            trigger,
        });
    }

    /// Records a run (or a resumed leg of one) as started: the layout now,
    /// the surplus to add, the instances to replace.
    pub(super) fn begin(
        &mut self,
        planned: Vec<String>,
        surplus: Vec<AsgDesired>,
        trigger: RunTrigger,
    ) {
        let input = self.input;
        let st = &mut self.status;
        st.pending_run = None;
        st.run_start = Some(input.group.now);
        st.trigger = Some(trigger);
        st.phase = RefreshPhase::ScalingUp;
        st.phase_since = Some(input.group.now);
        st.original_desired = input
            .group
            .asgs
            .iter()
            .map(|a| AsgDesired {
                auto_scaling_group: a.name.clone(),
                desired: a.desired,
            })
            .collect();
        st.surplus = surplus;
        st.total = planned.len() as i32;
        st.planned_instances = planned;
        st.replaced_instances = vec![];
        st.replaced = 0;
        st.current_target = None;
        st.alongside = vec![];
        st.failure = None;
        st.protected_since = None;
        st.progress = Some(format!("0/{}", st.total));
    }

    fn skip(&mut self, reason: String, settings: &ResolvedRefresh) -> Decision {
        self.happenings.push(Happening::Skipped(reason.clone()));
        self.end_run(
            self.input.group.now,
            RunResult::Skipped,
            Some(reason.clone()),
            settings,
        );
        Decision::wait(format!("run skipped: {reason}"), SOON)
    }

    pub(super) fn schedule_next(&mut self, settings: &ResolvedRefresh) {
        self.status.next_run = settings
            .schedule
            .as_ref()
            .and_then(|schedule| next_run(schedule, settings.time_zone, self.input.group.now));
        self.status.next_run_from = Some(self.input.schedule_key.to_string());
    }

    /// Records how the run (or the skipped one) went and clears the run.
    pub(super) fn end_run(
        &mut self,
        started: DateTime<Utc>,
        result: RunResult,
        reason: Option<String>,
        settings: &ResolvedRefresh,
    ) {
        let now = self.input.group.now;
        let st = &mut self.status;
        let replaced = if result == RunResult::Skipped {
            0
        } else {
            st.replaced
        };
        let trigger = st.trigger.take();
        st.last_run = Some(RunOutcome {
            started,
            trigger,
            finished: Some(now),
            replaced,
            result,
            reason,
        });
        st.pending_run = None;
        self.clear_run();
        // A drift roll leaves the schedule alone: a run that came due
        // meanwhile starts next.
        if trigger != Some(RunTrigger::Drift) {
            self.schedule_next(settings);
        }
    }

    /// Forgets the run in progress (not its progress or skipped nodes).
    pub(super) fn clear_run(&mut self) {
        self.leave_surplus();
        let st = &mut self.status;
        st.phase = RefreshPhase::Idle;
        st.run_start = None;
        st.phase_since = None;
        st.current_target = None;
        st.alongside = vec![];
        st.original_desired = vec![];
        st.surplus = vec![];
        st.planned_instances = vec![];
        st.replaced_instances = vec![];
        st.failure = None;
        st.protected_since = None;
        st.validating_since = None;
        st.validated_since = None;
        st.launched_ahead = vec![];
        st.paused_since = None;
    }
}

/// Why a run cannot start on these ASGs, if one has a process suspended
/// that a run needs: Launch (surplus and replacements) or Terminate.
pub fn blocking_processes(asgs: &[AsgView]) -> Option<String> {
    let blocked: Vec<String> = asgs
        .iter()
        .flat_map(|a| {
            [crate::cloud::LAUNCH, crate::cloud::TERMINATE]
                .into_iter()
                .filter(|p| a.is_suspended(p))
                .map(move |p| format!("{} has its {p} process suspended", a.name))
        })
        .collect();
    (!blocked.is_empty()).then(|| blocked.join("; "))
}

/// Spreads `n` surplus nodes over ASGs that are launching and below their
/// max, the least loaded first.
fn distribute(n: i32, asgs: &[AsgView]) -> Vec<AsgDesired> {
    let mut added: Vec<AsgDesired> = vec![];
    for _ in 0..n {
        let load = |a: &AsgView| a.desired + surplus_of(&added, &a.name);
        let Some(asg) = asgs
            .iter()
            .filter(|a| a.launching && load(a) < a.max && !a.fallback) // never the fallback
            .min_by(|a, b| (load(a), &a.name).cmp(&(load(b), &b.name)))
        else {
            break;
        };
        match added.iter_mut().find(|s| s.auto_scaling_group == asg.name) {
            Some(s) => s.desired += 1,
            None => added.push(AsgDesired {
                auto_scaling_group: asg.name.clone(),
                desired: 1,
            }),
        }
    }
    added
}

fn describe_counts(surplus: &[AsgDesired]) -> String {
    if surplus.is_empty() {
        return "no surplus".into();
    }
    surplus
        .iter()
        .map(|s| format!("{} on {}", s.desired, s.auto_scaling_group))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a plan from `status` at `now` can look at the ASGs and nodes: a
/// run in progress, a run due, a schedule not yet evaluated, or drifted
/// nodes to roll (`drift_pending`: the group reports drifted nodes and its
/// drift action is `Replace`). Otherwise the plan only reports the next
/// run, so the reconcile skips describing the ASGs.
pub fn needs_observation(
    status: Option<&RefresherStatus>,
    schedule_key: &str,
    now: DateTime<Utc>,
    drift_pending: bool,
) -> bool {
    let Some(status) = status else {
        return true;
    };
    drift_pending
        || status.run_start.is_some()
        || status.pending_run.is_some()
        || status.next_run_from.as_deref() != Some(schedule_key)
        || status.next_run.is_some_and(|t| t <= now)
}
