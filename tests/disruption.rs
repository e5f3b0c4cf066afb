//! Disruption controls end to end (real apiserver + the rude emulator +
//! simulated kubelet, the manager as a process): one control-plane node at
//! a time across Master groups, maintenance windows (a run waiting for one,
//! a run whose window closes), do-not-disrupt.

use snm_testkit as support;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use spot_node_manager::crd::condition::{ConditionStatus, SCHEDULE_IN_WINDOW};
use spot_node_manager::crd::{NodeGroup, Refresher};
use std::collections::BTreeSet;
use std::time::Duration;
use support::recorders::{BarePods, Cordons};
use support::refresh::*;
use support::steady::*;
use support::windows::*;
use support::{DO_NOT_DISRUPT, assert_eventually};

#[tokio::test]
async fn master_groups_with_the_same_schedule_never_replace_two_masters_at_once() {
    // kops's usual layout: one master instance group (one ASG) per zone,
    // each its own NodeGroup with desired 1.
    let g = SteadyGroup::masters("dc-masters")
        .one_group_per_asg()
        .start()
        .await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let original = g.baseline().await.original;
    let sampler = g.sample(3).await;
    let cordons = Cordons::watch(world, &kops.asgs);
    // Due together, far enough ahead for a loaded machine's manager to
    // see all three first (a one-off time seen after it never fires).
    let at = once_in(12);
    for i in 0..3 {
        schedule_refresh(
            world,
            &format!("masters-{i}"),
            serde_json::json!({"schedule": at, "masterSettleTime": "1s"}),
        )
        .await;
    }
    // The three runs, due together, each replaced its master, one group's
    // master out at a time.
    each_replaced_one_never_two_out(world, manager, "masters", cordons).await;
    let samples = sampler.stop().await;
    // Never two masters out: 3 masters, at least 2 Ready throughout.
    assert_eq!(samples.min_ready(), 2, "{samples:?}");
    let now_in_service = all_instances(world, &kops.asgs).await;
    assert!(now_in_service.is_disjoint(&original));
}

#[tokio::test]
async fn a_refresh_due_outside_every_window_waits_and_starts_when_one_opens() {
    let g = three_workers("dc-window").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let original = all_instances(world, &kops.asgs).await;
    // A window on 1 January only: closed now.
    set_windows(
        groups,
        serde_json::json!([{"schedule": "0 0 1 1 *", "duration": "1m"}]),
    )
    .await;
    schedule_refresh(world, "workers", serde_json::json!({})).await;
    let waiting = refresher_saying(world, "workers", "outside the maintenance windows").await;
    assert!(
        waiting
            .window
            .as_deref()
            .is_some_and(|w| w.starts_with("Closed until"))
    );
    let condition = waiting
        .conditions
        .iter()
        .find(|c| c.type_ == SCHEDULE_IN_WINDOW)
        .expect("the window condition");
    assert_eq!(condition.status, ConditionStatus::False, "{condition:?}");
    assert_eq!(condition.reason, "ScheduleOutsideWindows");
    // It stays waiting: nothing started, nothing skipped, nothing touched.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let status = refresher_status(world, "workers").await;
    assert_eq!(status.run_start, None, "{:?}", status.message);
    assert!(
        status.last_run.is_none(),
        "not skipped: {:?}",
        status.last_run
    );
    assert_eq!(all_instances(world, &kops.asgs).await, original);
    // A window open now: the run starts and replaces every node.
    set_windows(
        groups,
        serde_json::json!([{"schedule": "* * * * *", "duration": "1h"}]),
    )
    .await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.map(|r| r.replaced), Some(3));
    assert!(
        status
            .window
            .as_deref()
            .is_some_and(|w| w.starts_with("Open until"))
    );
}

#[tokio::test]
async fn a_run_whose_window_closes_waits_with_its_surplus_then_resumes() {
    let g = three_workers("dc-closes").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let Baseline { before, original } = g.baseline().await;
    set_windows(groups, windows(OPEN)).await;
    close_the_window_mid_run(world, groups, serde_json::json!({})).await;
    let waiting = refresher_saying(world, "workers", "keeping its surplus").await;
    assert!(waiting.run_start.is_some(), "{:?}", waiting.message);
    assert!((1..3).contains(&waiting.replaced), "{waiting:?}");
    // The node replaced just before the run began to wait leaves its ASG
    // once its termination completes (the wait is written right after the
    // call): desired 3 + surplus 1 remain.
    let held = assert_eventually("the replaced node gone", WAIT, || async {
        let all = all_instances(world, &kops.asgs).await;
        (all.len() == 4).then_some(all)
    })
    .await;
    // It stays so: the surplus kept Ready, nothing else taken.
    let sampler = g.sample(3).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let samples = sampler.stop().await;
    assert_eq!(all_instances(world, &kops.asgs).await, held);
    assert_eq!(samples.min_ready(), 4, "desired 3 + surplus 1: {samples:?}");
    assert_eq!(samples.max_desired(), 4, "{samples:?}");
    let still = refresher_status(world, "workers").await;
    assert_eq!(still.replaced, waiting.replaced);
    assert_eq!(still.run_start, waiting.run_start);
    // The next window: the run resumes and ends as if never paused.
    set_windows(groups, windows(OPEN)).await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.map(|r| r.replaced), Some(3));
    assert!(
        all_instances(world, &kops.asgs)
            .await
            .is_disjoint(&original)
    );
    let after = world.asg_snapshot(&kops.asgs).await;
    assert_eq!(desired_counts(&after), desired_counts(&before));
}

#[tokio::test]
async fn a_run_whose_window_closes_with_scale_down_sets_itself_aside_across_a_restart() {
    let g = three_workers("dc-set-aside").await;
    let Baseline { before, original } = g.baseline().await;
    let mut manager = g.manager;
    let (world, kops, groups) = (&g.world, &g.kops, &g.groups);
    let disruption = serde_json::json!({"windows": windows(OPEN), "onWindowClose": "ScaleDown"});
    world
        .patch_group("workers", serde_json::json!({ "disruption": disruption }))
        .await;
    close_the_window_mid_run(world, groups, serde_json::json!({})).await;
    let pending = refresher_until(
        world,
        "workers",
        "the run set aside",
        WAIT,
        |status| match status.run_start {
            None => status.pending_run,
            Some(_) => None,
        },
    )
    .await;
    assert!((1..3).contains(&pending.replaced), "{pending:?}");
    assert_eq!(pending.total, 3);
    assert_eq!(pending.remaining.len() as i32, 3 - pending.replaced);
    // The surplus is gone: the layout is the one before the run.
    let set_aside = world.asg_snapshot(&kops.asgs).await;
    assert_eq!(desired_counts(&set_aside), desired_counts(&before));
    // (The surplus instance leaves its ASG once its termination completes.)
    assert_eventually("the surplus instance gone", WAIT, || async {
        (all_instances(world, &kops.asgs).await.len() == 3).then_some(())
    })
    .await;
    assert_event(world, "RefreshSetAside").await;
    // Killed while it waits: the restarted manager keeps waiting.
    let _config2 = restart_manager(world, &mut manager).await;
    let held = all_instances(world, &kops.asgs).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let status = refresher_status(world, "workers").await;
    assert_eq!(
        status.pending_run.as_ref(),
        Some(&pending),
        "{:?}",
        status.message
    );
    assert_eq!(status.run_start, None);
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("left of a run set aside")),
        "{:?}",
        status.message
    );
    assert_eq!(all_instances(world, &kops.asgs).await, held);
    // The next window: it resumes with a new surplus and ends as one run.
    set_windows(groups, windows(OPEN)).await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, &manager);
    let last = status.last_run.expect("last run");
    assert_eq!((last.replaced, last.started), (3, pending.started));
    assert_eq!(status.pending_run, None);
    assert_event(world, "RefreshResumed").await;
    let terminated = terminated_instances(world).await;
    assert!(original.is_subset(&terminated), "{terminated:?}");
    assert_eq!(
        terminated.len(),
        5,
        "3 old nodes and 2 surplus nodes, once each: {terminated:?}"
    );
    let after = world.asg_snapshot(&kops.asgs).await;
    assert_eq!(desired_counts(&after), desired_counts(&before));
}

#[tokio::test]
async fn worker_groups_under_a_limit_of_one_run_one_after_another_across_a_restart() {
    let g = SteadyGroup::workers("dc-workers")
        .one_group_per_asg()
        .start()
        .await;
    let original = g.baseline().await.original;
    let mut manager = g.manager;
    let (world, kops) = (&g.world, &g.kops);
    let cordons = Cordons::watch(world, &kops.asgs);
    // Due together, far enough ahead for a loaded machine's manager to
    // see all three first (a one-off time seen after it never fires).
    let at = once_in(12);
    for i in 0..3 {
        schedule_refresh(
            world,
            &format!("workers-{i}"),
            serde_json::json!({"schedule": at, "surplusNodes": 1}),
        )
        .await;
    }
    // One runs; the others wait for the slot, without their groups' locks.
    let refreshers: Api<Refresher> = world.api();
    let waiting = assert_eventually("a run under way and one waiting", WAIT, || async {
        let mut running = 0;
        let mut waiting = None;
        for i in 0..3 {
            let status = refreshers.get(&format!("workers-{i}")).await.ok()?.status?;
            if status.run_start.is_some() {
                running += 1;
            } else if status
                .message
                .as_deref()
                .is_some_and(|m| m.contains("waiting for a disruption slot"))
            {
                waiting = Some(i);
            }
        }
        (running == 1).then_some(waiting).flatten()
    })
    .await;
    // A lock taken in a race is given back by the executor just after the
    // wait is written (persist, then act): within moments, and then for
    // good while it waits.
    let groups = world.api::<NodeGroup>();
    let lock = || async {
        let group = groups.get(&format!("workers-{waiting}")).await.ok()?;
        group.status.map(|s| s.operation)
    };
    assert_eventually(
        "the waiting group's lock given back",
        Duration::from_secs(15),
        || async { lock().await.filter(Option::is_none) },
    )
    .await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let held = lock().await.expect("the group");
        let (mut started, mut running_elsewhere) = (false, false);
        for i in 0..3 {
            let Ok(rf) = refreshers.get(&format!("workers-{i}")).await else {
                continue;
            };
            let runs = rf.status.as_ref().is_some_and(|s| s.run_start.is_some());
            match i == waiting {
                true => started = runs,
                false => running_elsewhere |= runs,
            }
        }
        // Until its own run starts (the slot came free), it holds none. The
        // executor takes the lock just before the run's start is written,
        // so a lock seen once the other run has ended is that start's (seen
        // in the suite: the first run ended within these five seconds).
        assert!(
            started || held.is_none() || !running_elsewhere,
            "a waiting group holds its lock while another group runs: {held:?}"
        );
    }
    // Killed while one runs and others wait: the restarted manager resumes.
    let _config2 = restart_manager(world, &mut manager).await;
    each_replaced_one_never_two_out(world, &manager, "workers", cordons).await;
    // Each old node terminated once, and the slot given back.
    let now_in_service = all_instances(world, &kops.asgs).await;
    assert!(now_in_service.is_disjoint(&original));
    // Given back by the step after the run's end (a run is recorded as
    // finished before its slot is released): soon, not at once.
    support::windows::assert_slots_given_back(world).await;
}

#[tokio::test]
async fn a_refresh_leaves_protected_nodes_alone_and_says_why() {
    let g = SteadyGroup::workers("dc-protected")
        .per_asg(2)
        .start()
        .await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let original = g.baseline().await.original;
    let mut names = node_names(world, &original).await;
    names.sort();
    assert_eq!(names.len(), 6);
    let (node_annotated, pod_annotated, cordoned, bare, free) =
        (&names[0], &names[1], &names[2], &names[3], &names[4..]);
    world
        .annotate_node(node_annotated, DO_NOT_DISRUPT, Some("true"))
        .await;
    // Cordoned by someone else (kubectl cordon).
    world.cordon(cordoned).await;
    // Controlled pods everywhere; one of them annotated (app-1, on the
    // second node); one bare pod.
    pods_on(world, &names).await;
    world
        .annotate_pod("app-1", DO_NOT_DISRUPT, Some("true"))
        .await;
    let pods: Api<Pod> = world.api();
    pods.create(&Default::default(), &support::bound_pod("bare", bare, &[]))
        .await
        .expect("bare pod");

    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.as_ref().map(|r| r.replaced), Some(2));
    let skipped: std::collections::BTreeMap<String, String> = status
        .skipped
        .iter()
        .map(|s| (s.node.clone(), s.reason.clone()))
        .collect();
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert!(skipped[node_annotated].contains("the Node is annotated"));
    assert!(skipped[pod_annotated].contains("is annotated nodemanager.dev/do-not-disrupt"));
    assert!(skipped[cordoned].contains("cordoned by someone else"));
    assert!(skipped[bare].contains("has no controller"));
    // The protected nodes are still there, untouched; the foreign cordon kept.
    let after = node_names(world, &all_instances(world, &kops.asgs).await).await;
    let cordons = world.cordoned_nodes().await.expect("nodes");
    for name in [node_annotated, pod_annotated, cordoned, bare] {
        assert!(after.contains(name), "{name} was removed");
        assert_eq!(cordons.contains(name), name == cordoned, "{name}");
    }
    for name in free {
        assert!(!after.contains(name), "{name} was not replaced");
    }
    assert_event(world, "NodesSkipped").await;
}

/// Groups `<prefix>-0..2` each replaced their one node, and no two groups'
/// nodes were out at once: at every cordon, at most one Node of an
/// in-service instance cordoned (each group drains one node at a time).
/// The slot bounds disruptions, not runs (issue 68): a run waiting on time
/// at a quiet point gives it back, so runs may overlap; their drains may
/// not.
async fn each_replaced_one_never_two_out(
    world: &support::World,
    manager: &support::ManagerProcess,
    prefix: &str,
    cordons: Cordons,
) {
    for i in 0..3 {
        let rf = run_finished(world, &format!("{prefix}-{i}")).await;
        let status = assert_run_succeeded(rf, manager);
        assert_eq!(status.last_run.expect("last run").replaced, 1);
    }
    let seen = cordons.stop();
    // Each group's node drained, at least (workers: its surplus too).
    assert!(seen.cordons >= 3, "{seen:?}");
    assert_eq!(
        seen.most_out,
        1,
        "two groups' nodes out at once: {seen:?}\n{}",
        manager.logs()
    );
}

#[tokio::test]
async fn the_replenisher_takes_back_an_unprotected_surplus_node_and_keeps_protected_ones() {
    use spot_node_manager::crd::Replenisher;
    let g = SteadyGroup::workers("dc-rp-protected")
        .zones(&support::ZONES[..1])
        .per_asg(3)
        .start()
        .await;
    let (world, groups) = (&g.world, &g.groups);
    let asg = g.kops.asgs[0].clone();
    world.set_min(&asg, 1).await;
    let replenish = serde_json::json!({"cooldown": "1s", "joinTimeout": "15m"});
    world
        .patch_group("workers", serde_json::json!({ "replenish": replenish }))
        .await;
    // Oldest first (launch time, then name): a scale-in prefers the newest,
    // so only the oldest is left unprotected.
    let names = nodes_oldest_first(groups, "workers").await;
    assert_eq!(names.len(), 3);
    let oldest = names[0].clone();
    for name in &names[1..] {
        world
            .annotate_node(name, DO_NOT_DISRUPT, Some("true"))
            .await;
    }
    let set_desired = |n: i32| world.patch_group("workers", serde_json::json!({"desired": n}));
    // One surplus: the unprotected node goes.
    set_desired(2).await;
    let in_asg = || async {
        let ids = world.asg_instances(&asg).await.into_iter().collect();
        let mut left = node_names(world, &ids).await;
        left.sort();
        left
    };
    assert_eventually("the unprotected node removed", WAIT, || async {
        let left = in_asg().await;
        (left.len() == 2 && !left.contains(&oldest)).then_some(())
    })
    .await;
    // One more surplus, only protected nodes left: kept, and said why.
    set_desired(1).await;
    let replenishers: Api<Replenisher> = world.api();
    assert_eventually("the surplus kept", WAIT, || async {
        let rp = replenishers.get("workers").await.ok()?;
        let message = serde_json::to_string(&rp.status?.conditions).ok()?;
        message
            .contains("the nodes that could go are protected")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(world.asg_instances(&asg).await.len(), 2, "nothing removed");
    // The protection lifted from one: it goes.
    world.annotate_node(&names[1], DO_NOT_DISRUPT, None).await;
    assert_eventually("the node no longer protected removed", WAIT, || async {
        (in_asg().await == vec![names[2].clone()]).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_surplus_a_refresh_removes_is_never_a_node_with_a_pod_no_controller_recreates() {
    let g = SteadyGroup::workers("dc-surplus-bare").start().await;
    let (world, manager) = (&g.world, &g.manager);
    let original = g.baseline().await.original;
    // Whatever a user starts by hand (`kubectl run`) lands on the new
    // nodes: each new node, once Ready, gets a bare pod.
    let placer = BarePods::on_new_nodes(world, &original);
    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let rf = run_finished(world, "workers").await;
    let placed = placer.stop();
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.as_ref().map(|r| r.replaced), Some(3));
    let pods: Api<Pod> = world.api();
    assert_eq!(placed.len(), 4, "a bare pod on each new node: {placed:?}");
    // Every bare pod is still there: the surplus was kept, not drained.
    for name in &placed {
        let pod = pods.get_opt(name).await.expect("get pod");
        assert!(
            pod.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
            "{name} was evicted: a pod no controller recreates is lost"
        );
    }
    assert!(
        manager
            .logs()
            .contains("surplus kept on protected nodes in"),
        "the run never said why its surplus stayed"
    );
}

/// Issue 68, hole 2: a removal already under way resumes with its rules
/// asked again. The replenisher's scale-in of a surplus node is held by a
/// budget; the group is suspended (lock and slot given back, the removal
/// kept), the node is protected meanwhile, and the group resumed with the
/// budget lifted. The resumed removal asks the rule book as a new one
/// would: the node is protected, so it is given back (uncordoned, never
/// terminated) and another surplus node goes instead. At 170b89f the
/// resumed drain went on with the lock alone and terminated the protected
/// node.
#[tokio::test]
async fn a_scale_in_resumed_after_a_suspend_asks_its_rules_again() {
    use spot_node_manager::crd::Replenisher;
    use spot_node_manager::crd::replenisher::ReplenishPhase;
    let g = SteadyGroup::workers("dc-rp-resume")
        .zones(&support::ZONES[..1])
        .per_asg(3)
        .start()
        .await;
    let (world, groups, manager) = (&g.world, &g.groups, &g.manager);
    let asg = g.kops.asgs[0].clone();
    world.set_min(&asg, 1).await;
    let replenish = serde_json::json!({"cooldown": "1s", "joinTimeout": "15m"});
    world
        .patch_group("workers", serde_json::json!({ "replenish": replenish }))
        .await;
    let names = nodes_oldest_first(groups, "workers").await;
    assert_eq!(names.len(), 3);
    // A pod on every node that a budget holds: a drain waits.
    labelled_pods_on(world, &names, "held", &[("app", "protected")]).await;
    support::create_pdb(world, 3).await;
    support::assert_pdb_allows(world, 0).await;
    world
        .patch_group("workers", serde_json::json!({"desired": 2}))
        .await;
    let replenishers: Api<Replenisher> = world.api();
    let target = assert_eventually("a scale-in under way", WAIT, || async {
        let status = replenishers.get("workers").await.ok()?.status?;
        status.scale_in.map(|t| t.node)
    })
    .await;
    // Recorded first, then cordoned by its first drain step.
    assert_eventually("the target cordoned", WAIT, || async {
        world
            .cordoned_nodes()
            .await?
            .contains(&target)
            .then_some(())
    })
    .await;

    world
        .patch_group("workers", serde_json::json!({"suspend": true}))
        .await;
    assert_eventually("the replenisher paused", WAIT, || async {
        let status = replenishers.get("workers").await.ok()?.status?;
        (status.phase == ReplenishPhase::Paused && status.scale_in.is_some()).then_some(())
    })
    .await;
    world
        .annotate_node(&target, DO_NOT_DISRUPT, Some("true"))
        .await;
    // A drain would now finish (the budget's status recomputed first: a
    // drain still held would wait out its 10-minute timeout).
    support::set_min_available(world, 0).await;
    support::assert_pdb_allows(world, 3).await;
    world
        .patch_group("workers", serde_json::json!({"suspend": false}))
        .await;

    let in_asg = || async {
        let ids = world.asg_instances(&asg).await.into_iter().collect();
        node_names(world, &ids).await
    };
    let removed = tokio::time::timeout(WAIT, async {
        while in_asg().await.len() != 2 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(
        removed.is_ok(),
        "another surplus node never removed\n{}",
        manager.logs()
    );
    let left = in_asg().await;
    assert!(
        left.contains(&target),
        "the protected node {target} was removed: {left:?}\n{}",
        manager.logs()
    );
    let cordoned = world.cordoned_nodes().await.expect("nodes");
    assert!(
        !cordoned.contains(&target),
        "{target} was not given back: {cordoned:?}"
    );
    let said: Vec<String> = events_with_reason(world, "ScaleInAbandoned")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    assert!(
        said.iter()
            .any(|n| n.contains(&format!("removal of {target} put off")) && n.contains("protected")),
        "the resumed removal never said why it was given back: {said:?}"
    );
}

/// Issue 68, hole 7: a due run waiting for its window meets a blocker
/// that passes before the window opens (a node NotReady for a while). It
/// is not skipped: it starts when the window opens, as its preview says.
/// At 170b89f the blocker skipped it for good.
#[tokio::test]
async fn a_due_run_waiting_for_its_window_is_not_skipped_by_a_passing_blocker() {
    use support::sim::NOT_READY_TAG;
    let g = three_workers("dc-window-blip").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    set_windows(
        groups,
        serde_json::json!([{"schedule": "0 0 1 1 *", "duration": "1m"}]),
    )
    .await;
    schedule_refresh(world, "workers", serde_json::json!({})).await;
    refresher_saying(world, "workers", "outside the maintenance windows").await;
    // A node NotReady while the run waits, seen by the manager, then back.
    let asg = kops.asgs[0].clone();
    let sick = world.asg_instances(&asg).await.remove(0);
    world.tag_asg(&asg, NOT_READY_TAG, &sick).await;
    assert_eventually("the group sees 2 of 3 Ready", WAIT, || async {
        (ready_count(groups, "workers").await? == 2).then_some(())
    })
    .await;
    // A few reconciles with the blocker in place.
    tokio::time::sleep(Duration::from_secs(5)).await;
    world.tag_asg(&asg, NOT_READY_TAG, "").await;
    assert_eventually("3 Ready again", WAIT, || async {
        (ready_count(groups, "workers").await? == 3).then_some(())
    })
    .await;
    let status = refresher_status(world, "workers").await;
    assert!(
        status.last_run.is_none(),
        "the due run was skipped: {:?}",
        status.last_run
    );
    set_windows(
        groups,
        serde_json::json!([{"schedule": "* * * * *", "duration": "1h"}]),
    )
    .await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.map(|r| r.replaced), Some(3));
}

/// Issue 68, item 3 (nothing held while a path waits): under a limit of
/// one, group workers-0's run waits on its only node, protected
/// (do-not-disrupt, `doNotDisruptTimeout` 24 h). It gives the disruption
/// slot back while it waits, keeping its lock and its surplus, so
/// workers-1's run, due meanwhile, replaces its node and ends. Once the
/// protection is lifted, workers-0's run takes the slot again and ends.
/// No two groups' nodes are out at once. Before, workers-1 waited for the
/// slot for the whole 24 h.
#[tokio::test]
async fn a_run_waiting_on_a_protected_node_lets_another_groups_run_go() {
    let g = SteadyGroup::workers("dc-slot-wait")
        .one_group_per_asg()
        .start()
        .await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let cordons = Cordons::watch(world, &kops.asgs);
    world
        .patch_group(
            "workers-0",
            serde_json::json!({"disruption": {"doNotDisruptTimeout": "24h"}}),
        )
        .await;
    let protected_ids = world
        .asg_instances(&kops.asgs[0])
        .await
        .into_iter()
        .collect();
    let protected = node_names(world, &protected_ids).await;
    assert_eq!(protected.len(), 1, "{protected:?}");
    world
        .annotate_node(&protected[0], DO_NOT_DISRUPT, Some("true"))
        .await;
    schedule_refresh(world, "workers-0", serde_json::json!({"surplusNodes": 1})).await;
    refresher_saying(world, "workers-0", "waiting for protected node(s)").await;

    schedule_refresh(world, "workers-1", serde_json::json!({"surplusNodes": 1})).await;
    let rf = run_finished(world, "workers-1").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.map(|r| r.replaced), Some(1));
    // workers-0's run still waits, with its lock and its surplus.
    let waiting = refresher_status(world, "workers-0").await;
    assert!(waiting.run_start.is_some(), "{waiting:?}");
    assert!(!waiting.surplus.is_empty(), "surplus kept: {waiting:?}");
    assert!(
        waiting
            .message
            .as_deref()
            .is_some_and(|m| m.contains("waiting for protected node(s)")),
        "{:?}",
        waiting.message
    );
    let lock = world
        .api::<NodeGroup>()
        .get("workers-0")
        .await
        .expect("group")
        .status
        .and_then(|s| s.operation);
    assert!(lock.is_some(), "the waiting run gave its lock back");

    world
        .annotate_node(&protected[0], DO_NOT_DISRUPT, None)
        .await;
    let rf = run_finished(world, "workers-0").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.map(|r| r.replaced), Some(1));
    let seen = cordons.stop();
    assert!(seen.cordons >= 2, "{seen:?}");
    assert_eq!(seen.most_out, 1, "two groups' nodes out at once: {seen:?}");
    support::windows::assert_slots_given_back(world).await;
}

/// Issue 68, hole 6: a run's surplus removal asks the masters' rule, and a
/// master run's surplus is the newest master of its place (no etcd
/// member), never a NotReady or drifted one first. A Master group over
/// three ASGs is refreshed. Once the run has replaced its first master
/// (place P: the new one, A', is P's etcd member), `kops update cluster`
/// runs and the user raises P to two: the master launched beside (X) is
/// current and A' drifted; X never serves while A' holds P's etcd volume.
/// Once the last planned master is terminated, the new master of the third
/// place (B') stops serving (its control-plane pods not Ready; its Node
/// Ready, so no Ready floor holds anything) and A' turns NotReady (its
/// Node only: its etcd may well serve on). While B' is down A' is never
/// terminated (X, no member, may go: etcd loses nothing); A' comes back,
/// then B', and the layout is back with A' kept. At 170b89f the surplus
/// took a NotReady master first, free of the masters' rule: A' (shown by
/// the variant below, where X serves; here 170b89f's run waits for X's
/// control plane and never reaches its last master).
#[tokio::test]
async fn a_master_runs_surplus_waits_while_another_master_is_down() {
    master_surplus_while_another_is_down("dc-master-surplus", true).await;
}

/// Hole 6 where X serves beside A' (a control plane that is not kops's: no
/// etcd volume per place). At 170b89f this is where the hole shows: the
/// run's surplus removal took A', NotReady, and terminated it while B' was
/// down ("P's member ... went while B' ... was down"; session 48's note).
/// On kops's plane 170b89f fails before: its run never reaches its last
/// master.
#[tokio::test]
async fn a_master_runs_surplus_waits_while_another_master_is_down_where_x_serves() {
    master_surplus_while_another_is_down("dc-master-surplus-kind", false).await;
}

async fn master_surplus_while_another_is_down(test: &str, etcd_volumes: bool) {
    use support::sim::{CONTROL_PLANE_DOWN_TAG, NOT_READY_TAG};
    let g = SteadyGroup::masters(test)
        .etcd_volumes(etcd_volumes)
        .start()
        .await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let original = g.baseline().await.original;
    let in_service = |asg: String| async move {
        world
            .asg_members(&asg)
            .await
            .into_iter()
            .filter(|(_, s)| s == "InService" || s.starts_with("Pending"))
            .map(|(id, _)| id)
            .collect::<BTreeSet<String>>()
    };
    let new_in = |asg: String, not: Vec<String>| {
        let original = original.clone();
        async move {
            let ids = in_service(asg).await;
            let mut new = ids.difference(&original).filter(|id| !not.contains(id));
            new.next().cloned()
        }
    };
    schedule_refresh(
        world,
        "masters",
        serde_json::json!({"masterSettleTime": "20s"}),
    )
    .await;
    // The run's first master terminated: its place P, and its new master.
    let p = refresher_until(world, "masters", "the first master terminated", RUN, |s| {
        let t = s.current_target.as_ref()?;
        (s.replaced_instances.len() == 1 && t.terminated.is_some())
            .then(|| t.auto_scaling_group.clone())
    })
    .await;
    let a_new = assert_eventually("P's new master", WAIT, || new_in(p.clone(), vec![])).await;
    world.kops_update_cluster(kops).await;
    world
        .aws
        .autoscaling
        .update_auto_scaling_group()
        .auto_scaling_group_name(&p)
        .max_size(2)
        .desired_capacity(2)
        .send()
        .await
        .expect("raise P");
    let beside = assert_eventually("a master beside in P", WAIT, || {
        new_in(p.clone(), vec![a_new.clone()])
    })
    .await;

    // The last planned master's termination recorded: the second one's new
    // master has served and settled. B' is the new master of the place
    // that is neither P nor the last one replaced.
    let last = refresher_until(world, "masters", "the last master terminated", RUN, |s| {
        let t = s.current_target.as_ref()?;
        (s.replaced_instances.len() >= 3 && t.terminated.is_some())
            .then(|| t.auto_scaling_group.clone())
    })
    .await;
    let down_place = kops
        .asgs
        .iter()
        .find(|a| **a != p && **a != last)
        .cloned()
        .expect("a third place");
    let b_new = new_in(down_place.clone(), vec![])
        .await
        .expect("the new master of the place that goes down");
    world
        .tag_asg(&down_place, CONTROL_PLANE_DOWN_TAG, &b_new)
        .await;
    world.tag_asg(&p, NOT_READY_TAG, &a_new).await;

    // Held: the last place's new master serves and settles meanwhile, so
    // the run reaches its surplus; P's member does not go.
    let p_asg = std::slice::from_ref(&p);
    let held_from = std::time::Instant::now();
    let mut looks = 0;
    let mut c_settled = false;
    let mut named = false;
    // At least 90 s and at least 60 looks, however slow each look is on a
    // loaded machine (the suite runs three test binaries at once).
    while held_from.elapsed() < Duration::from_secs(90) || looks < 60 {
        assert_eq!(
            world.terminations(p_asg, &a_new).await,
            0,
            "P's member {a_new} went while B' ({b_new}) was down (X: {beside})\n{}",
            manager.logs()
        );
        looks += 1;
        let says = refresher_status(world, "masters").await.message;
        named |= says.is_some_and(|m| m.contains(&b_new) || m.contains(&a_new));
        if let Some(c_new) = new_in(last.clone(), vec![a_new.clone(), beside.clone()]).await {
            let since = support::cluster::control_plane_ready_since(world, &c_new).await;
            c_settled |=
                since.is_some_and(|t| chrono::Utc::now() - t > chrono::Duration::seconds(25));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(c_settled, "the last place's new master never settled");
    assert!(
        named,
        "the Refresher never said it waits for {b_new} or {a_new}"
    );

    // A' back first (its repair, if planned, is given up), then B'.
    world.tag_asg(&p, NOT_READY_TAG, "").await;
    assert_eventually("A' Ready again", WAIT, || async {
        world
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(a_new.as_str()))
            .filter(spot_node_manager::k8s::node::is_ready)
            .map(|_| ())
    })
    .await;
    world.tag_asg(&down_place, CONTROL_PLANE_DOWN_TAG, "").await;
    assert_eventually("the surplus removed, the layout back", RUN, || async {
        (in_service(p.clone()).await.len() == 1).then_some(())
    })
    .await;
    let stayed = in_service(p.clone()).await;
    assert_eq!(stayed, BTreeSet::from([a_new.clone()]), "P's member stays");
    let asgs = world.asg_snapshot(&kops.asgs).await;
    let counts: Vec<i32> = desired_counts(&asgs).into_iter().map(|(_, d)| d).collect();
    assert_eq!(counts, vec![1, 1, 1], "{asgs:?}");
}
