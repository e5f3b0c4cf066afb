//! The replenisher's decisions, pure: from what was observed and `now`, one
//! action and the next status. No I/O; the reconcile writes the status (which
//! records what is about to be done) and then carries the action out.
//!
//! One stage per step of the README's behaviour list, each returning a plan
//! or passing on: guards (invalid, suspended, a refresh holds the lock), a
//! scale-in in progress, instances that never joined, too few Ready nodes,
//! too many, steady. Before them, the records of earlier actions are checked
//! against what is observed (a raise or termination a restart interrupted).
//!
//! Invariants (property-tested below): no mutating action without holding the
//! group's lock; never more than an ASG's max; never remove a Ready node
//! unless Ready nodes stay at or above the desired count; scale-up only while
//! Ready nodes are below the desired count, never counting twice what is
//! already on its way.

use crate::controllers::vocabulary::{
    AsgView, DesiredChange, LockState, NodeView, to_chrono, until,
};
use crate::crd::Role;
use crate::crd::replenisher::{
    AsgCount, AsgSince, CleanupTarget, ExcludedAsg, LastAction, NotJoinedRemovals, Raise,
    ReplenishPhase, ReplenisherStatus, ScaleInTarget,
};
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

pub struct Input<'a> {
    pub role: Role,
    pub desired: i32,
    pub suspend: bool,
    /// The group's spec is valid (the inventory's SpecValid condition).
    pub spec_valid: bool,
    pub cooldown: Duration,
    pub join_timeout: Duration,
    pub asgs: &'a [AsgView],
    pub nodes: &'a [NodeView],
    pub not_joined: &'a [NotJoinedView],
    /// Instances that count as capacity in the group's ASGs (fresh describe).
    pub active: &'a BTreeSet<String>,
    pub lock: LockState,
    pub status: &'a ReplenisherStatus,
    pub now: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing,
    TakeLock,
    ReleaseLock,
    /// Raise desired capacity on launching ASGs (recorded in `raising` first).
    ScaleUp(Vec<DesiredChange>),
    /// Terminate an instance that never joined through its ASG (recorded in
    /// `cleanup` first), decrementing only while desired is above min.
    RemoveNotJoined(CleanupTarget),
    /// One drain step on the target (persisted first); once drained, the
    /// termination is recorded ([`record_termination`]) and then made.
    Drain(ScaleInTarget),
    /// Make the recorded termination of a drained target, with decrement.
    Terminate(ScaleInTarget),
    /// Give up removing the target: uncordon it, keep it.
    AbandonScaleIn {
        target: ScaleInTarget,
        reason: String,
    },
}

impl Action {
    /// Whether carrying it out changes AWS or a Node (and so needs the lock).
    pub fn mutates(&self) -> bool {
        matches!(
            self,
            Action::ScaleUp(_)
                | Action::RemoveNotJoined(_)
                | Action::Drain(_)
                | Action::Terminate(_)
                | Action::AbandonScaleIn { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub action: Action,
    /// The status to write before the action: it records what the action is
    /// about to do, so a restart neither repeats nor forgets it.
    pub status: ReplenisherStatus,
    /// What it is doing or waiting for, for status and logs.
    pub message: String,
    pub requeue: Duration,
}

const SOON: Duration = Duration::from_secs(2);
const IDLE: Duration = Duration::from_secs(60);

pub fn plan(input: &Input) -> Plan {
    let mut plan = plan_inner(input);
    // Wake up for the next deadline the plan knows about, not a minute later.
    if let Some(deadline) = next_deadline(input, &plan.status) {
        plan.requeue = plan.requeue.min(until(input.now, deadline));
    }
    plan
}

/// The earliest future moment at which the plan may decide differently on
/// the same observations: a join timeout, an exclusion's retry, a removal's
/// backoff, the end of a launch grace, a drain timeout.
fn next_deadline(input: &Input, status: &ReplenisherStatus) -> Option<DateTime<Utc>> {
    let joins = input
        .not_joined
        .iter()
        .filter_map(|n| n.launch_time.map(|t| t + to_chrono(input.join_timeout)));
    let retries = status.excluded.iter().filter_map(|e| e.retry_after);
    let removals = status.removals.iter().map(|r| r.retry_after);
    let graces = status
        .behind
        .iter()
        .map(|b| b.since + to_chrono(crate::cloud::LAUNCH_GRACE));
    let drain = status
        .scale_in
        .iter()
        .map(|t| t.since + to_chrono(SCALE_IN_DRAIN_TIMEOUT));
    joins
        .chain(retries)
        .chain(removals)
        .chain(graces)
        .chain(drain)
        .filter(|t| *t > input.now)
        .min()
}

/// What every stage decides from: the input, the ASGs judged with what this
/// replenisher remembers, and the status with earlier records settled.
struct Stage<'a> {
    input: &'a Input<'a>,
    asgs: Vec<AsgView>,
    status: ReplenisherStatus,
    ready: i32,
}

impl Stage<'_> {
    fn finish(
        &self,
        mut status: ReplenisherStatus,
        phase: ReplenishPhase,
        action: Action,
        message: String,
        requeue: Duration,
    ) -> Plan {
        status.phase = phase;
        Plan {
            action,
            status,
            message,
            requeue,
        }
    }

    /// Not acting: give the lock back if we hold it, say why.
    fn idle(&self, status: ReplenisherStatus, phase: ReplenishPhase, message: String) -> Plan {
        if self.input.lock == LockState::Ours {
            self.finish(status, phase, Action::ReleaseLock, message, SOON)
        } else {
            self.finish(status, phase, Action::Nothing, message, IDLE)
        }
    }

    /// A mutation needs the lock first.
    fn act(
        &self,
        status: ReplenisherStatus,
        phase: ReplenishPhase,
        action: Action,
        message: String,
    ) -> Plan {
        match &self.input.lock {
            LockState::Ours => self.finish(status, phase, action, message, SOON),
            // The record of what we are about to do is written only with the
            // lock: until then, nothing was decided.
            LockState::Free => self.finish(
                self.status.clone(),
                phase,
                Action::TakeLock,
                format!("taking the lock to: {message}"),
                Duration::ZERO,
            ),
            LockState::Other(holder) => self.finish(
                self.status.clone(),
                ReplenishPhase::Paused,
                Action::Nothing,
                format!("{holder} holds the group's lock"),
                IDLE,
            ),
        }
    }

    fn wait(&self, message: String, requeue: Duration) -> Plan {
        self.finish(
            self.status.clone(),
            ReplenishPhase::Waiting,
            Action::Nothing,
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
        let end = self.status.last_modification? + to_chrono(self.input.cooldown);
        (self.input.now < end).then(|| until(self.input.now, end))
    }

    fn overdue(&self, n: &NotJoinedView) -> bool {
        n.launch_time
            .is_some_and(|t| self.input.now >= t + to_chrono(self.input.join_timeout))
    }
}

fn plan_inner(input: &Input) -> Plan {
    let mut status = input.status.clone();
    settle_records(input, &mut status);
    let asgs = judge(input, &mut status);
    update_exclusions(&mut status, &asgs, input.now);
    let stage = Stage {
        input,
        ready: input.nodes.iter().filter(|n| n.ready).count() as i32,
        asgs,
        status,
    };
    guards(&stage)
        .or_else(|| scale_in_in_progress(&stage))
        .or_else(|| remove_not_joined(&stage))
        .or_else(|| scale_up(&stage))
        .or_else(|| scale_in(&stage))
        .unwrap_or_else(|| {
            stage.idle(
                stage.status.clone(),
                ReplenishPhase::Steady,
                format!("{}/{} Ready", stage.ready, input.desired),
            )
        })
}

/// Earlier actions' records against what is observed now: a raise that a
/// restart interrupted (landed or not), a cleanup or scale-in termination that
/// is done, a run of never-joined removals that ended with a node joining.
fn settle_records(input: &Input, status: &mut ReplenisherStatus) {
    for raise in std::mem::take(&mut status.raising) {
        let landed = input
            .asgs
            .iter()
            .find(|a| a.name == raise.auto_scaling_group)
            .is_some_and(|a| a.desired >= raise.to);
        if !landed {
            add_raised(status, &raise.auto_scaling_group, raise.from - raise.to);
        }
    }
    if let Some(cleanup) = &status.cleanup
        && !input.active.contains(&cleanup.instance_id)
    {
        status.last_action = Some(LastAction {
            description: format!(
                "removed {} from {}: {}",
                cleanup.instance_id, cleanup.auto_scaling_group, cleanup.reason
            ),
            time: cleanup.since,
        });
        status.cleanup = None;
    }
    if let Some(target) = status.scale_in.clone()
        && target.terminating.is_some()
        && !input.active.contains(&target.instance_id)
    {
        finish_scale_in(status, &target);
    }
    // A removal run ends once a node of that ASG launched after it is Ready.
    status.removals.retain(|r| {
        !input.nodes.iter().any(|n| {
            n.ready
                && n.asg.as_deref() == Some(r.auto_scaling_group.as_str())
                && n.launch_time.is_some_and(|t| t > r.last)
        })
    });
}

/// The ASGs judged with the earliest moment anyone saw them behind (this
/// replenisher's memory or the inventory's), remembered for next time.
fn judge(input: &Input, status: &mut ReplenisherStatus) -> Vec<AsgView> {
    let mut behind = vec![];
    let asgs = input
        .asgs
        .iter()
        .map(|a| {
            let ours = status
                .behind
                .iter()
                .find(|b| b.auto_scaling_group == a.name)
                .map(|b| b.since);
            let remembered = match (ours, a.behind_since) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            let judged = a.clone().judge(remembered, input.now);
            if let Some(since) = judged.behind_since {
                behind.push(AsgSince {
                    auto_scaling_group: a.name.clone(),
                    since,
                });
            }
            judged
        })
        .collect();
    status.behind = behind;
    asgs
}

/// Nothing while the spec is invalid, the group suspended, or a refresh
/// holds the lock.
fn guards(s: &Stage) -> Option<Plan> {
    if !s.input.spec_valid {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            "the NodeGroup spec is invalid".into(),
        ));
    }
    if s.input.suspend {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Paused,
            "the NodeGroup is suspended".into(),
        ));
    }
    if let LockState::Other(holder) = &s.input.lock {
        return Some(s.finish(
            s.status.clone(),
            ReplenishPhase::Paused,
            Action::Nothing,
            format!("{holder} holds the group's lock"),
            IDLE,
        ));
    }
    None
}

/// A scale-in in progress goes on (drain, then the recorded termination), or
/// is abandoned.
fn scale_in_in_progress(s: &Stage) -> Option<Plan> {
    let target = s.status.scale_in.clone()?;
    let input = s.input;
    let mut status = s.status.clone();
    if !input.active.contains(&target.instance_id) {
        // Gone without us (e.g. a spot loss): nothing left to remove.
        status.scale_in = None;
        return Some(s.finish(
            status,
            ReplenishPhase::Waiting,
            Action::Nothing,
            format!("{} left its ASG by itself", target.node),
            Duration::ZERO,
        ));
    }
    let target_ready = input
        .nodes
        .iter()
        .any(|n| n.instance_id.as_deref() == Some(&target.instance_id) && n.ready);
    let after = s.ready - i32::from(target_ready);
    let abandon = if after < input.desired {
        Some(format!(
            "removing {} would leave {after} Ready node(s), below {}",
            target.node, input.desired
        ))
    } else if target.terminating.is_none()
        && input.now >= target.since + to_chrono(SCALE_IN_DRAIN_TIMEOUT)
    {
        Some(format!("drain of {} timed out", target.node))
    } else {
        None
    };
    if let Some(reason) = abandon {
        let action = Action::AbandonScaleIn {
            target,
            reason: reason.clone(),
        };
        return Some(s.act(status, ReplenishPhase::ScalingDown, action, reason));
    }
    if target.terminating.is_some() {
        let message = format!(
            "terminating {} in {} (recorded before a restart)",
            target.node, target.auto_scaling_group
        );
        return Some(s.act(
            status,
            ReplenishPhase::ScalingDown,
            Action::Terminate(target),
            message,
        ));
    }
    let message = format!(
        "draining {} to remove it from {}",
        target.node, target.auto_scaling_group
    );
    Some(s.act(
        status,
        ReplenishPhase::ScalingDown,
        Action::Drain(target),
        message,
    ))
}

/// Instances not joined after the join timeout (masters: any instance beyond
/// the count, at once) are terminated in their ASG, one at a time. Backs off
/// per ASG while its replacements keep not joining; never waits on the
/// cooldown, and a removal not yet due passes on to the other stages.
fn remove_not_joined(s: &Stage) -> Option<Plan> {
    let input = s.input;
    let now = input.now;
    // A recorded cleanup whose instance is still there: that one, once due.
    let total_instances: i32 = s.asgs.iter().map(|a| a.instances).sum();
    let extra_master = input.role == Role::Master && total_instances > input.desired;
    let candidate = input
        .not_joined
        .iter()
        .filter(|n| input.active.contains(&n.instance_id))
        .filter(|n| {
            s.status
                .removals
                .iter()
                .find(|r| r.auto_scaling_group == n.asg)
                .is_none_or(|r| now >= r.retry_after)
        })
        .find_map(|n| {
            if let Some(c) = s
                .status
                .cleanup
                .as_ref()
                .filter(|c| c.instance_id == n.instance_id)
            {
                return Some((n, c.reason.clone()));
            }
            if s.overdue(n) {
                Some((
                    n,
                    format!(
                        "not joined within {}",
                        crate::duration::format(input.join_timeout)
                    ),
                ))
            } else if extra_master {
                Some((
                    n,
                    format!("extra master beyond the configured {}", input.desired),
                ))
            } else {
                None
            }
        })?;
    let (instance, reason) = candidate;
    let asg = s.asg(&instance.asg)?;
    let decrement = asg.desired > asg.min;
    let mut status = s.status.clone();
    let retrying = status
        .cleanup
        .as_ref()
        .is_some_and(|c| c.instance_id == instance.instance_id);
    let target = CleanupTarget {
        instance_id: instance.instance_id.clone(),
        auto_scaling_group: instance.asg.clone(),
        reason: reason.clone(),
        decrement,
        since: now,
    };
    // Each attempt waits for the ASG's backoff, a failed call too: a refused
    // or failing removal never holds up the other stages. The count is of
    // instances that never joined: retrying the recorded one (a failed call,
    // a restart) is not another.
    let count = status
        .removals
        .iter()
        .find(|r| r.auto_scaling_group == instance.asg)
        .map_or(0, |r| r.count)
        + i32::from(!retrying);
    let count = count.max(1);
    status
        .removals
        .retain(|r| r.auto_scaling_group != instance.asg);
    status.removals.push(NotJoinedRemovals {
        auto_scaling_group: instance.asg.clone(),
        count,
        last: now,
        retry_after: now + to_chrono(exclusion_backoff(count)),
    });
    status.cleanup = Some(target.clone());
    let how = if decrement {
        "decrementing desired"
    } else {
        "at min: the ASG launches a fresh one"
    };
    let message = format!(
        "{} {} from {} ({how}): {reason}",
        if retrying {
            "retrying removal of"
        } else {
            "removing"
        },
        instance.instance_id,
        instance.asg
    );
    Some(s.act(
        status,
        ReplenishPhase::CleaningUp,
        Action::RemoveNotJoined(target),
        message,
    ))
}

/// Ready nodes of one ASG.
fn ready_in(nodes: &[NodeView], asg: &str) -> i32 {
    nodes
        .iter()
        .filter(|n| n.ready && n.asg.as_deref() == Some(asg))
        .count() as i32
}

/// What a launching ASG will still bring: its desired count less its Ready
/// nodes and less what is stuck (NotReady nodes past the join timeout,
/// never-joined instances past it). A launch due, in flight or Pending, a
/// node joining, and a lost instance the ASG will replace all count.
fn on_the_way(s: &Stage, asg: &AsgView) -> i32 {
    let input = s.input;
    let stuck_nodes = input
        .nodes
        .iter()
        .filter(|n| {
            !n.ready
                && n.asg.as_deref() == Some(asg.name.as_str())
                && n.launch_time
                    .is_some_and(|t| input.now >= t + to_chrono(input.join_timeout))
        })
        .count() as i32;
    let stuck_instances = input
        .not_joined
        .iter()
        .filter(|n| n.asg == asg.name && s.overdue(n))
        .count() as i32;
    (asg.desired - ready_in(input.nodes, &asg.name) - stuck_nodes - stuck_instances).max(0)
}

/// Too few Ready nodes: raise desired on ASGs that are launching and below
/// max, spread over them; what is already on its way is not ordered twice.
fn scale_up(s: &Stage) -> Option<Plan> {
    let input = s.input;
    if s.ready >= input.desired {
        return None;
    }
    let usable = |a: &&AsgView| a.launching && !s.excluded(&a.name);
    let coming: i32 = s.asgs.iter().filter(usable).map(|a| on_the_way(s, a)).sum();
    let deficit = input.desired - s.ready - coming;
    if deficit <= 0 {
        return Some(s.wait(format!("{coming} node(s) on their way"), SOON));
    }
    if input.role == Role::Master {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            format!(
                "{}/{} masters Ready; masters are never launched outside their own ASG",
                s.ready, input.desired
            ),
        ));
    }
    // An ASG whose instances are not joining (a removal run in progress) is
    // no place for another one.
    let not_joining = |a: &&AsgView| {
        s.status
            .removals
            .iter()
            .any(|r| r.auto_scaling_group == a.name)
    };
    let mut candidates: Vec<AsgView> = s
        .asgs
        .iter()
        .filter(usable)
        .filter(|a| a.desired < a.max && !not_joining(a))
        .cloned()
        .collect();
    if candidates.is_empty() {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            format!(
                "{}/{} Ready and no ASG can launch (not launching, backing off, or at max)",
                s.ready, input.desired
            ),
        ));
    }
    if let Some(left) = s.cooldown_left() {
        return Some(s.wait(format!("cooldown before scaling up by {deficit}"), left));
    }
    let mut added = 0;
    while added < deficit {
        // Spread: the candidate with the lowest desired count (then name) gets the next one.
        let Some(next) = candidates
            .iter_mut()
            .filter(|a| a.desired < a.max)
            .min_by(|a, b| (a.desired, &a.name).cmp(&(b.desired, &b.name)))
        else {
            break;
        };
        next.desired += 1;
        added += 1;
    }
    let changes: Vec<DesiredChange> = candidates
        .iter()
        .filter_map(|c| {
            let from = s.asg(&c.name)?.desired;
            (c.desired != from).then(|| DesiredChange {
                asg: c.name.clone(),
                from,
                to: c.desired,
            })
        })
        .collect();
    let message = format!(
        "{}/{} Ready: adding {added} on {}",
        s.ready,
        input.desired,
        changes
            .iter()
            .map(|c| format!("{} {}->{}", c.asg, c.from, c.to))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut status = s.status.clone();
    record_raise(&mut status, &changes, input.now, message.clone());
    Some(s.act(
        status,
        ReplenishPhase::ScalingUp,
        Action::ScaleUp(changes),
        message,
    ))
}

/// Too many Ready nodes (a shortage ended): take one back, explicitly chosen.
fn scale_in(s: &Stage) -> Option<Plan> {
    let input = s.input;
    if s.ready <= input.desired {
        return None;
    }
    if let Some(left) = s.cooldown_left() {
        return Some(s.wait(
            format!(
                "cooldown before removing {} surplus node(s)",
                s.ready - input.desired
            ),
            left,
        ));
    }
    let Some(target) = choose_victim(s) else {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            "surplus nodes but no ASG can shrink (at min)".into(),
        ));
    };
    let message = format!(
        "{}/{} Ready: removing {} from {}",
        s.ready, input.desired, target.node, target.auto_scaling_group
    );
    let mut status = s.status.clone();
    status.scale_in = Some(target.clone());
    Some(s.act(
        status,
        ReplenishPhase::ScalingDown,
        Action::Drain(target),
        message,
    ))
}

/// The surplus node to remove: from an ASG we raised (so the original layout
/// comes back), else from the ASG with the most Ready nodes; the newest node.
/// Never from an ASG with launches in flight: it is still settling.
fn choose_victim(s: &Stage) -> Option<ScaleInTarget> {
    let input = s.input;
    let raised = |asg: &str| {
        s.status
            .raised
            .iter()
            .find(|r| r.auto_scaling_group == asg)
            .map_or(0, |r| r.count)
    };
    let ready_in = |asg: &str| ready_in(input.nodes, asg);
    let asg = s
        .asgs
        .iter()
        .filter(|a| a.desired > a.min && ready_in(&a.name) > 0)
        .filter(|a| !a.is_behind() && a.pending == 0)
        .max_by(|a, b| {
            (
                raised(&a.name),
                ready_in(&a.name),
                std::cmp::Reverse(&a.name),
            )
                .cmp(&(
                    raised(&b.name),
                    ready_in(&b.name),
                    std::cmp::Reverse(&b.name),
                ))
        })?;
    let node = input
        .nodes
        .iter()
        .filter(|n| {
            n.ready && n.asg.as_deref() == Some(asg.name.as_str()) && n.instance_id.is_some()
        })
        .max_by(|a, b| (a.launch_time, &a.name).cmp(&(b.launch_time, &b.name)))?;
    Some(ScaleInTarget {
        node: node.name.clone(),
        instance_id: node.instance_id.clone()?,
        auto_scaling_group: asg.name.clone(),
        since: input.now,
        terminating: None,
    })
}

/// ASGs that are not launching are left out of scale-up and re-checked after
/// a backoff that grows while they keep failing.
fn update_exclusions(status: &mut ReplenisherStatus, asgs: &[AsgView], now: DateTime<Utc>) {
    for asg in asgs {
        let existing = status
            .excluded
            .iter()
            .position(|e| e.auto_scaling_group == asg.name);
        match (asg.launching, existing) {
            (false, None) => status.excluded.push(ExcludedAsg {
                auto_scaling_group: asg.name.clone(),
                reason: asg.reason.clone().unwrap_or_else(|| "not launching".into()),
                since: now,
                retry_after: Some(now + to_chrono(exclusion_backoff(1))),
                failures: 1,
            }),
            (false, Some(i)) => {
                let e = &mut status.excluded[i];
                if e.retry_after.is_none_or(|t| now >= t) {
                    e.failures += 1;
                    e.retry_after = Some(now + to_chrono(exclusion_backoff(e.failures)));
                    e.reason = asg.reason.clone().unwrap_or_else(|| "not launching".into());
                }
            }
            (true, Some(i)) => {
                if status.excluded[i].retry_after.is_none_or(|t| now >= t) {
                    status.excluded.remove(i);
                }
            }
            (true, None) => {}
        }
    }
    // ASGs no longer in the group are forgotten.
    status
        .excluded
        .retain(|e| asgs.iter().any(|a| a.name == e.auto_scaling_group));
}

/// Records a raise before it is made: the raise itself (checked after a
/// restart), the count to take back later, the cooldown's start.
fn record_raise(
    status: &mut ReplenisherStatus,
    changes: &[DesiredChange],
    now: DateTime<Utc>,
    description: String,
) {
    for c in changes {
        add_raised(status, &c.asg, c.to - c.from);
    }
    status.raising = changes
        .iter()
        .map(|c| Raise {
            auto_scaling_group: c.asg.clone(),
            from: c.from,
            to: c.to,
        })
        .collect();
    status.last_modification = Some(now);
    status.last_action = Some(LastAction {
        description,
        time: now,
    });
}

/// A raise that landed: nothing left to check.
pub fn raise_landed(status: &mut ReplenisherStatus) {
    status.raising.clear();
}

/// The recorded raise was not made (dry-run): take it back from `raised`, so
/// nothing is remembered as done. The cooldown's start stays, so a dry run
/// logs its intent once per cooldown rather than on every reconcile.
pub fn raise_not_made(status: &mut ReplenisherStatus) {
    for raise in std::mem::take(&mut status.raising) {
        add_raised(status, &raise.auto_scaling_group, raise.from - raise.to);
    }
}

/// Records, before it is made, the termination (with decrement) of a drained
/// scale-in target: the raise it takes back, the cooldown's start.
pub fn record_termination(
    status: &mut ReplenisherStatus,
    now: DateTime<Utc>,
) -> Option<ScaleInTarget> {
    let target = status.scale_in.as_mut()?;
    if target.terminating.is_none() {
        target.terminating = Some(now);
        let asg = target.auto_scaling_group.clone();
        add_raised(status, &asg, -1);
    }
    status.last_modification = Some(now);
    status.scale_in.clone()
}

/// The recorded termination is done.
pub fn finish_scale_in(status: &mut ReplenisherStatus, target: &ScaleInTarget) {
    status.scale_in = None;
    status.last_action = Some(LastAction {
        description: format!(
            "removed {} ({}) from {}",
            target.node, target.instance_id, target.auto_scaling_group
        ),
        time: target.terminating.unwrap_or(target.since),
    });
}

/// The recorded cleanup is done.
pub fn finish_cleanup(status: &mut ReplenisherStatus) {
    if let Some(c) = status.cleanup.take() {
        status.last_action = Some(LastAction {
            description: format!(
                "removed {} from {}: {}",
                c.instance_id, c.auto_scaling_group, c.reason
            ),
            time: c.since,
        });
    }
}

/// A scale-in given up: the node stays, and so does the raise it would have
/// taken back.
pub fn abandon_scale_in(status: &mut ReplenisherStatus, reason: &str, now: DateTime<Utc>) {
    if let Some(target) = status.scale_in.take() {
        if target.terminating.is_some() {
            add_raised(status, &target.auto_scaling_group, 1);
        }
        status.last_modification = Some(now);
        status.last_action = Some(LastAction {
            description: format!("kept {}: {reason}", target.node),
            time: now,
        });
    }
}

fn add_raised(status: &mut ReplenisherStatus, asg: &str, delta: i32) {
    match status
        .raised
        .iter_mut()
        .find(|r| r.auto_scaling_group == asg)
    {
        Some(r) => r.count = (r.count + delta).max(0),
        None if delta > 0 => status.raised.push(AsgCount {
            auto_scaling_group: asg.to_string(),
            count: delta,
        }),
        None => {}
    }
    status.raised.retain(|r| r.count > 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 22, 12, 0, 0).unwrap()
    }

    fn asg(name: &str, desired: i32, instances: i32, max: i32) -> AsgView {
        AsgView {
            name: name.into(),
            desired,
            min: 0,
            max,
            instances,
            ..Default::default()
        }
        .judge(None, t0())
    }

    const NO_CAPACITY: &str = "Could not launch Spot Instances. InsufficientInstanceCapacity";

    /// Its newest launch activity failed.
    fn failing(mut a: AsgView) -> AsgView {
        a.launch_failure = Some(NO_CAPACITY.into());
        a.judge(None, t0())
    }

    fn node(name: &str, asg: &str, ready: bool, minutes_old: i64) -> NodeView {
        NodeView {
            name: name.into(),
            instance_id: Some(format!("i-{name}")),
            asg: Some(asg.into()),
            ready,
            launch_time: Some(t0() - chrono::Duration::minutes(minutes_old)),
        }
    }

    #[derive(Debug)]
    struct Scenario {
        role: Role,
        desired: i32,
        suspend: bool,
        asgs: Vec<AsgView>,
        nodes: Vec<NodeView>,
        not_joined: Vec<NotJoinedView>,
        lock: LockState,
        status: ReplenisherStatus,
    }

    impl Scenario {
        /// Three ASGs of one node each, all Ready, desired 3, lock ours.
        fn steady() -> Self {
            Self {
                role: Role::Worker,
                desired: 3,
                suspend: false,
                asgs: vec![asg("a", 1, 1, 3), asg("c", 1, 1, 3), asg("d", 1, 1, 3)],
                nodes: vec![
                    node("na", "a", true, 60),
                    node("nc", "c", true, 60),
                    node("nd", "d", true, 60),
                ],
                not_joined: vec![],
                lock: LockState::Ours,
                status: ReplenisherStatus::default(),
            }
        }

        fn plan(&self) -> Plan {
            plan(&Input {
                role: self.role,
                desired: self.desired,
                suspend: self.suspend,
                spec_valid: true,
                cooldown: Duration::from_secs(300),
                join_timeout: Duration::from_secs(900),
                asgs: &self.asgs,
                nodes: &self.nodes,
                not_joined: &self.not_joined,
                active: &self.active(),
                lock: self.lock.clone(),
                status: &self.status,
                now: t0(),
            })
        }

        /// Every instance with a node or not joined is active in its ASG.
        fn active(&self) -> BTreeSet<String> {
            self.nodes
                .iter()
                .filter_map(|n| n.instance_id.clone())
                .chain(self.not_joined.iter().map(|n| n.instance_id.clone()))
                .collect()
        }

        /// Zone a is short: its node is gone and its launch failed.
        fn shortage_in_a(mut self) -> Self {
            self.asgs[0] = failing(asg("a", 1, 0, 3));
            self.nodes.retain(|n| n.name != "na");
            self
        }
    }

    #[test]
    fn steady_releases_the_lock_and_does_nothing() {
        let p = Scenario::steady().plan();
        assert_eq!(p.action, Action::ReleaseLock);
        assert_eq!(p.status.phase, ReplenishPhase::Steady);
        let mut s = Scenario::steady();
        s.lock = LockState::Free;
        assert_eq!(s.plan().action, Action::Nothing);
    }

    #[test]
    fn a_shortage_scales_up_only_launching_asgs_and_excludes_the_short_one() {
        let p = Scenario::steady().shortage_in_a().plan();
        assert_eq!(
            p.action,
            Action::ScaleUp(vec![DesiredChange {
                asg: "c".into(),
                from: 1,
                to: 2
            }])
        );
        assert_eq!(p.status.phase, ReplenishPhase::ScalingUp);
        let excluded = &p.status.excluded;
        assert_eq!(excluded.len(), 1);
        assert_eq!(excluded[0].auto_scaling_group, "a");
        assert_eq!(excluded[0].since, t0());
        assert_eq!(
            excluded[0].retry_after,
            Some(t0() + chrono::Duration::minutes(1))
        );
        assert!(
            excluded[0].reason.contains("InsufficientInstanceCapacity"),
            "{excluded:?}"
        );
        // Recorded before the call: the raise, the count to take back, the cooldown.
        assert_eq!(
            p.status.raising,
            vec![Raise {
                auto_scaling_group: "c".into(),
                from: 1,
                to: 2
            }]
        );
        assert_eq!(p.status.raised[0].count, 1);
        assert_eq!(p.status.last_modification, Some(t0()));
    }

    #[test]
    fn the_increase_is_spread_over_launching_asgs() {
        let mut s = Scenario::steady();
        s.desired = 5;
        let p = s.plan();
        assert_eq!(
            p.action,
            Action::ScaleUp(vec![
                DesiredChange {
                    asg: "a".into(),
                    from: 1,
                    to: 2
                },
                DesiredChange {
                    asg: "c".into(),
                    from: 1,
                    to: 2
                },
            ])
        );
    }

    #[test]
    fn exclusion_backoff_grows_while_it_keeps_failing_and_lifts_after() {
        let mut s = Scenario::steady().shortage_in_a();
        s.status = s.plan().status;
        // Still failing after the first backoff: failures 2, next retry in 2m.
        let active = s.active();
        let later = plan(&Input {
            now: t0() + chrono::Duration::minutes(2),
            ..input_of(&s, &active)
        });
        let e = &later.status.excluded[0];
        assert_eq!(e.failures, 2);
        assert_eq!(e.retry_after, Some(t0() + chrono::Duration::minutes(4)));
        assert_eq!(exclusion_backoff(10), Duration::from_secs(1800), "capped");
        // Launching again and past the backoff: no longer excluded.
        s.status = later.status;
        s.asgs[0] = asg("a", 1, 1, 3);
        let active = s.active();
        let healed = plan(&Input {
            now: t0() + chrono::Duration::minutes(5),
            ..input_of(&s, &active)
        });
        assert!(healed.status.excluded.is_empty());
    }

    fn input_of<'a>(s: &'a Scenario, active: &'a BTreeSet<String>) -> Input<'a> {
        Input {
            role: s.role,
            desired: s.desired,
            suspend: s.suspend,
            spec_valid: true,
            cooldown: Duration::from_secs(300),
            join_timeout: Duration::from_secs(900),
            asgs: &s.asgs,
            nodes: &s.nodes,
            not_joined: &s.not_joined,
            active,
            lock: s.lock.clone(),
            status: &s.status,
            now: t0(),
        }
    }

    #[test]
    fn all_asgs_at_max_is_reported_and_nothing_is_done() {
        let mut s = Scenario::steady().shortage_in_a();
        s.asgs[1].max = 1;
        s.asgs[2].max = 1;
        let p = s.plan();
        assert_eq!(
            p.action,
            Action::ReleaseLock,
            "nothing it can do: the lock goes back"
        );
        assert_eq!(p.status.phase, ReplenishPhase::Blocked);
        assert!(p.message.contains("no ASG can launch"), "{}", p.message);
    }

    #[test]
    fn nodes_already_launching_are_not_ordered_twice() {
        let mut s = Scenario::steady().shortage_in_a();
        s.asgs[1] = asg("c", 2, 2, 3); // raised already, its new node not Ready yet
        let p = s.plan();
        assert_eq!(p.action, Action::Nothing);
        assert_eq!(p.status.phase, ReplenishPhase::Waiting);
    }

    #[test]
    fn cooldown_not_over_means_wait_until_it_is() {
        let mut s = Scenario::steady().shortage_in_a();
        s.status.last_modification = Some(t0() - chrono::Duration::seconds(270));
        let p = s.plan();
        assert_eq!(p.action, Action::Nothing);
        assert_eq!(p.status.phase, ReplenishPhase::Waiting);
        assert_eq!(
            p.requeue,
            Duration::from_secs(30),
            "requeued for the end of the cooldown"
        );
    }

    #[test]
    fn a_refresh_holding_the_lock_pauses_the_replenisher() {
        let mut s = Scenario::steady().shortage_in_a();
        s.lock = LockState::Other("Refresh workers".into());
        let p = s.plan();
        assert_eq!(p.action, Action::Nothing);
        assert_eq!(p.status.phase, ReplenishPhase::Paused);
        assert!(p.message.contains("Refresh workers"));
    }

    #[test]
    fn a_suspended_group_is_left_alone() {
        let mut s = Scenario::steady().shortage_in_a();
        s.suspend = true;
        let p = s.plan();
        assert_eq!(p.action, Action::ReleaseLock);
        assert_eq!(p.status.phase, ReplenishPhase::Paused);
    }

    #[test]
    fn without_the_lock_it_asks_for_it_first() {
        let mut s = Scenario::steady().shortage_in_a();
        s.lock = LockState::Free;
        assert_eq!(s.plan().action, Action::TakeLock);
    }

    #[test]
    fn after_a_shortage_the_surplus_is_taken_back_from_the_raised_asg() {
        let mut s = Scenario::steady();
        // a launched again; c had been raised by one.
        s.asgs[1] = asg("c", 2, 2, 3);
        s.nodes.push(node("nc2", "c", true, 5));
        s.status.raised = vec![AsgCount {
            auto_scaling_group: "c".into(),
            count: 1,
        }];
        let p = s.plan();
        let Action::Drain(target) = p.action else {
            panic!("expected a drain, got {:?}", p.action)
        };
        assert_eq!(
            (target.node.as_str(), target.auto_scaling_group.as_str()),
            ("nc2", "c"),
            "newest node of the raised ASG"
        );
        assert_eq!(target.since, t0());
        assert_eq!(p.status.scale_in.as_ref(), Some(&target), "persisted first");
        // The termination is recorded (and the raise taken back) before it is made ...
        let mut status = p.status.clone();
        let recorded = record_termination(&mut status, t0()).expect("a target");
        assert!(recorded.terminating.is_some());
        assert!(status.raised.is_empty());
        // ... and a restart with that record retries the same termination.
        s.status = status.clone();
        assert_eq!(s.plan().action, Action::Terminate(recorded.clone()));
        // Once the instance is gone, the record is settled.
        s.nodes.retain(|n| n.name != "nc2");
        let settled = s.plan();
        assert!(settled.status.scale_in.is_none());
        assert!(settled.status.raised.is_empty(), "not taken back twice");
        assert!(
            settled
                .status
                .last_action
                .is_some_and(|a| a.description.contains("removed nc2"))
        );
    }

    #[test]
    fn a_scale_in_that_would_drop_below_desired_is_abandoned() {
        let mut s = Scenario::steady();
        s.asgs[1] = asg("c", 2, 2, 3);
        s.nodes.push(node("nc2", "c", true, 5));
        s.nodes[0].ready = false; // a node went NotReady meanwhile
        s.status.scale_in = Some(ScaleInTarget {
            node: "nc2".into(),
            instance_id: "i-nc2".into(),
            auto_scaling_group: "c".into(),
            since: t0(),
            terminating: None,
        });
        assert!(matches!(s.plan().action, Action::AbandonScaleIn { .. }));
    }

    #[test]
    fn a_scale_in_drain_that_takes_too_long_is_abandoned() {
        let mut s = Scenario::steady();
        s.asgs[1] = asg("c", 2, 2, 3);
        s.nodes.push(node("nc2", "c", true, 5));
        s.status.scale_in = Some(ScaleInTarget {
            node: "nc2".into(),
            instance_id: "i-nc2".into(),
            auto_scaling_group: "c".into(),
            since: t0() - chrono::Duration::minutes(11),
            terminating: None,
        });
        let p = s.plan();
        assert!(
            matches!(&p.action, Action::AbandonScaleIn { reason, .. } if reason.contains("timed out")),
            "{:?}",
            p.action
        );
    }

    #[test]
    fn an_instance_not_joined_past_the_timeout_is_removed() {
        let mut s = Scenario::steady();
        s.not_joined = vec![
            NotJoinedView {
                instance_id: "i-young".into(),
                asg: "a".into(),
                launch_time: Some(t0() - chrono::Duration::minutes(5)),
            },
            NotJoinedView {
                instance_id: "i-old".into(),
                asg: "c".into(),
                launch_time: Some(t0() - chrono::Duration::minutes(16)),
            },
        ];
        let p = s.plan();
        assert!(
            matches!(&p.action, Action::RemoveNotJoined(t) if t.instance_id == "i-old" && t.auto_scaling_group == "c"),
            "{:?}",
            p.action
        );
        assert_eq!(p.status.phase, ReplenishPhase::CleaningUp);
    }

    #[test]
    fn it_wakes_up_when_a_not_joined_instance_becomes_overdue() {
        let mut s = Scenario::steady();
        s.not_joined = vec![NotJoinedView {
            instance_id: "i-new".into(),
            asg: "a".into(),
            launch_time: Some(t0() - chrono::Duration::minutes(14)),
        }];
        let p = s.plan();
        assert_eq!(p.action, Action::ReleaseLock);
        s.lock = LockState::Free;
        let p = s.plan();
        assert_eq!(p.action, Action::Nothing);
        assert_eq!(p.requeue, Duration::from_secs(60), "due in one minute");
        s.not_joined[0].launch_time = Some(t0() - chrono::Duration::seconds(14 * 60 + 50));
        assert_eq!(
            s.plan().requeue,
            Duration::from_secs(10),
            "due in ten seconds, not at the next idle resync"
        );
    }

    #[test]
    fn an_extra_master_is_removed_at_once_and_masters_are_never_launched_elsewhere() {
        let mut s = Scenario::steady();
        s.role = Role::Master;
        s.asgs[0] = asg("a", 2, 2, 2);
        s.not_joined = vec![NotJoinedView {
            instance_id: "i-extra".into(),
            asg: "a".into(),
            launch_time: Some(t0()),
        }];
        let p = s.plan();
        assert!(
            matches!(&p.action, Action::RemoveNotJoined(t) if t.instance_id == "i-extra" && t.reason.contains("extra master")),
            "{:?}",
            p.action
        );
        // A missing master is not replaced in another ASG.
        let mut s = Scenario::steady().shortage_in_a();
        s.role = Role::Master;
        let p = s.plan();
        assert!(!matches!(p.action, Action::ScaleUp(_)));
        assert_eq!(p.status.phase, ReplenishPhase::Blocked);
    }

    #[test]
    fn a_raise_in_flight_counts_as_launching_within_the_grace_and_is_not_ordered_twice() {
        // a is short; c was raised a moment ago and AWS has not launched yet.
        let mut s = Scenario::steady().shortage_in_a();
        s.asgs[1] = asg("c", 2, 1, 3);
        let p = s.plan();
        assert_eq!(p.action, Action::Nothing, "{}", p.message);
        assert_eq!(p.status.phase, ReplenishPhase::Waiting);
        assert_eq!(
            p.status.behind,
            vec![
                AsgSince {
                    auto_scaling_group: "a".into(),
                    since: t0()
                },
                AsgSince {
                    auto_scaling_group: "c".into(),
                    since: t0()
                },
            ]
        );
        assert!(
            p.status
                .excluded
                .iter()
                .all(|e| e.auto_scaling_group != "c")
        );
        // The instance is Pending: still on its way.
        s.asgs[1] = AsgView {
            pending: 1,
            ..asg("c", 2, 2, 3)
        };
        assert_eq!(s.plan().action, Action::Nothing);
        // Still nothing launched past the grace: c is short too, d gets the node.
        s.asgs[1] = asg("c", 2, 1, 3);
        s.status = p.status;
        let active = s.active();
        let later = plan(&Input {
            now: t0() + to_chrono(crate::cloud::LAUNCH_GRACE),
            ..input_of(&s, &active)
        });
        assert_eq!(
            later.action,
            Action::ScaleUp(vec![DesiredChange {
                asg: "d".into(),
                from: 1,
                to: 2
            }]),
            "{}",
            later.message
        );
        assert!(
            later
                .status
                .excluded
                .iter()
                .any(|e| e.auto_scaling_group == "c" && e.reason.contains("for 1m"))
        );
    }

    #[test]
    fn a_lost_instance_its_asg_will_replace_is_on_its_way() {
        // The node is gone; its instance is still in the ASG (EC2 terminated it,
        // the ASG's health check has not noticed yet), or already dropped.
        let mut s = Scenario::steady();
        s.nodes.retain(|n| n.name != "na");
        assert_eq!(s.plan().action, Action::Nothing);
        s.asgs[0] = asg("a", 1, 0, 3);
        assert_eq!(s.plan().action, Action::Nothing);
    }

    #[test]
    fn a_node_not_ready_past_the_join_timeout_is_not_on_its_way() {
        let mut s = Scenario::steady();
        s.nodes[0].ready = false; // na, an hour old
        assert!(matches!(s.plan().action, Action::ScaleUp(_)));
        // A young node that is not Ready yet is joining.
        s.nodes[0].launch_time = Some(t0() - chrono::Duration::minutes(2));
        assert_eq!(s.plan().action, Action::Nothing);
    }

    #[test]
    fn an_asg_with_launch_suspended_is_not_launching() {
        let mut s = Scenario::steady().shortage_in_a();
        s.asgs[1].suspended_processes = vec!["Launch".into()];
        s.asgs[1] = s.asgs[1].clone().judge(None, t0());
        let p = s.plan();
        assert_eq!(
            p.action,
            Action::ScaleUp(vec![DesiredChange {
                asg: "d".into(),
                from: 1,
                to: 2
            }])
        );
        assert!(
            p.status
                .excluded
                .iter()
                .any(|e| e.auto_scaling_group == "c" && e.reason.contains("Launch process"))
        );
    }

    #[test]
    fn a_raise_interrupted_by_a_restart_is_settled_against_the_asg() {
        let mut s = Scenario::steady();
        let raising = |from, to| Raise {
            auto_scaling_group: "c".into(),
            from,
            to,
        };
        // Recorded, never made (killed before the call): the count is taken back.
        s.status.raising = vec![raising(1, 2)];
        s.status.raised = vec![AsgCount {
            auto_scaling_group: "c".into(),
            count: 1,
        }];
        let p = s.plan();
        assert!(p.status.raising.is_empty());
        assert!(p.status.raised.is_empty());
        // Made (killed after the call): kept, and not ordered again.
        s.asgs[1] = asg("c", 2, 2, 3);
        s.nodes.push(node("nc2", "c", false, 0));
        s.nodes.retain(|n| n.name != "na");
        s.asgs[0] = failing(asg("a", 1, 0, 3));
        let p = s.plan();
        assert!(p.status.raising.is_empty());
        assert_eq!(p.status.raised[0].count, 1);
        assert_eq!(p.action, Action::Nothing, "{}", p.message);
    }

    #[test]
    fn a_raise_not_made_in_a_dry_run_is_not_remembered_as_done() {
        let s = Scenario::steady().shortage_in_a();
        let p = s.plan();
        let Action::ScaleUp(changes) = &p.action else {
            panic!("{:?}", p.action)
        };
        let mut status = p.status.clone();
        assert_eq!(status.raised.len(), 1, "recorded before the call");
        raise_not_made(&mut status);
        assert!(status.raising.is_empty());
        assert!(
            status.raised.is_empty(),
            "{:?} after {changes:?}",
            status.raised
        );
        assert_eq!(
            status.last_modification, p.status.last_modification,
            "the cooldown still paces the dry run's log"
        );
    }

    fn never_joined(id: &str, asg: &str, minutes_old: i64) -> NotJoinedView {
        NotJoinedView {
            instance_id: id.into(),
            asg: asg.into(),
            launch_time: Some(t0() - chrono::Duration::minutes(minutes_old)),
        }
    }

    #[test]
    fn a_never_joined_instance_is_terminated_in_its_asg_decrementing_only_above_min() {
        let mut s = Scenario::steady();
        s.not_joined = vec![never_joined("i-late", "a", 20)];
        // kops: min = desired. Terminated without decrement: the ASG replaces it.
        s.asgs[0] = AsgView {
            min: 2,
            ..asg("a", 2, 2, 3)
        };
        let p = s.plan();
        let Action::RemoveNotJoined(target) = &p.action else {
            panic!("{:?}", p.action)
        };
        assert!(!target.decrement);
        assert_eq!(p.status.cleanup.as_ref(), Some(target), "recorded first");
        assert_eq!(p.status.removals[0].count, 1);
        // Above min: decremented.
        s.asgs[0].min = 1;
        s.asgs[0] = s.asgs[0].clone().judge(None, t0());
        let Action::RemoveNotJoined(target) = s.plan().action else {
            panic!()
        };
        assert!(target.decrement);
    }

    #[test]
    fn a_replacement_that_never_joins_either_backs_off_and_never_blocks_scale_up() {
        let mut s = Scenario::steady().shortage_in_a();
        s.asgs[1] = asg("c", 2, 2, 3);
        s.not_joined = vec![never_joined("i-again", "c", 20)];
        s.status.removals = vec![NotJoinedRemovals {
            auto_scaling_group: "c".into(),
            count: 1,
            last: t0() - chrono::Duration::seconds(20),
            retry_after: t0() + chrono::Duration::seconds(40),
        }];
        // Not due: the shortage is handled meanwhile.
        let p = s.plan();
        assert_eq!(
            p.action,
            Action::ScaleUp(vec![DesiredChange {
                asg: "d".into(),
                from: 1,
                to: 2
            }]),
            "{}",
            p.message
        );
        assert_eq!(
            p.requeue,
            Duration::from_secs(2),
            "next step soon, removal due in 40s"
        );
        // Its instances do not join: no raise goes there.
        s.desired = 4;
        let Action::ScaleUp(changes) = s.plan().action else {
            panic!("a raise")
        };
        assert!(changes.iter().all(|c| c.asg != "c"), "{changes:?}");
        s.desired = 3;
        // Due: removed, and the next one backs off twice as long.
        s.status.removals[0].retry_after = t0();
        let p = s.plan();
        assert!(
            matches!(p.action, Action::RemoveNotJoined(_)),
            "{:?}",
            p.action
        );
        assert_eq!(p.status.removals[0].count, 2);
        assert_eq!(
            p.status.removals[0].retry_after,
            t0() + chrono::Duration::minutes(2)
        );
        // A failed call leaves the record; the plan moves on until it is due.
        s.status = p.status;
        let p = s.plan();
        assert!(matches!(p.action, Action::ScaleUp(_)), "{:?}", p.action);
        // Once a node of c launched after the removal is Ready, the run ends:
        // the next removal there counts from one again.
        s.nodes.push(node("nc-new", "c", true, -1));
        let p = s.plan();
        assert!(
            matches!(p.action, Action::RemoveNotJoined(_)),
            "{:?}",
            p.action
        );
        assert_eq!(p.status.removals[0].count, 1);
    }

    #[test]
    fn retrying_the_recorded_removal_after_a_restart_is_not_another_instance_that_never_joined() {
        let mut s = Scenario::steady();
        s.not_joined = vec![never_joined("i-late", "a", 20)];
        let first = s.plan();
        assert!(matches!(first.action, Action::RemoveNotJoined(_)));
        // Killed after the record, before the call: the instance is still in
        // its ASG. Once the backoff is over, the same instance is removed,
        // and it still counts as the first that never joined.
        s.status = first.status;
        s.status.removals[0].retry_after = t0();
        let p = s.plan();
        let Action::RemoveNotJoined(target) = &p.action else {
            panic!("{:?}", p.action)
        };
        assert_eq!(target.instance_id, "i-late");
        assert!(p.message.starts_with("retrying"), "{}", p.message);
        assert_eq!(p.status.removals[0].count, 1, "{:?}", p.status.removals);
    }

    // ---- properties over random states ----

    fn arb_state() -> impl Strategy<Value = Scenario> {
        let asgs = prop::collection::vec((0i32..4, 0i32..4, 0i32..3, any::<bool>()), 1..4);
        (
            asgs,
            0i32..8,
            0u8..3,
            any::<bool>(),
            prop::collection::vec(any::<bool>(), 12),
            0u8..3,
            any::<bool>(),
        )
            .prop_map(
                |(asgs, desired, lock, raised, readiness, role, in_scale_in)| {
                    let mut views = vec![];
                    let mut nodes = vec![];
                    let mut not_joined = vec![];
                    let mut flags = readiness.into_iter().cycle();
                    for (i, (desired_in, instances, headroom, joined_all)) in
                        asgs.into_iter().enumerate()
                    {
                        let name = format!("asg{i}");
                        let instances = instances.min(desired_in + 1);
                        views.push(
                            AsgView {
                                name: name.clone(),
                                desired: desired_in,
                                min: 0,
                                max: desired_in.max(instances) + headroom,
                                instances,
                                ..Default::default()
                            }
                            .judge(None, t0()),
                        );
                        for j in 0..instances {
                            let id = format!("i-{i}-{j}");
                            if joined_all || j > 0 {
                                nodes.push(NodeView {
                                    name: id.clone(),
                                    instance_id: Some(id),
                                    asg: Some(name.clone()),
                                    ready: flags.next().unwrap_or(true),
                                    launch_time: Some(t0() - chrono::Duration::minutes(j as i64)),
                                });
                            } else {
                                not_joined.push(NotJoinedView {
                                    instance_id: id,
                                    asg: name.clone(),
                                    launch_time: Some(t0() - chrono::Duration::minutes(30)),
                                });
                            }
                        }
                    }
                    let mut status = ReplenisherStatus::default();
                    if raised {
                        status.raised = vec![AsgCount {
                            auto_scaling_group: "asg0".into(),
                            count: 1,
                        }];
                    }
                    if in_scale_in && let Some(n) = nodes.first() {
                        status.scale_in = Some(ScaleInTarget {
                            node: n.name.clone(),
                            instance_id: n.instance_id.clone().unwrap_or_default(),
                            auto_scaling_group: n.asg.clone().unwrap_or_default(),
                            since: t0(),
                            terminating: None,
                        });
                    }
                    Scenario {
                        role: if role == 0 {
                            Role::Master
                        } else {
                            Role::Worker
                        },
                        desired,
                        suspend: false,
                        asgs: views,
                        nodes,
                        not_joined,
                        lock: match lock {
                            0 => LockState::Free,
                            1 => LockState::Ours,
                            _ => LockState::Other("Refresh x".into()),
                        },
                        status,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn never_mutates_without_the_lock(s in arb_state()) {
            let p = s.plan();
            if p.action.mutates() {
                prop_assert_eq!(&s.lock, &LockState::Ours, "{:?}", p.action);
            }
        }

        #[test]
        fn never_exceeds_an_asgs_max_and_only_scales_up_when_short(s in arb_state()) {
            let ready = s.nodes.iter().filter(|n| n.ready).count() as i32;
            if let Action::ScaleUp(changes) = s.plan().action {
                prop_assert!(ready < s.desired, "scale-up with {} Ready of {}", ready, s.desired);
                for c in changes {
                    let a = s.asgs.iter().find(|a| a.name == c.asg).expect("known ASG");
                    prop_assert!(c.to <= a.max && c.to > c.from, "{:?} max {}", c, a.max);
                    prop_assert!(a.launching, "{} is not launching", a.name);
                }
            }
        }

        #[test]
        fn never_removes_a_ready_node_while_ready_would_drop_below_desired(s in arb_state()) {
            let ready = s.nodes.iter().filter(|n| n.ready).count() as i32;
            match s.plan().action {
                Action::Drain(target) => {
                    let target_ready = s.nodes.iter().any(|n| n.instance_id.as_deref() == Some(&target.instance_id) && n.ready);
                    prop_assert!(ready - i32::from(target_ready) >= s.desired, "drains {} with {} Ready of {}", target.node, ready, s.desired);
                }
                Action::RemoveNotJoined(t) => {
                    prop_assert!(s.nodes.iter().all(|n| n.instance_id.as_deref() != Some(&t.instance_id)), "{} has a node", t.instance_id);
                }
                _ => {}
            }
        }
    }
}
