//! Drains the nodes the handler marked, level-triggered from the mark on the
//! Node (so a restart picks up where it was): evictions through the
//! Eviction API, PodDisruptionBudgets respected, each pod's grace period
//! shortened so it ends by the deadline. At the deadline what is left is
//! named in an Event. The outcome is recorded in the mark.

use crate::cloud::HookCallKind;
use crate::context::Context;
use crate::crd::labels::INTERRUPTED_LABEL;
use crate::events::Reason;
use crate::k8s::drain::{drain_step_within, pods_to_move};
use crate::k8s::interruption_record::{self, HookAction, HookStep, Record, hook_step};
use crate::mutation::Intent;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const CONTROLLER: &str = "interruption-drain";
const EVENT_ACTION: &str = "InterruptionDrain";
/// Pods named in an Event at most (a note over 1 KiB is refused).
const NAMED_PODS: usize = 10;

/// What a drain step decides, pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Drained or reported already: nothing more.
    Done,
    /// A scheduled change days away: the node serves on until then, when
    /// it is cordoned and drained.
    NotYet { from: DateTime<Utc> },
    /// From its drain start: the cordon and taint deferred until now go
    /// on first.
    Cordon,
    /// Evict, with grace periods capped at this many seconds.
    Evict { max_grace: i64 },
    /// The deadline passed: report what is left, record it.
    Deadline,
}

/// `cordoned`: the node carries the mark's cordon and taint.
pub fn decide(record: &Record, cordoned: bool, now: DateTime<Utc>) -> Decision {
    if record.drained.is_some() {
        return Decision::Done;
    }
    if let Some(from) = record.drain_from.filter(|from| now < *from) {
        return Decision::NotYet { from };
    }
    if !cordoned {
        return Decision::Cordon;
    }
    if now >= record.deadline {
        return Decision::Deadline;
    }
    // Under a second left still evicts, with the shortest grace there is
    // short of a forced deletion.
    let left = (record.deadline - now).num_seconds();
    Decision::Evict {
        max_grace: left.max(1),
    }
}

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

async fn reconcile_inner(node: &Node, ctx: &Context) -> Result<Action> {
    let Some(record) = interruption_record::record_of(node) else {
        return Ok(Action::await_change());
    };
    let name = node.name_any();
    if !interruption_record::is_ours(&record, ctx.settings.namespace.as_deref()) {
        debug!(controller = CONTROLLER, node = %name, scope = ?record.scope, group = ?record.group, "marked by a manager of another namespace; left to it");
        return Ok(Action::await_change());
    }
    let now = ctx.clock.now();
    let record = lifecycle(ctx, node, record, now).await?;
    let cordoned = interruption_record::mark_patch(node, &record, now).is_none();
    match decide(&record, cordoned, now) {
        Decision::Done => Ok(Action::await_change()),
        // Woken at its drain start (and by any change to the node before).
        Decision::NotYet { from } => Ok(Action::requeue(crate::controllers::group_view::until(
            now, from,
        ))),
        Decision::Cordon => cordon(ctx, node, &record, now).await,
        Decision::Evict { max_grace } => {
            let progress = drain_step_within(ctx, &name, Some(max_grace)).await?;
            if progress.done() {
                let note = format!(
                    "drained {name} ({} of {}) {}s before its deadline",
                    record.kind,
                    record.instance_id,
                    (record.deadline - now).num_seconds()
                );
                if !finish(ctx, node, &record, now, 0).await? {
                    return Ok(Action::await_change());
                }
                event(
                    ctx,
                    node,
                    &record,
                    EventType::Normal,
                    Reason::InterruptionDrained,
                    note,
                )
                .await;
                ctx.metrics.drain("finished");
                return Ok(Action::await_change());
            }
            // Soon: the deadline is seconds away.
            Ok(Action::requeue(Duration::from_millis(500)))
        }
        Decision::Deadline => {
            // No more evictions: report what is still there, by name.
            let left = pods_to_move(ctx, &name).await?;
            if !finish(ctx, node, &record, now, left.len()).await? || left.is_empty() {
                return Ok(Action::await_change());
            }
            let mut named = left
                .iter()
                .take(NAMED_PODS)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if left.len() > NAMED_PODS {
                named.push_str(&format!(" and {} more", left.len() - NAMED_PODS));
            }
            let note = format!(
                "{name} ({} of {}) not drained by its deadline {}: {named}",
                record.kind,
                record.instance_id,
                record.deadline.to_rfc3339()
            );
            event(
                ctx,
                node,
                &record,
                EventType::Warning,
                Reason::InterruptionDrainIncomplete,
                note,
            )
            .await;
            ctx.metrics.drain("timed_out");
            Ok(Action::await_change())
        }
    }
}

/// The mark's cordon and taint, deferred to the drain start of a scheduled
/// change (or lost to someone's uncordon), put on; said in an Event.
async fn cordon(ctx: &Context, node: &Node, record: &Record, now: DateTime<Utc>) -> Result<Action> {
    let name = node.name_any();
    if interruption_record::mark(ctx, &name, record).await? {
        let loss = record.loss_at.unwrap_or(record.deadline);
        let note = format!(
            "{name} ({} of {}): cordoned and tainted, {} ahead of AWS taking it at {}; replaced and drained by {}",
            record.kind,
            record.instance_id,
            crate::duration::format(crate::controllers::group_view::until(now, loss)),
            loss.to_rfc3339(),
            record.deadline.to_rfc3339()
        );
        event(
            ctx,
            node,
            record,
            EventType::Warning,
            Reason::InterruptionNotice,
            note,
        )
        .await;
    }
    // The patched node comes back through the watch.
    Ok(Action::requeue(Duration::from_millis(500)))
}

/// AWS's smallest heartbeat timeout, assumed when the hook cannot be read.
const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

/// Pure: the node is the one the lifecycle action holds (its providerID
/// names the record's instance). Completing an action lets its ASG
/// terminate the instance, so it is only ever done for the node we drained.
pub fn may_call_hook(node: &Node, record: &Record) -> bool {
    let provider = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    record.lifecycle.is_some()
        && !record.instance_id.is_empty()
        && provider.is_some_and(|p| p.rsplit('/').next() == Some(record.instance_id.as_str()))
}

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
/// (heartbeats), and completes it (CONTINUE) once the drain has ended; the
/// step is recorded in the mark. Ends by itself when the action is done or
/// the node is gone (no reconcile, no call): nothing runs on for it.
async fn lifecycle(
    ctx: &Context,
    node: &Node,
    record: Record,
    now: DateTime<Utc>,
) -> Result<Record> {
    let Some(action) = record.lifecycle.clone() else {
        return Ok(record);
    };
    if action.completed.is_some() {
        return Ok(record);
    }
    let timeout = if record.drained.is_some() {
        chrono::Duration::zero()
    } else {
        heartbeat_timeout(ctx, &action).await
    };
    let Some(step) = hook_step(&record, now, timeout) else {
        return Ok(record);
    };
    let name = node.name_any();
    if !may_call_hook(node, &record) {
        warn!(controller = CONTROLLER, node = %name, instance = %record.instance_id, "lifecycle action recorded for another instance than the node's; not touched");
        return Ok(record);
    }
    let call = action.call(&record.instance_id);
    let (verb, kind) = match step {
        HookStep::Heartbeat => ("lifecycle_action_heartbeat", HookCallKind::Heartbeat),
        HookStep::Complete => ("complete_lifecycle_action", HookCallKind::Continue),
    };
    let cloud = ctx.cloud.cloud(action.region.as_deref());
    let applied = ctx
        .mutations
        .perform(
            Intent::aws(
                verb,
                format!("asg/{}", action.auto_scaling_group),
                format!("{} of {} ({})", action.hook, record.instance_id, name),
            ),
            || cloud.lifecycle_action(&call, kind),
        )
        .await?;
    let Some(waiting) = applied.performed() else {
        return Ok(record);
    };
    let done = step == HookStep::Complete || !waiting;
    let next = Record {
        lifecycle: Some(HookAction {
            heartbeat: (step == HookStep::Heartbeat)
                .then_some(now)
                .or(action.heartbeat),
            completed: done.then_some(now),
            ..action
        }),
        ..record
    };
    write_record(ctx, &name, &next, verb).await?;
    if step == HookStep::Complete {
        let note = format!(
            "lifecycle action {} of {} completed (CONTINUE): its ASG terminates it now",
            next.lifecycle
                .as_ref()
                .map(|a| a.hook.as_str())
                .unwrap_or_default(),
            next.instance_id
        );
        event(
            ctx,
            node,
            &next,
            EventType::Normal,
            Reason::LifecycleActionCompleted,
            note,
        )
        .await;
    }
    Ok(next)
}

/// Records the drain's end in the mark, so it is not reported twice; false
/// when it was recorded already. The Node this reconcile was given can lag
/// our own last write (a watch event queued before it lands after it), so
/// the record is read afresh first: a drain is reported once.
async fn finish(
    ctx: &Context,
    node: &Node,
    record: &Record,
    now: DateTime<Utc>,
    left: usize,
) -> Result<bool> {
    let name = node.name_any();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let fresh = nodes.get_opt(&name).await.map_err(Error::kube(format!(
        "read node {name} before recording its drain"
    )))?;
    if !should_record_drain(fresh.as_ref().and_then(interruption_record::record_of)) {
        debug!(controller = CONTROLLER, node = %name, "drain recorded already (stale view); not reported again");
        return Ok(false);
    }
    let done = Record {
        drained: Some(now),
        pods_left: Some(left as i32),
        ..record.clone()
    };
    write_record(ctx, &name, &done, "record_interruption_drain").await?;
    Ok(true)
}

/// Pure: a drain's end is recorded (and reported) only while the Node, read
/// afresh, still carries a mark without one. A Node gone or unmarked since
/// has nothing to record.
pub fn should_record_drain(fresh: Option<Record>) -> bool {
    fresh.is_some_and(|r| r.drained.is_none())
}

/// Replaces the mark's record on the node.
async fn write_record(
    ctx: &Context,
    name: &str,
    record: &Record,
    verb: &'static str,
) -> Result<()> {
    let patch = serde_json::json!({
        "metadata": {"annotations": {crate::crd::labels::INTERRUPTION_ANNOTATION: serde_json::to_string(record).unwrap_or_default()}},
    });
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    ctx.mutations
        .perform(
            Intent::kube(verb, format!("node/{name}"), record.kind.clone()),
            || async {
                nodes
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(Error::kube(format!(
                        "record the interruption of node {name}"
                    )))
            },
        )
        .await?;
    Ok(())
}

/// An Event on the Node and on its NodeGroup (named in the mark).
async fn event(
    ctx: &Context,
    node: &Node,
    record: &Record,
    type_: EventType,
    reason: Reason,
    note: String,
) {
    let on_node = crate::k8s::drain::node_ref(&node.name_any());
    if let Some((namespace, name)) = record.group.as_deref().and_then(|g| g.split_once('/')) {
        let on_group = ObjectReference {
            api_version: Some("nodemanager.dev/v1alpha1".into()),
            kind: Some("NodeGroup".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            ..Default::default()
        };
        let related = Some(&on_node);
        ctx.event_related(
            &on_group,
            related,
            type_,
            reason,
            EVENT_ACTION,
            note.clone(),
        )
        .await;
    }
    ctx.event(&on_node, type_, reason, EVENT_ACTION, note).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn record(deadline_in: i64, drained: bool) -> (Record, DateTime<Utc>) {
        let now = Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap();
        (
            Record {
                kind: "spot_interruption".into(),
                instance_id: "i-1".into(),
                noticed: now - chrono::Duration::seconds(10),
                deadline: now + chrono::Duration::seconds(deadline_in),
                drained: drained.then_some(now),
                pods_left: None,
                loss_at: None,
                drain_from: None,
                late: None,
                lifecycle: None,
                scope: None,
                group: None,
            },
            now,
        )
    }

    #[test]
    fn grace_periods_are_capped_by_the_time_left_and_the_deadline_ends_the_drain() {
        let (r, now) = record(80, false);
        assert_eq!(decide(&r, true, now), Decision::Evict { max_grace: 80 });
        let (r, now) = record(0, false);
        assert_eq!(decide(&r, true, now), Decision::Deadline);
        let (r, now) = record(1, false);
        let early = now + chrono::Duration::milliseconds(400);
        assert_eq!(
            decide(&r, true, early),
            Decision::Evict { max_grace: 1 },
            "not ended before its deadline"
        );
        let (r, now) = record(-5, false);
        assert_eq!(decide(&r, true, now), Decision::Deadline);
        let (r, now) = record(80, true);
        assert_eq!(
            decide(&r, true, now),
            Decision::Done,
            "recorded: never twice"
        );
    }

    #[test]
    fn a_scheduled_change_is_cordoned_at_its_drain_start_and_drained_after() {
        let (r, now) = record(2 * 24 * 3600, false);
        let from = now + chrono::Duration::hours(47);
        let r = Record {
            kind: "scheduled_change".into(),
            drain_from: Some(from),
            ..r
        };
        assert_eq!(decide(&r, false, now), Decision::NotYet { from });
        assert_eq!(decide(&r, false, from), Decision::Cordon);
        assert_eq!(decide(&r, true, from), Decision::Evict { max_grace: 3600 });
        // A spot warning's mark lost its cordon: put back before evicting.
        let (spot, now) = record(80, false);
        assert_eq!(decide(&spot, false, now), Decision::Cordon);
    }

    #[test]
    fn a_drain_recorded_since_the_view_was_taken_is_not_recorded_again() {
        let (pending, _) = record(80, false);
        let (drained, _) = record(80, true);
        assert!(should_record_drain(Some(pending)));
        assert!(
            !should_record_drain(Some(drained)),
            "the fresh Node has the drain recorded: a stale view must not report it twice"
        );
        assert!(
            !should_record_drain(None),
            "gone or unmarked: nothing to record"
        );
    }

    #[test]
    fn a_hook_is_called_only_for_the_node_on_the_actions_instance() {
        let (mut r, _) = record(80, false);
        let node = |provider: Option<&str>| Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                provider_id: provider.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ours = node(Some("aws:///ap-northeast-1a/i-1"));
        assert!(!may_call_hook(&ours, &r), "no action recorded");
        r.lifecycle = Some(HookAction {
            auto_scaling_group: "asg-a".into(),
            hook: "h".into(),
            token: "t".into(),
            region: None,
            heartbeat: None,
            completed: None,
        });
        assert!(may_call_hook(&ours, &r));
        assert!(!may_call_hook(
            &node(Some("aws:///ap-northeast-1a/i-11")),
            &r
        ));
        assert!(!may_call_hook(&node(None), &r));
        r.instance_id = String::new();
        assert!(!may_call_hook(&node(Some("aws:///ap-northeast-1a/")), &r));
    }
}
