//! Two manager processes against the real apiserver: exactly one leads, only
//! the leader's controllers act, and stopping it hands leadership over.

use snm_testkit as support;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use spot_node_manager::crd::NodeGroup;
use std::time::Duration;
use support::{ManagerProcess, World, assert_eventually};

const LEASE_DURATION: Duration = Duration::from_secs(4);

fn config_file(world: &World, lease: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        file.path(),
        format!(
            "leaderElection:\n  enabled: true\n  leaseName: {lease}\n  leaseNamespace: {ns}\n  leaseDuration: 4s\n  renewDeadline: 3s\n  retryPeriod: 500ms\n",
            ns = world.namespace
        ),
    )
    .expect("write config");
    file
}

fn start(world: &World, config: &tempfile::NamedTempFile, identity: &str) -> ManagerProcess {
    let path = config.path().to_str().expect("utf-8");
    ManagerProcess::start(world, &["--config", path, "--identity", identity])
}

/// (a leads, b leads) as each process reports it; None while either is not answering.
async fn leaders(a: &ManagerProcess, b: &ManagerProcess) -> Option<(bool, bool)> {
    Some((a.is_leader().await?, b.is_leader().await?))
}

async fn holder(api: &Api<Lease>, name: &str) -> Option<String> {
    api.get(name).await.ok()?.spec?.holder_identity
}

#[tokio::test]
async fn exactly_one_of_two_replicas_leads_and_sigterm_hands_over() {
    let world = World::new("leader").await;
    let groups: Api<NodeGroup> = world.api();
    let group: NodeGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": "workers"},
        "spec": {"role": "Worker", "autoScalingGroups": [{"name": "nodes-a"}], "desired": 1}
    }))
    .expect("group");
    groups
        .create(&PostParams::default(), &group)
        .await
        .expect("create group");

    let config = config_file(&world, "snm-leader");
    let a = start(&world, &config, "replica-a");
    let b = start(&world, &config, "replica-b");
    let leases: Api<Lease> = world.api();

    let (a_leads, b_leads) = assert_eventually("one leader", Duration::from_secs(30), || async {
        let (x, y) = leaders(&a, &b).await?;
        (x ^ y).then_some((x, y))
    })
    .await;
    // Sample for a while: never two leaders, and the Lease agrees.
    for _ in 0..15 {
        if let Some((x, y)) = leaders(&a, &b).await {
            assert!(!(x && y), "two leaders at once");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (leader, follower, leader_id, follower_id) = if a_leads {
        (a, b, "replica-a", "replica-b")
    } else {
        assert!(b_leads);
        (b, a, "replica-b", "replica-a")
    };
    assert_eq!(
        holder(&leases, "snm-leader").await.as_deref(),
        Some(leader_id)
    );

    // Only the leader's controllers reconcile.
    assert_eventually(
        "leader reconciled the group",
        Duration::from_secs(30),
        || async { (support::reconciles(&leader.metrics().await?, "inventory") > 0).then_some(()) },
    )
    .await;
    let follower_metrics = follower.metrics().await.expect("follower metrics");
    assert_eq!(
        support::reconciles(&follower_metrics, "inventory"),
        0,
        "a follower must not reconcile:\n{follower_metrics}"
    );

    // SIGTERM the leader: it releases the lease; the follower takes over well
    // within one lease duration (bounded here by the protocol, not a benchmark).
    let mut leader = leader;
    let status = leader.terminate();
    assert!(status.success(), "{}", leader.logs());
    let logs = leader.logs();
    let released = logs.find("released the lease").expect("released the lease");
    // Released only once every controller has stopped: until then the
    // other replica must not lead (our last reconciles could still mutate).
    let started = logs.matches("controller started").count();
    let stopped_before = logs[..released].matches("controller stopped").count();
    assert!(started >= 3, "{logs}");
    assert_eq!(
        stopped_before, started,
        "the lease was released before every controller stopped:\n{logs}"
    );
    assert_eventually(
        "follower takes over",
        LEASE_DURATION + Duration::from_secs(2),
        || async {
            (follower.is_leader().await?
                && holder(&leases, "snm-leader").await.as_deref() == Some(follower_id))
            .then_some(())
        },
    )
    .await;
    world.cleanup().await;
}

#[tokio::test]
async fn a_killed_leader_is_replaced_after_its_lease_expires() {
    let world = World::new("leaderkill").await;
    let config = config_file(&world, "snm-leader-kill");
    let mut a = start(&world, &config, "kill-a");
    assert_eventually("a leads", Duration::from_secs(30), || async {
        a.is_leader().await?.then_some(())
    })
    .await;
    let b = start(&world, &config, "kill-b");
    assert_eventually("b answers as follower", Duration::from_secs(30), || async {
        (!b.is_leader().await?).then_some(())
    })
    .await;
    // No graceful release: b must wait for the lease to expire, then take it.
    a.kill();
    let leases: Api<Lease> = world.api();
    assert_eventually("b takes over", LEASE_DURATION * 3, || async {
        (b.is_leader().await?
            && holder(&leases, "snm-leader-kill").await.as_deref() == Some("kill-b"))
        .then_some(())
    })
    .await;
    world.cleanup().await;
}
