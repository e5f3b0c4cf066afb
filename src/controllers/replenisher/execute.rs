//! The replenisher's executor: one planned command carried out, persist then
//! act. Each mutation is re-checked by `guard` against the fresh describe
//! just before it is made; the status that records it is written first.

use super::guard;
use super::plan::{self as replenish_plan, Command};
use crate::Result;
use crate::cloud::{AsgDescription, Cloud};
use crate::context::Context;
use crate::controllers::aws_mutations::{set_desired_capacity, terminate_in_group};
use crate::controllers::group_view::{REPAIR_DRAIN_TIMEOUT, after};
use crate::controllers::persist::{persist_then, write_if_changed};
use crate::crd::replenisher::{CleanupTarget, ReplenishPhase, Retirement, ScaleInTarget};
use crate::crd::{NodeGroup, NodeGroupStatus, Replenisher, ReplenisherStatus};
use crate::events::Reason;
use crate::k8s::drain::{drain_event, drain_step, next_step_after, uncordon};
use crate::k8s::lock::{self, Acquired, Holder};
use crate::mutation::Applied;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use std::sync::Arc;
use std::time::Duration;
use tracing::debug;

const EVENT_ACTION: &str = "Replenish";

/// What carrying out one command needs, and what it changes: the status to
/// write (`status`), what is stored (`written`), when to look again.
pub(super) struct Step<'a> {
    pub ctx: &'a Context,
    /// The Replenisher's namespace and name.
    pub at: (&'a str, &'a str),
    pub written: Option<ReplenisherStatus>,
    pub status: ReplenisherStatus,
    pub cloud: &'a Arc<dyn Cloud>,
    pub group: &'a NodeGroup,
    pub group_status: &'a NodeGroupStatus,
    /// The ASGs as AWS described them for this reconcile.
    pub fresh: &'a [AsgDescription],
    pub group_ref: ObjectReference,
    pub message: &'a str,
    pub slots: &'a crate::k8s::disruption_slot::Slots<'a>,
    /// Masters: the cluster's control plane, for the authority's re-check.
    pub control_plane: Option<&'a crate::controllers::authority::ControlPlane>,
    pub now: DateTime<Utc>,
    pub requeue: Duration,
}

impl Step<'_> {
    /// Carries out `command`; `draining` is the scale-in target stored
    /// before this reconcile (a drain's first step starts its Events).
    pub async fn carry_out(
        &mut self,
        command: Command,
        me: &Holder,
        draining: Option<&ScaleInTarget>,
    ) -> Result<()> {
        match command {
            Command::Nothing => {}
            Command::TakeLock => self.take_lock(me).await?,
            Command::ReleaseLock => {
                // The slot first: held only with the lock, so a restart
                // between the two still finds the lock ours, and gives
                // the lock back then (a slot is looked at with the lock).
                self.slots.release().await?;
                lock::release(self.ctx, self.group, me).await?;
            }
            Command::TakeSlot => {
                self.requeue = match self.slots.take(self.now).await? {
                    true => Duration::from_millis(100),
                    false => Duration::from_secs(1),
                };
            }
            Command::ScaleUp(changes) => self.scale_up(&changes).await?,
            Command::RemoveNotJoined(target) => self.remove_not_joined(&target).await?,
            Command::Drain(target) => {
                let first_step = draining != Some(&target);
                self.drain(&target, first_step).await?
            }
            Command::Terminate(target) => {
                self.guard_removal(&target)?;
                self.terminate_scale_in(&target).await?;
                if self.status.scale_in.is_none() {
                    self.last_action_event(Reason::ScaledDown).await;
                }
            }
            Command::Retire(retiring) => self.retire(&retiring).await?,
            Command::AbandonScaleIn { target, reason } => {
                self.abandon_scale_in(&target, reason).await?
            }
        }
        Ok(())
    }

    async fn take_lock(&mut self, me: &Holder) -> Result<()> {
        match lock::acquire(self.ctx, self.group, me, self.now).await? {
            Acquired::Yes => self.requeue = Duration::from_millis(100),
            Acquired::Conflict => self.requeue = Duration::from_secs(1),
            Acquired::No(holder) => {
                self.status.phase = ReplenishPhase::Paused;
                debug!(replenisher = %self.at.1, ?holder, "lock held");
            }
        }
        Ok(())
    }

    async fn scale_up(
        &mut self,
        changes: &[crate::controllers::group_view::DesiredChange],
    ) -> Result<()> {
        guard::scale_up(self.group, self.fresh, changes)?;
        if self.ctx.settings.dry_run {
            // Nothing will be made: record nothing as done, not even
            // between this write and the next.
            replenish_plan::raise_not_made(&mut self.status);
        }
        let (ctx, cloud, message) = (self.ctx, self.cloud, self.message);
        let performed = persist_then::<Replenisher, _, _, _, _>(
            ctx,
            self.at,
            &mut self.written,
            &self.status,
            "replenisher:scale_up",
            || async {
                let mut performed = true;
                for change in changes {
                    let applied =
                        set_desired_capacity(ctx, cloud.as_ref(), change, message).await?;
                    performed &= applied.performed().is_some();
                }
                Ok(performed)
            },
        )
        .await?;
        if !performed {
            replenish_plan::raise_not_made(&mut self.status);
        } else {
            replenish_plan::raise_landed(&mut self.status);
            let fallback = changes.iter().any(|c| self.group.spec.is_fallback(&c.asg));
            let (kind, reason) = match fallback {
                true => (EventType::Warning, Reason::FallbackRaised),
                false => (EventType::Normal, Reason::ScaledUp),
            };
            self.event(kind, reason, self.message.to_string()).await;
        }
        Ok(())
    }

    async fn remove_not_joined(&mut self, target: &CleanupTarget) -> Result<()> {
        guard::not_joined(self.group, self.fresh, target, self.control_plane)?;
        let why = format!("{}: {}", target.auto_scaling_group, target.reason);
        let applied = self
            .persist_then_terminate(
                "replenisher:remove_not_joined",
                &target.instance_id,
                target.decrement,
                why,
            )
            .await?;
        if applied.performed().is_none() {
            return Ok(());
        }
        replenish_plan::finish_cleanup(&mut self.status);
        self.event(
            EventType::Warning,
            Reason::RemovedNotJoined,
            self.message.to_string(),
        )
        .await;
        let again = self
            .status
            .removals
            .iter()
            .find(|r| r.auto_scaling_group == target.auto_scaling_group && r.count > 1)
            .map(|run| {
                format!(
                    "{} instance(s) of {} in a row never joined; the next removal there waits until {}",
                    run.count,
                    run.auto_scaling_group,
                    run.retry_after.to_rfc3339()
                )
            });
        if let Some(message) = again {
            self.event(EventType::Warning, Reason::NotJoinedAgain, message)
                .await;
        }
        Ok(())
    }

    async fn drain(&mut self, target: &ScaleInTarget, first_step: bool) -> Result<()> {
        let ctx = self.ctx;
        // The target is in the status: written before the first eviction.
        write_if_changed::<Replenisher, _>(ctx, self.at, &mut self.written, &self.status).await?;
        if first_step {
            ctx.metrics.drain("started");
            let message = format!("draining {} ({})", target.node, self.message);
            drain_event(
                ctx,
                &self.group_ref,
                &target.node,
                EventType::Normal,
                Reason::DrainStarted,
                EVENT_ACTION,
                message,
            )
            .await;
        }
        let progress = drain_step(ctx, &target.node).await?;
        if !progress.blocked.is_empty() {
            let message = format!(
                "draining {}: blocked by a PodDisruptionBudget: {}",
                target.node,
                progress.blocked.join(", ")
            );
            drain_event(
                ctx,
                &self.group_ref,
                &target.node,
                EventType::Warning,
                Reason::DrainBlocked,
                EVENT_ACTION,
                message,
            )
            .await;
        }
        // A repair ends its best effort at REPAIR_DRAIN_TIMEOUT.
        let effort_over = target.repair && self.now >= after(target.since, REPAIR_DRAIN_TIMEOUT);
        if !progress.done_for(target.repair) && !effort_over {
            self.requeue = next_step_after(target.since, self.now);
            return Ok(());
        }
        self.guard_removal(target)?;
        if let Some(target) = replenish_plan::record_termination(&mut self.status, self.now) {
            self.terminate_scale_in(&target).await?;
            ctx.metrics.drain("finished");
            if self.status.scale_in.is_none() {
                self.last_action_event(Reason::ScaledDown).await;
            }
        }
        Ok(())
    }

    /// The recorded termination of a drained scale-in target (with decrement
    /// unless it says otherwise): written, then made, then marked done.
    async fn terminate_scale_in(&mut self, target: &ScaleInTarget) -> Result<()> {
        let why = format!(
            "{}{}: scale-in of {}",
            if target.decrement { "decrement " } else { "" },
            target.auto_scaling_group,
            target.node
        );
        let applied = self
            .persist_then_terminate(
                "replenisher:scale_in",
                &target.instance_id,
                target.decrement,
                why,
            )
            .await?;
        if let Applied::Performed(()) = applied {
            replenish_plan::finish_scale_in(&mut self.status, target);
            if self.group.spec.is_fallback(&target.auto_scaling_group) {
                let message = format!(
                    "{} ({}) returned from the on-demand {}: its spot replacement is Ready",
                    target.node, target.instance_id, target.auto_scaling_group
                );
                self.event(EventType::Normal, Reason::ReturnedToSpot, message)
                    .await;
            }
            if target.repair {
                self.ctx.metrics.node_repair("repaired");
                let message = format!(
                    "{} ({}) was NotReady for over {}: terminated in {}{}",
                    target.node,
                    target.instance_id,
                    crate::duration::format(self.group.spec.replenish.unhealthy_timeout()),
                    target.auto_scaling_group,
                    if target.decrement {
                        " with decrement (its replacement was launched first)"
                    } else {
                        " (its ASG launches a replacement)"
                    }
                );
                drain_event(
                    self.ctx,
                    &self.group_ref,
                    &target.node,
                    EventType::Normal,
                    Reason::NodeRepaired,
                    EVENT_ACTION,
                    message,
                )
                .await;
            }
        }
        Ok(())
    }

    /// The check before a scale-in's termination: a repair's own (the node
    /// is unhealthy), else Ready stays at desired without it.
    fn guard_removal(&self, target: &ScaleInTarget) -> Result<()> {
        match target.repair {
            true => guard::repair(
                self.group,
                self.group_status,
                self.fresh,
                target,
                self.control_plane,
                self.now,
            )?,
            false => guard::scale_in(
                self.group,
                self.group_status,
                self.fresh,
                target,
                self.control_plane,
                self.now,
            )?,
        }
        Ok(())
    }

    async fn retire(&mut self, retiring: &[Retirement]) -> Result<()> {
        for r in retiring {
            guard::retire(
                self.group,
                self.group_status,
                self.fresh,
                r,
                self.control_plane,
                self.now,
            )?;
        }
        let (ctx, cloud) = (self.ctx, self.cloud);
        let done = persist_then::<Replenisher, _, _, _, _>(
            ctx,
            self.at,
            &mut self.written,
            &self.status,
            "replenisher:retire",
            || async {
                let mut done = vec![];
                for r in retiring {
                    let why = format!(
                        "{}: interrupted {} replaced{}",
                        r.auto_scaling_group,
                        r.node,
                        if r.decrement { ", decrement" } else { "" }
                    );
                    let applied =
                        terminate_in_group(ctx, cloud.as_ref(), &r.instance_id, r.decrement, why)
                            .await?;
                    if applied.performed().is_some() {
                        done.push(r.instance_id.clone());
                    }
                }
                Ok(done)
            },
        )
        .await?;
        if !done.is_empty() {
            replenish_plan::finish_retiring(&mut self.status, &done);
            self.last_action_event(Reason::InterruptedNodeRemoved).await;
        }
        Ok(())
    }

    async fn abandon_scale_in(&mut self, target: &ScaleInTarget, reason: String) -> Result<()> {
        // Uncordon (idempotent) before the status that forgets the node.
        uncordon(self.ctx, &target.node, "scale-in abandoned").await?;
        replenish_plan::abandon_scale_in(&mut self.status, &reason, self.now);
        if reason.contains("timed out") {
            self.ctx.metrics.drain("timed_out");
        }
        // A repair given up is good news when its node came back.
        let (kind, event_reason) = match target.repair {
            true => (EventType::Normal, Reason::RepairAbandoned),
            false => (EventType::Warning, Reason::ScaleInAbandoned),
        };
        drain_event(
            self.ctx,
            &self.group_ref,
            &target.node,
            kind,
            event_reason,
            EVENT_ACTION,
            reason,
        )
        .await;
        Ok(())
    }

    /// Terminates `instance` in its ASG (with decrement or not) once the
    /// status that records it is written: persist, then act.
    async fn persist_then_terminate(
        &mut self,
        step: &str,
        instance: &str,
        decrement: bool,
        why: String,
    ) -> Result<Applied<()>> {
        let (ctx, cloud) = (self.ctx, self.cloud);
        persist_then::<Replenisher, _, _, _, _>(
            ctx,
            self.at,
            &mut self.written,
            &self.status,
            step,
            || terminate_in_group(ctx, cloud.as_ref(), instance, decrement, why),
        )
        .await
    }

    /// Unhealthy nodes the circuit breaker keeps from repair: a Warning
    /// Event on the group and each node, counted once per episode.
    pub async fn repair_blocked(&self, held: &replenish_plan::RepairHeld) {
        self.ctx.metrics.node_repair("blocked");
        for node in &held.nodes {
            drain_event(
                self.ctx,
                &self.group_ref,
                node,
                EventType::Warning,
                Reason::RepairBlocked,
                EVENT_ACTION,
                held.message.clone(),
            )
            .await;
        }
    }

    async fn event(&self, type_: EventType, reason: Reason, message: String) {
        self.ctx
            .event(&self.group_ref, type_, reason, EVENT_ACTION, message)
            .await;
    }

    /// A Normal Event saying what the status's last action was.
    async fn last_action_event(&self, reason: Reason) {
        let description = self
            .status
            .last_action
            .as_ref()
            .map(|a| a.description.clone())
            .unwrap_or_default();
        self.event(EventType::Normal, reason, description).await;
    }
}
