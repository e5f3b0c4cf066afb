//! The Refresher controller: observe (the group's inventory, a fresh describe
//! of its ASGs, the lock), decide (`refresh_plan::plan`), persist the planned
//! status, then act through the mutation gate after re-checking what it may
//! touch. The only exception to persist-then-act is an uncordon, which is
//! idempotent and harmless, so it is done before the status that forgets the
//! node is written.

use crate::Result;
use crate::cloud::AsgDescription;
use crate::context::Context;
use crate::controllers::authority::validate::Scene;
use crate::controllers::aws_mutations::set_desired_capacities;
use crate::controllers::book::Book;
use crate::controllers::execute::{Drained, Effects, Planned, Taken, execute};
use crate::controllers::group_view::DesiredChange;
use crate::controllers::guard::refresh::{Effect, Guard};
use crate::controllers::observe::{DescribedAsgs, Observation, ObservedGroup, observe_group};
use crate::controllers::refresher::plan::{self as refresh_plan, Happening, Member};
use crate::controllers::refresher::seen::{Protection, Seen};
use crate::controllers::runtime::{About, instrumented};
use crate::crd::nodegroup::OperationKind;
use crate::crd::refresher::{RefreshTarget, TargetPurpose};
use crate::crd::{NodeGroup, Refresher, RefresherStatus};
use crate::events::Reason;
use crate::k8s::disruption_slot::{SlotState, Slots};
use crate::k8s::drain::{drain_event, drain_step, next_step_after, uncordon};
use crate::k8s::lock::{self, Acquired, Holder, LockState};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::debug;

pub const CONTROLLER: &str = "refresher";
const EVENT_ACTION: &str = "Refresh";
use super::conditions::{set_conditions, set_window_condition};
use super::report::report;

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    crate::controllers::runtime::run_group_child::<Refresher, _, _>(
        ctx, shutdown, CONTROLLER, reconcile,
    )
    .await
}

async fn reconcile(rf: Arc<Refresher>, ctx: Arc<Context>) -> Result<Action> {
    let group = rf.spec.node_group.clone();
    let name = rf.name_any();
    instrumented(
        &ctx,
        CONTROLLER,
        About::Child {
            group: &group,
            name: &name,
        },
        reconcile_inner(rf, &ctx),
    )
    .await
}

pub(super) async fn reconcile_inner(rf: Arc<Refresher>, ctx: &Context) -> Result<Action> {
    let Some(rf) = crate::controllers::runtime::reread(ctx, rf.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    let mut observed =
        match observe_group(ctx, &rf, OperationKind::Refresh, &rf.spec.node_group).await? {
            Observation::Group(observed) => observed,
            Observation::NotYet(again) => return Ok(Action::requeue(again)),
        };
    // One instant for the whole reconcile: a run that fell due between the
    // check below and the plan would be planned on no description at all
    // (no node Ready: the run skipped, a one-off schedule lost for good).
    let now = ctx.clock.now();
    // Idle and not due: the plan looks at nothing AWS would say (tested in
    // `needs_observation`), so frequent status updates cost no AWS call.
    let described = if refresh_plan::needs_observation(
        rf.status.as_ref(),
        &rf.spec.schedule_key(),
        now,
        super::seen::drift_pending(&rf, &observed.group),
    ) {
        Some(observed.describe(now).await?)
    } else {
        None
    };
    let looked = described.is_some();
    observed.observe_control_plane(ctx, looked).await?;
    let slots = Slots::of(ctx, &rf, observed.group.spec.role);
    let protection = Protection::for_status(rf.status.as_ref(), looked, now);
    let seen = Seen::observe(ctx, &rf, &observed.group, &slots, protection, now).await?;
    let next = seen.next(&observed, described.as_ref());
    let plan_for = |described: &DescribedAsgs| {
        let members = Member::all_of(&described.fresh);
        refresh_plan::plan(&seen.input(&observed, described, &members))
    };
    let mut described = described.unwrap_or_default();
    let mut plan = plan_for(&described);
    if plan.command.changes_aws() && observed.lock == LockState::Ours {
        // Act only on what AWS says now: the shared description may be a
        // few seconds old and miss a change made outside. (None for a plan
        // the executor only takes the lock for.)
        described = observed.describe_fresh(now).await?;
        plan = plan_for(&described);
    }
    // The rule book's scene for the executor's check, as the plan saw it.
    let stopped = seen
        .input(&observed, &described, &[])
        .group
        .stopped()
        .map(str::to_string);
    let breaker = observed.group.breaker_open();
    let DescribedAsgs { fresh, asgs, nodes } = described;
    let ObservedGroup {
        namespace,
        name,
        me,
        group,
        cloud,
        control_plane,
        lock,
        ..
    } = *observed;
    debug!(refresher = %name, command = ?plan.command, message = %plan.message, "planned");
    cloud.quiet(&group.spec.asg_names(), plan.waits_on_cluster);

    let mut status = plan.status.clone();
    status.observed_generation = rf.metadata.generation;
    status.window = seen.window.describe();
    status.next = next;
    let (settings, schedule_key) = (&seen.settings, &seen.schedule_key);
    set_conditions(&mut status, &rf, settings, schedule_key, &asgs, now);
    set_window_condition(&mut status, &rf, settings, &group, now);
    let book = Book::new(seen.window.clone(), &seen.protected, seen.slot.clone());
    let mut cluster = Cluster {
        ctx,
        slots: &slots,
        namespace: &namespace,
        name: &name,
        me: &me,
        group: &group,
        lock,
        group_ref: group.object_ref(&()),
        fresh: &fresh,
        nodes: &nodes,
        cloud: cloud.as_ref(),
        scene: book.scene(
            group.spec.role,
            control_plane.as_ref(),
            breaker.as_deref(),
            stopped.as_deref(),
        ),
        happenings: &plan.happenings,
        now,
    };
    let planned = Planned::of(&plan.command, status, &plan.message, plan.requeue);
    let requeue = execute(&mut cluster, rf.status.as_ref(), planned, now).await?;
    Ok(Action::requeue(requeue))
}

/// The executor's effects on the cluster and AWS: the executor re-checks
/// each mutation by the [`Guard`] against this reconcile's fresh
/// observations first.
struct Cluster<'a> {
    ctx: &'a Context,
    slots: &'a Slots<'a>,
    namespace: &'a str,
    name: &'a str,
    me: &'a Holder,
    group: &'a NodeGroup,
    /// The group's lock as observed; ours once taken.
    lock: LockState,
    group_ref: ObjectReference,
    fresh: &'a [AsgDescription],
    nodes: &'a [refresh_plan::GroupNode],
    cloud: &'a dyn crate::cloud::Cloud,
    /// What the rule book's check sees.
    scene: Scene<'a>,
    /// What the plan starts, told once its status is stored.
    happenings: &'a [Happening],
    now: DateTime<Utc>,
}

impl Cluster<'_> {
    fn guard<'s>(&'s self, status: &'s RefresherStatus) -> Guard<'s> {
        Guard {
            group: self.group,
            fresh: self.fresh,
            nodes: self.nodes,
            status,
            scene: self.scene,
        }
    }
}

impl Effects for Cluster<'_> {
    type Record = RefresherStatus;

    fn guard(
        &self,
        status: &RefresherStatus,
        effect: Effect<'_>,
    ) -> std::result::Result<(), crate::controllers::guard::Refusal> {
        self.guard(status).check(effect)
    }

    fn dry_run(&self) -> bool {
        self.ctx.settings.dry_run
    }

    async fn uncordon(&mut self, node: &str, _: &RefresherStatus) -> Result<()> {
        uncordon(self.ctx, node, "refresh gave up on draining it").await
    }

    async fn write_status(&mut self, status: &RefresherStatus) -> Result<()> {
        write_status(self.ctx, self.namespace, self.name, status).await
    }

    fn reached(&mut self, point: &str) -> Result<()> {
        crate::crash_points::crash_point(point);
        Ok(())
    }

    async fn announce(&mut self) {
        report(self.ctx, &self.group_ref, self.happenings).await
    }

    fn lock(&self) -> Option<LockState> {
        Some(self.lock.clone())
    }

    async fn take_lock(&mut self) -> Result<Taken> {
        Ok(
            match lock::acquire(self.ctx, self.group, self.me, self.now).await? {
                Acquired::Yes => {
                    self.lock = LockState::Ours;
                    Taken::Yes
                }
                Acquired::Conflict => Taken::Retry,
                Acquired::No(holder) => {
                    debug!(refresher = %self.name, ?holder, "lock held");
                    Taken::HeldElsewhere
                }
            },
        )
    }

    async fn take_slot(&mut self) -> Result<bool> {
        let taken = self.slots.take(self.now).await?;
        if taken {
            self.scene.slot = &crate::controllers::book::TAKEN;
        }
        Ok(taken)
    }

    fn holds_slot(&self) -> bool {
        *self.scene.slot == SlotState::Ours
    }

    async fn release_slot(&mut self) -> Result<()> {
        self.slots.release().await?;
        Ok(())
    }

    async fn release_lock(&mut self) -> Result<()> {
        lock::release(self.ctx, self.group, self.me).await?;
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        _: &RefresherStatus,
        why: &str,
    ) -> Result<bool> {
        set_desired_capacities(self.ctx, self.cloud, changes, why).await
    }

    async fn workloads_on(&mut self, target: &RefreshTarget) -> Result<Vec<String>> {
        match &target.node {
            Some(node) => crate::k8s::workloads::on_node(self.ctx, node).await,
            None => Ok(vec![]),
        }
    }

    async fn drain_step(
        &mut self,
        target: &RefreshTarget,
        _: &RefresherStatus,
        first: bool,
        why: &str,
    ) -> Result<Drained> {
        let ctx = self.ctx;
        let node = target.node.clone().unwrap_or_default();
        if first {
            ctx.metrics.drain("started");
            drain_event(
                ctx,
                &self.group_ref,
                &node,
                EventType::Normal,
                Reason::DrainStarted,
                EVENT_ACTION,
                format!("draining {node}: {why}"),
            )
            .await;
        }
        let progress = drain_step(ctx, &node).await?;
        if !progress.blocked.is_empty() {
            drain_event(
                ctx,
                &self.group_ref,
                &node,
                EventType::Warning,
                Reason::DrainBlocked,
                EVENT_ACTION,
                format!(
                    "draining {node}: blocked by a PodDisruptionBudget ({}): {}",
                    progress.budgets.join("; "),
                    progress.blocked.join(", ")
                ),
            )
            .await;
        }
        let done = progress.done_for(target.unhealthy);
        if done {
            ctx.metrics.drain("finished");
        }
        Ok(Drained {
            done,
            requeue: next_step_after(target.since, self.now),
            blocked_by: (!progress.budgets.is_empty()).then(|| progress.budgets.join("; ")),
        })
    }

    async fn terminate(&mut self, removal: Effect<'_>, _: &RefresherStatus) -> Result<bool> {
        match removal {
            Effect::Terminate(target) => terminate(self.ctx, self.cloud, target).await,
            _ => Err(crate::Error::InvalidObject(format!(
                "{removal:?}: not a refresher removal"
            ))),
        }
    }

    async fn done(&mut self, done: Effect<'_>, _: &RefresherStatus, _: &str) {
        let Effect::Terminate(target) = done else {
            return;
        };
        if let (true, Some(node)) = (target.unhealthy, &target.node) {
            self.ctx.metrics.node_repair("refreshed");
            let why = "was NotReady past the unhealthy timeout: terminated by the refresh as a repair, its pods' deletions asked";
            let note = format!("{node} ({}) {why}", target.instance_id);
            let (ctx, group) = (self.ctx, &self.group_ref);
            drain_event(
                ctx,
                group,
                node,
                EventType::Normal,
                Reason::NodeRepaired,
                EVENT_ACTION,
                note,
            )
            .await;
        }
    }
}

/// Terminates `target` as its purpose says; whether it was made.
async fn terminate(
    ctx: &Context,
    cloud: &dyn crate::cloud::Cloud,
    target: &RefreshTarget,
) -> Result<bool> {
    let decrement = target.decrements();
    let detail = match target.purpose {
        TargetPurpose::Replace if decrement => format!(
            "replace: its replacement was launched ahead; decrement {}",
            target.auto_scaling_group
        ),
        TargetPurpose::Replace => format!(
            "replace: {} keeps its desired count and launches a new instance",
            target.auto_scaling_group
        ),
        TargetPurpose::RemoveSurplus => {
            format!("remove surplus: decrement {}", target.auto_scaling_group)
        }
    };
    let applied = crate::controllers::aws_mutations::terminate_in_group(
        ctx,
        cloud,
        &target.instance_id,
        decrement,
        detail,
    )
    .await?;
    Ok(applied.performed().is_some())
}

async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &RefresherStatus,
) -> Result<()> {
    ctx.apply_status::<Refresher>(namespace, name, status).await
}
