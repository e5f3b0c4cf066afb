//! The controller-manager: clients, admin server, leader election, and the
//! controllers, all stopped by one shutdown signal.

use crate::admin::{self, Readiness};
use crate::clock::SystemClock;
use crate::cloud::{self, aws::AwsCloudProvider};
use crate::config::Settings;
use crate::context::Context;
use crate::crd::NodeGroup;
use crate::leader::{Elector, Leadership};
use crate::metrics::Metrics;
use crate::{Error, Result};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Cancels `shutdown` on SIGTERM or SIGINT.
pub fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(e) => {
                    warn!(error = %e, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await
                }
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => info!("SIGINT received, shutting down"),
            _ = term => info!("SIGTERM received, shutting down"),
        }
        shutdown.cancel();
    });
}

pub async fn kube_client(settings: &Settings) -> Result<kube::Client> {
    kube::Client::try_from(kube_config(settings).await?).map_err(Error::kube("build client"))
}

/// A client that surfaces HTTP 429 at once (for evictions).
pub async fn kube_client_without_retry(settings: &Settings) -> Result<kube::Client> {
    let mut config = kube_config(settings).await?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(Error::kube("build eviction client"))
}

async fn kube_config(settings: &Settings) -> Result<kube::Config> {
    let config = if let Some(path) = &settings.kubeconfig {
        let kubeconfig = Kubeconfig::read_from(path)
            .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?
    } else if settings.in_cluster {
        kube::Config::incluster()
            .map_err(|e| Error::Config(format!("in-cluster configuration: {e}")))?
    } else {
        kube::Config::infer().await.map_err(|e| {
            Error::Config(format!(
                "no kubeconfig or in-cluster configuration found: {e}"
            ))
        })?
    };
    Ok(config)
}

/// Fails with a clear message when the CRDs are not installed.
async fn check_crds(client: &kube::Client, settings: &Settings) -> Result<()> {
    let api: Api<NodeGroup> = match &settings.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::Config(
            "the NodeGroup CRD is not installed: kubectl apply -f manifests/crds/".into(),
        )),
        Err(e) => Err(Error::kube("list NodeGroups")(e)),
    }
}

/// Runs until SIGTERM/SIGINT (or `shutdown` is cancelled by the caller).
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<()> {
    let settings = Arc::new(settings);
    let metrics = Arc::new(Metrics::default());
    let readiness = Readiness::default();

    let listener = admin::bind(settings.admin_address).await?;
    let admin_addr = listener.local_addr().map_err(Error::Admin)?;
    info!(address = %admin_addr, "admin server listening");
    let admin_task = tokio::spawn(admin::serve(
        listener,
        metrics.clone(),
        readiness.clone(),
        shutdown.clone(),
    ));

    let client = kube_client(&settings).await?;
    let eviction_client = kube_client_without_retry(&settings).await?;
    check_crds(&client, &settings).await?;

    let sdk = cloud::load_sdk_config(&settings.aws).await;
    if sdk.region().is_none() {
        warn!(
            "no AWS region configured (aws.region, --aws-region or AWS_REGION): AWS calls will fail"
        );
    }
    let cloud = Arc::new(
        AwsCloudProvider::new(sdk.clone(), settings.aws.emulator_account.clone())
            .with_metrics(metrics.clone()),
    );
    if settings.dry_run {
        warn!(
            "dry-run: no AWS or Kubernetes object will be mutated; intended mutations are logged"
        );
    }
    readiness.set(true);

    let leadership = if settings.leader_election.enabled {
        Leadership::elected()
    } else {
        Leadership::always()
    };
    let elector_task = settings.leader_election.enabled.then(|| {
        let elector = Elector::new(
            client.clone(),
            settings.leader_election.clone(),
            settings.identity.clone(),
            leadership.clone(),
        );
        tokio::spawn(elector.run(shutdown.clone()))
    });

    let queue = settings.interruption.queue_url.as_deref().map(|url| {
        Arc::new(crate::interruption::queue::Queue::new(
            &sdk,
            url,
            settings.aws.emulator_account.as_deref(),
            metrics.clone(),
        ))
    });
    if queue.is_none() {
        info!("interruption handler off: no interruption.queueUrl");
    }
    let ctx = Arc::new(
        Context::new(
            client,
            eviction_client,
            settings.clone(),
            Arc::new(SystemClock),
            metrics.clone(),
            leadership.clone(),
            cloud,
        )
        .with_interruption_queue(queue),
    );

    let mut leading = leadership.subscribe();
    while !shutdown.is_cancelled() {
        // Wait to lead.
        if !*leading.borrow_and_update() {
            info!(identity = %settings.identity, "waiting for leadership");
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = leading.changed() => if changed.is_err() { break } else { continue },
            }
        }
        metrics.leader.set(1);
        info!(identity = %settings.identity, "leading: starting controllers");
        let controllers = shutdown.child_token();
        let mut task = tokio::spawn(crate::controllers::run_all(
            ctx.clone(),
            controllers.clone(),
        ));
        // Lead until shutdown or until leadership is lost.
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow_and_update() { break }
                }
                _ = &mut task => { error!("controllers stopped unexpectedly"); break }
            }
        }
        metrics.leader.set(0);
        if !shutdown.is_cancelled() {
            warn!("leadership lost: stopping controllers");
        }
        controllers.cancel();
        if !task.is_finished() {
            let _ = task.await;
        }
    }
    info!("shutting down");
    if let Some(t) = elector_task {
        let _ = t.await;
    }
    let _ = admin_task.await;
    Ok(())
}
