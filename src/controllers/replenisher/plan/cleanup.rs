//! Instances that never joined: terminated in their ASG, one at a time,
//! with a backoff per ASG while its replacements keep not joining.

use super::{Command, Deciding, NotJoinedView, Plan, exclusion_backoff};
use crate::controllers::authority::{self, Reason, Request};
use crate::controllers::group_view::after;
use crate::crd::Role;
use crate::crd::replenisher::{CleanupTarget, NotJoinedRemovals, ReplenishPhase};

/// Instances not joined after the join timeout (masters: any instance beyond
/// the count, at once) are terminated in their ASG, one at a time. Backs off
/// per ASG while its replacements keep not joining; never waits on the
/// cooldown, and a removal not yet due passes on to the other stages.
pub(super) fn remove_not_joined(s: &Deciding) -> Option<Plan> {
    let input = s.input;
    let now = input.group.now;
    let (instance, reason) = candidate(s)?;
    // A master instance goes only while every other master is Ready (its
    // etcd may run though its Node never registered).
    let request = Request {
        reason: Reason::NeverJoined,
        role: input.group.role,
        instance: &instance.instance_id,
    };
    authority::decide(input.group.control_plane, &request).ok()?;
    let asg = s.asg(&instance.asg)?;
    // A master is replaced in its own ASG only, and never raised there: one
    // that never joined keeps its place (its ASG launches a fresh one),
    // unless it is beyond the count.
    let decrement = asg.desired > asg.min && (input.group.role == Role::Worker || extra_master(s));
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
        retry_after: after(now, exclusion_backoff(count)),
    });
    if decrement && !retrying {
        // Recorded with the removal: a raise of ours taken back, or the
        // ASG's count below the layout (restored for workers).
        super::records::add_raised(&mut status, &instance.asg, -1);
    }
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
        Command::RemoveNotJoined(target),
        message,
    ))
}

/// A Master group with more instances than its count: an instance of it
/// that has not joined is removed at once (its ASG's backoff aside), not
/// at its join timeout: an extra master would join etcd as a member
/// nobody asked for.
pub(super) fn extra_master(s: &Deciding) -> bool {
    let total_instances: i32 = s.asgs.iter().map(|a| a.instances).sum();
    // What we raised is no extra: a replacement for a master at risk or
    // warned, launched while it still runs.
    let ordered: i32 = s.status.raised.iter().map(|r| r.count).sum();
    s.input.group.role == Role::Master && total_instances > s.input.group.desired + ordered
}

/// The instance to remove and why: a recorded cleanup whose instance is
/// still there, else one overdue, else (masters) one beyond the configured
/// count; only in an ASG whose backoff has passed.
fn candidate<'a>(s: &Deciding<'a>) -> Option<(&'a NotJoinedView, String)> {
    let input = s.input;
    let now = input.group.now;
    let extra_master = extra_master(s);
    let due = |n: &&NotJoinedView| {
        input.active.contains(&n.instance_id)
            && s.status
                .removals
                .iter()
                .find(|r| r.auto_scaling_group == n.asg)
                .is_none_or(|r| now >= r.retry_after)
    };
    // A recorded removal is retried before any other starts (its record,
    // and what it took from the layout, would be overwritten).
    if let Some(c) = &s.status.cleanup
        && let Some(n) = input
            .not_joined
            .iter()
            .find(|n| n.instance_id == c.instance_id)
        && input.active.contains(&n.instance_id)
    {
        return due(&n).then(|| (n, c.reason.clone()));
    }
    input.not_joined.iter().filter(due).find_map(|n| {
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
                format!("extra master beyond the configured {}", input.group.desired),
            ))
        } else {
            None
        }
    })
}
