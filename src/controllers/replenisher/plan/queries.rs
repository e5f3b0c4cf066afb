//! Questions the stages share about the observed group, below every stage
//! (no stage imports another's helpers).

use super::Deciding;
use crate::controllers::authority::validate::{Disruption, Floor, Refused, Scene, validate};
use crate::controllers::authority::{self, Blocked, Reason, Request};
use crate::controllers::group_view::{AsgView, DesiredChange, Fate, GroupNode};
use crate::crd::Role;
use crate::crd::replenisher::Replacement;
use crate::crd::replenisher::ScaleInTarget;

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
pub(super) fn leaves_through_us(s: &Deciding, n: &GroupNode) -> bool {
    (matches!(n.fate, Some(Fate::Reclaimed { .. } | Fate::AtRisk)) || repaired_worker(s, n))
        && n.asg.is_some()
        && n.instance_id
            .as_ref()
            .is_some_and(|id| s.input.active.contains(id))
}

/// An unhealthy worker that repair replaces first, then removes.
pub(super) fn repaired_worker(s: &Deciding, n: &GroupNode) -> bool {
    let group = &s.input.group;
    group.repair && group.role == Role::Worker && group.unhealthy(n)
}

/// Unhealthy nodes still in service in their ASG (repair on or off), by name.
pub(super) fn unhealthy<'a>(s: &'a Deciding) -> Vec<&'a GroupNode> {
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
/// not backing off after an instance that never joined. (Only during the
/// backoff: a run of removals ends when a node launched there joins, and
/// after a removal with decrement nothing launches there but a raise, so
/// an ASG held out for the whole run would be held out for good.)
pub(super) fn raise_candidates(s: &Deciding) -> Vec<AsgView> {
    let not_joining = |a: &&AsgView| {
        s.status
            .removals
            .iter()
            .any(|r| r.auto_scaling_group == a.name && s.input.group.now < r.retry_after)
    };
    s.asgs
        .iter()
        .filter(|a| a.launching && !s.excluded(&a.name) && !a.fallback)
        .filter(|a| a.desired < a.max && !not_joining(a))
        .cloned()
        .collect()
}

/// The replacement recorded for `node`'s instance.
pub(super) fn replacement<'a>(s: &'a Deciding, node: &GroupNode) -> Option<&'a Replacement> {
    let id = node.instance_id.as_deref()?;
    s.status.replacing.iter().find(|r| r.instance_id == id)
}

/// Nodes leaving through us with no replacement yet, by name.
pub(super) fn unreplaced<'a>(s: &'a Deciding) -> Vec<&'a GroupNode> {
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
pub(super) fn replacement_in(s: &Deciding, node: &GroupNode, asg: &str) -> Replacement {
    Replacement {
        node: node.name.clone(),
        instance_id: node.instance_id.clone().unwrap_or_default(),
        auto_scaling_group: asg.to_string(),
        since: s.input.group.now,
    }
}

/// The authority's answer for repairing `node` (a master: only while every
/// other master of the cluster is Ready, counted by instance).
pub(super) fn authority(s: &Deciding, node: &GroupNode) -> Result<(), Blocked> {
    authority_for(s, Reason::repair(s.input.group.role), node)
}

/// The authority's answer for taking `node` away for `reason`.
pub(super) fn authority_for(s: &Deciding, reason: Reason, node: &GroupNode) -> Result<(), Blocked> {
    let request = Request {
        reason,
        role: s.input.group.role,
        instance: node.instance_id.as_deref().unwrap_or_default(),
    };
    authority::decide(s.input.group.control_plane, &request)
}

/// Why `target` is removed: the reason it carries, decided when it was
/// chosen; one not carried yet (being chosen, or recorded before reasons
/// were carried) from what it is.
pub(super) fn reason_of(s: &Deciding, target: &ScaleInTarget) -> Reason {
    let carried = target.reason.as_deref().and_then(Reason::from_label);
    carried.unwrap_or_else(|| match target.repair {
        true => Reason::repair(s.input.group.role),
        false => removal_reason(s, target),
    })
}

/// Why the replenisher removes `target` (no repair), in the rule book's
/// terms: a node at risk, the on-demand fallback's node, or a surplus.
fn removal_reason(s: &Deciding, target: &ScaleInTarget) -> Reason {
    let at_risk = s
        .input
        .group
        .node_of(&target.instance_id)
        .is_some_and(|n| n.fate == Some(Fate::AtRisk));
    if at_risk {
        Reason::AtRisk
    } else if s
        .asg(&target.auto_scaling_group)
        .is_some_and(|a| a.fallback)
    {
        Reason::FallbackReturn
    } else {
        Reason::ScaleIn
    }
}

/// A repair under way that must not be finished: its node is no longer
/// unhealthy (Ready again, or leaving on an interruption notice), or the
/// authority refuses it now. Giving it up puts the node back in service
/// (a Ready one) and frees the group; what was raised for it is surplus
/// that the scale-in takes back. None: go on.
pub(super) fn repair_given_up(s: &Deciding, target: &ScaleInTarget) -> Option<String> {
    let node = s
        .input
        .group
        .nodes
        .iter()
        .find(|n| n.instance_id.as_deref() == Some(target.instance_id.as_str()))?;
    if node.ready {
        return Some(format!(
            "repair of {} given up: it is Ready again",
            target.node
        ));
    }
    if !s.input.group.unhealthy(node) {
        return Some(format!(
            "repair of {} given up: it is no longer NotReady past the unhealthy timeout",
            target.node
        ));
    }
    authority(s, node)
        .err()
        .map(|blocked| format!("repair of {} given up: refusing to {blocked}", target.node))
}

/// What a launching ASG will still bring: its desired count less its Ready
/// nodes, less what is stuck (NotReady nodes past the join timeout,
/// never-joined instances past it), less interrupted nodes that leave
/// through us (the ASG will not replace them). A launch due, in flight or
/// Pending, a node joining, and a lost instance the ASG will replace all count.
pub(super) fn on_the_way(s: &Deciding, asg: &AsgView) -> i32 {
    let input = s.input;
    let in_asg = |n: &&GroupNode| n.asg.as_deref() == Some(asg.name.as_str());
    // A NotReady node is on its way (joining, or a blip) until the
    // unhealthy timeout; one that leaves through us is counted below.
    let stuck_nodes = input
        .group
        .nodes
        .iter()
        .filter(in_asg)
        .filter(|n| input.group.stuck(n) && !leaves_through_us(s, n))
        .count() as i32;
    let leaving = input
        .group
        .nodes
        .iter()
        .filter(in_asg)
        .filter(|n| leaves_through_us(s, n))
        .count() as i32;
    let stuck_instances = input
        .not_joined
        .iter()
        .filter(|n| n.asg == asg.name && s.overdue(n))
        .count() as i32;
    (asg.desired - ready_in(input.group.nodes, &asg.name) - stuck_nodes - stuck_instances - leaving)
        .max(0)
}

/// Spread: of the candidates below their max, the one with the best
/// recent record (fewest interruptions, rebalance recommendations and
/// launch failures in 24 hours), then the lowest desired count, then the
/// lowest spot price, then the name, gets the next one. The count comes
/// before the price so that several nodes still spread over the zones; the
/// price decides between pools alike in record and size.
pub(super) fn spread(candidates: &[AsgView]) -> Option<usize> {
    let open = || {
        candidates
            .iter()
            .enumerate()
            .filter(|(_, a)| a.desired < a.max)
    };
    // Prices order the pools only when every one has a price: an unknown
    // one is no reason to pass a pool over, nor to prefer it.
    let priced = open().all(|(_, a)| a.price.is_some());
    let price = |a: &AsgView| if priced { a.price } else { None };
    open()
        .min_by(|(_, a), (_, b)| {
            (a.risk, a.desired, price(a), &a.name).cmp(&(b.risk, b.desired, price(b), &b.name))
        })
        .map(|(i, _)| i)
}

/// Adds up to `n` to the candidates, one at a time where [`spread`] says;
/// how many it added (fewer when every candidate is at its max).
pub(super) fn spread_over(candidates: &mut [AsgView], n: i32) -> i32 {
    let mut added = 0;
    while added < n {
        let Some(i) = spread(candidates) else {
            break;
        };
        candidates[i].desired += 1;
        added += 1;
    }
    added
}

/// The raises the candidates now stand for, against the ASGs as judged.
pub(super) fn changes_from(s: &Deciding, candidates: &[AsgView]) -> Vec<DesiredChange> {
    candidates
        .iter()
        .filter_map(|c| {
            let from = s.asg(&c.name)?.desired;
            (c.desired != from).then(|| DesiredChange {
                asg: c.name.clone(),
                from,
                to: c.desired,
            })
        })
        .collect()
}

impl Deciding<'_> {
    /// The rule book's scene as this plan sees it: what the executor's
    /// check will see (a free slot taken by the executor first), so the
    /// plan chooses by the same rules.
    pub(super) fn scene(&self) -> Scene<'_> {
        let group = &self.input.group;
        let scene = self.input.rules.scene(
            group.role,
            group.control_plane,
            group.breaker.as_deref(),
            group.stopped(),
        );
        crate::controllers::book::Book::to_choose(scene)
    }

    /// Whether the rule book lets a removal of `target` (no repair) take
    /// its next step: `in_hand` once its drain has begun with the slot.
    pub(super) fn validate_removal(
        &self,
        target: &ScaleInTarget,
        in_hand: bool,
    ) -> Result<(), Refused> {
        let group = &self.input.group;
        let node = group.node_of(&target.instance_id);
        let target_ready = node.is_some_and(|n| n.ready);
        let ready_besides = self.ready - i32::from(target_ready);
        let d = Disruption {
            reason: reason_of(self, target),
            instance: &target.instance_id,
            node: Some(&target.node),
            in_hand,
            dead: false,
            floor: Some(Floor::of(ready_besides, group.desired)),
        };
        validate(&d, &self.scene())
    }

    /// The maintenance windows as `reason` sees them (the rule book).
    pub(super) fn window(&self, reason: Reason) -> crate::controllers::window::WindowState {
        self.input.rules.window(reason)
    }

    /// The protected nodes, and why, as `reason` sees them (the rule book).
    pub(super) fn protected(
        &self,
        reason: Reason,
    ) -> std::borrow::Cow<'_, std::collections::BTreeMap<String, String>> {
        self.input.rules.protected(reason)
    }
}
