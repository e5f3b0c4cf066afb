//! The replenisher's executor against the world: the cluster (status,
//! Events, drains, the lock and the slot) and AWS, each change through the
//! mutation gate (`aws_mutations`, `k8s::drain`, `k8s::lock`).

use super::execute::{Counted, Effects, Taken};
use super::plan::RepairHeld;
use crate::Result;
use crate::cloud::Cloud;
use crate::context::Context;
use crate::controllers::aws_mutations::{set_desired_capacity, terminate_in_group};
use crate::controllers::group_view::DesiredChange;
use crate::controllers::guard::Refusal;
use crate::controllers::guard::replenish::{Check, Guard};
use crate::crd::{Replenisher, ReplenisherStatus};
use crate::events::Reason;
use crate::k8s::drain::{DrainProgress, drain_event, drain_step, uncordon};
use crate::k8s::lock::{self, Acquired, Holder};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use tracing::debug;

const EVENT_ACTION: &str = "Replenish";

/// One reconcile's view of the world, and what it acts through.
pub(super) struct Cluster<'a> {
    pub ctx: &'a Context,
    /// The Replenisher's namespace and name.
    pub at: (&'a str, &'a str),
    /// The Replenisher's status as stored.
    pub written: Option<ReplenisherStatus>,
    pub cloud: &'a dyn Cloud,
    pub guard: Guard<'a>,
    pub group_ref: ObjectReference,
    pub me: &'a Holder,
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
    fn guard(&self, check: Check<'_>) -> std::result::Result<(), Refusal> {
        self.guard.check(check)
    }

    fn dry_run(&self) -> bool {
        self.ctx.settings.dry_run
    }

    async fn write_status(&mut self, status: &ReplenisherStatus) -> Result<()> {
        if self.written.as_ref() != Some(status) {
            let (namespace, name) = self.at;
            self.ctx
                .apply_status::<Replenisher>(namespace, name, status)
                .await?;
            self.written = Some(status.clone());
        }
        Ok(())
    }

    fn reached(&mut self, point: &str) -> Result<()> {
        crate::crash_points::crash_point(point);
        Ok(())
    }

    async fn event(
        &mut self,
        node: Option<&str>,
        kind: EventType,
        reason: Reason,
        message: String,
    ) {
        match node {
            Some(node) => self.node_event(node, kind, reason, message).await,
            None => {
                self.ctx
                    .event(&self.group_ref, kind, reason, EVENT_ACTION, message)
                    .await
            }
        }
    }

    fn count(&mut self, counted: Counted) {
        match counted {
            Counted::DrainStarted => self.ctx.metrics.drain("started"),
            Counted::DrainFinished => self.ctx.metrics.drain("finished"),
            Counted::DrainTimedOut => self.ctx.metrics.drain("timed_out"),
            Counted::Repaired => self.ctx.metrics.node_repair("repaired"),
        }
    }

    async fn take_lock(&mut self) -> Result<Taken> {
        let now = self.guard.now;
        Ok(
            match lock::acquire(self.ctx, self.guard.group, self.me, now).await? {
                Acquired::Yes => Taken::Yes,
                Acquired::Conflict => Taken::Retry,
                Acquired::No(holder) => {
                    debug!(replenisher = %self.at.1, ?holder, "lock held");
                    Taken::HeldElsewhere
                }
            },
        )
    }

    async fn release_lock(&mut self) -> Result<()> {
        // The slot first: held only with the lock, so a restart between
        // the two still finds the lock ours, and gives the lock back then
        // (a slot is looked at with the lock).
        self.slots.release().await?;
        lock::release(self.ctx, self.guard.group, self.me).await?;
        Ok(())
    }

    async fn take_slot(&mut self) -> Result<bool> {
        self.slots.take(self.guard.now).await
    }

    async fn set_desired(&mut self, change: &DesiredChange, why: &str) -> Result<bool> {
        let applied = set_desired_capacity(self.ctx, self.cloud, change, why).await?;
        Ok(applied.performed().is_some())
    }

    async fn drain_step(&mut self, node: &str) -> Result<DrainProgress> {
        drain_step(self.ctx, node).await
    }

    async fn terminate(&mut self, instance: &str, decrement: bool, why: String) -> Result<bool> {
        let applied = terminate_in_group(self.ctx, self.cloud, instance, decrement, why).await?;
        Ok(applied.performed().is_some())
    }

    async fn uncordon(&mut self, node: &str, why: &str) -> Result<()> {
        uncordon(self.ctx, node, why).await
    }
}
