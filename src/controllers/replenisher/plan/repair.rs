//! Unhealthy nodes (Ready not True for longer than the unhealthy timeout):
//! repaired one at a time per group, through the one scale-in slot, with a
//! best-effort drain (a dead kubelet never confirms a pod's deletion).
//!
//! - A worker is replaced first: `scale_up` raises for it (its own ASG
//!   first) and records the replacement, as for an interrupted node. Once
//!   Ready is back at desired, it is drained and terminated, with decrement
//!   when its replacement was raised in its own ASG, so the layout comes
//!   back.
//! - A worker no ASG can launch a replacement for (every ASG at max or not
//!   launching: kops groups often have min = max) is terminated without
//!   decrement: its own ASG launches one in its place when it can.
//! - A master is never surged: terminated without decrement (its ASG
//!   replaces it), only while the disruption authority allows it (every
//!   other master of the cluster Ready, counted by instance across every
//!   Master group), and holding the manager-wide disruption slot.
//! - A repair whose node is Ready again before its termination, or that
//!   the authority refuses by then, is given up (`queries::repair_given_up`).
//!
//! A worker group's circuit breaker (too much of the group NotReady) stops
//! all of it: `breaker` runs before these stages. A Master group's breaker
//! does not: the authority counts the cluster's masters instead (one dead
//! master of a group of one is 100% of its group, one of three of the
//! cluster), and refuses while another master is down.

use super::queries::{authority, on_the_way, raise_candidates, replacement, unhealthy};
use super::scale_in::{start_scale_in, wait_for_slot};
use super::{Deciding, Plan};
use crate::controllers::authority::Reason;
use crate::controllers::group_view::GroupNode;
use crate::crd::Role;
use crate::crd::replenisher::ScaleInTarget;

/// Before any raise: an unhealthy master, or an unhealthy worker no ASG can
/// replace, is repaired in place (terminated without decrement).
pub(super) fn repair_in_place(s: &Deciding) -> Option<Plan> {
    if !s.input.group.repair || s.status.scale_in.is_some() {
        return None;
    }
    let node = match s.input.group.role {
        Role::Master => unhealthy(s).into_iter().find(|n| authority(s, n).is_ok())?,
        Role::Worker => {
            if s.ready >= s.input.group.desired || !raise_candidates(s).is_empty() {
                return None;
            }
            // A node whose replacement was raised waits for it, unless
            // nothing is on its way (the replacement died or never came):
            // its record then holds nothing, and the node is repaired too.
            let coming: i32 = s.asgs.iter().map(|a| on_the_way(s, a)).sum();
            let unhealthy = unhealthy(s);
            let first = unhealthy.iter().find(|n| replacement(s, n).is_none());
            *first.or_else(|| unhealthy.first().filter(|_| coming == 0))?
        }
    };
    let target = target(s, node, false)?;
    let message = match s.input.group.role {
        Role::Master => format!(
            "repairing master {}: NotReady for over {}; terminating it in {} (no decrement: its ASG replaces it)",
            target.node,
            crate::duration::format(s.input.group.unhealthy_timeout),
            target.auto_scaling_group
        ),
        Role::Worker => format!(
            "repairing {}: NotReady for over {} and no ASG can launch a replacement; terminating it in {} without decrement so its ASG replaces it",
            target.node,
            crate::duration::format(s.input.group.unhealthy_timeout),
            target.auto_scaling_group
        ),
    };
    // Whether a repair waits for a disruption slot is the rule book's
    // (today neither a master's nor a worker's does: a dead kubelet does
    // not wait, and the masters' rule serialises masters).
    let reason = Reason::repair(s.input.group.role);
    if let Some(plan) = wait_for_slot(s, reason, &message) {
        return Some(plan);
    }
    Some(start_scale_in(s, target, message))
}

/// Once Ready is back at desired: an unhealthy worker (replaced, or not
/// needed) is drained and terminated, with decrement in its own ASG when
/// its replacement was raised there (or none was needed).
pub(super) fn repair_replaced(s: &Deciding) -> Option<Plan> {
    let group = &s.input.group;
    if !group.repair
        || group.role != Role::Worker
        || s.status.scale_in.is_some()
        || s.ready < group.desired
    {
        return None;
    }
    let node = unhealthy(s).into_iter().next()?;
    let own = node.asg.as_deref()?;
    let in_own = replacement(s, node).is_none_or(|r| r.auto_scaling_group == own);
    let decrement = in_own && s.asg(own).is_some_and(|a| a.desired > a.min);
    let target = target(s, node, decrement)?;
    let message = format!(
        "repairing {}: NotReady for over {}, {}/{} Ready without it; removing it from {}{}",
        target.node,
        crate::duration::format(group.unhealthy_timeout),
        s.ready,
        group.desired,
        target.auto_scaling_group,
        if decrement { " with decrement" } else { "" }
    );
    Some(start_scale_in(s, target, message))
}

fn target(s: &Deciding, node: &GroupNode, decrement: bool) -> Option<ScaleInTarget> {
    Some(ScaleInTarget {
        node: node.name.clone(),
        instance_id: node.instance_id.clone()?,
        auto_scaling_group: node.asg.clone()?,
        since: s.input.group.now,
        terminating: None,
        decrement,
        repair: true,
        reason: Some(Reason::repair(s.input.group.role).label().into()),
    })
}

/// Unhealthy nodes that wait unrepaired, and why: the RepairAllowed
/// condition False.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairHeld {
    pub reason: &'static str,
    pub message: String,
    pub nodes: Vec<String>,
}

/// Why unhealthy nodes are not being repaired now, if any wait; first, a
/// master of this group whose control plane does not serve past its join
/// timeout (nothing the manager does brings it back, and every master
/// operation of the cluster waits on it): said by name, as the quorum at
/// risk.
pub(super) fn repair_held(s: &Deciding) -> Option<RepairHeld> {
    not_serving(s).or_else(|| unhealthy_held(s))
}

/// This group's masters whose Node is Ready and control plane not serving
/// past their join timeout.
fn not_serving(s: &Deciding) -> Option<RepairHeld> {
    let group = &s.input.group;
    let cp = group.control_plane?;
    let nodes: Vec<String> = cp
        .down
        .iter()
        .filter(|d| d.why == crate::controllers::authority::DownWhy::NotServing)
        .filter_map(|d| group.node_of(d.instance.as_deref()?))
        .map(|n| n.name.clone())
        .collect();
    if nodes.is_empty() {
        return None;
    }
    Some(RepairHeld {
        reason: "ControlPlaneQuorumAtRisk",
        message: format!(
            "master(s) {} do not serve: Node Ready, kops's control-plane pods (kube-apiserver, etcd-manager) missing or not Ready past joinTimeout; no master is taken away meanwhile: look at those nodes",
            nodes.join(", ")
        ),
        nodes,
    })
}

fn unhealthy_held(s: &Deciding) -> Option<RepairHeld> {
    let waiting: Vec<String> = unhealthy(s)
        .into_iter()
        .filter(|n| s.status.scale_in.as_ref().is_none_or(|t| t.node != n.name))
        .map(|n| n.name.clone())
        .collect();
    let first = waiting.first()?;
    let nodes = waiting.join(", ");
    let group = &s.input.group;
    let held = |reason, message| {
        Some(RepairHeld {
            reason,
            message,
            nodes: waiting.clone(),
        })
    };
    if let Some(why) = &group.breaker
        && group.role != Role::Master
    {
        return held(
            "CircuitBreakerOpen",
            format!("not repairing {nodes}: circuit breaker open: {why}"),
        );
    }
    if !group.repair {
        return held(
            "RepairDisabled",
            format!(
                "{nodes} NotReady past the unhealthy timeout; repair is off (replenish.repair)"
            ),
        );
    }
    let first = group.nodes.iter().find(|n| n.name == *first)?;
    if group.role == Role::Master
        && s.status.scale_in.is_none()
        && let Err(blocked) = authority(s, first)
    {
        return held(
            blocked.reason(),
            format!("not repairing {nodes}: refusing to {blocked}"),
        );
    }
    None
}
