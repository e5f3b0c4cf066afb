//! One module per controller, each exposing `run(ctx, shutdown)`.
//! `run_all` starts every controller and returns when all have stopped.

pub mod inventory;
pub mod refresher;
pub mod replenisher;
pub mod vocabulary;

use crate::cloud::AsgDescription;
use crate::context::Context;
use crate::controllers::vocabulary::{AsgView, NodeView};
use crate::crd::nodegroup::OperationKind;
use crate::crd::{NodeGroup, NodeGroupStatus};
use crate::error::Error;
use crate::k8s::lock::{self, Holder, LockState};
use crate::mutation::{Applied, Intent};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Runs every controller until `shutdown` is cancelled.
pub async fn run_all(ctx: Arc<Context>, shutdown: CancellationToken) {
    ctx.metrics.register_controller(inventory::CONTROLLER);
    ctx.metrics.register_controller(replenisher::CONTROLLER);
    ctx.metrics.register_controller(refresher::CONTROLLER);
    tokio::join!(
        bounded(
            inventory::CONTROLLER,
            inventory::run(ctx.clone(), shutdown.clone()),
            &shutdown
        ),
        bounded(
            replenisher::CONTROLLER,
            replenisher::run(ctx.clone(), shutdown.clone()),
            &shutdown
        ),
        bounded(
            refresher::CONTROLLER,
            refresher::run(ctx.clone(), shutdown.clone()),
            &shutdown
        ),
    );
}

/// How long in-flight reconciles may take to finish after the shutdown signal.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs a controller; once `shutdown` fires, gives it [`SHUTDOWN_GRACE`] to
/// stop, then drops it. (kube-runtime's graceful shutdown can wait forever
/// when the signal arrives before its store is ready.) Dropping in-flight work
/// is safe: every step is persisted before it acts.
async fn bounded(
    name: &'static str,
    controller: impl Future<Output = ()>,
    shutdown: &CancellationToken,
) {
    tokio::pin!(controller);
    tokio::select! {
        _ = &mut controller => return,
        _ = shutdown.cancelled() => {}
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, controller)
        .await
        .is_err()
    {
        tracing::warn!(
            controller = name,
            "did not stop within the grace period; abandoning in-flight work"
        );
    }
}

/// What to do after a failed reconcile. Conflicts, throttling and a lost lease
/// are expected contention: retry soon, quietly. Anything else: log, back off.
pub fn retry_after(
    controller: &'static str,
    object: &str,
    error: &Error,
) -> kube::runtime::controller::Action {
    use kube::runtime::controller::Action;
    match error.category() {
        "kube_conflict" | "kube_throttled" | "aws_throttled" | "not_leader" => {
            tracing::debug!(controller, object, error = %error, "retrying");
            Action::requeue(std::time::Duration::from_secs(2))
        }
        _ => {
            tracing::warn!(controller, object, error = %error, "reconcile failed");
            Action::requeue(std::time::Duration::from_secs(15))
        }
    }
}

/// Wraps a reconcile with metrics: count, duration, error category.
pub async fn instrumented<T, F>(
    ctx: &Context,
    controller: &'static str,
    reconcile: F,
) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    let started = Instant::now();
    let result = reconcile.await;
    let category = result.as_ref().err().map(Error::category);
    ctx.metrics
        .reconciled(controller, started.elapsed(), category);
    result
}

/// Runs the controller of a per-group child resource (Refresher,
/// Replenisher): reconciled on its own changes and on those of the NodeGroup
/// of the same name, whose status (inventory, lock) drives its plan.
pub async fn run_group_child<K, F, Fut>(
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    controller: &'static str,
    reconcile: F,
) where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: FnMut(Arc<K>, Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    let (children, groups): (Api<K>, Api<NodeGroup>) = match &ctx.settings.namespace {
        Some(ns) => (
            Api::namespaced(ctx.client.clone(), ns),
            Api::namespaced(ctx.client.clone(), ns),
        ),
        None => (Api::all(ctx.client.clone()), Api::all(ctx.client.clone())),
    };
    tracing::info!(controller, "controller started");
    Controller::new(children, watcher::Config::default().any_semantic())
        .watches(groups, watcher::Config::default().any_semantic(), |group| {
            let namespace = group.namespace().unwrap_or_default();
            Some(ObjectRef::<K>::new(&group.name_any()).within(&namespace))
        })
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(
            reconcile,
            move |child: Arc<K>, error: &Error, _ctx| {
                retry_after(controller, &child.name_any(), error)
            },
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(controller, error = %e, "reconcile failed");
            }
        })
        .await;
    tracing::info!(controller, "controller stopped");
}

/// The child as stored now. The controller's cache can lag this manager's
/// own status writes (a reconcile triggered by the NodeGroup can run before
/// the watch delivers the write); planning from it would redo or undo a step.
/// None: it was deleted.
pub async fn reread<K>(ctx: &Context, child: &K) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let name = child.name_any();
    let namespace = child
        .namespace()
        .ok_or_else(|| Error::InvalidObject(format!("{name} has no namespace")))?;
    Api::<K>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("get {namespace}/{name}")))
}

/// What a child controller observes before planning: its NodeGroup (with a
/// status that has seen the current spec: act only on such an inventory),
/// the group's lock from its side, and a fresh describe of the group's ASGs.
pub struct Observed {
    pub namespace: String,
    pub name: String,
    pub me: Holder,
    pub group: NodeGroup,
    pub group_status: NodeGroupStatus,
    pub lock: LockState,
    pub cloud: Arc<dyn crate::cloud::Cloud>,
    pub fresh: Vec<AsgDescription>,
    pub asgs: Vec<AsgView>,
    /// The group's nodes, Ready only while their instance is active.
    pub nodes: Vec<NodeView>,
}

/// Observes for `child` (of `kind`) working on NodeGroup `node_group`.
/// Without `describe`, the ASGs are not described (`fresh` is empty): for a
/// plan that does not look at them. Ok(Err(d)): nothing to act on yet, look
/// again after `d`.
pub async fn observe_for<K: Resource>(
    ctx: &Context,
    child: &K,
    kind: OperationKind,
    node_group: &str,
    describe: bool,
) -> Result<Result<Observed, Duration>, Error> {
    let name = child.name_any();
    let namespace = child.namespace().ok_or_else(|| {
        Error::InvalidObject(format!("{kind:?} resource {name} has no namespace"))
    })?;
    let groups: Api<NodeGroup> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(group) = groups
        .get_opt(node_group)
        .await
        .map_err(Error::kube(format!(
            "get NodeGroup {namespace}/{node_group}"
        )))?
    else {
        // No garbage collector guaranteed (and none on test apiservers): idle.
        return Ok(Err(Duration::from_secs(60)));
    };
    let Some(group_status) = group
        .status
        .clone()
        .filter(|s| s.observed_generation == group.metadata.generation)
    else {
        return Ok(Err(Duration::from_secs(2)));
    };
    let me = Holder {
        kind,
        name: name.clone(),
    };
    let lock = lock::observe(
        &ctx.client,
        &namespace,
        group_status.operation.as_ref(),
        &me,
    )
    .await?;
    let cloud = ctx.cloud.cloud(group.spec.region.as_deref());
    let fresh = if describe {
        cloud.describe_groups(&group.spec.asg_names()).await?
    } else {
        vec![]
    };
    let asgs = fresh.iter().map(AsgView::from).collect();
    let nodes = vocabulary::node_views(&group_status.nodes, &fresh);
    Ok(Ok(Observed {
        namespace,
        name,
        me,
        group,
        group_status,
        lock,
        cloud,
        fresh,
        asgs,
        nodes,
    }))
}

/// The one executor of the child controllers' steps: the status that records
/// what is about to be done is written first (when it changed), then the
/// action runs. Killed between the two, the next reconcile finds the record
/// and settles it against what AWS and the cluster say; killed before the
/// write, nothing was decided. `written` tracks what is stored.
pub async fn persist_then<K, S, T, F, Fut>(
    ctx: &Context,
    (namespace, name): (&str, &str),
    written: &mut Option<S>,
    next: &S,
    step: &str,
    act: F,
) -> Result<T, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    S: serde::Serialize + PartialEq + Clone,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    if written.as_ref() != Some(next) {
        ctx.apply_status::<K>(namespace, name, next).await?;
        *written = Some(next.clone());
    }
    crate::fault::crash_point(&format!("{step}:persisted"));
    let done = act().await?;
    crate::fault::crash_point(&format!("{step}:acted"));
    Ok(done)
}

/// Writes the status when it differs from what is stored.
pub async fn write_if_changed<K, S>(
    ctx: &Context,
    (namespace, name): (&str, &str),
    written: &mut Option<S>,
    next: &S,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    S: serde::Serialize + PartialEq + Clone,
{
    if written.as_ref() != Some(next) {
        ctx.apply_status::<K>(namespace, name, next).await?;
        *written = Some(next.clone());
    }
    Ok(())
}

/// Sets an ASG's desired capacity, through the mutation gate.
pub async fn set_desired_capacity(
    ctx: &Context,
    cloud: &dyn crate::cloud::Cloud,
    change: &vocabulary::DesiredChange,
    why: &str,
) -> Result<Applied<()>, Error> {
    ctx.mutations
        .perform(
            Intent::aws(
                "set_desired_capacity",
                format!("asg/{}", change.asg),
                format!("{} -> {} ({why})", change.from, change.to),
            ),
            || cloud.set_desired_capacity(&change.asg, change.to),
        )
        .await
}

/// Terminates an instance through its ASG (with or without decrementing its
/// desired count), through the mutation gate.
pub async fn terminate_in_group(
    ctx: &Context,
    cloud: &dyn crate::cloud::Cloud,
    instance_id: &str,
    decrement: bool,
    why: String,
) -> Result<Applied<()>, Error> {
    ctx.mutations
        .perform(
            Intent::aws(
                "terminate_instance_in_auto_scaling_group",
                format!("instance/{instance_id}"),
                why,
            ),
            || cloud.terminate_in_group(instance_id, decrement),
        )
        .await
}
