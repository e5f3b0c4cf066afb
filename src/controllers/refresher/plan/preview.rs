//! What the refresher will do next on its own, said before it happens:
//! the next run (a scheduled refresh, a drift roll, a run set aside), when
//! it starts, the nodes in the order it takes them and what would hold each.
//! Computed from the same observation by the same functions the run uses
//! (the targets, their order, the start's blockers, the windows), never by
//! a copy of their rules.

use super::draining::take_order;
use super::set_aside::CONTROL_PLANE_UNOBSERVED;
use super::targets::{drifted_targets, targets};
use super::{Book, Deciding, Input, LockState, WindowState};
use crate::controllers::authority::Reason;
use crate::crd::next::{LISTED_NODES, NextDisruption, NextNode};
use crate::crd::nodegroup::ResolvedRefresh;
use crate::crd::refresher::RunTrigger;
use chrono::{DateTime, Utc};

/// The next disruption, None when there is none to come (no schedule, or
/// one that never fires again, and nothing drifted). `window_at` is the
/// group's maintenance windows at an instant (`controllers::window`).
pub fn preview(
    input: &Input,
    window_at: &dyn Fn(DateTime<Utc>) -> WindowState,
) -> Option<NextDisruption> {
    let mut planner = Deciding {
        input,
        status: input.status.clone(),
        happenings: vec![],
        paused: false,
    };
    let settings = match input.settings {
        Ok(s) => s,
        Err(problem) => {
            let why = format!("the NodeGroup spec is invalid: {problem}");
            return Some(NextDisruption {
                what: "refresh".into(),
                why: "the Refresher's spec".into(),
                summary: format!("blocked: {why}"),
                blocked_by: Some(why),
                ..Default::default()
            });
        }
    };
    if planner.status.run_start.is_some() {
        return Some(planner.under_way());
    }
    planner.coming(settings, window_at)
}

/// How a preview says that a scheduled run would be skipped when due (not
/// waited for): what follows is why.
pub const SKIPPED: &str = "skipped when due: ";

/// What a coming run is, before its window and blockers are applied.
struct Coming {
    what: &'static str,
    why: String,
    /// When it may start, windows aside.
    from: DateTime<Utc>,
    /// Its targets, oldest first, as the run would record them at `from`.
    targets: Vec<String>,
}

impl Deciding<'_> {
    /// A run in progress: the nodes it has left, in the order it takes them.
    fn under_way(&self) -> NextDisruption {
        let what = match self.status.trigger {
            Some(RunTrigger::Drift) => "drift roll",
            _ => "refresh",
        };
        let mut nodes: Vec<NextNode> = self
            .status
            .current_target
            .iter()
            .chain(&self.status.alongside)
            .filter(|t| t.terminated.is_none())
            .filter_map(|t| {
                Some(NextNode {
                    node: t.node.clone()?,
                    instance_id: t.instance_id.clone(),
                    blocked_by: t.blocked_by.clone(),
                })
            })
            .collect();
        let (upcoming, protected) = self.candidates();
        let in_hand: Vec<String> = nodes.iter().map(|n| n.instance_id.clone()).collect();
        let upcoming = upcoming
            .into_iter()
            .filter(|t| !in_hand.contains(&t.instance_id));
        nodes.extend(upcoming.filter_map(|t| {
            Some(NextNode {
                node: t.node?,
                instance_id: t.instance_id,
                blocked_by: None,
            })
        }));
        nodes.extend(self.protected_nodes(protected));
        let total = nodes.len();
        nodes.truncate(LISTED_NODES);
        NextDisruption {
            what: what.into(),
            at: None,
            why: format!(
                "under way since {}",
                self.status
                    .run_start
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default()
            ),
            under_way: true,
            total: count(total),
            summary: format!("{what}: {total} node(s) left"),
            nodes,
            blocked_by: None,
        }
    }

    /// No run in progress: the next one, when it starts and what holds it.
    fn coming(
        &mut self,
        settings: &ResolvedRefresh,
        window_at: &dyn Fn(DateTime<Utc>) -> WindowState,
    ) -> Option<NextDisruption> {
        let input = self.input;
        if self.status.next_run_from.as_deref() != Some(input.schedule_key) {
            self.schedule_next(settings);
        }
        let coming = self.what_comes(settings)?;
        let reason = match coming.what {
            "drift roll" => Reason::DriftRoll,
            _ => Reason::Refresh,
        };
        let (at, window_blocks) = match Book::seen_by(window_at(coming.from), reason) {
            WindowState::Closed { opens: Some(t) } => (t, None),
            WindowState::Closed { opens: None } => (
                coming.from,
                Some("no maintenance window opens again".to_string()),
            ),
            _ => (coming.from, None),
        };
        // The targets as the run records them when it starts (`maxNodeAge`
        // counts to then, not to now: a node young today may be old enough
        // by tomorrow's run).
        let targets = match coming.what {
            "refresh" if at > input.group.now => {
                let mut later = input.clone();
                later.group.now = at;
                targets(&later, settings.max_node_age)
            }
            _ => coming.targets,
        };
        let (upcoming, protected) = take_order(input, reason, targets.iter().collect());
        let mut nodes: Vec<NextNode> = upcoming
            .into_iter()
            .map(|(node, id)| NextNode {
                node: node.name.clone(),
                instance_id: id.clone(),
                blocked_by: None,
            })
            .collect();
        nodes.extend(self.protected_nodes(protected));
        let blocked_by = window_blocks.or_else(|| self.held(coming.what, &targets, settings));
        let total = nodes.len();
        nodes.truncate(LISTED_NODES);
        let at = (at > input.group.now).then_some(at);
        let when = at.map_or_else(|| "now".to_string(), |t| format!("at {}", t.to_rfc3339()));
        let summary = match &blocked_by {
            Some(why) if why.starts_with(SKIPPED) => {
                format!("{} {total} node(s) {when}; {why}", coming.what)
            }
            Some(why) => format!("{} {total} node(s) {when}; blocked: {why}", coming.what),
            None => format!("{} {total} node(s) {when}", coming.what),
        };
        Some(NextDisruption {
            what: coming.what.into(),
            at,
            why: coming.why,
            under_way: false,
            total: count(total),
            nodes,
            blocked_by,
            summary,
        })
    }

    /// The run to come, as the idle phase would start it.
    fn what_comes(&self, settings: &ResolvedRefresh) -> Option<Coming> {
        let input = self.input;
        let now = input.group.now;
        if let Some(pending) = &self.status.pending_run {
            let left: Vec<String> = pending
                .remaining
                .iter()
                .filter(|id| self.active(id))
                .cloned()
                .collect();
            return Some(Coming {
                what: "resume",
                why: format!("a run set aside with {} node(s) left", left.len()),
                from: now,
                targets: left,
            });
        }
        let drifted = match input.drift_replace {
            true => drifted_targets(input),
            false => vec![],
        };
        if !drifted.is_empty() {
            let (from, why) = match self.drift_backoff() {
                Some((again, failed)) => (
                    again,
                    format!("drifted nodes; the last drift roll failed ({failed})"),
                ),
                None => (now, "drifted nodes (drift.action: Replace)".to_string()),
            };
            // A scheduled run due by then starts first (the idle phase
            // starts a due run before it looks at drift), drifted nodes
            // among its targets.
            if self.status.next_run.is_none_or(|t| t > from) {
                return Some(Coming {
                    what: "drift roll",
                    why,
                    from,
                    targets: drifted,
                });
            }
        }
        let from = self.status.next_run?;
        let mut why = format!("schedule ({})", input.schedule_key);
        if let Some(age) = settings.max_node_age {
            why.push_str(&format!(
                "; nodes older than {}",
                crate::duration::format(age)
            ));
        }
        Some(Coming {
            what: "refresh",
            why,
            from,
            targets: targets(input, settings.max_node_age),
        })
    }

    /// What would hold the coming run were it due now, in the idle phase's
    /// order: a scheduled refresh that may not start is skipped (its start
    /// blockers, no target, a surplus that cannot be added) and says so; a
    /// drift roll or a run set aside waits for the same; every run waits
    /// for a master coming back elsewhere, a disruption slot and the lock.
    fn held(&self, what: &str, targets: &[String], settings: &ResolvedRefresh) -> Option<String> {
        let skipped = |why: String| match what {
            "refresh" => format!("{SKIPPED}{why}"),
            _ => why,
        };
        // An idle reconcile does not look at the control plane: unknown
        // there is not a refusal (the run itself looks before it starts).
        if let Some(why) = self
            .control_plane_not_whole()
            .filter(|why| why != CONTROL_PLANE_UNOBSERVED)
        {
            return Some(why);
        }
        if let Some(why) = self
            .start_blocker()
            .filter(|why| why != CONTROL_PLANE_UNOBSERVED)
        {
            return Some(skipped(why));
        }
        if targets.is_empty() && what == "refresh" {
            return Some(skipped(match settings.max_node_age {
                Some(age) => format!("no node is older than {}", crate::duration::format(age)),
                None => "the group has no node to replace".into(),
            }));
        }
        if let Some(why) = self.surplus_to_add(settings).1 {
            return Some(skipped(why));
        }
        if let Some(holders) = self.input.rules.slots_full() {
            return Some(format!("the disruption slots are held: {holders}"));
        }
        match &self.input.group.lock {
            LockState::Other(holder) => Some(format!("the group's lock is held by {holder}")),
            _ => None,
        }
    }

    /// Protected nodes, taken last: waited for up to `doNotDisruptTimeout`
    /// (at most `pauseTimeout`), then skipped.
    fn protected_nodes(&self, protected: Vec<(String, String, String)>) -> Vec<NextNode> {
        let wait = self.protected_wait();
        let then = match wait.is_zero() {
            true => "skipped".to_string(),
            false => format!(
                "waited for up to {}, then skipped",
                crate::duration::format(wait)
            ),
        };
        protected
            .into_iter()
            .map(|(node, instance_id, why)| NextNode {
                node,
                instance_id,
                blocked_by: Some(format!("{why}: taken last, {then}")),
            })
            .collect()
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
