//! The refresher's decisions, pure: from what was observed and `now`, one
//! action and the next status. No I/O; the reconcile persists the status and
//! carries the action out.
//!
//! A run, per group:
//! 1. due (schedule in its time zone), healthy (Ready >= desired), not
//!    suspended, lock taken: record the start, each ASG's desired count, the
//!    surplus per ASG and the instances to replace (oldest first);
//! 2. `ScalingUp`: raise the ASGs by the surplus, wait for Ready >= desired + surplus;
//! 3. `Draining`: the next planned instance, once removing it keeps enough Ready;
//! 4. `WaitingForReplacement`: terminated without decrement (decided and
//!    persisted before the call), wait for Ready to be whole again;
//! 5. `ScalingDown`: every ASG back to its recorded count, surplus nodes chosen
//!    explicitly, drained, terminated with decrement; release the lock.
//!
//! A failure (surplus or replacement not Ready in time, a drain timing out
//! with `Abort`) records its reason and goes to `ScalingDown`: the surplus
//! goes, old nodes stay. Invariants (property-tested below): Ready never
//! drops below the desired count during a worker refresh with surplus, at
//! most one planned node is worked on at a time, no instance is terminated
//! twice, and a run ends with every ASG at its recorded desired count.

use crate::controllers::refresher::schedule::next_run;
use crate::controllers::vocabulary::{AsgView, DesiredChange, LockState, to_chrono, until};
use crate::crd::Role;
use crate::crd::nodegroup::{DrainTimeoutAction, ResolvedRefresh};
use crate::crd::refresher::{
    AsgDesired, RefreshPhase, RefreshTarget, RefresherStatus, RunOutcome, RunResult, TargetPurpose,
};
use chrono::{DateTime, Utc};
use std::collections::BTreeSet;
use std::time::Duration;

pub use crate::controllers::vocabulary::NodeView;

/// An instance that is active (not terminating or detaching) in one of the
/// group's ASGs, per a fresh describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub asg: String,
    pub instance_id: String,
}

pub struct Input<'a> {
    pub role: Role,
    pub desired: i32,
    /// The group or the Refresher is suspended.
    pub suspended: bool,
    pub dry_run: bool,
    /// The Refresher's settings, or why they are invalid.
    pub settings: &'a Result<ResolvedRefresh, String>,
    /// Identifies the schedule (see `RefresherSpec::schedule_key`).
    pub schedule_key: &'a str,
    pub asgs: &'a [AsgView],
    pub members: &'a [Member],
    pub nodes: &'a [NodeView],
    /// Masters: the nodes whose control-plane pods (kube-apiserver,
    /// etcd-manager) are all Ready. Looked at only between replacements.
    pub control_plane_ready: &'a BTreeSet<String>,
    pub lock: LockState,
    pub status: &'a RefresherStatus,
    pub now: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing,
    TakeLock,
    ReleaseLock,
    /// Set ASGs' desired capacity (surplus up, layout back).
    SetDesired(Vec<DesiredChange>),
    /// One drain step on the target's node; once drained, [`after_drain`]
    /// decides the termination, which is persisted before it is made.
    Drain(RefreshTarget),
    /// Carry out a termination already recorded in status (`terminated` set):
    /// Replace without decrement, RemoveSurplus with decrement.
    Terminate(RefreshTarget),
    /// Put a node back in service (a drain given up). Idempotent, so the
    /// reconcile does it before persisting the status that forgets the node.
    Uncordon(String),
}

impl Action {
    /// Whether carrying it out changes AWS or a Node (and so needs the lock).
    pub fn mutates(&self) -> bool {
        matches!(
            self,
            Action::SetDesired(_) | Action::Drain(_) | Action::Terminate(_) | Action::Uncordon(_)
        )
    }
}

/// What happened in this step, for Events and metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum Happening {
    Started {
        total: usize,
        surplus: i32,
    },
    Skipped(String),
    /// Dry run: what the run would do.
    Planned(String),
    Replaced {
        node: String,
        took: Duration,
    },
    Failed(String),
    Finished {
        result: RunResult,
        replaced: i32,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub action: Action,
    pub status: RefresherStatus,
    pub message: String,
    pub requeue: Duration,
    pub happenings: Vec<Happening>,
}

const SOON: Duration = Duration::from_secs(2);
const LOCK_RETRY: Duration = Duration::from_secs(5);
/// Re-check the schedule at least this often (a clock jump, an edit missed).
const IDLE: Duration = Duration::from_secs(300);

pub fn plan(input: &Input) -> Plan {
    let mut planner = Planner {
        input,
        status: input.status.clone(),
        happenings: vec![],
    };
    let (action, message, requeue) = planner.decide();
    let mut status = planner.status;
    status.message = Some(message.clone());
    Plan {
        action,
        status,
        message,
        requeue,
        happenings: planner.happenings,
    }
}

/// Whether a plan from `status` at `now` can look at the ASGs and nodes: a
/// run in progress, a run due, or a schedule not yet evaluated. Otherwise the
/// plan only reports the next run, so the reconcile skips describing the ASGs.
pub fn needs_observation(
    status: Option<&RefresherStatus>,
    schedule_key: &str,
    now: DateTime<Utc>,
) -> bool {
    let Some(status) = status else {
        return true;
    };
    status.run_start.is_some()
        || status.next_run_from.as_deref() != Some(schedule_key)
        || status.next_run.is_some_and(|t| t <= now)
}

/// The drain of the current target is complete (or given up with `Proceed`):
/// record the termination in the status before it is made. Returns the target
/// to terminate, or None when there is no target being drained.
pub fn after_drain(status: &mut RefresherStatus, now: DateTime<Utc>) -> Option<RefreshTarget> {
    let target = status.current_target.as_mut()?;
    if target.terminated.is_some() {
        return None;
    }
    target.terminated = Some(now);
    let target = target.clone();
    if target.purpose == TargetPurpose::Replace {
        if !status.replaced_instances.contains(&target.instance_id) {
            status.replaced_instances.push(target.instance_id.clone());
        }
        status.phase = RefreshPhase::WaitingForReplacement;
    }
    status.phase_since = Some(now);
    Some(target)
}

type Step = (Action, String, Duration);

struct Planner<'a> {
    input: &'a Input<'a>,
    status: RefresherStatus,
    happenings: Vec<Happening>,
}

impl Planner<'_> {
    fn decide(&mut self) -> Step {
        let settings = match self.input.settings {
            Ok(s) => s,
            Err(problem) => {
                if self.status.run_start.is_some() {
                    return (
                        Action::Nothing,
                        format!("run paused: the Refresher's spec is invalid: {problem}"),
                        IDLE,
                    );
                }
                self.status.phase = RefreshPhase::Blocked;
                self.status.next_run = None;
                self.status.next_run_from = None;
                return (self.release_if_ours(), format!("no run: {problem}"), IDLE);
            }
        };
        if self.status.run_start.is_none()
            && let Some(step) = self.idle(settings)
        {
            return step;
        }
        self.running(settings)
    }

    fn release_if_ours(&self) -> Action {
        if self.input.lock == LockState::Ours {
            Action::ReleaseLock
        } else {
            Action::Nothing
        }
    }

    fn schedule_next(&mut self, settings: &ResolvedRefresh) {
        self.status.next_run = next_run(&settings.schedule, settings.time_zone, self.input.now);
        self.status.next_run_from = Some(self.input.schedule_key.to_string());
    }

    fn ready(&self) -> i32 {
        self.input.nodes.iter().filter(|n| n.ready).count() as i32
    }

    fn active(&self, instance_id: &str) -> bool {
        self.input
            .members
            .iter()
            .any(|m| m.instance_id == instance_id)
    }

    fn surplus_total(&self) -> i32 {
        self.status.surplus.iter().map(|s| s.desired).sum()
    }

    /// Ready nodes the group should have while nothing is being replaced.
    fn whole(&self) -> i32 {
        self.input.desired + self.surplus_total()
    }

    /// Not running. Some(step) unless a run starts now.
    fn idle(&mut self, settings: &ResolvedRefresh) -> Option<Step> {
        let input = self.input;
        let now = input.now;
        if self.status.next_run_from.as_deref() != Some(input.schedule_key) {
            self.schedule_next(settings);
        }
        let due = self.status.next_run.is_some_and(|t| now >= t);
        if !due {
            self.status.phase = RefreshPhase::Idle;
            let (message, requeue) = match self.status.next_run {
                Some(t) => (
                    format!("next run at {}", t.to_rfc3339()),
                    until(now, t).min(IDLE),
                ),
                None => ("the schedule never fires again".to_string(), IDLE),
            };
            // A lock still held here was left by a run that ended just before a restart.
            return Some((self.release_if_ours(), message, requeue));
        }
        if input.suspended {
            return Some(self.skip("the group is suspended".into(), settings));
        }
        if let Some(why) = blocking_processes(input.asgs) {
            return Some(self.skip(why, settings));
        }
        let ready = self.ready();
        if ready < input.desired {
            return Some(self.skip(
                format!("only {ready} of {} nodes are Ready", input.desired),
                settings,
            ));
        }
        let planned = targets(input, settings.max_node_age);
        if planned.is_empty() {
            let why = match settings.max_node_age {
                Some(age) => format!("no node is older than {}", crate::duration::format(age)),
                None => "the group has no node to replace".into(),
            };
            return Some(self.skip(why, settings));
        }
        let wanted = match input.role {
            Role::Worker => settings.surplus_nodes,
            Role::Master => 0,
        };
        let surplus = distribute(wanted, input.asgs);
        let placed: i32 = surplus.iter().map(|s| s.desired).sum();
        if placed < wanted {
            return Some(self.skip(
                format!(
                    "cannot add {wanted} surplus node(s): only {placed} fit on ASGs that are launching and below their max"
                ),
                settings,
            ));
        }
        if input.dry_run {
            let plan = format!(
                "dry run: would add {} and replace {} node(s) in this order: {}",
                describe_counts(&surplus),
                planned.len(),
                planned.join(", ")
            );
            self.happenings.push(Happening::Planned(plan.clone()));
            self.finish_idle(now, RunResult::Skipped, Some(plan.clone()), settings);
            return Some((Action::Nothing, plan, SOON));
        }
        match &input.lock {
            LockState::Other(holder) => {
                self.status.phase = RefreshPhase::WaitingForLock;
                return Some((
                    Action::Nothing,
                    format!("due; waiting for the group's lock, held by {holder}"),
                    LOCK_RETRY,
                ));
            }
            LockState::Free => {
                self.status.phase = RefreshPhase::WaitingForLock;
                return Some((
                    Action::TakeLock,
                    "due; taking the group's lock".into(),
                    Duration::ZERO,
                ));
            }
            LockState::Ours => {}
        }
        let st = &mut self.status;
        st.run_start = Some(now);
        st.phase = RefreshPhase::ScalingUp;
        st.phase_since = Some(now);
        st.original_desired = input
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
        st.failure = None;
        st.progress = Some(format!("0/{}", st.total));
        self.happenings.push(Happening::Started {
            total: self.status.planned_instances.len(),
            surplus: placed,
        });
        None
    }

    fn skip(&mut self, reason: String, settings: &ResolvedRefresh) -> Step {
        self.happenings.push(Happening::Skipped(reason.clone()));
        self.finish_idle(
            self.input.now,
            RunResult::Skipped,
            Some(reason.clone()),
            settings,
        );
        (
            self.release_if_ours(),
            format!("run skipped: {reason}"),
            SOON,
        )
    }

    fn finish_idle(
        &mut self,
        started: DateTime<Utc>,
        result: RunResult,
        reason: Option<String>,
        settings: &ResolvedRefresh,
    ) {
        let now = self.input.now;
        let st = &mut self.status;
        let replaced = if result == RunResult::Skipped {
            0
        } else {
            st.replaced
        };
        st.last_run = Some(RunOutcome {
            started,
            finished: Some(now),
            replaced,
            result,
            reason,
        });
        st.phase = RefreshPhase::Idle;
        st.run_start = None;
        st.phase_since = None;
        st.current_target = None;
        st.original_desired = vec![];
        st.surplus = vec![];
        st.planned_instances = vec![];
        st.replaced_instances = vec![];
        st.failure = None;
        self.schedule_next(settings);
    }

    fn fail(&mut self, reason: String) {
        self.happenings.push(Happening::Failed(reason.clone()));
        self.status.failure = Some(match self.status.failure.take() {
            Some(earlier) => format!("{earlier}; {reason}"),
            None => reason,
        });
        self.enter(RefreshPhase::ScalingDown);
    }

    fn enter(&mut self, phase: RefreshPhase) {
        self.status.phase = phase;
        self.status.phase_since = Some(self.input.now);
    }

    fn since_phase(&self) -> DateTime<Utc> {
        self.status
            .phase_since
            .or(self.status.run_start)
            .unwrap_or(self.input.now)
    }

    fn running(&mut self, settings: &ResolvedRefresh) -> Step {
        let input = self.input;
        let now = input.now;
        if input.suspended {
            return (
                Action::Nothing,
                "run paused: the group is suspended".into(),
                IDLE,
            );
        }
        if input.dry_run {
            // A run started by a manager without --dry-run: stepping it here
            // would only record steps that are not made.
            return (
                Action::Nothing,
                "run paused: this manager runs with --dry-run; a manager without it resumes the run".into(),
                IDLE,
            );
        }
        match &input.lock {
            LockState::Ours => {}
            LockState::Free => {
                return (
                    Action::TakeLock,
                    "retaking the group's lock".into(),
                    Duration::ZERO,
                );
            }
            LockState::Other(holder) => {
                return (
                    Action::Nothing,
                    format!("run paused: {holder} holds the group's lock"),
                    LOCK_RETRY,
                );
            }
        }
        // Each pass either returns a step or changes the phase; a handful of
        // passes covers every chain of transitions.
        for _ in 0..8 {
            match self.status.phase {
                RefreshPhase::ScalingUp => {
                    let changes = self.raise_changes();
                    if !changes.is_empty() {
                        let message = format!("adding surplus: {}", describe_changes(&changes));
                        return (Action::SetDesired(changes), message, SOON);
                    }
                    let (ready, whole) = (self.ready(), self.whole());
                    if ready >= whole {
                        self.next_target();
                        continue;
                    }
                    let deadline = self.since_phase() + to_chrono(settings.ready_timeout);
                    if now >= deadline {
                        self.fail(format!(
                            "surplus not Ready within {}: {ready} of {whole} nodes Ready",
                            crate::duration::format(settings.ready_timeout)
                        ));
                        continue;
                    }
                    return (
                        Action::Nothing,
                        format!("waiting for surplus: {ready} of {whole} nodes Ready"),
                        SOON.min(until(now, deadline)),
                    );
                }
                RefreshPhase::Draining | RefreshPhase::ScalingDown
                    if self
                        .status
                        .current_target
                        .as_ref()
                        .is_some_and(|t| t.terminated.is_none()) =>
                {
                    return self.draining(settings);
                }
                RefreshPhase::Draining => {
                    // No target yet (or it finished): pick the next one.
                    self.next_target();
                }
                RefreshPhase::WaitingForReplacement => {
                    let Some(target) = self.status.current_target.clone() else {
                        self.next_target();
                        continue;
                    };
                    if self.active(&target.instance_id) {
                        return self.retry_termination(target);
                    }
                    let (ready, whole) = (self.ready(), self.whole());
                    let node = target.node.clone().unwrap_or(target.instance_id.clone());
                    if ready >= whole {
                        match self.control_plane_settling(settings) {
                            Ok(Some(waiting)) => return waiting,
                            Ok(None) => {}
                            Err(reason) => {
                                self.status.current_target = None;
                                self.fail(reason);
                                continue;
                            }
                        }
                    }
                    if ready >= whole {
                        let took = (now - target.since).to_std().unwrap_or(Duration::ZERO);
                        self.happenings.push(Happening::Replaced { node, took });
                        self.status.replaced += 1;
                        self.status.progress =
                            Some(format!("{}/{}", self.status.replaced, self.status.total));
                        self.status.current_target = None;
                        self.next_target();
                        continue;
                    }
                    let deadline = self.since_phase() + to_chrono(settings.ready_timeout);
                    if now >= deadline {
                        self.status.current_target = None;
                        self.fail(format!(
                            "the replacement for {node} was not Ready within {}: {ready} of {whole} nodes Ready",
                            crate::duration::format(settings.ready_timeout)
                        ));
                        continue;
                    }
                    return (
                        Action::Nothing,
                        format!(
                            "waiting for the replacement of {node}: {ready} of {whole} nodes Ready"
                        ),
                        SOON.min(until(now, deadline)),
                    );
                }
                RefreshPhase::ScalingDown => {
                    if let Some(step) = self.scaling_down(settings) {
                        return step;
                    }
                }
                RefreshPhase::Idle | RefreshPhase::WaitingForLock | RefreshPhase::Blocked => {
                    // A run without a running phase (hand-edited status): resume from the top.
                    self.enter(RefreshPhase::ScalingUp);
                }
            }
        }
        (
            Action::Nothing,
            format!("in phase {:?}", self.status.phase),
            SOON,
        )
    }

    /// ASGs below their recorded desired count plus this run's surplus.
    /// Masters, once the replacement is Ready: wait until every master's
    /// control-plane pods are Ready, then the settle time, before the next
    /// master is touched. Ok(None): go on; Err: not Ready in time.
    fn control_plane_settling(
        &mut self,
        settings: &ResolvedRefresh,
    ) -> Result<Option<Step>, String> {
        let input = self.input;
        if input.role != Role::Master {
            return Ok(None);
        }
        let mut waiting_for: Vec<&str> = input
            .nodes
            .iter()
            .filter(|n| n.ready && !input.control_plane_ready.contains(&n.name))
            .map(|n| n.name.as_str())
            .collect();
        waiting_for.sort();
        let deadline = self.since_phase() + to_chrono(settings.ready_timeout);
        if !waiting_for.is_empty() {
            self.status.control_plane_ready_since = None;
            if input.now >= deadline {
                return Err(format!(
                    "control-plane pods not Ready within {} on {}",
                    crate::duration::format(settings.ready_timeout),
                    waiting_for.join(", ")
                ));
            }
            return Ok(Some((
                Action::Nothing,
                format!(
                    "waiting for control-plane pods (kube-apiserver, etcd-manager) on {}",
                    waiting_for.join(", ")
                ),
                SOON.min(until(input.now, deadline)),
            )));
        }
        let since = *self
            .status
            .control_plane_ready_since
            .get_or_insert(input.now);
        let settled = since + to_chrono(settings.master_settle_time);
        if input.now < settled {
            return Ok(Some((
                Action::Nothing,
                format!(
                    "control plane Ready; settling until {}",
                    settled.to_rfc3339()
                ),
                until(input.now, settled),
            )));
        }
        self.status.control_plane_ready_since = None;
        Ok(None)
    }

    fn raise_changes(&self) -> Vec<DesiredChange> {
        self.status
            .original_desired
            .iter()
            .filter_map(|o| {
                let asg = self
                    .input
                    .asgs
                    .iter()
                    .find(|a| a.name == o.auto_scaling_group)?;
                let want = o.desired + surplus_of(&self.status.surplus, &asg.name);
                (asg.desired < want && want <= asg.max).then(|| DesiredChange {
                    asg: asg.name.clone(),
                    from: asg.desired,
                    to: want,
                })
            })
            .collect()
    }

    /// The oldest planned instance still in service becomes the target (phase
    /// `Draining`); with none left, the run goes to `ScalingDown`.
    fn next_target(&mut self) {
        let input = self.input;
        let next = self.status.planned_instances.iter().find_map(|id| {
            if self.status.replaced_instances.contains(id) || !self.active(id) {
                return None;
            }
            let node = input
                .nodes
                .iter()
                .find(|n| n.instance_id.as_deref() == Some(id.as_str()))?;
            Some(RefreshTarget {
                node: Some(node.name.clone()),
                instance_id: id.clone(),
                auto_scaling_group: node.asg.clone()?,
                purpose: TargetPurpose::Replace,
                since: input.now,
                terminated: None,
            })
        });
        match next {
            Some(target) => {
                self.status.current_target = Some(target);
                self.enter(RefreshPhase::Draining);
            }
            None => {
                self.status.current_target = None;
                self.enter(RefreshPhase::ScalingDown);
            }
        }
    }

    fn removal_safety(&self, target: &RefreshTarget) -> Removal {
        removal(
            target,
            self.input.nodes,
            self.input.desired,
            self.surplus_total(),
        )
    }

    /// A termination recorded but not made (the manager died in between):
    /// make it if it is still safe; otherwise take the record back and let
    /// the drain logic hold or give up, so a restart never removes a node
    /// the group can no longer spare.
    fn retry_termination(&mut self, target: RefreshTarget) -> Step {
        let Removal {
            safe,
            ready_besides,
            needed,
        } = self.removal_safety(&target);
        if safe {
            let message = format!("terminating {}", target.instance_id);
            return (Action::Terminate(target), message, SOON);
        }
        if let Some(t) = self.status.current_target.as_mut() {
            t.terminated = None;
        }
        self.status
            .replaced_instances
            .retain(|id| *id != target.instance_id);
        if target.purpose == TargetPurpose::Replace {
            self.status.phase = RefreshPhase::Draining;
        }
        (
            Action::Nothing,
            format!(
                "holding {}: terminating it now would leave {ready_besides} Ready, fewer than {needed}",
                target.instance_id
            ),
            SOON,
        )
    }

    /// A target chosen, not yet terminated: drain it, or give up on it.
    fn draining(&mut self, settings: &ResolvedRefresh) -> Step {
        let now = self.input.now;
        let Some(target) = self.status.current_target.clone() else {
            return (Action::Nothing, "no target".into(), SOON);
        };
        let label = target
            .node
            .clone()
            .unwrap_or_else(|| target.instance_id.clone());
        if !self.active(&target.instance_id) {
            // Gone by other means (a spot interruption): nothing to terminate.
            self.status.current_target = None;
            if target.purpose == TargetPurpose::Replace {
                self.status.phase = RefreshPhase::Draining;
            }
            return (
                Action::Nothing,
                format!("{label} left its ASG by other means"),
                Duration::ZERO,
            );
        }
        let Removal {
            safe,
            ready_besides,
            needed,
        } = self.removal_safety(&target);
        let drain_deadline = target.since + to_chrono(settings.drain_timeout);
        let give_up = |this: &mut Self, reason: String| -> Step {
            this.status.current_target = None;
            if target.purpose == TargetPurpose::RemoveSurplus {
                // Keep this surplus node rather than loop on it: its ASG's
                // current count becomes the layout to end at, and the failure
                // says so. The replenisher removes extra Ready nodes later.
                let current = this
                    .input
                    .asgs
                    .iter()
                    .find(|a| a.name == target.auto_scaling_group)
                    .map(|a| a.desired);
                if let (Some(o), Some(current)) = (
                    this.status
                        .original_desired
                        .iter_mut()
                        .find(|o| o.auto_scaling_group == target.auto_scaling_group),
                    current,
                ) {
                    o.desired = current;
                }
                this.fail(format!(
                    "{reason}; surplus node {label} kept in {}",
                    target.auto_scaling_group
                ));
            } else {
                this.fail(reason.clone());
            }
            match target.node.clone() {
                Some(node) => (Action::Uncordon(node), reason, Duration::ZERO),
                None => (Action::Nothing, reason, Duration::ZERO),
            }
        };
        if !safe {
            // Waiting for Ready nodes elsewhere, bounded like a replacement.
            let deadline = drain_deadline + to_chrono(settings.ready_timeout);
            if now >= deadline {
                return give_up(
                    self,
                    format!(
                        "gave up on {label}: removing it would leave {ready_besides} Ready, fewer than {needed}"
                    ),
                );
            }
            return (
                Action::Nothing,
                format!(
                    "holding {label}: removing it now would leave {ready_besides} Ready, fewer than {needed}"
                ),
                SOON.min(until(now, deadline)),
            );
        }
        if target.node.is_none() {
            // An instance that never joined: nothing to drain.
            return self.terminate_now(format!("terminating {label} (never joined)"));
        }
        if now >= drain_deadline {
            let after = crate::duration::format(settings.drain_timeout);
            return match settings.drain_timeout_action {
                DrainTimeoutAction::Proceed => self.terminate_now(format!(
                    "drain of {label} timed out after {after}; terminating it anyway (drainTimeoutAction Proceed)"
                )),
                DrainTimeoutAction::Abort => give_up(
                    self,
                    format!("drain of {label} timed out after {after} (drainTimeoutAction Abort)"),
                ),
            };
        }
        let what = match target.purpose {
            TargetPurpose::Replace => format!(
                "draining {label} ({} of {})",
                self.status.replaced + 1,
                self.status.total
            ),
            TargetPurpose::RemoveSurplus => format!("draining surplus node {label}"),
        };
        (
            Action::Drain(target),
            what,
            SOON.min(until(now, drain_deadline)),
        )
    }

    fn terminate_now(&mut self, message: String) -> Step {
        match after_drain(&mut self.status, self.input.now) {
            Some(target) => (Action::Terminate(target), message, SOON),
            None => (Action::Nothing, message, SOON),
        }
    }

    /// Back to the recorded layout; then the run ends. None: phase changed.
    fn scaling_down(&mut self, settings: &ResolvedRefresh) -> Option<Step> {
        let input = self.input;
        if let Some(target) = self.status.current_target.clone() {
            let original = original_of(&self.status.original_desired, &target.auto_scaling_group);
            let asg_desired = input
                .asgs
                .iter()
                .find(|a| a.name == target.auto_scaling_group)
                .map(|a| a.desired);
            // A termination recorded but not seen done yet, and still needed.
            if self.active(&target.instance_id) && asg_desired.is_some_and(|d| Some(d) > original) {
                return Some(self.retry_termination(target));
            }
            self.status.current_target = None;
        }
        let mut changes = vec![];
        let mut victim = None;
        let mut waiting = None;
        for o in &self.status.original_desired {
            let Some(asg) = input.asgs.iter().find(|a| a.name == o.auto_scaling_group) else {
                continue;
            };
            let active: Vec<&Member> = input.members.iter().filter(|m| m.asg == asg.name).collect();
            if asg.desired < o.desired {
                // Lower than recorded (changed by someone else): restore it.
                changes.push(DesiredChange {
                    asg: asg.name.clone(),
                    from: asg.desired,
                    to: o.desired.min(asg.max),
                });
            } else if asg.desired > o.desired
                && ((active.len() as i32) < asg.desired || asg.pending > 0)
            {
                if asg.launching || asg.pending > 0 {
                    // A launch in flight or Pending: lowering desired now could
                    // make AWS pick a victim. Wait for it; it is then removed
                    // like any surplus, explicitly.
                    waiting.get_or_insert_with(|| asg.name.clone());
                } else {
                    // The launch failed and nothing is Pending: cancel it,
                    // terminating nothing.
                    changes.push(DesiredChange {
                        asg: asg.name.clone(),
                        from: asg.desired,
                        to: (active.len() as i32).max(o.desired),
                    });
                }
            } else if asg.desired > o.desired && victim.is_none() {
                victim = self.surplus_victim(&asg.name, &active);
                if victim.is_none() {
                    victim = Some(Err(asg.name.clone()));
                }
            }
        }
        let changes: Vec<DesiredChange> = changes.into_iter().filter(|c| c.from != c.to).collect();
        if !changes.is_empty() {
            let message = format!("restoring the layout: {}", describe_changes(&changes));
            return Some((Action::SetDesired(changes), message, SOON));
        }
        if victim.is_none()
            && let Some(asg) = waiting
        {
            let deadline = self.since_phase() + to_chrono(settings.ready_timeout);
            if input.now < deadline {
                return Some((
                    Action::Nothing,
                    format!(
                        "waiting for the launch in flight in {asg} before removing the surplus"
                    ),
                    SOON.min(until(input.now, deadline)),
                ));
            }
            return Some(self.finish_run(
                settings,
                Some(format!(
                    "a surplus launch in {asg} never landed: its desired count is left above the recorded one"
                )),
            ));
        }
        match victim {
            Some(Ok(target)) => {
                self.status.current_target = Some(target);
                self.status.phase_since = Some(input.now);
                Some(self.draining(settings))
            }
            Some(Err(asg)) => {
                let deadline = self.since_phase() + to_chrono(settings.ready_timeout);
                if input.now >= deadline {
                    return Some(self.finish_run(
                        settings,
                        Some(format!("surplus left in {asg}: no node could be removed while keeping {} Ready", input.desired)),
                    ));
                }
                Some((
                    Action::Nothing,
                    format!(
                        "keeping the surplus in {asg} until removing it leaves {} Ready ({} Ready now)",
                        input.desired,
                        self.ready(),
                    ),
                    SOON.min(until(input.now, deadline)),
                ))
            }
            None => Some(self.finish_run(settings, None)),
        }
    }

    /// Which instance of `asg` goes: one that never joined, else one that is
    /// not Ready, else the newest Ready node (it carries the fewest pods).
    /// Ok(None)-like `None` when removing any would leave too few Ready.
    fn surplus_victim(
        &self,
        asg: &str,
        active: &[&Member],
    ) -> Option<Result<RefreshTarget, String>> {
        let input = self.input;
        let node_of = |id: &str| {
            input
                .nodes
                .iter()
                .find(|n| n.instance_id.as_deref() == Some(id))
        };
        let target = |m: &Member, node: Option<&NodeView>| RefreshTarget {
            node: node.map(|n| n.name.clone()),
            instance_id: m.instance_id.clone(),
            auto_scaling_group: asg.to_string(),
            purpose: TargetPurpose::RemoveSurplus,
            since: input.now,
            terminated: None,
        };
        if let Some(m) = active.iter().find(|m| node_of(&m.instance_id).is_none()) {
            return Some(Ok(target(m, None)));
        }
        if let Some((m, n)) = active.iter().find_map(|m| {
            let n = node_of(&m.instance_id)?;
            (!n.ready).then_some((m, n))
        }) {
            return Some(Ok(target(m, Some(n))));
        }
        if self.ready() - 1 < input.desired {
            return None;
        }
        active
            .iter()
            .filter_map(|m| node_of(&m.instance_id).map(|n| (m, n)))
            .max_by(|(_, a), (_, b)| (a.launch_time, &a.name).cmp(&(b.launch_time, &b.name)))
            .map(|(m, n)| Ok(target(m, Some(n))))
    }

    fn finish_run(&mut self, settings: &ResolvedRefresh, leftover: Option<String>) -> Step {
        let started = self.status.run_start.unwrap_or(self.input.now);
        let reason = match (self.status.failure.clone(), leftover) {
            (Some(f), Some(l)) => Some(format!("{f}; {l}")),
            (f, l) => f.or(l),
        };
        let result = if reason.is_some() {
            RunResult::Failed
        } else {
            RunResult::Succeeded
        };
        let replaced = self.status.replaced;
        let total = self.status.total;
        self.happenings
            .push(Happening::Finished { result, replaced });
        self.finish_idle(started, result, reason.clone(), settings);
        self.status.progress = Some(format!("{replaced}/{total}"));
        let message = match reason {
            Some(r) => format!("run failed after replacing {replaced} of {total}: {r}"),
            None => format!("run succeeded: replaced {replaced} of {total}"),
        };
        (Action::ReleaseLock, message, SOON)
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

/// Whether the group can spare a target, by the Ready nodes besides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removal {
    pub safe: bool,
    pub ready_besides: i32,
    pub needed: i32,
}

/// The one rule for removing a target, used by the plan and re-checked by the
/// reconcile before the termination: replacing an old node keeps Ready at
/// desired + surplus - 1 (workers with surplus: never below desired; without
/// surplus, masters: every other node Ready); removing surplus keeps Ready at
/// desired, and removing one that is not Ready costs no Ready node.
pub fn removal(target: &RefreshTarget, nodes: &[NodeView], desired: i32, surplus: i32) -> Removal {
    let id = Some(target.instance_id.as_str());
    let ready_besides = nodes
        .iter()
        .filter(|n| n.ready && n.instance_id.as_deref() != id)
        .count() as i32;
    let target_ready = nodes
        .iter()
        .any(|n| n.ready && n.instance_id.as_deref() == id);
    let (safe, needed) = match target.purpose {
        TargetPurpose::Replace => {
            let needed = desired + surplus - 1;
            (ready_besides >= needed, needed)
        }
        TargetPurpose::RemoveSurplus => (!target_ready || ready_besides >= desired, desired),
    };
    Removal {
        safe,
        ready_besides,
        needed,
    }
}

/// The instances a run replaces, oldest first: nodes of the group whose
/// instance is active in a group ASG and whose launch time is known and
/// (with `max_age`) at least that old. Nodes launched later are new.
fn targets(input: &Input, max_age: Option<Duration>) -> Vec<String> {
    let mut old: Vec<(&DateTime<Utc>, &str, &str)> = input
        .nodes
        .iter()
        .filter_map(|n| {
            let id = n.instance_id.as_deref()?;
            let launched = n.launch_time.as_ref()?;
            let member = input.members.iter().any(|m| m.instance_id == id);
            let old_enough = max_age.is_none_or(|age| *launched + to_chrono(age) <= input.now);
            (member && old_enough).then_some((launched, n.name.as_str(), id))
        })
        .collect();
    old.sort();
    old.into_iter().map(|(_, _, id)| id.to_string()).collect()
}

/// Spreads `n` surplus nodes over ASGs that are launching and below their
/// max, the least loaded first.
fn distribute(n: i32, asgs: &[AsgView]) -> Vec<AsgDesired> {
    let mut added: Vec<AsgDesired> = vec![];
    for _ in 0..n {
        let load = |a: &AsgView| a.desired + surplus_of(&added, &a.name);
        let Some(asg) = asgs
            .iter()
            .filter(|a| a.launching && load(a) < a.max)
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

fn surplus_of(surplus: &[AsgDesired], asg: &str) -> i32 {
    surplus
        .iter()
        .find(|s| s.auto_scaling_group == asg)
        .map_or(0, |s| s.desired)
}

fn original_of(original: &[AsgDesired], asg: &str) -> Option<i32> {
    original
        .iter()
        .find(|s| s.auto_scaling_group == asg)
        .map(|s| s.desired)
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

fn describe_changes(changes: &[DesiredChange]) -> String {
    changes
        .iter()
        .map(|c| format!("{} {}->{}", c.asg, c.from, c.to))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::nodegroup::parse_schedule;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    fn settings(schedule: &str, zone: &str, surplus: i32) -> ResolvedRefresh {
        ResolvedRefresh {
            schedule: parse_schedule(schedule).expect("schedule"),
            time_zone: zone.parse().expect("zone"),
            surplus_nodes: surplus,
            max_node_age: None,
            drain_timeout: Duration::from_secs(300),
            drain_timeout_action: DrainTimeoutAction::Abort,
            ready_timeout: Duration::from_secs(900),
            master_settle_time: Duration::from_secs(10),
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Crash {
        /// After persisting the planned status, before acting.
        BeforeAction,
        /// After a finished drain's termination is recorded, before the call.
        BeforeTermination,
    }

    #[derive(Debug, Clone)]
    struct Instance {
        id: String,
        asg: String,
        launched: DateTime<Utc>,
        joined: bool,
        ready: bool,
        cordoned: bool,
    }

    #[derive(Debug, Clone)]
    struct SimAsg {
        name: String,
        desired: i32,
        max: i32,
        launching: bool,
        suspended: Vec<String>,
    }

    /// A group and its ASGs as the plan would observe them, driven the way the
    /// reconcile drives the plan: persist the status, then act (or crash).
    #[derive(Debug, Clone)]
    struct Sim {
        now: DateTime<Utc>,
        role: Role,
        desired: i32,
        suspended: bool,
        dry_run: bool,
        settings: Result<ResolvedRefresh, String>,
        key: String,
        asgs: Vec<SimAsg>,
        instances: Vec<Instance>,
        next_id: u32,
        status: RefresherStatus,
        lock: LockState,
        /// Drains of these nodes never finish (a PodDisruptionBudget).
        stuck: Vec<String>,
        /// Masters whose control-plane pods are not Ready.
        control_plane_down: BTreeSet<String>,
        /// Drain steps taken per node: a drain finishes on its second step.
        drain_steps: Vec<String>,
        terminated: Vec<String>,
        happenings: Vec<Happening>,
        actions: Vec<Action>,
        /// Ready nodes right after each of our terminations of a Ready node
        /// (removing one that is not Ready costs no Ready node).
        ready_after_terminations: Vec<i32>,
        /// Each ASG's desired count when each run started.
        layouts: Vec<Vec<(String, i32)>>,
    }

    impl Sim {
        /// `per_asg` Ready nodes in each of `asgs` ASGs, launched a day ago.
        fn new(role: Role, asgs: usize, per_asg: i32, surplus: i32) -> Sim {
            let now = utc(2026, 6, 1, 12, 0);
            let mut sim = Sim {
                now,
                role,
                desired: asgs as i32 * per_asg,
                suspended: false,
                dry_run: false,
                settings: Ok(settings("0 12 * * *", "UTC", surplus)),
                key: "daily".into(),
                asgs: (0..asgs)
                    .map(|i| SimAsg {
                        name: format!("asg-{i}"),
                        desired: per_asg,
                        max: per_asg + 3,
                        launching: true,
                        suspended: vec![],
                    })
                    .collect(),
                instances: vec![],
                next_id: 0,
                status: RefresherStatus {
                    next_run: Some(now),
                    next_run_from: Some("daily".into()),
                    ..Default::default()
                },
                lock: LockState::Free,
                stuck: vec![],
                control_plane_down: BTreeSet::new(),
                drain_steps: vec![],
                terminated: vec![],
                happenings: vec![],
                actions: vec![],
                ready_after_terminations: vec![],
                layouts: vec![],
            };
            sim.launch(now - chrono::Duration::days(1));
            for i in &mut sim.instances {
                i.joined = true;
                i.ready = true;
            }
            sim
        }

        fn node_name(id: &str) -> String {
            format!("node-{id}")
        }

        /// The ASGs launch up to their desired count (when they can).
        fn launch(&mut self, at: DateTime<Utc>) {
            for asg in self.asgs.clone() {
                let have = self.instances.iter().filter(|i| i.asg == asg.name).count() as i32;
                if !asg.launching {
                    continue;
                }
                for _ in have..asg.desired {
                    self.next_id += 1;
                    self.instances.push(Instance {
                        id: format!("i-{:03}", self.next_id),
                        asg: asg.name.clone(),
                        launched: at,
                        joined: false,
                        ready: false,
                        cordoned: false,
                    });
                }
            }
        }

        fn ready_count(&self) -> i32 {
            self.instances.iter().filter(|i| i.ready).count() as i32
        }

        fn views(&self) -> (Vec<AsgView>, Vec<Member>, Vec<NodeView>) {
            let asgs = self
                .asgs
                .iter()
                .map(|a| AsgView {
                    name: a.name.clone(),
                    desired: a.desired,
                    min: 0,
                    max: a.max,
                    instances: self.instances.iter().filter(|i| i.asg == a.name).count() as i32,
                    launching: a.launching,
                    suspended_processes: a.suspended.clone(),
                    ..Default::default()
                })
                .collect();
            let members = self
                .instances
                .iter()
                .map(|i| Member {
                    asg: i.asg.clone(),
                    instance_id: i.id.clone(),
                })
                .collect();
            let nodes = self
                .instances
                .iter()
                .filter(|i| i.joined)
                .map(|i| NodeView {
                    name: Sim::node_name(&i.id),
                    instance_id: Some(i.id.clone()),
                    asg: Some(i.asg.clone()),
                    ready: i.ready,
                    launch_time: Some(i.launched),
                })
                .collect();
            (asgs, members, nodes)
        }

        fn plan(&self) -> Plan {
            let (asgs, members, nodes) = self.views();
            let control_plane_ready: BTreeSet<String> = nodes
                .iter()
                .map(|n| n.name.clone())
                .filter(|n| !self.control_plane_down.contains(n))
                .collect();
            plan(&Input {
                role: self.role,
                desired: self.desired,
                suspended: self.suspended,
                dry_run: self.dry_run,
                settings: &self.settings,
                schedule_key: &self.key,
                asgs: &asgs,
                members: &members,
                nodes: &nodes,
                control_plane_ready: &control_plane_ready,
                lock: self.lock.clone(),
                status: &self.status,
                now: self.now,
            })
        }

        /// One reconcile. `crash`: the manager dies right after persisting
        /// the status, before the action (or, for a finished drain, after
        /// recording the termination and before making it).
        fn step(&mut self, crash: bool) -> Plan {
            self.step_with(if crash {
                Some(Crash::BeforeAction)
            } else {
                None
            })
        }

        fn step_with(&mut self, crash: Option<Crash>) -> Plan {
            let plan = self.plan();
            if plan.status.run_start.is_some() && self.status.run_start.is_none() {
                self.layouts.push(
                    self.asgs
                        .iter()
                        .map(|a| (a.name.clone(), a.desired))
                        .collect(),
                );
            }
            self.actions.push(plan.action.clone());
            self.happenings.extend(plan.happenings.clone());
            if let Action::Uncordon(_) = plan.action {
                // Uncordon happens before the status is written.
                if crash.is_some() {
                    return plan;
                }
            }
            self.status = plan.status.clone();
            if crash == Some(Crash::BeforeAction) {
                return plan;
            }
            match plan.action.clone() {
                Action::Nothing => {}
                Action::TakeLock => {
                    assert_eq!(self.lock, LockState::Free, "took a held lock");
                    self.lock = LockState::Ours;
                }
                Action::ReleaseLock => self.lock = LockState::Free,
                Action::SetDesired(changes) => {
                    assert_eq!(self.lock, LockState::Ours, "mutation without the lock");
                    for c in changes {
                        let active =
                            self.instances.iter().filter(|i| i.asg == c.asg).count() as i32;
                        let asg = self.asgs.iter_mut().find(|a| a.name == c.asg).expect("asg");
                        assert_eq!(asg.desired, c.from, "planned from a stale count");
                        assert!(c.to <= asg.max, "above max");
                        assert!(
                            c.to >= active,
                            "lowering desired would make the ASG pick a victim"
                        );
                        asg.desired = c.to;
                    }
                    self.launch(self.now);
                }
                Action::Drain(target) => {
                    assert_eq!(self.lock, LockState::Ours, "mutation without the lock");
                    let node = target.node.clone().expect("drain of a node");
                    let inst = self
                        .instances
                        .iter_mut()
                        .find(|i| Sim::node_name(&i.id) == node)
                        .expect("draining a node that exists");
                    inst.cordoned = true;
                    let steps = self.drain_steps.iter().filter(|n| **n == node).count();
                    self.drain_steps.push(node.clone());
                    if !self.stuck.contains(&node)
                        && steps >= 1
                        && let Some(t) = after_drain(&mut self.status, self.now)
                    {
                        // Persisted; the manager may die before terminating.
                        if crash != Some(Crash::BeforeTermination) {
                            self.terminate(&t);
                        }
                    }
                }
                Action::Terminate(target) => {
                    assert_eq!(self.lock, LockState::Ours, "mutation without the lock");
                    assert!(
                        target.terminated.is_some(),
                        "termination not recorded first"
                    );
                    self.terminate(&target);
                }
                Action::Uncordon(node) => {
                    if let Some(i) = self
                        .instances
                        .iter_mut()
                        .find(|i| Sim::node_name(&i.id) == node)
                    {
                        i.cordoned = false;
                    }
                }
            }
            plan
        }

        fn terminate(&mut self, target: &RefreshTarget) {
            assert!(
                !self.terminated.contains(&target.instance_id),
                "{} terminated twice",
                target.instance_id
            );
            let Some(pos) = self
                .instances
                .iter()
                .position(|i| i.id == target.instance_id)
            else {
                return;
            };
            let was_ready = self.instances.remove(pos).ready;
            self.terminated.push(target.instance_id.clone());
            if target.purpose == TargetPurpose::RemoveSurplus {
                let asg = self
                    .asgs
                    .iter_mut()
                    .find(|a| a.name == target.auto_scaling_group)
                    .expect("asg");
                asg.desired -= 1;
            }
            if was_ready {
                self.ready_after_terminations.push(self.ready_count());
            }
            self.launch(self.now);
        }

        fn all_join_and_ready(&mut self) {
            for i in &mut self.instances {
                i.joined = true;
                i.ready = true;
            }
        }

        fn advance(&mut self, secs: i64) {
            self.now += chrono::Duration::seconds(secs);
        }

        /// Steps (new nodes Ready at once) until the run ends or `max` steps.
        fn run_to_end(&mut self, max: usize) {
            for _ in 0..max {
                self.step(false);
                self.all_join_and_ready();
                self.advance(1);
                if self.status.run_start.is_none() && self.status.last_run.is_some() {
                    return;
                }
            }
        }

        fn original_cordoned(&self) -> usize {
            self.instances
                .iter()
                .filter(|i| i.cordoned && self.status.planned_instances.contains(&i.id))
                .count()
        }

        fn layout(&self) -> Vec<(String, i32)> {
            self.asgs
                .iter()
                .map(|a| (a.name.clone(), a.desired))
                .collect()
        }

        fn result(&self) -> Option<(RunResult, Option<String>)> {
            self.status
                .last_run
                .as_ref()
                .map(|r| (r.result, r.reason.clone()))
        }
    }

    #[test]
    fn a_plan_that_needs_no_observation_does_not_depend_on_it() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.status.next_run = Some(sim.now + chrono::Duration::hours(1));
        assert!(!needs_observation(Some(&sim.status), &sim.key, sim.now));
        let with = sim.plan();
        sim.instances.clear();
        sim.asgs.clear();
        let without = sim.plan();
        assert_eq!(with, without);
        // Due, running, or a new schedule: observations are needed.
        assert!(needs_observation(
            Some(&sim.status),
            &sim.key,
            sim.now + chrono::Duration::hours(1)
        ));
        assert!(needs_observation(Some(&sim.status), "edited", sim.now));
        sim.status.run_start = Some(sim.now);
        assert!(needs_observation(Some(&sim.status), &sim.key, sim.now));
        assert!(needs_observation(None, &sim.key, sim.now));
    }

    #[test]
    fn a_worker_refresh_replaces_every_node_and_restores_the_layout() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        let original: Vec<String> = sim.instances.iter().map(|i| i.id.clone()).collect();
        let layout = sim.layout();
        sim.run_to_end(200);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
        let mut terminated = sim.terminated.clone();
        terminated.sort();
        // Every original node, then one surplus node.
        assert_eq!(terminated.len(), 4, "{terminated:?}");
        assert!(original.iter().all(|o| sim.terminated.contains(o)));
        assert_eq!(sim.layout(), layout);
        assert!(sim.ready_after_terminations.iter().all(|r| *r >= 3));
        assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(3));
        assert_eq!(sim.lock, LockState::Free);
        assert_eq!(sim.status.phase, RefreshPhase::Idle);
        // Daily at noon UTC: the next run is tomorrow.
        assert_eq!(sim.status.next_run, Some(utc(2026, 6, 2, 12, 0)));
        let replaced = sim
            .happenings
            .iter()
            .filter(|h| matches!(h, Happening::Replaced { .. }))
            .count();
        assert_eq!(replaced, 3);
    }

    #[test]
    fn the_oldest_node_goes_first() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.instances[1].launched -= chrono::Duration::days(3);
        let oldest = sim.instances[1].id.clone();
        sim.run_to_end(200);
        assert_eq!(sim.terminated.first(), Some(&oldest));
    }

    #[test]
    fn schedule_in_a_zone_across_spring_forward_runs_at_the_end_of_the_gap() {
        // 02:30 does not exist in New York on 2026-03-08: the run is at 03:00 EDT (07:00 UTC).
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.settings = Ok(settings("30 2 * * *", "America/New_York", 1));
        sim.key = "ny".into();
        sim.now = utc(2026, 3, 8, 5, 0);
        for i in &mut sim.instances {
            i.launched = utc(2026, 3, 1, 0, 0);
        }
        sim.status = RefresherStatus::default();
        let plan = sim.step(false);
        assert_eq!(plan.status.next_run, Some(utc(2026, 3, 8, 7, 0)));
        assert_eq!(plan.action, Action::Nothing);
        assert_eq!(plan.status.phase, RefreshPhase::Idle);
        sim.now = utc(2026, 3, 8, 6, 59);
        assert_eq!(sim.step(false).action, Action::Nothing);
        sim.now = utc(2026, 3, 8, 7, 0);
        assert_eq!(sim.step(false).action, Action::TakeLock);
        let plan = sim.step(false);
        assert_eq!(plan.status.run_start, Some(utc(2026, 3, 8, 7, 0)));
        assert!(matches!(plan.action, Action::SetDesired(_)));
        sim.run_to_end(200);
        // Next: 02:30 EDT on the 9th = 06:30 UTC.
        assert_eq!(sim.status.next_run, Some(utc(2026, 3, 9, 6, 30)));
    }

    #[test]
    fn schedule_in_a_zone_across_fall_back_runs_once() {
        // 01:30 happens twice in New York on 2026-11-01: one run, at the first.
        let mut sim = Sim::new(Role::Worker, 1, 1, 1);
        sim.settings = Ok(settings("30 1 * * *", "America/New_York", 1));
        sim.key = "ny".into();
        sim.now = utc(2026, 11, 1, 4, 0);
        sim.status = RefresherStatus::default();
        sim.step(false);
        assert_eq!(sim.status.next_run, Some(utc(2026, 11, 1, 5, 30)));
        sim.now = utc(2026, 11, 1, 5, 30);
        sim.run_to_end(100);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
        assert_eq!(sim.status.next_run, Some(utc(2026, 11, 2, 6, 30)));
    }

    #[test]
    fn an_edited_schedule_is_re_evaluated() {
        let mut sim = Sim::new(Role::Worker, 1, 1, 1);
        sim.status.next_run = Some(utc(2026, 6, 2, 12, 0));
        sim.key = "hourly".into();
        sim.settings = Ok(settings("0 * * * *", "UTC", 1));
        sim.now = utc(2026, 6, 1, 12, 10);
        let plan = sim.step(false);
        assert_eq!(plan.status.next_run, Some(utc(2026, 6, 1, 13, 0)));
        assert_eq!(plan.status.next_run_from.as_deref(), Some("hourly"));
    }

    #[test]
    fn a_lock_held_by_the_replenisher_is_waited_for() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.lock = LockState::Other("Replenish workers".into());
        for _ in 0..3 {
            let plan = sim.step(false);
            assert_eq!(plan.action, Action::Nothing);
            assert_eq!(plan.status.phase, RefreshPhase::WaitingForLock);
            assert!(
                plan.message.contains("Replenish workers"),
                "{}",
                plan.message
            );
            assert_eq!(plan.status.run_start, None);
            sim.advance(60);
        }
        sim.lock = LockState::Free;
        assert_eq!(sim.step(false).action, Action::TakeLock);
        sim.run_to_end(200);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    }

    #[test]
    fn a_suspended_group_skips_the_run_and_says_why() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.suspended = true;
        let plan = sim.step(false);
        assert_eq!(plan.action, Action::Nothing);
        assert_eq!(
            sim.result(),
            Some((RunResult::Skipped, Some("the group is suspended".into())))
        );
        assert_eq!(sim.status.next_run, Some(utc(2026, 6, 2, 12, 0)));
        assert!(sim.terminated.is_empty());
        assert!(matches!(sim.happenings[0], Happening::Skipped(_)));
    }

    #[test]
    fn an_asg_with_launch_or_terminate_suspended_skips_the_run_naming_both() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.asgs[1].suspended = vec!["AZRebalance".into(), "Launch".into()];
        sim.asgs[2].suspended = vec!["Terminate".into()];
        let plan = sim.step(false);
        assert_eq!(plan.action, Action::Nothing);
        assert_eq!(
            sim.result(),
            Some((
                RunResult::Skipped,
                Some(
                    "asg-1 has its Launch process suspended; asg-2 has its Terminate process suspended"
                        .into()
                )
            ))
        );
        assert!(sim.terminated.is_empty());
        // AZRebalance alone does not stop a run.
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.asgs[1].suspended = vec!["AZRebalance".into()];
        sim.run_to_end(200);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    }

    #[test]
    fn too_few_ready_nodes_skip_the_run() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.instances[0].ready = false;
        sim.step(false);
        assert_eq!(
            sim.result(),
            Some((
                RunResult::Skipped,
                Some("only 2 of 3 nodes are Ready".into())
            ))
        );
        assert_eq!(sim.lock, LockState::Free);
        assert!(sim.actions.iter().all(|a| !a.mutates()));
    }

    #[test]
    fn surplus_that_never_gets_ready_fails_the_run_and_is_removed() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        let layout = sim.layout();
        sim.step(false); // lock
        sim.step(false); // start, raise
        assert!(sim.asgs.iter().map(|a| a.desired).sum::<i32>() == 4);
        // The surplus never becomes Ready.
        for _ in 0..20 {
            sim.step(false);
            sim.advance(60);
        }
        let (result, reason) = sim.result().expect("ended");
        assert_eq!(result, RunResult::Failed);
        assert!(
            reason
                .unwrap_or_default()
                .contains("surplus not Ready within 15m")
        );
        assert_eq!(sim.layout(), layout);
        // The not-Ready surplus instance was removed; no old node was touched.
        assert_eq!(sim.terminated.len(), 1);
        assert_eq!(sim.instances.iter().filter(|i| i.ready).count(), 3);
        assert!(sim.instances.iter().all(|i| !i.cordoned));
        assert_eq!(sim.lock, LockState::Free);
    }

    #[test]
    fn surplus_that_cannot_launch_is_cancelled_without_terminating_anything() {
        let mut sim = Sim::new(Role::Worker, 2, 1, 1);
        for a in &mut sim.asgs {
            a.launching = false;
        }
        // Not launching anywhere: the run does not start.
        sim.step(false);
        let (result, reason) = sim.result().expect("skipped");
        assert_eq!(result, RunResult::Skipped);
        assert!(reason.unwrap_or_default().contains("cannot add 1 surplus"));
        // Launching per the describe, but nothing comes: timed out, desired set back.
        let mut sim = Sim::new(Role::Worker, 2, 1, 1);
        sim.step(false);
        sim.step(false);
        for a in &mut sim.asgs {
            a.launching = false;
        }
        sim.instances.retain(|i| i.ready);
        for _ in 0..20 {
            sim.step(false);
            sim.advance(60);
        }
        assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Failed));
        assert_eq!(sim.layout(), vec![("asg-0".into(), 1), ("asg-1".into(), 1)]);
        assert!(sim.terminated.is_empty());
    }

    #[test]
    fn a_replacement_that_never_gets_ready_fails_and_keeps_the_other_old_nodes() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        let layout = sim.layout();
        let original: Vec<String> = sim.instances.iter().map(|i| i.id.clone()).collect();
        // Surplus Ready (in asg-0), the first old node (in asg-1) replaced;
        // its replacement never joins.
        sim.instances[1].launched -= chrono::Duration::days(1);
        sim.step(false);
        sim.step(false);
        sim.all_join_and_ready();
        while sim.terminated.is_empty() {
            sim.step(false);
        }
        for _ in 0..16 {
            sim.step(false);
            sim.advance(60);
        }
        let reason = sim.status.failure.clone().unwrap_or_default();
        assert!(reason.contains("was not Ready within 15m"), "{reason}");
        assert_eq!(sim.status.phase, RefreshPhase::ScalingDown);
        // The surplus is what keeps 3 Ready: it stays while the replacement is not Ready.
        assert_eq!(sim.terminated.len(), 1);
        assert_eq!(sim.ready_count(), 3);
        // The replacement comes up late: the surplus goes, the layout is back.
        sim.all_join_and_ready();
        sim.run_to_end(50);
        let (result, reason) = sim.result().expect("ended");
        assert_eq!(result, RunResult::Failed);
        assert!(
            reason
                .unwrap_or_default()
                .contains("was not Ready within 15m")
        );
        assert_eq!(sim.layout(), layout);
        // One old node replaced, the other two kept and schedulable.
        let kept: Vec<&Instance> = sim
            .instances
            .iter()
            .filter(|i| original.contains(&i.id))
            .collect();
        assert_eq!(kept.len(), 2);
        assert!(kept.iter().all(|i| i.ready && !i.cordoned));
        assert!(sim.ready_after_terminations.iter().all(|r| *r >= 3));
        assert!(
            sim.happenings
                .iter()
                .any(|h| matches!(h, Happening::Failed(_)))
        );
        assert_eq!(sim.lock, LockState::Free);
    }

    #[test]
    fn a_surplus_still_needed_after_a_failure_is_kept_and_the_run_ends() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        // The first target is in asg-1; the surplus goes to asg-0.
        sim.instances[1].launched -= chrono::Duration::days(1);
        sim.step(false);
        sim.step(false);
        sim.all_join_and_ready();
        while sim.terminated.is_empty() {
            sim.step(false);
        }
        for _ in 0..40 {
            sim.step(false);
            sim.advance(60);
        }
        let (result, reason) = sim.result().expect("ended");
        assert_eq!(result, RunResult::Failed);
        let reason = reason.unwrap_or_default();
        assert!(reason.contains("surplus left in asg-0"), "{reason}");
        assert_eq!(sim.ready_count(), 3);
        assert_eq!(sim.lock, LockState::Free);
    }

    fn stuck_first_drain(action: DrainTimeoutAction) -> Sim {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        if let Ok(s) = &mut sim.settings {
            s.drain_timeout_action = action;
        }
        let first = Sim::node_name(&sim.instances[0].id);
        sim.stuck = vec![first];
        sim
    }

    #[test]
    fn a_drain_timeout_with_proceed_terminates_the_node_anyway() {
        let mut sim = stuck_first_drain(DrainTimeoutAction::Proceed);
        let first = sim.instances[0].id.clone();
        for _ in 0..30 {
            sim.step(false);
            sim.all_join_and_ready();
            sim.advance(20);
        }
        assert!(sim.terminated.contains(&first));
        sim.run_to_end(200);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
        assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(3));
    }

    #[test]
    fn a_drain_timeout_with_abort_ends_the_run_and_keeps_the_node() {
        let mut sim = stuck_first_drain(DrainTimeoutAction::Abort);
        let layout = sim.layout();
        let first = sim.instances[0].id.clone();
        for _ in 0..40 {
            sim.step(false);
            sim.all_join_and_ready();
            sim.advance(20);
        }
        let (result, reason) = sim.result().expect("ended");
        assert_eq!(result, RunResult::Failed);
        assert!(reason.unwrap_or_default().contains("timed out after 5m"));
        assert!(!sim.terminated.contains(&first));
        let node = sim.instances.iter().find(|i| i.id == first).expect("kept");
        assert!(!node.cordoned, "the kept node is back in service");
        assert_eq!(sim.layout(), layout);
        assert_eq!(sim.terminated.len(), 1, "only the surplus went");
    }

    #[test]
    fn max_node_age_leaves_young_nodes_alone() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        if let Ok(s) = &mut sim.settings {
            s.max_node_age = Some(Duration::from_secs(7 * 24 * 3600));
        }
        sim.instances[2].launched = sim.now - chrono::Duration::days(10);
        let old = sim.instances[2].id.clone();
        sim.run_to_end(200);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
        assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(1));
        assert_eq!(sim.terminated.len(), 2); // the old node and the surplus
        assert!(sim.terminated.contains(&old));

        let mut young = Sim::new(Role::Worker, 3, 1, 1);
        if let Ok(s) = &mut young.settings {
            s.max_node_age = Some(Duration::from_secs(7 * 24 * 3600));
        }
        young.step(false);
        assert_eq!(
            young.result(),
            Some((
                RunResult::Skipped,
                Some("no node is older than 168h".into())
            ))
        );
    }

    #[test]
    fn masters_are_replaced_one_at_a_time_without_surplus() {
        let mut sim = Sim::new(Role::Master, 3, 1, 0);
        let layout = sim.layout();
        let mut max_not_ready = 0;
        for _ in 0..300 {
            sim.step(false);
            let desired: i32 = sim.asgs.iter().map(|a| a.desired).sum();
            assert_eq!(desired, 3, "no surplus master");
            max_not_ready = max_not_ready.max(3 - sim.ready_count());
            // New masters join and become Ready a few steps later.
            if sim.now.timestamp() % 4 == 0 {
                sim.all_join_and_ready();
            }
            sim.advance(1);
            if sim.status.last_run.is_some() {
                break;
            }
        }
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
        assert_eq!(sim.terminated.len(), 3);
        assert_eq!(max_not_ready, 1, "one master at a time");
        // Each termination left the other two Ready.
        assert!(sim.ready_after_terminations.iter().all(|r| *r == 2));
        assert_eq!(sim.layout(), layout);
    }

    #[test]
    fn the_next_master_waits_for_the_control_plane_and_the_settle_time() {
        let mut sim = Sim::new(Role::Master, 3, 1, 0);
        let originals: BTreeSet<String> = sim
            .instances
            .iter()
            .map(|i| Sim::node_name(&i.id))
            .collect();
        // Run until the first replacement is Ready, its control plane down.
        for _ in 0..60 {
            sim.step(false);
            let new: Vec<String> = sim
                .instances
                .iter()
                .map(|i| Sim::node_name(&i.id))
                .filter(|n| !originals.contains(n))
                .collect();
            sim.control_plane_down.extend(new);
            sim.all_join_and_ready();
            sim.advance(1);
            if sim.terminated.len() == 1 && sim.ready_count() == 3 {
                break;
            }
        }
        assert_eq!(sim.terminated.len(), 1);
        let drains_so_far = sim.drain_steps.len();
        for _ in 0..30 {
            let plan = sim.step(false);
            assert!(
                plan.message.contains("control-plane pods"),
                "{}",
                plan.message
            );
            sim.advance(1);
        }
        assert_eq!(
            sim.drain_steps.len(),
            drains_so_far,
            "no second master touched"
        );
        // Up: still the settle time (10 s here) before the next master.
        sim.control_plane_down.clear();
        for _ in 0..9 {
            let plan = sim.step(false);
            assert!(plan.message.contains("settling"), "{}", plan.message);
            sim.advance(1);
        }
        assert_eq!(sim.drain_steps.len(), drains_so_far);
        sim.advance(1);
        sim.run_to_end(300);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
        assert_eq!(sim.terminated.len(), 3);
    }

    #[test]
    fn a_master_is_not_terminated_while_another_master_is_not_ready() {
        let mut sim = Sim::new(Role::Master, 3, 1, 0);
        let first = Sim::node_name(&sim.instances[0].id);
        sim.stuck = vec![first.clone()];
        sim.step(false); // lock
        let plan = sim.step(false); // start, first drain step
        assert!(matches!(plan.action, Action::Drain(_)));
        // Another master goes down while the first is drained.
        sim.instances[2].ready = false;
        sim.stuck.clear();
        for _ in 0..5 {
            let plan = sim.step(false);
            assert!(!matches!(
                plan.action,
                Action::Drain(_) | Action::Terminate(_)
            ));
            assert!(plan.message.contains("holding"), "{}", plan.message);
        }
        assert!(sim.terminated.is_empty());
        sim.instances[2].ready = true;
        sim.run_to_end(100);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
        assert!(sim.ready_after_terminations.iter().all(|r| *r == 2));
    }

    #[test]
    fn a_dry_run_plans_and_logs_without_mutating() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.dry_run = true;
        let plan = sim.step(false);
        assert_eq!(plan.action, Action::Nothing);
        let (result, reason) = sim.result().expect("recorded");
        assert_eq!(result, RunResult::Skipped);
        let reason = reason.unwrap_or_default();
        assert!(
            reason.starts_with("dry run: would add 1 on asg-0 and replace 3"),
            "{reason}"
        );
        assert!(matches!(sim.happenings[0], Happening::Planned(_)));
        assert_eq!(sim.lock, LockState::Free);
    }

    #[test]
    fn a_run_in_progress_is_paused_under_dry_run() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.step(false);
        sim.step(false);
        let before = sim.status.clone();
        sim.dry_run = true;
        let plan = sim.step(false);
        assert_eq!(plan.action, Action::Nothing);
        assert!(plan.message.contains("--dry-run"), "{}", plan.message);
        assert_eq!(plan.status.phase, before.phase);
        assert_eq!(plan.status.run_start, before.run_start);
    }

    #[test]
    fn an_invalid_spec_blocks_runs_and_pauses_a_run_in_progress() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.settings = Err("spec.timeZone: unknown".into());
        let plan = sim.step(false);
        assert_eq!(plan.status.phase, RefreshPhase::Blocked);
        assert_eq!(plan.status.next_run, None);
        assert!(plan.message.contains("spec.timeZone"));

        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.step(false);
        sim.step(false);
        sim.settings = Err("spec.timeZone: unknown".into());
        let plan = sim.step(false);
        assert_eq!(plan.action, Action::Nothing);
        assert!(plan.status.run_start.is_some(), "the run is kept");
        assert!(plan.message.contains("paused"));
    }

    #[test]
    fn a_run_suspended_midway_pauses_and_resumes() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        while sim.terminated.is_empty() {
            sim.step(false);
            sim.all_join_and_ready();
        }
        sim.suspended = true;
        let plan = sim.step(false);
        assert_eq!(plan.action, Action::Nothing);
        assert!(plan.message.contains("suspended"));
        sim.suspended = false;
        sim.run_to_end(200);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    }

    #[test]
    fn a_restart_after_recording_a_termination_terminates_that_same_node() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        loop {
            let plan = sim.plan();
            if matches!(plan.action, Action::Drain(_)) {
                sim.status = plan.status;
                break;
            }
            sim.step(false);
            sim.all_join_and_ready();
        }
        // Drain completes, the termination is recorded, the manager dies.
        let target = sim.status.current_target.clone().expect("target");
        let recorded = after_drain(&mut sim.status, sim.now).expect("recorded");
        assert_eq!(recorded.instance_id, target.instance_id);
        // Restarted: the same instance, once.
        let plan = sim.step(false);
        assert_eq!(plan.action, Action::Terminate(recorded.clone()));
        assert_eq!(sim.terminated, vec![target.instance_id.clone()]);
        let next = sim.step(false);
        assert!(!matches!(next.action, Action::Terminate(_)));
    }

    #[test]
    fn a_target_that_vanishes_is_skipped_not_counted() {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        sim.stuck = sim
            .instances
            .iter()
            .map(|i| Sim::node_name(&i.id))
            .collect();
        loop {
            let plan = sim.step(false);
            sim.all_join_and_ready();
            if matches!(plan.action, Action::Drain(_)) {
                break;
            }
        }
        let target = sim.status.current_target.clone().expect("target");
        // The drain is in progress when a spot interruption takes the node.
        sim.instances.retain(|i| i.id != target.instance_id);
        sim.launch(sim.now);
        sim.stuck.clear();
        sim.run_to_end(200);
        assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
        assert!(!sim.terminated.contains(&target.instance_id));
        assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(2));
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// One reconcile, perhaps with the manager dying in it.
        Reconcile(Option<Crash>),
        /// A node that is not being replaced goes NotReady (and recovers on a later Ready).
        NotReady(usize),
        /// A node joins (not Ready yet).
        Join(usize),
        /// A node becomes Ready.
        Ready(usize),
        /// Time passes (seconds).
        Tick(i64),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            6 => Just(Event::Reconcile(None)),
            1 => Just(Event::Reconcile(Some(Crash::BeforeAction))),
            1 => Just(Event::Reconcile(Some(Crash::BeforeTermination))),
            1 => (0..8usize).prop_map(Event::NotReady),
            2 => (0..8usize).prop_map(Event::Join),
            2 => (0..8usize).prop_map(Event::Ready),
            1 => (1..40i64).prop_map(Event::Tick),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Whatever the order of nodes joining, becoming Ready, time passing
        /// and the manager dying: our terminations never leave fewer Ready
        /// than desired, at most one old node is worked on at a time, no
        /// instance is terminated twice (asserted in the sim), and the run
        /// ends with every ASG at its recorded count.
        #[test]
        fn a_worker_refresh_is_safe_under_any_event_order(
            asgs in 1..4usize,
            per_asg in 1..3i32,
            surplus in 1..3i32,
            events in proptest::collection::vec(event(), 0..300),
        ) {
            let mut sim = Sim::new(Role::Worker, asgs, per_asg, surplus);
            let desired = sim.desired;
            for e in events {
                match e {
                    Event::Reconcile(crash) => { sim.step_with(crash); }
                    Event::NotReady(k) => {
                        let ready: Vec<usize> = (0..sim.instances.len()).filter(|i| sim.instances[*i].ready).collect();
                        if let Some(i) = ready.get(k % ready.len().max(1)) { sim.instances[*i].ready = false; }
                    }
                    Event::Join(k) => {
                        let waiting: Vec<usize> = (0..sim.instances.len()).filter(|i| !sim.instances[*i].joined).collect();
                        if let Some(i) = waiting.get(k % waiting.len().max(1)) { sim.instances[*i].joined = true; }
                    }
                    Event::Ready(k) => {
                        let waiting: Vec<usize> = (0..sim.instances.len()).filter(|i| sim.instances[*i].joined && !sim.instances[*i].ready).collect();
                        if let Some(i) = waiting.get(k % waiting.len().max(1)) { sim.instances[*i].ready = true; }
                    }
                    Event::Tick(s) => sim.advance(s),
                }
                prop_assert!(sim.original_cordoned() <= 1, "two old nodes worked on at once");
                prop_assert!(sim.ready_after_terminations.iter().all(|r| *r >= desired),
                    "Ready fell below {desired}: {:?}", sim.ready_after_terminations);
            }
            let started = sim.layouts.len();
            let before_end: Vec<String> = sim.instances.iter().map(|i| i.id.clone()).collect();
            sim.run_to_end(500);
            prop_assert!(sim.status.run_start.is_none(), "run did not end: {:?}", sim.status);
            // A run that succeeded (and was under way) left none of the nodes it started with.
            if started > 0 && sim.result().map(|r| r.0) == Some(RunResult::Succeeded) && sim.layouts.len() == started {
                let original_left = sim.instances.iter().filter(|i| i.launched < Sim::new(Role::Worker, 1, 1, 1).now && before_end.contains(&i.id)).count();
                prop_assert_eq!(original_left, 0, "old nodes left after success: {:?}", sim.status.last_run);
            }
            prop_assert!(sim.ready_after_terminations.iter().all(|r| *r >= desired));
            let kept = sim.result().and_then(|r| r.1).is_some_and(|r| r.contains("kept"));
            if let (Some(start), false) = (sim.layouts.last(), kept) {
                prop_assert_eq!(&sim.layout(), start, "layout not restored: {:?}", sim.result());
            }
            prop_assert_eq!(sim.lock.clone(), LockState::Free);
        }
    }
}
