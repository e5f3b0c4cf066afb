//! The admin HTTP server: `/metrics`, `/healthz`, `/readyz`.

use crate::metrics::Metrics;
use crate::{Error, Result};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;

/// What `/readyz` reports: set once the manager can talk to the apiserver and
/// its CRDs are installed. A standby replica (not leader) is ready too: it is
/// healthy and able to take over.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What `/healthz` reports: failing once the controllers have stopped by
/// themselves several times in a row, so the kubelet restarts the process
/// (a fresh one may get past what keeps failing: a wedged client, a bad
/// watch) rather than it backing off forever.
#[derive(Clone, Default)]
pub struct Liveness(Arc<AtomicBool>);

impl Liveness {
    pub fn set_failing(&self, failing: bool) {
        self.0.store(failing, Ordering::Release);
    }
    pub fn alive(&self) -> bool {
        !self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    readiness: Readiness,
    liveness: Liveness,
}

/// Binds the admin address; returns the bound address (useful with port 0).
pub async fn bind(address: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(Error::Admin)
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    liveness: Liveness,
    shutdown: CancellationToken,
) -> Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz_handler))
        .route("/readyz", get(readyz_handler))
        .with_state(AdminState {
            metrics,
            readiness,
            liveness,
        });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(Error::Admin)
}

async fn metrics_handler(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

async fn healthz_handler(State(state): State<AdminState>) -> impl IntoResponse {
    if state.liveness.alive() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the controllers keep stopping; restart wanted",
        )
    }
}

async fn readyz_handler(State(state): State<AdminState>) -> impl IntoResponse {
    if state.readiness.get() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn healthz_fails_only_while_the_controllers_keep_stopping() {
        let state = AdminState {
            metrics: Arc::new(Metrics::default()),
            readiness: Readiness::default(),
            liveness: Liveness::default(),
        };
        let status = |s: &AdminState| {
            let s = s.clone();
            async move { healthz_handler(State(s)).await.into_response().status() }
        };
        assert_eq!(status(&state).await, StatusCode::OK);
        state.liveness.set_failing(true);
        assert_eq!(status(&state).await, StatusCode::SERVICE_UNAVAILABLE);
        state.liveness.set_failing(false);
        assert_eq!(status(&state).await, StatusCode::OK);
    }
}
