//! A user's workload through our disruptions, on the whole local cluster:
//! kube-controller-manager (Deployment/ReplicaSet, disruption controller)
//! and kube-scheduler place and recreate the pods, the simulated kubelet runs
//! them (and a DaemonSet's, on every node), and a PodDisruptionBudget
//! computed by the real controller guards them. What is measured is what a user cares about: Ready pods.

use snm_testkit as support;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use spot_node_manager::crd::refresher::{RefreshPhase, RunResult};
use spot_node_manager::crd::replenisher::ReplenishPhase;
use spot_node_manager::crd::{NodeGroup, Refresher, Replenisher};
use std::collections::BTreeSet;
use support::refresh::*;
use support::steady::*;
use support::workload::{
    assert_web_ready, deploy_agent, deploy_web, nodes_with_ready_agent, ready_web_pods, sample_web,
};
use support::{World, ZONES, assert_eventually};

const REPLICAS: usize = 6;

#[tokio::test]
async fn a_refresh_keeps_the_workload_within_its_budget_and_moves_every_pod() {
    let g = three_workers("wl-refresh").await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let original = all_instances(world, &kops.asgs).await;
    let original_nodes = node_names(world, &original).await;
    deploy_web(world, REPLICAS as i32, 1).await;
    // A node agent on every node, from the real DaemonSet controller.
    deploy_agent(world).await;
    let original_set: BTreeSet<String> = original_nodes.iter().cloned().collect();
    assert_eventually("an agent on each node", WAIT, || async {
        (nodes_with_ready_agent(world).await == original_set).then_some(())
    })
    .await;
    let before = assert_eventually("6 Ready pods spread over the nodes", WAIT, || async {
        let ready = ready_web_pods(world).await;
        (ready.len() == REPLICAS).then_some(ready)
    })
    .await;
    // The budget is computed by the disruption controller before the run.
    let sampler = sample_web(world).await;

    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.map(|l| l.replaced), Some(3));
    // Every evicted pod is back, Ready, on a new node.
    let after = assert_eventually("6 Ready pods on the new nodes", WAIT, || async {
        let ready = ready_web_pods(world).await;
        (ready.len() == REPLICAS && ready.iter().all(|(_, n)| !original_nodes.contains(n)))
            .then_some(ready)
    })
    .await;
    let samples = sampler.stop().await;
    // Drains left the agents alone (a drain that waited on them would have
    // timed out and failed the run), and the new nodes have theirs.
    let new_nodes: BTreeSet<String> = after.iter().map(|(_, n)| n.clone()).collect();
    assert_eventually("an agent on each new node", WAIT, || async {
        let agents = nodes_with_ready_agent(world).await;
        new_nodes.is_subset(&agents).then_some(())
    })
    .await;
    println!(
        "FIGURES workload: min Ready pods {} of {REPLICAS} (budget floor {}), {} samples",
        samples.min_ready(),
        REPLICAS - 1,
        samples.count()
    );
    assert!(
        samples.min_ready() >= REPLICAS - 1,
        "Ready pods fell below the budget's floor: {samples:?}"
    );
    let moved: Vec<&String> = before.iter().map(|(pod, _)| pod).collect();
    assert!(!moved.is_empty(), "no pod before the run: {before:?}");
    assert!(
        moved.iter().all(|p| !after.iter().any(|(q, _)| q == *p)),
        "every original pod was evicted and recreated: before {before:?}, after {after:?}"
    );
}

/// The emulator's marker: the ASG's launches fail for lack of capacity.
const NO_CAPACITY: &str = "snm.test/no-capacity";

#[tokio::test]
async fn replenishing_a_lost_node_and_scaling_back_in_keeps_the_workload_within_its_budget() {
    let world = World::new("wl-shortage").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let short = kops.asgs[0].clone();
    world.set_timing(&short, "capacity-retry", 5.0).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&group("workers", "Worker", &kops.asgs, 3))
        .await;
    let (manager, _config) = world.start_manager(&[]);
    let replenishers: Api<Replenisher> = world.api();
    let steady = || async {
        let rp = replenishers.get("workers").await.ok()?.status?;
        (ready_count(&groups, "workers").await? == 3
            && rp.phase == ReplenishPhase::Steady
            && rp.raised.is_empty())
        .then_some(())
    };
    assert_eventually("steady with 3 Ready", RUN, steady).await;
    deploy_web(&world, REPLICAS as i32, 1).await;
    assert_eventually("6 Ready pods", WAIT, || async {
        (ready_web_pods(&world).await.len() == REPLICAS).then_some(())
    })
    .await;

    // A spot loss in a zone out of capacity: its pods go with it (not ours
    // to protect), the replenisher launches elsewhere, the pods come back.
    world.tag_asg(&short, NO_CAPACITY, "true").await;
    let lost = world.asg_instances(&short).await.remove(0);
    world.lose_instance_and_its_node(&lost).await;
    assert_eventually("3 Ready nodes and 6 Ready pods again", RUN, || async {
        (ready_count(&groups, "workers").await? == 3
            && ready_web_pods(&world).await.len() == REPLICAS)
            .then_some(())
    })
    .await;

    // Spread the pods over the three nodes, the raised one included (a
    // rollout, as a user's next deploy would), so the scale-in has pods to move.
    // First the node lifecycle controller must have lifted the new node's
    // not-ready taint (it looks every 5 s), or the scheduler passes it over.
    assert_eventually("3 untainted nodes", WAIT, || async {
        let list = world.nodes().await?;
        let untainted = list
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_none_or(|t| t.is_empty())
            })
            .count();
        (untainted == 3).then_some(())
    })
    .await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = world.api();
    let restart = serde_json::json!({"spec": {"template": {"metadata": {"annotations":
        {"snm.test/restarted": "1"}}}}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&restart))
        .await
        .expect("restart the deployment");
    assert_eventually("6 Ready pods over 3 nodes", RUN, || async {
        let ready = ready_web_pods(&world).await;
        let on: BTreeSet<&String> = ready.iter().map(|(_, n)| n).collect();
        (ready.len() == REPLICAS && on.len() == 3).then_some(())
    })
    .await;

    // From here on every disruption is ours: the capacity returns, the short
    // ASG launches its own node again, and the replenisher drains and removes
    // the one it raised, explicitly, within the budget.
    let sampler = sample_web(&world).await;
    world.untag_asg(&short, NO_CAPACITY, "true").await;
    assert_eventually("scaled back in to the original layout", RUN, || async {
        let layout = world.asg_snapshot(&kops.asgs).await;
        let back = layout
            .iter()
            .all(|(_, desired, ids)| *desired == 1 && ids.len() == 1);
        (back && ready_web_pods(&world).await.len() == REPLICAS).then_some(())
    })
    .await;
    assert_eventually("steady again", WAIT, steady).await;
    let samples = sampler.stop().await;
    println!(
        "FIGURES workload through the scale-in: min Ready pods {} of {REPLICAS} (budget floor {}), {} samples",
        samples.min_ready(),
        REPLICAS - 1,
        samples.count()
    );
    assert!(
        samples.min_ready() >= REPLICAS - 1,
        "Ready pods fell below the budget's floor: {samples:?}"
    );
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Runs a refresh whose drains are given up after 10 s (`Abort`), and
/// returns its outcome, asserting it failed.
async fn refresh_given_up(world: &World) -> spot_node_manager::crd::refresher::RunOutcome {
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "drainTimeout": "10s", "drainTimeoutAction": "Abort"}),
    )
    .await;
    let rf = run_finished(world, "workers").await;
    let last = rf.status.and_then(|s| s.last_run).expect("last run");
    assert_eq!(
        last.result,
        spot_node_manager::crd::refresher::RunResult::Failed,
        "{last:?}"
    );
    last
}

#[tokio::test]
async fn a_budget_that_allows_nothing_fails_the_refresh_cleanly_and_nothing_is_evicted() {
    let g = three_workers("wl-no-disruption").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let before = world.asg_snapshot(&kops.asgs).await;
    deploy_web(world, REPLICAS as i32, 0).await;
    let pods_before = assert_web_ready(world, REPLICAS).await;
    let sampler = sample_web(world).await;
    let last = refresh_given_up(world).await;
    let samples = sampler.stop().await;
    let reason = last.reason.unwrap_or_default();
    assert!(reason.contains("timed out"), "{reason}");
    // It says which budget held it, in the apiserver's words.
    assert!(reason.contains("disruption budget web"), "{reason}");
    // Nothing evicted against the budget: the same pods, all Ready throughout.
    assert_eq!(samples.min_ready(), REPLICAS, "{samples:?}");
    let pods_after = ready_web_pods(world).await;
    assert_eq!(pods_after, pods_before);
    // Cleanly: the node given up on is back in service, the surplus gone, the
    // layout as recorded, the lock free.
    assert_eventually("no node left cordoned, layout back", WAIT, || async {
        let layout = world.asg_snapshot(&kops.asgs).await;
        let back = layout
            .iter()
            .zip(&before)
            .all(|((_, d, ids), (_, d0, _))| d == d0 && ids.len() == 1);
        let cordoned = world.cordoned_nodes().await?;
        // The lock is released by the status write that ends the run, which
        // can come after AWS shows the layout back.
        let locked = groups
            .get("workers")
            .await
            .ok()?
            .status?
            .operation
            .is_some();
        (back && cordoned.is_empty() && !locked).then_some(())
    })
    .await;
    support::cluster::assert_events(world, &["DrainBlocked"]).await;
    assert!(manager.child_alive(), "{}", manager.logs());
}

#[tokio::test]
async fn an_operators_cordon_protects_its_node_from_a_refresh_and_stays() {
    let g = three_workers("wl-their-cordon").await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    deploy_web(world, REPLICAS as i32, 0).await;
    assert_web_ready(world, REPLICAS).await;
    // An operator cordons every node of the group (maintenance), with
    // kubectl's patch: whichever node the refresh drains first, its cordon
    // is theirs.
    let original = all_instances(world, &kops.asgs).await;
    let names = node_names(world, &original).await;
    for name in &names {
        world.cordon(name).await;
    }
    // Their cordons protect the nodes (issue 28; a refresh used to drain
    // and terminate them): the run leaves all three alone and says why.
    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let status = run_finished(world, "workers").await.status.expect("status");
    let last = status.last_run.clone().expect("last run");
    assert_eq!(last.replaced, 0, "{last:?}");
    assert_eq!(status.skipped.len(), 3, "{:?}", status.skipped);
    assert!(
        status
            .skipped
            .iter()
            .all(|s| s.reason.contains("cordoned by someone else")),
        "{:?}",
        status.skipped
    );
    // (Only the surplus node is drained, at the run's end.)
    support::cluster::assert_events(world, &["NodesSkipped"]).await;
    // The surplus is gone; the operator's nodes are all still cordoned, none
    // carrying our mark.
    assert_eventually("the surplus removed", WAIT, || async {
        (all_instances(world, &kops.asgs).await == original).then_some(())
    })
    .await;
    let mut cordoned = world.cordoned_nodes().await.expect("nodes");
    cordoned.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(cordoned, expected, "the operator's cordons stay");
    let nodes: Api<Node> = Api::all(world.client.clone());
    for name in &names {
        let node = nodes.get(name).await.expect("node");
        assert!(
            !node
                .annotations()
                .contains_key(spot_node_manager::crd::labels::CORDONED_BY_US),
            "{name} marked as cordoned by us"
        );
    }
    assert!(manager.child_alive(), "{}", manager.logs());
}

#[tokio::test]
async fn deleting_the_group_mid_refresh_unwinds_the_run_before_its_children_go() {
    let g = three_workers("wl-delete-mid-run").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let before = world.asg_snapshot(&kops.asgs).await;
    // A budget that allows nothing holds the first drain: the run stays in
    // Draining, with an old node cordoned and the surplus up, until deleted.
    deploy_web(world, REPLICAS as i32, 0).await;
    let pods_before = assert_web_ready(world, REPLICAS).await;
    let group = groups.get("workers").await.expect("group");
    assert!(
        group
            .finalizers()
            .iter()
            .any(|f| f == spot_node_manager::crd::labels::FINALIZER),
        "the inventory puts its finalizer on every group: {:?}",
        group.finalizers()
    );
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "drainTimeout": "10m"}),
    )
    .await;
    let refreshers: Api<Refresher> = world.api();
    let replenishers: Api<Replenisher> = world.api();
    let drained = assert_eventually("a drain under way, an old node cordoned", RUN, || async {
        let rf = refreshers.get("workers").await.ok()?;
        let status = rf.status?;
        let cordoned = world.cordoned_nodes().await?;
        (status.phase == RefreshPhase::Draining && cordoned.len() == 1).then(|| cordoned[0].clone())
    })
    .await;
    let raised = world.asg_snapshot(&kops.asgs).await;
    assert_ne!(
        desired_counts(&raised),
        desired_counts(&before),
        "the surplus is up"
    );

    // The unwind can take less than a poll, so every status the group
    // carries from here on is read from a watch.
    let from = groups
        .get("workers")
        .await
        .expect("group")
        .resource_version()
        .expect("resourceVersion");
    let deleting = record_deleting_messages(groups, "workers", &from).await;
    groups
        .delete("workers", &Default::default())
        .await
        .expect("delete group");
    assert_eventually("group and children gone", RUN, || async {
        let g = groups.get_opt("workers").await.ok()?;
        let rf = refreshers.get_opt("workers").await.ok()?;
        let rp = replenishers.get_opt("workers").await.ok()?;
        (g.is_none() && rf.is_none() && rp.is_none()).then_some(())
    })
    .await;
    // The deletion waited, saying for what, while the run unwound.
    let said = deleting.lock().expect("messages").clone();
    assert!(
        said.iter().any(|m| m.contains("refresh run")),
        "the group said what its deletion waits for: {said:?}"
    );
    // Unwound before they went: the drained node uncordoned, the surplus
    // terminated, every ASG at its recorded count.
    let cordoned = world.cordoned_nodes().await.expect("nodes");
    assert!(
        !cordoned.contains(&drained),
        "{drained} is still cordoned: {cordoned:?}"
    );
    let after = world.asg_snapshot(&kops.asgs).await;
    assert_eq!(desired_counts(&after), desired_counts(&before));
    // The surplus node, cordoned for its removal, may still be shutting
    // down: it leaves with its instance.
    assert_eventually(
        "one instance per ASG, nothing cordoned, no surplus left",
        WAIT,
        || async {
            let after = world.asg_snapshot(&kops.asgs).await;
            (after.iter().all(|(_, _, ids)| ids.len() == 1)
                && world.cordoned_nodes().await? == Vec::<String>::new())
            .then_some(())
        },
    )
    .await;
    // Nothing was evicted against the budget.
    assert_eq!(ready_web_pods(world).await, pods_before);
    support::cluster::assert_events(world, &["RefreshFailed"]).await;
    assert!(
        manager.logs().contains("the NodeGroup is being deleted"),
        "{}",
        manager.logs()
    );
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Every message of the group's `Deleting` condition, in order, from a watch
/// that starts at `from`: each status write is one watch event, so none is
/// missed however fast the deletion goes.
async fn record_deleting_messages(
    groups: &Api<NodeGroup>,
    name: &str,
    from: &str,
) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let said: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut events = groups
        .watch(&params, from)
        .await
        .expect("watch the group")
        .boxed();
    let out = said.clone();
    tokio::spawn(async move {
        while let Some(Ok(event)) = events.next().await {
            let (WatchEvent::Modified(g) | WatchEvent::Deleted(g)) = event else {
                continue;
            };
            let conditions = g.status.map(|s| s.conditions).unwrap_or_default();
            if let Some(c) = conditions.iter().find(|c| c.type_ == "Deleting") {
                out.lock().expect("messages").push(c.message.clone());
            }
        }
    });
    said
}

#[tokio::test]
async fn a_refresh_waits_for_the_pods_it_evicted_then_goes_on() {
    let g = three_workers("wl-validate").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let original = all_instances(world, &kops.asgs).await;
    let original_nodes = node_names(world, &original).await;
    pin_a_pod_to_the_oldest_node(world, groups).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let pin = pin();

    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "validationTimeout": "5m"}),
    )
    .await;
    // Its pod evicted, with nowhere to go: the run holds after the first node.
    let refreshers: Api<Refresher> = world.api();
    let held = assert_eventually("the run holding for the evicted pod", WAIT, || async {
        let status = refreshers.get("workers").await.ok()?.status?;
        let message = status.message.clone().unwrap_or_default();
        (message.contains("validating the replacement") && message.contains("Pending"))
            .then_some(status)
    })
    .await;
    assert!(
        held.message
            .as_deref()
            .is_some_and(|m| m.contains("/ReplicaSet/pinned-")),
        "{:?}",
        held.message
    );
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let gone: BTreeSet<String> = terminated_instances(world)
        .await
        .intersection(&original)
        .cloned()
        .collect();
    assert_eq!(gone.len(), 1, "one old node taken, no second: {gone:?}");
    let status = refreshers
        .get("workers")
        .await
        .expect("rf")
        .status
        .expect("status");
    assert_eq!(status.replaced, 0, "{:?}", status.message);
    assert!(status.run_start.is_some());
    // Room for it on the new nodes: it runs there, and the run goes on.
    for node in node_names(world, &all_instances(world, &kops.asgs).await).await {
        if !original_nodes.contains(&node) {
            nodes
                .patch(&node, &PatchParams::default(), &pin)
                .await
                .expect("label");
        }
    }
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.map(|r| r.replaced), Some(3));
}

/// A refresh with `max_surge` on six nodes, two pods each, a budget of
/// one: that many replacements launched ahead (never more), never below 6
/// Ready nor 11 of 12 pods, every old node gone once, the layout back.
/// Returns the most old nodes seen cordoned (drained) at once.
async fn a_refresh_with_max_surge(max_surge: i32) -> usize {
    let g = SteadyGroup::workers(&format!("wl-surge-{max_surge}"))
        .per_asg(2)
        .start()
        .await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = all_instances(world, &kops.asgs).await;
    // Two pods per node; the budget lets one be unavailable at a time.
    let pods = 12;
    deploy_web(world, pods as i32, 1).await;
    assert_web_ready(world, pods).await;
    let web = sample_web(world).await;
    let nodes = sample(world, &kops.asgs, 6).await;
    // The budget paces maxSurge drains one pod at a time, each waiting for
    // the pod before it to be Ready elsewhere: on a loaded machine that
    // outlasts the tests' usual 30 s drain timeout, which is not what is
    // tested here.
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "maxSurge": max_surge, "drainTimeout": "3m"}),
    )
    .await;
    let rf = run_finished(world, "workers").await;
    let (nodes, web) = (nodes.stop().await, web.stop().await);
    let last = assert_run_succeeded(rf, manager)
        .last_run
        .expect("last run");
    assert_eq!(last.replaced, 6);
    // Never below 6 Ready; besides the surplus, maxSurge replacements
    // launched ahead at once, never more.
    assert_eq!(nodes.min_ready(), 6, "{nodes:?}");
    assert_eq!(nodes.max_desired(), 6 + 1 + max_surge, "{nodes:?}");
    assert!(nodes.max_cordoned() <= max_surge as usize, "{nodes:?}");
    // The budget held throughout: at most one pod unavailable.
    assert!(web.min_ready() + 1 >= pods, "{web:?}");
    // Every old node gone, each once, with the surplus; nothing launched
    // ahead left behind: the layout is back.
    layout_back(world, &kops.asgs, &before).await;
    let terminated = terminated_instances(world).await;
    assert!(original.is_subset(&terminated), "{terminated:?}");
    assert_eq!(
        terminated.len(),
        7,
        "six old nodes and the surplus: {terminated:?}"
    );
    nodes.max_cordoned()
}

/// maxSurge 2 under a budget that allows one eviction at a time.
#[tokio::test]
async fn a_refresh_with_max_surge_two_keeps_a_one_at_a_time_budget() {
    a_refresh_with_max_surge(2).await;
}

/// maxSurge 3: the nodes the replacements stand for are drained at once
/// (the first with the surplus beside it, the next ones once their
/// replacements are Ready); the budget, not the refresher, paces the
/// evictions.
#[tokio::test]
async fn a_refresh_with_max_surge_three_drains_nodes_at_once_and_keeps_a_one_at_a_time_budget() {
    let most_drained = a_refresh_with_max_surge(3).await;
    assert!(most_drained >= 2, "never two old nodes drained at once");
}

/// A pod its drain moved never comes back (it may run only on the node the
/// refresh took first): once `validationTimeout` (10 s here) runs out, the
/// run fails and keeps the old nodes left (`Abort`), or goes on with the
/// next node and says so in a `ValidationTimedOut` Warning Event (`Proceed`).
async fn a_validation_that_times_out(action: &str) -> (Refresher, World, BTreeSet<String>) {
    let g = three_workers(&format!("wl-timeout-{}", action.to_lowercase())).await;
    let (world, kops, groups) = (&g.world, &g.kops, &g.groups);
    let original = all_instances(world, &kops.asgs).await;
    pin_a_pod_to_the_oldest_node(world, groups).await;
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "validationTimeout": "10s",
                           "validationTimeoutAction": action}),
    )
    .await;
    let rf = run_finished(world, "workers").await;
    (rf, g.world, original)
}

#[tokio::test]
async fn a_validation_that_times_out_with_abort_fails_the_run_and_keeps_the_old_nodes_left() {
    let (rf, world, original) = a_validation_that_times_out("Abort").await;
    let last = rf.status.and_then(|s| s.last_run).expect("last run");
    assert_eq!(last.result, RunResult::Failed, "{last:?}");
    let reason = last.reason.unwrap_or_default();
    assert!(reason.contains("not whole within 10s"), "{reason}");
    assert!(reason.contains("/ReplicaSet/pinned-"), "{reason}");
    let gone: BTreeSet<String> = terminated_instances(&world)
        .await
        .intersection(&original)
        .cloned()
        .collect();
    assert_eq!(gone.len(), 1, "only the first old node went: {gone:?}");
    assert_eq!(event_count(&world, "ValidationTimedOut").await, 0);
}

#[tokio::test]
async fn a_validation_that_times_out_with_proceed_goes_on_and_says_so() {
    let (rf, world, original) = a_validation_that_times_out("Proceed").await;
    let last = rf.status.and_then(|s| s.last_run).expect("last run");
    assert_eq!(
        (last.result, last.replaced),
        (RunResult::Succeeded, 3),
        "{last:?}"
    );
    assert!(original.is_subset(&terminated_instances(&world).await));
    assert_event(&world, "ValidationTimedOut").await;
}

/// The label a node needs to run the `pinned` Deployment's pod.
fn pin() -> Patch<serde_json::Value> {
    Patch::Merge(serde_json::json!({"metadata": {"labels": {"snm.test/pinned": "yes"}}}))
}

/// Deployment `pinned` (one replica) whose pod may run only on a node
/// labelled by [`pin`]; the group's oldest node, which a refresh takes
/// first, gets the label. Returns that node once the pod is Ready on it.
async fn pin_a_pod_to_the_oldest_node(world: &World, groups: &Api<NodeGroup>) -> String {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    // The oldest node is replaced first; a pod that may run only there.
    let first = nodes_oldest_first(groups, "workers").await[0].clone();
    let nodes: Api<Node> = Api::all(world.client.clone());
    let pin = pin();
    nodes
        .patch(&first, &PatchParams::default(), &pin)
        .await
        .expect("label");
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "pinned"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "pinned"}},
            "template": {
                "metadata": {"labels": {"app": "pinned"}},
                "spec": {
                    "nodeSelector": {support::sim::SIM_ACCOUNT_LABEL: world.account,
                                     "snm.test/pinned": "yes"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "pinned", "image": "registry.invalid/pinned"}],
                },
            },
        },
    }))
    .expect("deployment");
    let deployments: Api<Deployment> = world.api();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("deployment");
    let pods: Api<Pod> = world.api();
    let pinned_ready = || async {
        pods.list(&kube::api::ListParams::default().labels("app=pinned"))
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .find(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .and_then(|p| p.spec?.node_name)
    };
    let on = assert_eventually("the pinned pod Ready", WAIT, pinned_ready).await;
    assert_eq!(on, first);
    first
}

/// Issue 54, hole 8: the ASG of the node a refresh is draining leaves the
/// group's spec (the user drops it from the NodeGroup). The node is no
/// longer the group's to terminate; it used to stay cordoned for good. It
/// is given back, uncordoned and running, and the run goes on with the
/// nodes still the group's.
#[tokio::test]
async fn a_node_whose_asg_leaves_the_spec_mid_drain_is_given_back_uncordoned() {
    let g = three_workers("wl-asg-left").await;
    let (world, kops, groups) = (&g.world, &g.kops, &g.groups);
    let oldest = nodes_oldest_first(groups, "workers").await.remove(0);
    // A budget that allows no eviction holds its drain.
    support::cluster::create_pdb(world, 1).await;
    labelled_pods_on(
        world,
        std::slice::from_ref(&oldest),
        "held",
        &[("app", "protected")],
    )
    .await;
    support::cluster::assert_pdb_allows(world, 0).await;
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "drainTimeout": "10m"}),
    )
    .await;
    let target = refresher_until(world, "workers", "the oldest node draining", WAIT, |s| {
        s.current_target
            .filter(|t| t.node.as_deref() == Some(oldest.as_str()))
    })
    .await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let cordoned = |node: Node| node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
    assert_eventually("the oldest node cordoned", WAIT, || async {
        cordoned(nodes.get(&oldest).await.ok()?).then_some(())
    })
    .await;
    // The user drops its ASG, and its node from the count.
    let rest: Vec<String> = kops
        .asgs
        .iter()
        .filter(|a| **a != target.auto_scaling_group)
        .cloned()
        .collect();
    let spec = serde_json::json!({"spec": {
        "autoScalingGroups": rest.iter().map(|a| serde_json::json!({"name": a})).collect::<Vec<_>>(),
        "desired": 2,
    }});
    groups
        .patch("workers", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .expect("drop the ASG");
    assert_eventually("the node given back uncordoned", WAIT, || async {
        (!cordoned(nodes.get(&oldest).await.ok()?)).then_some(())
    })
    .await;
    let rf = run_finished(world, "workers").await;
    let status = rf.status.expect("status");
    assert!(
        !terminated_instances(world)
            .await
            .contains(&target.instance_id),
        "not the group's to terminate any more: {:?}",
        status.last_run
    );
    assert!(
        !cordoned(nodes.get(&oldest).await.expect("the node")),
        "still in service after the run"
    );
}
