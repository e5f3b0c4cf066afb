//! Interrupted nodes (a notice the interruption handler recorded on the
//! node): replaced before their loss, then removed by us so that exactly one
//! new instance comes per lost one.
//!
//! - A reclaimed node (spot interruption, scheduled change) gets its
//!   replacement at once (in `scale_up`, its own ASG first), and is
//!   terminated here once drained or at its deadline, before AWS takes it:
//!   with decrement when the replacement was raised in its own ASG (the
//!   raise is taken back, the layout stays), else without (its ASG launches
//!   one in its place once it can; the other ASG's raise is surplus that the
//!   scale-in takes back).
//! - An at-risk node (rebalance recommendation, `Replace`) is removed like a
//!   surplus node once its replacement is Ready.
//!
//! Only a node we replaced is ever terminated here: without a replacement
//! (no ASG could launch), AWS takes it at its time and its ASG replaces it.

use super::records::{add_raised, count_of};
use crate::controllers::group_view::after;
use crate::crd::Role;

/// How long after its deadline a reclaimed node we replaced is terminated
/// even if the end of its drain was never recorded.
pub(super) const RETIRE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
use super::queries::{authority_for, leaves_through_us, replacement};
use super::scale_in::{PROTECTED_RETRY, start_scale_in, wait_for_slot};
use super::{Command, Deciding, Plan};
use crate::controllers::authority::Reason;
use crate::controllers::group_view::{Fate, GroupNode, SOON};
use crate::crd::replenisher::{Replacement, ReplenishPhase, Retirement, ScaleInTarget};
use std::collections::BTreeMap;

/// Recorded terminations of interrupted instances go on; reclaimed nodes
/// we replaced are terminated once drained with their replacement launched,
/// or at their deadline.
pub(super) fn retire(s: &Deciding) -> Option<Plan> {
    if !s.status.retiring.is_empty() {
        let names: Vec<&str> = s.status.retiring.iter().map(|r| r.node.as_str()).collect();
        return Some(s.act(
            s.status.clone(),
            ReplenishPhase::ScalingDown,
            Command::Retire(s.status.retiring.clone()),
            format!("terminating interrupted {} (recorded)", names.join(", ")),
        ));
    }
    let now = s.input.group.now;
    let scale_in = s.status.scale_in.as_ref().map(|t| t.instance_id.as_str());
    // Due once the drain has ended (drained, or its end recorded at the
    // deadline with what was left) and either the deadline has come or the
    // replacement is launched (its ASG no longer behind, or Ready back at
    // desired without it). Waiting for the drain's record keeps its report
    // (the pods left); should it never come, a grace after the deadline.
    let restored = s.ready >= s.input.group.desired;
    let due = |n: &GroupNode, r: &Replacement| match n.fate {
        Some(Fate::Reclaimed { deadline, drained }) => {
            now >= after(deadline, RETIRE_GRACE)
                || (drained
                    && (now >= deadline
                        || restored
                        || s.asg(&r.auto_scaling_group).is_some_and(|a| !a.is_behind())))
        }
        _ => false,
    };
    let due: Vec<(&GroupNode, &Replacement)> = s
        .input
        .group
        .nodes
        .iter()
        .filter(|n| leaves_through_us(s, n) && n.instance_id.as_deref() != scale_in)
        .filter_map(|n| Some((n, replacement(s, n)?)))
        .filter(|(n, r)| due(n, r))
        // A master leaves before AWS takes it only while the other masters
        // are up: else AWS takes it at its time, and nothing is ours.
        .filter(|(n, _)| authority_for(s, Reason::Retirement, n).is_ok())
        .collect();
    if due.is_empty() {
        return None;
    }
    let mut status = s.status.clone();
    let mut lowered: BTreeMap<&str, i32> = BTreeMap::new();
    for (node, replaced) in due {
        let (Some(own), Some(instance_id)) = (node.asg.as_deref(), node.instance_id.clone()) else {
            continue;
        };
        let lower = lowered.entry(own).or_default();
        let desired_before = s.asg(own).map(|a| a.desired - *lower);
        let decrement = replaced.auto_scaling_group == own
            && s.asg(own).is_some_and(|a| a.desired - *lower > a.min);
        if decrement {
            *lower += 1;
            add_raised(&mut status, own, -1);
        }
        status.retiring.push(Retirement {
            node: node.name.clone(),
            instance_id,
            auto_scaling_group: own.to_string(),
            decrement,
            since: now,
            desired_before: desired_before.filter(|_| decrement),
        });
    }
    status.last_modification = Some(now);
    let names: Vec<&str> = status.retiring.iter().map(|r| r.node.as_str()).collect();
    let message = format!(
        "terminating interrupted {} (drained or at the deadline; replaced)",
        names.join(", ")
    );
    let retiring = status.retiring.clone();
    Some(s.act(
        status,
        ReplenishPhase::ScalingDown,
        Command::Retire(retiring),
        message,
    ))
}

/// An at-risk node whose replacement is Ready is removed like a surplus
/// node: drained, then terminated (with decrement when replaced in its own
/// ASG). The cooldown does not apply: this is the second half of one step.
pub(super) fn remove_at_risk(s: &Deciding) -> Option<Plan> {
    // Outside the maintenance windows it stays (`at_risk_kept` says so);
    // AWS may still take it, which is then an interruption like any other.
    if s.status.scale_in.is_some()
        || s.ready < s.input.group.desired
        || !s.window(Reason::AtRisk).is_open()
    {
        return None;
    }
    let (node, replaced) = at_risk_replaced(s)?;
    if s.protected(Reason::AtRisk).contains_key(&node.name)
        || authority_for(s, Reason::AtRisk, node).is_err()
    {
        return None;
    }
    let own = node.asg.clone()?;
    // Replaced in its own ASG, or (nothing recorded) that ASG holds a raise
    // of ours: the decrement takes it back. Otherwise its ASG relaunches.
    let raised_own = count_of(&s.status.raised, &own) > 0;
    let in_own = match replaced {
        // A master's ASG is never left below its count (masters launch
        // nowhere else): its raise already taken back (its replacement
        // went first, at risk itself), it relaunches in place.
        Some(r) if s.input.group.role == Role::Master => r.auto_scaling_group == own && raised_own,
        Some(r) => r.auto_scaling_group == own,
        None => raised_own,
    };
    let target = ScaleInTarget {
        node: node.name.clone(),
        instance_id: node.instance_id.clone()?,
        decrement: in_own && s.asg(&own).is_some_and(|a| a.desired > a.min),
        auto_scaling_group: own,
        since: s.input.group.now,
        terminating: None,
        repair: false,
        reason: Some(Reason::AtRisk.label().into()),
    };
    let message = format!(
        "{} at risk of interruption, its replacement Ready: removing it from {}",
        target.node, target.auto_scaling_group
    );
    if let Some(plan) = wait_for_slot(s, Reason::AtRisk, &message) {
        return Some(plan);
    }
    Some(start_scale_in(s, target, message))
}

/// The first node at risk that is replaced: by the replacement we launched
/// for it (with it), or, nothing recorded, by Ready nodes enough without it
/// (a surplus was there when the recommendation came, or no ASG could
/// launch then): it need not serve on until its mark is old.
fn at_risk_replaced<'s>(s: &'s Deciding) -> Option<(&'s GroupNode, Option<&'s Replacement>)> {
    let serving = s
        .input
        .group
        .nodes
        .iter()
        .filter(|n| n.ready && n.fate.is_none());
    let covered = serving.count() as i32 >= s.input.group.desired;
    s.input
        .group
        .nodes
        .iter()
        .filter(|n| n.fate == Some(Fate::AtRisk) && leaves_through_us(s, n))
        .filter_map(|n| match replacement(s, n) {
            Some(r) => Some((n, Some(r))),
            None => covered.then_some((n, None)),
        })
        .min_by(|a, b| a.0.name.cmp(&b.0.name))
}

/// Nothing else to do, a node at risk replaced and kept (every window
/// closed, or it is protected): say so, and until when.
pub(super) fn at_risk_kept(s: &Deciding) -> Option<Plan> {
    let (node, _) = at_risk_replaced(s)?;
    let window = s.window(Reason::AtRisk);
    let (why, requeue) = match s.protected(Reason::AtRisk).get(&node.name) {
        Some(why) => (format!("protected: {why}"), PROTECTED_RETRY),
        None => match authority_for(s, Reason::AtRisk, node) {
            // A master, while the others are not all up.
            Err(blocked) => (format!("refusing to {blocked}"), SOON),
            Ok(()) => (
                window.closed_reason()?,
                window.recheck_in(s.input.group.now),
            ),
        },
    };
    Some(s.wait_on_time(
        format!(
            "{} at risk of interruption, replaced, kept: {why}",
            node.name
        ),
        requeue,
    ))
}
