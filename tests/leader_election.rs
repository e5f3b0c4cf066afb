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
    config_with(world, lease, "4s", "3s", "")
}

/// Leader election on, with this lease's timing and more of the file.
fn config_with(
    world: &World,
    lease: &str,
    duration: &str,
    renew_deadline: &str,
    more: &str,
) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        file.path(),
        format!(
            "{more}leaderElection:\n  enabled: true\n  leaseName: {lease}\n  leaseNamespace: {ns}\n  leaseDuration: {duration}\n  renewDeadline: {renew_deadline}\n  retryPeriod: 500ms\n",
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
    let _groups: Api<NodeGroup> = world.api();
    let group: NodeGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": "workers"},
        "spec": {"role": "Worker", "autoScalingGroups": [{"name": "nodes-a"}], "desired": 1}
    }))
    .expect("group");
    world.create_group(&group).await;

    let config = config_file(&world, "snm-leader");
    let a = start(&world, &config, "replica-a");
    let b = start(&world, &config, "replica-b");
    let leases: Api<Lease> = world.api();

    let (a_leads, b_leads) = assert_eventually("one leader", Duration::from_secs(30), || async {
        let (x, y) = leaders(&a, &b).await?;
        (x ^ y).then_some((x, y))
    })
    .await;
    // Sample for a while: never two leaders, and the Lease agrees. A
    // sample whose metrics cannot be read says nothing: most must be read,
    // or the check checked nothing.
    let every = Duration::from_millis(200);
    support::sample_checked("both replicas' metrics", 15, 10, every, || async {
        let (x, y) = leaders(&a, &b).await?;
        assert!(!(x && y), "two leaders at once");
        Some(())
    })
    .await;
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
    assert!(!logs.contains("stopped unexpectedly"), "{logs}");
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
}

#[tokio::test]
async fn a_leader_cut_off_from_the_apiserver_makes_no_aws_call_after_its_renew_deadline() {
    use support::proxy::{CuttableProxy, apiserver_address, kubeconfig_through};
    let world = World::new("leader-cut").await;
    let kops = world.kops_group("nodes", &support::ZONES, 1, &[]).await;
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&support::refresh::group("workers", "Worker", &kops.asgs, 3))
        .await;
    // Renew deadline 2 s, lease 6 s: each AWS operation is bounded by
    // 6 - 2 - 0.5 = 3.5 s, room for several failed attempts, so a call that
    // began as leader just before the deadline could go on retrying well
    // after it, but for the fence. (The manager's calls die out a few
    // seconds after the cut, as its reconciles fail on the apiserver: a
    // longer deadline would prove nothing.)
    let config = config_with(&world, "snm-cut", "6s", "2s", "resyncInterval: 1s\n");
    // The manager reaches the apiserver through a proxy the test can cut;
    // the test's own client goes direct.
    let proxy = CuttableProxy::start(apiserver_address(world.kubeconfig())).await;
    let kubeconfig = kubeconfig_through(world.kubeconfig(), proxy.port);
    let path = config.path().to_str().expect("utf-8");
    let manager = ManagerProcess::start_through(
        &world,
        kubeconfig.path(),
        &["--config", path, "--identity", "cut-off"],
        &[],
    );
    assert_eventually(
        "leading, the group synced",
        Duration::from_secs(60),
        || async {
            let synced = groups
                .get("workers")
                .await
                .ok()?
                .status?
                .observed_generation
                .is_some();
            (synced && manager.is_leader().await? && !world.aws_request_times().await.is_empty())
                .then_some(())
        },
    )
    .await;
    // AWS fails every call after 300 ms (503): the SDK retries at its usual
    // pace, so once the shared description has expired (5 s), the manager's
    // calls are in flight, between attempts, most of the time.
    world
        .refuse_aws("ServiceUnavailable", Duration::from_millis(300))
        .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    // The cut comes just after a call's first attempt arrives: that call is
    // then in flight with retries to come (the SDK's standard mode makes 3
    // attempts, 0-1 s then 0-2 s apart, well within the 3.5 s bound), the
    // next one close to the deadline, so the fence has something to stop.
    let seen_before = world.aws_attempts().await.len();
    assert_eventually(
        "a call's first attempt, while AWS refuses",
        Duration::from_secs(30),
        || async {
            let attempts = world.aws_attempts().await;
            attempts[seen_before.min(attempts.len())..]
                .iter()
                .any(|(_, attempt, max)| *attempt == 1 && *max > 1)
                .then_some(())
        },
    )
    .await;
    let refused_from = world.aws_request_times().await.len();
    let cut_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    proxy.cut();
    // Past the renew deadline, the controllers' shutdown grace (5 s) and
    // any operation's bound.
    tokio::time::sleep(Duration::from_secs(12)).await;

    let leases: Api<Lease> = world.api();
    let renewed = leases
        .get("snm-cut")
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.renew_time)
        .expect("renewed")
        .0
        .as_millisecond() as f64
        / 1000.0;
    let deadline = renewed + 2.0;
    let times = world.aws_request_times().await;
    let seen = format!(
        "requests, seconds from the cut: {:?}; the deadline at {:.2}",
        times
            .iter()
            .map(|t| format!("{:.2}", t - cut_at))
            .collect::<Vec<_>>(),
        deadline - cut_at
    );
    // The call in flight went on: an attempt before the deadline, or one the
    // fence refused after it (the error names it).
    let fenced = manager
        .logs()
        .contains(spot_node_manager::cloud::leader_fence::NOT_LEADING);
    eprintln!(
        "after the cut: {} attempt(s) reached AWS, the fence refused one: {fenced}; {seen}",
        times.len() - refused_from
    );
    assert!(
        times.len() > refused_from || fenced,
        "no call was being retried at the cut: the test proves nothing; {seen}"
    );
    let late: Vec<f64> = times
        .iter()
        .map(|t| t - deadline)
        .filter(|after| *after > 0.5)
        .collect();
    assert!(
        late.is_empty(),
        "AWS requests after the renew deadline (seconds after it): {late:?}; {seen}\n{}",
        manager.logs()
    );
    assert_eq!(
        manager.is_leader().await,
        Some(false),
        "it knows it lost the lease"
    );
    drop(proxy);
}

/// Issue 55 item 7: a refresh drains the node the leader's own pod runs
/// on. Every other pod goes first; then the leader hands the lease to the
/// standby (Ready on another node) instead of being evicted while leading,
/// and the standby, leading at once, evicts the old leader's pod and
/// finishes the run. The lease is long (30 s): a takeover by expiry could
/// not come within the bound below.
#[tokio::test]
async fn a_drain_of_the_leaders_node_takes_its_pod_last_and_hands_leadership_over_first() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::watcher;
    let world = World::new("own-node").await;
    let kops = world
        .kops_group("nodes", &support::ZONES[..1], 2, &[])
        .await;
    let _sim = world.start_sim(Duration::from_millis(200), Duration::from_millis(200));
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&support::refresh::group("workers", "Worker", &kops.asgs, 2))
        .await;
    let config = config_with(&world, "snm-own", "30s", "20s", "resyncInterval: 2s\n");
    let path = config.path().to_str().expect("utf-8");
    let ns = world.namespace.clone();
    let replica = |pod: &str| {
        ManagerProcess::start_env(
            &world,
            &["--config", path, "--identity", pod],
            &[("POD_NAME", pod), ("POD_NAMESPACE", ns.as_str())],
        )
    };
    let a = replica("mgr-a");
    assert_eventually("a leads, 2 Ready", support::refresh::WAIT, || async {
        let ready = support::refresh::ready_count(&groups, "workers").await?;
        (a.is_leader().await? && ready == 2).then_some(())
    })
    .await;
    let b = replica("mgr-b");
    assert_eventually("b answers as follower", Duration::from_secs(30), || async {
        (!b.is_leader().await?).then_some(())
    })
    .await;
    // The oldest node goes first: the leader's pod runs there, with two
    // workload pods whose names sort after it (the order a drain lists
    // them in), the standby's pod on the other node.
    let nodes = support::refresh::nodes_oldest_first(&groups, "workers").await;
    let (first, second) = (nodes[0].clone(), nodes[1].clone());
    // Each pod with a controller, as a Deployment's are (one without is
    // protected, never evicted).
    let labels = [("app.kubernetes.io/name", "snm-own")];
    let pods: Api<Pod> = world.api();
    let owner = support::refresh::app_owner(&world).await;
    for (name, node) in [("mgr-a", &first), ("mgr-b", &second)] {
        let mut pod = support::bound_pod(name, node, &labels);
        pod.metadata.owner_references = Some(vec![owner.clone()]);
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create a replica's pod");
    }
    for name in ["web-0", "web-1"] {
        let mut pod = support::bound_pod(name, &first, &[("app", "web")]);
        pod.metadata.owner_references = Some(vec![owner.clone()]);
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }
    assert_eventually(
        "the standby's pod Ready",
        Duration::from_secs(30),
        || async {
            let pod = pods.get("mgr-b").await.ok()?;
            let ready = pod
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(())
        },
    )
    .await;
    // The order the first node's pods are deleted in, as the apiserver
    // tells it.
    let on_first = watcher::Config::default().fields(&format!("spec.nodeName={first}"));
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = order.clone();
    let watch = tokio::spawn(watcher(pods.clone(), on_first).for_each(move |e| {
        let seen = seen.clone();
        async move {
            let gone = |p: &Pod| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    p.metadata.deletion_timestamp.is_some(),
                )
            };
            let name = match e {
                Ok(watcher::Event::Apply(p)) => Some(gone(&p)).filter(|(_, d)| *d).map(|(n, _)| n),
                Ok(watcher::Event::Delete(p)) => Some(gone(&p).0),
                _ => None,
            };
            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = name.filter(|n| !seen.contains(n)) {
                seen.push(n);
            }
        }
    }));

    support::refresh::schedule_refresh(&world, "workers", serde_json::json!({})).await;
    assert_eventually("a hands leadership over", support::refresh::RUN, || async {
        (!a.is_leader().await?).then_some(())
    })
    .await;
    // Well within the 30 s lease: handed over, not expired.
    let leases: Api<Lease> = world.api();
    assert_eventually("b leads at once", Duration::from_secs(10), || async {
        (b.is_leader().await? && holder(&leases, "snm-own").await.as_deref() == Some("mgr-b"))
            .then_some(())
    })
    .await;
    let rf = support::refresh::run_finished(&world, "workers").await;
    support::refresh::assert_run_succeeded(rf, &b);
    watch.abort();
    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut moved = order.clone();
    moved.sort();
    assert_eq!(
        (moved, order.last().map(String::as_str)),
        (
            ["mgr-a", "web-0", "web-1"].map(String::from).to_vec(),
            Some("mgr-a")
        ),
        "every pod moved, the leader's last: {order:?}\na: {}\nb: {}",
        a.logs(),
        b.logs()
    );
    let (a_logs, b_logs) = (a.logs(), b.logs());
    assert!(
        a_logs.contains("handed the lease over to a standby"),
        "{a_logs}"
    );
    assert!(
        !a_logs.contains(&format!("pod/{ns}/mgr-a")),
        "a never evicted its own pod:\n{a_logs}"
    );
    assert!(
        b_logs.contains(&format!("pod/{ns}/mgr-a")),
        "b evicted it:\n{b_logs}"
    );
}
