//! The replenisher's executor against the world: the cluster (status,
//! Events, drains, the lock and the slot) and AWS, each change through the
//! mutation gate (`aws_mutations`, `k8s::drain`, `k8s::lock`).

use super::plan::RepairHeld;
use super::told::{drained, removal_of, told};
use crate::Result;
use crate::cloud::Cloud;
use crate::context::Context;
use crate::controllers::aws_mutations::{set_desired_capacities, terminate_in_group};
use crate::controllers::execute::{Drained, Effects, Taken};
use crate::controllers::group_view::DesiredChange;
use crate::controllers::guard::Refusal;
use crate::controllers::guard::replenish::{Effect, Guard};
use crate::crd::replenisher::ScaleInTarget;
use crate::crd::{Replenisher, ReplenisherStatus};
use crate::events::Reason;
use crate::k8s::drain::{drain_event, drain_step, next_step_after, uncordon};
use crate::k8s::lock::{self, Acquired, Holder, LockState};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use tracing::debug;

const EVENT_ACTION: &str = "Replenish";

/// One reconcile's view of the world, and what it acts through.
pub(super) struct Cluster<'a> {
    pub ctx: &'a Context,
    /// The Replenisher's namespace and name.
    pub at: (&'a str, &'a str),
    pub cloud: &'a dyn Cloud,
    pub guard: Guard<'a>,
    pub group_ref: ObjectReference,
    pub me: &'a Holder,
    /// The group's lock as observed; ours once taken.
    pub lock: LockState,
    pub slots: &'a crate::k8s::disruption_slot::Slots<'a>,
}

impl Cluster<'_> {
    /// Unhealthy nodes the circuit breaker keeps from repair: a Warning
    /// Event on the group and each node, counted once per episode.
    pub async fn repair_blocked(&self, held: &RepairHeld) {
        self.ctx.metrics.node_repair("blocked");
        for node in &held.nodes {
            self.node_event(
                node,
                EventType::Warning,
                Reason::RepairBlocked,
                held.message.clone(),
            )
            .await;
        }
    }

    async fn node_event(&self, node: &str, kind: EventType, reason: Reason, message: String) {
        let (ctx, group) = (self.ctx, &self.group_ref);
        drain_event(ctx, group, node, kind, reason, EVENT_ACTION, message).await;
    }
}

impl Effects for Cluster<'_> {
    type Record = ReplenisherStatus;

    fn guard(&self, status: &ReplenisherStatus, effect: Effect<'_>) -> Result<(), Refusal> {
        self.guard.check(status, effect)
    }

    fn dry_run(&self) -> bool {
        self.ctx.settings.dry_run
    }

    async fn write_status(&mut self, status: &ReplenisherStatus) -> crate::Result<()> {
        let (namespace, name) = self.at;
        self.ctx
            .apply_status::<Replenisher>(namespace, name, status)
            .await
    }

    fn reached(&mut self, point: &str) -> crate::Result<()> {
        crate::crash_points::crash_point(point);
        Ok(())
    }

    fn lock(&self) -> Option<LockState> {
        Some(self.lock.clone())
    }

    async fn take_lock(&mut self) -> crate::Result<Taken> {
        let now = self.guard.now;
        Ok(
            match lock::acquire(self.ctx, self.guard.group, self.me, now).await? {
                Acquired::Yes => {
                    self.lock = LockState::Ours;
                    Taken::Yes
                }
                Acquired::Conflict => Taken::Retry,
                Acquired::No(holder) => {
                    debug!(replenisher = %self.at.1, ?holder, "lock held");
                    Taken::HeldElsewhere
                }
            },
        )
    }

    async fn take_slot(&mut self) -> crate::Result<bool> {
        let taken = self.slots.take(self.guard.now).await?;
        if taken {
            self.guard.scene.slot = &crate::controllers::book::TAKEN;
        }
        Ok(taken)
    }

    fn holds_slot(&self) -> bool {
        *self.guard.scene.slot == crate::controllers::book::SlotState::Ours
    }

    async fn release_slot(&mut self) -> crate::Result<()> {
        self.slots.release().await?;
        Ok(())
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        lock::release(self.ctx, self.guard.group, self.me).await?;
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        _: &ReplenisherStatus,
        why: &str,
    ) -> crate::Result<bool> {
        set_desired_capacities(self.ctx, self.cloud, changes, why).await
    }

    async fn drain_step(
        &mut self,
        target: &ScaleInTarget,
        _: &ReplenisherStatus,
        first: bool,
        why: &str,
    ) -> crate::Result<Drained> {
        let node = target.node.as_str();
        if first {
            self.ctx.metrics.drain("started");
            let message = format!("draining {node} ({why})");
            self.node_event(node, EventType::Normal, Reason::DrainStarted, message)
                .await;
        }
        let progress = drain_step(self.ctx, node).await?;
        if !progress.blocked.is_empty() {
            let message = format!(
                "draining {node}: blocked by a PodDisruptionBudget: {}",
                progress.blocked.join(", ")
            );
            self.node_event(node, EventType::Warning, Reason::DrainBlocked, message)
                .await;
        }
        let now = self.guard.now;
        let done = drained(target, &progress, now);
        if done {
            self.ctx.metrics.drain("finished");
        }
        Ok(Drained {
            done,
            requeue: next_step_after(target.since, now),
            blocked_by: None,
        })
    }

    async fn terminate(
        &mut self,
        removal: Effect<'_>,
        _: &ReplenisherStatus,
    ) -> crate::Result<bool> {
        let Some((instance, decrement, why)) = removal_of(&removal) else {
            return Err(crate::Error::InvalidObject(format!(
                "{removal:?}: not a removal of one instance"
            )));
        };
        let applied = terminate_in_group(self.ctx, self.cloud, instance, decrement, why).await?;
        Ok(applied.performed().is_some())
    }

    async fn uncordon(&mut self, node: &str, _: &ReplenisherStatus) -> crate::Result<()> {
        uncordon(self.ctx, node, "scale-in abandoned").await
    }

    async fn done(&mut self, done: Effect<'_>, status: &ReplenisherStatus, why: &str) {
        for (node, kind, reason, message) in told(&self.guard.group.spec, done, status, why) {
            match node {
                Some(node) => self.node_event(&node, kind, reason, message).await,
                None => {
                    (self.ctx)
                        .event(&self.group_ref, kind, reason, EVENT_ACTION, message)
                        .await
                }
            }
        }
        match done {
            Effect::Terminate(t) if t.repair => self.ctx.metrics.node_repair("repaired"),
            Effect::GiveBack { reason, .. } if reason.contains("timed out") => {
                self.ctx.metrics.drain("timed_out")
            }
            _ => {}
        }
    }
}
