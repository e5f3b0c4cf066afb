//! One module per controller, each exposing `run(ctx, shutdown)`.
//! `run_all` starts every controller and returns when all have stopped.

pub mod inventory;
pub mod nodegroup;
pub mod refresh_plan;
pub mod refresh_schedule;
pub mod refresher;
pub mod replenish_plan;
pub mod replenisher;

use crate::context::Context;
use crate::error::Error;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Runs every controller until `shutdown` is cancelled.
pub async fn run_all(ctx: Arc<Context>, shutdown: CancellationToken) {
    ctx.metrics.register_controller(nodegroup::CONTROLLER);
    ctx.metrics.register_controller(replenisher::CONTROLLER);
    ctx.metrics.register_controller(refresher::CONTROLLER);
    tokio::join!(
        bounded(
            nodegroup::CONTROLLER,
            nodegroup::run(ctx.clone(), shutdown.clone()),
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
