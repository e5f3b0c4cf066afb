//! The on-demand fallback (`spec.fallback`, workers): raised by the missing
//! count once every spot ASG has been short for `after`, never while one
//! can launch; and the return to spot, one fallback node at a time once a
//! spot ASG has launched for `returnAfter`: a spot node raised and Ready
//! first, then the fallback node drained and terminated with decrement, as
//! any voluntary removal (a window, do-not-disrupt, a disruption slot).
//! Fallback nodes are found by their ASG, never by a record: a restart
//! forgets none.

use super::queries::{changes_from, on_the_way, spread, spread_over};
use super::records::record_raise;
use super::scale_in::{PROTECTED_RETRY, start_scale_in, wait_for_slot};
use super::{Command, Deciding, Plan};
use crate::controllers::authority::Reason;
use crate::controllers::group_view::{AsgView, DesiredChange, GroupNode, IDLE, after, until};
use crate::crd::Role;
use crate::crd::replenisher::{AsgSince, ReplenishPhase, ScaleInTarget};
use chrono::{DateTime, Utc};

/// The clocks the fallback decides on, from this observation: since when
/// every spot ASG is short (Ready below desired, none able to launch), and
/// since when each spot ASG able to launch has been so (a failure restarts
/// it). Nothing without `spec.fallback`.
pub(super) fn clocks(s: &Deciding) -> (Option<DateTime<Utc>>, Vec<AsgSince>) {
    if s.input.fallback.is_none() || s.input.group.role != Role::Worker {
        return (None, vec![]);
    }
    let now = s.input.group.now;
    // Launching by its own description (an ASG the raises still back off
    // from counts: the return's hysteresis is `returnAfter`, not that). At
    // its max too: a kops instance group with min = max relaunches its lost
    // node by itself, and that relaunch is the return (the fallback node is
    // then a surplus).
    let launching: Vec<AsgSince> = s
        .asgs
        .iter()
        .filter(|a| !a.fallback && a.launching)
        .map(|a| AsgSince {
            auto_scaling_group: a.name.clone(),
            since: s
                .status
                .spot_launching
                .iter()
                .find(|l| l.auto_scaling_group == a.name)
                .map_or(now, |l| l.since),
        })
        .collect();
    // Any spot ASG launching counts, at its max too (that is the user's
    // limit, not a shortage), and one whose raises still back off after
    // failed launches: it launches again, so an on-demand node raised now
    // would be one too many once it does (the guard refuses it too).
    let spot_can = s.asgs.iter().any(|a| !a.fallback && a.launching);
    let short = s.ready < s.input.group.desired && !spot_can;
    let short_since = short.then(|| s.status.short_since.unwrap_or(now));
    (short_since, launching)
}

/// Ready is short and no spot ASG can launch: the fallback, once short for
/// `after`, by what is missing (what is on its way counted once, the
/// fallback's own too). None without `spec.fallback`.
pub(super) fn fall_back(s: &Deciding, deficit: i32) -> Option<Plan> {
    let settings = s.input.fallback?;
    let input = s.input;
    if input.group.role != Role::Worker {
        return None;
    }
    let now = input.group.now;
    let since = s.status.short_since?;
    let due = after(since, settings.after);
    let (ready, desired) = (s.ready, input.group.desired);
    if now < due {
        return Some(s.wait_on_time(
            format!(
                "{ready}/{desired} Ready and no spot ASG can launch: falling back to on-demand at {}",
                due.to_rfc3339()
            ),
            until(now, due),
        ));
    }
    let mut candidates: Vec<AsgView> = s
        .asgs
        .iter()
        .filter(|a| a.fallback && a.launching && !s.excluded(&a.name) && a.desired < a.max)
        .cloned()
        .collect();
    let added = spread_over(&mut candidates, deficit);
    if added == 0 {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            format!(
                "{ready}/{desired} Ready, no spot ASG can launch, and no fallback ASG can (not launching, backing off, or at max)"
            ),
        ));
    }
    let changes = changes_from(s, &candidates);
    let message = format!(
        "{ready}/{desired} Ready and every spot ASG short since {}: falling back to on-demand, adding {added} on {}",
        since.to_rfc3339(),
        changes
            .iter()
            .map(|c| format!("{} {}->{}", c.asg, c.from, c.to))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut status = s.status.clone();
    record_raise(&mut status, &changes, now, message.clone());
    Some(s.act(
        status,
        ReplenishPhase::ScalingUp,
        Command::SetDesired(changes),
        message,
    ))
}

/// The Ready nodes on the fallback, by name.
pub(super) fn on_fallback<'a>(s: &Deciding<'a>) -> Vec<&'a GroupNode> {
    let fallback = |n: &&GroupNode| {
        s.asgs
            .iter()
            .any(|a| a.fallback && n.asg.as_deref() == Some(a.name.as_str()))
    };
    let mut nodes: Vec<&GroupNode> = s
        .input
        .group
        .nodes
        .iter()
        .filter(|n| n.ready && n.instance_id.is_some())
        .filter(fallback)
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes
}

/// When the spot ASGs able to launch may take a fallback node's place: the
/// soonest of their clocks plus `returnAfter`.
pub(super) fn spot_due<'s>(s: &'s Deciding) -> Vec<(DateTime<Utc>, &'s AsgView)> {
    let Some(settings) = s.input.fallback else {
        return vec![];
    };
    s.asgs
        .iter()
        .filter(|a| !a.fallback)
        .filter_map(|a| {
            let since = s
                .status
                .spot_launching
                .iter()
                .find(|l| l.auto_scaling_group == a.name)?
                .since;
            Some((after(since, settings.return_after), a))
        })
        .collect()
}

/// Nodes on the fallback: back to spot once a spot ASG has launched for
/// `returnAfter`, one at a time, replacement first; until then they stay
/// (and a spot surplus with them: it takes a fallback node's place then).
pub(super) fn return_to_spot(s: &Deciding) -> Option<Plan> {
    let settings = s.input.fallback?;
    let nodes = on_fallback(s);
    let first = nodes.first()?;
    let input = s.input;
    let now = input.group.now;
    let (ready, desired) = (s.ready, input.group.desired);
    let clocks = spot_due(s);
    let due: Vec<&AsgView> = clocks
        .iter()
        .filter(|(t, _)| now >= *t)
        .map(|(_, a)| *a)
        .collect();
    if due.is_empty() {
        let next = clocks.iter().map(|(t, _)| *t).min();
        return Some(s.wait_on_time(
            format!(
                "{} node(s) on the on-demand fallback: back to spot once a spot ASG has launched for {}",
                nodes.len(),
                crate::duration::format(settings.return_after)
            ),
            next.map_or(IDLE, |t| until(now, t).min(IDLE)),
        ));
    }
    if ready <= desired {
        return replacement_first(s, &due, first);
    }
    // A spot replacement is Ready: the fallback node goes, as a voluntary
    // removal.
    let window = s.window(Reason::FallbackReturn);
    if let Some(why) = window.closed_reason() {
        return Some(s.wait_on_time(
            format!("{} stays on the on-demand fallback: {why}", first.name),
            window.recheck_in(now),
        ));
    }
    let protected = s.protected(Reason::FallbackReturn);
    let Some(node) = nodes.iter().find(|n| !protected.contains_key(&n.name)) else {
        return Some(s.wait_on_time(
            format!(
                "the on-demand fallback's nodes are protected: {}",
                nodes
                    .iter()
                    .filter_map(|n| Some(format!("{} ({})", n.name, protected.get(&n.name)?)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            PROTECTED_RETRY,
        ));
    };
    let asg = s.asg(node.asg.as_deref()?)?;
    let target = ScaleInTarget {
        node: node.name.clone(),
        instance_id: node.instance_id.clone()?,
        auto_scaling_group: asg.name.clone(),
        since: now,
        terminating: None,
        decrement: asg.desired > asg.min,
        repair: false,
        reason: Some(Reason::FallbackReturn.label().into()),
    };
    let message = format!(
        "{ready}/{desired} Ready, spot launching again: returning {} from the on-demand {}",
        target.node, target.auto_scaling_group
    );
    if let Some(plan) = wait_for_slot(s, Reason::FallbackReturn, &message) {
        return Some(plan);
    }
    Some(start_scale_in(s, target, message))
}

/// Ready at desired with a fallback node to return: its spot replacement
/// first, in a spot ASG that has launched for `returnAfter`, one at a time.
fn replacement_first(s: &Deciding, due: &[&AsgView], node: &GroupNode) -> Option<Plan> {
    let coming: i32 = s
        .asgs
        .iter()
        .filter(|a| !a.fallback && a.launching && !s.excluded(&a.name))
        .map(|a| on_the_way(s, a))
        .sum();
    if coming > 0 {
        return Some(s.coming(
            format!("a spot node is on its way to replace {}", node.name),
            super::SOON,
        ));
    }
    if let Some(left) = s.cooldown_left() {
        return Some(s.wait_on_time(
            format!("cooldown before replacing {} with spot", node.name),
            left,
        ));
    }
    let mut candidates: Vec<AsgView> = due
        .iter()
        .filter(|a| a.launching && a.desired < a.max)
        .map(|a| (*a).clone())
        .collect();
    let i = spread(&candidates)?;
    let from = candidates[i].desired;
    candidates[i].desired += 1;
    let change = DesiredChange {
        asg: candidates[i].name.clone(),
        from,
        to: from + 1,
    };
    let message = format!(
        "{}/{} Ready: adding 1 on {} {}->{} to replace {} from the on-demand fallback",
        s.ready, s.input.group.desired, change.asg, change.from, change.to, node.name
    );
    let mut status = s.status.clone();
    record_raise(
        &mut status,
        std::slice::from_ref(&change),
        s.input.group.now,
        message.clone(),
    );
    Some(s.act(
        status,
        ReplenishPhase::ScalingUp,
        Command::SetDesired(vec![change]),
        message,
    ))
}
