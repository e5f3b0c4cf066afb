//! Too few Ready nodes: raise desired on the ASGs that can launch, counting
//! what is already on its way once.

use super::queries::{
    changes_from, on_the_way, raise_candidates, replacement_in, spread, spread_over, unreplaced,
};
use super::records::{count_of, record_raise};
use super::{Command, Deciding, Plan, SOON};
use crate::controllers::group_view::{AsgView, DesiredChange, Fate};
use crate::crd::Role;
use crate::crd::replenisher::ReplenishPhase;

/// Too few Ready nodes: raise desired on ASGs that are launching and below
/// max; what is already on its way is not ordered twice. Interrupted nodes
/// are replaced first, each in its own ASG when it can launch (masters only
/// there), even during the cooldown; the rest is spread over the ASGs.
pub(super) fn scale_up(s: &Deciding) -> Option<Plan> {
    let input = s.input;
    if s.ready >= input.group.desired {
        return None;
    }
    let usable = |a: &&AsgView| a.launching && !s.excluded(&a.name);
    let coming: i32 = s.asgs.iter().filter(usable).map(|a| on_the_way(s, a)).sum();
    let deficit = input.group.desired - s.ready - coming;
    if deficit <= 0 {
        return Some(s.coming(format!("{coming} node(s) on their way"), SOON));
    }
    let mut candidates = raise_candidates(s);
    let mut replacements = vec![];
    // Nodes at risk (not lost) that nothing can replace now serve on: no
    // shortage of theirs is made up elsewhere or on demand.
    let mut serving_at_risk = vec![];
    for node in unreplaced(s).into_iter().take(deficit as usize) {
        let own = candidates
            .iter()
            .position(|c| Some(c.name.as_str()) == node.asg.as_deref() && c.desired < c.max);
        let pick = match own {
            Some(i) => Some(i),
            None if input.group.role == Role::Worker => spread(&candidates),
            None => None,
        };
        match pick {
            Some(i) => {
                candidates[i].desired += 1;
                replacements.push(replacement_in(s, node, &candidates[i].name));
            }
            None if node.fate == Some(Fate::AtRisk) => serving_at_risk.push(node.name.as_str()),
            None => {}
        }
    }
    let mut added = replacements.len() as i32;
    let short = deficit - serving_at_risk.len() as i32;
    if added == 0 && short <= 0 {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Steady,
            format!(
                "{} at risk of interruption, serving on: no ASG can launch a replacement ({})",
                serving_at_risk.join(", "),
                match input.group.role {
                    Role::Master =>
                        "a master only in its own ASG, which is at max or not launching",
                    Role::Worker => "not launching, backing off, or at max",
                }
            ),
        ));
    }
    // No spot ASG can launch: the on-demand fallback, when set.
    if added == 0
        && candidates.is_empty()
        && let Some(plan) = super::fallback::fall_back(s, short)
    {
        return Some(plan);
    }
    if added == 0
        && let Some(plan) = nothing_to_add(s, &candidates, short)
    {
        return Some(plan);
    }
    if input.group.role == Role::Worker && s.cooldown_left().is_none() {
        added += spread_over(&mut candidates, short - added);
    }
    let changes = changes_from(s, &candidates);
    let mut message = raise_message(s, added, &changes, &replacements);
    message.push_str(&price_note(&raise_candidates(s), &changes));
    let mut status = s.status.clone();
    record_raise(&mut status, &changes, input.group.now, message.clone());
    status.replacing.extend(replacements);
    Some(s.act(
        status,
        ReplenishPhase::ScalingUp,
        Command::SetDesired(changes),
        message,
    ))
}

/// With no interrupted node replaced: why nothing can be added now
/// (masters launch only in their own ASG; no ASG can launch; the cooldown),
/// if so.
fn nothing_to_add(s: &Deciding, candidates: &[AsgView], deficit: i32) -> Option<Plan> {
    let input = s.input;
    if input.group.role == Role::Master {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            format!(
                "{}/{} masters Ready; masters are never launched outside their own ASG",
                s.ready, input.group.desired
            ),
        ));
    }
    if candidates.is_empty() {
        return Some(s.idle(
            s.status.clone(),
            ReplenishPhase::Blocked,
            format!(
                "{}/{} Ready and no ASG can launch (not launching, backing off, or at max)",
                s.ready, input.group.desired
            ),
        ));
    }
    let left = s.cooldown_left()?;
    Some(s.wait_on_time(format!("cooldown before scaling up by {deficit}"), left))
}

/// What a raise says: the counts, each change, the nodes it replaces.
fn raise_message(
    s: &Deciding,
    added: i32,
    changes: &[DesiredChange],
    replacements: &[crate::crd::replenisher::Replacement],
) -> String {
    let replacing = match replacements.is_empty() {
        true => String::new(),
        false => format!(
            " (replacing {})",
            replacements
                .iter()
                .map(|r| r.node.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    format!(
        "{}/{} Ready: adding {added} on {}{replacing}",
        s.ready,
        s.input.group.desired,
        changes
            .iter()
            .map(|c| format!("{} {}->{}", c.asg, c.from, c.to))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Why a raise of one went where it did, when the spot price decided it:
/// another pool alike in record and size, dearer. Empty otherwise.
fn price_note(pools: &[AsgView], changes: &[DesiredChange]) -> String {
    let [change] = changes else {
        return String::new();
    };
    let Some(chosen) = pools.iter().find(|p| p.name == change.asg) else {
        return String::new();
    };
    let dearer = pools
        .iter()
        .filter(|p| p.name != chosen.name && p.desired < p.max)
        .filter(|p| (p.risk, p.desired) == (chosen.risk, chosen.desired))
        .filter_map(|p| p.price)
        .min();
    match (chosen.price, dearer) {
        (Some(own), Some(other)) if own < other => format!(
            " (the lowest spot price of the pools alike in record and size: ${:.4}/h against ${:.4}/h)",
            own as f64 / 1e6,
            other as f64 / 1e6
        ),
        _ => String::new(),
    }
}

/// Ready at desired, nothing on its way, and an ASG left below its count by
/// a removal of ours (`lowered`) while another stays raised: the lowered
/// one is raised back by one where it can launch, so its node comes first;
/// the surplus that makes is taken back from the raised ASG (`scale_in`
/// prefers the most raised). A surge, then a removal: the layout comes back
/// without Ready ever dropping. None when nothing is to restore.
pub(super) fn restore_layout(s: &Deciding) -> Option<Plan> {
    let input = s.input;
    let settled = s.asgs.iter().all(|a| !a.is_behind() && a.pending == 0);
    let raised_elsewhere = |asg: &str| {
        s.status
            .raised
            .iter()
            .any(|r| r.auto_scaling_group != asg && r.count > 0)
    };
    if s.ready != input.group.desired
        || !settled
        || !input.not_joined.is_empty()
        || s.status.scale_in.is_some()
        || s.status.cleanup.is_some()
        || input.group.role != Role::Worker
    {
        return None;
    }
    let mut candidates = raise_candidates(s);
    let i = candidates
        .iter()
        .position(|a| count_of(&s.status.lowered, &a.name) > 0 && raised_elsewhere(&a.name))?;
    if let Some(left) = s.cooldown_left() {
        let name = &candidates[i].name;
        return Some(s.wait_on_time(format!("cooldown before raising {name} back"), left));
    }
    candidates[i].desired += 1;
    let name = candidates[i].name.clone();
    let changes = changes_from(s, &candidates);
    let message = format!(
        "restoring the layout: raising {name} back by 1 (a removal of ours left it below its count); the surplus is then taken back from {}",
        s.status
            .raised
            .iter()
            .filter(|r| r.auto_scaling_group != name)
            .map(|r| r.auto_scaling_group.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut status = s.status.clone();
    record_raise(&mut status, &changes, input.group.now, message.clone());
    Some(s.act(
        status,
        ReplenishPhase::ScalingUp,
        Command::SetDesired(changes),
        message,
    ))
}
