//! Node repair end to end: real apiserver and controller-manager (its node
//! lifecycle controller marks a silent Node Unknown after 40 s), the rude
//! emulator, and the simulated kubelet, whose `DEAD_TAG` kills a kubelet
//! for good: no Lease, no status, no pod ever let go.
//! The crash test needs the `fault-injection` feature (scripts/test enables it).

use snm_testkit as support;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use spot_node_manager::crd::condition::ConditionStatus;
use spot_node_manager::crd::nodegroup::GroupState;
use spot_node_manager::crd::replenisher::ReplenishPhase;
use spot_node_manager::crd::{NodeGroup, Replenisher};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::sim::{DEAD_TAG, NOT_READY_TAG};
use support::{World, ZONES, assert_eventually};

/// From a kubelet's death: 40 s to Unknown, the timeout, a replacement.
const WAIT: Duration = Duration::from_secs(180);
const FAST: Duration = Duration::from_millis(300);

fn group(name: &str, role: &str, asgs: &[String], extra: serde_json::Value) -> NodeGroup {
    let replenish =
        serde_json::json!({"cooldown": "1s", "joinTimeout": "15m", "unhealthyTimeout": "20s"});
    let mut spec = serde_json::json!({ "replenish": replenish });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    support::refresh::node_group(name, role, asgs, asgs.len(), spec)
}

async fn steady(world: &World, name: &str, count: i32) {
    let groups: Api<NodeGroup> = world.api();
    let replenishers: Api<Replenisher> = world.api();
    assert_eventually(
        &format!("{name} steady with {count} Ready"),
        WAIT,
        || async {
            let rp = replenishers.get(name).await.ok()?;
            let ready = groups.get(name).await.ok()?.status?.ready_nodes?;
            (ready == count && rp.status?.phase == ReplenishPhase::Steady).then_some(())
        },
    )
    .await;
}

/// A group of one node per zone at its desired count, the simulated
/// kubelet and the manager running. It cannot be destructured (it has a
/// Drop): a `let Started { world, .. }` would drop the manager and cancel
/// the simulated kubelet at the end of that statement, and the test would
/// wait for a cluster nobody runs. Borrow its fields instead.
struct Started {
    world: World,
    kops: support::KopsGroup,
    groups: Api<NodeGroup>,
    manager: support::ManagerProcess,
    _config: tempfile::NamedTempFile,
    _sim: support::SimGuard,
}

/// `name` (of `role`: kops "nodes" or "master" ASGs) with `extra` spec
/// fields, steady.
async fn started(test: &str, name: &str, role: &str, extra: serde_json::Value) -> Started {
    let world = World::new(test).await;
    let kops_role = if role == "Master" { "master" } else { "nodes" };
    let kops = world.kops_group(kops_role, &ZONES, 1, &[]).await;
    let sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&group(name, role, &kops.asgs, extra))
        .await;
    let (manager, config) = world.start_manager(&[]);
    steady(&world, name, 3).await;
    Started {
        world,
        kops,
        groups,
        manager,
        _config: config,
        _sim: sim,
    }
}

impl Drop for Started {
    fn drop(&mut self) {}
}

/// (ASG, desired, instances) of an `asg_snapshot`: its layout.
fn counts(snapshot: &[(String, i32, Vec<String>)]) -> Vec<(String, i32, usize)> {
    snapshot
        .iter()
        .map(|(n, d, ids)| (n.clone(), *d, ids.len()))
        .collect()
}

/// The instances in the ASGs now.
async fn instances_of(world: &World, asgs: &[String]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for asg in asgs {
        seen.extend(world.asg_instances(asg).await);
    }
    seen
}

/// A pod on `node` (no controller: nothing recreates it).
async fn pod_on(world: &World, node: &str) {
    let pods: Api<Pod> = world.api();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("app".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            termination_grace_period_seconds: Some(30),
            containers: vec![Container {
                name: "app".into(),
                image: Some("registry.k8s.io/pause:3.9".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod");
}

#[tokio::test]
async fn a_worker_notready_for_good_is_replaced_then_terminated_and_the_layout_comes_back() {
    let s = started("repair-worker", "workers", "Worker", serde_json::json!({})).await;
    let (world, kops, groups, manager) = (&s.world, &s.kops, &s.groups, &s.manager);
    let original = world.asg_snapshot(&kops.asgs).await;
    let before = instances_of(world, &kops.asgs).await;

    let dead = world.asg_instances(&kops.asgs[0]).await.remove(0);
    pod_on(world, &dead).await;
    world.tag_asg(&kops.asgs[0], DEAD_TAG, &dead).await;
    let killed = Instant::now();
    let mut seen = before.clone();
    let mut unhealthy_since_seen = None;
    let mut repairing_seen = false;
    loop {
        assert!(killed.elapsed() < WAIT, "the dead instance still runs");
        let now = instances_of(world, &kops.asgs).await;
        if !now.contains(&dead) {
            break;
        }
        seen.extend(now);
        if let Ok(g) = groups.get("workers").await {
            repairing_seen |= g
                .status
                .as_ref()
                .is_some_and(|s| s.state == Some(GroupState::Repairing));
            let since = g.status.and_then(|s| {
                s.nodes
                    .into_iter()
                    .find(|n| n.name == dead)
                    .and_then(|n| n.unhealthy_since)
            });
            unhealthy_since_seen = unhealthy_since_seen.or(since);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let since = unhealthy_since_seen.expect("status.nodes[].unhealthySince was set");
    let expired = since + chrono::Duration::seconds(20);
    eprintln!(
        "figure: kubelet killed -> dead instance terminated {:.1}s; timeout expired -> terminated {:.1}s (replacement launched and Ready, drain, termination)",
        killed.elapsed().as_secs_f64(),
        (chrono::Utc::now() - expired).num_milliseconds() as f64 / 1000.0
    );
    steady(world, "workers", 3).await;
    seen.extend(instances_of(world, &kops.asgs).await);
    let new: Vec<&String> = seen.difference(&before).collect();
    assert_eq!(new.len(), 1, "exactly one new instance: {new:?}");
    assert!(repairing_seen, "the group's state said Repairing");
    assert_eq!(
        counts(&world.asg_snapshot(&kops.asgs).await),
        counts(&original),
        "the layout is back (1/1/1)"
    );
    assert_eq!(world.terminations(&kops.asgs, &dead).await, 1);
    support::cluster::assert_events(world, &["NodeRepaired"]).await;
    let metrics = manager.assert_metrics().await;
    assert_eq!(
        support::manager::metric(
            &metrics,
            "spot_node_manager_node_repairs_total{outcome=\"repaired\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_notready_blip_shorter_than_the_timeout_launches_and_terminates_nothing() {
    let extra = serde_json::json!({"replenish": {
        "cooldown": "1s", "joinTimeout": "15m", "unhealthyTimeout": "30s"
    }});
    let s = started("repair-blip", "workers", "Worker", extra).await;
    let (world, kops, groups) = (&s.world, &s.kops, &s.groups);
    let before = instances_of(world, &kops.asgs).await;
    let original = world.asg_snapshot(&kops.asgs).await;

    // Nodes older than the timeout: counting a NotReady node's time from
    // its launch would call the blip stuck at once.
    tokio::time::sleep(Duration::from_secs(30)).await;
    // A kubelet restart: NotReady for 15 s, then Ready again.
    let blip = world.asg_instances(&kops.asgs[0]).await.remove(0);
    world.tag_asg(&kops.asgs[0], NOT_READY_TAG, &blip).await;
    assert_eventually("the node NotReady", WAIT, || async {
        let status = groups.get("workers").await.ok()?.status?;
        (status.ready_nodes? == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    world.tag_asg(&kops.asgs[0], NOT_READY_TAG, "").await;
    // Watch past the moment the timeout would have expired.
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        assert_eq!(
            instances_of(world, &kops.asgs).await,
            before,
            "nothing launched, nothing terminated"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    steady(world, "workers", 3).await;
    assert_eq!(world.asg_snapshot(&kops.asgs).await, original);
}

#[tokio::test]
async fn the_circuit_breaker_with_two_of_three_workers_dead_terminates_nothing_and_says_why() {
    // 30%: with the two replacements Ready, 2 of 5 NotReady still opens it.
    let extra = serde_json::json!({"maxNotReadyPercent": 30});
    let s = started("repair-breaker", "workers", "Worker", extra).await;
    let (world, kops) = (&s.world, &s.kops);
    let a = world.asg_instances(&kops.asgs[0]).await.remove(0);
    let b = world.asg_instances(&kops.asgs[1]).await.remove(0);
    world.tag_asg(&kops.asgs[0], DEAD_TAG, &a).await;
    world.tag_asg(&kops.asgs[1], DEAD_TAG, &b).await;
    assert_eventually("RepairAllowed False: the breaker", WAIT, || async {
        let (status, reason, message) = support::cluster::repair_allowed(world, "workers").await?;
        (status == ConditionStatus::False
            && reason == "CircuitBreakerOpen"
            && message.contains(&a)
            && message.contains(&b))
        .then_some(())
    })
    .await;
    // Well past the timeout, both still run.
    let until = Instant::now() + Duration::from_secs(25);
    while Instant::now() < until {
        let all = instances_of(world, &kops.asgs).await;
        assert!(
            all.contains(&a) && all.contains(&b),
            "nothing terminated while the breaker is open"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (_, _, message) = support::cluster::repair_allowed(world, "workers")
        .await
        .expect("condition");
    assert!(message.contains("circuit breaker open"), "{message}");
    support::cluster::assert_events(world, &["RepairBlocked"]).await;
}

#[tokio::test]
async fn a_dead_master_is_terminated_and_replaced_in_its_own_asg() {
    let s = started("repair-master", "masters", "Master", serde_json::json!({})).await;
    let (world, kops) = (&s.world, &s.kops);
    let original = world.asg_snapshot(&kops.asgs).await;
    let dead = world.asg_instances(&kops.asgs[1]).await.remove(0);
    world.tag_asg(&kops.asgs[1], DEAD_TAG, &dead).await;
    assert_eventually("the dead master replaced in its own ASG", WAIT, || async {
        let ids = world.asg_instances(&kops.asgs[1]).await;
        (ids.len() == 1 && ids[0] != dead).then_some(())
    })
    .await;
    steady(world, "masters", 3).await;
    let now = world.asg_snapshot(&kops.asgs).await;
    let desired = |s: &[(String, i32, Vec<String>)]| {
        s.iter()
            .map(|(n, d, _)| (n.clone(), *d))
            .collect::<Vec<_>>()
    };
    assert_eq!(desired(&now), desired(&original), "never surged");
    assert_eq!(world.terminations(&kops.asgs, &dead).await, 1);
}

#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn killed_between_the_recorded_termination_and_the_call_it_terminates_once() {
    let mut s = started("repair-restart", "workers", "Worker", serde_json::json!({})).await;
    let (world, kops) = (&s.world, &s.kops);
    let original = world.asg_snapshot(&kops.asgs).await;
    s.manager.kill();
    let before = instances_of(world, &kops.asgs).await;
    let dead = world.asg_instances(&kops.asgs[0]).await.remove(0);
    world.tag_asg(&kops.asgs[0], DEAD_TAG, &dead).await;

    // Dies right after writing that it terminates the dead node.
    world
        .assert_crashes_at("replenisher:terminate:persisted")
        .await;
    let recorded = world.replenisher_status("workers").await.scale_in;
    let recorded = recorded.expect("the repair is recorded");
    assert!(recorded.repair && recorded.terminating.is_some() && recorded.node == dead);
    assert!(
        instances_of(world, &kops.asgs).await.contains(&dead),
        "not terminated before the crash"
    );

    let (_manager, _config) = world.start_manager(&[]);
    assert_eventually("the dead instance terminated", WAIT, || async {
        (!instances_of(world, &kops.asgs).await.contains(&dead)).then_some(())
    })
    .await;
    steady(world, "workers", 3).await;
    assert_eq!(world.terminations(&kops.asgs, &dead).await, 1);
    let after = instances_of(world, &kops.asgs).await;
    assert_eq!(after.difference(&before).count(), 1, "one new instance");
    assert_eq!(
        counts(&world.asg_snapshot(&kops.asgs).await),
        counts(&original)
    );
}

#[tokio::test]
async fn a_refresh_that_meets_a_node_dead_during_the_run_replaces_it_instead_of_aborting() {
    use spot_node_manager::crd::Refresher;
    use spot_node_manager::crd::refresher::RunResult;
    use support::refresh::{all_instances, node_names, pods_on, run_finished, schedule_refresh};
    use support::steady::SteadyGroup;
    let steady = SteadyGroup::workers("repair-refresh").start().await;
    let (world, kops) = (&steady.world, &steady.kops);
    let replenish = serde_json::json!({"replenish": {"unhealthyTimeout": "20s"}});
    world.patch_group("workers", replenish).await;
    let original = all_instances(world, &kops.asgs).await;
    // Pods on every node: a dead kubelet never lets its pod go.
    pods_on(world, &node_names(world, &original).await).await;
    // drainTimeoutAction Abort (the default); a drain timeout long enough
    // for the node to turn unhealthy (40 s to Unknown, then 20 s) first.
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "drainTimeout": "90s"}),
    )
    .await;
    let refreshers: Api<Refresher> = world.api();
    assert_eventually("the run started", WAIT, || async {
        let s = refreshers.get("workers").await.ok()?.status?;
        s.run_start.map(|_| ())
    })
    .await;
    // One old node's kubelet dies as the run begins.
    let dead = world.asg_instances(&kops.asgs[2]).await.remove(0);
    world.tag_asg(&kops.asgs[2], DEAD_TAG, &dead).await;

    let rf = run_finished(world, "workers").await;
    let last = rf
        .status
        .and_then(|s| s.last_run)
        .expect("the run's result");
    assert_eq!(
        last.result,
        RunResult::Succeeded,
        "{last:?}\n{}",
        steady.manager.logs()
    );
    assert_eq!(
        last.replaced, 3,
        "every old node replaced, the dead one too"
    );
    assert!(!all_instances(world, &kops.asgs).await.contains(&dead));
    assert_eq!(world.terminations(&kops.asgs, &dead).await, 1);
    support::cluster::assert_events(world, &["NodeRepaired"]).await;
}

#[tokio::test]
async fn the_preview_says_when_a_dead_worker_is_repaired_and_it_is_then() {
    let s = started("pv-repair", "workers", "Worker", serde_json::json!({})).await;
    let (world, kops, groups) = (&s.world, &s.kops, &s.groups);
    let dead = world.asg_instances(&kops.asgs[0]).await.remove(0);
    world.tag_asg(&kops.asgs[0], DEAD_TAG, &dead).await;
    // The preview, asked as a user would while the node is NotReady: the
    // repair of that node, at its unhealthySince + unhealthyTimeout (20s).
    let said = assert_eventually("the preview to say the repair", WAIT, || async {
        let ours = world.preview_of("workers").await?;
        let repair = ours["repairs"].as_array()?.first()?.clone();
        (repair["node"] == dead.as_str()).then_some(repair)
    })
    .await;
    let at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(said["at"].clone()).expect("a time");
    assert!(said["heldBy"].is_null(), "{said}");
    let nodes = world.group_status("workers").await.nodes;
    let since = nodes.into_iter().find(|n| n.name == dead);
    let since = since
        .and_then(|n| n.unhealthy_since)
        .expect("unhealthySince");
    assert_eq!(at, since + chrono::Duration::seconds(20));
    // The NodeGroup's NEXT says it too, from the Replenisher's own plan
    // (its status.next), at the same second.
    let line = assert_eventually("NEXT to say the repair", WAIT, || async {
        let next = groups.get("workers").await.ok()?.status?.next?;
        next.starts_with(&format!("repair {dead} ")).then_some(next)
    })
    .await;
    assert!(
        line.contains(&at.to_rfc3339()) || line.ends_with(" now"),
        "{line}"
    );
    // The repair starts at that time (its replacement raised), within a
    // resync (2 s) and a reconcile of it, not before.
    let raised = assert_eventually("the replacement raised", WAIT, || async {
        world
            .aws_actions()
            .await
            .into_iter()
            .find(|(_, a)| a == "SetDesiredCapacity")
            .map(|(t, _)| t)
    })
    .await;
    let late = raised - at.timestamp_millis() as f64 / 1000.0;
    eprintln!("figure: the previewed repair time to the replacement raised: {late:.2}s");
    assert!(late >= -0.5, "raised {late:.2}s before the previewed time");
    assert!(
        late <= 2.0 + 3.0,
        "raised {late:.2}s after the previewed time"
    );
    steady(world, "workers", 3).await;
    assert_eq!(world.terminations(&kops.asgs, &dead).await, 1);
}
