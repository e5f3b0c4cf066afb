//! One module per controller, each exposing `run(ctx, shutdown)`.
//! `run_all` starts every controller and returns when all have stopped.

pub mod inventory;
pub mod nodegroup;
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
    tokio::join!(
        nodegroup::run(ctx.clone(), shutdown.clone()),
        replenisher::run(ctx.clone(), shutdown.clone())
    );
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
