//! The drainer's executor against the world: the mark on the Node (its
//! status), the cordon and evictions, the lifecycle action's completion,
//! and the Events that tell them, each change through the mutation gate.

use super::EVENT_ACTION;
use super::check::Fresh;
use super::plan::{Interrupted, Mark};
use crate::cloud::HookCallKind;
use crate::context::Context;
use crate::controllers::command::Effect;
use crate::controllers::execute::{Drained, Effects, not_this_path};
use crate::controllers::guard::Refusal;
use crate::events::Reason;
use crate::k8s::drain::drain_step_within;
use crate::k8s::interruption_record::{self, Record};
use crate::mutation::Intent;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use std::time::Duration;

/// Pods named in an Event at most (a note over 1 KiB is refused).
const NAMED_PODS: usize = 10;

/// One reconcile's view of a marked Node, and what it acts through.
pub(super) struct Drainer<'a> {
    pub ctx: &'a Context,
    pub fresh: Fresh<'a>,
    /// The drain's end, told once it is written: whether at the deadline,
    /// and what was left then.
    pub ending: (bool, Vec<String>),
    /// Its end was told (the mark read afresh had none).
    pub told: bool,
}

impl Drainer<'_> {
    fn node(&self) -> &Node {
        self.fresh.node
    }

    /// The mark's cordon and taint, deferred to the drain start of a
    /// scheduled change (or lost to someone's uncordon), put on; said in
    /// an Event.
    async fn cordon(&self, record: &Record) -> Result<()> {
        let name = self.node().name_any();
        // Its guard asked the rule book before this drain step.
        let asked = |_: &Node| Ok(());
        if interruption_record::mark(self.ctx, &name, record, asked).await? {
            let now = self.fresh.now;
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
                self.ctx,
                self.node(),
                record,
                EventType::Warning,
                Reason::InterruptionNotice,
                note,
            )
            .await;
        }
        Ok(())
    }
}

impl Effects for Drainer<'_> {
    type Record = Mark;

    fn guard(&self, status: &Mark, effect: Effect<'_, Interrupted>) -> Result<(), Refusal> {
        self.fresh.check(status, effect)
    }

    fn dry_run(&self) -> bool {
        self.ctx.settings.dry_run
    }

    /// The mark written; a drain's end it records for the first time is
    /// told then, before the lifecycle action it lets go is completed.
    async fn write_status(&mut self, status: &Mark) -> Result<()> {
        let name = &status.on.node;
        write_record(self.ctx, name, &status.record, "record_interruption_drain").await?;
        if status.record.drained.is_some() && !self.told {
            self.told = true;
            let (at_deadline, left) = &self.ending;
            let (node, now) = (self.fresh.node, self.fresh.now);
            drain_ended(self.ctx, node, &status.record, now, *at_deadline, left).await;
        }
        Ok(())
    }

    fn reached(&mut self, point: &str) -> Result<()> {
        crate::crash_points::crash_point(point);
        Ok(())
    }

    /// A cordon while the node lacks the mark's, else evictions with grace
    /// periods cut to the time left before the deadline.
    async fn drain_step(
        &mut self,
        target: &Interrupted,
        status: &Mark,
        _first: bool,
        _why: &str,
    ) -> Result<Drained> {
        let record = &status.record;
        let now = self.fresh.now;
        // Soon: the deadline is seconds away.
        let soon = Duration::from_millis(500);
        if interruption_record::mark_patch(self.node(), record, now).is_some() {
            self.cordon(record).await?;
            // The patched node comes back through the watch.
            return Ok(Drained {
                done: false,
                requeue: soon,
                blocked_by: None,
            });
        }
        let max_grace = (record.deadline - now).num_seconds().max(1);
        let progress = drain_step_within(self.ctx, &target.node, Some(max_grace)).await?;
        Ok(Drained {
            done: progress.done(),
            requeue: soon,
            blocked_by: (!progress.blocked.is_empty()).then(|| progress.blocked.join(", ")),
        })
    }

    /// The drain's end lets AWS take the instance; a terminate lifecycle
    /// action holding it is completed (CONTINUE) so its ASG goes on now.
    /// Whether an action was completed.
    async fn terminate(&mut self, removal: Effect<'_, Interrupted>, status: &Mark) -> Result<bool> {
        let Effect::Terminate(target) = removal else {
            return not_this_path(&format!("{removal:?}"));
        };
        let Some(action) = status
            .record
            .lifecycle
            .as_ref()
            .filter(|a| a.completed.is_none())
        else {
            return Ok(false);
        };
        let call = action.call(&target.instance_id);
        let cloud = self.ctx.cloud.cloud(action.region.as_deref());
        let applied = self
            .ctx
            .mutations
            .perform(
                Intent::aws(
                    "complete_lifecycle_action",
                    format!("asg/{}", action.auto_scaling_group),
                    format!(
                        "{} of {} ({})",
                        action.hook, target.instance_id, target.node
                    ),
                ),
                || cloud.lifecycle_action(&call, HookCallKind::Continue),
            )
            .await?;
        Ok(applied.performed().is_some())
    }

    async fn done(&mut self, done: Effect<'_, Interrupted>, status: &Mark, _why: &str) {
        if let Effect::Terminate(target) = done {
            let hook = status.record.lifecycle.as_ref().map(|a| a.hook.as_str());
            let note = format!(
                "lifecycle action {} of {} completed (CONTINUE): its ASG terminates it now",
                hook.unwrap_or_default(),
                target.instance_id
            );
            event(
                self.ctx,
                self.node(),
                &status.record,
                EventType::Normal,
                Reason::LifecycleActionCompleted,
                note,
            )
            .await;
        }
    }
}

/// Tells a drain's end, recorded this reconcile: drained, or what was left
/// at the deadline (`at_deadline`), by name.
async fn drain_ended(
    ctx: &Context,
    node: &Node,
    record: &Record,
    now: DateTime<Utc>,
    at_deadline: bool,
    left: &[String],
) {
    let name = node.name_any();
    if at_deadline && left.is_empty() {
        // Nothing left to name: the pods went by themselves.
        return;
    }
    if left.is_empty() {
        let note = format!(
            "drained {name} ({} of {}) {}s before its deadline",
            record.kind,
            record.instance_id,
            (record.deadline - now).num_seconds()
        );
        let reason = Reason::InterruptionDrained;
        event(ctx, node, record, EventType::Normal, reason, note).await;
        ctx.metrics.drain("finished");
        return;
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
    let reason = Reason::InterruptionDrainIncomplete;
    event(ctx, node, record, EventType::Warning, reason, note).await;
    ctx.metrics.drain("timed_out");
}

/// Replaces the mark's record on the node.
pub(super) async fn write_record(
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
