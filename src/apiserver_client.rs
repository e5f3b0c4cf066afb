//! The manager's client to the apiserver: kube's own middleware (base URI,
//! authentication, extra headers, retry of 5xx/429) over a connection that
//! speaks HTTP/2 when the apiserver offers it, as client-go does.
//!
//! kube's default stack offers HTTP/1.1 only (kube-rs/kube#1923: websocket
//! upgrades need it, and the manager never upgrades). Over HTTP/1.1 each
//! request in flight holds a connection of its own: a burst of 150 spot
//! warnings opened about 200 connections to the apiserver in 3 s, each with
//! a TLS handshake on both sides (docs/benchmarks.md). Over HTTP/2 they are
//! streams of one connection.
//!
//! Through a proxy, kube's default is used.

use crate::{Error, Result};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use std::time::Duration;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

/// A connection with nothing received for this long is pinged, and closed if
/// no answer comes within [`PING_TIMEOUT`]: an apiserver gone without a FIN
/// (a node lost, a network cut) would otherwise hold every stream of the one
/// connection for ever. client-go's values (ReadIdleTimeout, PingTimeout).
const PING_AFTER_IDLE: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Flow control: what the apiserver may send ahead of our reading. Every
/// watch shares the connection's window, so one watch read slowly (a
/// reconcile holding its stream) must not stall the others: the connection's
/// window holds many streams' worth. Memory is spent only on bytes received
/// and not yet read. hyper's defaults are 2 MiB and 5 MiB.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;

/// A client for `config`: ours, unless it goes through a proxy (kube's
/// default stack has the proxy connectors).
pub fn build(config: kube::Config) -> Result<kube::Client> {
    if config.proxy_url.is_some() {
        kube::Client::try_from(config).map_err(Error::kube("build client"))
    } else {
        http2(config)
    }
}

fn http2(config: kube::Config) -> Result<kube::Client> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let tls = config
        .rustls_client_config()
        .map_err(Error::kube("TLS configuration for the apiserver"))?;
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
                Error::Config(format!("tls-server-name {name:?} in the kubeconfig: {e}"))
            })?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    let https = builder.enable_http1().enable_http2().wrap_connector(tcp);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let http = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_AFTER_IDLE)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .http2_initial_stream_window_size(STREAM_WINDOW)
        .http2_initial_connection_window_size(CONNECTION_WINDOW)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(
            config
                .auth_layer()
                .map_err(Error::kube("apiserver authentication"))?,
        )
        .layer(
            config
                .extra_headers_layer()
                .map_err(Error::kube("apiserver request headers"))?,
        )
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}
