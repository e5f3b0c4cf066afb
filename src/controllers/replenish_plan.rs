//! The replenisher's decisions, pure: from what was observed and `now`, one
//! action and the next status. No I/O; the reconcile carries the action out.
//!
//! Invariants (property-tested below): no mutating action without holding the
//! group's lock; never more than an ASG's max; never remove a Ready node
//! unless Ready nodes stay at or above the desired count; scale-up only while
//! Ready nodes are below the desired count.

use crate::crd::Role;
use crate::crd::replenisher::{
    AsgCount, ExcludedAsg, LastAction, ReplenishPhase, ReplenisherStatus, ScaleInTarget,
};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// A drain for scale-in that takes longer than this is abandoned (the node is
/// uncordoned and kept) and retried after the cooldown.
pub const SCALE_IN_DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
/// Backoff for an ASG that is not launching: 1m, 2m, 4m ... at most 30m.
pub fn exclusion_backoff(failures: i32) -> Duration {
    let exp = failures.clamp(1, 6) - 1;
    Duration::from_secs((60u64 << exp).min(1800))
}

/// An ASG as the plan sees it: the same figures the inventory reports.
pub type AsgView = crate::crd::nodegroup::AutoScalingGroupStatus;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub instance_id: Option<String>,
    pub asg: Option<String>,
    pub ready: bool,
    pub launch_time: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotJoinedView {
    pub instance_id: String,
    pub asg: String,
    pub launch_time: Option<DateTime<Utc>>,
}

pub use crate::k8s::lock::LockState;

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
    pub lock: LockState,
    pub status: &'a ReplenisherStatus,
    pub now: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredChange {
    pub asg: String,
    pub from: i32,
    pub to: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing,
    TakeLock,
    ReleaseLock,
    /// Raise desired capacity on launching ASGs.
    ScaleUp(Vec<DesiredChange>),
    /// Detach (with decrement) and terminate an instance that never joined.
    RemoveNotJoined {
        asg: String,
        instance_id: String,
        reason: String,
    },
    /// Drain the target (persisted first); terminate it with decrement once drained.
    Drain(ScaleInTarget),
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
                | Action::RemoveNotJoined { .. }
                | Action::Drain(_)
                | Action::AbandonScaleIn { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub action: Action,
    /// The status to write (before the action's own effects, which the
    /// reconcile records once the action succeeded).
    pub status: ReplenisherStatus,
    /// What it is doing or waiting for, for status and logs.
    pub message: String,
    pub requeue: Duration,
}

const SOON: Duration = Duration::from_secs(2);
const IDLE: Duration = Duration::from_secs(60);

pub(crate) fn chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

pub(crate) fn until(now: DateTime<Utc>, then: DateTime<Utc>) -> Duration {
    (then - now)
        .to_std()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_millis(500))
}

pub fn plan(input: &Input) -> Plan {
    let mut plan = plan_inner(input);
    // Wake up for the next deadline the plan knows about, not a minute later.
    if let Some(deadline) = next_deadline(input, &plan.status) {
        plan.requeue = plan.requeue.min(until(input.now, deadline));
    }
    plan
}

/// The earliest future moment at which the plan may decide differently on
/// the same observations: a join timeout, an exclusion's retry, a drain timeout.
fn next_deadline(input: &Input, status: &ReplenisherStatus) -> Option<DateTime<Utc>> {
    let joins = input
        .not_joined
        .iter()
        .filter_map(|n| n.launch_time.map(|t| t + chrono(input.join_timeout)));
    let retries = status.excluded.iter().filter_map(|e| e.retry_after);
    let drain = status
        .scale_in
        .iter()
        .map(|t| t.since + chrono(SCALE_IN_DRAIN_TIMEOUT));
    joins
        .chain(retries)
        .chain(drain)
        .filter(|t| *t > input.now)
        .min()
}

fn plan_inner(input: &Input) -> Plan {
    let mut status = input.status.clone();
    let now = input.now;
    let finish =
        |mut status: ReplenisherStatus, phase, action: Action, message: String, requeue| {
            status.phase = phase;
            Plan {
                action,
                status,
                message,
                requeue,
            }
        };
    // Not acting: give the lock back if we hold it, say why.
    let idle = |status: ReplenisherStatus, phase, message: String, lock: &LockState| {
        let action = if *lock == LockState::Ours {
            Action::ReleaseLock
        } else {
            Action::Nothing
        };
        let requeue = if action == Action::ReleaseLock {
            SOON
        } else {
            IDLE
        };
        finish(status, phase, action, message, requeue)
    };
    // A mutation needs the lock first.
    let act =
        |status: ReplenisherStatus, phase, action: Action, message: String, lock: &LockState| {
            match lock {
                LockState::Ours => finish(status, phase, action, message, SOON),
                LockState::Free => finish(
                    status,
                    phase,
                    Action::TakeLock,
                    format!("taking the lock to: {message}"),
                    Duration::ZERO,
                ),
                LockState::Other(holder) => finish(
                    status,
                    ReplenishPhase::Paused,
                    Action::Nothing,
                    format!("{holder} holds the group's lock"),
                    IDLE,
                ),
            }
        };

    if !input.spec_valid {
        return idle(
            status,
            ReplenishPhase::Blocked,
            "the NodeGroup spec is invalid".into(),
            &input.lock,
        );
    }
    if input.suspend {
        return idle(
            status,
            ReplenishPhase::Paused,
            "the NodeGroup is suspended".into(),
            &input.lock,
        );
    }
    if let LockState::Other(holder) = &input.lock {
        return finish(
            status,
            ReplenishPhase::Paused,
            Action::Nothing,
            format!("{holder} holds the group's lock"),
            IDLE,
        );
    }

    update_exclusions(&mut status, input.asgs, now);
    let excluded = |name: &str| status.excluded.iter().any(|e| e.auto_scaling_group == name);
    let ready = input.nodes.iter().filter(|n| n.ready).count() as i32;
    let in_cooldown = status
        .last_modification
        .map(|t| now < t + chrono(input.cooldown))
        .unwrap_or(false);
    let cooldown_left = status
        .last_modification
        .map(|t| until(now, t + chrono(input.cooldown)))
        .unwrap_or(SOON);

    // 1. A scale-in in progress goes on, or is abandoned.
    if let Some(target) = status.scale_in.clone() {
        // Still a node of its ASG, or at least an instance of it (not joined).
        let has_node = input
            .asgs
            .iter()
            .any(|a| a.name == target.auto_scaling_group)
            && input
                .nodes
                .iter()
                .any(|n| n.instance_id.as_deref() == Some(&target.instance_id));
        let still_there = has_node
            || input
                .not_joined
                .iter()
                .any(|n| n.instance_id == target.instance_id);
        if !still_there {
            status.scale_in = None;
        } else {
            let target_ready = input
                .nodes
                .iter()
                .any(|n| n.instance_id.as_deref() == Some(&target.instance_id) && n.ready);
            let after = ready - i32::from(target_ready);
            let abandon = if after < input.desired {
                Some(format!(
                    "removing {} would leave {after} Ready node(s), below {}",
                    target.node, input.desired
                ))
            } else if now >= target.since + chrono(SCALE_IN_DRAIN_TIMEOUT) {
                Some(format!("drain of {} timed out", target.node))
            } else {
                None
            };
            if let Some(reason) = abandon {
                let action = Action::AbandonScaleIn {
                    target,
                    reason: reason.clone(),
                };
                return act(
                    status,
                    ReplenishPhase::ScalingDown,
                    action,
                    reason,
                    &input.lock,
                );
            }
            let message = format!(
                "draining {} to remove it from {}",
                target.node, target.auto_scaling_group
            );
            return act(
                status,
                ReplenishPhase::ScalingDown,
                Action::Drain(target),
                message,
                &input.lock,
            );
        }
    }

    // 2. Instances that never joined.
    let total_instances: i32 = input.asgs.iter().map(|a| a.instances).sum();
    let overdue = input.not_joined.iter().find_map(|n| {
        let late = n
            .launch_time
            .is_some_and(|t| now >= t + chrono(input.join_timeout));
        // kops cannot run an extra master: one beyond the count never joins.
        let extra_master = input.role == Role::Master && total_instances > input.desired;
        if late {
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
    });
    if let Some((instance, reason)) = overdue {
        if in_cooldown {
            return finish(
                status,
                ReplenishPhase::Waiting,
                Action::Nothing,
                format!("cooldown before removing {}", instance.instance_id),
                cooldown_left,
            );
        }
        let message = format!(
            "removing {} from {}: {reason}",
            instance.instance_id, instance.asg
        );
        let action = Action::RemoveNotJoined {
            asg: instance.asg.clone(),
            instance_id: instance.instance_id.clone(),
            reason,
        };
        return act(
            status,
            ReplenishPhase::CleaningUp,
            action,
            message,
            &input.lock,
        );
    }

    // 3. Too few Ready nodes: what is already on its way does not count twice.
    let ready_in = |asg: &str| ready_in(input.nodes, asg);
    let pending: i32 = input
        .asgs
        .iter()
        .filter(|a| a.launching && !excluded(&a.name))
        .map(|a| (a.desired - ready_in(&a.name)).max(0))
        .sum();
    let deficit = input.desired - ready - pending;
    if ready < input.desired && deficit <= 0 {
        return finish(
            status,
            ReplenishPhase::Waiting,
            Action::Nothing,
            format!("{pending} node(s) on their way"),
            SOON,
        );
    }
    if deficit > 0 {
        if input.role == Role::Master {
            return idle(
                status,
                ReplenishPhase::Blocked,
                format!(
                    "{ready}/{} masters Ready; masters are never launched outside their own ASG",
                    input.desired
                ),
                &input.lock,
            );
        }
        let mut candidates: Vec<AsgView> = input
            .asgs
            .iter()
            .filter(|a| a.launching && !excluded(&a.name) && a.desired < a.max)
            .cloned()
            .collect();
        if candidates.is_empty() {
            return idle(
                status,
                ReplenishPhase::Blocked,
                format!(
                    "{ready}/{} Ready and no ASG can launch (not launching, backing off, or at max)",
                    input.desired
                ),
                &input.lock,
            );
        }
        if in_cooldown {
            return finish(
                status,
                ReplenishPhase::Waiting,
                Action::Nothing,
                format!("cooldown before scaling up by {deficit}"),
                cooldown_left,
            );
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
                let from = input.asgs.iter().find(|a| a.name == c.name)?.desired;
                (c.desired != from).then(|| DesiredChange {
                    asg: c.name.clone(),
                    from,
                    to: c.desired,
                })
            })
            .collect();
        let message = format!(
            "{ready}/{} Ready: adding {added} on {}",
            input.desired,
            changes
                .iter()
                .map(|c| format!("{} {}->{}", c.asg, c.from, c.to))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return act(
            status,
            ReplenishPhase::ScalingUp,
            Action::ScaleUp(changes),
            message,
            &input.lock,
        );
    }

    // 4. Too many Ready nodes: take one back, explicitly chosen.
    if ready > input.desired {
        if in_cooldown {
            return finish(
                status,
                ReplenishPhase::Waiting,
                Action::Nothing,
                format!(
                    "cooldown before removing {} surplus node(s)",
                    ready - input.desired
                ),
                cooldown_left,
            );
        }
        let Some(target) = choose_victim(input, &status) else {
            return idle(
                status,
                ReplenishPhase::Blocked,
                "surplus nodes but no ASG can shrink (at min)".into(),
                &input.lock,
            );
        };
        let message = format!(
            "{ready}/{} Ready: removing {} from {}",
            input.desired, target.node, target.auto_scaling_group
        );
        return act(
            status,
            ReplenishPhase::ScalingDown,
            Action::Drain(target),
            message,
            &input.lock,
        );
    }

    // 5. Steady.
    idle(
        status,
        ReplenishPhase::Steady,
        format!("{ready}/{} Ready", input.desired),
        &input.lock,
    )
}

/// Ready nodes in one ASG.
fn ready_in(nodes: &[NodeView], asg: &str) -> i32 {
    nodes
        .iter()
        .filter(|n| n.ready && n.asg.as_deref() == Some(asg))
        .count() as i32
}

/// The surplus node to remove: from an ASG we raised (so the original layout
/// comes back), else from the ASG with the most Ready nodes; the newest node.
fn choose_victim(input: &Input, status: &ReplenisherStatus) -> Option<ScaleInTarget> {
    let raised = |asg: &str| {
        status
            .raised
            .iter()
            .find(|r| r.auto_scaling_group == asg)
            .map_or(0, |r| r.count)
    };
    let ready_in = |asg: &str| ready_in(input.nodes, asg);
    let asg = input
        .asgs
        .iter()
        .filter(|a| a.desired > a.min && ready_in(&a.name) > 0)
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
                retry_after: Some(now + chrono(exclusion_backoff(1))),
                failures: 1,
            }),
            (false, Some(i)) => {
                let e = &mut status.excluded[i];
                if e.retry_after.is_none_or(|t| now >= t) {
                    e.failures += 1;
                    e.retry_after = Some(now + chrono(exclusion_backoff(e.failures)));
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

/// Records a successful scale-up.
pub fn record_scale_up(
    status: &mut ReplenisherStatus,
    changes: &[DesiredChange],
    now: DateTime<Utc>,
    description: String,
) {
    for c in changes {
        add_raised(status, &c.asg, c.to - c.from);
    }
    status.last_modification = Some(now);
    status.last_action = Some(LastAction {
        description,
        time: now,
    });
}

/// Records the termination (with decrement) of a scale-in target.
pub fn record_scale_in(status: &mut ReplenisherStatus, target: &ScaleInTarget, now: DateTime<Utc>) {
    add_raised(status, &target.auto_scaling_group, -1);
    status.scale_in = None;
    status.last_modification = Some(now);
    status.last_action = Some(LastAction {
        description: format!(
            "removed {} ({}) from {}",
            target.node, target.instance_id, target.auto_scaling_group
        ),
        time: now,
    });
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
            launching: instances >= desired,
            reason: (instances < desired)
                .then(|| format!("desired {desired} but {instances} instance(s)")),
        }
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
                lock: self.lock.clone(),
                status: &self.status,
                now: t0(),
            })
        }

        /// Zone a is short: its node is gone and the ASG cannot replace it.
        fn shortage_in_a(mut self) -> Self {
            self.asgs[0] = asg("a", 1, 0, 3);
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
        assert!(excluded[0].reason.contains("desired 1 but 0"));
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
        let later = plan(&Input {
            now: t0() + chrono::Duration::minutes(2),
            ..input_of(&s)
        });
        let e = &later.status.excluded[0];
        assert_eq!(e.failures, 2);
        assert_eq!(e.retry_after, Some(t0() + chrono::Duration::minutes(4)));
        assert_eq!(exclusion_backoff(10), Duration::from_secs(1800), "capped");
        // Launching again and past the backoff: no longer excluded.
        s.status = later.status;
        s.asgs[0] = asg("a", 1, 1, 3);
        let healed = plan(&Input {
            now: t0() + chrono::Duration::minutes(5),
            ..input_of(&s)
        });
        assert!(healed.status.excluded.is_empty());
    }

    fn input_of(s: &Scenario) -> Input<'_> {
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
        // Once terminated, the record of the raise is gone.
        let mut status = p.status.clone();
        record_scale_in(&mut status, &target, t0());
        assert!(status.raised.is_empty());
        assert!(status.scale_in.is_none());
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
            matches!(&p.action, Action::RemoveNotJoined { instance_id, asg, .. } if instance_id == "i-old" && asg == "c"),
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
            matches!(&p.action, Action::RemoveNotJoined { instance_id, reason, .. } if instance_id == "i-extra" && reason.contains("extra master")),
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
                        views.push(AsgView {
                            name: name.clone(),
                            desired: desired_in,
                            min: 0,
                            max: desired_in.max(instances) + headroom,
                            instances,
                            launching: instances >= desired_in,
                            reason: None,
                        });
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
                Action::RemoveNotJoined { instance_id, .. } => {
                    prop_assert!(s.nodes.iter().all(|n| n.instance_id.as_deref() != Some(&instance_id)), "{} has a node", instance_id);
                }
                _ => {}
            }
        }
    }
}
