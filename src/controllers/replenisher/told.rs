//! What the replenisher tells of what its commands did: the Events each
//! outcome gets (pure), and what a removal says to AWS.

use crate::controllers::command::Effect;
use crate::controllers::group_view::{REPAIR_DRAIN_TIMEOUT, after};
use crate::crd::replenisher::ScaleInTarget;
use crate::crd::{NodeGroupSpec, ReplenisherStatus};
use crate::events::Reason;
use crate::k8s::drain::DrainProgress;
use chrono::{DateTime, Utc};
use kube::runtime::events::EventType;

/// An Event: on the group, and on its node when it names one.
pub type Told = (Option<String>, EventType, Reason, String);

/// Whether a drain step leaves `target` ready to go: drained (a repair:
/// every deletion asked), or a repair's best effort over
/// (`REPAIR_DRAIN_TIMEOUT`).
pub fn drained(target: &ScaleInTarget, progress: &DrainProgress, now: DateTime<Utc>) -> bool {
    let effort_over = target.repair && now >= after(target.since, REPAIR_DRAIN_TIMEOUT);
    progress.done_for(target.repair) || effort_over
}

/// The instance a removal terminates, with decrement or not, and why; None
/// for an effect that is no removal of one instance.
pub fn removal_of<'a>(removal: &Effect<'a, ScaleInTarget>) -> Option<(&'a str, bool, String)> {
    Some(match *removal {
        Effect::Terminate(t) => (
            &t.instance_id,
            t.decrement,
            format!(
                "{}{}: scale-in of {}",
                if t.decrement { "decrement " } else { "" },
                t.auto_scaling_group,
                t.node
            ),
        ),
        Effect::NotJoined(c) => (
            &c.instance_id,
            c.decrement,
            format!("{}: {}", c.auto_scaling_group, c.reason),
        ),
        Effect::Retire([r]) => (
            &r.instance_id,
            r.decrement,
            format!(
                "{}: interrupted {} replaced{}",
                r.auto_scaling_group,
                r.node,
                if r.decrement { ", decrement" } else { "" }
            ),
        ),
        Effect::Retire(_)
        | Effect::GiveBack { .. }
        | Effect::SetDesired(_)
        | Effect::Drain { .. } => return None,
    })
}

/// The Events `done` gets, with the status after it and the plan's
/// message `why`.
pub fn told(
    spec: &NodeGroupSpec,
    done: Effect<'_, ScaleInTarget>,
    status: &ReplenisherStatus,
    why: &str,
) -> Vec<Told> {
    let last_action = || {
        let description = status.last_action.as_ref().map(|a| a.description.clone());
        description.unwrap_or_default()
    };
    let mut told = vec![];
    match done {
        Effect::SetDesired(changes) => {
            let (kind, reason) = match changes.iter().any(|c| spec.is_fallback(&c.asg)) {
                true => (EventType::Warning, Reason::FallbackRaised),
                false => (EventType::Normal, Reason::ScaledUp),
            };
            told.push((None, kind, reason, why.to_string()));
        }
        Effect::NotJoined(target) => {
            let (kind, reason) = (EventType::Warning, Reason::RemovedNotJoined);
            told.push((None, kind, reason, why.to_string()));
            let again = status
                .removals
                .iter()
                .find(|r| r.auto_scaling_group == target.auto_scaling_group && r.count > 1);
            if let Some(run) = again {
                let message = format!(
                    "{} instance(s) of {} in a row never joined; the next removal there waits until {}",
                    run.count,
                    run.auto_scaling_group,
                    run.retry_after.to_rfc3339()
                );
                told.push((None, kind, Reason::NotJoinedAgain, message));
            }
        }
        Effect::Terminate(target) => {
            if spec.is_fallback(&target.auto_scaling_group) {
                let message = format!(
                    "{} ({}) returned from the on-demand {}: its spot replacement is Ready",
                    target.node, target.instance_id, target.auto_scaling_group
                );
                told.push((None, EventType::Normal, Reason::ReturnedToSpot, message));
            }
            if target.repair {
                let message = format!(
                    "{} ({}) was NotReady for over {}: terminated in {}{}",
                    target.node,
                    target.instance_id,
                    crate::duration::format(spec.replenish.unhealthy_timeout()),
                    target.auto_scaling_group,
                    if target.decrement {
                        " with decrement (its replacement was launched first)"
                    } else {
                        " (its ASG launches a replacement)"
                    }
                );
                let node = Some(target.node.clone());
                told.push((node, EventType::Normal, Reason::NodeRepaired, message));
            }
            if status.scale_in.is_none() {
                told.push((None, EventType::Normal, Reason::ScaledDown, last_action()));
            }
        }
        Effect::Retire(_) => {
            let reason = Reason::InterruptedNodeRemoved;
            told.push((None, EventType::Normal, reason, last_action()));
        }
        Effect::GiveBack { target, reason } => {
            // A repair given up is good news when its node came back.
            let (kind, event_reason) = match target.repair {
                true => (EventType::Normal, Reason::RepairAbandoned),
                false => (EventType::Warning, Reason::ScaleInAbandoned),
            };
            let node = Some(target.node.clone());
            told.push((node, kind, event_reason, reason.to_string()));
        }
        // A drain step is told by the drain itself.
        Effect::Drain { .. } => {}
    }
    told
}
