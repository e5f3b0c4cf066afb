//! The NodeGroup controller's reconcile: the node inventory. For each group
//! it validates the spec, maps the group's Nodes to their instances and ASGs, lists the
//! instances that never joined, reports per-ASG health, and keeps the group's
//! child Refresher and Replenisher in step with the spec. It never mutates AWS.

use super::deletion;
use super::instance_facts::InstanceFacts;
use super::plan::{self, AwsView, Membership};
use crate::cloud::Cloud;
use crate::context::Context;
use crate::controllers::runtime::{About, instrumented};
use crate::crd::condition::{ConditionStatus, set_condition};
use crate::crd::{NodeGroup, NodeGroupStatus, Refresher, Replenisher};
use crate::events::{ConditionEvent, Reason};
use crate::k8s::node::{NodeView, SlimNode};
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

use super::children::sync_children;
use super::validation::validated_status;
use crate::crd::condition::{DEGRADED, DELETING, EXTERNAL_UPDATE, SPEC_VALID};

pub const CONTROLLER: &str = "inventory";
/// How often a deletion re-checks the children unwinding.
const DELETION_POLL: Duration = Duration::from_secs(2);

pub(super) struct InventoryContext {
    pub(super) ctx: Arc<Context>,
    pub(super) nodes: Store<SlimNode>,
    /// Every NodeGroup, to find an ASG named by two of them.
    pub(super) groups: Store<NodeGroup>,
    /// True once the Node cache holds the initial list. (Not
    /// `Store::wait_until_ready`: with kube-runtime 5 two reconciles waiting on
    /// it at once leaves one of them asleep forever.)
    pub(super) nodes_ready: tokio::sync::watch::Receiver<bool>,
    /// Instances described so far (their facts never change).
    pub(super) facts: InstanceFacts,
    /// Another termination handler in the cluster, listed once a minute.
    pub(super) handlers: super::handlers::Listed<Vec<String>>,
    /// A cluster-autoscaler naming ASGs, listed once a minute.
    pub(super) autoscalers: super::handlers::Listed<Vec<super::autoscalers::Autoscaler>>,
    /// Karpenter's NodePools, listed once a minute.
    pub(super) node_pools: super::handlers::Listed<Vec<String>>,
    /// The ASGs' terminate lifecycle hooks, described once an hour.
    pub(super) hooks: super::hourly::Hourly<Vec<crate::cloud::LifecycleHook>>,
    /// The ASGs' warm pools, described once an hour.
    pub(super) warm_pools: super::hourly::Hourly<Option<crate::cloud::WarmPool>>,
    /// Spot and on-demand prices, read at most hourly and daily.
    pub(super) prices: crate::cloud::prices::PriceBook,
}

pub(super) async fn reconcile(
    group: Arc<NodeGroup>,
    ictx: Arc<InventoryContext>,
) -> Result<Action> {
    let name = group.name_any();
    instrumented(
        &ictx.ctx,
        CONTROLLER,
        About::Group(&name),
        reconcile_inner(group, &ictx),
    )
    .await
}

pub(super) fn error_policy(
    group: Arc<NodeGroup>,
    error: &Error,
    _ctx: Arc<InventoryContext>,
) -> Action {
    crate::controllers::runtime::retry_after(CONTROLLER, &group.name_any(), error)
}

/// Reads the AWS view of a group: one describe of its ASGs (shared with the
/// other controllers for a few seconds), a describe of only the instances
/// `facts` does not know yet or whose state is read (those without a Node),
/// and of the ASGs' symbolic template versions every other resync outside
/// operations. A steady
/// sync describes no instance, whatever the node count.
/// `nodes` are any view of a Node: the cache's `Arc`s pass through without
/// copying every Node on each sync.
pub async fn observe_aws<N: NodeView>(
    cloud: &dyn Cloud,
    facts: &InstanceFacts,
    group: &NodeGroup,
    nodes: &[N],
) -> Result<AwsView> {
    let names = group.spec.asg_names();
    let asgs = cloud.describe_groups(&names).await?;
    let membership = Membership::of(group, &asgs);
    let joined: BTreeSet<String> = nodes.iter().filter_map(|n| n.instance_id()).collect();
    let wanted: BTreeSet<String> = asgs
        .iter()
        .flat_map(|a| a.instances.iter().map(|i| i.instance_id.clone()))
        .chain(
            nodes
                .iter()
                .filter(|n| membership.includes(*n))
                .filter_map(|n| n.instance_id()),
        )
        .collect();
    // The plan reads the EC2 state of active members without a Node only.
    let stateful: BTreeSet<String> = asgs
        .iter()
        .flat_map(|a| a.instances.iter())
        .filter(|i| i.is_active() && !joined.contains(&i.instance_id))
        .map(|i| i.instance_id.clone())
        .collect();
    let started = std::time::Instant::now();
    let ids = facts.to_describe(&wanted, &stateful, started);
    let described = if ids.is_empty() {
        vec![]
    } else {
        cloud.describe_instances(&ids).await?
    };
    let instances = facts.remember(described, started, &wanted, std::time::Instant::now());
    // The versions of the templates the ASGs name as $Latest or $Default.
    let symbolic = super::drift::symbolic_templates(&asgs);
    // Not during an operation (its budget is 20 calls a minute, and a
    // refresh replaces the nodes anyway): what is known stands until then.
    // A group whose drift is rolled still asks: its roll follows a newer
    // version, or a rollback, while it runs.
    let operating = group.status.as_ref().is_some_and(|s| s.operation.is_some())
        && group.spec.drift.action != crate::crd::nodegroup::DriftAction::Replace;
    let ask = match operating {
        true => vec![],
        false => facts.templates.to_ask(&symbolic, started),
    };
    // A failure (an IAM policy without ec2:DescribeLaunchTemplates) leaves
    // drift unknown until an ask succeeds; everything else syncs as before.
    let templates = match ask.is_empty() {
        true => facts.templates.remember(&ask, vec![], started, &symbolic),
        false => match cloud.template_versions(&ask).await {
            Ok(answer) => facts.templates.remember(&ask, answer, started, &symbolic),
            Err(e) => {
                tracing::warn!(error = %e, "launch templates unreadable: drift unknown");
                let why = match &e {
                    Error::Aws {
                        code: Some(code), ..
                    } => format!("{e} ({code})"),
                    _ => e.to_string(),
                };
                facts.templates.failed(&ask, &why, started, &symbolic)
            }
        },
    };
    let drift_unknown = facts.templates.unreadable(&symbolic);
    Ok(AwsView {
        asgs,
        instances,
        templates,
        drift_unknown,
    })
}

async fn reconcile_inner(group: Arc<NodeGroup>, ictx: &InventoryContext) -> Result<Action> {
    let ctx = &ictx.ctx;
    let namespace = group.namespace().ok_or_else(|| {
        Error::InvalidObject(format!("NodeGroup {} has no namespace", group.name_any()))
    })?;
    let name = group.name_any();
    let deleting = group.metadata.deletion_timestamp.is_some();
    if !deleting && !deletion::has_finalizer(&group) {
        // Before any child exists or any status is written: a deletion
        // from now on waits for the group's work to unwind.
        deletion::set_finalizer(ctx, &group, true).await?;
        return Ok(Action::requeue(Duration::ZERO));
    }
    let now = ctx.clock.now();
    let current = group.status.clone().unwrap_or_default();
    let others = ictx.groups.state();
    let mut nodes_ready = ictx.nodes_ready.clone();
    if nodes_ready.wait_for(|ready| *ready).await.is_err() {
        return Err(Error::InvalidObject("node cache closed".into()));
    }
    let nodes = ictx.nodes.state();
    let cloud = ctx.cloud.cloud(group.spec.region.as_deref());
    let observed = observe_aws(cloud.as_ref(), &ictx.facts, &group, &nodes).await;
    let described = observed.as_ref().ok().map(|view| view.asgs.as_slice());
    let mut validated = validated_status(&group, &others, described, &current, now);
    let waiting = if deleting {
        let waiting = deletion::observe_waits(ctx, &group, &namespace, &name).await?;
        set_condition(
            &mut validated.conditions,
            DELETING,
            ConditionStatus::True,
            if waiting.is_some() {
                "Unwinding"
            } else {
                "Unwound"
            },
            match &waiting {
                Some(w) => format!("waiting for {w}"),
                None => "nothing under way; removing the finalizer".to_string(),
            },
            group.metadata.generation,
            now,
        );
        waiting
    } else {
        None
    };

    let (next, requeue) = match &observed {
        Ok(view) => (
            plan::inventory_status(&group, &nodes, view, &validated, now),
            ctx.settings.resync_interval,
        ),
        Err(e) => {
            warn!(group = %name, error = %e, "AWS sync failed");
            (
                plan::sync_failed_status(&group, &validated, &e.to_string(), now),
                ctx.settings.resync_interval.min(Duration::from_secs(15)),
            )
        }
    };

    let mut next = next;
    if let Ok(view) = &observed {
        beside_the_description(ictx, cloud.as_ref(), &group, view, &mut next, now).await;
    }
    other_handlers(ictx, cloud.as_ref(), &group, &mut next, now).await;
    next.state = Some(plan::group_state(&group, &next, now));
    next.auto_scaling_group_count = i32::try_from(group.spec.auto_scaling_groups.len()).ok();
    (next.next_refresh, next.next) = children_next(ctx, &group, &namespace, &name).await?;
    if group.spec.refresh.is_none() {
        next.next_refresh = None;
    }
    ctx.metrics.group_observed(&namespace, &name, &next);
    if next != current {
        write_status(ctx, &namespace, &name, &next).await?;
        warn_of_changes(ctx, &group, &current, &next).await;
    }
    if deleting {
        // The children unwind on their own (they see the deletion); the
        // garbage collector removes them once the finalizer is gone.
        if waiting.is_none() && deletion::has_finalizer(&group) {
            info!(group = %name, "group work unwound; releasing the deletion");
            deletion::set_finalizer(ctx, &group, false).await?;
            ctx.metrics.group_forgotten(&namespace, &name);
            return Ok(Action::await_change());
        }
        return Ok(Action::requeue(DELETION_POLL));
    }
    // Children follow a valid spec only: an invalid edit must not tear down a
    // Refresher in the middle of its run.
    if !is_invalid(&next) {
        sync_children(ctx, &group, &namespace, &name).await?;
    }
    Ok(Action::requeue(requeue))
}

/// What is judged of the described ASGs beside the inventory itself: the
/// settings that compete (warm pools described hourly), the cost record.
async fn beside_the_description(
    ictx: &InventoryContext,
    cloud: &dyn Cloud,
    group: &NodeGroup,
    view: &AwsView,
    next: &mut NodeGroupStatus,
    now: DateTime<Utc>,
) {
    let existing: Vec<String> = view.asgs.iter().map(|a| a.name.clone()).collect();
    let pools = super::competing::warm_pools(&ictx.warm_pools, cloud, &existing).await;
    let (client, scope) = (&ictx.ctx.client, listing_scope(&ictx.ctx));
    let autoscalers = super::autoscalers::autoscalers(&ictx.autoscalers, client, scope);
    let autoscalers = autoscalers.await.unwrap_or_default();
    let node_pools = super::karpenter::node_pools(&ictx.node_pools, client).await;
    let node_pools = node_pools.unwrap_or_default();
    let asgs = (view.asgs.as_slice(), pools.as_slice());
    let others = super::competing::Others {
        autoscalers: &autoscalers,
        node_pools: &node_pools,
    };
    super::competing::set_competing(group, asgs, others, next, now);
    let settings = &ictx.ctx.settings;
    let cadence = super::cost::Cadence::of(settings.cost_interval, settings.resync_interval);
    let prices = &ictx.prices;
    super::cost::account_group(prices, cloud, group, view, next, cadence, now).await;
}

/// Where another controller's Deployments are looked for: the whole
/// cluster; against the emulator (tests share one apiserver) only the
/// manager's own namespace, since another test's is not this one's (only a
/// test build accepts an emulator account).
pub fn listing_scope(ctx: &Context) -> Option<&str> {
    (ctx.settings.aws.emulator_account.as_ref()).and(ctx.settings.namespace.as_deref())
}

/// The OtherTerminationHandler condition on `next`, from a listing at
/// most a minute old and the ASGs' hooks described at most an hour ago.
async fn other_handlers(
    ictx: &InventoryContext,
    cloud: &dyn Cloud,
    group: &NodeGroup,
    next: &mut NodeGroupStatus,
    now: chrono::DateTime<chrono::Utc>,
) {
    let ctx = &ictx.ctx;
    let found = super::handlers::handlers(&ictx.handlers, &ctx.client, listing_scope(ctx)).await;
    let what = "lifecycle hooks (IAM: autoscaling:DescribeLifecycleHooks)";
    let hooks = ictx
        .hooks
        .get(&group.spec.asg_names(), what, |asg| async move {
            cloud.terminate_hooks(&asg).await
        })
        .await
        .map(|found| {
            let each = found
                .iter()
                .flat_map(|(asg, hooks)| hooks.iter().map(move |h| (asg.clone(), h.clone())));
            each.collect::<Vec<_>>()
        });
    let queue = ctx.settings.interruption.queue_url.as_deref();
    let uncompleted = hooks.map(|h| super::hooks::uncompleted(&h, queue));
    super::handlers::set_handlers(
        group,
        found.as_deref().map(Vec::as_slice),
        uncompleted.as_deref(),
        next,
        now,
    );
}

/// A Warning Event for each problem the new status raises: the spec turned
/// invalid, the group degraded, the circuit breaker opened, a kops rolling
/// update started; a Normal one when nodes are found drifted.
async fn warn_of_changes(
    ctx: &Context,
    group: &NodeGroup,
    current: &NodeGroupStatus,
    next: &NodeGroupStatus,
) {
    let becomes_invalid = is_invalid(next) && !is_invalid(current);
    let becomes_degraded = is_degraded(next) && !is_degraded(current);
    let breaker_opens = next_breaker_opens(current, next);
    let turns_true = |type_: &str| {
        let is_true = |s: &NodeGroupStatus| {
            crate::crd::condition::find(&s.conditions, type_)
                .is_some_and(|c| c.status == ConditionStatus::True)
        };
        is_true(next) && !is_true(current)
    };
    // In the order of ConditionEvent::ALL, which the reference lists.
    let flags = [
        becomes_invalid,
        becomes_degraded,
        breaker_opens,
        turns_true(EXTERNAL_UPDATE),
        turns_true(crate::crd::condition::COMPETING_ASG_SETTINGS),
        turns_true(crate::crd::condition::NO_ROOM_ABOVE_DESIRED),
        turns_true(crate::crd::condition::OTHER_TERMINATION_HANDLER),
    ];
    debug_assert_eq!(flags.len(), ConditionEvent::ALL.len());
    for (flag, (type_, _)) in flags.into_iter().zip(ConditionEvent::ALL) {
        if flag && let Some(c) = crate::crd::condition::find(&next.conditions, type_) {
            ctx.condition_event(&group.object_ref(&()), c, "Sync").await;
        }
    }
    for message in unreliable_pools(current, next, ctx.clock.now()) {
        let object = group.object_ref(&());
        ctx.event(
            &object,
            EventType::Warning,
            Reason::UnreliablePool,
            "Sync",
            message,
        )
        .await;
    }
    if let Some(message) = super::drift::drift_appeared(current, next) {
        ctx.event(
            &group.object_ref(&()),
            EventType::Normal,
            Reason::DriftDetected,
            "Sync",
            message,
        )
        .await;
    }
}

/// What the children say comes next: the Refresher's next run, and the
/// sooner of its next disruption and the Replenisher's, in one line.
async fn children_next(
    ctx: &Context,
    group: &NodeGroup,
    namespace: &str,
    name: &str,
) -> Result<(Option<DateTime<Utc>>, Option<String>)> {
    let has_refresher = group.spec.refresh.is_some()
        || group.spec.drift.action == crate::crd::nodegroup::DriftAction::Replace;
    let (next_run, refresher_next) = match has_refresher {
        true => next_refresh(ctx, namespace, name).await?,
        false => (None, None),
    };
    let replenisher_next = match group.spec.replenish.enabled {
        true => next_replenish(ctx, namespace, name).await?,
        false => None,
    };
    let next = crate::crd::next::soonest(refresher_next, replenisher_next).map(|n| n.summary);
    Ok((next_run, next))
}

/// When the group's Refresher next runs, and its next disruption in one
/// line, as it says.
async fn next_refresh(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<(
    Option<DateTime<Utc>>,
    Option<crate::crd::next::NextDisruption>,
)> {
    let refresher = Api::<Refresher>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get Refresher {namespace}/{name}")))?;
    let status = refresher.and_then(|r| r.status).unwrap_or_default();
    Ok((status.next_run, status.next))
}

/// The group's Replenisher's next disruption, as it says.
async fn next_replenish(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<crate::crd::next::NextDisruption>> {
    let replenisher = Api::<Replenisher>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get Replenisher {namespace}/{name}")))?;
    Ok(replenisher.and_then(|r| r.status?.next))
}

/// The pools that become unreliable with this status (their notices in 24
/// hours reach [`UNRELIABLE_AT`](crate::crd::nodegroup::UNRELIABLE_AT)),
/// each in one line: once per episode.
fn unreliable_pools(
    current: &NodeGroupStatus,
    next: &NodeGroupStatus,
    now: DateTime<Utc>,
) -> Vec<String> {
    use crate::crd::nodegroup::{UNRELIABLE_AT, notices_in_window};
    next.auto_scaling_groups
        .iter()
        .filter_map(|a| {
            let count = notices_in_window(&a.recent, now);
            let before = current
                .auto_scaling_groups
                .iter()
                .find(|p| p.name == a.name)
                .map_or(0, |p| notices_in_window(&p.recent, now));
            (count >= UNRELIABLE_AT && before < UNRELIABLE_AT).then(|| {
                format!(
                    "{}: {count} interruption warnings and rebalance recommendations in 24 h; raises elsewhere go to pools with fewer",
                    a.name
                )
            })
        })
        .collect()
}

fn is_invalid(status: &NodeGroupStatus) -> bool {
    crate::crd::condition::find(&status.conditions, SPEC_VALID)
        .is_some_and(|c| c.status == ConditionStatus::False)
}

/// The circuit breaker opens with this status.
fn next_breaker_opens(current: &NodeGroupStatus, next: &NodeGroupStatus) -> bool {
    let open = |s: &NodeGroupStatus| {
        crate::crd::condition::find(&s.conditions, crate::crd::condition::CIRCUIT_BREAKER)
            .is_some_and(|c| c.status == ConditionStatus::True)
    };
    open(next) && !open(current)
}

fn is_degraded(status: &NodeGroupStatus) -> bool {
    crate::crd::condition::find(&status.conditions, DEGRADED)
        .is_some_and(|c| c.status == ConditionStatus::True)
}

/// Server-side apply of the status with our single field manager. The
/// operation lock is never part of it (its holders write it with a
/// compare-and-swap of their own).
async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &NodeGroupStatus,
) -> Result<()> {
    let mut status = status.clone();
    status.operation = None;
    ctx.apply_status::<NodeGroup>(namespace, name, &status)
        .await
}

#[cfg(test)]
mod inventory_tests {
    use super::*;

    #[test]
    fn a_pool_is_called_unreliable_once_per_episode() {
        use crate::crd::nodegroup::{AutoScalingGroupStatus, PoolEvent, PoolEventKind};
        let now = t0();
        let with = |n: usize| NodeGroupStatus {
            auto_scaling_groups: vec![AutoScalingGroupStatus {
                name: "a".into(),
                recent: (0..n)
                    .map(|i| PoolEvent {
                        kind: PoolEventKind::Interruption,
                        at: now,
                        instance_id: Some(format!("i-{i}")),
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(unreliable_pools(&with(1), &with(2), now).is_empty());
        let said = unreliable_pools(&with(2), &with(3), now);
        assert_eq!(said.len(), 1);
        assert!(
            said[0].starts_with("a: 3 interruption warnings"),
            "{}",
            said[0]
        );
        assert!(unreliable_pools(&with(3), &with(4), now).is_empty());
    }
    use crate::cloud::fake::FakeCloud;
    use crate::controllers::inventory::plan::tests::{group, node, t0};
    use k8s_openapi::api::core::v1::Node;

    /// A fake cloud with `per_asg` instances in each of 3 ASGs and a Node for each.
    fn world(per_asg: usize) -> (FakeCloud, Vec<Node>) {
        let cloud = FakeCloud::new();
        let mut nodes = vec![];
        for zone in ["a", "c", "d"] {
            let name = format!("nodes-{zone}");
            for (i, id) in cloud
                .add_group(&name, &format!("zone-{zone}"), per_asg, 1000, t0())
                .iter()
                .enumerate()
            {
                // The fake's ASGs carry no kops tag: membership is by the ASGs' instances.
                nodes.push(node(
                    &format!("n-{zone}-{i}"),
                    &name,
                    &format!("zone-{zone}"),
                    id,
                    true,
                ));
            }
        }
        (cloud, nodes)
    }

    /// (calls, instance describes) of a first sync, then of a second one.
    async fn calls_for_two_syncs(per_asg: usize) -> [(usize, usize); 2] {
        let (cloud, nodes) = world(per_asg);
        let facts = InstanceFacts::default();
        let g = group(&["nodes-a", "nodes-c", "nodes-d"], (per_asg * 3) as i32);
        let mut calls = [(0, 0); 2];
        for sync in &mut calls {
            cloud.reset_calls();
            let view = observe_aws(&cloud, &facts, &g, &nodes)
                .await
                .expect("observe");
            let status = plan::inventory_status(&g, &nodes, &view, &Default::default(), t0());
            assert_eq!(status.nodes.len(), per_asg * 3);
            assert!(status.nodes.iter().all(|n| n.launch_time == Some(t0())));
            assert!(status.not_joined.is_empty());
            *sync = (cloud.total_calls(), cloud.calls("describe_instances"));
        }
        calls
    }

    #[tokio::test]
    async fn aws_calls_per_sync_do_not_grow_with_the_node_count() {
        let small = calls_for_two_syncs(2).await; // 6 nodes
        let large = calls_for_two_syncs(167).await; // 501 nodes
        assert_eq!(
            small, large,
            "calls for 6 nodes {small:?} vs 501 nodes {large:?}"
        );
        assert_eq!(
            small,
            [(3, 1), (1, 0)],
            "one describe of the ASGs, one of the instances, one of the \
             templates; then the ASGs only (templates every other resync)"
        );
    }

    #[tokio::test]
    async fn no_template_is_asked_while_an_operation_holds_the_group() {
        use crate::crd::nodegroup::{OperationKind, OperationLock};
        let (cloud, nodes) = world(1);
        let facts = InstanceFacts::for_resync(Duration::ZERO);
        let mut g = group(&["nodes-a", "nodes-c", "nodes-d"], 3);
        let locked = || {
            Some(NodeGroupStatus {
                operation: Some(OperationLock {
                    holder: OperationKind::Refresh,
                    holder_name: "workers".into(),
                    since: t0(),
                }),
                ..Default::default()
            })
        };
        g.status = locked();
        observe_aws(&cloud, &facts, &g, &nodes)
            .await
            .expect("observe");
        assert_eq!(cloud.calls("template_versions"), 0);
        g.status = None;
        observe_aws(&cloud, &facts, &g, &nodes)
            .await
            .expect("observe");
        assert_eq!(cloud.calls("template_versions"), 1, "once the lock is free");

        // A group that rolls its drift asks during its own roll.
        let facts = InstanceFacts::for_resync(Duration::ZERO);
        g.spec.drift.action = crate::crd::nodegroup::DriftAction::Replace;
        g.status = locked();
        observe_aws(&cloud, &facts, &g, &nodes)
            .await
            .expect("observe");
        assert_eq!(cloud.calls("template_versions"), 2, "asked under the lock");
    }

    #[tokio::test]
    async fn a_new_template_version_drifts_the_nodes_launched_before_it() {
        let (cloud, nodes) = world(1);
        let facts = InstanceFacts::for_resync(Duration::ZERO);
        let g = group(&["nodes-a", "nodes-c", "nodes-d"], 3);
        let sync = |nodes: Vec<Node>| {
            let (cloud, facts, g) = (&cloud, &facts, &g);
            async move {
                let view = observe_aws(cloud, facts, g, &nodes).await.expect("observe");
                plan::inventory_status(g, &nodes, &view, &Default::default(), t0())
            }
        };
        let status = sync(nodes.clone()).await;
        assert_eq!(status.drifted_nodes, Some(0));
        assert_eq!(
            cloud.calls("template_versions"),
            1,
            "one call, three templates"
        );

        // `kops update cluster`: a new version of nodes-a's template only.
        cloud.new_template_version("nodes-a");
        let status = sync(nodes.clone()).await;
        assert_eq!(status.drifted_nodes, Some(1));
        let drifted = status
            .nodes
            .iter()
            .find(|n| n.drifted.is_some())
            .expect("one");
        assert_eq!(drifted.auto_scaling_group.as_deref(), Some("nodes-a"));
        assert_eq!(
            drifted.drifted.as_deref(),
            Some("launch template nodes-a-template version 1, its ASG launches version 2")
        );

        // kops's annotation marks a node whatever its template.
        let mut marked = nodes.clone();
        marked[1].metadata.annotations = Some(
            [(
                crate::crd::labels::NEEDS_UPDATE_ANNOTATION.to_string(),
                "".to_string(),
            )]
            .into(),
        );
        let status = sync(marked).await;
        assert_eq!(status.drifted_nodes, Some(2));
        assert_eq!(
            status
                .nodes
                .iter()
                .find(|n| n.name == nodes[1].name_any())
                .and_then(|n| n.drifted.clone())
                .as_deref(),
            Some("annotation kops.k8s.io/needs-update")
        );
    }

    #[tokio::test]
    async fn an_instance_without_a_node_is_described_for_its_state_a_joined_one_is_not() {
        let (cloud, mut nodes) = world(2);
        let facts = InstanceFacts::default();
        let g = group(&["nodes-a", "nodes-c", "nodes-d"], 6);
        observe_aws(&cloud, &facts, &g, &nodes)
            .await
            .expect("observe");
        // One Node goes; its instance stays in its ASG.
        let gone = nodes.remove(0);
        let id = gone.instance_id().expect("instance");
        cloud.reset_calls();
        // Within the state floor: what is known serves.
        observe_aws(&cloud, &facts, &g, &nodes)
            .await
            .expect("observe");
        assert_eq!(cloud.calls("describe_instances"), 0);
        tokio::time::sleep(super::super::instance_facts::STATE_FLOOR).await;
        let view = observe_aws(&cloud, &facts, &g, &nodes)
            .await
            .expect("observe");
        assert_eq!(cloud.calls("describe_instances"), 1, "its state, again");
        let status = plan::inventory_status(&g, &nodes, &view, &Default::default(), t0());
        let listed: Vec<&str> = status
            .not_joined
            .iter()
            .map(|n| n.instance_id.as_str())
            .collect();
        assert_eq!(listed, [id.as_str()]);
        // Its launch time comes from what was kept.
        assert_eq!(status.not_joined[0].launch_time, Some(t0()));
    }

    #[tokio::test]
    async fn observing_makes_no_mutation() {
        let (cloud, nodes) = world(2);
        let g = group(&["nodes-a", "nodes-c", "nodes-d", "missing"], 6);
        observe_aws(&cloud, &InstanceFacts::default(), &g, &nodes)
            .await
            .expect("observe");
        for op in ["set_desired_capacity", "terminate_in_group"] {
            assert_eq!(cloud.calls(op), 0, "{op}");
        }
    }

    #[tokio::test]
    async fn an_aws_error_is_surfaced_with_its_operation() {
        let (cloud, nodes) = world(1);
        cloud.fail_next("describe_groups", "Rate exceeded");
        let g = group(&["nodes-a"], 1);
        let err = observe_aws(&cloud, &InstanceFacts::default(), &g, &nodes)
            .await
            .expect_err("fails");
        assert!(err.to_string().contains("Rate exceeded"), "{err}");
    }
}
