//! The refresher's decisions, pure: from what was observed and `now`, one
//! [`Decision`] and the next status. No I/O; the reconcile persists the status
//! and carries the step's action out.
//!
//! A run, per group, one module per phase:
//! 1. [`idle`]: due (schedule in its time zone), healthy (Ready >= desired),
//!    not suspended, lock taken: record the start, each ASG's desired count,
//!    the surplus per ASG and the instances to replace (oldest first);
//! 2. [`scaling_up`]: raise the ASGs by the surplus, wait for Ready >= desired + surplus;
//! 3. [`draining`]: the next planned instance, once removing it keeps enough
//!    Ready (workers: its replacement launched ahead first, see [`ahead`];
//!    with `maxSurge` above 1, the next ones drained alongside, [`batch`]);
//! 4. [`replacing`] (`WaitingForReplacement`): terminated (recorded first,
//!    [`termination`]), wait for Ready to be whole again, validate;
//! 5. [`scaling_down`]: every ASG back to its recorded count, surplus nodes
//!    chosen explicitly, drained, terminated with decrement; the run ends
//!    (the executor gives the lock back).
//!
//! Each phase is a transition: a step to take now, or the next phase to
//! enter ([`Next`]). Phases are only entered forward (see [`rank`]), and
//! `ScalingDown` always yields a step, so a plan never loops.
//!
//! A failure records its reason and goes to `ScalingDown`: the surplus
//! goes, old nodes stay. Invariants (property-tested in `tests`): Ready
//! never drops below the desired count during a worker refresh with
//! surplus, at most `maxSurge` planned nodes (one without) are worked on at
//! a time, no instance is terminated twice, and a run ends with every ASG
//! at its recorded desired count.

mod ahead;
mod batch;
mod draining;
mod drift;
mod idle;
mod pause;
mod preview;
mod replacing;
mod scaling_down;
mod scaling_up;
mod set_aside;
mod targets;
mod termination;
#[cfg(test)]
mod tests;

pub use crate::controllers::book::{Book, SlotState};
use crate::controllers::group_view::{DesiredChange, LockState};
pub use crate::controllers::window::WindowState;
pub use crate::crd::nodegroup::OnWindowClose;
use crate::crd::nodegroup::ResolvedRefresh;
use crate::crd::refresher::{
    RefreshPhase, RefreshTarget, RefresherStatus, RunResult, RunTrigger, TargetPurpose,
};
use chrono::{DateTime, Utc};
use std::collections::BTreeSet;
use std::time::Duration;

pub use crate::controllers::authority::rules::{Reason, reason_of, run_reason};
pub use crate::controllers::group_view::{GroupFacts, GroupNode, Member};
pub use crate::controllers::guard::refresh::{Removal, removal};
pub(crate) use crate::crd::refresher::surplus_of;
pub use idle::{blocking_processes, needs_observation};
pub use preview::preview;
pub use termination::{after_drain, authority};

#[derive(Clone)]
pub struct Input<'a> {
    /// What every child plan is told (`suspended`: the group or the
    /// Refresher; `breaker`: a run pauses, a due run is skipped).
    pub group: GroupFacts<'a>,
    pub dry_run: bool,
    /// The Refresher's settings, or why they are invalid.
    pub settings: &'a Result<ResolvedRefresh, String>,
    /// How long a run may pause while `settings` are invalid: the
    /// Refresher's own `pauseTimeout` when that reads (another group naming
    /// one of its ASGs leaves it valid), else the default.
    pub invalid_pause: std::time::Duration,
    /// Identifies the schedule (see `RefresherSpec::schedule_key`).
    pub schedule_key: &'a str,
    /// `drift.action: Replace`: drifted nodes (`GroupNode::drifted`) are
    /// rolled without waiting for the schedule.
    pub drift_replace: bool,
    pub members: &'a [Member],
    /// Masters: the nodes whose control-plane pods (kube-apiserver,
    /// etcd-manager) are all Ready. Looked at only between replacements.
    pub control_plane_ready: &'a BTreeSet<String>,
    /// The group's maintenance windows now (a run starts, and takes its
    /// next node, only while one is open), the nodes protected from
    /// voluntary disruption (taken last, waited for at most
    /// `do_not_disrupt_timeout`, then skipped) and the manager-wide
    /// disruption slot a run holds while it acts: read only through the
    /// rule book.
    pub rules: Book<'a>,
    pub do_not_disrupt_timeout: Duration,
    /// A run whose window closes with nodes left: wait with the surplus, or
    /// remove it and resume in the next window (`status.pendingRun`).
    pub on_window_close: OnWindowClose,
    /// Waiting for a replacement: the workloads its drain moved whose pods
    /// are not all back yet (Pending or not Ready), with why.
    pub unsettled: &'a std::collections::BTreeMap<String, String>,
    pub status: &'a RefresherStatus,
}

/// The refresher's commands: the one vocabulary (`controllers::command`)
/// over its refresh targets.
pub type Command = crate::controllers::command::Command<RefreshTarget>;
pub use crate::controllers::command::Batch;

/// What happened in this step, for Events and metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum Happening {
    Started {
        total: usize,
        surplus: i32,
        trigger: RunTrigger,
    },
    /// A drift roll follows the drift: nodes that drifted meanwhile joined
    /// it (a newer template version), nodes no longer drifted left it (the
    /// old version made current again).
    DriftChanged {
        joined: Vec<String>,
        left: Vec<String>,
    },
    Skipped(String),
    /// The window closed (`onWindowClose: ScaleDown`), or the authority
    /// stopped a master run (`why`, when it did): the surplus is gone, the
    /// rest of the run waits for the next window, or for the masters.
    SetAside {
        remaining: usize,
        opens: Option<DateTime<Utc>>,
        why: Option<String>,
    },
    /// A run set aside resumes in an open window.
    Resumed {
        remaining: usize,
    },
    /// Protected nodes left alone by the run (node, reason).
    NodesSkipped(Vec<(String, String)>),
    /// Dry run: what the run would do.
    Planned(String),
    Replaced {
        node: String,
        took: Duration,
    },
    Failed(String),
    /// A replacement's validation timed out and the run went on
    /// (`validationTimeoutAction: Proceed`).
    ValidationTimedOut(String),
    /// Someone else lowered an ASG's desired count below the one recorded
    /// at the run's start: the run ends at theirs.
    LayoutLowered {
        asg: String,
        recorded: i32,
        now: i32,
    },
    Finished {
        result: RunResult,
        replaced: i32,
        /// From the run's start to its end.
        took: std::time::Duration,
    },
}

/// One reconcile's worth of work: the action, why, and when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub command: Command,
    pub message: String,
    pub requeue: Duration,
}

impl Decision {
    fn act(command: Command, message: impl Into<String>, requeue: Duration) -> Decision {
        Decision {
            command,
            message: message.into(),
            requeue,
        }
    }

    /// Nothing to do but look again after `requeue`.
    fn wait(message: impl Into<String>, requeue: Duration) -> Decision {
        Decision::act(Command::Nothing, message, requeue)
    }

    /// A target given back: its node uncordoned (none for an instance that
    /// never joined), then look again at once.
    fn back_in_service(target: RefreshTarget, message: impl Into<String>) -> Decision {
        let reason: String = message.into();
        match target.node {
            Some(_) => Decision::act(
                Command::GiveBack {
                    target,
                    reason: reason.clone(),
                },
                reason,
                Duration::ZERO,
            ),
            None => Decision::wait(reason, Duration::ZERO),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub command: Command,
    pub status: RefresherStatus,
    pub message: String,
    pub requeue: Duration,
    pub happenings: Vec<Happening>,
    /// The run waits on the cluster only (a drain, a replacement's Node to
    /// be Ready): the group's ASGs may be described less often meanwhile
    /// ([`crate::cloud::Cloud::quiet`]).
    pub waits_on_cluster: bool,
}

/// What a phase decides: a step now, or the phase to go on in (never stored).
#[allow(clippy::large_enum_variant)]
enum Next {
    Decision(Decision),
    Enter(RefreshPhase),
}

use crate::controllers::group_view::{IDLE, SOON};
/// Another holder has the lock: ask again this often.
const LOCK_RETRY: Duration = Duration::from_secs(5);

pub fn plan(input: &Input) -> Plan {
    let mut planner = Deciding {
        input,
        status: carrying_reasons(input.status.clone()),
        happenings: vec![],
        paused: false,
    };
    let decided = planner.decide();
    let Decision {
        command,
        message,
        requeue,
    } = planner.slot_for_step(decided);
    if !planner.paused {
        // A run that steps (or none at all) is not paused.
        planner.status.paused_since = None;
    }
    let mut status = planner.status;
    status.message = Some(message.clone());
    let waits_on_cluster = waits_on_cluster(&command, &status);
    Plan {
        command,
        status,
        message,
        requeue,
        happenings: planner.happenings,
        waits_on_cluster,
    }
}

/// The status with every target of its batch carrying its reason: one
/// recorded before targets carried reasons is given its own, once, here
/// (the executor refuses a step of a target that carries none).
fn carrying_reasons(mut status: RefresherStatus) -> RefresherStatus {
    let trigger = status.trigger;
    let batch = status
        .current_target
        .iter_mut()
        .chain(&mut status.alongside);
    for t in batch.filter(|t| t.reason.is_none()) {
        t.reason = Some(reason_of(t, trigger).label().into());
    }
    status
}

/// A run draining, or waiting for a replacement whose launch is under way:
/// what it waits for is in the cluster. Anything that changes AWS is made
/// on a description asked at that moment, whatever this says.
fn waits_on_cluster(command: &Command, status: &RefresherStatus) -> bool {
    status.run_start.is_some()
        && matches!(
            status.phase,
            RefreshPhase::Draining | RefreshPhase::WaitingForReplacement
        )
        && matches!(command, Command::Drain(_) | Command::Nothing)
}

/// The order a run goes through its phases; a plan only enters a phase of a
/// higher rank than the one it is in, which bounds the transitions.
fn rank(phase: RefreshPhase) -> u8 {
    match phase {
        RefreshPhase::Idle
        | RefreshPhase::WaitingForLock
        | RefreshPhase::WaitingForSlot
        | RefreshPhase::WaitingForWindow
        | RefreshPhase::Blocked => 0,
        RefreshPhase::ScalingUp => 1,
        RefreshPhase::Draining => 2,
        RefreshPhase::WaitingForReplacement => 3,
        RefreshPhase::ScalingDown => 4,
    }
}

struct Deciding<'a> {
    input: &'a Input<'a>,
    status: RefresherStatus,
    happenings: Vec<Happening>,
    /// This step waits in a pause (`pause`): its start is kept.
    paused: bool,
}

impl Deciding<'_> {
    /// How long a run waits for protected nodes before it skips them:
    /// `doNotDisruptTimeout`, at most its `pauseTimeout` (it keeps its
    /// group's lock meanwhile, and no wait on time holds it longer).
    pub(super) fn protected_wait(&self) -> Duration {
        let pause = match self.input.settings {
            Ok(s) => s.pause_timeout,
            Err(_) => crate::crd::nodegroup::DEFAULT_PAUSE_TIMEOUT,
        };
        self.input.do_not_disrupt_timeout.min(pause)
    }

    /// Why `t` goes: the reason it carries, given when it was chosen (or
    /// at the plan's entry, for a target recorded before targets carried
    /// reasons, the same answer).
    pub(super) fn reason_of(&self, t: &RefreshTarget) -> Reason {
        let carried = crate::controllers::execute::Target::reason(t);
        carried.unwrap_or_else(|| reason_of(t, self.status.trigger))
    }

    /// The windows as the run's reason sees them (the rule book).
    fn run_window(&self) -> WindowState {
        self.input.rules.window(run_reason(self.status.trigger))
    }

    fn decide(&mut self) -> Decision {
        let settings = match self.input.settings {
            Ok(s) => s,
            Err(problem) => {
                // A run whose settings turned invalid (an edit, another
                // group naming one of its ASGs) pauses like any other, and
                // is set aside after its own pause timeout when that still
                // reads, else the default.
                if self.status.run_start.is_some() {
                    return self.pause(
                        format!("run paused: {problem}"),
                        IDLE,
                        self.input.invalid_pause,
                    );
                }
                self.status.phase = RefreshPhase::Blocked;
                self.status.next_run = None;
                self.status.next_run_from = None;
                return Decision::wait(format!("no run: {problem}"), IDLE);
            }
        };
        if self.status.run_start.is_none()
            && let Some(step) = self.idle(settings)
        {
            return step;
        }
        if let Some(paused) = self.paused(settings) {
            return paused;
        }
        self.run(settings)
    }

    /// Runs the phase transitions until one yields a step.
    fn run(&mut self, settings: &ResolvedRefresh) -> Decision {
        if let Some(step) = self.unwind_for_deletion() {
            return step;
        }
        if let Some(step) = self.follow_drift() {
            return step;
        }
        loop {
            let from = self.status.phase;
            match self.transition(settings) {
                Next::Decision(step) => return step,
                Next::Enter(to) if rank(to) > rank(from) => self.enter(to),
                Next::Enter(to) => {
                    // Unreachable by construction; never loop on it.
                    return Decision::wait(format!("in phase {from:?}, not entering {to:?}"), SOON);
                }
            }
        }
    }

    /// The transition function: what the current phase decides.
    fn transition(&mut self, settings: &ResolvedRefresh) -> Next {
        match self.status.phase {
            RefreshPhase::ScalingUp => self.scaling_up(settings),
            RefreshPhase::Draining => self.draining_phase(settings),
            RefreshPhase::WaitingForReplacement => self.waiting_for_replacement(settings),
            RefreshPhase::ScalingDown => Next::Decision(self.scaling_down(settings)),
            // A run without a running phase (hand-edited status): resume from the top.
            RefreshPhase::Idle
            | RefreshPhase::WaitingForLock
            | RefreshPhase::WaitingForSlot
            | RefreshPhase::WaitingForWindow
            | RefreshPhase::Blocked => Next::Enter(RefreshPhase::ScalingUp),
        }
    }

    /// The NodeGroup is being deleted (its finalizer waits for the run to
    /// end): a run short of `ScalingDown` fails into it, so the surplus goes,
    /// old nodes stay and every ASG gets its recorded count back. An old node
    /// being drained, or drained with its termination recorded but not made,
    /// is kept: the record is taken back and the node uncordoned.
    fn unwind_for_deletion(&mut self) -> Option<Decision> {
        if !self.input.group.deleting || rank(self.status.phase) >= rank(RefreshPhase::ScalingDown)
        {
            return None;
        }
        let reason = "the NodeGroup is being deleted".to_string();
        if let Some(target) = self.status.current_target.clone()
            && target.purpose == TargetPurpose::Replace
            && (target.terminated.is_none() || self.active(&target.instance_id))
        {
            self.status
                .replaced_instances
                .retain(|id| *id != target.instance_id);
            let label = target.node.as_deref().unwrap_or(&target.instance_id);
            return Some(self.give_up(&target, format!("{reason}: {label} kept")));
        }
        self.record_failure(reason);
        self.enter(RefreshPhase::ScalingDown);
        None
    }

    fn ready(&self) -> i32 {
        self.input.group.nodes.iter().filter(|n| n.ready).count() as i32
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
        self.input.group.desired + self.surplus_total()
    }

    /// Records a failure; the run then goes to `ScalingDown`.
    fn record_failure(&mut self, reason: String) {
        self.happenings.push(Happening::Failed(reason.clone()));
        self.status.failure = Some(match self.status.failure.take() {
            Some(earlier) => format!("{earlier}; {reason}"),
            None => reason,
        });
    }

    fn fail(&mut self, reason: String) -> Next {
        self.record_failure(reason);
        Next::Enter(RefreshPhase::ScalingDown)
    }

    fn enter(&mut self, phase: RefreshPhase) {
        self.status.phase = phase;
        self.status.phase_since = Some(self.input.group.now);
    }

    fn since_phase(&self) -> DateTime<Utc> {
        self.status
            .phase_since
            .or(self.status.run_start)
            .unwrap_or(self.input.group.now)
    }
}

fn describe_changes(changes: &[DesiredChange]) -> String {
    changes
        .iter()
        .map(|c| format!("{} {}->{}", c.asg, c.from, c.to))
        .collect::<Vec<_>>()
        .join(", ")
}
