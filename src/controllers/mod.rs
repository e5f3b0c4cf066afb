//! Every controller, constructed in one list (`run_all`); nothing below
//! knows the list exists. One folder per controller, each exposing
//! `run(ctx, shutdown)`: `inventory`, `replenisher`, `refresher`,
//! `interruption` (the SQS receiver and the drainer of marked nodes). What
//! they share: `authority` (whether a node may be taken away, asked by
//! every path), `book` (the rule book as the plans read it), `group_view` (the group as their plans see it), `observe`
//! (what they look at), `guard` (the safety refusals), `aws_mutations` (through the mutation gate),
//! and `runtime` (retry policy, spans, the per-group runner).

pub mod authority;
pub mod aws_mutations;
pub mod book;
pub mod command;
pub mod execute;
pub mod group_view;
pub mod guard;
pub mod interruption;
pub mod inventory;
#[cfg(test)]
pub(crate) mod mock_api;
pub mod observe;
pub mod refresher;
pub mod replenisher;
pub mod runtime;
#[cfg(test)]
mod walk;
pub mod window;

use crate::context::Context;
use std::future::Future;
use std::sync::Arc;
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
        async {
            if let Some(queue) = ctx.interruption_queue.clone() {
                ctx.metrics
                    .register_controller(interruption::drainer::CONTROLLER);
                tokio::join!(
                    bounded(
                        interruption::receiver::CONTROLLER,
                        interruption::receiver::run(ctx.clone(), queue, shutdown.clone()),
                        &shutdown,
                    ),
                    bounded(
                        interruption::drainer::CONTROLLER,
                        interruption::drainer::run(ctx.clone(), shutdown.clone()),
                        &shutdown,
                    ),
                );
            }
        },
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
