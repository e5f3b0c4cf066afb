//! Drift rolls end to end (issue 26, `spec.drift.action: Replace`): after
//! `kops update cluster` the drifted nodes are rolled with the refresher's
//! machinery, without a schedule; a newer version mid-roll joins it, a
//! rollback ends it; a killed manager resumes it. Real apiserver, the rude
//! emulator (it records the template version of each launch), the
//! simulated kubelet, a workload behind a PodDisruptionBudget.

use snm_testkit as support;

use spot_node_manager::crd::refresher::{RefreshPhase, RunResult, RunTrigger};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::World;
use support::recorders::TemplateVersions;
use support::refresh::*;
use support::steady::*;
use support::workload::{assert_web_ready, deploy_web, sample_web};

/// `spec.drift.action` of NodeGroup `workers` (no `refresh`: the defaults).
async fn drift_action(world: &World, action: &str) {
    let drift = serde_json::json!({"drift": {"action": action}});
    world.patch_group("workers", drift).await;
}

/// The layout back (see [`layout_back`]) and group `workers` 3 Ready, none
/// drifted.
async fn settled(g: &SteadyGroup, before: &[(String, i32, Vec<String>)]) {
    layout_back(&g.world, &g.kops.asgs, before).await;
    g.status_where("workers", "3 Ready, none drifted", |s| {
        s.ready_nodes == Some(3) && s.drifted_nodes == Some(0)
    })
    .await;
}

#[tokio::test]
async fn after_kops_update_cluster_the_drifted_nodes_are_rolled_within_the_budget() {
    let g = three_workers("drift-roll").await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    deploy_web(world, 3, 1).await;
    assert_web_ready(world, 3).await;
    let Baseline { before, original } = g.baseline().await;
    drift_action(world, "Replace").await;
    let versions = TemplateVersions::watch(world, &kops.asgs);
    let nodes = g.sample(3).await;
    let web = sample_web(world).await;

    let updated = Instant::now();
    assert_eq!(world.kops_update_cluster(kops).await, [2, 2, 2]);
    g.status_where("workers", "3 drifted", |s| s.drifted_nodes == Some(3))
        .await;
    let detected = Instant::now();
    let started = refresher_where(world, "workers", "a drift roll started", |s| {
        s.run_start.is_some() || s.last_run.is_some()
    })
    .await;
    eprintln!(
        "kops update cluster -> drift reported {:.1} s -> drift roll started {:.1} s later",
        (detected - updated).as_secs_f64(),
        detected.elapsed().as_secs_f64()
    );
    assert_eq!(
        started
            .trigger
            .or(started.last_run.as_ref().and_then(|r| r.trigger)),
        Some(RunTrigger::Drift)
    );
    let rf = run_finished(world, "workers").await;
    let took = detected.elapsed();
    let (nodes, web) = (nodes.stop().await, web.stop().await);
    let status = assert_run_succeeded(rf, manager);
    let last = status.last_run.clone().expect("last run");
    assert_eq!((last.replaced, last.trigger), (3, Some(RunTrigger::Drift)));
    eprintln!(
        "drift roll of 3 nodes: {:.1} s from detection to its end",
        took.as_secs_f64()
    );

    // Never below 3 Ready, one surplus and one replacement launched ahead
    // at most; the workload never below its budget's floor (3 replicas,
    // maxUnavailable 1).
    assert_eq!(nodes.min_ready(), 3, "{nodes:?}");
    assert_eq!(nodes.max_desired(), 5, "{nodes:?}");
    assert!(web.min_ready() >= 2, "{web:?}");
    settled(&g, &before).await;
    // Exactly the old nodes and the surplus terminated; what runs is on
    // version 2.
    let gone = terminated_or_going(&instances_by_state(world).await);
    assert!(original.is_subset(&gone), "{gone:?}");
    assert_eq!(gone.len(), 4, "3 old nodes and the surplus: {gone:?}");
    let now = all_instances(world, &kops.asgs).await;
    assert!(now.is_subset(&versions.of("2")), "{now:?}");
    assert_event(world, "DriftDetected").await;
    assert_eq!(event_count(world, "RefreshStarted").await, 1);
}

#[tokio::test]
async fn a_newer_version_mid_roll_joins_it_and_no_node_launched_from_it_goes() {
    let g = three_workers("drift-roll-newer").await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let Baseline { before, original } = g.baseline_with_pods().await;
    drift_action(world, "Replace").await;
    let versions = TemplateVersions::watch(world, &kops.asgs);

    world.kops_update_cluster(kops).await;
    refresher_where(world, "workers", "the first node replaced", |s| {
        s.replaced >= 1
    })
    .await;
    assert_eq!(world.kops_update_cluster(kops).await, [3, 3, 3]);
    let rf = run_finished(world, "workers").await;
    assert_run_succeeded(rf, manager);
    // The nodes of version 2 joined the roll or went as the surplus; if
    // the roll ended before the inventory saw version 3, a second roll
    // takes them.
    settled(&g, &before).await;
    let now = all_instances(world, &kops.asgs).await;
    assert!(
        now.is_subset(&versions.of("3")),
        "every node on version 3: {now:?}"
    );
    let gone = terminated_or_going(&instances_by_state(world).await);
    assert!(original.is_subset(&gone), "{gone:?}");
    assert!(
        versions.of("2").is_subset(&gone),
        "every node of version 2 gone"
    );
    let wasted: BTreeSet<String> = gone.intersection(&versions.of("3")).cloned().collect();
    assert!(
        wasted.is_empty(),
        "terminated nodes launched from version 3: {wasted:?}"
    );
    assert_event(world, "DriftRollChanged").await;
}

#[tokio::test]
async fn a_rollback_mid_roll_ends_it_and_keeps_the_old_nodes_not_yet_replaced() {
    let g = three_workers("drift-roll-back").await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let Baseline { before, original } = g.baseline_with_pods().await;
    // Each replacement takes a few seconds, so the rollback lands mid-roll.
    for asg in &kops.asgs {
        world.set_timing(asg, "launch-lag", 4.0).await;
    }
    drift_action(world, "Replace").await;
    let versions = TemplateVersions::watch(world, &kops.asgs);

    world.kops_update_cluster(kops).await;
    refresher_where(world, "workers", "the first node replaced", |s| {
        s.replaced >= 1
    })
    .await;
    world.pin_template_version(kops, 1).await;
    // Once the inventory sees it, no old node is drifted any more: those
    // still in service then must stay.
    let status = g
        .status_where("workers", "the old nodes no longer drifted", |s| {
            s.nodes.iter().all(|n| {
                !(n.drifted.is_some()
                    && original.contains(n.instance_id.as_deref().unwrap_or_default()))
            })
        })
        .await;
    // A termination the roll recorded before it saw the rollback is still
    // made (recorded, then done); give the refresher a reconcile or two to
    // see it, then every old node neither replaced nor being terminated
    // must stay.
    let decided_by = |rf: spot_node_manager::crd::RefresherStatus| {
        rf.replaced_instances
            .into_iter()
            .chain(
                rf.current_target
                    .filter(|t| t.terminated.is_some())
                    .map(|t| t.instance_id),
            )
            .collect::<BTreeSet<String>>()
    };
    let mut decided =
        decided_by(refresher_where(world, "workers", "the refresher's status", |_| true).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    decided.extend(decided_by(
        refresher_where(world, "workers", "the refresher's status", |_| true).await,
    ));
    let kept: BTreeSet<String> = status
        .nodes
        .iter()
        .filter_map(|n| n.instance_id.clone())
        .filter(|i| original.contains(i) && !decided.contains(i))
        .collect();
    let rf = run_finished(world, "workers").await;
    assert_run_succeeded(rf, manager);
    settled(&g, &before).await;
    let now = all_instances(world, &kops.asgs).await;
    assert!(!kept.is_empty(), "the rollback came after the roll's end");
    assert!(kept.is_subset(&now), "kept {kept:?}, in service {now:?}");
    assert!(
        now.is_subset(&versions.of("1")),
        "every node on version 1: {now:?}"
    );
    let gone = terminated_or_going(&instances_by_state(world).await);
    assert!(
        versions.of("2").is_subset(&gone),
        "every node of version 2 gone"
    );
    assert_event(world, "DriftRollChanged").await;
}

#[tokio::test]
async fn a_node_marked_needs_update_is_rolled_alone() {
    let g = three_workers("drift-roll-marked").await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let Baseline { before, original } = g.baseline().await;
    drift_action(world, "Replace").await;
    let marked = world.asg_instances(&kops.asgs[1]).await.remove(0);
    world
        .annotate_node(&marked, "kops.k8s.io/needs-update", Some(""))
        .await;
    let rf = run_finished(world, "workers").await;
    let last = assert_run_succeeded(rf, manager)
        .last_run
        .expect("last run");
    assert_eq!(last.replaced, 1);
    settled(&g, &before).await;
    let gone = terminated_or_going(&instances_by_state(world).await);
    assert!(gone.contains(&marked), "{gone:?}");
    assert_eq!(gone.len(), 2, "the marked node and the surplus: {gone:?}");
    let now = all_instances(world, &kops.asgs).await;
    let kept: BTreeSet<_> = original.iter().filter(|i| **i != marked).cloned().collect();
    assert!(kept.is_subset(&now), "{now:?}");
}

#[tokio::test]
async fn a_manager_killed_mid_drift_roll_resumes_it_and_terminates_each_node_once() {
    let g = three_workers("drift-roll-restart").await;
    let Baseline { before, original } = g.baseline_with_pods().await;
    let sampler = g.sample(3).await;
    let mut manager = g.manager;
    let (world, kops) = (&g.world, &g.kops);
    drift_action(world, "Replace").await;
    world.kops_update_cluster(kops).await;

    let phases = [RefreshPhase::WaitingForReplacement, RefreshPhase::Draining];
    let _configs = kill_at_phases(world, &mut manager, &phases, |_| true).await;
    assert_taken_over_run_finished(world, &kops.asgs, &manager, sampler, &original, &before).await;
    let last = refresher_status(world, "workers").await.last_run;
    let last = last.expect("last run");
    assert_eq!(
        (last.result, last.trigger),
        (RunResult::Succeeded, Some(RunTrigger::Drift))
    );
}

/// Masters: the drift roll takes them one at a time without surplus, with
/// `spec.refresh`'s settings (a short settle time; its schedule is a year
/// away and plays no part).
#[tokio::test]
async fn drifted_masters_are_rolled_one_at_a_time_without_surplus() {
    let g = SteadyGroup::masters("drift-roll-masters").start().await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let Baseline { before, original } = g.baseline().await;
    let refresh = serde_json::json!({"schedule": "0 0 1 1 *", "masterSettleTime": "2s", "readyTimeout": "60s"});
    let spec = serde_json::json!({"refresh": refresh, "drift": {"action": "Replace"}});
    world.patch_group("masters", spec).await;
    let nodes = g.sample(3).await;
    world.kops_update_cluster(kops).await;
    let rf = run_finished(world, "masters").await;
    let nodes = nodes.stop().await;
    let last = assert_run_succeeded(rf, manager)
        .last_run
        .expect("last run");
    assert_eq!((last.replaced, last.trigger), (3, Some(RunTrigger::Drift)));
    // One master out at a time, never an extra one.
    assert_eq!(nodes.min_ready(), 2, "{nodes:?}");
    assert_eq!(nodes.max_desired(), 3, "{nodes:?}");
    layout_back(world, &kops.asgs, &before).await;
    let gone = terminated_or_going(&instances_by_state(world).await);
    assert_eq!(gone, original, "exactly the old masters terminated");
}
