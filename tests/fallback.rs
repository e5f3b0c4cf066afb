//! The on-demand fallback end to end: real apiserver, the rude emulator
//! (launch lag, Pending, scaling activities, a spot shortage per ASG) and
//! the simulated kubelet, the manager as a process.
//!
//! Every spot ASG short at once: after `fallback.after`, exactly the
//! missing count launches on the on-demand fallback and Ready is back at
//! desired; nothing more while the shortage lasts. The shortage ends in one
//! zone but that zone fails again within `returnAfter`: no return. It ends
//! for good: after `returnAfter`, the fallback node is replaced by spot,
//! replacement first (Ready never below desired), the fallback back to 0.

use snm_testkit as support;

use kube::api::Api;
use spot_node_manager::crd::NodeGroup;
use spot_node_manager::crd::nodegroup::GroupState;
use std::time::{Duration, Instant};
use support::refresh::events_with_reason;
use support::{World, ZONES, assert_eventually};

const WAIT: Duration = Duration::from_secs(120);
const FAST: Duration = Duration::from_millis(300);
const NO_CAPACITY: &str = "snm.test/no-capacity";
const AFTER_SECS: u64 = 20;
const RETURN_AFTER_SECS: u64 = 30;

fn group(spot: &[String], fallback: &str) -> NodeGroup {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": "workers"},
        "spec": {
            "role": "Worker",
            "autoScalingGroups": spot.iter().map(|a| serde_json::json!({"name": a})).collect::<Vec<_>>(),
            "desired": 3,
            "replenish": {"cooldown": "1s"},
            "fallback": {
                "autoScalingGroups": [{"name": fallback}],
                "after": format!("{AFTER_SECS}s"),
                "returnAfter": format!("{RETURN_AFTER_SECS}s")
            }
        }
    }))
    .expect("group")
}

/// Samples the group's Ready count every 200 ms until stopped: the lowest
/// seen once `armed` (after Ready is first back at desired).
struct ReadySampler {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<i32>,
}

impl ReadySampler {
    fn start(world: &World) -> ReadySampler {
        let stop = tokio_util::sync::CancellationToken::new();
        let groups: Api<NodeGroup> = world.api();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let mut lowest = i32::MAX;
            while !token.is_cancelled() {
                if let Ok(g) = groups.get("workers").await
                    && let Some(ready) = g.status.and_then(|s| s.ready_nodes)
                {
                    lowest = lowest.min(ready);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            lowest
        });
        ReadySampler { stop, task }
    }

    async fn lowest(self) -> i32 {
        self.stop.cancel();
        self.task.await.expect("sampler")
    }
}

/// Three spot ASGs of one node each, retrying a short launch every 5 s,
/// an empty on-demand ASG, the group with it as its fallback, the
/// simulated kubelet; no manager yet.
struct Setup {
    world: World,
    kops: support::KopsGroup,
    fallback: String,
    groups: Api<NodeGroup>,
    _sim: support::SimGuard,
}

/// Starts the manager (resyncs every 5 s) and waits until the group's 3
/// nodes are Ready on spot.
async fn manager_with_3_ready(
    world: &World,
    groups: &Api<NodeGroup>,
) -> (support::ManagerProcess, tempfile::NamedTempFile) {
    // The cost record accounted every 2 s: a fallback's hours show at once.
    let config = "resyncInterval: 5s\ncostInterval: 2s\n";
    let started = world.start_manager_with(config, &[], &[]);
    assert_eventually("3 Ready on spot", WAIT, || async {
        let ready = groups.get("workers").await.ok()?.status?.ready_nodes?;
        (ready == 3).then_some(())
    })
    .await;
    started
}

impl Setup {
    async fn start(test: &str) -> Setup {
        let world = World::new(test).await;
        let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
        let on_demand = world.kops_group("ondemand", &ZONES[..1], 0, &[]).await;
        let fallback = on_demand.asgs[0].clone();
        for asg in &kops.asgs {
            world.set_timing(asg, "capacity-retry", 5.0).await;
        }
        let _sim = world.start_sim(FAST, FAST);
        let groups: Api<NodeGroup> = world.api();
        world.create_group(&group(&kops.asgs, &fallback)).await;
        Setup {
            world,
            kops,
            fallback,
            groups,
            _sim,
        }
    }
}

async fn desired_of(world: &World, asg: &str) -> i32 {
    world
        .asg_snapshot(&[asg.to_string()])
        .await
        .first()
        .map_or(-1, |(_, desired, _)| *desired)
}

#[tokio::test]
async fn every_spot_asg_short_falls_back_for_the_missing_count_and_returns_to_spot_replacement_first()
 {
    let Setup {
        world,
        kops,
        fallback,
        groups,
        _sim,
    } = Setup::start("fallback").await;
    let (manager, _config) = manager_with_3_ready(&world, &groups).await;
    let ready = || async { groups.get("workers").await.ok()?.status?.ready_nodes };
    assert_eq!(desired_of(&world, &fallback).await, 0);
    let layout = world.asg_snapshot(&kops.asgs).await;

    // Every spot pool is out of capacity, and zone a's node is reclaimed.
    for asg in &kops.asgs {
        world.tag_asg(asg, NO_CAPACITY, "true").await;
    }
    let lost = world.asg_instances(&kops.asgs[0]).await.remove(0);
    world.lose_instance_and_its_node(&lost).await;
    let gone = Instant::now();
    // After `after` of every spot ASG short: the fallback, by one.
    assert_eventually("the fallback raised", WAIT, || async {
        (desired_of(&world, &fallback).await == 1).then_some(())
    })
    .await;
    let raised = gone.elapsed();
    assert!(
        raised >= Duration::from_secs(AFTER_SECS),
        "raised {raised:?} after the loss, before fallback.after"
    );
    assert_eventually("3 Ready with the fallback", WAIT, || async {
        (ready().await? == 3).then_some(())
    })
    .await;
    let restored = gone.elapsed();
    let status = groups
        .get("workers")
        .await
        .expect("group")
        .status
        .expect("status");
    assert_eq!(status.state, Some(GroupState::FallbackOnDemand));
    let condition = spot_node_manager::crd::condition::find(
        &status.conditions,
        spot_node_manager::crd::condition::FALLBACK_ON_DEMAND,
    )
    .expect("condition")
    .clone();
    assert!(
        condition
            .message
            .contains("1 instance(s) on the on-demand fallback"),
        "{}",
        condition.message
    );
    let raised_events = events_with_reason(&world, "FallbackRaised").await;
    assert_eq!(raised_events.len(), 1, "{raised_events:?}");
    // The fallback node's hours are priced at the on-demand rate (the
    // emulator's m5.large, the fallback's type): it saves nothing.
    let cost = assert_eventually("on-demand hours in the record", WAIT, || async {
        let cost = world.group_status("workers").await.cost?;
        (cost.this_month.on_demand_instance_hours > 0.0).then_some(cost)
    })
    .await;
    let f = &cost.this_month;
    let rate = f.on_demand_dollars / f.on_demand_instance_hours;
    assert!((rate - 0.096).abs() < 1e-9, "{rate} an hour: {f:?}");
    assert!(f.spot_instance_hours > 0.0, "{f:?}");
    // The shortage goes on: nothing more is launched anywhere.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(desired_of(&world, &fallback).await, 1);
    assert_eq!(world.asg_instances(&fallback).await.len(), 1);

    // Zone c launches again (its raise lands) but fails again within
    // returnAfter (its new node reclaimed, no capacity): no return.
    let sampler = ReadySampler::start(&world);
    let c = kops.asgs[1].clone();
    let before: Vec<String> = world.asg_instances(&c).await;
    world.untag_asg(&c, NO_CAPACITY, "true").await;
    let landed = assert_eventually("zone c launches", WAIT, || async {
        let now = world.asg_instances(&c).await;
        now.into_iter().find(|id| !before.contains(id))
    })
    .await;
    world.tag_asg(&c, NO_CAPACITY, "true").await;
    world.lose_instance(&landed).await;
    tokio::time::sleep(Duration::from_secs(RETURN_AFTER_SECS + 10)).await;
    assert_eq!(
        desired_of(&world, &fallback).await,
        1,
        "returned though zone c failed again within returnAfter"
    );
    assert!(
        events_with_reason(&world, "ReturnedToSpot")
            .await
            .is_empty()
    );

    // The shortage ends in zone c for good: after returnAfter, the fallback
    // node is replaced by spot, replacement first.
    let fallback_node = world.asg_instances(&fallback).await.remove(0);
    world.untag_asg(&c, NO_CAPACITY, "true").await;
    let back = Instant::now();
    assert_eventually("the fallback back to 0", WAIT, || async {
        (desired_of(&world, &fallback).await == 0
            && world.asg_instances(&fallback).await.is_empty())
        .then_some(())
    })
    .await;
    let returned = back.elapsed();
    assert!(
        returned >= Duration::from_secs(RETURN_AFTER_SECS),
        "returned {returned:?} after spot came back, before returnAfter"
    );
    assert_eventually("3 Ready on spot", WAIT, || async {
        (ready().await? == 3).then_some(())
    })
    .await;
    let lowest = sampler.lowest().await;
    assert!(lowest >= 3, "Ready fell to {lowest} on the way back");
    assert_eq!(
        world
            .terminations(std::slice::from_ref(&fallback), &fallback_node)
            .await,
        1
    );
    let returned_events = events_with_reason(&world, "ReturnedToSpot").await;
    assert_eq!(returned_events.len(), 1, "{returned_events:?}");
    let status = groups
        .get("workers")
        .await
        .expect("group")
        .status
        .expect("status");
    assert_ne!(status.state, Some(GroupState::FallbackOnDemand));
    // The shortage ends everywhere: the original layout comes back.
    for asg in [&kops.asgs[0], &kops.asgs[2]] {
        world.untag_asg(asg, NO_CAPACITY, "true").await;
    }
    let counts = |s: &[(String, i32, Vec<String>)]| {
        s.iter()
            .map(|(n, d, ids)| (n.clone(), *d, ids.len()))
            .collect::<Vec<_>>()
    };
    assert_eventually("the original layout back", WAIT, || async {
        let now = world.asg_snapshot(&kops.asgs).await;
        (counts(&now) == counts(&layout) && ready().await? == 3).then_some(())
    })
    .await;
    assert_eq!(desired_of(&world, &fallback).await, 0);
    eprintln!(
        "FIGURES fallback: raised {:.1}s after the lost node went (after {AFTER_SECS}s), Ready restored {:.1}s after; back to spot {:.1}s after spot launched again (returnAfter {RETURN_AFTER_SECS}s)",
        raised.as_secs_f64(),
        restored.as_secs_f64(),
        returned.as_secs_f64()
    );
    drop(manager);
}

/// Launches the fallback ASG has made (its scaling activities).
async fn launches(world: &World, asg: &str) -> usize {
    world
        .activities(asg)
        .await
        .iter()
        .filter(|(code, d)| code == "Successful" && d.starts_with("Launching"))
        .count()
}

#[tokio::test]
async fn killed_mid_fallback_and_mid_return_it_launches_once_and_forgets_no_fallback_node() {
    let Setup {
        world,
        kops,
        fallback,
        groups,
        _sim,
    } = Setup::start("fallback-restart").await;
    let ready = || async { groups.get("workers").await.ok()?.status?.ready_nodes };
    let replenishers: Api<spot_node_manager::crd::Replenisher> = world.api();
    {
        let (_manager, _config) = manager_with_3_ready(&world, &groups).await;
        // Every spot pool short, zone a's node reclaimed: the manager
        // records since when, then is stopped before the fallback is due.
        for asg in &kops.asgs {
            world.tag_asg(asg, NO_CAPACITY, "true").await;
        }
        let lost = world.asg_instances(&kops.asgs[0]).await.remove(0);
        world.lose_instance(&lost).await;
        assert_eventually("every spot ASG short", WAIT, || async {
            let rp = replenishers.get("workers").await.ok()?.status?;
            rp.short_since.map(|_| ())
        })
        .await;
    }
    assert_eq!(desired_of(&world, &fallback).await, 0);
    // Killed after recording the fallback's raise, then after making it.
    world
        .assert_crashes_at("replenisher:set_desired:persisted")
        .await;
    world
        .assert_crashes_at("replenisher:set_desired:acted")
        .await;
    assert_eq!(desired_of(&world, &fallback).await, 1, "one raise, not two");
    {
        let (_manager, _config) = world.start_manager_with("resyncInterval: 5s\n", &[], &[]);
        assert_eventually("3 Ready with the fallback", WAIT, || async {
            (ready().await? == 3).then_some(())
        })
        .await;
    }
    let fallback_node = world.asg_instances(&fallback).await.remove(0);
    // Spot is back in zone c; the return is killed after recording the
    // fallback node's termination, then after making it.
    let c = kops.asgs[1].clone();
    world.untag_asg(&c, NO_CAPACITY, "true").await;
    world
        .assert_crashes_at("replenisher:terminate:persisted")
        .await;
    world.assert_crashes_at("replenisher:terminate:acted").await;
    let (_manager, _config) = world.start_manager_with("resyncInterval: 5s\n", &[], &[]);
    assert_eventually("back on spot, the fallback at 0", WAIT, || async {
        let rp = replenishers.get("workers").await.ok()?.status?;
        (desired_of(&world, &fallback).await == 0
            && world.asg_instances(&fallback).await.is_empty()
            && ready().await? == 3
            && rp.scale_in.is_none())
        .then_some(())
    })
    .await;
    assert_eq!(launches(&world, &fallback).await, 1, "one fallback launch");
    assert_eq!(
        world
            .terminations(std::slice::from_ref(&fallback), &fallback_node)
            .await,
        1
    );
}

/// Issue 54, hole 5: a worker with a rebalance recommendation
/// (`onRebalanceRecommendation: Replace`) on spot ASGs at max (kops's
/// instance groups with min = max) was never replaced and never counted as
/// Ready again: the replenisher stayed Blocked ("2/3 Ready and no ASG can
/// launch") for good. Now the node serves on, the replenisher is Steady and
/// says why, and nothing is raised anywhere, on demand included.
#[tokio::test]
async fn a_worker_at_risk_on_spot_asgs_at_max_serves_on_and_nothing_falls_back() {
    use spot_node_manager::crd::Replenisher;
    let Setup {
        world,
        kops,
        fallback,
        groups,
        _sim,
    } = Setup::start("fallback-at-risk").await;
    world.set_max(&kops.asgs, 1).await;
    let replace = serde_json::json!({"interruption": {"onRebalanceRecommendation": "Replace"}});
    world.patch_group("workers", replace).await;
    let queue = world.queue("interruptions").await;
    let (manager, _config) = world.start_manager_with(
        "resyncInterval: 5s\n",
        &["--interruption-queue-url", queue.url.as_str()],
        &[],
    );
    let ready = || async { groups.get("workers").await.ok()?.status?.ready_nodes };
    assert_eventually("3 Ready", WAIT, || async {
        (ready().await? == 3).then_some(())
    })
    .await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let victim = before[0].2[0].clone();
    queue
        .send(&support::interruption::rebalance_recommendation(
            &victim,
            chrono::Utc::now(),
        ))
        .await;
    assert_eventually("the recommendation recorded", WAIT, || async {
        let status = groups.get("workers").await.ok()?.status?;
        status
            .nodes
            .iter()
            .any(|n| n.instance_id.as_deref() == Some(victim.as_str()) && n.interruption.is_some())
            .then_some(())
    })
    .await;
    // Well past `fallback.after`: nothing on demand, nothing raised, the
    // node still there and serving.
    tokio::time::sleep(Duration::from_secs(AFTER_SECS + 15)).await;
    assert_eq!(desired_of(&world, &fallback).await, 0, "an on-demand node");
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let replenishers: Api<Replenisher> = world.api();
    let phase = world.replenisher_status("workers").await.phase;
    assert_eq!(
        phase,
        spot_node_manager::crd::replenisher::ReplenishPhase::Steady
    );
    assert_eventually("the replenisher says it serves on", WAIT, || async {
        let status = replenishers.get("workers").await.ok()?.status?;
        status
            .conditions
            .iter()
            .any(|c| {
                c.type_ == "Replenished"
                    && c.message
                        .contains(&format!("{victim} at risk of interruption, serving on"))
            })
            .then_some(())
    })
    .await;
    let status = replenishers
        .get("workers")
        .await
        .expect("replenisher")
        .status
        .expect("status");
    assert_eq!(
        status.phase,
        spot_node_manager::crd::replenisher::ReplenishPhase::Steady,
        "{:?}",
        status.conditions
    );
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Issue 54, hole 6: a fallback ASG whose MinSize is above 0 kept its
/// on-demand nodes for good (each one the return terminated at min was
/// relaunched). The group is refused until it is 0, saying why and how.
#[tokio::test]
async fn a_fallback_asg_with_min_size_above_zero_is_refused_until_it_is_zero() {
    let Setup {
        world,
        fallback,
        groups,
        _sim,
        ..
    } = Setup::start("fallback-min").await;
    let set_min = |min: i32| {
        world
            .aws
            .autoscaling
            .update_auto_scaling_group()
            .auto_scaling_group_name(&fallback)
            .min_size(min)
            .desired_capacity(min)
            .send()
    };
    set_min(1).await.expect("min 1");
    let (manager, _config) = world.start_manager_with("resyncInterval: 2s\n", &[], &[]);
    let spec_valid = || async {
        let status = groups.get("workers").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "SpecValid")
    };
    let refused = assert_eventually("refused", WAIT, || async {
        spec_valid()
            .await
            .filter(|c| c.status == spot_node_manager::crd::condition::ConditionStatus::False)
    })
    .await;
    assert_eq!(refused.reason, "FallbackMinSizeAboveZero", "{refused:?}");
    assert!(
        refused
            .message
            .contains(&format!("{fallback:?} has MinSize 1")),
        "{}",
        refused.message
    );
    set_min(0).await.expect("min 0");
    assert_eventually("valid once it is 0", WAIT, || async {
        spec_valid()
            .await
            .filter(|c| c.status == spot_node_manager::crd::condition::ConditionStatus::True)
    })
    .await;
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Issue 54, hole 6: a spot ASG whose launches work again while its raises
/// still back off can launch, so the fallback is not raised beside it
/// (before, every spot ASG in its backoff counted as unable to launch: the
/// fallback was raised, and once the spot ASG's backoff ended the group
/// had one node too many). Every spot pool out of capacity, two nodes lost;
/// once every spot ASG is excluded, zone a gets capacity back and its own
/// replacement lands while its raises back off (1 min): the group waits
/// for zone a, past `fallback.after`, and the fallback stays at 0, neither
/// raised nor planned and refused by the guard (which refuses it too: with
/// the plan's check undone, the test fails on 3 refused_fallback_raise).
#[tokio::test]
async fn no_fallback_while_a_spot_asg_launches_again_but_its_raises_still_back_off() {
    use spot_node_manager::crd::Replenisher;
    let Setup {
        world,
        kops,
        fallback,
        groups,
        _sim,
    } = Setup::start("fallback-backoff").await;
    let (manager, _config) = manager_with_3_ready(&world, &groups).await;
    let ready = || async { groups.get("workers").await.ok()?.status?.ready_nodes };
    for asg in &kops.asgs {
        world.tag_asg(asg, NO_CAPACITY, "true").await;
    }
    let a = kops.asgs[0].clone();
    for asg in &kops.asgs[..2] {
        let lost = world.asg_instances(asg).await.remove(0);
        world.lose_instance(&lost).await;
    }
    // Every spot ASG left out of raises, backing off.
    let replenishers: Api<Replenisher> = world.api();
    let excluded = || async {
        let status = replenishers.get("workers").await.ok()?.status?;
        Some(status.excluded)
    };
    assert_eventually("every spot ASG backing off", WAIT, || async {
        let excluded = excluded().await?;
        kops.asgs
            .iter()
            .all(|asg| excluded.iter().any(|e| &e.auto_scaling_group == asg))
            .then_some(())
    })
    .await;
    let before = world.asg_instances(&a).await;
    world.untag_asg(&a, NO_CAPACITY, "true").await;
    let landed = assert_eventually("zone a's own replacement", WAIT, || async {
        let now = world.asg_instances(&a).await;
        now.into_iter().find(|id| !before.contains(id))
    })
    .await;
    // The case: zone a launches, and its raises still back off.
    let backing_off = excluded()
        .await
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.auto_scaling_group == a)
        .and_then(|e| e.retry_after)
        .is_some_and(|t| t > chrono::Utc::now());
    assert!(
        backing_off,
        "zone a's raises no longer back off when {landed} landed"
    );
    // Zone a is raised once its backoff ends; the fallback never is.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        assert_eq!(
            desired_of(&world, &fallback).await,
            0,
            "the fallback raised while zone a could launch"
        );
        let spot_ready = ready().await == Some(3) && desired_of(&world, &a).await >= 2;
        if spot_ready {
            break;
        }
        assert!(Instant::now() < deadline, "zone a never raised");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        events_with_reason(&world, "FallbackRaised")
            .await
            .is_empty()
    );
    assert!(world.asg_instances(&fallback).await.is_empty());
    // Nor was it planned and refused by the guard: the plan agrees with it.
    let metrics = manager.metrics().await.expect("the manager's metrics");
    assert!(
        support::manager::reconciles(&metrics, "replenisher") > 0,
        "{metrics}"
    );
    let refused: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains("refused_fallback_raise"))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
    drop(manager);
}
