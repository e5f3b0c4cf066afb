//! The admin HTTP server: `/metrics`, `/healthz`, `/readyz`, and
//! `/scrapes` (when Prometheus last scraped `/metrics`, for `check`).

use crate::metrics::Metrics;
use crate::{Error, Result};
use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
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

/// The header every Prometheus scrape carries (Prometheus's
/// `scrape/scrape.go`, `targetScraper`): a `/metrics` request with it is a
/// scrape, one without (a curl, `check` itself) is not.
pub const SCRAPE_HEADER: &str = "x-prometheus-scrape-timeout-seconds";

/// What `/scrapes` answers: since when this process serves, and its last
/// scrape (when, from where). A scrape that never comes (a NetworkPolicy
/// that admits another namespace, a ServiceMonitor that selects nothing)
/// shows only as `SpotNodeManagerNoLeader` otherwise.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scrapes {
    pub serving_since: chrono::DateTime<chrono::Utc>,
    pub last_scrape: Option<Scrape>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scrape {
    pub at: chrono::DateTime<chrono::Utc>,
    pub from: String,
}

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    readiness: Readiness,
    liveness: Liveness,
    scrapes: Arc<std::sync::Mutex<Scrapes>>,
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
        .route("/scrapes", get(scrapes_handler))
        .with_state(AdminState {
            metrics,
            readiness,
            liveness,
            scrapes: Arc::new(std::sync::Mutex::new(Scrapes {
                serving_since: chrono::Utc::now(),
                last_scrape: None,
            })),
        });
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
    .map_err(Error::Admin)
}

async fn metrics_handler(
    State(state): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> impl IntoResponse {
    if headers.contains_key(SCRAPE_HEADER) {
        let mut scrapes = state.scrapes.lock().unwrap_or_else(|p| p.into_inner());
        scrapes.last_scrape = Some(Scrape {
            at: chrono::Utc::now(),
            from: peer.ip().to_string(),
        });
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

async fn scrapes_handler(State(state): State<AdminState>) -> impl IntoResponse {
    let scrapes = state
        .scrapes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let body = serde_json::to_string(&scrapes).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    ([(header::CONTENT_TYPE, "application/json")], body)
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

    fn fresh_state() -> AdminState {
        AdminState {
            metrics: Arc::new(Metrics::default()),
            readiness: Readiness::default(),
            liveness: Liveness::default(),
            scrapes: Arc::new(std::sync::Mutex::new(Scrapes {
                serving_since: chrono::Utc::now(),
                last_scrape: None,
            })),
        }
    }

    #[tokio::test]
    async fn healthz_fails_only_while_the_controllers_keep_stopping() {
        let state = fresh_state();
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

    /// Issue 69 item 7: only a request carrying Prometheus's scrape header
    /// is a scrape (a curl or `check` reading `/metrics` is not), with
    /// where it came from.
    #[tokio::test]
    async fn a_scrape_is_a_metrics_request_with_prometheus_header() {
        let state = fresh_state();
        let peer: SocketAddr = "10.1.2.3:41000".parse().expect("address");
        let get = |headers: HeaderMap| {
            let s = state.clone();
            async move {
                metrics_handler(State(s), ConnectInfo(peer), headers)
                    .await
                    .into_response()
                    .status()
            }
        };
        assert_eq!(get(HeaderMap::new()).await, StatusCode::OK);
        let last = |s: &AdminState| s.scrapes.lock().expect("lock").last_scrape.clone();
        assert_eq!(last(&state), None, "a plain GET is no scrape");
        let mut prometheus = HeaderMap::new();
        prometheus.insert(SCRAPE_HEADER, "10".parse().expect("value"));
        assert_eq!(get(prometheus).await, StatusCode::OK);
        let scrape = last(&state).expect("a scrape");
        assert_eq!(scrape.from, "10.1.2.3");
        let answered = scrapes_handler(State(state.clone())).await.into_response();
        assert_eq!(answered.status(), StatusCode::OK);
    }
}
