//! Records of earlier actions, kept in the status: settled against what is
//! observed (a raise or termination a restart interrupted), the ASGs judged
//! with what this replenisher remembers, exclusions, and the record each
//! action writes before it is made.

use super::{Input, exclusion_backoff};
use crate::controllers::group_view::{AsgView, DesiredChange, after};
use crate::crd::replenisher::{
    AsgCount, AsgSince, ExcludedAsg, LastAction, Raise, ReplenisherStatus, Retirement,
    ScaleInTarget,
};
use chrono::{DateTime, Utc};

/// Earlier actions' records against what is observed now: a raise that a
/// restart interrupted (landed or not), a cleanup or scale-in termination that
/// is done, a run of never-joined removals that ended with a node joining.
/// A surplus the refresher left (a failed run that could not remove it
/// while keeping the Ready count, a run set aside) becomes a raise of
/// ours, once: the scale-in takes it back and the layout is restored
/// against it, as for a raise we made. Without it, a removal of ours with
/// decrement elsewhere would leave one ASG above its count and another
/// below for good.
pub(super) fn take_over_surplus(input: &Input, status: &mut ReplenisherStatus) {
    let Some(left) = input.surplus_left else {
        return;
    };
    if status.taken_over.is_some_and(|t| t >= left.at) {
        return;
    }
    for asg in &left.asgs {
        add_raised(status, &asg.auto_scaling_group, asg.count);
    }
    status.taken_over = Some(left.at);
}

pub(super) fn settle_records(input: &Input, status: &mut ReplenisherStatus) {
    for raise in std::mem::take(&mut status.raising) {
        let landed = input
            .group
            .asgs
            .iter()
            .find(|a| a.name == raise.auto_scaling_group)
            .is_some_and(|a| a.desired >= raise.to);
        if !landed {
            forget_raise(status, &raise);
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
    // A removal recorded and never made, its instance joined since: what it
    // took from the layout is given back.
    if let Some(cleanup) = status.cleanup.clone()
        && input.group.node_of(&cleanup.instance_id).is_some()
    {
        if cleanup.decrement {
            add_raised(status, &cleanup.auto_scaling_group, 1);
        }
        status.cleanup = None;
    }
    if let Some(target) = status.scale_in.clone()
        && target.terminating.is_some()
        && !input.active.contains(&target.instance_id)
    {
        finish_scale_in(status, &target);
    }
    // Interrupted instances that are gone: by our termination, or by AWS's
    // first (its ASG then replaced it; a raise made for it is surplus that
    // the scale-in takes back).
    let gone: Vec<&Retirement> = status
        .retiring
        .iter()
        .filter(|r| !input.active.contains(&r.instance_id))
        .collect();
    // AWS's first when its ASG's count never went down: the raise the
    // decrement was to take back is still there (a surplus, taken back by
    // the scale-in).
    let not_decremented: Vec<String> = gone
        .iter()
        .filter(|r| {
            let now_desired = input.group.asg(&r.auto_scaling_group).map(|a| a.desired);
            r.decrement && r.desired_before.is_some_and(|b| now_desired >= Some(b))
        })
        .map(|r| r.auto_scaling_group.clone())
        .collect();
    let gone: Vec<String> = gone.iter().map(|r| r.instance_id.clone()).collect();
    for asg in not_decremented {
        add_raised(status, &asg, 1);
    }
    finish_retiring(status, &gone);
    // A replacement is forgotten once its node is gone, or Ready again (an
    // unhealthy node that recovered: what was raised for it is surplus).
    status.replacing.retain(|r| {
        input.active.contains(&r.instance_id)
            && !input
                .group
                .nodes
                .iter()
                .any(|n| n.ready && n.instance_id.as_deref() == Some(r.instance_id.as_str()))
    });
    // A removal run ends once a node of that ASG launched after it is Ready.
    status.removals.retain(|r| {
        !input.group.nodes.iter().any(|n| {
            n.ready
                && n.asg.as_deref() == Some(r.auto_scaling_group.as_str())
                && n.launch_time.is_some_and(|t| t > r.last)
        })
    });
}

/// The ASGs judged with the earliest moment anyone saw them behind (this
/// replenisher's memory or the inventory's), remembered for next time.
pub(super) fn judge(input: &Input, status: &mut ReplenisherStatus) -> Vec<AsgView> {
    let mut behind = vec![];
    let asgs = input
        .group
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
            let judged = a.clone().judge(remembered, input.group.now);
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

/// ASGs that are not launching are left out of scale-up and re-checked after
/// a backoff that grows while they keep failing.
pub(super) fn update_exclusions(
    status: &mut ReplenisherStatus,
    asgs: &[AsgView],
    now: DateTime<Utc>,
) {
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
                retry_after: Some(after(now, exclusion_backoff(1))),
                failures: 1,
            }),
            (false, Some(i)) => {
                let e = &mut status.excluded[i];
                if e.retry_after.is_none_or(|t| now >= t) {
                    e.failures += 1;
                    e.retry_after = Some(after(now, exclusion_backoff(e.failures)));
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
pub(super) fn record_raise(
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
        forget_raise(status, &raise);
    }
}

/// A raise that was never made: its count taken back, and the replacements
/// recorded with it (same ASG, same instant) forgotten, so the nodes they
/// stood for are not taken for replaced (a node at risk removed with
/// decrement for a replacement that never came would leave its ASG short).
fn forget_raise(status: &mut ReplenisherStatus, raise: &Raise) {
    add_raised(status, &raise.auto_scaling_group, raise.from - raise.to);
    let at = status.last_modification;
    status
        .replacing
        .retain(|r| r.auto_scaling_group != raise.auto_scaling_group || Some(r.since) != at);
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
        if target.decrement {
            let asg = target.auto_scaling_group.clone();
            add_raised(status, &asg, -1);
        }
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

/// The recorded terminations of interrupted instances are done.
pub fn finish_retiring(status: &mut ReplenisherStatus, done: &[String]) {
    let (finished, left): (Vec<_>, Vec<_>) = std::mem::take(&mut status.retiring)
        .into_iter()
        .partition(|r| done.contains(&r.instance_id));
    status.retiring = left;
    if let Some(r) = finished.last() {
        status.last_action = Some(LastAction {
            description: format!(
                "removed interrupted {} ({}) from {}{}",
                r.node,
                r.instance_id,
                r.auto_scaling_group,
                if r.decrement {
                    ", taking back the raise made for its replacement"
                } else {
                    ", which launches its replacement"
                }
            ),
            time: r.since,
        });
    }
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
        if target.terminating.is_some() && target.decrement {
            add_raised(status, &target.auto_scaling_group, 1);
        }
        status.last_modification = Some(now);
        status.last_action = Some(LastAction {
            description: format!("kept {}: {reason}", target.node),
            time: now,
        });
    }
}

/// Moves `asg`'s count away from the original layout by `delta` (a raise:
/// up; a removal with decrement: down), kept as `raised` above it or
/// `lowered` below it (never both for one ASG).
pub(super) fn add_raised(status: &mut ReplenisherStatus, asg: &str, delta: i32) {
    let off = count_of(&status.raised, asg) - count_of(&status.lowered, asg) + delta;
    set_count(&mut status.raised, asg, off.max(0));
    set_count(&mut status.lowered, asg, (-off).max(0));
}

/// `asg`'s count in `raised` or `lowered` (0 when absent).
pub(super) fn count_of(list: &[AsgCount], asg: &str) -> i32 {
    list.iter()
        .find(|r| r.auto_scaling_group == asg)
        .map_or(0, |r| r.count)
}

fn set_count(list: &mut Vec<AsgCount>, asg: &str, count: i32) {
    match list.iter_mut().find(|r| r.auto_scaling_group == asg) {
        Some(r) => r.count = count,
        None => list.push(AsgCount {
            auto_scaling_group: asg.to_string(),
            count,
        }),
    }
    list.retain(|r| r.count > 0);
}
