//! The controller-manager: clients, admin server, leader election, and the
//! controllers, all stopped by one shutdown signal.

use crate::admin::{self, Readiness};
use crate::clock::SystemClock;
use crate::cloud::{self, aws::AwsCloudProvider};
use crate::config::Settings;
use crate::context::Context;
use crate::crd::NodeGroup;
use crate::leader::Elector;
use crate::leadership::Leadership;
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
    crate::apiserver_client::build(kube_config(settings).await?)
}

/// A client that surfaces HTTP 429 at once (for evictions).
pub async fn kube_client_without_retry(settings: &Settings) -> Result<kube::Client> {
    let mut config = kube_config(settings).await?;
    config.default_retry = false;
    crate::apiserver_client::build(config)
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

/// The longest one AWS operation (all its attempts) may take: shorter than
/// the time from our last possible renewal to another replica leading
/// (leaseDuration - renewDeadline), so no call we began as leader is still
/// running when someone else leads. At least 1 s.
pub fn aws_operation_timeout(le: &crate::config::LeaderElectionSettings) -> std::time::Duration {
    le.lease_duration
        .saturating_sub(le.renew_deadline)
        .saturating_sub(std::time::Duration::from_millis(500))
        .max(std::time::Duration::from_secs(1))
}

/// How long to wait before restarting controllers that stopped by
/// themselves: 1 s, doubling up to 1 min.
#[derive(Debug, Default)]
pub struct RestartBackoff {
    restarts: u32,
}

/// Controllers that ran this long before stopping were healthy until then.
const HEALTHY_STRETCH: std::time::Duration = std::time::Duration::from_secs(300);

impl RestartBackoff {
    /// Fewer than 3 stops in a row: keep restarting in-process; from the
    /// third, `/healthz` fails so that the kubelet restarts the process.
    pub fn healthy(&self) -> bool {
        self.restarts < 3
    }

    pub fn next_wait(&mut self) -> std::time::Duration {
        let wait = std::time::Duration::from_secs(1u64 << self.restarts.min(6))
            .min(std::time::Duration::from_secs(60));
        self.restarts = self.restarts.saturating_add(1);
        wait
    }
}

/// Runs until SIGTERM/SIGINT (or `shutdown` is cancelled by the caller).
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<()> {
    let settings = Arc::new(settings);
    let metrics = Arc::new(Metrics::default());
    let readiness = Readiness::default();
    let liveness = admin::Liveness::default();

    let listener = admin::bind(settings.admin_address).await?;
    let admin_addr = listener.local_addr().map_err(Error::Admin)?;
    info!(address = %admin_addr, "admin server listening");
    let admin_task = tokio::spawn(admin::serve(
        listener,
        metrics.clone(),
        readiness.clone(),
        liveness.clone(),
        shutdown.clone(),
    ));

    tokio::spawn(crate::heap_trim::trim_periodically(
        crate::heap_trim::TRIM_INTERVAL,
        shutdown.clone(),
    ));

    let leadership = if settings.leader_election.enabled {
        Leadership::elected()
    } else {
        Leadership::always()
    };
    let ctx = build_context(settings.clone(), metrics.clone(), leadership.clone()).await?;
    readiness.set(true);

    // The elector stops (and releases the Lease) only once every controller
    // has stopped: releasing first would let the other replica lead while
    // our last reconciles still mutate.
    let elector_stop = CancellationToken::new();
    let elector_task = settings.leader_election.enabled.then(|| {
        let elector = Elector::new(
            ctx.client.clone(),
            settings.leader_election.clone(),
            settings.identity.clone(),
            leadership.clone(),
        );
        tokio::spawn(elector.run(elector_stop.clone()))
    });

    lead_while_elected(ctx, &leadership, &liveness, &shutdown).await;
    info!("shutting down: every controller has stopped");
    elector_stop.cancel();
    if let Some(t) = elector_task {
        let _ = t.await;
    }
    let _ = admin_task.await;
    Ok(())
}

/// The controllers' Context: Kubernetes clients (after checking our CRDs
/// are installed), the fenced AWS clients, the interruption queue if set.
async fn build_context(
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    leadership: Leadership,
) -> Result<Arc<Context>> {
    let client = kube_client(&settings).await?;
    let eviction_client = kube_client_without_retry(&settings).await?;
    check_crds(&client, &settings).await?;

    if settings.aws.emulator_account.is_some() {
        // Tests against the emulator compress time (only a test build
        // accepts an emulator account).
        crate::crd::nodegroup::lift_duration_minima();
        info!("against the emulator: the least durations of a NodeGroup spec are lifted");
    }
    let sdk = cloud::load_sdk_config(&settings.aws).await;
    if sdk.region().is_none() {
        warn!(
            "no AWS region configured (aws.region, --aws-region or AWS_REGION): AWS calls will fail"
        );
    }
    let cloud = Arc::new(
        AwsCloudProvider::new(sdk.clone(), settings.aws.emulator_account.clone())
            .with_pricing_region(settings.aws.pricing_region.clone())
            .with_fencing(cloud::Fencing {
                leadership: leadership.clone(),
                operation_timeout: aws_operation_timeout(&settings.leader_election),
            })
            .with_metrics(metrics.clone()),
    );
    if settings.dry_run {
        warn!(
            "dry-run: no AWS or Kubernetes object will be mutated; intended mutations are logged"
        );
    }
    let queue = settings.interruption.queue_url.as_deref().map(|url| {
        Arc::new(crate::cloud::sqs::Queue::new(
            &sdk,
            url,
            settings.aws.emulator_account.as_deref(),
            metrics.clone(),
        ))
    });
    if queue.is_none() {
        info!("interruption handler off: no interruption.queueUrl");
    }
    Ok(Arc::new(
        Context::new(
            client,
            eviction_client,
            settings,
            Arc::new(SystemClock),
            metrics,
            leadership,
            cloud,
        )
        .with_interruption_queue(queue),
    ))
}

/// Runs every controller while this replica leads, stops them when it no
/// longer does, and restarts them (after a pause) when they stop by
/// themselves; returns once `shutdown` fires and they have stopped.
async fn lead_while_elected(
    ctx: Arc<Context>,
    leadership: &Leadership,
    liveness: &admin::Liveness,
    shutdown: &CancellationToken,
) {
    let metrics = ctx.metrics.clone();
    let identity = ctx.settings.identity.clone();
    let mut leading = leadership.subscribe();
    let mut restarts = RestartBackoff::default();
    while !shutdown.is_cancelled() {
        // Wait to lead.
        if !*leading.borrow_and_update() {
            info!(identity = %identity, "waiting for leadership");
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = leading.changed() => if changed.is_err() { break } else { continue },
            }
        }
        metrics.leader.set(1);
        info!(identity = %identity, "leading: starting controllers");
        let controllers = shutdown.child_token();
        let term_started = std::time::Instant::now();
        let mut task = tokio::spawn(crate::controllers::run_all(
            ctx.clone(),
            controllers.clone(),
        ));
        // Lead until shutdown or until leadership is lost.
        let mut crashed = false;
        loop {
            // Biased, and checked again: a shutdown ends the controllers at
            // once (their token is its child), and that is not a crash.
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow_and_update() { break }
                }
                _ = &mut task => { crashed = !shutdown.is_cancelled(); break }
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
        // Once they are stopped: none writes a group's series again.
        metrics.groups_unled();
        if crashed {
            // A crash after a long healthy stretch starts the count afresh.
            if term_started.elapsed() >= HEALTHY_STRETCH {
                restarts = RestartBackoff::default();
            }
            // Not at once: a controller that cannot start (an apiserver
            // refusing its watch) would otherwise relist every Node in a loop.
            let wait = restarts.next_wait();
            liveness.set_failing(!restarts.healthy());
            metrics.controller_restarts.inc();
            error!(retry_in = ?wait, "controllers stopped unexpectedly; restarting them after a pause");
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        } else {
            restarts = RestartBackoff::default();
            liveness.set_failing(false);
        }
    }
}

#[cfg(test)]
mod restart_tests {
    use super::RestartBackoff;
    use std::time::Duration;

    #[test]
    fn restarts_back_off_from_a_second_to_a_minute() {
        let mut b = RestartBackoff::default();
        let waits: Vec<u64> = (0..9).map(|_| b.next_wait().as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        let mut b = RestartBackoff::default();
        assert!(b.healthy());
        b.next_wait();
        b.next_wait();
        assert!(b.healthy(), "two stops in a row");
        b.next_wait();
        assert!(!b.healthy(), "the third: liveness fails");
        let mut b = RestartBackoff { restarts: u32::MAX };
        assert_eq!(b.next_wait(), Duration::from_secs(60), "never overflows");
    }

    #[test]
    fn an_aws_operation_ends_before_another_replica_can_lead() {
        let le = |lease: u64, renew: u64| crate::config::LeaderElectionSettings {
            enabled: true,
            lease_name: "l".into(),
            lease_namespace: "ns".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(2),
        };
        assert_eq!(
            super::aws_operation_timeout(&le(15, 10)),
            Duration::from_millis(4500)
        );
        assert!(super::aws_operation_timeout(&le(60, 40)) < Duration::from_secs(20));
        assert_eq!(
            super::aws_operation_timeout(&le(10, 10)),
            Duration::from_secs(1),
            "a floor, whatever the settings"
        );
    }
}
