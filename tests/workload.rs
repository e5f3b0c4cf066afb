//! A user's workload through our disruptions, on the whole local cluster:
//! kube-controller-manager (Deployment/ReplicaSet, disruption controller)
//! and kube-scheduler place and recreate the pods, the simulated kubelet runs
//! them, and a PodDisruptionBudget computed by the real controller guards
//! them. What is measured is what a user cares about: Ready pods.

use snm_testkit as support;

use support::assert_eventually;
use support::refresh::*;
use support::workload::{deploy_web, ready_web_pods, sample_web};

const REPLICAS: usize = 6;

#[tokio::test]
async fn a_refresh_keeps_the_workload_within_its_budget_and_moves_every_pod() {
    let SteadyGroup {
        world,
        kops,
        manager,
        config: _config,
        sim: _sim,
        ..
    } = three_workers("wl-refresh").await;
    let original = all_instances(&world, &kops.asgs).await;
    let original_nodes = node_names(&world, &original).await;
    deploy_web(&world, REPLICAS as i32, 1).await;
    let before = assert_eventually("6 Ready pods spread over the nodes", WAIT, || async {
        let ready = ready_web_pods(&world).await;
        (ready.len() == REPLICAS).then_some(ready)
    })
    .await;
    // The budget is computed by the disruption controller before the run.
    let sampler = sample_web(&world);

    schedule_refresh(&world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let rf = run_finished(&world, "workers").await;
    let status = assert_run_succeeded(rf, &manager);
    assert_eq!(status.last_run.map(|l| l.replaced), Some(3));
    // Every evicted pod is back, Ready, on a new node.
    let after = assert_eventually("6 Ready pods on the new nodes", WAIT, || async {
        let ready = ready_web_pods(&world).await;
        (ready.len() == REPLICAS && ready.iter().all(|(_, n)| !original_nodes.contains(n)))
            .then_some(ready)
    })
    .await;
    let samples = sampler.stop();
    println!(
        "FIGURES workload: min Ready pods {:?} of {REPLICAS} (budget floor {}), {} samples",
        samples.min_ready,
        REPLICAS - 1,
        samples.count
    );
    assert!(samples.count > 20, "too few samples: {samples:?}");
    assert!(
        samples.min_ready >= Some(REPLICAS - 1),
        "Ready pods fell below the budget's floor: {samples:?}"
    );
    let moved: Vec<&String> = before.iter().map(|(pod, _)| pod).collect();
    assert!(
        moved.iter().all(|p| !after.iter().any(|(q, _)| q == *p)),
        "every original pod was evicted and recreated: before {before:?}, after {after:?}"
    );
    world.cleanup().await;
}
