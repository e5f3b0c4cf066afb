//! The repairs to come, said before they happen: each NotReady node of the
//! group, when it becomes unhealthy (its Ready condition's last transition
//! plus `unhealthyTimeout`: `GroupFacts::unhealthy_at`, what the repair
//! stages use), and what would hold its repair then. The same order as the
//! repair stages take them: the earliest first, by name among equals.

use super::queries::{leaves_through_us, replacement};
use super::scale_in::{choose_victim, protected_surplus};
use super::{Deciding, Plan};
use crate::controllers::authority::{self, Reason, Request};
use crate::controllers::group_view::{Fate, GroupFacts, GroupNode, LockState, after};
use crate::controllers::window::WindowState;
use crate::crd::Role;
use crate::crd::next::{LISTED_NODES, NextDisruption, NextNode};
use crate::crd::replenisher::ReplenisherStatus;
use chrono::{DateTime, Utc};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComingRepair {
    pub node: String,
    pub instance_id: String,
    /// When it is unhealthy, and its repair starts (a worker's replacement
    /// raised first).
    pub at: DateTime<Utc>,
    /// What would hold the repair now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

/// The group's repairs to come, each with what would hold it now (the
/// group held as a whole, then the repair's own rules); `active`: the
/// instances in service in the group's ASGs (a node on another is not the
/// group's to repair). No repair waits for a disruption slot (the rule
/// book: a dead kubelet does not wait, the masters' rule serialises).
pub fn repairs_to_come(group: &GroupFacts, active: &[String]) -> Vec<ComingRepair> {
    let mut coming: Vec<ComingRepair> = group
        .nodes
        .iter()
        .filter(|n| n.asg.is_some())
        .filter_map(|n| {
            let id = n.instance_id.clone().filter(|id| active.contains(id))?;
            let at = group.unhealthy_at(n)?;
            Some(ComingRepair {
                node: n.name.clone(),
                held_by: group_held(group).or_else(|| held_by(group, &id)),
                instance_id: id,
                at,
            })
        })
        .collect();
    coming.sort_by(|a, b| (a.at, &a.node).cmp(&(b.at, &b.node)));
    coming
}

/// What holds a repair of `instance` now, as the repair stages check it.
fn held_by(group: &GroupFacts, instance: &str) -> Option<String> {
    if !group.repair {
        return Some(
            "repair is off (replenish.repair: false): a worker gets a replacement, the node is kept"
                .into(),
        );
    }
    match group.role {
        Role::Worker => group
            .breaker
            .as_ref()
            .map(|why| format!("circuit breaker open: {why}")),
        Role::Master => {
            let request = Request {
                reason: Reason::MasterRepair,
                role: Role::Master,
                instance,
            };
            authority::decide(group.control_plane, &request)
                .err()
                .map(|b| b.to_string())
        }
    }
}

/// The replenisher's next disruption of its own (`Replenisher.status.next`,
/// one line of the NodeGroup's `NEXT` column): one under way (a repair, a
/// surplus or at-risk removal, an instance that never joined), else the
/// soonest to come, each of the stages' own predicates and times: a repair
/// at `unhealthy_at`, a removal of an instance that never joined at its
/// join timeout (or its ASG's backoff), a node at risk once replaced and a
/// window is open, a surplus node once the cooldown is over and a window is
/// open. Interrupted nodes are not here: AWS takes them at its time.
pub(super) fn next(s: &Deciding, plan: &Plan) -> Option<NextDisruption> {
    under_way(s, &plan.status).or_else(|| coming(s))
}

fn under_way(s: &Deciding, status: &ReplenisherStatus) -> Option<NextDisruption> {
    let (what, why, node, instance_id) = if let Some(t) = &status.scale_in {
        let at_risk = s.input.group.nodes.iter().any(|n| {
            n.instance_id.as_deref() == Some(&t.instance_id) && n.fate == Some(Fate::AtRisk)
        });
        let (what, why) = match (t.repair, at_risk) {
            (true, _) => ("repair", "unhealthy"),
            (false, true) => ("at-risk removal", "rebalance recommendation"),
            (false, false) => ("surplus removal", "more Ready nodes than desired"),
        };
        (what, why.to_string(), t.node.clone(), t.instance_id.clone())
    } else {
        let c = status.cleanup.as_ref()?;
        let (id, why) = (c.instance_id.clone(), c.reason.clone());
        ("never-joined removal", why, id.clone(), id)
    };
    Some(NextDisruption {
        summary: format!("{what} {node}: under way"),
        what: what.into(),
        at: None,
        why,
        under_way: true,
        total: 1,
        nodes: vec![NextNode {
            node,
            instance_id,
            blocked_by: None,
        }],
        blocked_by: None,
    })
}

/// One kind of disruption to come, its nodes in the order taken.
struct Kind {
    what: &'static str,
    why: String,
    /// The soonest of its nodes; None: now.
    at: Option<DateTime<Utc>>,
    nodes: Vec<NextNode>,
    blocked_by: Option<String>,
}

fn coming(s: &Deciding) -> Option<NextDisruption> {
    // The soonest; among equals, in the stages' order.
    let kind = [
        never_joined(s),
        repairs(s),
        at_risk(s),
        back_to_spot(s),
        surplus(s),
    ]
    .into_iter()
    .flatten()
    .enumerate()
    .min_by_key(|(i, k)| (k.at, *i))
    .map(|(_, k)| k)?;
    let blocked_by = group_block(s).or(kind.blocked_by);
    let total = kind.nodes.len();
    let subject = match &kind.nodes[..] {
        [one] => one.node.clone(),
        _ => format!("{total} node(s)"),
    };
    let when = kind
        .at
        .map_or_else(|| "now".to_string(), |t| format!("at {}", t.to_rfc3339()));
    let summary = match &blocked_by {
        Some(why) => format!("{} {subject} {when}; blocked: {why}", kind.what),
        None => format!("{} {subject} {when}", kind.what),
    };
    let mut nodes = kind.nodes;
    nodes.truncate(LISTED_NODES);
    Some(NextDisruption {
        what: kind.what.into(),
        at: kind.at,
        why: kind.why,
        under_way: false,
        total: i32::try_from(total).unwrap_or(i32::MAX),
        nodes,
        blocked_by,
        summary,
    })
}

/// `t` if it is still to come; None: now.
fn later(s: &Deciding, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    (t > s.input.group.now).then_some(t)
}

/// A voluntary removal's time: not before `t` (None: now), and not before
/// a closed window opens.
fn in_window(s: &Deciding, reason: Reason, t: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    let at = match s.window(reason).opens() {
        Some(opens) => Some(t.map_or(opens, |t| t.max(opens))),
        None => t,
    };
    at.and_then(|t| later(s, t))
}

fn window_never(s: &Deciding, reason: Reason) -> Option<String> {
    matches!(s.window(reason), WindowState::Closed { opens: None })
        .then(|| "no maintenance window opens again".to_string())
}

/// Instances that never joined, at their join timeout (an extra master's:
/// now) or their ASG's backoff, whichever is later (the cleanup stage's own
/// clock).
fn never_joined(s: &Deciding) -> Option<Kind> {
    let input = s.input;
    let extra_master = super::cleanup::extra_master(s);
    let mut never: Vec<(DateTime<Utc>, NextNode)> = input
        .not_joined
        .iter()
        .filter(|n| input.active.contains(&n.instance_id))
        .filter_map(|n| {
            let due = match extra_master {
                true => input.group.now,
                false => after(n.launch_time?, input.join_timeout),
            };
            let backoff = s
                .status
                .removals
                .iter()
                .find(|r| r.auto_scaling_group == n.asg)
                .map(|r| r.retry_after);
            let request = Request {
                reason: Reason::NeverJoined,
                role: input.group.role,
                instance: &n.instance_id,
            };
            let held = authority::decide(input.group.control_plane, &request)
                .err()
                .map(|b| b.to_string());
            Some((
                backoff.map_or(due, |b| due.max(b)),
                NextNode {
                    node: n.instance_id.clone(),
                    instance_id: n.instance_id.clone(),
                    blocked_by: held,
                },
            ))
        })
        .collect();
    never.sort_by(|a, b| (a.0, &a.1.node).cmp(&(b.0, &b.1.node)));
    let at = never.first()?.0;
    Some(Kind {
        what: "never-joined removal",
        why: match extra_master {
            true => format!("extra master beyond the configured {}", input.group.desired),
            false => format!(
                "not joined within {}",
                crate::duration::format(input.join_timeout)
            ),
        },
        at: later(s, at),
        nodes: never.into_iter().map(|(_, n)| n).collect(),
        blocked_by: None,
    })
}

/// Repairs, at each node's unhealthy time.
fn repairs(s: &Deciding) -> Option<Kind> {
    let input = s.input;
    let active: Vec<String> = input.active.iter().cloned().collect();
    let repairs = repairs_to_come(&input.group, &active);
    let first = repairs.first()?;
    Some(Kind {
        what: "repair",
        why: format!(
            "NotReady for {}",
            crate::duration::format(input.group.unhealthy_timeout)
        ),
        at: later(s, first.at),
        nodes: repairs
            .iter()
            .map(|r| NextNode {
                node: r.node.clone(),
                instance_id: r.instance_id.clone(),
                blocked_by: r.held_by.clone(),
            })
            .collect(),
        blocked_by: None,
    })
}

/// Nodes at risk we replaced, removed once in a window (and Ready back).
fn at_risk(s: &Deciding) -> Option<Kind> {
    let input = s.input;
    let nodes: Vec<NextNode> = input
        .group
        .nodes
        .iter()
        .filter(|n| n.fate == Some(Fate::AtRisk) && leaves_through_us(s, n))
        .filter(|n| replacement(s, n).is_some())
        .filter_map(|n| voluntary(s, Reason::AtRisk, n))
        .collect();
    if nodes.is_empty() {
        return None;
    }
    Some(Kind {
        what: "at-risk removal",
        why: "rebalance recommendation".into(),
        at: in_window(s, Reason::AtRisk, None),
        nodes,
        blocked_by: window_never(s, Reason::AtRisk).or_else(|| {
            (s.ready < input.group.desired).then(|| "its replacement is not Ready yet".to_string())
        }),
    })
}

/// A node a voluntary removal would take, with its protection if any.
fn voluntary(s: &Deciding, reason: Reason, n: &GroupNode) -> Option<NextNode> {
    Some(NextNode {
        node: n.name.clone(),
        instance_id: n.instance_id.clone()?,
        blocked_by: s
            .protected(reason)
            .get(&n.name)
            .map(|why| format!("protected: {why}")),
    })
}

/// What an hour of the nodes on the fallback costs, when every one's
/// on-demand price is known: `; on demand meanwhile: $0.1920/h`.
fn fallback_cost(s: &Deciding) -> String {
    let price = |n: &&crate::controllers::group_view::GroupNode| {
        let asg = n.asg.as_deref()?;
        s.asgs.iter().find(|a| a.name == asg)?.on_demand_price
    };
    let prices: Option<Vec<u64>> = super::fallback::on_fallback(s).iter().map(price).collect();
    match prices {
        Some(p) if !p.is_empty() => format!(
            "; on demand meanwhile: ${:.4}/h",
            p.iter().sum::<u64>() as f64 / 1e6
        ),
        _ => String::new(),
    }
}

/// Nodes on the on-demand fallback, back to spot once a spot ASG has
/// launched for `returnAfter` (the soonest clock), in a window.
fn back_to_spot(s: &Deciding) -> Option<Kind> {
    let settings = s.input.fallback?;
    let nodes: Vec<NextNode> = super::fallback::on_fallback(s)
        .into_iter()
        .filter_map(|n| voluntary(s, Reason::FallbackReturn, n))
        .collect();
    if nodes.is_empty() {
        return None;
    }
    let due = super::fallback::spot_due(s)
        .into_iter()
        .map(|(t, _)| t)
        .min();
    Some(Kind {
        what: "return to spot",
        why: format!(
            "a spot ASG launching for {}{}",
            crate::duration::format(settings.return_after),
            fallback_cost(s)
        ),
        at: in_window(s, Reason::FallbackReturn, due),
        nodes,
        blocked_by: window_never(s, Reason::FallbackReturn).or_else(|| {
            due.is_none()
                .then(|| "no spot ASG launches yet (every spot pool short)".to_string())
        }),
    })
}

/// Surplus nodes (a shortage ended), after the cooldown, in a window.
fn surplus(s: &Deciding) -> Option<Kind> {
    let input = s.input;
    // While nodes are on the fallback, a surplus waits to take their place.
    let fallback_nodes = input.fallback.is_some() && !super::fallback::on_fallback(s).is_empty();
    if s.ready <= input.group.desired || fallback_nodes {
        return None;
    }
    let cooldown_end = s.status.last_modification.map(|t| after(t, input.cooldown));
    let victim = choose_victim(s, true);
    let nodes = victim
        .iter()
        .map(|t| NextNode {
            node: t.node.clone(),
            instance_id: t.instance_id.clone(),
            blocked_by: None,
        })
        .collect();
    let blocked_by = window_never(s, Reason::ScaleIn).or_else(|| match victim {
        Some(_) => None,
        None if choose_victim(s, false).is_some() => Some(protected_surplus(s)),
        None => Some("no ASG can shrink (at min)".into()),
    });
    Some(Kind {
        what: "surplus removal",
        why: format!("{} Ready, {} desired", s.ready, input.group.desired),
        at: in_window(s, Reason::ScaleIn, cooldown_end),
        nodes,
        blocked_by,
    })
}

/// What holds every disruption of the group now, as the guards see it.
fn group_block(s: &Deciding) -> Option<String> {
    if !s.input.spec_valid {
        return Some("the NodeGroup spec is invalid".into());
    }
    group_held(&s.input.group)
}

/// What holds everything the replenisher would do to the group: its spec
/// invalid, the group suspended, a kops rolling update, the group's lock
/// held by another.
fn group_held(group: &GroupFacts) -> Option<String> {
    if group.invalid_spec.is_some() {
        return Some("the NodeGroup spec is invalid".into());
    }
    if group.suspended {
        return Some("the NodeGroup is suspended".into());
    }
    if let Some(why) = &group.external_update {
        return Some(why.clone());
    }
    if let LockState::Other(holder) = &group.lock {
        return Some(format!("{holder} holds the group's lock"));
    }
    None
}
