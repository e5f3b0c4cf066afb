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
//!   replaces it), and only while every other master is Ready.
//!
//! The circuit breaker (too much of the group NotReady) stops all of it:
//! `breaker` runs before these stages.

use super::queries::{raise_candidates, replacement, unhealthy};
use super::scale_in::start_scale_in;
use super::{Plan, Stage};
use crate::controllers::group_view::GroupNode;
use crate::crd::Role;
use crate::crd::replenisher::ScaleInTarget;

/// Before any raise: an unhealthy master, or an unhealthy worker no ASG can
/// replace, is repaired in place (terminated without decrement).
pub(super) fn repair_in_place(s: &Stage) -> Option<Plan> {
    if !s.input.group.repair || s.status.scale_in.is_some() {
        return None;
    }
    let node = match s.input.group.role {
        Role::Master => unhealthy(s).into_iter().find(|n| others_ready(s, n))?,
        Role::Worker => {
            if s.ready >= s.input.group.desired || !raise_candidates(s).is_empty() {
                return None;
            }
            unhealthy(s)
                .into_iter()
                .find(|n| replacement(s, n).is_none())?
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
    Some(start_scale_in(s, target, message))
}

/// Once Ready is back at desired: an unhealthy worker (replaced, or not
/// needed) is drained and terminated, with decrement in its own ASG when
/// its replacement was raised there (or none was needed).
pub(super) fn repair_replaced(s: &Stage) -> Option<Plan> {
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

/// Every node of the group but `node` is Ready (a master repair's rule:
/// never two masters down at once by our hand).
fn others_ready(s: &Stage, node: &GroupNode) -> bool {
    s.input
        .group
        .nodes
        .iter()
        .filter(|n| n.name != node.name)
        .all(|n| n.ready)
}

fn target(s: &Stage, node: &GroupNode, decrement: bool) -> Option<ScaleInTarget> {
    Some(ScaleInTarget {
        node: node.name.clone(),
        instance_id: node.instance_id.clone()?,
        auto_scaling_group: node.asg.clone()?,
        since: s.input.group.now,
        terminating: None,
        decrement,
        repair: true,
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

/// Why unhealthy nodes are not being repaired now, if any wait.
pub(super) fn repair_held(s: &Stage) -> Option<RepairHeld> {
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
    if let Some(why) = &group.breaker {
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
    if group.role == Role::Master && s.status.scale_in.is_none() && !others_ready(s, first) {
        return held(
            "OtherMastersNotReady",
            format!(
                "not repairing {nodes}: a master is repaired only while every other master is Ready"
            ),
        );
    }
    None
}
