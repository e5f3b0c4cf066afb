//! The Replenisher controller: observe (the group's inventory, a fresh
//! describe of its ASGs, the lock), decide (`replenish_plan::plan`), act
//! (through the mutation gate, after re-checking what it may touch).

use crate::cloud::AsgDescription;
use crate::context::Context;
use crate::controllers::actions::{
    persist_then, set_desired_capacity, terminate_in_group, write_if_changed,
};
use crate::controllers::observe::{DescribedAsgs, Observation, ObservedGroup, observe_group};
use crate::controllers::replenisher::plan::{
    self as replenish_plan, Action as PlanAction, Input, NotJoinedView,
};
use crate::controllers::runtime::{About, instrumented};
use crate::controllers::vocabulary::{DesiredChange, Fate, node_views};
use crate::crd::condition::{ConditionStatus, set_condition};
use crate::crd::nodegroup::OperationKind;
use crate::crd::replenisher::{ReplenishPhase, ScaleInTarget};
use crate::crd::{NodeGroup, Replenisher, ReplenisherStatus};
use crate::k8s::drain::{drain_event, drain_step, next_step_after, uncordon};
use crate::k8s::lock::{self, Acquired};
use crate::mutation::Applied;
use crate::{Error, Result, duration};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub const CONTROLLER: &str = "replenisher";
pub const REPLENISHED: &str = "Replenished";

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    crate::controllers::runtime::run_group_child::<Replenisher, _, _>(
        ctx, shutdown, CONTROLLER, reconcile,
    )
    .await
}

async fn reconcile(rp: Arc<Replenisher>, ctx: Arc<Context>) -> Result<Action> {
    let group = rp.spec.node_group.clone();
    instrumented(
        &ctx,
        CONTROLLER,
        About::Group(&group),
        reconcile_inner(rp, &ctx),
    )
    .await
}

pub(super) async fn reconcile_inner(rp: Arc<Replenisher>, ctx: &Context) -> Result<Action> {
    let Some(rp) = crate::controllers::runtime::reread(ctx, rp.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    let observed =
        match observe_group(ctx, &rp, OperationKind::Replenish, &rp.spec.node_group).await? {
            Observation::Group(observed) => observed,
            Observation::NotYet(again) => return Ok(Action::requeue(again)),
        };
    let now = ctx.clock.now();
    let current = rp.status.clone().unwrap_or_default();
    let not_joined: Vec<NotJoinedView> = observed
        .group_status
        .not_joined
        .iter()
        .map(|n| NotJoinedView {
            instance_id: n.instance_id.clone(),
            asg: n.auto_scaling_group.clone(),
            launch_time: n.launch_time,
        })
        .collect();
    let plan_for = |described: &DescribedAsgs| {
        let group = &observed.group;
        let active: BTreeSet<String> = described
            .fresh
            .iter()
            .flat_map(|a| a.instances.iter().filter(|i| i.is_active()))
            .map(|i| i.instance_id.clone())
            .collect();
        replenish_plan::plan(&Input {
            role: group.spec.role,
            desired: group.spec.desired,
            suspend: group.spec.suspend,
            deleting: group.metadata.deletion_timestamp.is_some(),
            // Another group naming one of its ASGs stops it too.
            spec_valid: group.spec.validate().is_empty() && group.asg_conflict().is_none(),
            breaker: group.breaker_open(),
            cooldown: duration::parse(&rp.spec.cooldown).unwrap_or(Duration::from_secs(300)),
            join_timeout: duration::parse(&rp.spec.join_timeout)
                .unwrap_or(Duration::from_secs(900)),
            asgs: &described.asgs,
            nodes: &described.nodes,
            not_joined: &not_joined,
            active: &active,
            lock: observed.lock.clone(),
            status: &current,
            now,
        })
    };
    let mut described = observed.describe().await?;
    let mut plan = plan_for(&described);
    if plan.action.changes_aws() {
        // Act only on what AWS says now: the shared description may be a
        // few seconds old and miss a change made outside (a process
        // suspended, a min raised). One more describe per AWS mutation.
        described = observed.describe_fresh().await?;
        plan = plan_for(&described);
    }
    let fresh = described.fresh;
    let ObservedGroup {
        namespace,
        name,
        me,
        group,
        group_status,
        lock: _,
        cloud,
    } = *observed;
    debug!(replenisher = %name, action = ?plan.action, message = %plan.message, "planned");

    let mut status = plan.status.clone();
    status.observed_generation = rp.metadata.generation;
    let steady = status.phase == ReplenishPhase::Steady;
    set_condition(
        &mut status.conditions,
        REPLENISHED,
        if steady {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        },
        &format!("{:?}", status.phase),
        plan.message.clone(),
        rp.metadata.generation,
        now,
    );
    let group_ref = group.object_ref(&());
    let at = (namespace.as_str(), name.as_str());
    let mut written = rp.status.clone();
    let mut requeue = plan.requeue;
    match plan.action.clone() {
        PlanAction::Nothing => {}
        PlanAction::TakeLock => match lock::acquire(ctx, &group, &me, now).await? {
            Acquired::Yes => requeue = Duration::from_millis(100),
            Acquired::Conflict => requeue = Duration::from_secs(1),
            Acquired::No(holder) => {
                status.phase = ReplenishPhase::Paused;
                debug!(replenisher = %name, ?holder, "lock held");
            }
        },
        PlanAction::ReleaseLock => {
            lock::release(ctx, &group, &me).await?;
        }
        PlanAction::ScaleUp(changes) => {
            check_scale_up(&group, &fresh, &changes)?;
            if ctx.settings.dry_run {
                // Nothing will be made: record nothing as done, not even
                // between this write and the next.
                replenish_plan::raise_not_made(&mut status);
            }
            let performed = persist_then::<Replenisher, _, _, _, _>(
                ctx,
                at,
                &mut written,
                &status,
                "replenisher:scale_up",
                || async {
                    let mut performed = true;
                    for change in &changes {
                        let applied =
                            set_desired_capacity(ctx, cloud.as_ref(), change, &plan.message)
                                .await?;
                        performed &= applied.performed().is_some();
                    }
                    Ok(performed)
                },
            )
            .await?;
            if !performed {
                replenish_plan::raise_not_made(&mut status);
            } else {
                replenish_plan::raise_landed(&mut status);
                ctx.event(
                    &group_ref,
                    EventType::Normal,
                    "ScaledUp",
                    "Replenish",
                    plan.message.clone(),
                )
                .await;
            }
        }
        PlanAction::RemoveNotJoined(target) => {
            check_not_joined(&group, &fresh, &target)?;
            let applied = persist_then::<Replenisher, _, _, _, _>(
                ctx,
                at,
                &mut written,
                &status,
                "replenisher:remove_not_joined",
                || {
                    terminate_in_group(
                        ctx,
                        cloud.as_ref(),
                        &target.instance_id,
                        target.decrement,
                        format!("{}: {}", target.auto_scaling_group, target.reason),
                    )
                },
            )
            .await?;
            if applied.performed().is_some() {
                replenish_plan::finish_cleanup(&mut status);
                ctx.event(
                    &group_ref,
                    EventType::Warning,
                    "RemovedNotJoined",
                    "Replenish",
                    plan.message.clone(),
                )
                .await;
                if let Some(run) = status
                    .removals
                    .iter()
                    .find(|r| r.auto_scaling_group == target.auto_scaling_group && r.count > 1)
                {
                    ctx.event(
                        &group_ref,
                        EventType::Warning,
                        "NotJoinedAgain",
                        "Replenish",
                        format!(
                            "{} instance(s) of {} in a row never joined; the next removal there waits until {}",
                            run.count,
                            run.auto_scaling_group,
                            run.retry_after.to_rfc3339()
                        ),
                    )
                    .await;
                }
            }
        }
        PlanAction::Drain(target) => {
            let first_step = current.scale_in.as_ref() != Some(&target);
            // The target is in the status: written before the first eviction.
            write_if_changed::<Replenisher, _>(ctx, at, &mut written, &status).await?;
            if first_step {
                ctx.metrics.drain("started");
                drain_event(
                    ctx,
                    &group_ref,
                    &target.node,
                    EventType::Normal,
                    "DrainStarted",
                    "Replenish",
                    format!("draining {} ({})", target.node, plan.message),
                )
                .await;
            }
            let progress = drain_step(ctx, &target.node).await?;
            if !progress.blocked.is_empty() {
                drain_event(
                    ctx,
                    &group_ref,
                    &target.node,
                    EventType::Warning,
                    "DrainBlocked",
                    "Replenish",
                    format!(
                        "draining {}: blocked by a PodDisruptionBudget: {}",
                        target.node,
                        progress.blocked.join(", ")
                    ),
                )
                .await;
            }
            if progress.done() {
                check_scale_in(&group, &group_status, &fresh, &target)?;
                if let Some(target) = replenish_plan::record_termination(&mut status, now) {
                    terminate_scale_in(ctx, at, &mut written, &mut status, &cloud, &target).await?;
                    ctx.metrics.drain("finished");
                    if status.scale_in.is_none() {
                        last_action_event(ctx, &group_ref, "ScaledDown", &status).await;
                    }
                }
            } else {
                requeue = next_step_after(target.since, now);
            }
        }
        PlanAction::Terminate(target) => {
            check_scale_in(&group, &group_status, &fresh, &target)?;
            terminate_scale_in(ctx, at, &mut written, &mut status, &cloud, &target).await?;
            if status.scale_in.is_none() {
                last_action_event(ctx, &group_ref, "ScaledDown", &status).await;
            }
        }
        PlanAction::Retire(retiring) => {
            for r in &retiring {
                check_retire(&group, &group_status, &fresh, r)?;
            }
            let done = persist_then::<Replenisher, _, _, _, _>(
                ctx,
                at,
                &mut written,
                &status,
                "replenisher:retire",
                || async {
                    let mut done = vec![];
                    for r in &retiring {
                        let why = format!(
                            "{}: interrupted {} replaced{}",
                            r.auto_scaling_group,
                            r.node,
                            if r.decrement { ", decrement" } else { "" }
                        );
                        let applied = terminate_in_group(
                            ctx,
                            cloud.as_ref(),
                            &r.instance_id,
                            r.decrement,
                            why,
                        )
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
                replenish_plan::finish_retiring(&mut status, &done);
                last_action_event(ctx, &group_ref, "InterruptedNodeRemoved", &status).await;
            }
        }
        PlanAction::AbandonScaleIn { target, reason } => {
            // Uncordon (idempotent) before the status that forgets the node.
            uncordon(ctx, &target.node, "scale-in abandoned").await?;
            replenish_plan::abandon_scale_in(&mut status, &reason, now);
            if reason.contains("timed out") {
                ctx.metrics.drain("timed_out");
            }
            drain_event(
                ctx,
                &group_ref,
                &target.node,
                EventType::Warning,
                "ScaleInAbandoned",
                "Replenish",
                reason,
            )
            .await;
        }
    }
    write_if_changed::<Replenisher, _>(ctx, at, &mut written, &status).await?;
    Ok(Action::requeue(requeue.max(Duration::from_millis(100))))
}

/// The recorded termination of a drained scale-in target (with decrement
/// unless it says otherwise): written, then made, then marked done.
async fn terminate_scale_in(
    ctx: &Context,
    at: (&str, &str),
    written: &mut Option<ReplenisherStatus>,
    status: &mut ReplenisherStatus,
    cloud: &Arc<dyn crate::cloud::Cloud>,
    target: &ScaleInTarget,
) -> Result<()> {
    let applied = persist_then::<Replenisher, _, _, _, _>(
        ctx,
        at,
        written,
        status,
        "replenisher:scale_in",
        || {
            terminate_in_group(
                ctx,
                cloud.as_ref(),
                &target.instance_id,
                target.decrement,
                format!(
                    "{}{}: scale-in of {}",
                    if target.decrement { "decrement " } else { "" },
                    target.auto_scaling_group,
                    target.node
                ),
            )
        },
    )
    .await?;
    if let Applied::Performed(()) = applied {
        replenish_plan::finish_scale_in(status, target);
    }
    Ok(())
}

/// A Normal Event saying what the status's last action was.
async fn last_action_event(
    ctx: &Context,
    group_ref: &ObjectReference,
    reason: &str,
    status: &ReplenisherStatus,
) {
    ctx.event(
        group_ref,
        EventType::Normal,
        reason,
        "Replenish",
        status
            .last_action
            .as_ref()
            .map(|a| a.description.clone())
            .unwrap_or_default(),
    )
    .await;
}

/// The safety check that refused a replenisher mutation, with what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    NotTheGroupsAsg {
        asg: String,
    },
    AboveMax {
        asg: String,
        to: i32,
        max: i32,
    },
    StaleCount {
        asg: String,
        planned_from: i32,
        desired: i32,
    },
    NotActiveInAsg {
        instance: String,
        asg: String,
    },
    HasANode {
        instance: String,
    },
    DecrementAtMin {
        instance: String,
        asg: String,
    },
    TooFewReady {
        instance: String,
        ready_besides: i32,
        desired: i32,
    },
    NotReclaimed {
        instance: String,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotTheGroupsAsg { asg } => {
                write!(f, "touch {asg}: not one of the group's ASGs")
            }
            Refusal::AboveMax { asg, to, max } => {
                write!(f, "set {asg} to {to}: above its max {max}")
            }
            Refusal::StaleCount {
                asg,
                planned_from,
                desired,
            } => write!(
                f,
                "set {asg}: planned from {planned_from}, desired is now {desired}"
            ),
            Refusal::NotActiveInAsg { instance, asg } => {
                write!(
                    f,
                    "remove {instance}: not active in {asg} (or {asg} is at its min)"
                )
            }
            Refusal::HasANode { instance } => write!(f, "remove {instance}: a Node runs on it"),
            Refusal::DecrementAtMin { instance, asg } => {
                write!(f, "remove {instance} with decrement: {asg} is at its min")
            }
            Refusal::TooFewReady {
                instance,
                ready_besides,
                desired,
            } => write!(
                f,
                "terminate {instance}: {ready_besides} other Ready node(s), {desired} desired"
            ),
            Refusal::NotReclaimed { instance } => write!(
                f,
                "terminate {instance}: its node carries no spot interruption or scheduled change"
            ),
        }
    }
}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Error {
        tracing::warn!(%refusal, "replenisher safety check");
        Error::InvalidObject(format!("refusing to {refusal}"))
    }
}

/// The group's ASG of that name, per the fresh describe.
fn groups_asg<'a>(
    group: &NodeGroup,
    fresh: &'a [AsgDescription],
    name: &str,
) -> Result<&'a AsgDescription, Refusal> {
    let listed = group
        .spec
        .auto_scaling_groups
        .iter()
        .any(|r| r.name == name);
    fresh
        .iter()
        .find(|a| a.name == name && listed)
        .ok_or_else(|| Refusal::NotTheGroupsAsg { asg: name.into() })
}

/// The group's ASG of that name, with the instance active in it.
fn active_member<'a>(
    group: &NodeGroup,
    fresh: &'a [AsgDescription],
    asg_name: &str,
    instance: &str,
) -> Result<&'a AsgDescription, Refusal> {
    let asg = groups_asg(group, fresh, asg_name)?;
    if !asg
        .instances
        .iter()
        .any(|i| i.instance_id == instance && i.is_active())
    {
        return Err(Refusal::NotActiveInAsg {
            instance: instance.into(),
            asg: asg_name.into(),
        });
    }
    Ok(asg)
}

/// A termination with decrement keeps the ASG at or above its min.
fn decrement_allowed(asg: &AsgDescription, instance: &str) -> Result<(), Refusal> {
    if asg.desired <= asg.min {
        return Err(Refusal::DecrementAtMin {
            instance: instance.into(),
            asg: asg.name.clone(),
        });
    }
    Ok(())
}

/// Safety: only this group's ASGs, never above their max, never from a stale count.
fn check_scale_up(
    group: &NodeGroup,
    fresh: &[AsgDescription],
    changes: &[DesiredChange],
) -> Result<(), Refusal> {
    for c in changes {
        let asg = groups_asg(group, fresh, &c.asg)?;
        if c.to > asg.max {
            return Err(Refusal::AboveMax {
                asg: c.asg.clone(),
                to: c.to,
                max: asg.max,
            });
        }
        if c.from != asg.desired {
            return Err(Refusal::StaleCount {
                asg: c.asg.clone(),
                planned_from: c.from,
                desired: asg.desired,
            });
        }
    }
    Ok(())
}

/// Safety: the instance is active in that ASG of this group, no Node runs on
/// it, and a decrement keeps the ASG at or above its min.
fn check_not_joined(
    group: &NodeGroup,
    fresh: &[AsgDescription],
    target: &crate::crd::replenisher::CleanupTarget,
) -> Result<(), Refusal> {
    let asg = active_member(
        group,
        fresh,
        &target.auto_scaling_group,
        &target.instance_id,
    )?;
    let has_node = group.status.as_ref().is_some_and(|s| {
        s.nodes
            .iter()
            .any(|n| n.instance_id.as_deref() == Some(target.instance_id.as_str()))
    });
    if has_node {
        return Err(Refusal::HasANode {
            instance: target.instance_id.clone(),
        });
    }
    if target.decrement {
        decrement_allowed(asg, &target.instance_id)?;
    }
    Ok(())
}

/// Safety: the target is active in its ASG, above min when the termination
/// decrements, and removing it keeps Ready >= desired.
fn check_scale_in(
    group: &NodeGroup,
    status: &crate::crd::NodeGroupStatus,
    fresh: &[AsgDescription],
    target: &ScaleInTarget,
) -> Result<(), Refusal> {
    let asg = active_member(
        group,
        fresh,
        &target.auto_scaling_group,
        &target.instance_id,
    )?;
    if target.decrement {
        decrement_allowed(asg, &target.instance_id)?;
    }
    let ready_besides = node_views(&status.nodes, fresh)
        .iter()
        .filter(|n| n.ready && n.instance_id.as_deref() != Some(target.instance_id.as_str()))
        .count() as i32;
    if ready_besides < group.spec.desired {
        return Err(Refusal::TooFewReady {
            instance: target.instance_id.clone(),
            ready_besides,
            desired: group.spec.desired,
        });
    }
    Ok(())
}

/// Safety: an interrupted instance is terminated only while it is active in
/// that ASG of the group, its node records a notice that AWS reclaims it
/// (spot interruption, scheduled change), and a decrement keeps the ASG at
/// or above its min.
fn check_retire(
    group: &NodeGroup,
    status: &crate::crd::NodeGroupStatus,
    fresh: &[AsgDescription],
    r: &crate::crd::replenisher::Retirement,
) -> Result<(), Refusal> {
    let asg = active_member(group, fresh, &r.auto_scaling_group, &r.instance_id)?;
    let reclaimed = status.nodes.iter().any(|n| {
        n.instance_id.as_deref() == Some(r.instance_id.as_str())
            && n.interruption
                .as_ref()
                .is_some_and(|i| matches!(Fate::of(i), Fate::Reclaimed { .. }))
    });
    if !reclaimed {
        return Err(Refusal::NotReclaimed {
            instance: r.instance_id.clone(),
        });
    }
    if r.decrement {
        decrement_allowed(asg, &r.instance_id)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::inventory::plan::tests::{group, t0};
    use crate::controllers::vocabulary::tests::{fresh, status_node};
    use crate::crd::replenisher::CleanupTarget;

    /// Group of ASGs a (i-1, i-2 with nodes n1, n2; i-9 never joined) and b
    /// (i-3 with n3), desired 2; a sits above its min of 1, b at its min.
    struct Case {
        group: NodeGroup,
        fresh: Vec<AsgDescription>,
    }

    impl Case {
        fn new() -> Case {
            let mut g = group(&["a", "b"], 2);
            g.status = Some(crate::crd::NodeGroupStatus {
                nodes: vec![
                    status_node("n1", "a", "i-1"),
                    status_node("n2", "a", "i-2"),
                    status_node("n3", "b", "i-3"),
                ],
                ..Default::default()
            });
            let mut a = fresh(
                "a",
                &[
                    ("i-1", "InService"),
                    ("i-2", "InService"),
                    ("i-9", "InService"),
                ],
            );
            a.min = 1;
            a.max = 4;
            let mut b = fresh("b", &[("i-3", "InService")]);
            b.min = 1;
            Case {
                group: g,
                fresh: vec![a, b],
            }
        }

        fn status(&self) -> &crate::crd::NodeGroupStatus {
            self.group.status.as_ref().expect("status")
        }
    }

    fn change(asg: &str, from: i32, to: i32) -> DesiredChange {
        DesiredChange {
            asg: asg.into(),
            from,
            to,
        }
    }

    fn cleanup(instance: &str, asg: &str, decrement: bool) -> CleanupTarget {
        CleanupTarget {
            instance_id: instance.into(),
            auto_scaling_group: asg.into(),
            reason: "not joined".into(),
            decrement,
            since: t0(),
        }
    }

    fn scale_in(node: &str, instance: &str, asg: &str) -> ScaleInTarget {
        ScaleInTarget {
            node: node.into(),
            instance_id: instance.into(),
            auto_scaling_group: asg.into(),
            since: t0(),
            terminating: None,
            decrement: true,
        }
    }

    #[test]
    fn a_raise_goes_only_to_the_groups_asgs_within_max_from_the_current_count() {
        let c = Case::new();
        let check = |changes: &[DesiredChange]| check_scale_up(&c.group, &c.fresh, changes);
        assert_eq!(check(&[change("a", 3, 4)]), Ok(()));
        assert_eq!(
            check(&[change("a", 3, 5)]),
            Err(Refusal::AboveMax {
                asg: "a".into(),
                to: 5,
                max: 4
            })
        );
        assert_eq!(
            check(&[change("a", 2, 3)]),
            Err(Refusal::StaleCount {
                asg: "a".into(),
                planned_from: 2,
                desired: 3
            })
        );
        assert_eq!(
            check(&[change("elsewhere", 1, 2)]),
            Err(Refusal::NotTheGroupsAsg {
                asg: "elsewhere".into()
            })
        );
    }

    #[test]
    fn only_an_active_instance_without_a_node_is_removed_and_decremented_only_above_min() {
        let c = Case::new();
        let check = |t: &CleanupTarget| check_not_joined(&c.group, &c.fresh, t);
        assert_eq!(check(&cleanup("i-9", "a", true)), Ok(()));
        assert_eq!(
            check(&cleanup("i-1", "a", false)),
            Err(Refusal::HasANode {
                instance: "i-1".into()
            })
        );
        assert_eq!(
            check(&cleanup("i-42", "a", false)),
            Err(Refusal::NotActiveInAsg {
                instance: "i-42".into(),
                asg: "a".into()
            })
        );
        let mut at_min = Case::new();
        at_min.fresh[0].min = 3;
        assert_eq!(
            check_not_joined(&at_min.group, &at_min.fresh, &cleanup("i-9", "a", true)),
            Err(Refusal::DecrementAtMin {
                instance: "i-9".into(),
                asg: "a".into()
            })
        );
        assert_eq!(
            check_not_joined(&at_min.group, &at_min.fresh, &cleanup("i-9", "a", false)),
            Ok(()),
            "at min, removed without decrement: the ASG replaces it"
        );
    }

    #[test]
    fn a_scale_in_keeps_ready_at_desired_and_its_asg_at_min() {
        let c = Case::new();
        let check = |t: &ScaleInTarget| check_scale_in(&c.group, c.status(), &c.fresh, t);
        assert_eq!(check(&scale_in("n2", "i-2", "a")), Ok(()));
        assert_eq!(
            check(&scale_in("n3", "i-3", "b")),
            Err(Refusal::DecrementAtMin {
                instance: "i-3".into(),
                asg: "b".into()
            })
        );
        let mut short = Case::new();
        if let Some(s) = short.group.status.as_mut() {
            s.nodes[2].ready = false;
        }
        assert_eq!(
            check_scale_in(
                &short.group,
                short.status(),
                &short.fresh,
                &scale_in("n2", "i-2", "a")
            ),
            Err(Refusal::TooFewReady {
                instance: "i-2".into(),
                ready_besides: 1,
                desired: 2
            })
        );
    }

    #[test]
    fn only_a_reclaimed_instance_active_in_the_groups_asg_is_retired() {
        use crate::crd::nodegroup::NodeInterruption;
        use crate::crd::replenisher::Retirement;
        let mut c = Case::new();
        let retire = |instance: &str, asg: &str, decrement: bool| Retirement {
            node: "n".into(),
            instance_id: instance.into(),
            auto_scaling_group: asg.into(),
            decrement,
            since: t0(),
        };
        let interruption = |kind: &str| NodeInterruption {
            kind: kind.into(),
            noticed: t0(),
            deadline: t0(),
            drained: None,
        };
        let check = |c: &Case, r: &Retirement| check_retire(&c.group, c.status(), &c.fresh, r);
        assert_eq!(
            check(&c, &retire("i-2", "a", true)),
            Err(Refusal::NotReclaimed {
                instance: "i-2".into()
            }),
            "no notice on its node"
        );
        if let Some(s) = c.group.status.as_mut() {
            s.nodes[1].interruption = Some(interruption("state_change"));
            s.nodes[2].interruption = Some(interruption("spot_interruption"));
        }
        assert_eq!(
            check(&c, &retire("i-2", "a", false)),
            Err(Refusal::NotReclaimed {
                instance: "i-2".into()
            }),
            "going by itself: its ASG replaces it"
        );
        assert_eq!(check(&c, &retire("i-3", "b", false)), Ok(()));
        assert_eq!(
            check(&c, &retire("i-3", "b", true)),
            Err(Refusal::DecrementAtMin {
                instance: "i-3".into(),
                asg: "b".into()
            })
        );
        assert_eq!(
            check(&c, &retire("i-3", "a", false)),
            Err(Refusal::NotActiveInAsg {
                instance: "i-3".into(),
                asg: "a".into()
            })
        );
    }
}
