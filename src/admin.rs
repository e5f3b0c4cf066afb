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

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    readiness: Readiness,
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
    shutdown: CancellationToken,
) -> Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz_handler))
        .with_state(AdminState { metrics, readiness });
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

async fn readyz_handler(State(state): State<AdminState>) -> impl IntoResponse {
    if state.readiness.get() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
