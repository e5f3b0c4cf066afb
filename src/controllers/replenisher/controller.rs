//! The Replenisher controller: observe (the group's inventory, a fresh
//! describe of its ASGs, the lock), decide (`replenish_plan::plan`), act
//! (through the mutation gate, after re-checking what it may touch).

use super::effects::Cluster;
use crate::context::Context;
use crate::controllers::authority::validate::Scene;
use crate::controllers::book::Book;
use crate::controllers::execute::{Planned, execute};
use crate::controllers::group_view::{Fate, LockState};
use crate::controllers::guard::replenish::Guard;
use crate::controllers::observe::{DescribedAsgs, Observation, ObservedGroup, observe_group};
use crate::controllers::replenisher::plan::{self as replenish_plan, Input, NotJoinedView};
use crate::controllers::runtime::{About, instrumented};
use crate::crd::condition::{ConditionStatus, set_condition};
use crate::crd::nodegroup::OperationKind;
use crate::crd::replenisher::ReplenishPhase;
use crate::crd::{Replenisher, ReplenisherStatus};
use crate::k8s::disruption_slot::{SlotState, Slots};
use crate::{Result, duration};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub const CONTROLLER: &str = "replenisher";
use crate::controllers::replenisher::plan::RepairHeld;
use crate::crd::condition::{REPAIR_ALLOWED, REPLENISHED};

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    crate::controllers::runtime::run_group_child::<Replenisher, _, _>(
        ctx, shutdown, CONTROLLER, reconcile,
    )
    .await
}

async fn reconcile(rp: Arc<Replenisher>, ctx: Arc<Context>) -> Result<Action> {
    let group = rp.spec.node_group.clone();
    let name = rp.name_any();
    instrumented(
        &ctx,
        CONTROLLER,
        About::Child {
            group: &group,
            name: &name,
        },
        reconcile_inner(rp, &ctx),
    )
    .await
}

/// The instances of the described ASGs that count as capacity.
fn active_instances(described: &DescribedAsgs) -> BTreeSet<String> {
    described
        .fresh
        .iter()
        .flat_map(|a| a.instances.iter().filter(|i| i.is_active()))
        .map(|i| i.instance_id.clone())
        .collect()
}

pub(super) async fn reconcile_inner(rp: Arc<Replenisher>, ctx: &Context) -> Result<Action> {
    let Some(rp) = crate::controllers::runtime::reread(ctx, rp.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    let mut observed =
        match observe_group(ctx, &rp, OperationKind::Replenish, &rp.spec.node_group).await? {
            Observation::Group(observed) => observed,
            Observation::NotYet(again) => return Ok(Action::requeue(again)),
        };
    let now = ctx.clock.now();
    let current = rp.status.clone().unwrap_or_default();
    let needed = may_take_a_node(&observed.group_status, &current)
        || a_master_not_serving(ctx, &observed, now).await?;
    observed.observe_control_plane(ctx, needed).await?;
    let not_joined: Vec<NotJoinedView> = observed
        .group_status
        .not_joined
        .iter()
        .map(NotJoinedView::from)
        .collect();
    let mut described = observed.describe(now).await?;
    let slots = Slots::of_replenisher(ctx, &rp, observed.group.spec.role);
    let surplus_left = surplus_left(ctx, &rp).await?;
    let (protected, slot) = voluntary(ctx, &observed, &described, &slots, &current, now).await?;
    let plan_for = |described: &DescribedAsgs| {
        let group = &observed.group;
        let active = active_instances(described);
        replenish_plan::plan(&Input {
            group: observed.facts(described, false, now),
            // Another group naming one of its ASGs stops it too.
            spec_valid: group.spec.validate().is_empty() && group.invalid_outside_spec().is_none(),
            cooldown: duration::parse(&rp.spec.cooldown).unwrap_or(Duration::from_secs(300)),
            join_timeout: join_timeout(&rp),
            not_joined: &not_joined,
            active: &active,
            rules: Book::new(
                crate::controllers::window::group_window(group, now),
                &protected,
                slot.clone(),
            ),
            status: &current,
            fallback: group.spec.fallback.as_ref().map(|f| f.resolve()),
            surplus_left: surplus_left.as_ref(),
        })
    };
    let mut plan = plan_for(&described);
    if plan.command.changes_aws() && observed.lock == LockState::Ours {
        // Act only on what AWS says now: the shared description may be a
        // few seconds old and miss a change made outside (a process
        // suspended, a min raised). One more describe per AWS mutation;
        // none for a plan the executor only takes the lock for.
        described = observed.describe_fresh(now).await?;
        plan = plan_for(&described);
    }
    let rules = RuleParts::of(&observed, &described, (&protected, &slot), now);
    let fresh = described.fresh;
    let ObservedGroup {
        namespace,
        name,
        me,
        group,
        group_status,
        lock,
        cloud,
        control_plane: observed_control_plane,
    } = *observed;
    debug!(replenisher = %name, command = ?plan.command, message = %plan.message, "planned");

    let mut status = plan.status.clone();
    status.observed_generation = rp.metadata.generation;
    let cp = observed_control_plane.as_ref();
    let newly_blocked = set_conditions(&mut status, &plan, cp, rp.metadata.generation, now);
    let held = plan.repair_held.as_ref().map(|h| h.reason);
    ctx.metrics.repair_held(&namespace, &group.name_any(), held);
    let mut cluster = Cluster {
        ctx,
        at: (namespace.as_str(), name.as_str()),
        cloud: cloud.as_ref(),
        guard: Guard {
            group: &group,
            status: &group_status,
            fresh: &fresh,
            scene: rules.scene(group.spec.role, cp),
            now,
        },
        group_ref: group.object_ref(&()),
        me: &me,
        lock,
        slots: &slots,
    };
    if let Some(held) = newly_blocked {
        cluster.repair_blocked(held).await;
    }
    let planned = Planned::of(&plan.command, status, &plan.message, plan.requeue);
    let requeue = execute(&mut cluster, rp.status.as_ref(), planned, now).await?;
    Ok(Action::requeue(requeue))
}

/// The owned parts of the rule book's scene for the executor's check, as
/// the plan saw them.
struct RuleParts<'p> {
    stopped: Option<String>,
    book: Book<'p>,
    breaker: Option<String>,
}

impl<'p> RuleParts<'p> {
    fn of(
        observed: &ObservedGroup,
        described: &DescribedAsgs,
        (protected, slot): (&'p BTreeMap<String, String>, &SlotState),
        now: chrono::DateTime<chrono::Utc>,
    ) -> RuleParts<'p> {
        let facts = observed.facts(described, false, now);
        let window = crate::controllers::window::group_window(&observed.group, now);
        RuleParts {
            stopped: facts.stopped().map(str::to_string),
            book: Book::new(window, protected, slot.clone()),
            breaker: observed.group.breaker_open(),
        }
    }

    fn scene<'a>(
        &'a self,
        role: crate::crd::Role,
        control_plane: Option<&'a crate::controllers::authority::ControlPlane>,
    ) -> Scene<'a> {
        self.book.scene(
            role,
            control_plane,
            self.breaker.as_deref(),
            self.stopped.as_deref(),
        )
    }
}

/// What the group's last refresh run left above its counts (its
/// Refresher's `surplusLeft`), to take over; None without a Refresher.
async fn surplus_left(
    ctx: &Context,
    rp: &Replenisher,
) -> Result<Option<crate::crd::refresher::SurplusLeft>> {
    let namespace = rp.namespace().unwrap_or_default();
    let name = &rp.spec.node_group;
    let refresher = kube::Api::<crate::crd::Refresher>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(name)
        .await
        .map_err(crate::Error::kube(format!(
            "get Refresher {namespace}/{name} (for the surplus a run left)"
        )))?;
    Ok(refresher
        .and_then(|r| r.status)
        .and_then(|s| s.surplus_left))
}

/// `joinTimeout`; the default when invalid (validation reports it).
fn join_timeout(rp: &Replenisher) -> Duration {
    duration::parse(&rp.spec.join_timeout).unwrap_or(Duration::from_secs(900))
}

/// A node may be taken away (a repair, an instance that never joined, an
/// interrupted node retired before AWS takes it, a removal under way): for
/// a Master group, the authority then decides on the whole control plane.
fn may_take_a_node(group: &crate::crd::NodeGroupStatus, current: &ReplenisherStatus) -> bool {
    !group.not_joined.is_empty()
        || group
            .nodes
            .iter()
            .any(|n| !n.ready || n.interruption.is_some())
        || current.scale_in.is_some()
        || current.cleanup.is_some()
        || !current.retiring.is_empty()
}

/// A Master group whose Ready master has no serving control plane past its
/// join timeout (Kubernetes reads only: the Master groups and kops's
/// pods): the whole control plane is then looked at, so the master is
/// reported by name (RepairAllowed) though nothing is to be taken away.
async fn a_master_not_serving(
    ctx: &Context,
    observed: &ObservedGroup,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool> {
    let group = &observed.group;
    if group.spec.role != crate::crd::Role::Master {
        return Ok(false);
    }
    let join = join_timeout_of(group);
    let overdue = |n: &&crate::crd::nodegroup::NodeStatus| {
        n.ready
            && n.launch_time
                .is_some_and(|t| now >= crate::controllers::group_view::after(t, join))
    };
    let candidates: Vec<&str> = observed
        .group_status
        .nodes
        .iter()
        .filter(overdue)
        .map(|n| n.name.as_str())
        .collect();
    if candidates.is_empty() {
        return Ok(false);
    }
    let namespace = group.namespace().unwrap_or_default();
    let (serving, _) = crate::controllers::authority::observe::serving(ctx, &namespace).await?;
    Ok(candidates.iter().any(|n| !serving.contains_key(*n)))
}

/// The group's `replenish.joinTimeout`; the default when invalid.
fn join_timeout_of(group: &crate::crd::NodeGroup) -> Duration {
    duration::parse(&group.spec.replenish.join_timeout).unwrap_or(Duration::from_secs(900))
}

/// What a voluntary removal needs to know. The nodes it could take that
/// are protected (with why): the Ready nodes while there are more than
/// desired (a scale-in), nodes at risk, and a removal's node under way;
/// and the disruption slot. Neither is looked at while another operation
/// holds the group (the replenisher then acts on nothing) or no removal
/// could happen and none is under way.
async fn voluntary(
    ctx: &Context,
    observed: &ObservedGroup,
    described: &DescribedAsgs,
    slots: &Slots<'_>,
    current: &ReplenisherStatus,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(BTreeMap<String, String>, SlotState)> {
    let facts = observed.facts(described, false, now);
    if matches!(facts.lock, LockState::Other(_)) {
        return Ok((BTreeMap::new(), SlotState::Free));
    }
    let surplus = facts.nodes.iter().filter(|n| n.ready).count() as i32 > facts.desired;
    let mut names: BTreeSet<String> = facts
        .nodes
        .iter()
        .filter(|n| (surplus && n.ready) || n.fate == Some(Fate::AtRisk))
        .map(|n| n.name.clone())
        .collect();
    names.extend(current.scale_in.iter().map(|t| t.node.clone()));
    // A slot held when no removal could happen is given back with the lock
    // (the executor gives back both), so it need not be looked at then.
    let slot = match names.is_empty() {
        true => SlotState::Free,
        false => slots.observe().await?,
    };
    let evict_unmanaged = observed.group.spec.disruption.evict_unmanaged_pods;
    let protected = crate::k8s::protection::observe(ctx, &names, evict_unmanaged, false)
        .await?
        .protected;
    Ok((protected, slot))
}

/// The RepairAllowed condition: False while unhealthy nodes wait
/// unrepaired. Returns what newly blocks them when the circuit breaker, or
/// a control plane whose quorum is at risk, has just started to (its
/// Warning Event and metric, once per episode).
fn set_repair_allowed<'a>(
    status: &mut ReplenisherStatus,
    held: Option<&'a RepairHeld>,
    generation: Option<i64>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<&'a RepairHeld> {
    let was_blocked = |reason: &str| {
        status.conditions.iter().any(|c| {
            c.type_ == REPAIR_ALLOWED && c.status == ConditionStatus::False && c.reason == reason
        })
    };
    let newly = held.filter(|h| ANNOUNCED.contains(&h.reason) && !was_blocked(h.reason));
    let (condition, reason, message) = match held {
        Some(h) => (ConditionStatus::False, h.reason, h.message.clone()),
        None => (
            ConditionStatus::True,
            "Allowed",
            "unhealthy nodes are repaired".to_string(),
        ),
    };
    set_condition(
        &mut status.conditions,
        REPAIR_ALLOWED,
        condition,
        reason,
        &message,
        generation,
        now,
    );
    newly
}

/// The Replenisher's conditions for `plan`; what newly blocks repairs, if
/// anything (see [`set_repair_allowed`]).
fn set_conditions<'a>(
    status: &mut ReplenisherStatus,
    plan: &'a replenish_plan::Plan,
    control_plane: Option<&crate::controllers::authority::ControlPlane>,
    generation: Option<i64>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<&'a RepairHeld> {
    set_replenished(status, &plan.message, generation, now);
    let newly_blocked = set_repair_allowed(status, plan.repair_held.as_ref(), generation, now);
    if let Some(cp) = control_plane {
        set_control_plane_counted(status, cp.counted_by, generation, now);
    }
    newly_blocked
}

/// The ControlPlaneCounted condition of a Master group's Replenisher, set
/// whenever the control plane was looked at: how the masters were counted.
fn set_control_plane_counted(
    status: &mut ReplenisherStatus,
    by: crate::k8s::control_plane::CountedBy,
    generation: Option<i64>,
    now: chrono::DateTime<chrono::Utc>,
) {
    use crate::k8s::control_plane::CountedBy;
    let (condition, reason, message) = match by {
        CountedBy::Pods => (
            ConditionStatus::True,
            "ByControlPlanePods",
            "masters are counted as etcd counts them: by kops's control-plane pods (kube-apiserver, etcd-manager) Ready",
        ),
        CountedBy::Nodes => (
            ConditionStatus::False,
            "CountedByNode",
            "no master shows kops's control-plane pods (kube-system pods labelled k8s-app=kube-apiserver, etcd-manager-main): masters are counted by Node Ready plus masterSettleTime, which cannot see an etcd member that has not joined",
        ),
    };
    set_condition(
        &mut status.conditions,
        crate::crd::condition::CONTROL_PLANE_COUNTED,
        condition,
        reason,
        message,
        generation,
        now,
    );
}

/// Refusals the user must hear of (an Event, once per episode): nothing the
/// manager does will end them.
const ANNOUNCED: [&str; 2] = ["CircuitBreakerOpen", "ControlPlaneQuorumAtRisk"];

/// The Replenished condition: True while the group is steady.
fn set_replenished(
    status: &mut ReplenisherStatus,
    message: &str,
    generation: Option<i64>,
    now: chrono::DateTime<chrono::Utc>,
) {
    let steady = status.phase == ReplenishPhase::Steady;
    let reason = format!("{:?}", status.phase);
    set_condition(
        &mut status.conditions,
        REPLENISHED,
        if steady {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        },
        &reason,
        message,
        generation,
        now,
    );
}
