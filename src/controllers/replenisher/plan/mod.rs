//! The replenisher's decisions, pure: from what was observed and `now`, one
//! action and the next status. No I/O; the reconcile writes the status (which
//! records what is about to be done) and then carries the action out.
//!
//! One stage per step of docs/concepts/replenisher.md, each returning a plan
//! or passing on: guards (invalid, suspended, a refresh holds the lock),
//! interrupted nodes due for termination, a scale-in in progress, instances
//! that never joined, unhealthy masters (and workers nothing can replace)
//! repaired in place, too few Ready nodes (interrupted and unhealthy ones
//! replaced first), at-risk nodes whose replacement is Ready, unhealthy
//! workers once Ready is back at desired, too many, steady. Before them, the records of earlier actions are checked
//! against what is observed (a raise or termination a restart interrupted).
//!
//! Invariants (property-tested below): no mutating action without holding the
//! group's lock; never more than an ASG's max; never remove a Ready node
//! unless Ready nodes stay at or above the desired count; scale-up only while
//! Ready nodes are below the desired count, never counting twice what is
//! already on its way.

mod cleanup;
mod coming;
mod deleting;
mod fallback;
mod interrupted;
mod queries;
mod records;
mod repair;
mod scale_in;
mod scale_up;
#[cfg(test)]
mod tests;

use cleanup::remove_not_joined;
use deleting::unwinding;
use interrupted::{at_risk_kept, remove_at_risk, retire};
use records::{judge, settle_records, update_exclusions};
use repair::{repair_held, repair_in_place, repair_replaced};

pub use coming::{ComingRepair, repairs_to_come};
pub use repair::RepairHeld;

use scale_in::{scale_in, scale_in_in_progress};
use scale_up::{restore_layout, scale_up};

pub use records::{
    abandon_scale_in, finish_cleanup, finish_retiring, finish_scale_in, raise_landed,
    raise_not_made, record_termination,
};

use crate::controllers::group_view::{
    AsgView, Fate, GroupFacts, LockState, REPAIR_DRAIN_TIMEOUT, after, until,
};
use crate::crd::replenisher::{ReplenishPhase, ReplenisherStatus, ScaleInTarget};
use chrono::{DateTime, Utc};
use std::collections::BTreeSet;
use std::time::Duration;

/// A drain for scale-in that takes longer than this is abandoned (the node is
/// uncordoned and kept) and retried after the cooldown.
pub const SCALE_IN_DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
/// Backoff for an ASG that is not launching, or whose instances keep not
/// joining: 1m, 2m, 4m ... at most 30m.
pub fn exclusion_backoff(failures: i32) -> Duration {
    let exp = failures.clamp(1, 6) - 1;
    Duration::from_secs((60u64 << exp).min(1800))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotJoinedView {
    pub instance_id: String,
    pub asg: String,
    pub launch_time: Option<DateTime<Utc>>,
}

impl From<&crate::crd::nodegroup::NotJoinedInstance> for NotJoinedView {
    fn from(n: &crate::crd::nodegroup::NotJoinedInstance) -> Self {
        NotJoinedView {
            instance_id: n.instance_id.clone(),
            asg: n.auto_scaling_group.clone(),
            launch_time: n.launch_time,
        }
    }
}

pub struct Input<'a> {
    /// What every child plan is told (`deleting`: finish or give back what
    /// is under way, start nothing).
    pub group: GroupFacts<'a>,
    /// The group's spec is valid (the inventory's SpecValid condition).
    pub spec_valid: bool,
    pub cooldown: Duration,
    pub join_timeout: Duration,
    pub not_joined: &'a [NotJoinedView],
    /// Instances that count as capacity in the group's ASGs (fresh describe).
    pub active: &'a BTreeSet<String>,
    /// The group's maintenance windows now (the scale-in back to the
    /// original layout and the removal of a node at risk wait for one;
    /// repairs and interruptions do not), the nodes protected from
    /// voluntary disruption (the scale-in never picks one, a node at risk
    /// that is one is kept; looked at only when either could happen) and
    /// the manager-wide disruption slot a voluntary removal holds with the
    /// lock: read only through the rule book.
    pub rules: Book<'a>,
    pub status: &'a ReplenisherStatus,
    /// `spec.fallback`, resolved; None: no on-demand fallback.
    pub fallback: Option<crate::crd::nodegroup::ResolvedFallback>,
    /// The group's Refresher's `surplusLeft`: taken over as a raise of
    /// ours (see `records::take_over_surplus`).
    pub surplus_left: Option<&'a crate::crd::refresher::SurplusLeft>,
}

/// The replenisher's commands: the one vocabulary (`controllers::command`)
/// over its scale-in targets.
pub type Command = crate::controllers::command::Command<ScaleInTarget>;
pub use crate::controllers::command::Batch;

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub command: Command,
    /// The status to write before the command: it records what the action is
    /// about to do, so a restart neither repeats nor forgets it.
    pub status: ReplenisherStatus,
    /// What it is doing or waiting for, for status and logs.
    pub message: String,
    pub requeue: Duration,
    /// Why unhealthy nodes wait unrepaired (the RepairAllowed condition's
    /// reason and message), if any do.
    pub repair_held: Option<RepairHeld>,
}

pub use crate::controllers::book::{Book, SlotState};
use crate::controllers::group_view::{IDLE, SOON};

pub fn plan(input: &Input) -> Plan {
    let mut plan = plan_inner(input);
    // Wake up for the next deadline the plan knows about, not a minute later.
    if let Some(deadline) = next_deadline(input, &plan.status) {
        plan.requeue = plan.requeue.min(until(input.group.now, deadline));
    }
    plan
}

/// The earliest future moment at which the plan may decide differently on
/// the same observations: a join timeout, an exclusion's retry, a removal's
/// backoff, the end of a launch grace, a drain timeout, a node turning
/// unhealthy, a notice coming into force or leaving it.
fn next_deadline(input: &Input, status: &ReplenisherStatus) -> Option<DateTime<Utc>> {
    let joins = input
        .not_joined
        .iter()
        .filter_map(|n| n.launch_time.map(|t| after(t, input.join_timeout)));
    let retries = status.excluded.iter().filter_map(|e| e.retry_after);
    let removals = status.removals.iter().map(|r| r.retry_after);
    let graces = status
        .behind
        .iter()
        .map(|b| after(b.since, crate::cloud::LAUNCH_GRACE));
    let drain = status.scale_in.iter().map(|t| {
        let timeout = match t.repair {
            true => REPAIR_DRAIN_TIMEOUT,
            false => SCALE_IN_DRAIN_TIMEOUT,
        };
        after(t.since, timeout)
    });
    // A NotReady node turns unhealthy (no longer on its way; repaired).
    let unhealthy = input
        .group
        .nodes
        .iter()
        .filter_map(|n| input.group.unhealthy_at(n));
    // An interrupted node we replaced is terminated at its deadline once its
    // drain's end is recorded, or a grace later.
    let retirements = input.group.nodes.iter().filter_map(|n| match n.fate {
        Some(Fate::Reclaimed { deadline, drained }) => {
            let id = n.instance_id.as_deref()?;
            let at = if drained {
                deadline
            } else {
                after(deadline, interrupted::RETIRE_GRACE)
            };
            status
                .replacing
                .iter()
                .any(|r| r.instance_id == id)
                .then_some(at)
        }
        _ => None,
    });
    // A notice comes into force, or a rebalance recommendation's hold ends
    // (the node counts as Ready again).
    let fates = input.group.nodes.iter().filter_map(|n| n.fate_changes);
    // A master's control plane not serving by then is reported by name.
    let masters_join = input
        .group
        .nodes
        .iter()
        .filter(|n| input.group.role == crate::crd::Role::Master && n.ready)
        .filter_map(|n| Some(after(n.launch_time?, input.join_timeout)));
    joins
        .chain(masters_join)
        .chain(retries)
        .chain(retirements)
        .chain(fates)
        .chain(removals)
        .chain(graces)
        .chain(drain)
        .chain(unhealthy)
        .filter(|t| *t > input.group.now)
        .min()
}

/// What every stage decides from: the input, the ASGs judged with what this
/// replenisher remembers, and the status with earlier records settled.
struct Deciding<'a> {
    input: &'a Input<'a>,
    asgs: Vec<AsgView>,
    status: ReplenisherStatus,
    ready: i32,
}

impl Deciding<'_> {
    fn finish(
        &self,
        mut status: ReplenisherStatus,
        phase: ReplenishPhase,
        command: Command,
        message: String,
        requeue: Duration,
    ) -> Plan {
        status.phase = phase;
        Plan {
            command,
            status,
            message,
            requeue,
            repair_held: None,
        }
    }

    /// Not acting: the executor gives the lock (and a slot) back, as the
    /// status records nothing it covers; say why.
    fn idle(&self, status: ReplenisherStatus, phase: ReplenishPhase, message: String) -> Plan {
        self.finish(status, phase, Command::Nothing, message, IDLE)
    }

    /// A mutation. The executor makes it with the group's lock (taking it
    /// first: the record of what we are about to do is written only with
    /// the lock); with the lock held by the group's other controller,
    /// nothing is decided.
    fn act(
        &self,
        status: ReplenisherStatus,
        phase: ReplenishPhase,
        command: Command,
        message: String,
    ) -> Plan {
        match &self.input.group.lock {
            LockState::Other(holder) => self.finish(
                self.status.clone(),
                ReplenishPhase::Paused,
                Command::Nothing,
                format!("{holder} holds the group's lock"),
                IDLE,
            ),
            LockState::Ours | LockState::Free => self.finish(status, phase, command, message, SOON),
        }
    }

    /// What was raised is on its way: still scaling up, so the lock stays
    /// (the group's refresher does not start a run over a raise in flight).
    fn coming(&self, message: String, requeue: Duration) -> Plan {
        self.finish(
            self.status.clone(),
            ReplenishPhase::ScalingUp,
            Command::Nothing,
            message,
            requeue,
        )
    }

    /// Waiting on time (a window, a cooldown, protected nodes, a return to
    /// spot): nothing happens here until then, so the executor gives the
    /// group's lock and a disruption slot back, for another path that may
    /// need them meanwhile (a dead master elsewhere, a refresh); they are
    /// taken again when this acts. Only between steps: nothing is in hand.
    fn wait_on_time(&self, message: String, requeue: Duration) -> Plan {
        self.finish(
            self.status.clone(),
            ReplenishPhase::Waiting,
            Command::Nothing,
            message,
            requeue,
        )
    }

    fn asg(&self, name: &str) -> Option<&AsgView> {
        self.asgs.iter().find(|a| a.name == name)
    }

    fn excluded(&self, name: &str) -> bool {
        self.status
            .excluded
            .iter()
            .any(|e| e.auto_scaling_group == name)
    }

    fn cooldown_left(&self) -> Option<Duration> {
        let end = after(self.status.last_modification?, self.input.cooldown);
        (self.input.group.now < end).then(|| until(self.input.group.now, end))
    }

    fn overdue(&self, n: &NotJoinedView) -> bool {
        n.launch_time
            .is_some_and(|t| self.input.group.now >= after(t, self.input.join_timeout))
    }
}

fn plan_inner(input: &Input) -> Plan {
    let mut status = input.status.clone();
    records::take_over_surplus(input, &mut status);
    settle_records(input, &mut status);
    let asgs = judge(input, &mut status);
    update_exclusions(&mut status, &asgs, input.group.now);
    let mut stage = Deciding {
        input,
        ready: input.group.nodes.iter().filter(|n| n.ready).count() as i32,
        asgs,
        status,
    };
    (stage.status.short_since, stage.status.spot_launching) = fallback::clocks(&stage);
    let mut plan = guards(&stage)
        .or_else(|| breaker(&stage))
        .or_else(|| unwinding(&stage))
        .or_else(|| retire(&stage))
        .or_else(|| scale_in_in_progress(&stage))
        .or_else(|| remove_not_joined(&stage))
        .or_else(|| repair_in_place(&stage))
        .or_else(|| scale_up(&stage))
        .or_else(|| remove_at_risk(&stage))
        .or_else(|| repair_replaced(&stage))
        .or_else(|| fallback::return_to_spot(&stage))
        .or_else(|| scale_in(&stage))
        .or_else(|| restore_layout(&stage))
        .or_else(|| at_risk_kept(&stage))
        .unwrap_or_else(|| {
            stage.idle(
                stage.status.clone(),
                ReplenishPhase::Steady,
                format!("{}/{} Ready", stage.ready, input.group.desired),
            )
        });
    plan.repair_held = repair_held(&stage);
    plan.status.next = coming::next(&stage, &plan);
    // A master waiting for another group's master is not woken when that
    // one comes back (another group's status, or a control-plane Node no
    // group lists): it looks again soon; with the quorum at risk, only the
    // user brings them back, and it looks again less often.
    let recheck = match plan.repair_held.as_ref().map(|h| h.reason) {
        Some("OtherMastersNotReady") => Some(AUTHORITY_RECHECK),
        // Ended by a setting, maybe on another Master group (whose change
        // does not wake this one).
        Some("ControlPlaneQuorumAtRisk" | "ControlPlaneOutage") => Some(QUORUM_RECHECK),
        _ => None,
    };
    if let Some(recheck) = recheck {
        plan.requeue = plan.requeue.min(recheck);
    }
    plan
}

/// How soon a master repair the authority holds back is looked at again.
const AUTHORITY_RECHECK: Duration = Duration::from_secs(10);
/// The same, while the quorum is at risk (left to the user).
const QUORUM_RECHECK: Duration = Duration::from_secs(30);

/// The circuit breaker is open: nothing is terminated (records of
/// terminations under way are kept for later), but an interrupted node AWS
/// is taking anyway is still retired and replacements are still launched.
fn breaker(s: &Deciding) -> Option<Plan> {
    // A Master group's breaker counts its own masters (a dead one is 100%
    // of a group of one): the authority counts the cluster's instead.
    if s.input.group.role == crate::crd::Role::Master {
        return None;
    }
    let why = s.input.group.breaker.as_ref()?;
    let message = format!("circuit breaker open: {why}");
    retire(s)
        .or_else(|| scale_up(s))
        .or_else(|| Some(s.idle(s.status.clone(), ReplenishPhase::Blocked, message)))
}

/// Nothing while the spec is invalid, the group suspended, a kops rolling
/// update replaces its nodes, or a refresh holds the lock.
fn guards(s: &Deciding) -> Option<Plan> {
    if !s.input.spec_valid {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            "the NodeGroup spec is invalid".into(),
        ));
    }
    if s.input.group.suspended {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Paused,
            "the NodeGroup is suspended".into(),
        ));
    }
    if let Some(why) = &s.input.group.external_update {
        return Some(s.idle(s.status.clone(), ReplenishPhase::Paused, why.clone()));
    }
    if let LockState::Other(holder) = &s.input.group.lock {
        return Some(s.finish(
            s.status.clone(),
            ReplenishPhase::Paused,
            Command::Nothing,
            format!("{holder} holds the group's lock"),
            IDLE,
        ));
    }
    None
}
