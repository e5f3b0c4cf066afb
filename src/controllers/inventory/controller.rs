//! The NodeGroup controller: the node inventory. For each group it validates
//! the spec, maps the group's Nodes to their instances and ASGs, lists the
//! instances that never joined, reports per-ASG health, and keeps the group's
//! child Refresher and Replenisher in step with the spec. It never mutates AWS.

use super::deletion;
use super::facts::InstanceFacts;
use super::plan::{self, AwsView, Membership};
use crate::cloud::Cloud;
use crate::context::{Context, FIELD_MANAGER};
use crate::controllers::runtime::{About, instrumented};
use crate::crd::condition::{ConditionStatus, set_condition};
use crate::crd::nodegroup::ASG_CONFLICT as CONFLICT;
use crate::crd::refresher::RefresherSpec;
use crate::crd::replenisher::ReplenisherSpec;
use crate::crd::{NodeGroup, NodeGroupStatus, Refresher, Replenisher};
use crate::k8s::node::{NodeView, SlimNode, role_matches};
use crate::mutation::Intent;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const CONTROLLER: &str = "inventory";
pub const SPEC_VALID: &str = "SpecValid";
/// Set once the group is being deleted: what its deletion waits for.
pub const DELETING: &str = "Deleting";
/// Nodes per page of the initial list (and of every relist).
const NODE_PAGE: u32 = 50;
/// How often a deletion re-checks the children unwinding.
const DELETION_POLL: Duration = Duration::from_secs(2);

struct InventoryContext {
    ctx: Arc<Context>,
    nodes: Store<SlimNode>,
    /// Every NodeGroup, to find an ASG named by two of them.
    groups: Store<NodeGroup>,
    /// True once the Node cache holds the initial list. (Not
    /// `Store::wait_until_ready`: with kube-runtime 5 two reconciles waiting on
    /// it at once leaves one of them asleep forever.)
    nodes_ready: tokio::sync::watch::Receiver<bool>,
    /// Instances described so far (their facts never change).
    facts: InstanceFacts,
}

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let groups: Api<NodeGroup> = match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let (nodes, node_writer) = reflector::store::<SlimNode>();
    let (ready_tx, nodes_ready) = tokio::sync::watch::channel(false);
    let node_changes = relevant_node_changes(
        watcher(
            // Decoded slim: only what the inventory reads is ever held.
            Api::<SlimNode>::all(ctx.client.clone()),
            // Small pages: a page's JSON is held whole while it is decoded;
            // at 500 (the default) that is megabytes.
            watcher::Config::default()
                .any_semantic()
                .page_size(NODE_PAGE),
        )
        .default_backoff()
        .reflect(node_writer),
        ready_tx,
    );
    let controller = Controller::new(groups, watcher::Config::default().any_semantic());
    let group_store = controller.store();
    let all_groups = group_store.clone();
    let conflict_store = group_store.clone();
    info!(controller = CONTROLLER, "controller started");
    controller
        .watches_stream(node_changes, move |node| {
            groups_of_node(&group_store, &node)
        })
        // A group's ASGs changed: the others sharing one (or reporting a
        // conflict that may be gone now) are validated again.
        .watches(
            groups_api_of(&ctx),
            watcher::Config::default().any_semantic(),
            move |changed: NodeGroup| related_groups(&conflict_store, &changed),
        )
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(
            reconcile,
            error_policy,
            Arc::new(InventoryContext {
                ctx,
                nodes,
                groups: all_groups,
                nodes_ready,
                facts: InstanceFacts::default(),
            }),
        )
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(controller = CONTROLLER, object = %obj, "reconciled"),
                Err(e) => debug!(controller = CONTROLLER, error = %e, "reconcile failed"),
            }
        })
        .await;
    info!(controller = CONTROLLER, "controller stopped");
}

/// What about a Node matters to the inventory. Kubelet heartbeats change
/// none of it, so they never trigger a sync (and its AWS calls).
fn node_fingerprint(node: &(impl NodeView + ?Sized)) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (k, v) in node.node_labels().pairs() {
        (k, v).hash(&mut h);
    }
    node.provider_id().hash(&mut h);
    node.cordoned().hash(&mut h);
    node.ready().hash(&mut h);
    node.being_deleted().hash(&mut h);
    // An interruption notice and its drain's end drive the replenisher
    // through the group's status: the fields the status copies, and no more
    // (a lifecycle action's heartbeat is no reason to describe AWS again).
    crate::interruption::mark::record_of(node)
        .map(|r| (r.kind, r.instance_id, r.noticed, r.deadline, r.drained))
        .hash(&mut h);
    h.finish()
}

/// Passes a Node on only when its fingerprint changed, and always on delete.
/// Signals `ready` once the initial list is in the (already reflected) store.
fn relevant_node_changes(
    events: impl futures::Stream<Item = Result<watcher::Event<SlimNode>, watcher::Error>>
    + Send
    + 'static,
    ready: tokio::sync::watch::Sender<bool>,
) -> impl futures::Stream<Item = Result<SlimNode, watcher::Error>> + Send + 'static {
    let seen: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let ready = Arc::new(ready);
    events.filter_map(move |event| {
        let seen = seen.clone();
        let ready = ready.clone();
        async move {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                ready.send_replace(true);
                // The list's pages and the cache it replaced are free now.
                crate::memory::release_freed();
            }
            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            match event {
                Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                    let fingerprint = node_fingerprint(&node);
                    (seen.insert(node.name_any(), fingerprint) != Some(fingerprint))
                        .then_some(Ok(node))
                }
                Ok(watcher::Event::Delete(node)) => {
                    seen.remove(&node.name_any());
                    Some(Ok(node))
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                Err(e) => Some(Err(e)),
            }
        }
    })
}

/// The groups a Node may belong to: those that list it, and those whose
/// selector (or role, for the default selector) matches it.
fn groups_of_node(groups: &Store<NodeGroup>, node: &SlimNode) -> Vec<ObjectRef<NodeGroup>> {
    let name = node.node_name();
    groups
        .state()
        .iter()
        .filter(|g| {
            let listed = g
                .status
                .as_ref()
                .is_some_and(|s| s.nodes.iter().any(|n| n.name == name));
            let matches = match &g.spec.node_selector {
                Some(selector) => plan::selector_matches(selector, node.node_labels()),
                None => role_matches(g.spec.role, node.node_labels()),
            };
            listed || matches
        })
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

async fn reconcile(group: Arc<NodeGroup>, ictx: Arc<InventoryContext>) -> Result<Action> {
    let name = group.name_any();
    instrumented(
        &ictx.ctx,
        CONTROLLER,
        About::Group(&name),
        reconcile_inner(group, &ictx),
    )
    .await
}

fn error_policy(group: Arc<NodeGroup>, error: &Error, _ctx: Arc<InventoryContext>) -> Action {
    crate::controllers::runtime::retry_after(CONTROLLER, &group.name_any(), error)
}

/// Reads the AWS view of a group: one describe of its ASGs (shared with the
/// other controllers for a few seconds), and a describe of only the
/// instances `facts` does not know yet or whose state is read (those without
/// a Node). A steady sync describes no instance, whatever the node count.
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
    Ok(AwsView { asgs, instances })
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
    let mut validated = validated_status(&group, &others, &current, now);
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

    let mut nodes_ready = ictx.nodes_ready.clone();
    if nodes_ready.wait_for(|ready| *ready).await.is_err() {
        return Err(Error::InvalidObject("node cache closed".into()));
    }
    let nodes = ictx.nodes.state();
    let cloud = ctx.cloud.cloud(group.spec.region.as_deref());
    let (next, requeue) = match observe_aws(cloud.as_ref(), &ictx.facts, &group, &nodes).await {
        Ok(view) => (
            plan::inventory_status(&group, &nodes, &view, &validated, now),
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
    next.state = Some(plan::group_state(&group, &next));
    next.auto_scaling_group_count = i32::try_from(group.spec.auto_scaling_groups.len()).ok();
    next.next_refresh = match group.spec.refresh {
        Some(_) => next_refresh(ctx, &namespace, &name).await?,
        None => None,
    };
    ctx.metrics.group_observed(&namespace, &name, &next);
    if next != current {
        let becomes_invalid = is_invalid(&next) && !is_invalid(&current);
        let becomes_degraded = is_degraded(&next) && !is_degraded(&current);
        let breaker_opens = next_breaker_opens(&current, &next);
        write_status(ctx, &namespace, &name, &next).await?;
        for (flag, type_) in [
            (becomes_invalid, SPEC_VALID),
            (becomes_degraded, plan::DEGRADED),
            (breaker_opens, crate::crd::nodegroup::CIRCUIT_BREAKER),
        ] {
            if flag && let Some(c) = crate::crd::condition::find(&next.conditions, type_) {
                ctx.event(
                    &group.object_ref(&()),
                    EventType::Warning,
                    &c.reason,
                    "Sync",
                    c.message.clone(),
                )
                .await;
            }
        }
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

/// When the group's Refresher next runs, as it says.
async fn next_refresh(ctx: &Context, namespace: &str, name: &str) -> Result<Option<DateTime<Utc>>> {
    let refresher = Api::<Refresher>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get Refresher {namespace}/{name}")))?;
    Ok(refresher.and_then(|r| r.status?.next_run))
}

fn is_invalid(status: &NodeGroupStatus) -> bool {
    crate::crd::condition::find(&status.conditions, SPEC_VALID)
        .is_some_and(|c| c.status == ConditionStatus::False)
}

/// The circuit breaker opens with this status.
fn next_breaker_opens(current: &NodeGroupStatus, next: &NodeGroupStatus) -> bool {
    let open = |s: &NodeGroupStatus| {
        crate::crd::condition::find(&s.conditions, crate::crd::nodegroup::CIRCUIT_BREAKER)
            .is_some_and(|c| c.status == ConditionStatus::True)
    };
    open(next) && !open(current)
}

fn is_degraded(status: &NodeGroupStatus) -> bool {
    crate::crd::condition::find(&status.conditions, plan::DEGRADED)
        .is_some_and(|c| c.status == ConditionStatus::True)
}

/// Pure: the children a valid group should have (None = should not exist).
pub fn child_specs(group: &NodeGroup) -> (Option<RefresherSpec>, Option<ReplenisherSpec>) {
    let spec = &group.spec;
    let name = group.name_any();
    let refresher = spec.refresh.as_ref().map(|r| RefresherSpec {
        node_group: name.clone(),
        role: spec.role,
        schedule: r.schedule.clone(),
        time_zone: r.time_zone.clone(),
        surplus_nodes: r.effective_surplus(spec.role),
        max_node_age: r.max_node_age.clone(),
        drain_timeout: r.drain_timeout.clone(),
        drain_timeout_action: r.drain_timeout_action,
        ready_timeout: r.ready_timeout.clone(),
        master_settle_time: r.master_settle_time.clone(),
        suspend: spec.suspend,
    });
    let replenisher = spec.replenish.enabled.then(|| ReplenisherSpec {
        node_group: name.clone(),
        role: spec.role,
        desired: spec.desired,
        cooldown: spec.replenish.cooldown.clone(),
        join_timeout: spec.replenish.join_timeout.clone(),
        suspend: spec.suspend,
    });
    (refresher, replenisher)
}

async fn sync_children(
    ctx: &Context,
    group: &NodeGroup,
    namespace: &str,
    name: &str,
) -> Result<()> {
    let owner = group.controller_owner_ref(&()).ok_or_else(|| {
        Error::InvalidObject(format!("NodeGroup {namespace}/{name} has no uid yet"))
    })?;
    let (refresher, replenisher) = child_specs(group);
    let refreshers: Api<Refresher> = Api::namespaced(ctx.client.clone(), namespace);
    let replenishers: Api<Replenisher> = Api::namespaced(ctx.client.clone(), namespace);

    match refresher {
        Some(spec) => {
            apply_child::<Refresher, _>(ctx, &refreshers, name, &owner, "Refresher", spec).await?
        }
        None => {
            if let Some(existing) = refreshers
                .get_opt(name)
                .await
                .map_err(Error::kube("get Refresher"))?
            {
                // A run in progress holds the original desired counts and the
                // surplus it added: removing it now would lose them.
                if existing
                    .status
                    .as_ref()
                    .is_some_and(|s| s.run_start.is_some())
                {
                    warn!(group = %name, "refresh removed from spec but a run is in progress; keeping the Refresher");
                } else {
                    delete_child(ctx, &refreshers, namespace, name, "Refresher").await?;
                }
            }
        }
    }
    match replenisher {
        Some(spec) => {
            apply_child::<Replenisher, _>(ctx, &replenishers, name, &owner, "Replenisher", spec)
                .await?
        }
        None => {
            if replenishers
                .get_opt(name)
                .await
                .map_err(Error::kube("get Replenisher"))?
                .is_some()
            {
                delete_child(ctx, &replenishers, namespace, name, "Replenisher").await?;
            }
        }
    }
    Ok(())
}

async fn apply_child<K, S>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    kind: &'static str,
    spec: S,
) -> Result<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + serde::Serialize,
    S: serde::Serialize + PartialEq + serde::de::DeserializeOwned,
{
    // Skip the write when the child already has exactly this spec and owner.
    if let Some(existing) = api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get {kind} {name}")))?
    {
        let value = serde_json::to_value(&existing).map_err(|source| Error::Serialization {
            context: format!("{kind} {name}"),
            source,
        })?;
        let same_spec = value
            .get("spec")
            .and_then(|s| serde_json::from_value::<S>(s.clone()).ok())
            .is_some_and(|s| s == spec);
        let owned = existing
            .meta()
            .owner_references
            .as_ref()
            .is_some_and(|refs| refs.iter().any(|r| r.uid == owner.uid));
        if same_spec && owned {
            return Ok(());
        }
    }
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": spec,
    });
    let namespace = api.resource_url().to_string();
    ctx.mutations
        .perform(
            Intent::own("apply_child", format!("{kind}/{name}")),
            || async {
                api.patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
                .map_err(Error::kube(format!("apply {kind} {name} ({namespace})")))
            },
        )
        .await?;
    info!(kind, name, "child resource applied");
    Ok(())
}

async fn delete_child<K>(
    ctx: &Context,
    api: &Api<K>,
    namespace: &str,
    name: &str,
    kind: &'static str,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    ctx.mutations
        .perform(
            Intent::own("delete_child", format!("{kind}/{namespace}/{name}")),
            || async {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                    Err(e) => Err(Error::kube(format!("delete {kind} {namespace}/{name}"))(e)),
                }
            },
        )
        .await?;
    info!(kind, name, "child resource removed");
    Ok(())
}

/// The NodeGroups this manager watches.
fn groups_api_of(ctx: &Context) -> Api<NodeGroup> {
    match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    }
}

/// The other groups to validate again when `changed` changes: those naming
/// one of its ASGs, and those reporting a conflict (it may be resolved).
fn related_groups(store: &Store<NodeGroup>, changed: &NodeGroup) -> Vec<ObjectRef<NodeGroup>> {
    let key = |g: &NodeGroup| (g.namespace(), g.name_any());
    store
        .state()
        .iter()
        .filter(|g| key(g) != key(changed))
        .filter(|g| {
            !asg_conflicts(g, [changed]).is_empty()
                || g.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == SPEC_VALID && c.reason == CONFLICT)
                })
        })
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

/// Pure: the ASGs of `group` that another group also names (same region).
/// Two groups acting on one ASG would each take the other's nodes for its
/// own: both are invalid, and neither acts until one lets go.
pub fn asg_conflicts<'a>(
    group: &NodeGroup,
    others: impl IntoIterator<Item = &'a NodeGroup>,
) -> Vec<crate::crd::nodegroup::SpecProblem> {
    let me = (group.namespace(), group.name_any());
    let others: Vec<&NodeGroup> = others.into_iter().collect();
    let mut problems = vec![];
    for (i, asg) in group.spec.auto_scaling_groups.iter().enumerate() {
        let mut claimed_by: Vec<String> = others
            .iter()
            .filter(|o| (o.namespace(), o.name_any()) != me)
            .filter(|o| o.spec.region == group.spec.region)
            .filter(|o| {
                o.spec
                    .auto_scaling_groups
                    .iter()
                    .any(|a| a.name == asg.name)
            })
            .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
            .collect();
        if claimed_by.is_empty() {
            continue;
        }
        claimed_by.sort();
        problems.push(crate::crd::nodegroup::SpecProblem {
            field: format!("autoScalingGroups[{i}].name"),
            reason: CONFLICT,
            message: format!(
                "Auto Scaling Group {:?} is also in NodeGroup {}; neither group acts on it until one lets go",
                asg.name,
                claimed_by.join(", ")
            ),
        });
    }
    problems
}

/// Pure: the status after validating the spec, against the other groups
/// too (`others` may include this one). Keeps every other field as is.
pub fn validated_status(
    group: &NodeGroup,
    others: &[Arc<NodeGroup>],
    current: &NodeGroupStatus,
    now: DateTime<Utc>,
) -> NodeGroupStatus {
    let generation = group.metadata.generation;
    let mut next = current.clone();
    let mut problems = group.spec.validate();
    problems.extend(asg_conflicts(group, others.iter().map(|g| g.as_ref())));
    match problems.first() {
        None => set_condition(
            &mut next.conditions,
            SPEC_VALID,
            ConditionStatus::True,
            "Valid",
            "spec is valid",
            generation,
            now,
        ),
        Some(first) => {
            let message = problems
                .iter()
                .map(|p| format!("spec.{}: {}", p.field, p.message))
                .collect::<Vec<_>>()
                .join("; ");
            set_condition(
                &mut next.conditions,
                SPEC_VALID,
                ConditionStatus::False,
                first.reason,
                message,
                generation,
                now,
            );
        }
    }
    next.observed_generation = generation;
    next.desired_nodes = Some(group.spec.desired);
    next
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
mod tests {
    use super::*;
    use crate::crd::NodeGroupSpec;
    use chrono::TimeZone;

    fn group(spec: serde_json::Value, generation: i64) -> NodeGroup {
        let spec: NodeGroupSpec = serde_json::from_value(spec).expect("spec");
        let mut g = NodeGroup::new("workers", spec);
        g.metadata.namespace = Some("ns".into());
        g.metadata.generation = Some(generation);
        g
    }

    #[test]
    fn invalid_schedule_gives_a_false_condition_naming_the_field() {
        let now = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let g = group(
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "a"}], "desired": 3,
                               "refresh": {"schedule": "whenever", "timeZone": "Nowhere/City"}}),
            4,
        );
        let status = validated_status(&g, &[], &NodeGroupStatus::default(), now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason, "InvalidSchedule");
        assert!(c.message.contains("spec.refresh.schedule"), "{}", c.message);
        assert!(c.message.contains("spec.refresh.timeZone"), "{}", c.message);
        assert_eq!(status.observed_generation, Some(4));
    }

    #[test]
    fn a_valid_spec_is_stable_so_nothing_is_rewritten() {
        let t0 = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let g = group(
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "a"}], "desired": 3}),
            1,
        );
        let first = validated_status(&g, &[], &NodeGroupStatus::default(), t0);
        let second = validated_status(&g, &[], &first, t0 + chrono::Duration::minutes(1));
        assert_eq!(
            first, second,
            "an unchanged group must produce an identical status"
        );
    }

    #[test]
    fn an_asg_named_by_two_groups_makes_both_invalid_naming_the_other() {
        let now = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let named = |name: &str, asgs: serde_json::Value, region: Option<&str>| {
            let mut g = group(
                serde_json::json!({"role": "Worker", "autoScalingGroups": asgs, "desired": 3,
                                   "region": region}),
                1,
            );
            g.metadata.name = Some(name.into());
            Arc::new(g)
        };
        let a = named(
            "a",
            serde_json::json!([{"name": "x"}, {"name": "shared"}]),
            None,
        );
        let b = named("b", serde_json::json!([{"name": "shared"}]), None);
        let elsewhere = named("c", serde_json::json!([{"name": "x"}]), Some("eu-west-1"));
        let all = vec![a.clone(), b.clone(), elsewhere.clone()];
        for (me, other, field) in [
            (&a, "ns/b", "spec.autoScalingGroups[1].name"),
            (&b, "ns/a", "spec.autoScalingGroups[0].name"),
        ] {
            let status = validated_status(me, &all, &NodeGroupStatus::default(), now);
            let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
            assert_eq!(
                (c.status.clone(), c.reason.as_str()),
                (ConditionStatus::False, CONFLICT)
            );
            assert!(
                c.message.contains(other) && c.message.contains(field),
                "{}",
                c.message
            );
            // Read back by both child controllers: neither acts.
            let mut g = (**me).clone();
            g.status = Some(status);
            assert!(g.asg_conflict().is_some_and(|m| m.contains(other)));
        }
        // The same name in another region is another ASG; a group is never
        // in conflict with itself.
        let status = validated_status(&elsewhere, &all, &NodeGroupStatus::default(), now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::True, "{}", c.message);
        assert!(asg_conflicts(&b, [b.as_ref()]).is_empty());
        // Once one lets go, the other is valid again.
        let b_moved = named("b", serde_json::json!([{"name": "other"}]), None);
        let status = validated_status(&a, &[a.clone(), b_moved], &NodeGroupStatus::default(), now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::True);
    }
}

#[cfg(test)]
mod inventory_tests {
    use super::*;
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
            [(2, 1), (1, 0)],
            "one describe of the ASGs, one of the instances; then the ASGs only"
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
        tokio::time::sleep(super::super::facts::STATE_FLOOR).await;
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

    #[test]
    fn children_follow_the_spec() {
        let mut g = group(&["nodes-a"], 3);
        let (refresher, replenisher) = child_specs(&g);
        assert!(refresher.is_none(), "no refresh configured");
        let rp = replenisher.expect("replenish is on by default");
        assert_eq!(
            (rp.node_group.as_str(), rp.desired, rp.cooldown.as_str()),
            ("workers", 3, "5m")
        );
        g.spec.refresh =
            Some(serde_json::from_value(serde_json::json!({"schedule": "0 3 * * *"})).unwrap());
        g.spec.replenish.enabled = false;
        let (refresher, replenisher) = child_specs(&g);
        let rf = refresher.expect("refresher");
        assert_eq!(rf.surplus_nodes, 1, "worker default");
        assert_eq!(rf.time_zone, "UTC");
        assert!(replenisher.is_none());
    }

    #[test]
    fn a_slim_node_reads_the_same_to_the_inventory_at_a_fraction_of_the_size() {
        let json = include_str!("fixtures/kops-node.json");
        let full: Node = serde_json::from_str(json).expect("fixture");
        let slim: SlimNode = serde_json::from_str(json).expect("fixture, slim");
        assert_eq!(node_fingerprint(&slim), node_fingerprint(&full));
        assert!(
            slim.node_labels().pairs().eq(full.node_labels().pairs()),
            "the same labels"
        );
        assert_eq!(slim.instance_id(), full.instance_id());
        assert!(slim.ready() && slim.cordoned());
        assert!(crate::interruption::mark::record_of(&slim).is_some());
        // What the group's status says of it is the same.
        let ig = "nodes-ap-northeast-1a";
        let g = group(&[ig], 1);
        let view = AwsView {
            asgs: vec![crate::controllers::inventory::plan::tests::asg(
                ig,
                ig,
                "ap-northeast-1a",
                &["i-0a1b2c3d4e5f60718"],
                1,
            )],
            instances: vec![],
        };
        let status = |n: &dyn Fn() -> NodeGroupStatus| n();
        let of_full = status(&|| {
            plan::inventory_status(
                &g,
                std::slice::from_ref(&full),
                &view,
                &Default::default(),
                t0(),
            )
        });
        let of_slim = status(&|| {
            plan::inventory_status(
                &g,
                std::slice::from_ref(&slim),
                &view,
                &Default::default(),
                t0(),
            )
        });
        assert_eq!(of_slim, of_full);
        assert_eq!(of_full.nodes.len(), 1, "the fixture is a member");
    }

    #[test]
    fn heartbeats_do_not_change_the_fingerprint_but_readiness_and_cordons_do() {
        let n = node("n1", "nodes-a", "zone-a", "i-1", true);
        let mut heartbeat = n.clone();
        heartbeat
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        heartbeat.metadata.resource_version = Some("999".into());
        assert_eq!(node_fingerprint(&n), node_fingerprint(&heartbeat));
        let not_ready = node("n1", "nodes-a", "zone-a", "i-1", false);
        assert_ne!(node_fingerprint(&n), node_fingerprint(&not_ready));
        let mut cordoned = n.clone();
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_ne!(node_fingerprint(&n), node_fingerprint(&cordoned));
    }

    #[test]
    fn a_drains_end_changes_the_fingerprint_a_lifecycle_heartbeat_does_not() {
        use crate::interruption::mark::{ANNOTATION, HookAction, Record};
        use chrono::TimeZone;
        let t0 = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let with = |r: &Record| {
            let mut n = node("n1", "nodes-a", "zone-a", "i-1", true);
            n.metadata.annotations = Some(
                [(
                    ANNOTATION.to_string(),
                    serde_json::to_string(r).expect("json"),
                )]
                .into(),
            );
            n
        };
        let record = Record {
            kind: "terminate_lifecycle_action".into(),
            instance_id: "i-1".into(),
            noticed: t0,
            deadline: t0 + chrono::Duration::seconds(90),
            group: None,
            drained: None,
            pods_left: None,
            lifecycle: Some(HookAction {
                auto_scaling_group: "nodes-a".into(),
                hook: "h".into(),
                token: "t".into(),
                region: None,
                heartbeat: None,
                completed: None,
            }),
        };
        let plain = node("n1", "nodes-a", "zone-a", "i-1", true);
        assert_ne!(node_fingerprint(&plain), node_fingerprint(&with(&record)));
        let mut beat = record.clone();
        if let Some(a) = beat.lifecycle.as_mut() {
            a.heartbeat = Some(t0 + chrono::Duration::seconds(15));
        }
        assert_eq!(
            node_fingerprint(&with(&record)),
            node_fingerprint(&with(&beat))
        );
        let drained = Record {
            drained: Some(t0 + chrono::Duration::seconds(30)),
            ..record.clone()
        };
        assert_ne!(
            node_fingerprint(&with(&record)),
            node_fingerprint(&with(&drained))
        );
    }
}
