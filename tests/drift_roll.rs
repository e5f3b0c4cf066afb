//! Drift rolls end to end (issue 26, `spec.drift.action: Replace`): after
//! `kops update cluster` the drifted nodes are rolled with the refresher's
//! machinery, without a schedule; a newer version mid-roll joins it, a
//! rollback ends it; a killed manager resumes it. Real apiserver, the rude
//! emulator (it records the template version of each launch), the
//! simulated kubelet, a workload behind a PodDisruptionBudget.

use snm_testkit as support;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use spot_node_manager::cloud::{Cloud, LaunchSource, aws::AwsCloud};
use spot_node_manager::crd::Refresher;
use spot_node_manager::crd::nodegroup::NodeGroupStatus;
use spot_node_manager::crd::refresher::{RefreshPhase, RunResult, RunTrigger};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::refresh::*;
use support::steady::*;
use support::workload::{assert_web_ready, deploy_web, sample_web};
use support::{World, assert_eventually};

/// `spec.drift.action` of NodeGroup `workers` (no `refresh`: the defaults).
async fn drift_action(world: &World, action: &str) {
    let groups: Api<spot_node_manager::crd::NodeGroup> = world.api();
    groups
        .patch(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"drift": {"action": action}}})),
        )
        .await
        .expect("set drift.action");
}

async fn status_where(
    world: &World,
    what: &str,
    holds: impl Fn(&NodeGroupStatus) -> bool,
) -> NodeGroupStatus {
    let groups: Api<spot_node_manager::crd::NodeGroup> = world.api();
    assert_eventually(what, RUN, || async {
        let status = groups.get("workers").await.ok()?.status?;
        holds(&status).then_some(status)
    })
    .await
}

/// The template version each instance of the ASGs was launched from, as
/// seen every 250 ms while it was in an ASG (so terminated ones are known).
struct Versions {
    seen: Arc<Mutex<BTreeMap<String, String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Versions {
    fn watch(world: &World, asgs: &[String]) -> Versions {
        let seen: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let cloud = AwsCloud::new(world.aws.clone());
        let (asgs, out) = (asgs.to_vec(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                if let Ok(described) = cloud.describe_groups(&asgs).await {
                    let mut seen = out.lock().expect("versions");
                    for i in described.iter().flat_map(|a| a.instances.iter()) {
                        if let Some(LaunchSource::Template {
                            version: Some(v), ..
                        }) = &i.launched_from
                        {
                            seen.insert(i.instance_id.clone(), v.clone());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Versions { seen, task }
    }

    /// Instances seen launched from `version`.
    fn of(&self, version: &str) -> BTreeSet<String> {
        self.seen
            .lock()
            .expect("versions")
            .iter()
            .filter(|(_, v)| *v == version)
            .map(|(i, _)| i.clone())
            .collect()
    }
}

impl Drop for Versions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn terminated(states: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    let mut gone = states.get("terminated").cloned().unwrap_or_default();
    gone.extend(states.get("shutting-down").cloned().unwrap_or_default());
    gone
}

/// The layout back (see [`layout_back`]) and group `workers` 3 Ready, none
/// drifted.
async fn settled(world: &World, asgs: &[String], before: &[(String, i32, Vec<String>)]) {
    layout_back(world, asgs, before).await;
    status_where(world, "3 Ready, none drifted", |s| {
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
    let original = all_instances(world, &kops.asgs).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    drift_action(world, "Replace").await;
    let versions = Versions::watch(world, &kops.asgs);
    let nodes = sample(world, &kops.asgs, 3);
    let web = sample_web(world);

    let updated = Instant::now();
    assert_eq!(world.kops_update_cluster(kops).await, [2, 2, 2]);
    status_where(world, "3 drifted", |s| s.drifted_nodes == Some(3)).await;
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
    let (nodes, web) = (nodes.stop(), web.stop());
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
    assert_eq!(nodes.min_ready, Some(3), "{nodes:?}");
    assert_eq!(nodes.max_desired, 5, "{nodes:?}");
    assert!(web.min_ready.is_some_and(|m| m >= 2), "{web:?}");
    settled(world, &kops.asgs, &before).await;
    // Exactly the old nodes and the surplus terminated; what runs is on
    // version 2.
    let gone = terminated(&instances_by_state(world).await);
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
    let original = all_instances(world, &kops.asgs).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    pods_on(world, &node_names(world, &original).await).await;
    drift_action(world, "Replace").await;
    let versions = Versions::watch(world, &kops.asgs);

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
    settled(world, &kops.asgs, &before).await;
    let now = all_instances(world, &kops.asgs).await;
    assert!(
        now.is_subset(&versions.of("3")),
        "every node on version 3: {now:?}"
    );
    let gone = terminated(&instances_by_state(world).await);
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
    let original = all_instances(world, &kops.asgs).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    pods_on(world, &node_names(world, &original).await).await;
    // Each replacement takes a few seconds, so the rollback lands mid-roll.
    for asg in &kops.asgs {
        world.set_timing(asg, "launch-lag", 4.0).await;
    }
    drift_action(world, "Replace").await;
    let versions = Versions::watch(world, &kops.asgs);

    world.kops_update_cluster(kops).await;
    refresher_where(world, "workers", "the first node replaced", |s| {
        s.replaced >= 1
    })
    .await;
    world.pin_template_version(kops, 1).await;
    // Once the inventory sees it, no old node is drifted any more: those
    // still in service then must stay.
    let status = status_where(world, "the old nodes no longer drifted", |s| {
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
    settled(world, &kops.asgs, &before).await;
    let now = all_instances(world, &kops.asgs).await;
    assert!(!kept.is_empty(), "the rollback came after the roll's end");
    assert!(kept.is_subset(&now), "kept {kept:?}, in service {now:?}");
    assert!(
        now.is_subset(&versions.of("1")),
        "every node on version 1: {now:?}"
    );
    let gone = terminated(&instances_by_state(world).await);
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
    let original = all_instances(world, &kops.asgs).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    drift_action(world, "Replace").await;
    let marked = world.asg_instances(&kops.asgs[1]).await.remove(0);
    let nodes: Api<Node> = Api::all(world.client.clone());
    let patch = serde_json::json!({"metadata": {"annotations": {"kops.k8s.io/needs-update": ""}}});
    nodes
        .patch(&marked, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
    let rf = run_finished(world, "workers").await;
    let last = assert_run_succeeded(rf, manager)
        .last_run
        .expect("last run");
    assert_eq!(last.replaced, 1);
    settled(world, &kops.asgs, &before).await;
    let gone = terminated(&instances_by_state(world).await);
    assert!(gone.contains(&marked), "{gone:?}");
    assert_eq!(gone.len(), 2, "the marked node and the surplus: {gone:?}");
    let now = all_instances(world, &kops.asgs).await;
    let kept: BTreeSet<_> = original.iter().filter(|i| **i != marked).cloned().collect();
    assert!(kept.is_subset(&now), "{now:?}");
}

#[tokio::test]
async fn a_manager_killed_mid_drift_roll_resumes_it_and_terminates_each_node_once() {
    let g = three_workers("drift-roll-restart").await;
    let mut manager = g.manager;
    let (world, kops) = (&g.world, &g.kops);
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = all_instances(world, &kops.asgs).await;
    pods_on(world, &node_names(world, &original).await).await;
    drift_action(world, "Replace").await;
    let sampler = sample(world, &kops.asgs, 3);
    world.kops_update_cluster(kops).await;

    let phases = [RefreshPhase::WaitingForReplacement, RefreshPhase::Draining];
    let _configs = kill_at_phases(world, &mut manager, &phases, |_| true).await;
    assert_taken_over_run_finished(world, &kops.asgs, &manager, sampler, &original, &before).await;
    let rf: Refresher = world
        .api::<Refresher>()
        .get("workers")
        .await
        .expect("refresher");
    let last = rf.status.and_then(|s| s.last_run).expect("last run");
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
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let original = all_instances(world, &kops.asgs).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    groups
        .patch(
            "masters",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "refresh": {"schedule": "0 0 1 1 *", "masterSettleTime": "2s", "readyTimeout": "60s"},
                "drift": {"action": "Replace"}
            }})),
        )
        .await
        .expect("drift Replace");
    let nodes = sample(world, &kops.asgs, 3);
    world.kops_update_cluster(kops).await;
    let rf = run_finished(world, "masters").await;
    let nodes = nodes.stop();
    let last = assert_run_succeeded(rf, manager)
        .last_run
        .expect("last run");
    assert_eq!((last.replaced, last.trigger), (3, Some(RunTrigger::Drift)));
    // One master out at a time, never an extra one.
    assert_eq!(nodes.min_ready, Some(2), "{nodes:?}");
    assert_eq!(nodes.max_desired, 3, "{nodes:?}");
    layout_back(world, &kops.asgs, &before).await;
    let gone = terminated(&instances_by_state(world).await);
    assert_eq!(gone, original, "exactly the old masters terminated");
}
