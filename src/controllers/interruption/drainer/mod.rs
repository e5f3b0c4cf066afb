//! Drains the nodes the handler marked, level-triggered from the mark on the
//! Node (so a restart picks up where it was): evictions through the
//! Eviction API, PodDisruptionBudgets respected, each pod's grace period
//! shortened so it ends by the deadline. At the deadline what is left is
//! named in an Event. The outcome is recorded in the mark.
//!
//! The cordon, the evictions and the lifecycle action's completion are
//! carried out by the one executor (`controllers::execute`), as every
//! other path's: the mark is the status it writes first, [`check`] the
//! guard it asks before each effect (the rule book included), on the Node
//! read afresh. Heartbeats, which keep a lifecycle action waiting and take
//! nothing away, are sent before the plan. The receiver's mark, whose
//! cordon and taint are a loss's first effect (in the patch that records
//! it), asks the same rule book on the Node it is planned on
//! (`check::may_mark`).

pub(crate) mod check;
mod effects;
pub mod plan;

use crate::cloud::HookCallKind;
use crate::context::Context;
use crate::controllers::execute::{Planned, execute};
use crate::crd::labels::INTERRUPTED_LABEL;
use crate::k8s::drain::pods_to_move;
use crate::k8s::interruption_record::{self, HookAction, HookStep, Record, hook_step};
use crate::mutation::Intent;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use plan::{Decision, Mark, decide, may_call_hook};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const CONTROLLER: &str = "interruption-drain";
const EVENT_ACTION: &str = "InterruptionDrain";

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    info!(controller = CONTROLLER, "controller started");
    Controller::new(
        nodes,
        watcher::Config::default()
            .labels(INTERRUPTED_LABEL)
            .any_semantic(),
    )
    .graceful_shutdown_on(shutdown.cancelled_owned())
    .run(
        reconcile,
        |node: Arc<Node>, error: &Error, _| {
            crate::controllers::runtime::retry_after(CONTROLLER, &node.name_any(), error)
        },
        ctx,
    )
    .for_each(|result| async move {
        if let Err(e) = result {
            debug!(controller = CONTROLLER, error = %e, "reconcile failed");
        }
    })
    .await;
    info!(controller = CONTROLLER, "controller stopped");
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action> {
    use crate::controllers::runtime::{About, instrumented};
    let name = node.name_any();
    instrumented(
        &ctx,
        CONTROLLER,
        About::Node(&name),
        reconcile_inner(&node, &ctx),
    )
    .await
}

async fn reconcile_inner(watched: &Node, ctx: &Context) -> Result<Action> {
    let Some(record) = interruption_record::record_of(watched) else {
        return Ok(Action::await_change());
    };
    let name = watched.name_any();
    if !interruption_record::is_ours(&record, ctx.settings.namespace.as_deref()) {
        debug!(controller = CONTROLLER, node = %name, scope = ?record.scope, group = ?record.group, "marked by a manager of another namespace; left to it");
        return Ok(Action::await_change());
    }
    let now = ctx.clock.now();
    let record = heartbeat(ctx, watched, record, now).await?;
    let seen = decision_on(watched, &record, now);
    match seen {
        // Woken at its drain start (and by any change to the node before).
        Decision::NotYet { from } => {
            return Ok(Action::requeue(crate::controllers::group_view::until(
                now, from,
            )));
        }
        Decision::Done => {
            if record
                .lifecycle
                .as_ref()
                .is_some_and(|a| a.completed.is_none())
            {
                warn!(controller = CONTROLLER, node = %name, instance = %record.instance_id, "lifecycle action recorded for another instance than the node's; not touched");
            }
            return Ok(Action::await_change());
        }
        _ => {}
    }
    // It acts: planned again on the Node read afresh (the watched one can
    // lag our own last write: a drain would be reported twice), which the
    // guard checks each effect on.
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let fresh = nodes
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read node {name} before draining it")))?;
    let Some((node, record)) =
        fresh.and_then(|n| interruption_record::record_of(&n).map(|r| (n, r)))
    else {
        return Ok(Action::await_change());
    };
    let decision = decision_on(&node, &record, now);
    let left = match decision {
        // No more evictions: what is still there is reported by name.
        Decision::Deadline => pods_to_move(ctx, &name).await?,
        _ => vec![],
    };
    let stored = Mark::of(&name, record);
    let Some(step) = plan::step(&stored, &decision, left.len(), now) else {
        return Ok(Action::await_change());
    };
    let mut effects = effects::Drainer {
        ctx,
        fresh: check::Fresh {
            node: &node,
            namespace: ctx.settings.namespace.as_deref(),
            now,
        },
        ending: (decision == Decision::Deadline, left),
        told: stored.record.drained.is_some(),
    };
    let planned = Planned::of(&step.command, step.status, &step.message, step.requeue);
    let requeue = execute(&mut effects, Some(&stored), planned, now).await?;
    Ok(match effects.told || decision == Decision::Complete {
        // Ended (and its lifecycle action, if any, completed; in dry-run
        // only logged): the next change to the node wakes it.
        true => Action::await_change(),
        false => Action::requeue(requeue),
    })
}

fn decision_on(node: &Node, record: &Record, now: DateTime<Utc>) -> Decision {
    let cordoned = interruption_record::mark_patch(node, record, now).is_none();
    decide(record, cordoned, may_call_hook(node, record), now)
}

/// AWS's smallest heartbeat timeout, assumed when the hook cannot be read.
const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

/// The hook's heartbeat timeout, described once per hook and process.
async fn heartbeat_timeout(ctx: &Context, action: &HookAction) -> chrono::Duration {
    type Key = (Option<String>, String, String);
    static KNOWN: OnceLock<Mutex<HashMap<Key, Duration>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    let key = (
        action.region.clone(),
        action.auto_scaling_group.clone(),
        action.hook.clone(),
    );
    let cached = known
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .copied();
    let timeout = match cached {
        Some(t) => t,
        None => {
            let cloud = ctx.cloud.cloud(action.region.as_deref());
            match cloud
                .hook_heartbeat_timeout(&action.auto_scaling_group, &action.hook)
                .await
            {
                Ok(found) => {
                    let t = found.unwrap_or(MIN_HEARTBEAT_TIMEOUT);
                    known
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key, t);
                    t
                }
                Err(e) => {
                    warn!(controller = CONTROLLER, hook = %action.hook, error = %e, "cannot read the lifecycle hook; heartbeats assume the shortest timeout AWS allows (30 s)");
                    MIN_HEARTBEAT_TIMEOUT
                }
            }
        }
    };
    chrono::Duration::from_std(timeout).unwrap_or(chrono::Duration::seconds(30))
}

/// Keeps a terminate lifecycle action waiting while the drain runs
/// (heartbeats), recorded in the mark. It takes nothing away, so it is
/// sent here, not by the executor, which completes the action once the
/// drain has ended. Ends by itself when the drain or the action is done or
/// the node is gone (no reconcile, no call): nothing runs on for it.
async fn heartbeat(
    ctx: &Context,
    node: &Node,
    record: Record,
    now: DateTime<Utc>,
) -> Result<Record> {
    let Some(action) = record.lifecycle.clone() else {
        return Ok(record);
    };
    if action.completed.is_some() || record.drained.is_some() {
        return Ok(record);
    }
    let timeout = heartbeat_timeout(ctx, &action).await;
    if hook_step(&record, now, timeout) != Some(HookStep::Heartbeat) {
        return Ok(record);
    }
    let name = node.name_any();
    if !may_call_hook(node, &record) {
        warn!(controller = CONTROLLER, node = %name, instance = %record.instance_id, "lifecycle action recorded for another instance than the node's; not touched");
        return Ok(record);
    }
    let call = action.call(&record.instance_id);
    let verb = "lifecycle_action_heartbeat";
    let cloud = ctx.cloud.cloud(action.region.as_deref());
    let applied = ctx
        .mutations
        .perform(
            Intent::aws(
                verb,
                format!("asg/{}", action.auto_scaling_group),
                format!("{} of {} ({})", action.hook, record.instance_id, name),
            ),
            || cloud.lifecycle_action(&call, HookCallKind::Heartbeat),
        )
        .await?;
    let Some(waiting) = applied.performed() else {
        return Ok(record);
    };
    let next = Record {
        lifecycle: Some(HookAction {
            heartbeat: Some(now),
            // No longer waiting (its timeout passed, or someone completed
            // it): nothing to complete.
            completed: (!waiting).then_some(now),
            ..action
        }),
        ..record
    };
    effects::write_record(ctx, &name, &next, verb).await?;
    Ok(next)
}
