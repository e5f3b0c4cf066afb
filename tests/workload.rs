//! A user's workload through our disruptions, on the whole local cluster:
//! kube-controller-manager (Deployment/ReplicaSet, disruption controller)
//! and kube-scheduler place and recreate the pods, the simulated kubelet runs
//! them (and a DaemonSet's, on every node), and a PodDisruptionBudget
//! computed by the real controller guards them. What is measured is what a user cares about: Ready pods.

use snm_testkit as support;

use std::collections::BTreeSet;
use support::assert_eventually;
use support::refresh::*;
use support::workload::{
    deploy_agent, deploy_web, nodes_with_ready_agent, ready_web_pods, sample_web,
};

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
    // A node agent on every node, from the real DaemonSet controller.
    deploy_agent(&world).await;
    let original_set: BTreeSet<String> = original_nodes.iter().cloned().collect();
    assert_eventually("an agent on each node", WAIT, || async {
        (nodes_with_ready_agent(&world).await == original_set).then_some(())
    })
    .await;
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
    // Drains left the agents alone (a drain that waited on them would have
    // timed out and failed the run), and the new nodes have theirs.
    let new_nodes: BTreeSet<String> = after.iter().map(|(_, n)| n.clone()).collect();
    assert_eventually("an agent on each new node", WAIT, || async {
        let agents = nodes_with_ready_agent(&world).await;
        new_nodes.is_subset(&agents).then_some(())
    })
    .await;
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
