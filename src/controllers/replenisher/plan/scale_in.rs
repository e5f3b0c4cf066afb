//! Stage 2 and the last stage: a scale-in in progress goes on or is
//! abandoned; too many Ready nodes (after a shortage, the raise taken back)
//! start a scale-in of one chosen node.

use super::queries::{ready_in, reason_of};
use super::{Batch, Command, Deciding, Plan, SCALE_IN_DRAIN_TIMEOUT};
use crate::controllers::authority::Reason;
use crate::controllers::authority::rules::{self, Rule};
use crate::controllers::group_view::GroupNode;
use crate::controllers::group_view::after;
use crate::crd::replenisher::{ReplenishPhase, ScaleInTarget};
use std::time::Duration;

/// A scale-in in progress goes on (drain, then the recorded termination), or
/// is abandoned.
pub(super) fn scale_in_in_progress(s: &Deciding) -> Option<Plan> {
    let mut target = s.status.scale_in.clone()?;
    let input = s.input;
    let mut status = s.status.clone();
    if target.reason.is_none() {
        // Recorded before reasons were carried: decided now, kept.
        target.reason = Some(reason_of(s, &target).label().into());
        status.scale_in = Some(target.clone());
    }
    if s.asg(&target.auto_scaling_group).is_none() {
        // Its ASG left the spec (or `spec.fallback` went) mid-removal: the
        // instance is no longer ours to terminate, but its node still runs,
        // cordoned by us. Give it back.
        let reason = format!(
            "{} is no longer one of the group's ASGs",
            target.auto_scaling_group
        );
        let message = format!("keeping {}: {reason}", target.node);
        let command = Command::GiveBack { target, reason };
        return Some(s.act(status, ReplenishPhase::Waiting, command, message));
    }
    if !input.active.contains(&target.instance_id) {
        // Gone without us (e.g. a spot loss): nothing left to remove.
        status.scale_in = None;
        return Some(s.finish(
            status,
            ReplenishPhase::Waiting,
            Command::Nothing,
            format!("{} left its ASG by itself", target.node),
            Duration::ZERO,
        ));
    }
    let phase = match target.repair {
        true => ReplenishPhase::Repairing,
        false => ReplenishPhase::ScalingDown,
    };
    // A repair costs no Ready node and is not abandoned for want of one
    // (putting a dead node back in service would put pods on a dead
    // kubelet); it is given up when its node comes back, or when the
    // authority refuses it now (another master went down meanwhile).
    let abandon = if target.repair {
        super::queries::repair_given_up(s, &target)
    } else if target.terminating.is_none()
        && input.group.now >= after(target.since, SCALE_IN_DRAIN_TIMEOUT)
    {
        Some(format!("drain of {} timed out", target.node))
    } else {
        // The rule book, asked as the executor will ask it before the next
        // step. In hand while the slot it began with is still held; one
        // resumed after a stop gave the slot back (a suspend, a kops
        // rolling update, the breaker) begins again: its window, its
        // protection and a slot are asked anew (a free one the executor
        // takes), and it is given back, lock and slot with it, when any
        // refuses (chosen again once allowed).
        let in_hand = input.rules.holds_slot();
        match s.validate_removal(&target, in_hand) {
            Ok(()) => None,
            Err(refused) => Some(format!(
                "removal of {} put off: refusing to {refused}",
                target.node
            )),
        }
    };
    if let Some(reason) = abandon {
        let action = Command::GiveBack {
            target,
            reason: reason.clone(),
        };
        return Some(s.act(status, phase, action, reason));
    }
    if target.terminating.is_some() {
        let message = format!(
            "terminating {} in {} (recorded before a restart)",
            target.node, target.auto_scaling_group
        );
        return Some(s.act(status, phase, Command::Terminate(target), message));
    }
    let message = match target.repair {
        true => format!(
            "repairing {}: draining it (best effort) to remove it from {}",
            target.node, target.auto_scaling_group
        ),
        false => format!(
            "draining {} to remove it from {}",
            target.node, target.auto_scaling_group
        ),
    };
    Some(s.act(status, phase, Command::Drain(Batch::of(target)), message))
}

/// Why the masters' rule refuses the removal of `target` now, if it does
/// (a scale-in and a node at risk bind it alike).
fn masters_refuse(s: &Deciding, target: &ScaleInTarget) -> Option<String> {
    let node = s
        .input
        .group
        .nodes
        .iter()
        .find(|n| n.instance_id.as_deref() == Some(target.instance_id.as_str()))?;
    super::queries::authority_for(s, Reason::ScaleIn, node)
        .err()
        .map(|blocked| format!("removal of {} put off: refusing to {blocked}", target.node))
}

/// Too many Ready nodes (a shortage ended): take one back, explicitly chosen.
pub(super) fn scale_in(s: &Deciding) -> Option<Plan> {
    let input = s.input;
    if s.ready <= input.group.desired {
        return None;
    }
    let window = s.window(Reason::ScaleIn);
    if let Some(why) = window.closed_reason() {
        let requeue = window.recheck_in(input.group.now);
        return Some(s.wait_on_time(
            format!(
                "{} surplus node(s) kept: {why}",
                s.ready - input.group.desired
            ),
            requeue,
        ));
    }
    if let Some(left) = s.cooldown_left() {
        return Some(s.wait_on_time(
            format!(
                "cooldown before removing {} surplus node(s)",
                s.ready - input.group.desired
            ),
            left,
        ));
    }
    let Some(target) = choose_victim(s, true) else {
        if choose_victim(s, false).is_some() {
            return Some(s.wait_on_time(
                format!(
                    "{} surplus node(s) kept: {}",
                    s.ready - input.group.desired,
                    protected_surplus(s)
                ),
                PROTECTED_RETRY,
            ));
        }
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            "surplus nodes but no ASG can shrink (at min)".into(),
        ));
    };
    // A master the masters' rule refuses now (another down, or settling
    // after its replacement) is not begun: its first drain step would be
    // refused by the guard. Waiting holds neither the lock nor the slot.
    if let Some(why) = masters_refuse(s, &target) {
        let kept = s.ready - input.group.desired;
        return Some(s.wait_on_time(format!("{kept} surplus node(s) kept: {why}"), MASTERS_RETRY));
    }
    let message = format!(
        "{}/{} Ready: removing {} from {}",
        s.ready, input.group.desired, target.node, target.auto_scaling_group
    );
    if let Some(plan) = wait_for_slot(s, Reason::ScaleIn, &message) {
        return Some(plan);
    }
    Some(start_scale_in(s, target, message))
}

/// Records the target (before its first eviction) and drains it.
pub(super) fn start_scale_in(s: &Deciding, mut target: ScaleInTarget, message: String) -> Plan {
    // Its reason decided once, here, and carried to every step.
    let reason = reason_of(s, &target);
    target.reason = Some(reason.label().into());
    let mut status = s.status.clone();
    status.scale_in = Some(target.clone());
    let phase = match target.repair {
        true => ReplenishPhase::Repairing,
        false => ReplenishPhase::ScalingDown,
    };
    s.act(status, phase, Command::Drain(Batch::of(target)), message)
}

/// A master's removal the masters' rule refuses: looked at again this often
/// (a replacement's etcd joins, its settle ends).
const MASTERS_RETRY: Duration = Duration::from_secs(30);

/// Surplus kept because only protected nodes could go: looked at again this
/// often (a pod's annotation does not wake the replenisher).
pub(super) const PROTECTED_RETRY: Duration = Duration::from_secs(60);

/// The Ready nodes that are protected, and why, for a message.
pub(super) fn protected_surplus(s: &Deciding) -> String {
    let protected = s.protected(Reason::ScaleIn);
    let list: Vec<String> = s
        .input
        .group
        .nodes
        .iter()
        .filter(|n| n.ready)
        .filter_map(|n| Some(format!("{} ({})", n.name, protected.get(&n.name)?)))
        .collect();
    format!("the nodes that could go are protected: {}", list.join(", "))
}

/// The surplus node to remove: from an ASG we raised (so the original layout
/// comes back), else from the ASG with the most Ready nodes; the newest node.
/// Never from an ASG with launches in flight: it is still settling.
/// `spare_protected`: never a node protected from voluntary disruption
/// (another ASG's node goes instead, the layout then off by one).
pub(super) fn choose_victim(s: &Deciding, spare_protected: bool) -> Option<ScaleInTarget> {
    let input = s.input;
    let protected = s.protected(Reason::ScaleIn);
    let candidate = |n: &&GroupNode, asg: &str| {
        n.ready
            && n.asg.as_deref() == Some(asg)
            && n.instance_id.is_some()
            && !(spare_protected && protected.contains_key(&n.name))
    };
    let raised = |asg: &str| super::records::count_of(&s.status.raised, asg);
    let ready_in = |asg: &str| ready_in(input.group.nodes, asg);
    let takes = |asg: &str| input.group.nodes.iter().any(|n| candidate(&n, asg));
    let asg = s
        .asgs
        .iter()
        // A fallback node goes only by the return to spot.
        .filter(|a| a.desired > a.min && takes(&a.name) && !a.fallback)
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
        .group
        .nodes
        .iter()
        .filter(|n| candidate(n, &asg.name))
        .max_by(|a, b| (a.launch_time, &a.name).cmp(&(b.launch_time, &b.name)))?;
    Some(ScaleInTarget {
        node: node.name.clone(),
        instance_id: node.instance_id.clone()?,
        auto_scaling_group: asg.name.clone(),
        since: input.group.now,
        terminating: None,
        decrement: true,
        repair: false,
        reason: None,
    })
}

/// A removal waiting for a disruption slot asks again this often.
const SLOT_RETRY: Duration = Duration::from_secs(5);

/// A removal (`what`) for a reason the rule book binds to the slot waits,
/// rather than begins, while every disruption slot is held by others: the
/// executor would refuse its first step. Some(plan) while it waits. A free
/// slot is taken by the executor itself, before the first drain step.
pub(super) fn wait_for_slot(s: &Deciding, reason: Reason, what: &str) -> Option<Plan> {
    if !rules::binds(reason, Rule::Slot) {
        return None;
    }
    let why = s.input.rules.slots_full()?;
    // Waiting without the lock (the executor gives it back: nothing is
    // recorded): the slot's holder may be this group's refresher, waiting
    // for the lock (a hold-and-wait).
    let message = format!("{what}: waiting for a disruption slot: {why}");
    let status = s.status.clone();
    Some(s.finish(
        status,
        ReplenishPhase::Waiting,
        Command::Nothing,
        message,
        SLOT_RETRY,
    ))
}
