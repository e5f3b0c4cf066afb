//! The interruption handler's loop: long-poll the queue, plan each message
//! ([`super::plan`]), persist its steps on the nodes, then delete it. A
//! message whose steps fail is not deleted: it comes back after its
//! visibility timeout, and the node marks make the retry do nothing twice.

use super::lookup::{GroupWatch, Groups, NodeCache, unmanaged};
use super::message;
use super::ownership::Owner;
use super::plan::{self, MessagePlan, Response};
use crate::Result;
use crate::cloud::sqs::{Queue, Received};
use crate::context::Context;
use crate::events::Reason;
use crate::k8s::drain::node_ref;
use crate::k8s::interruption_record::{self, Record};
use crate::mutation::Intent;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::runtime::events::EventType;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const CONTROLLER: &str = "interruption";
/// Messages handled at once. Receiving goes on while earlier messages are
/// handled (a burst is not handled batch after batch), until this many are
/// in flight: enough for a whole pool reclaimed at once (at 32, a burst of
/// 150 waited on the permits, p99 4 s in the bench).
const CONCURRENCY: usize = 256;
const EVENT_ACTION: &str = "Interruption";
/// Events published at once. A message's Events wait for a permit after
/// its marks, so in a burst the marks go first: beside 150 messages'
/// Events at once, the marks took twice as long (p50 0.6-0.9 s at 150).
const EVENTS_AT_ONCE: usize = 4;

/// Long polls in flight at once, always. SQS hands out a sample of the
/// queue per receive (often fewer than the 10 asked for), so a burst
/// arrives faster through a few concurrent polls; each message is still
/// handled once at a time (invisible to the others while handled).
const RECEIVERS: usize = 3;
/// Short polls added while a burst lasts: a receive that comes back full
/// (10) says more are waiting, so another receiver joins, until one comes
/// back short. Idle, only the long polls run (their cost is the budget's).
const BURST_RECEIVERS: usize = 8;
/// SQS's most messages per receive.
const MAX_BATCH: usize = 10;

/// What the receivers share.
struct Receivers {
    ctx: Arc<Context>,
    queue: Arc<Queue>,
    in_flight: Arc<tokio::sync::Semaphore>,
    events: Arc<tokio::sync::Semaphore>,
    groups: GroupWatch,
    nodes: Arc<NodeCache>,
    shutdown: CancellationToken,
    /// Burst receivers running.
    bursting: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Poll {
    /// Waits up to 20 s for a message; runs until shutdown.
    Long,
    /// Returns at once; ends at the first batch that is not full.
    Burst,
}

/// Runs until `shutdown`: receive, handle, repeat; SQS errors back off
/// (1 s doubling to 1 min) and never stop the loop.
pub async fn run(ctx: Arc<Context>, queue: Arc<Queue>, shutdown: CancellationToken) {
    info!(controller = CONTROLLER, queue = %queue.url(), "interruption handler started");
    // Nothing is received before the groups are known: a message judged on
    // an empty view would name no instance of ours.
    let Some(groups) = GroupWatch::start(&ctx, &shutdown).await else {
        info!(controller = CONTROLLER, "interruption handler stopped");
        return;
    };
    let shared = Arc::new(Receivers {
        ctx,
        queue,
        in_flight: Arc::new(tokio::sync::Semaphore::new(CONCURRENCY)),
        events: Arc::new(tokio::sync::Semaphore::new(EVENTS_AT_ONCE)),
        groups,
        nodes: Default::default(),
        shutdown,
        bursting: Default::default(),
    });
    let mut receivers = tokio::task::JoinSet::new();
    for _ in 0..RECEIVERS {
        receivers.spawn(receive_loop(shared.clone(), Poll::Long));
    }
    while receivers.join_next().await.is_some() {}
    // Burst receivers end by themselves (a short batch, or the shutdown),
    // after the messages they took.
    while shared.bursting.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    info!(controller = CONTROLLER, "interruption handler stopped");
}

/// Adds a burst receiver unless [`BURST_RECEIVERS`] run already.
fn join_the_burst(shared: &Arc<Receivers>) {
    use std::sync::atomic::Ordering::SeqCst;
    let added = shared
        .bursting
        .fetch_update(SeqCst, SeqCst, |n| (n < BURST_RECEIVERS).then_some(n + 1));
    if added.is_ok() {
        tokio::spawn(Box::pin(receive_loop(shared.clone(), Poll::Burst)));
    }
}

async fn receive_loop(shared: Arc<Receivers>, poll: Poll) {
    let Receivers {
        ctx,
        queue,
        in_flight,
        events,
        groups,
        nodes,
        shutdown,
        ..
    } = &*shared;
    let wait = match poll {
        Poll::Long => 20,
        Poll::Burst => 0,
    };
    let mut backoff = Duration::from_secs(1);
    let mut handling = tokio::task::JoinSet::new();
    loop {
        let batch = tokio::select! {
            _ = shutdown.cancelled() => break,
            batch = queue.receive_waiting(wait) => batch,
        };
        match batch {
            Ok(messages) => {
                backoff = Duration::from_secs(1);
                let full = messages.len() >= MAX_BATCH;
                if full {
                    join_the_burst(&shared);
                }
                if messages.is_empty() {
                    if poll == Poll::Burst {
                        break;
                    }
                    continue;
                }
                debug!(
                    controller = CONTROLLER,
                    count = messages.len(),
                    ?poll,
                    "received"
                );
                let groups = Arc::new(groups.groups());
                for m in messages {
                    let Ok(permit) = in_flight.clone().acquire_owned().await else {
                        break;
                    };
                    let (ctx, queue, groups) = (ctx.clone(), queue.clone(), groups.clone());
                    let (nodes, events) = (nodes.clone(), events.clone());
                    handling.spawn(async move {
                        handle(&ctx, &queue, &groups, &nodes, &events, m).await;
                        drop(permit);
                    });
                }
                // Reap what finished; the rest goes on while we receive.
                while handling.try_join_next().is_some() {}
                if poll == Poll::Burst && !full {
                    break;
                }
            }
            Err(e) if poll == Poll::Burst => {
                debug!(controller = CONTROLLER, error = %e, "a burst receive failed; the long polls go on");
                break;
            }
            Err(e) => {
                warn!(controller = CONTROLLER, error = %e, retry_in = ?backoff, "receiving from the queue failed");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
        }
    }
    // Messages being handled finish (each is persisted before it is deleted,
    // so one cut short by the shutdown grace comes back and is redone once).
    while handling.join_next().await.is_some() {}
    if poll == Poll::Burst {
        shared
            .bursting
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn handle(
    ctx: &Context,
    queue: &Queue,
    groups: &Groups,
    nodes: &NodeCache,
    events: &tokio::sync::Semaphore,
    received: Received,
) {
    let parsed = message::parse(&received.body);
    let id = received.message_id.as_deref().unwrap_or("-");
    let unmanaged = match unmanaged(ctx, nodes, groups, &parsed).await {
        Ok(u) => u,
        Err(e) => {
            // It comes back after its visibility timeout.
            warn!(controller = CONTROLLER, message = id, error = %e, "cannot read the Nodes; message left on the queue");
            ctx.metrics.interruption_message("unknown", "failed");
            return;
        }
    };
    let plan = plan::plan(
        &parsed,
        &groups.ownership,
        &unmanaged,
        groups,
        ctx.settings.interruption.foreign_messages,
        ctx.clock.now(),
    );
    match plan.outcome {
        "rejected" => {
            warn!(
                controller = CONTROLLER,
                message = id,
                kind = plan.kind,
                "{}; deleting it",
                plan.summary
            )
        }
        _ => {
            info!(
                controller = CONTROLLER,
                message = id,
                kind = plan.kind,
                outcome = plan.outcome,
                "{}",
                plan.summary
            )
        }
    }
    let carried = carry_out(ctx, groups, events, &plan).await;
    if carried.is_ok() && !plan.steps.is_empty() {
        // Between the persisted marks and the message's deletion.
        crate::crash_points::crash_point("interruption:marked");
    }
    let outcome = match carried {
        Ok(()) if plan.delete => match queue.delete(&ctx.mutations, &received.receipt).await {
            Ok(()) => plan.outcome,
            Err(e) => {
                warn!(controller = CONTROLLER, message = id, error = %e, "deleting the message failed; it comes back and is handled again (nothing twice)");
                "failed"
            }
        },
        Ok(()) => plan.outcome,
        Err(e) => {
            warn!(controller = CONTROLLER, message = id, error = %e, "handling the message failed; it comes back after its visibility timeout");
            "failed"
        }
    };
    ctx.metrics.interruption_message(plan.kind, outcome);
}

async fn carry_out(
    ctx: &Context,
    groups: &Groups,
    events: &tokio::sync::Semaphore,
    plan: &MessagePlan,
) -> Result<()> {
    for step in &plan.steps {
        // Held for the Events only (the semaphore is never closed: an error
        // would only mean publishing without a permit).
        let permit = || events.acquire();
        match step {
            Response::Mark {
                owner,
                node,
                record,
            } => {
                if interruption_record::mark(ctx, node, record, may_mark(record)).await? {
                    let _permit = permit().await;
                    announce_mark(ctx, groups, owner, node, record).await;
                }
            }
            Response::MarkUnmanaged { node, record } => {
                if interruption_record::mark(ctx, node, record, may_mark(record)).await? {
                    let note = format!(
                        "{} for {} ({}), a node of no NodeGroup: cordoned and tainted, drained by {}; not replaced by this manager (its ASG replaces it once AWS takes it)",
                        record.kind,
                        node,
                        record.instance_id,
                        record.deadline.to_rfc3339()
                    );
                    let on = node_ref(node);
                    let _permit = permit().await;
                    ctx.event(
                        &on,
                        EventType::Warning,
                        Reason::InterruptionNotice,
                        EVENT_ACTION,
                        note,
                    )
                    .await;
                }
            }
            Response::Complete {
                owner,
                instance_id,
                action,
            } => {
                complete_unjoined(ctx, groups, owner, instance_id, action).await?;
            }
            // The message stays; its next delivery finds the Node.
            Response::AwaitNode { instance_id, .. } => {
                debug!(controller = CONTROLLER, instance = %instance_id, "no Node has joined for it yet; the message stays on the queue");
            }
            Response::Note {
                owner,
                reason,
                note,
                ..
            } => {
                let node = owner.node.as_deref();
                let _permit = permit().await;
                event(
                    ctx,
                    groups,
                    owner,
                    node,
                    EventType::Normal,
                    *reason,
                    note.clone(),
                )
                .await;
            }
        }
    }
    Ok(())
}

/// The rule book's check of a mark's cordon, on the Node the mark is
/// planned on: the drainer's, whose first effect the mark is.
fn may_mark(record: &Record) -> impl Fn(&Node) -> Result<()> + '_ {
    |node| {
        let instance = &record.instance_id;
        crate::controllers::interruption::drainer::check::may_mark(node, instance)
            .map_err(|refused| crate::controllers::guard::Refusal::Rule(refused).into())
    }
}

/// The Events of a node just marked: a loss or a recommendation acted on.
async fn announce_mark(ctx: &Context, groups: &Groups, owner: &Owner, node: &str, record: &Record) {
    if !record.is_loss() {
        let note = format!(
            "rebalance recommendation for {} ({}): at elevated risk of interruption; a replacement is launched, then the node is drained and removed (onRebalanceRecommendation Replace)",
            node, record.instance_id
        );
        let reason = Reason::RebalanceRecommendation;
        event(
            ctx,
            groups,
            owner,
            Some(node),
            EventType::Normal,
            reason,
            note,
        )
        .await;
    } else {
        let age = ctx.clock.now() - record.noticed;
        ctx.metrics
            .interruption_age(age.to_std().unwrap_or_default());
        let now = ctx.clock.now();
        let mut note = match record.drain_from.filter(|_| !record.leaving(now)) {
            Some(from) => format!(
                "{} for {} ({}): serves on until {}, then replaced, cordoned and drained (interruption.scheduledChangeLead); drain deadline {}",
                record.kind,
                node,
                record.instance_id,
                from.to_rfc3339(),
                record.deadline.to_rfc3339()
            ),
            None => format!(
                "{} for {} ({}): cordoned and tainted; drain deadline {}",
                record.kind,
                node,
                record.instance_id,
                record.deadline.to_rfc3339()
            ),
        };
        if let Some(loss) = record.loss_at {
            note.push_str(&format!(
                "; AWS takes the instance at {}",
                loss.to_rfc3339()
            ));
        }
        if record.late == Some(true) {
            note.push_str(&format!(
                "; the notice came late (AWS sent it at {}), its pods are evicted anyway",
                record.noticed.to_rfc3339()
            ));
        }
        event(
            ctx,
            groups,
            owner,
            Some(node),
            EventType::Warning,
            Reason::InterruptionNotice,
            note,
        )
        .await;
    }
}

/// A terminate lifecycle action for an instance of ours that never joined:
/// nothing to drain, so its ASG need not wait out the hook's timeout. No
/// disruption the rule book judges: its ASG is terminating the instance
/// already (CONTINUE and the hook's timeout end alike), and no Node serves
/// on it, so this call takes no capacity away.
async fn complete_unjoined(
    ctx: &Context,
    groups: &Groups,
    owner: &Owner,
    instance_id: &str,
    action: &crate::k8s::interruption_record::HookAction,
) -> Result<()> {
    let call = action.call(instance_id);
    let cloud = ctx.cloud.cloud(action.region.as_deref());
    ctx.mutations
        .perform(
            Intent::aws(
                "complete_lifecycle_action",
                format!("asg/{}", action.auto_scaling_group),
                format!("{} of {instance_id} (never joined)", action.hook),
            ),
            || cloud.lifecycle_action(&call, crate::cloud::HookCallKind::Continue),
        )
        .await?;
    let note = format!(
        "lifecycle action {} of {instance_id} completed (CONTINUE): it never joined, nothing to drain",
        action.hook
    );
    event(
        ctx,
        groups,
        owner,
        None,
        EventType::Normal,
        Reason::LifecycleActionCompleted,
        note,
    )
    .await;
    Ok(())
}

/// An Event on the NodeGroup and, when there is one, on the Node.
async fn event(
    ctx: &Context,
    groups: &Groups,
    owner: &Owner,
    node: Option<&str>,
    type_: EventType,
    reason: Reason,
    note: String,
) {
    let on_node = node.map(node_ref);
    if let Some(group) = groups
        .by_name
        .get(&(owner.namespace.clone(), owner.group.clone()))
    {
        let on_group = group.object_ref(&());
        ctx.event_related(
            &on_group,
            on_node.as_ref(),
            type_,
            reason,
            EVENT_ACTION,
            note.clone(),
        )
        .await;
    }
    if let Some(on_node) = on_node {
        ctx.event(&on_node, type_, reason, EVENT_ACTION, note).await;
    }
}
