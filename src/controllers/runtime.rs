//! What the controllers share at run time: the retry policy, reconcile
//! spans and metrics, and the runner of the per-group child controllers.

use crate::context::Context;
use crate::crd::NodeGroup;
use crate::error::Error;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// What to do after a failed reconcile. Conflicts, throttling and a lost lease
/// are expected contention: retry soon, quietly. Anything else: log, back off.
pub fn retry_after(controller: &'static str, object: &str, error: &Error) -> Action {
    if error.is_expected_contention() {
        tracing::debug!(controller, object, error = %error, "retrying");
        Action::requeue(std::time::Duration::from_secs(2))
    } else {
        tracing::warn!(controller, object, error = %error, "reconcile failed");
        Action::requeue(std::time::Duration::from_secs(15))
    }
}

/// What a reconcile is about, named in its span: every line it logs then
/// carries `controller` and `group` (or `node`) as fields.
#[derive(Debug, Clone, Copy)]
pub enum About<'a> {
    Group(&'a str),
    /// A group's child resource (Refresher, Replenisher), by its own name.
    Child {
        group: &'a str,
        name: &'a str,
    },
    Node(&'a str),
}

/// Wraps a reconcile in a span naming its controller and object, with
/// metrics (count, duration, error category), and contains a panic in it:
/// see [`contained`].
pub async fn instrumented<T, F>(
    ctx: &Context,
    controller: &'static str,
    about: About<'_>,
    reconcile: F,
) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    use tracing::Instrument;
    let span = match about {
        About::Group(group) | About::Child { group, .. } => {
            tracing::info_span!("reconcile", controller, group)
        }
        About::Node(node) => tracing::info_span!("reconcile", controller, node),
    };
    let started = Instant::now();
    let result = contained(controller, reconcile)
        .instrument(span.clone())
        .await;
    let category = result.as_ref().err().map(Error::category);
    ctx.metrics
        .reconciled(controller, started.elapsed(), category);
    // One line per reconcile, in its span: what a test (or an operator)
    // reads to know that this group or node was looked at.
    let outcome = category.unwrap_or("ok");
    span.in_scope(|| match about {
        About::Child { name, .. } => tracing::debug!(outcome, object = name, "reconcile ended"),
        _ => tracing::debug!(outcome, "reconcile ended"),
    });
    result
}

/// Runs one reconcile, turning a panic into [`Error::Panicked`]: kube-runtime
/// would re-raise it and stop the whole controller (every group, every node),
/// where this way only that object is retried, after the error policy's
/// delay, and the panic is logged and counted (`category="panic"`).
pub async fn contained<T, F>(controller: &'static str, reconcile: F) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(reconcile).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            tracing::error!(controller, panic = %message, "reconcile panicked; contained to this object, retried later");
            Err(Error::Panicked {
                controller,
                message,
            })
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_reconcile_is_an_error_of_that_object_not_the_controllers_end() {
        let panicked = contained("replenisher", async {
            if std::hint::black_box(true) {
                panic!("DateTime + TimeDelta overflowed");
            }
            Ok::<u8, Error>(1)
        })
        .await;
        let Err(e) = panicked else {
            panic!("not contained")
        };
        assert_eq!(e.category(), "panic");
        assert!(e.to_string().contains("overflowed"), "{e}");
        assert!(!e.is_expected_contention(), "logged, retried after a delay");
        // A formatted message is kept too; a plain result passes through.
        let formatted = contained("inventory", async {
            let n = std::hint::black_box(7);
            if n > 0 {
                panic!("index {n} out of range");
            }
            Ok::<u8, Error>(0)
        })
        .await;
        assert!(formatted.is_err_and(|e| e.to_string().contains("index 7")));
        assert_eq!(
            contained("inventory", async { Ok::<u8, Error>(3) })
                .await
                .ok(),
            Some(3)
        );
    }
}
