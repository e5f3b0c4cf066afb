//! The Refresher controller: observe (the group's inventory, a fresh describe
//! of its ASGs, the lock), decide (`refresh_plan::plan`), persist the planned
//! status, then act through the mutation gate after re-checking what it may
//! touch. The only exception to persist-then-act is an uncordon, which is
//! idempotent and harmless, so it is done before the status that forgets the
//! node is written.

use crate::cloud::AsgDescription;
use crate::context::Context;
use crate::controllers::actions::set_desired_capacity;
use crate::controllers::observe::{DescribedAsgs, Observation, ObservedGroup, observe_group};
use crate::controllers::refresher::execute::{Drained, Effects, execute};
use crate::controllers::refresher::plan::{self as refresh_plan, Happening, Input, Member};
use crate::controllers::runtime::instrumented;
use crate::controllers::vocabulary::DesiredChange;
use crate::crd::condition::{ConditionStatus, set_condition};
use crate::crd::nodegroup::OperationKind;
use crate::crd::refresher::{RefreshTarget, RunResult, TargetPurpose};
use crate::crd::{NodeGroup, Refresher, RefresherStatus};
use crate::k8s::drain::{drain_event, drain_step, next_step_after, uncordon};
use crate::k8s::lock::{self, Acquired, Holder};
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const CONTROLLER: &str = "refresher";
pub const SCHEDULE_VALID: &str = "ScheduleValid";
pub const LAST_RUN_SUCCEEDED: &str = "LastRunSucceeded";
/// False while an ASG of the group has Launch or Terminate suspended.
pub const SCALING_PROCESSES: &str = "ScalingProcesses";
const EVENT_ACTION: &str = "Refresh";

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    crate::controllers::runtime::run_group_child::<Refresher, _, _>(
        ctx, shutdown, CONTROLLER, reconcile,
    )
    .await
}

async fn reconcile(rf: Arc<Refresher>, ctx: Arc<Context>) -> Result<Action> {
    instrumented(&ctx, CONTROLLER, reconcile_inner(rf, &ctx)).await
}

async fn reconcile_inner(rf: Arc<Refresher>, ctx: &Context) -> Result<Action> {
    let Some(rf) = crate::controllers::runtime::reread(ctx, rf.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    let observed =
        match observe_group(ctx, &rf, OperationKind::Refresh, &rf.spec.node_group).await? {
            Observation::Group(observed) => observed,
            Observation::NotYet(again) => return Ok(Action::requeue(again)),
        };
    // Idle and not due: the plan looks at nothing AWS would say
    // (`needs_observation` is tested for exactly that), so the group's
    // frequent status updates cost no AWS call.
    let described = if refresh_plan::needs_observation(
        rf.status.as_ref(),
        &rf.spec.schedule_key(),
        ctx.clock.now(),
    ) {
        Some(observed.describe().await?)
    } else {
        None
    };
    let DescribedAsgs { fresh, asgs, nodes } = described.unwrap_or(DescribedAsgs {
        fresh: vec![],
        asgs: vec![],
        nodes: vec![],
    });
    let ObservedGroup {
        namespace,
        name,
        me,
        group,
        lock: lock_state,
        cloud,
        ..
    } = *observed;
    let now = ctx.clock.now();
    let settings = rf.spec.resolve();
    let members = members(&fresh);
    let current = rf.status.clone().unwrap_or_default();
    let schedule_key = rf.spec.schedule_key();
    // Masters between replacements: which nodes' control planes are up.
    let control_plane_ready = if group.spec.role == crate::crd::Role::Master
        && current.phase == crate::crd::refresher::RefreshPhase::WaitingForReplacement
    {
        crate::k8s::control_plane::ready_nodes(ctx).await?
    } else {
        Default::default()
    };
    let plan = refresh_plan::plan(&Input {
        role: group.spec.role,
        desired: group.spec.desired,
        suspended: group.spec.suspend || rf.spec.suspend,
        dry_run: ctx.settings.dry_run,
        settings: &settings,
        schedule_key: &schedule_key,
        asgs: &asgs,
        members: &members,
        nodes: &nodes,
        control_plane_ready: &control_plane_ready,
        lock: lock_state,
        status: &current,
        now,
    });
    debug!(refresher = %name, action = ?plan.action, message = %plan.message, "planned");

    let mut status = plan.status.clone();
    status.observed_generation = rf.metadata.generation;
    match &settings {
        Ok(_) => set_condition(
            &mut status.conditions,
            SCHEDULE_VALID,
            ConditionStatus::True,
            "Valid",
            format!("schedule {schedule_key}"),
            rf.metadata.generation,
            now,
        ),
        Err(problem) => set_condition(
            &mut status.conditions,
            SCHEDULE_VALID,
            ConditionStatus::False,
            "InvalidSpec",
            problem.clone(),
            rf.metadata.generation,
            now,
        ),
    }
    // Whether the ASGs let a run do its work (Launch, Terminate not suspended).
    match refresh_plan::blocking_processes(&asgs) {
        Some(why) => set_condition(
            &mut status.conditions,
            SCALING_PROCESSES,
            ConditionStatus::False,
            "ProcessSuspended",
            why,
            rf.metadata.generation,
            now,
        ),
        None if !asgs.is_empty() => set_condition(
            &mut status.conditions,
            SCALING_PROCESSES,
            ConditionStatus::True,
            "Active",
            "Launch and Terminate are active on every ASG",
            rf.metadata.generation,
            now,
        ),
        // Not described this reconcile (idle, not due): keep what was known.
        None => {}
    }
    if let Some(last) = status
        .last_run
        .clone()
        .filter(|l| l.result != RunResult::Skipped)
    {
        set_condition(
            &mut status.conditions,
            LAST_RUN_SUCCEEDED,
            if last.result == RunResult::Succeeded {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            &format!("{:?}", last.result),
            last.reason
                .unwrap_or_else(|| format!("replaced {}", last.replaced)),
            rf.metadata.generation,
            now,
        );
    }
    let mut cluster = Cluster {
        ctx,
        namespace: &namespace,
        name: &name,
        me: &me,
        group: &group,
        group_ref: group.object_ref(&()),
        fresh: &fresh,
        nodes: &nodes,
        cloud: cloud.as_ref(),
        now,
    };
    let requeue = execute(&mut cluster, rf.status.as_ref(), &plan, &status, now).await?;
    Ok(Action::requeue(requeue))
}

/// The executor's effects on the cluster and AWS: each mutation re-checked
/// by the [`Guard`] against this reconcile's fresh observations first.
struct Cluster<'a> {
    ctx: &'a Context,
    namespace: &'a str,
    name: &'a str,
    me: &'a Holder,
    group: &'a NodeGroup,
    group_ref: ObjectReference,
    fresh: &'a [AsgDescription],
    nodes: &'a [refresh_plan::NodeView],
    cloud: &'a dyn crate::cloud::Cloud,
    now: DateTime<Utc>,
}

impl Cluster<'_> {
    fn guard<'s>(&'s self, status: &'s RefresherStatus) -> Guard<'s> {
        Guard {
            group: self.group,
            fresh: self.fresh,
            nodes: self.nodes,
            status,
        }
    }
}

impl Effects for Cluster<'_> {
    async fn uncordon(&mut self, node: &str, status: &RefresherStatus) -> Result<()> {
        self.guard(status).owns_node(node)?;
        uncordon(self.ctx, node, "refresh gave up on draining it").await
    }

    async fn write_status(&mut self, status: &RefresherStatus) -> Result<()> {
        write_status(self.ctx, self.namespace, self.name, status).await
    }

    fn reached(&mut self, point: &str) -> Result<()> {
        crate::fault::crash_point(point);
        Ok(())
    }

    async fn report(&mut self, happenings: &[Happening]) {
        report(self.ctx, &self.group_ref, happenings).await
    }

    async fn take_lock(&mut self) -> Result<Duration> {
        Ok(
            match lock::acquire(self.ctx, self.group, self.me, self.now).await? {
                Acquired::Yes => Duration::from_millis(100),
                Acquired::Conflict => Duration::from_secs(1),
                Acquired::No(holder) => {
                    debug!(refresher = %self.name, ?holder, "lock held");
                    Duration::from_secs(5)
                }
            },
        )
    }

    async fn release_lock(&mut self) -> Result<()> {
        lock::release(self.ctx, self.group, self.me).await?;
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        status: &RefresherStatus,
        why: &str,
    ) -> Result<()> {
        self.guard(status).set_desired(changes)?;
        for change in changes {
            set_desired_capacity(self.ctx, self.cloud, change, why).await?;
        }
        Ok(())
    }

    async fn drain_step(
        &mut self,
        target: &RefreshTarget,
        status: &RefresherStatus,
        first: bool,
        why: &str,
    ) -> Result<Drained> {
        self.guard(status).drain(target)?;
        let ctx = self.ctx;
        let node = target.node.clone().unwrap_or_default();
        if first {
            ctx.metrics.drain("started");
            drain_event(
                ctx,
                &self.group_ref,
                &node,
                EventType::Normal,
                "DrainStarted",
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
                "DrainBlocked",
                EVENT_ACTION,
                format!(
                    "draining {node}: blocked by a PodDisruptionBudget: {}",
                    progress.blocked.join(", ")
                ),
            )
            .await;
        }
        if progress.done() {
            ctx.metrics.drain("finished");
        }
        Ok(Drained {
            done: progress.done(),
            requeue: next_step_after(target.since, self.now),
        })
    }

    async fn terminate(&mut self, target: &RefreshTarget, status: &RefresherStatus) -> Result<()> {
        terminate(self.ctx, &self.guard(status), self.cloud, target).await
    }
}

/// Active instances of the group's ASGs, per the fresh describe.
fn members(fresh: &[AsgDescription]) -> Vec<Member> {
    fresh
        .iter()
        .flat_map(|a| {
            a.instances
                .iter()
                .filter(|i| i.is_active())
                .map(|i| Member {
                    asg: a.name.clone(),
                    instance_id: i.instance_id.clone(),
                })
        })
        .collect()
}

async fn terminate(
    ctx: &Context,
    guard: &Guard<'_>,
    cloud: &dyn crate::cloud::Cloud,
    target: &RefreshTarget,
) -> Result<()> {
    guard.terminate(target)?;
    let decrement = target.purpose == TargetPurpose::RemoveSurplus;
    let detail = match target.purpose {
        TargetPurpose::Replace => format!(
            "replace: {} keeps its desired count and launches a new instance",
            target.auto_scaling_group
        ),
        TargetPurpose::RemoveSurplus => {
            format!("remove surplus: decrement {}", target.auto_scaling_group)
        }
    };
    crate::controllers::actions::terminate_in_group(
        ctx,
        cloud,
        &target.instance_id,
        decrement,
        detail,
    )
    .await?;
    Ok(())
}

/// Events and metrics for what the plan did.
async fn report(ctx: &Context, group: &ObjectReference, happenings: &[Happening]) {
    for h in happenings {
        let (type_, reason, note) = match h {
            Happening::Started { total, surplus } => {
                ctx.metrics.refresh_runs_started.inc();
                (
                    EventType::Normal,
                    "RefreshStarted",
                    format!("replacing {total} node(s), {surplus} surplus"),
                )
            }
            Happening::Skipped(why) => {
                ctx.metrics.refresh_run("Skipped");
                (EventType::Normal, "RefreshSkipped", why.clone())
            }
            Happening::Planned(what) => {
                ctx.metrics.refresh_run("Skipped");
                (EventType::Normal, "RefreshPlanned", what.clone())
            }
            Happening::Replaced { node, took } => {
                ctx.metrics
                    .node_replacement_duration
                    .observe(took.as_secs_f64());
                (
                    EventType::Normal,
                    "NodeReplaced",
                    format!(
                        "{node} replaced in {}",
                        crate::duration::format(Duration::from_secs(took.as_secs()))
                    ),
                )
            }
            Happening::Failed(why) => (EventType::Warning, "RefreshFailed", why.clone()),
            Happening::Finished { result, replaced } => {
                let (label, type_) = match result {
                    RunResult::Succeeded => ("Succeeded", EventType::Normal),
                    RunResult::Failed => ("Failed", EventType::Warning),
                    RunResult::Skipped => ("Skipped", EventType::Normal),
                };
                ctx.metrics.refresh_run(label);
                (
                    type_,
                    "RefreshFinished",
                    format!("{label}: replaced {replaced} node(s)"),
                )
            }
        };
        info!(reason, %note, "refresh");
        ctx.event(group, type_, reason, EVENT_ACTION, note).await;
    }
}

/// Re-checks each mutation against fresh observations before it is made:
/// only the group's ASGs and instances, never above max, never lowering an
/// ASG below its active instances (AWS would pick a victim), never removing
/// a node the group cannot spare, never replacing a node the run did not plan.
#[derive(Clone, Copy)]
struct Guard<'a> {
    group: &'a NodeGroup,
    fresh: &'a [AsgDescription],
    nodes: &'a [refresh_plan::NodeView],
    status: &'a RefresherStatus,
}

/// The check of [`Guard`] that refused a mutation, with what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    OutsideARun,
    NotTheGroupsAsg {
        asg: String,
    },
    NotTheGroupsNode {
        node: String,
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
    /// Lowering desired below the active instances: AWS would pick a victim.
    AwsWouldPickAVictim {
        asg: String,
        to: i32,
        active: i32,
    },
    NotActive {
        instance: String,
        asg: String,
    },
    NotPlanned {
        instance: String,
    },
    TerminationNotRecorded {
        instance: String,
    },
    NotAboveRecordedCount {
        instance: String,
        asg: String,
        desired: i32,
        recorded: Option<i32>,
    },
    TooFewReady {
        instance: String,
        ready_besides: i32,
        needed: i32,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::OutsideARun => write!(f, "act outside a run"),
            Refusal::NotTheGroupsAsg { asg } => {
                write!(f, "touch {asg}: not one of the group's ASGs")
            }
            Refusal::NotTheGroupsNode { node } => {
                write!(f, "touch node {node}: not one of the group's nodes")
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
            Refusal::AwsWouldPickAVictim { asg, to, active } => write!(
                f,
                "lower {asg} to {to}: {active} active instance(s), AWS would pick which to terminate"
            ),
            Refusal::NotActive { instance, asg } => {
                write!(f, "touch {instance}: not active in {asg}")
            }
            Refusal::NotPlanned { instance } => {
                write!(f, "replace {instance}: the run did not plan it")
            }
            Refusal::TerminationNotRecorded { instance } => {
                write!(f, "terminate {instance}: the termination is not recorded")
            }
            Refusal::NotAboveRecordedCount {
                instance,
                asg,
                desired,
                recorded,
            } => write!(
                f,
                "remove {instance} from {asg}: desired {desired} is not above the recorded {recorded:?}"
            ),
            Refusal::TooFewReady {
                instance,
                ready_besides,
                needed,
            } => write!(
                f,
                "terminate {instance}: {ready_besides} other Ready node(s), {needed} needed"
            ),
        }
    }
}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Error {
        warn!(%refusal, "refresher safety check");
        Error::InvalidObject(format!("refusing to {refusal}"))
    }
}

impl Guard<'_> {
    fn asg(&self, name: &str) -> Result<&AsgDescription, Refusal> {
        let listed = self
            .group
            .spec
            .auto_scaling_groups
            .iter()
            .any(|r| r.name == name);
        self.fresh
            .iter()
            .find(|a| a.name == name && listed)
            .ok_or_else(|| Refusal::NotTheGroupsAsg { asg: name.into() })
    }

    fn set_desired(&self, changes: &[DesiredChange]) -> Result<(), Refusal> {
        if self.status.run_start.is_none() {
            return Err(Refusal::OutsideARun);
        }
        for c in changes {
            let asg = self.asg(&c.asg)?;
            let active = asg.active_instances() as i32;
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
            if c.to < c.from && c.to < active {
                return Err(Refusal::AwsWouldPickAVictim {
                    asg: c.asg.clone(),
                    to: c.to,
                    active,
                });
            }
        }
        Ok(())
    }

    fn owns_node(&self, node: &str) -> Result<(), Refusal> {
        let known = self
            .group
            .status
            .as_ref()
            .is_some_and(|s| s.nodes.iter().any(|n| n.name == node));
        if !known {
            return Err(Refusal::NotTheGroupsNode { node: node.into() });
        }
        Ok(())
    }

    /// Within a run, the target's instance is active in one of the group's
    /// ASGs, and a Replace target is one the run planned to replace.
    fn target(&self, t: &RefreshTarget) -> Result<(), Refusal> {
        if self.status.run_start.is_none() {
            return Err(Refusal::OutsideARun);
        }
        let asg = self.asg(&t.auto_scaling_group)?;
        let active = asg
            .instances
            .iter()
            .any(|i| i.instance_id == t.instance_id && i.is_active());
        if !active {
            return Err(Refusal::NotActive {
                instance: t.instance_id.clone(),
                asg: t.auto_scaling_group.clone(),
            });
        }
        if t.purpose == TargetPurpose::Replace
            && !self.status.planned_instances.contains(&t.instance_id)
        {
            return Err(Refusal::NotPlanned {
                instance: t.instance_id.clone(),
            });
        }
        if let Some(node) = &t.node {
            self.owns_node(node)?;
        }
        Ok(())
    }

    fn drain(&self, t: &RefreshTarget) -> Result<(), Refusal> {
        self.target(t)
    }

    fn terminate(&self, t: &RefreshTarget) -> Result<(), Refusal> {
        self.target(t)?;
        if t.terminated.is_none() {
            return Err(Refusal::TerminationNotRecorded {
                instance: t.instance_id.clone(),
            });
        }
        if t.purpose == TargetPurpose::RemoveSurplus {
            let asg = self.asg(&t.auto_scaling_group)?;
            let recorded = self
                .status
                .original_desired
                .iter()
                .find(|o| o.auto_scaling_group == t.auto_scaling_group)
                .map(|o| o.desired);
            if recorded.is_none_or(|o| asg.desired <= o) {
                return Err(Refusal::NotAboveRecordedCount {
                    instance: t.instance_id.clone(),
                    asg: t.auto_scaling_group.clone(),
                    desired: asg.desired,
                    recorded,
                });
            }
        }
        let surplus: i32 = self.status.surplus.iter().map(|s| s.desired).sum();
        let r = refresh_plan::removal(t, self.nodes, self.group.spec.desired, surplus);
        if !r.safe {
            return Err(Refusal::TooFewReady {
                instance: t.instance_id.clone(),
                ready_besides: r.ready_besides,
                needed: r.needed,
            });
        }
        Ok(())
    }
}

async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &RefresherStatus,
) -> Result<()> {
    ctx.apply_status::<Refresher>(namespace, name, status).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::vocabulary::node_views;
    use crate::controllers::vocabulary::tests::{fresh, status_node};
    use crate::crd::NodeGroupStatus;
    use crate::crd::refresher::AsgDesired;
    use chrono::{TimeZone, Utc};

    /// A worker group of 3 over ASGs a and b: i-1, i-2 in a (a raised by one
    /// surplus, i-9), i-3 in b; a run in progress planning i-1..i-3.
    struct Case {
        group: NodeGroup,
        fresh: Vec<AsgDescription>,
        status: RefresherStatus,
    }

    impl Case {
        fn new() -> Case {
            let mut group: NodeGroup = serde_json::from_value(serde_json::json!({
                "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
                "metadata": {"name": "workers", "namespace": "ns"},
                "spec": {"role": "Worker", "desired": 3,
                         "autoScalingGroups": [{"name": "a"}, {"name": "b"}]}
            }))
            .expect("group");
            group.status = Some(NodeGroupStatus {
                nodes: vec![
                    status_node("n1", "a", "i-1"),
                    status_node("n2", "a", "i-2"),
                    status_node("n9", "a", "i-9"),
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
            a.max = 3;
            let fresh = vec![a, fresh("b", &[("i-3", "InService"), ("i-7", "InService")])];
            let status = RefresherStatus {
                run_start: Some(Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).unwrap()),
                original_desired: vec![
                    AsgDesired {
                        auto_scaling_group: "a".into(),
                        desired: 2,
                    },
                    AsgDesired {
                        auto_scaling_group: "b".into(),
                        desired: 2,
                    },
                ],
                surplus: vec![AsgDesired {
                    auto_scaling_group: "a".into(),
                    desired: 1,
                }],
                planned_instances: vec!["i-1".into(), "i-2".into(), "i-3".into()],
                ..Default::default()
            };
            Case {
                group,
                fresh,
                status,
            }
        }

        fn check<T>(&self, f: impl FnOnce(&Guard) -> Result<T, Refusal>) -> Result<T, Refusal> {
            let nodes = node_views(
                &self.group.status.as_ref().expect("status").nodes,
                &self.fresh,
            );
            f(&Guard {
                group: &self.group,
                fresh: &self.fresh,
                nodes: &nodes,
                status: &self.status,
            })
        }
    }

    fn target(id: &str, asg: &str, node: &str, purpose: TargetPurpose) -> RefreshTarget {
        RefreshTarget {
            node: Some(node.into()),
            instance_id: id.into(),
            auto_scaling_group: asg.into(),
            purpose,
            since: Utc.with_ymd_and_hms(2026, 6, 1, 12, 1, 0).unwrap(),
            terminated: Some(Utc.with_ymd_and_hms(2026, 6, 1, 12, 2, 0).unwrap()),
        }
    }

    fn change(asg: &str, from: i32, to: i32) -> DesiredChange {
        DesiredChange {
            asg: asg.into(),
            from,
            to,
        }
    }

    #[test]
    fn a_planned_node_may_be_replaced_while_enough_stay_ready() {
        let case = Case::new();
        let t = target("i-1", "a", "n1", TargetPurpose::Replace);
        assert!(case.check(|g| g.terminate(&t)).is_ok());
    }

    #[test]
    fn an_unplanned_node_is_never_replaced() {
        let case = Case::new();
        // i-9 is the surplus: new, not planned.
        let t = target("i-9", "a", "n9", TargetPurpose::Replace);
        let not_planned = Err(Refusal::NotPlanned {
            instance: "i-9".into(),
        });
        assert_eq!(case.check(|g| g.terminate(&t)), not_planned);
        assert_eq!(case.check(|g| g.drain(&t)), not_planned);
    }

    #[test]
    fn a_termination_not_recorded_first_is_refused() {
        let case = Case::new();
        let mut t = target("i-1", "a", "n1", TargetPurpose::Replace);
        t.terminated = None;
        assert_eq!(
            case.check(|g| g.terminate(&t)),
            Err(Refusal::TerminationNotRecorded {
                instance: "i-1".into()
            })
        );
    }

    #[test]
    fn a_replacement_that_would_leave_too_few_ready_is_refused() {
        let mut case = Case::new();
        // Another node not Ready: removing n1 would leave 2 Ready, 3 needed.
        if let Some(s) = case.group.status.as_mut() {
            s.nodes[1].ready = false;
        }
        let t = target("i-1", "a", "n1", TargetPurpose::Replace);
        assert_eq!(
            case.check(|g| g.terminate(&t)),
            Err(Refusal::TooFewReady {
                instance: "i-1".into(),
                ready_besides: 2,
                needed: 3
            })
        );
    }

    #[test]
    fn an_instance_outside_the_group_or_not_active_is_never_touched() {
        let case = Case::new();
        let elsewhere = target("i-1", "other-asg", "n1", TargetPurpose::Replace);
        assert_eq!(
            case.check(|g| g.terminate(&elsewhere)),
            Err(Refusal::NotTheGroupsAsg {
                asg: "other-asg".into()
            })
        );
        let mut leaving = Case::new();
        leaving.fresh[0].instances[0].lifecycle_state = "Terminating".into();
        let t = target("i-1", "a", "n1", TargetPurpose::Replace);
        assert_eq!(
            leaving.check(|g| g.terminate(&t)),
            Err(Refusal::NotActive {
                instance: "i-1".into(),
                asg: "a".into()
            })
        );
    }

    #[test]
    fn nothing_is_touched_outside_a_run() {
        let mut case = Case::new();
        case.status.run_start = None;
        let t = target("i-1", "a", "n1", TargetPurpose::Replace);
        assert_eq!(case.check(|g| g.terminate(&t)), Err(Refusal::OutsideARun));
        assert_eq!(
            case.check(|g| g.set_desired(&[change("b", 2, 3)])),
            Err(Refusal::OutsideARun)
        );
    }

    #[test]
    fn surplus_is_removed_only_from_an_asg_above_its_recorded_count() {
        let case = Case::new();
        let surplus = target("i-9", "a", "n9", TargetPurpose::RemoveSurplus);
        assert!(case.check(|g| g.terminate(&surplus)).is_ok());
        // b is at its recorded 2: nothing of it is surplus.
        let not_surplus = target("i-3", "b", "n3", TargetPurpose::RemoveSurplus);
        assert_eq!(
            case.check(|g| g.terminate(&not_surplus)),
            Err(Refusal::NotAboveRecordedCount {
                instance: "i-3".into(),
                asg: "b".into(),
                desired: 2,
                recorded: Some(2)
            })
        );
    }

    #[test]
    fn capacity_changes_stay_within_max_and_never_make_aws_pick_a_victim() {
        let case = Case::new();
        assert!(case.check(|g| g.set_desired(&[change("b", 2, 3)])).is_ok());
        // Above a's max of 3.
        assert_eq!(
            case.check(|g| g.set_desired(&[change("a", 3, 4)])),
            Err(Refusal::AboveMax {
                asg: "a".into(),
                to: 4,
                max: 3
            })
        );
        // Planned from a stale count.
        assert_eq!(
            case.check(|g| g.set_desired(&[change("b", 1, 3)])),
            Err(Refusal::StaleCount {
                asg: "b".into(),
                planned_from: 1,
                desired: 2
            })
        );
        // Below the 3 instances running in a: AWS would choose which to kill.
        assert_eq!(
            case.check(|g| g.set_desired(&[change("a", 3, 2)])),
            Err(Refusal::AwsWouldPickAVictim {
                asg: "a".into(),
                to: 2,
                active: 3
            })
        );
        // Not one of the group's ASGs.
        assert_eq!(
            case.check(|g| g.set_desired(&[change("c", 1, 2)])),
            Err(Refusal::NotTheGroupsAsg { asg: "c".into() })
        );
    }

    #[test]
    fn only_the_groups_nodes_are_uncordoned() {
        let case = Case::new();
        assert!(case.check(|g| g.owns_node("n1")).is_ok());
        assert_eq!(
            case.check(|g| g.owns_node("someone-elses")),
            Err(Refusal::NotTheGroupsNode {
                node: "someone-elses".into()
            })
        );
    }
}
