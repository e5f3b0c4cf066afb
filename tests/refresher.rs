//! The refresher end to end: real apiserver + moto + simulated kubelet, the
//! manager as a separate process (killed mid-run in one test).

mod support;

use chrono::{Datelike, Timelike, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use spot_node_manager::crd::refresher::{RefreshPhase, RunResult};
use spot_node_manager::crd::{NodeGroup, Refresher};
use spot_node_manager::sim::SIM_ACCOUNT_LABEL;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{World, ZONES, eventually};

const WAIT: Duration = Duration::from_secs(90);
const RUN: Duration = Duration::from_secs(240);
const FAST: Duration = Duration::from_millis(300);

fn group(name: &str, role: &str, asgs: &[String], desired: i32) -> NodeGroup {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": name},
        "spec": {
            "role": role,
            "autoScalingGroups": asgs.iter().map(|a| serde_json::json!({"name": a})).collect::<Vec<_>>(),
            "desired": desired,
            "replenish": {"cooldown": "1s"}
        }
    }))
    .expect("group")
}

/// A cron expression (with seconds and year) that fires once, `secs` from now.
fn once_in(secs: i64) -> String {
    let t = Utc::now() + chrono::Duration::seconds(secs);
    format!(
        "{} {} {} {} {} * {}",
        t.second(),
        t.minute(),
        t.hour(),
        t.day(),
        t.month(),
        t.year()
    )
}

/// Turns refresh on for the group, due a few seconds from now.
async fn schedule_refresh(world: &World, name: &str, extra: serde_json::Value) {
    let mut refresh = serde_json::json!({
        "schedule": once_in(3),
        "timeZone": "UTC",
        "drainTimeout": "30s",
        "readyTimeout": "60s",
    });
    if let (Some(r), Some(e)) = (refresh.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    let groups: Api<NodeGroup> = world.api();
    groups
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"refresh": refresh}})),
        )
        .await
        .expect("schedule refresh");
}

async fn ready_count(groups: &Api<NodeGroup>, name: &str) -> Option<i32> {
    groups.get(name).await.ok()?.status?.ready_nodes
}

/// What a sampler saw while a refresh ran.
#[derive(Debug, Default, Clone)]
struct Samples {
    count: usize,
    /// Fewest Nodes Ready whose instance was in service in one of the ASGs.
    min_ready: Option<i32>,
    /// Most desired capacity summed over the ASGs.
    max_desired: i32,
}

/// Samples, every 250 ms, the Ready Nodes whose instance is InService in the
/// group's ASGs (a Node of a terminated instance does not count, however
/// long its kubelet takes to go), and the ASGs' total desired count.
fn sample(world: &World, asgs: &[String]) -> (Arc<Mutex<Samples>>, tokio::task::JoinHandle<()>) {
    let samples = Arc::new(Mutex::new(Samples::default()));
    let nodes: Api<Node> = Api::all(world.client.clone());
    let autoscaling = world.aws.autoscaling.clone();
    let asgs = asgs.to_vec();
    let selector = format!("{SIM_ACCOUNT_LABEL}={}", world.account);
    let out = samples.clone();
    let task = tokio::spawn(async move {
        loop {
            let described = autoscaling
                .describe_auto_scaling_groups()
                .set_auto_scaling_group_names(Some(asgs.clone()))
                .send()
                .await;
            let listed = nodes.list(&ListParams::default().labels(&selector)).await;
            if let (Ok(described), Ok(listed)) = (described, listed) {
                let in_service: BTreeSet<String> = described
                    .auto_scaling_groups()
                    .iter()
                    .flat_map(|g| g.instances())
                    .filter(|i| i.lifecycle_state().map(|s| s.as_str()) == Some("InService"))
                    .filter_map(|i| i.instance_id().map(str::to_string))
                    .collect();
                let desired: i32 = described
                    .auto_scaling_groups()
                    .iter()
                    .map(|g| g.desired_capacity().unwrap_or(0))
                    .sum();
                let ready = listed
                    .items
                    .iter()
                    .filter(|n| is_ready(n))
                    .filter(|n| instance_of(n).is_some_and(|i| in_service.contains(&i)))
                    .count() as i32;
                let mut s = out.lock().expect("samples");
                s.count += 1;
                s.min_ready = Some(s.min_ready.map_or(ready, |m| m.min(ready)));
                s.max_desired = s.max_desired.max(desired);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    (samples, task)
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn instance_of(node: &Node) -> Option<String> {
    let id = node.spec.as_ref()?.provider_id.as_ref()?;
    Some(id.rsplit('/').next()?.to_string())
}

/// Instance ids of the account's instances in each EC2 state.
async fn instances_by_state(world: &World) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let described = world
        .aws
        .ec2
        .describe_instances()
        .send()
        .await
        .expect("describe instances");
    for r in described.reservations() {
        for i in r.instances() {
            let state = i
                .state()
                .and_then(|s| s.name())
                .map(|n| n.as_str().to_string())
                .unwrap_or_default();
            if let Some(id) = i.instance_id() {
                out.entry(state).or_default().insert(id.to_string());
            }
        }
    }
    out
}

async fn all_instances(world: &World, asgs: &[String]) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for a in asgs {
        all.extend(world.asg_instances(a).await);
    }
    all
}

/// Waits for the run to end and returns the Refresher.
async fn run_finished(world: &World, name: &str) -> Refresher {
    let refreshers: Api<Refresher> = world.api();
    eventually("the refresh run to end", RUN, || async {
        let rf = refreshers.get(name).await.ok()?;
        let status = rf.status.as_ref()?;
        (status.last_run.is_some() && status.run_start.is_none()).then_some(rf)
    })
    .await
}

/// A Pod on each node, so every drain has something to evict.
async fn pods_on(world: &World, nodes: &[String]) {
    let pods: Api<Pod> = world.api();
    for (i, node) in nodes.iter().enumerate() {
        pods.create(
            &PostParams::default(),
            &support::bound_pod(&format!("app-{i}"), node, &[("app", "web")]),
        )
        .await
        .expect("create pod");
    }
}

async fn node_names(world: &World, instances: &BTreeSet<String>) -> Vec<String> {
    let nodes: Api<Node> = Api::all(world.client.clone());
    let selector = format!("{SIM_ACCOUNT_LABEL}={}", world.account);
    nodes
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("nodes")
        .items
        .into_iter()
        .filter(|n| instance_of(n).is_some_and(|i| instances.contains(&i)))
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// How many times an Event with `reason` was recorded (repeats of the same
/// Event are a series on one object).
async fn event_count(world: &World, reason: &str) -> i32 {
    let events: Api<k8s_openapi::api::events::v1::Event> = world.api();
    events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

#[tokio::test]
async fn a_worker_group_is_refreshed_with_surplus_and_never_drops_below_desired() {
    let world = World::new("rf-workers").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(
            &PostParams::default(),
            &group("workers", "Worker", &kops.asgs, 3),
        )
        .await
        .expect("create");
    let (manager, _config) = world.start_manager(&[]);
    eventually("3 Ready", WAIT, || async {
        (ready_count(&groups, "workers").await? == 3).then_some(())
    })
    .await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = all_instances(&world, &kops.asgs).await;
    pods_on(&world, &node_names(&world, &original).await).await;
    let (samples, sampler) = sample(&world, &kops.asgs);

    schedule_refresh(&world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let rf = run_finished(&world, "workers").await;
    sampler.abort();
    let samples = samples.lock().expect("samples").clone();
    let status = rf.status.clone().expect("status");
    let last = status.last_run.clone().expect("last run");
    assert_eq!(
        last.result,
        RunResult::Succeeded,
        "{last:?}\n{}",
        manager.logs()
    );
    assert_eq!(last.replaced, 3);
    assert_eq!(status.phase, RefreshPhase::Idle);
    assert_eq!(status.progress.as_deref(), Some("3/3"));

    // Ready never below 3; the surplus (one) was the only capacity added.
    assert!(samples.count > 10, "too few samples: {samples:?}");
    assert_eq!(samples.min_ready, Some(3), "{samples:?}");
    assert_eq!(samples.max_desired, 4, "{samples:?}");

    // Every original node replaced, each instance terminated once, the
    // surplus gone, and the layout back: one per ASG, desired as before.
    let after = world.asg_snapshot(&kops.asgs).await;
    let now_in_service = all_instances(&world, &kops.asgs).await;
    assert!(now_in_service.is_disjoint(&original), "{after:?}");
    let desired = |snap: &[(String, i32, Vec<String>)]| -> Vec<(String, i32)> {
        snap.iter().map(|(n, d, _)| (n.clone(), *d)).collect()
    };
    assert_eq!(desired(&after), desired(&before));
    assert!(after.iter().all(|(_, _, ids)| ids.len() == 1), "{after:?}");
    let states = instances_by_state(&world).await;
    let terminated = states.get("terminated").cloned().unwrap_or_default();
    assert!(original.is_subset(&terminated), "{states:?}");
    assert_eq!(terminated.len(), 4, "3 old nodes and 1 surplus: {states:?}");
    eventually("3 Ready after the run", WAIT, || async {
        (ready_count(&groups, "workers").await? == 3).then_some(())
    })
    .await;
    // Drains evicted the pods; the lock is free again.
    let pods: Api<Pod> = world.api();
    assert!(
        pods.list(&ListParams::default())
            .await
            .expect("pods")
            .items
            .is_empty()
    );
    let g = groups.get("workers").await.expect("group");
    assert_eq!(g.status.and_then(|s| s.operation), None);

    // Observable: Events, metrics, status.
    let reasons = support::event_reasons(&world).await;
    for reason in [
        "RefreshStarted",
        "DrainStarted",
        "NodeReplaced",
        "RefreshFinished",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} in {reasons:?}"
        );
    }
    assert_eq!(event_count(&world, "NodeReplaced").await, 3, "{reasons:?}");
    let metrics = manager.metrics().await.expect("metrics");
    assert!(
        metrics.contains("spot_node_manager_refresh_runs_total{result=\"Succeeded\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("spot_node_manager_node_replacement_duration_seconds_count 3"),
        "{metrics}"
    );
    world.cleanup().await;
}

#[tokio::test]
async fn a_master_group_is_refreshed_one_at_a_time_without_surplus() {
    let world = World::new("rf-masters").await;
    let kops = world.kops_group("master", &ZONES, 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(
            &PostParams::default(),
            &group("masters", "Master", &kops.asgs, 3),
        )
        .await
        .expect("create");
    let (manager, _config) = world.start_manager(&[]);
    eventually("3 masters Ready", WAIT, || async {
        (ready_count(&groups, "masters").await? == 3).then_some(())
    })
    .await;
    let original = all_instances(&world, &kops.asgs).await;
    let (samples, sampler) = sample(&world, &kops.asgs);

    schedule_refresh(&world, "masters", serde_json::json!({})).await;
    let rf = run_finished(&world, "masters").await;
    sampler.abort();
    let samples = samples.lock().expect("samples").clone();
    let last = rf.status.and_then(|s| s.last_run).expect("last run");
    assert_eq!(
        last.result,
        RunResult::Succeeded,
        "{last:?}\n{}",
        manager.logs()
    );
    assert_eq!(last.replaced, 3);
    // One master out at a time, never an extra one.
    assert_eq!(samples.min_ready, Some(2), "{samples:?}");
    assert_eq!(samples.max_desired, 3, "{samples:?}");
    let now_in_service = all_instances(&world, &kops.asgs).await;
    assert!(now_in_service.is_disjoint(&original));
    let terminated = instances_by_state(&world)
        .await
        .remove("terminated")
        .unwrap_or_default();
    assert_eq!(terminated, original, "exactly the old masters terminated");
    world.cleanup().await;
}

#[tokio::test]
async fn a_manager_killed_mid_refresh_resumes_and_terminates_each_node_once() {
    let world = World::new("rf-restart").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(
            &PostParams::default(),
            &group("workers", "Worker", &kops.asgs, 3),
        )
        .await
        .expect("create");
    let (mut manager, _config) = world.start_manager(&[]);
    eventually("3 Ready", WAIT, || async {
        (ready_count(&groups, "workers").await? == 3).then_some(())
    })
    .await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = all_instances(&world, &kops.asgs).await;
    // Pods make each drain take two steps, so the Draining phase lasts.
    pods_on(&world, &node_names(&world, &original).await).await;
    let (samples, sampler) = sample(&world, &kops.asgs);
    schedule_refresh(&world, "workers", serde_json::json!({"surplusNodes": 1})).await;

    // Kill -9 at two different points of the run, restarting each time.
    let mut configs = vec![];
    let refreshers: Api<Refresher> = world.api();
    for phase in [RefreshPhase::WaitingForReplacement, RefreshPhase::Draining] {
        let seen = eventually(&format!("phase {phase:?}"), RUN, || async {
            let s = refreshers.get("workers").await.ok()?.status?;
            (s.phase == phase && s.run_start.is_some()).then_some(s.replaced)
        })
        .await;
        manager.kill();
        eprintln!("killed the manager in {phase:?} after {seen} replacement(s)");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (restarted, config) = world.start_manager(&[]);
        manager = restarted;
        configs.push(config);
    }
    let rf = run_finished(&world, "workers").await;
    sampler.abort();
    let samples = samples.lock().expect("samples").clone();
    let status = rf.status.expect("status");
    let last = status.last_run.clone().expect("last run");
    assert_eq!(
        last.result,
        RunResult::Succeeded,
        "{last:?}\n{}",
        manager.logs()
    );
    assert_eq!(last.replaced, 3);
    assert_eq!(samples.min_ready, Some(3), "{samples:?}");
    // Exactly one termination per old node, plus the one surplus.
    let terminated = instances_by_state(&world)
        .await
        .remove("terminated")
        .unwrap_or_default();
    assert!(original.is_subset(&terminated));
    assert_eq!(terminated.len(), 4, "{terminated:?}");
    let after = world.asg_snapshot(&kops.asgs).await;
    let desired = |snap: &[(String, i32, Vec<String>)]| -> Vec<(String, i32)> {
        snap.iter().map(|(n, d, _)| (n.clone(), *d)).collect()
    };
    assert_eq!(desired(&after), desired(&before));
    world.cleanup().await;
}

#[tokio::test]
async fn a_dry_run_refresh_plans_and_changes_nothing() {
    let world = World::new("rf-dry").await;
    let kops = world.kops_group("nodes", &ZONES[..2], 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(
            &PostParams::default(),
            &group("workers", "Worker", &kops.asgs, 2),
        )
        .await
        .expect("create");
    let (_manager, _config) = world.start_manager(&["--dry-run"]);
    eventually("2 Ready", WAIT, || async {
        (ready_count(&groups, "workers").await? == 2).then_some(())
    })
    .await;
    let before = world.asg_snapshot(&kops.asgs).await;
    schedule_refresh(&world, "workers", serde_json::json!({})).await;
    let rf = run_finished(&world, "workers").await;
    let last = rf.status.and_then(|s| s.last_run).expect("last run");
    assert_eq!(last.result, RunResult::Skipped);
    let reason = last.reason.unwrap_or_default();
    assert!(reason.starts_with("dry run: would add 1 on"), "{reason}");
    assert!(reason.contains("replace 2 node(s)"), "{reason}");
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let g = groups.get("workers").await.expect("group");
    assert_eq!(g.status.and_then(|s| s.operation), None, "no lock taken");
    assert!(
        support::event_reasons(&world)
            .await
            .iter()
            .any(|r| r == "RefreshPlanned")
    );
    world.cleanup().await;
}
