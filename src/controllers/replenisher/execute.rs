//! The replenisher's executor: one planned command carried out, persist then
//! act. The reconcile runs it against the cluster and AWS (`effects.rs`);
//! the plan's simulation test runs the same function against its simulated
//! group, so the order the test proves safe is the order the controller
//! uses. Every mutation is first re-checked by the guard (`Effects::guard`,
//! the real `guard::replenish` in both): the executor asks, so no
//! implementation can forget to.
//!
//! Order: an uncordon (idempotent) before the status that forgets the node;
//! the status that records an action written, then the action made (named
//! crash points between: `<step>:persisted`, `<step>:acted`).

use super::plan::{self as replenish_plan, Command, Plan};
use crate::Result;
use crate::controllers::group_view::{DesiredChange, REPAIR_DRAIN_TIMEOUT, after};
use crate::controllers::guard::Refusal;
use crate::controllers::guard::replenish::Check;
use crate::crd::NodeGroupSpec;
use crate::crd::ReplenisherStatus;
use crate::crd::replenisher::{CleanupTarget, ReplenishPhase, Retirement, ScaleInTarget};
use crate::events::Reason;
use crate::k8s::drain::{DrainProgress, next_step_after};
use chrono::{DateTime, Utc};
use kube::runtime::events::EventType;
use std::time::Duration;

/// The outcome of asking for the group's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Yes,
    /// A race lost: look again soon.
    Retry,
    /// Held by another operation.
    HeldElsewhere,
}

/// What the executor counts in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    DrainStarted,
    DrainFinished,
    DrainTimedOut,
    Repaired,
}

/// What carrying out a command needs from the world.
#[allow(async_fn_in_trait)] // Used with static dispatch only.
pub trait Effects {
    /// The guard's answer (`guard::replenish::Guard::check`) on this
    /// reconcile's observations.
    fn guard(&self, check: Check<'_>) -> std::result::Result<(), Refusal>;
    /// Whether mutations are only logged (nothing is made).
    fn dry_run(&self) -> bool;
    /// Writes the status when it differs from what is stored.
    async fn write_status(&mut self, status: &ReplenisherStatus) -> Result<()>;
    /// A named point between a write and the action that follows it.
    fn reached(&mut self, point: &str) -> Result<()>;
    /// An Event on the group (and on `node`, when given).
    async fn event(&mut self, node: Option<&str>, kind: EventType, reason: Reason, message: String);
    fn count(&mut self, counted: Counted);
    async fn take_lock(&mut self) -> Result<Taken>;
    /// Gives back the disruption slot if ours, then the lock.
    async fn release_lock(&mut self) -> Result<()>;
    /// Takes a manager-wide disruption slot; false when none is free.
    async fn take_slot(&mut self) -> Result<bool>;
    /// Whether the change was made (not in dry-run).
    async fn set_desired(&mut self, change: &DesiredChange, why: &str) -> Result<bool>;
    async fn drain_step(&mut self, node: &str) -> Result<DrainProgress>;
    /// Terminates `instance` through its ASG; whether it was made.
    async fn terminate(&mut self, instance: &str, decrement: bool, why: String) -> Result<bool>;
    async fn uncordon(&mut self, node: &str, why: &str) -> Result<()>;
}

/// Carries out `plan`, whose status (with the reconcile's conditions) is
/// `status`; `draining` is the scale-in target stored before this
/// reconcile (a drain's first step starts its Events). The status as it
/// then stands is written; returns when to reconcile again.
pub async fn execute<E: Effects>(
    effects: &mut E,
    spec: &NodeGroupSpec,
    plan: &Plan,
    status: ReplenisherStatus,
    draining: Option<&ScaleInTarget>,
    now: DateTime<Utc>,
) -> Result<Duration> {
    let mut run = Run {
        effects,
        spec,
        status,
        message: &plan.message,
        now,
        requeue: plan.requeue,
    };
    run.carry_out(&plan.command, draining).await?;
    run.effects.write_status(&run.status).await?;
    Ok(run.requeue.max(Duration::from_millis(100)))
}

struct Run<'a, E> {
    effects: &'a mut E,
    spec: &'a NodeGroupSpec,
    status: ReplenisherStatus,
    message: &'a str,
    now: DateTime<Utc>,
    requeue: Duration,
}

impl<E: Effects> Run<'_, E> {
    async fn carry_out(
        &mut self,
        command: &Command,
        draining: Option<&ScaleInTarget>,
    ) -> Result<()> {
        match command {
            Command::Nothing => {}
            Command::TakeLock => match self.effects.take_lock().await? {
                Taken::Yes => self.requeue = Duration::from_millis(100),
                Taken::Retry => self.requeue = Duration::from_secs(1),
                Taken::HeldElsewhere => self.status.phase = ReplenishPhase::Paused,
            },
            Command::ReleaseLock => self.effects.release_lock().await?,
            Command::TakeSlot => {
                self.requeue = match self.effects.take_slot().await? {
                    true => Duration::from_millis(100),
                    false => Duration::from_secs(1),
                };
            }
            Command::SetDesired(changes) => self.scale_up(changes).await?,
            Command::RemoveNotJoined(target) => self.remove_not_joined(target).await?,
            Command::Drain(batch) => {
                let target = &batch.first;
                self.drain(target, draining != Some(target)).await?
            }
            Command::Terminate(target) => {
                self.effects.guard(Check::Removal(target))?;
                self.terminate_scale_in(target).await?;
                if self.status.scale_in.is_none() {
                    self.last_action_event(Reason::ScaledDown).await;
                }
            }
            Command::Retire(retiring) => self.retire(retiring).await?,
            Command::GiveBack { target, reason } => self.abandon_scale_in(target, reason).await?,
        }
        Ok(())
    }

    /// Writes the status that records the step's action: persist, then act.
    async fn persist(&mut self, step: &str) -> Result<()> {
        self.effects.write_status(&self.status).await?;
        self.effects.reached(&format!("{step}:persisted"))
    }

    async fn scale_up(&mut self, changes: &[DesiredChange]) -> Result<()> {
        self.effects.guard(Check::ScaleUp(changes))?;
        if self.effects.dry_run() {
            // Nothing will be made: record nothing as done, not even
            // between this write and the next.
            replenish_plan::raise_not_made(&mut self.status);
        }
        self.persist("replenisher:scale_up").await?;
        let mut performed = true;
        for change in changes {
            performed &= self.effects.set_desired(change, self.message).await?;
        }
        self.effects.reached("replenisher:scale_up:acted")?;
        if !performed {
            replenish_plan::raise_not_made(&mut self.status);
            return Ok(());
        }
        replenish_plan::raise_landed(&mut self.status);
        let (kind, reason) = match changes.iter().any(|c| self.spec.is_fallback(&c.asg)) {
            true => (EventType::Warning, Reason::FallbackRaised),
            false => (EventType::Normal, Reason::ScaledUp),
        };
        self.effects
            .event(None, kind, reason, self.message.to_string())
            .await;
        Ok(())
    }

    async fn remove_not_joined(&mut self, target: &CleanupTarget) -> Result<()> {
        self.effects.guard(Check::NotJoined(target))?;
        let why = format!("{}: {}", target.auto_scaling_group, target.reason);
        let step = "replenisher:remove_not_joined";
        let made = self
            .persist_then_terminate(step, &target.instance_id, target.decrement, why)
            .await?;
        if !made {
            return Ok(());
        }
        replenish_plan::finish_cleanup(&mut self.status);
        let message = self.message.to_string();
        self.effects
            .event(None, EventType::Warning, Reason::RemovedNotJoined, message)
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
            self.effects
                .event(None, EventType::Warning, Reason::NotJoinedAgain, message)
                .await;
        }
        Ok(())
    }

    async fn drain(&mut self, target: &ScaleInTarget, first_step: bool) -> Result<()> {
        // The target is in the status: written before the first eviction.
        self.effects.write_status(&self.status).await?;
        let node = Some(target.node.as_str());
        if first_step {
            self.effects.count(Counted::DrainStarted);
            let message = format!("draining {} ({})", target.node, self.message);
            self.effects
                .event(node, EventType::Normal, Reason::DrainStarted, message)
                .await;
        }
        let progress = self.effects.drain_step(&target.node).await?;
        if !progress.blocked.is_empty() {
            let message = format!(
                "draining {}: blocked by a PodDisruptionBudget: {}",
                target.node,
                progress.blocked.join(", ")
            );
            self.effects
                .event(node, EventType::Warning, Reason::DrainBlocked, message)
                .await;
        }
        // A repair ends its best effort at REPAIR_DRAIN_TIMEOUT.
        let effort_over = target.repair && self.now >= after(target.since, REPAIR_DRAIN_TIMEOUT);
        if !progress.done_for(target.repair) && !effort_over {
            self.requeue = next_step_after(target.since, self.now);
            return Ok(());
        }
        self.effects.guard(Check::Removal(target))?;
        if let Some(target) = replenish_plan::record_termination(&mut self.status, self.now) {
            self.terminate_scale_in(&target).await?;
            self.effects.count(Counted::DrainFinished);
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
        let step = "replenisher:scale_in";
        let made = self
            .persist_then_terminate(step, &target.instance_id, target.decrement, why)
            .await?;
        if !made {
            return Ok(());
        }
        replenish_plan::finish_scale_in(&mut self.status, target);
        if self.spec.is_fallback(&target.auto_scaling_group) {
            let message = format!(
                "{} ({}) returned from the on-demand {}: its spot replacement is Ready",
                target.node, target.instance_id, target.auto_scaling_group
            );
            self.effects
                .event(None, EventType::Normal, Reason::ReturnedToSpot, message)
                .await;
        }
        if target.repair {
            self.effects.count(Counted::Repaired);
            let message = format!(
                "{} ({}) was NotReady for over {}: terminated in {}{}",
                target.node,
                target.instance_id,
                crate::duration::format(self.spec.replenish.unhealthy_timeout()),
                target.auto_scaling_group,
                if target.decrement {
                    " with decrement (its replacement was launched first)"
                } else {
                    " (its ASG launches a replacement)"
                }
            );
            let node = Some(target.node.as_str());
            self.effects
                .event(node, EventType::Normal, Reason::NodeRepaired, message)
                .await;
        }
        Ok(())
    }

    async fn retire(&mut self, retiring: &[Retirement]) -> Result<()> {
        for r in retiring {
            self.effects.guard(Check::Retire(r))?;
        }
        self.persist("replenisher:retire").await?;
        let mut done = vec![];
        for r in retiring {
            let why = format!(
                "{}: interrupted {} replaced{}",
                r.auto_scaling_group,
                r.node,
                if r.decrement { ", decrement" } else { "" }
            );
            if self
                .effects
                .terminate(&r.instance_id, r.decrement, why)
                .await?
            {
                done.push(r.instance_id.clone());
            }
        }
        self.effects.reached("replenisher:retire:acted")?;
        if !done.is_empty() {
            replenish_plan::finish_retiring(&mut self.status, &done);
            self.last_action_event(Reason::InterruptedNodeRemoved).await;
        }
        Ok(())
    }

    async fn abandon_scale_in(&mut self, target: &ScaleInTarget, reason: &str) -> Result<()> {
        // Uncordon (idempotent) before the status that forgets the node.
        self.effects
            .uncordon(&target.node, "scale-in abandoned")
            .await?;
        replenish_plan::abandon_scale_in(&mut self.status, reason, self.now);
        if reason.contains("timed out") {
            self.effects.count(Counted::DrainTimedOut);
        }
        // A repair given up is good news when its node came back.
        let (kind, event_reason) = match target.repair {
            true => (EventType::Normal, Reason::RepairAbandoned),
            false => (EventType::Warning, Reason::ScaleInAbandoned),
        };
        let node = Some(target.node.as_str());
        self.effects
            .event(node, kind, event_reason, reason.to_string())
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
    ) -> Result<bool> {
        self.persist(step).await?;
        let made = self.effects.terminate(instance, decrement, why).await?;
        self.effects.reached(&format!("{step}:acted"))?;
        Ok(made)
    }

    /// A Normal Event saying what the status's last action was.
    async fn last_action_event(&mut self, reason: Reason) {
        let description = self
            .status
            .last_action
            .as_ref()
            .map(|a| a.description.clone())
            .unwrap_or_default();
        self.effects
            .event(None, EventType::Normal, reason, description)
            .await;
    }
}
