//! Questions the stages share about the observed group, below every stage
//! (no stage imports another's helpers).

use super::Stage;
use crate::controllers::group_view::{AsgView, Fate, GroupNode};
use crate::crd::Role;
use crate::crd::replenisher::Replacement;

/// Ready nodes of one ASG.
pub(super) fn ready_in(nodes: &[GroupNode], asg: &str) -> i32 {
    nodes
        .iter()
        .filter(|n| n.ready && n.asg.as_deref() == Some(asg))
        .count() as i32
}

/// A node that leaves through us (reclaimed, at risk, or an unhealthy
/// worker to repair), still running in its ASG: capacity its ASG will not
/// bring back by itself.
pub(super) fn leaves_through_us(s: &Stage, n: &GroupNode) -> bool {
    (matches!(n.fate, Some(Fate::Reclaimed { .. } | Fate::AtRisk)) || repaired_worker(s, n))
        && n.asg.is_some()
        && n.instance_id
            .as_ref()
            .is_some_and(|id| s.input.active.contains(id))
}

/// An unhealthy worker that repair replaces first, then removes.
pub(super) fn repaired_worker(s: &Stage, n: &GroupNode) -> bool {
    let group = &s.input.group;
    group.repair && group.role == Role::Worker && group.unhealthy(n)
}

/// Unhealthy nodes still in service in their ASG (repair on or off), by name.
pub(super) fn unhealthy<'a>(s: &'a Stage) -> Vec<&'a GroupNode> {
    let mut nodes: Vec<&GroupNode> = s
        .input
        .group
        .nodes
        .iter()
        .filter(|n| s.input.group.unhealthy(n) && n.asg.is_some())
        .filter(|n| {
            n.instance_id
                .as_ref()
                .is_some_and(|id| s.input.active.contains(id))
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes
}

/// The ASGs a raise may go to now: launching, not excluded, below max, and
/// not in a run of instances that never join.
pub(super) fn raise_candidates(s: &Stage) -> Vec<AsgView> {
    let not_joining = |a: &&AsgView| {
        s.status
            .removals
            .iter()
            .any(|r| r.auto_scaling_group == a.name)
    };
    s.asgs
        .iter()
        .filter(|a| a.launching && !s.excluded(&a.name))
        .filter(|a| a.desired < a.max && !not_joining(a))
        .cloned()
        .collect()
}

/// The replacement recorded for `node`'s instance.
pub(super) fn replacement<'a>(s: &'a Stage, node: &GroupNode) -> Option<&'a Replacement> {
    let id = node.instance_id.as_deref()?;
    s.status.replacing.iter().find(|r| r.instance_id == id)
}

/// Nodes leaving through us with no replacement yet, by name.
pub(super) fn unreplaced<'a>(s: &'a Stage) -> Vec<&'a GroupNode> {
    let mut nodes: Vec<&GroupNode> = s
        .input
        .group
        .nodes
        .iter()
        .filter(|n| leaves_through_us(s, n) && replacement(s, n).is_none())
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes
}

/// The record of a replacement raised in `asg` for `node`.
pub(super) fn replacement_in(s: &Stage, node: &GroupNode, asg: &str) -> Replacement {
    Replacement {
        node: node.name.clone(),
        instance_id: node.instance_id.clone().unwrap_or_default(),
        auto_scaling_group: asg.to_string(),
        since: s.input.group.now,
    }
}
