//! The operation lock and the drain against the real apiserver.

use snm_testkit as support;

use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use spot_node_manager::crd::nodegroup::OperationKind;
use spot_node_manager::crd::{NodeGroup, Refresher, Replenisher};
use spot_node_manager::k8s::drain::drain_step;
use spot_node_manager::k8s::lock::{self, Acquired, Holder};
use support::World;

fn group() -> NodeGroup {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": "workers"},
        "spec": {"role": "Worker", "autoScalingGroups": [{"name": "nodes-a"}], "desired": 1}
    }))
    .expect("group")
}

async fn create_holders(world: &World) {
    let rf: Refresher = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "Refresher", "metadata": {"name": "workers"},
        "spec": {"nodeGroup": "workers", "role": "Worker", "schedule": "0 3 * * *", "timeZone": "UTC",
                 "surplusNodes": 1, "drainTimeout": "5m", "drainTimeoutAction": "Abort", "readyTimeout": "15m"}
    }))
    .expect("refresher");
    world
        .api::<Refresher>()
        .create(&PostParams::default(), &rf)
        .await
        .expect("create refresher");
    let rp: Replenisher = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "Replenisher", "metadata": {"name": "workers"},
        "spec": {"nodeGroup": "workers", "role": "Worker", "desired": 1, "cooldown": "5m", "joinTimeout": "15m"}
    }))
    .expect("replenisher");
    world
        .api::<Replenisher>()
        .create(&PostParams::default(), &rp)
        .await
        .expect("create replenisher");
}

#[tokio::test]
async fn two_racing_holders_exactly_one_wins_the_lock() {
    let world = World::new("lock").await;
    let ctx = world.context(false).await;
    create_holders(&world).await;
    let groups: Api<NodeGroup> = world.api();
    world.create_group(&group()).await;
    let seen = groups.get("workers").await.expect("get");
    let refresh = Holder {
        kind: OperationKind::Refresh,
        name: "workers".into(),
    };
    let replenish = Holder {
        kind: OperationKind::Replenish,
        name: "workers".into(),
    };
    let now = chrono::Utc::now();
    // Both decide from the same observed version; the apiserver picks one.
    let (a, b) = tokio::join!(
        lock::acquire(&ctx, &seen, &refresh, now),
        lock::acquire(&ctx, &seen, &replenish, now)
    );
    let outcomes = [a.expect("acquire a"), b.expect("acquire b")];
    assert_eq!(
        outcomes.iter().filter(|o| **o == Acquired::Yes).count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == Acquired::Conflict)
            .count(),
        1,
        "{outcomes:?}"
    );
    let (winner, loser) = if outcomes[0] == Acquired::Yes {
        (&refresh, &replenish)
    } else {
        (&replenish, &refresh)
    };

    let fresh = groups.get("workers").await.expect("get");
    let held = fresh
        .status
        .as_ref()
        .and_then(|s| s.operation.clone())
        .expect("lock recorded");
    assert_eq!(
        (held.holder, held.holder_name.as_str()),
        (winner.kind, "workers")
    );
    // The loser, retrying on fresh data, sees who holds it.
    assert_eq!(
        lock::acquire(&ctx, &fresh, loser, now)
            .await
            .expect("retry"),
        Acquired::No(held.clone())
    );
    // The winner, e.g. after a restart, still holds it.
    assert_eq!(
        lock::acquire(&ctx, &fresh, winner, now)
            .await
            .expect("resume"),
        Acquired::Yes
    );
    // Released, the loser can take it.
    assert!(lock::release(&ctx, &fresh, winner).await.expect("release"));
    let fresh = groups.get("workers").await.expect("get");
    assert!(
        fresh
            .status
            .as_ref()
            .and_then(|s| s.operation.as_ref())
            .is_none()
    );
    assert_eq!(
        lock::acquire(&ctx, &fresh, loser, now).await.expect("take"),
        Acquired::Yes
    );
}

#[tokio::test]
async fn a_lock_held_by_a_deleted_holder_is_taken_over() {
    let world = World::new("lock-orphan").await;
    let ctx = world.context(false).await;
    let groups: Api<NodeGroup> = world.api();
    world.create_group(&group()).await;
    let ghost = Holder {
        kind: OperationKind::Refresh,
        name: "deleted-refresher".into(),
    };
    let seen = groups.get("workers").await.expect("get");
    assert_eq!(
        lock::acquire(&ctx, &seen, &ghost, chrono::Utc::now())
            .await
            .expect("take"),
        Acquired::Yes
    );
    // No Refresher by that name exists: the replenisher may take over.
    let me = Holder {
        kind: OperationKind::Replenish,
        name: "workers".into(),
    };
    let seen = groups.get("workers").await.expect("get");
    assert_eq!(
        lock::acquire(&ctx, &seen, &me, chrono::Utc::now())
            .await
            .expect("take over"),
        Acquired::Yes
    );
}

/// A bare Node (no kubelet behind it) for pods to be bound to.
async fn create_node(nodes: &Api<Node>, name: &str) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: None,
    };
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("node");
}

/// Waits until the apiserver's watch cache (what a drain step lists) shows
/// the pods as `done` says.
async fn cache_shows(pods: &Api<Pod>, what: &str, done: impl Fn(&[Pod]) -> bool) {
    support::assert_eventually(what, std::time::Duration::from_secs(30), || async {
        let listed = pods.list(&ListParams::default().match_any()).await.ok()?;
        done(&listed.items).then_some(())
    })
    .await;
}

#[tokio::test]
async fn drain_evicts_respects_budgets_and_skips_daemonset_and_mirror_pods() {
    let world = World::new("drain").await;
    let ctx = world.context(false).await;
    let node_name = format!("{}-drain-node", world.prefix());
    let nodes: Api<Node> = Api::all(world.client.clone());
    create_node(&nodes, &node_name).await;
    let pods: Api<Pod> = world.api();
    pods.create(
        &PostParams::default(),
        &support::bound_pod("web", &node_name, &[("app", "web")]),
    )
    .await
    .expect("pod");
    pods.create(
        &PostParams::default(),
        &support::bound_pod("db", &node_name, &[("app", "protected")]),
    )
    .await
    .expect("pod");
    // The apiserver ignores budgets for Pending pods: make it Running and Ready,
    // as its kubelet would.
    let running = serde_json::json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("db", &PatchParams::default(), &Patch::Merge(&running))
        .await
        .expect("pod running");
    let mut ds = support::bound_pod("logs", &node_name, &[]);
    ds.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "DaemonSet".into(),
        name: "logs".into(),
        uid: "00000000-0000-0000-0000-000000000001".into(),
        ..Default::default()
    }]);
    pods.create(&PostParams::default(), &ds)
        .await
        .expect("ds pod");
    let mut mirror = support::bound_pod("static", &node_name, &[]);
    mirror.metadata.annotations = Some(
        [(
            "kubernetes.io/config.mirror".to_string(),
            "hash".to_string(),
        )]
        .into(),
    );
    pods.create(&PostParams::default(), &mirror)
        .await
        .expect("mirror pod");
    let pdb: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "protected"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "protected"}}}
    }))
    .expect("pdb");
    support::pdb_api(&world)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("create pdb");
    support::assert_pdb_allows(&world, 0).await;

    let ns = &world.namespace;
    // A step reads the pods from the apiserver's watch cache, as a drain
    // polling many nodes must: each step here waits for it to have caught
    // up with the writes before, as a drain's next poll would.
    cache_shows(&pods, "the four pods", |p| p.len() == 4).await;
    let first = drain_step(&ctx, &node_name).await.expect("drain step");
    assert_eq!(first.evicted, vec![format!("{ns}/web")]);
    assert_eq!(
        first.blocked,
        vec![format!("{ns}/db")],
        "the budget allows no disruption"
    );
    assert!(!first.done());
    let node = nodes.get(&node_name).await.expect("node");
    assert_eq!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "cordoned"
    );

    // Blocked again on the next step; the evicted pod is now waited for.
    cache_shows(&pods, "web terminating", |p| {
        p.iter()
            .any(|p| p.name_any() == "web" && p.metadata.deletion_timestamp.is_some())
    })
    .await;
    let second = drain_step(&ctx, &node_name).await.expect("drain step");
    assert_eq!(second.blocked, vec![format!("{ns}/db")]);
    assert_eq!(
        second.waiting,
        vec![format!("{ns}/web")],
        "terminating pods are not evicted again"
    );
    assert!(
        ctx.metrics
            .encode()
            .contains(r#"spot_node_manager_drains_total{outcome="blocked_by_pdb"} 2"#)
    );

    // The budget allows one disruption: the protected pod goes too.
    support::set_min_available(&world, 0).await;
    support::assert_pdb_allows(&world, 1).await;
    let third = drain_step(&ctx, &node_name).await.expect("drain step");
    assert_eq!(third.evicted, vec![format!("{ns}/db")]);

    // Standing in for the kubelet, finish the terminating pods: the drain is done
    // while the DaemonSet and mirror pods stay.
    for name in ["web", "db"] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .expect("finish pod");
    }
    cache_shows(&pods, "web and db gone", |p| p.len() == 2).await;
    let last = drain_step(&ctx, &node_name).await.expect("drain step");
    assert!(last.done(), "{last:?}");
    assert!(pods.get_opt("logs").await.expect("get").is_some());
    assert!(pods.get_opt("static").await.expect("get").is_some());
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
}

#[tokio::test]
async fn a_dry_run_drain_neither_cordons_nor_evicts() {
    let world = World::new("drain-dry").await;
    let ctx = world.context(true).await;
    let node_name = format!("{}-dry-node", world.prefix());
    let nodes: Api<Node> = Api::all(world.client.clone());
    create_node(&nodes, &node_name).await;
    let pods: Api<Pod> = world.api();
    pods.create(
        &PostParams::default(),
        &support::bound_pod("web", &node_name, &[]),
    )
    .await
    .expect("pod");
    let progress = drain_step(&ctx, &node_name).await.expect("drain step");
    assert_eq!(progress.dry_run, vec![format!("{}/web", world.namespace)]);
    let node = nodes.get(&node_name).await.expect("node");
    assert_ne!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "not cordoned in dry-run"
    );
    let web = pods.get("web").await.expect("pod still there");
    assert!(
        web.metadata.deletion_timestamp.is_none(),
        "not evicted in dry-run"
    );
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
}

#[tokio::test]
async fn a_node_that_is_gone_has_nothing_left_to_drain() {
    let world = World::new("drain-gone").await;
    let ctx = world.context(false).await;
    let progress = drain_step(&ctx, &format!("{}-never-existed", world.prefix()))
        .await
        .expect("drain step");
    assert!(progress.done(), "{progress:?}");
}

/// The grace cap of an interrupted node's drain reaches the apiserver: a
/// pod whose own grace period is longer is evicted with the cap, one whose
/// own is shorter keeps its own, and an uncapped drain leaves each its own.
/// (kube's `Api::evict` sent the cap under a key the apiserver drops.)
#[tokio::test]
async fn an_eviction_carries_the_grace_cap_to_the_apiserver() {
    use spot_node_manager::k8s::drain::drain_step_within;
    let world = World::new("drain-grace").await;
    let ctx = world.context(false).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let pods: Api<Pod> = world.api();
    let pod_with_grace = |name: &str, node: &str, grace: i64| {
        let mut pod = support::bound_pod(name, node, &[]);
        if let Some(spec) = pod.spec.as_mut() {
            spec.termination_grace_period_seconds = Some(grace);
        }
        pod
    };
    let capped = format!("{}-capped-node", world.prefix());
    let uncapped = format!("{}-uncapped-node", world.prefix());
    for node in [&capped, &uncapped] {
        create_node(&nodes, node).await;
    }
    for (name, node, grace) in [
        ("long", &capped, 300),
        ("short", &capped, 10),
        ("own", &uncapped, 300),
    ] {
        pods.create(&PostParams::default(), &pod_with_grace(name, node, grace))
            .await
            .expect("pod");
    }
    let ns = &world.namespace;
    let step = drain_step_within(&ctx, &capped, Some(20))
        .await
        .expect("drain step");
    assert_eq!(step.evicted.len(), 2, "{step:?}");
    let step = drain_step_within(&ctx, &uncapped, None)
        .await
        .expect("drain step");
    assert_eq!(step.evicted, vec![format!("{ns}/own")]);
    for (name, grace) in [("long", 20), ("short", 10), ("own", 300)] {
        let pod = pods.get(name).await.expect("pod terminating");
        assert!(pod.metadata.deletion_timestamp.is_some(), "{name} evicted");
        assert_eq!(
            pod.metadata.deletion_grace_period_seconds,
            Some(grace),
            "{name}'s grace period"
        );
    }
    for name in ["long", "short", "own"] {
        let _ = pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
    }
    for node in [&capped, &uncapped] {
        let _ = nodes.delete(node, &DeleteParams::default()).await;
    }
}
