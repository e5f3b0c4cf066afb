//! The refresher end to end: real apiserver + moto + simulated kubelet, the
//! manager as a separate process (killed mid-run in one test).

use snm_testkit as support;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use spot_node_manager::crd::Refresher;
use spot_node_manager::crd::nodegroup::NodeGroupStatus;
use spot_node_manager::crd::refresher::{RefreshPhase, RunResult};
use std::time::Duration;
use support::recorders::ControlPlaneSampler;
use support::refresh::*;
use support::steady::*;
use support::{ZONES, assert_eventually};

#[tokio::test]
async fn a_worker_group_is_refreshed_with_surplus_and_never_drops_below_desired() {
    let g = three_workers("rf-workers").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let Baseline { before, original } = g.baseline_with_pods().await;
    // Slow launches: desired stays above the instances for 2 s, then 2 s Pending.
    for asg in &kops.asgs {
        world.set_timing(asg, "launch-lag", 2.0).await;
        world.set_timing(asg, "pending-time", 2.0).await;
    }
    let sampler = g.sample(3).await;

    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let rf = run_finished(world, "workers").await;
    let samples = sampler.stop().await;
    let status = assert_run_succeeded(rf, manager);
    let last = status.last_run.clone().expect("last run");
    assert_eq!(last.replaced, 3);
    assert_eq!(status.phase, RefreshPhase::Idle);
    assert_eq!(status.progress.as_deref(), Some("3/3"));

    // Ready never below 3; the capacity added was the surplus (one) and
    // the replacement launched ahead of its old node's termination (one,
    // maxSurge's default).
    assert_eq!(samples.min_ready(), 3, "{samples:?}");
    assert_eq!(samples.max_desired(), 5, "{samples:?}");

    // Every original node replaced, each instance terminated once, the
    // surplus gone, and the layout back: one per ASG, desired as before
    // (once the last termination is through: AWS lists a Terminating
    // instance for a while).
    let after = assert_eventually("terminations through", WAIT, || async {
        let after = world.asg_snapshot(&kops.asgs).await;
        after
            .iter()
            .all(|(_, _, ids)| ids.len() == 1)
            .then_some(after)
    })
    .await;
    let now_in_service = all_instances(world, &kops.asgs).await;
    assert!(now_in_service.is_disjoint(&original), "{after:?}");
    assert_eq!(desired_counts(&after), desired_counts(&before));
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(after.iter().all(|(_, _, ids)| ids.len() == 1), "{after:?}");
    let states = instances_by_state(world).await;
    let terminated = states.get("terminated").cloned().unwrap_or_default();
    assert!(original.is_subset(&terminated), "{states:?}");
    assert_eq!(terminated.len(), 4, "3 old nodes and 1 surplus: {states:?}");
    // AWS never chose a victim: every termination in the ASGs' activities is
    // one the manager asked for, by instance, and logged.
    assert_terminations_chosen(world, &kops.asgs, manager, terminated.len()).await;
    assert_eventually("3 Ready after the run", WAIT, || async {
        (ready_count(groups, "workers").await? == 3).then_some(())
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
    g.lock_released("workers").await;

    // Observable: Events, metrics, status.
    support::cluster::assert_events(
        world,
        &[
            "RefreshStarted",
            "DrainStarted",
            "NodeReplaced",
            "RefreshFinished",
        ],
    )
    .await;
    let reasons = support::event_reasons(world).await;
    assert_eq!(event_count(world, "NodeReplaced").await, 3, "{reasons:?}");
    manager
        .assert_metric_values(&[
            (
                r#"spot_node_manager_refresh_runs_total{result="Succeeded"}"#,
                1.0,
            ),
            (
                "spot_node_manager_node_replacement_duration_seconds_count",
                3.0,
            ),
        ])
        .await;
}

#[tokio::test]
async fn a_master_group_is_refreshed_one_at_a_time_without_surplus() {
    let g = SteadyGroup::masters("rf-masters").start().await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let original = g.baseline().await.original;
    let sampler = g.sample(3).await;
    let control_plane = ControlPlaneSampler::start(world, &original);

    schedule_refresh(
        world,
        "masters",
        serde_json::json!({"masterSettleTime": "2s"}),
    )
    .await;
    let rf = run_finished(world, "masters").await;
    let samples = sampler.stop().await;
    // The next master is cordoned only once the previous replacement's
    // control-plane pods (kube-apiserver, etcd-manager) are Ready.
    let (cordoned, control_plane_ready) = control_plane.stop();
    assert_eq!(cordoned.len(), 3, "{cordoned:?}");
    assert_eq!(control_plane_ready.len(), 3, "{control_plane_ready:?}");
    for k in 1..3 {
        assert!(
            cordoned[k] > control_plane_ready[k - 1],
            "master {} cordoned {:?} before replacement {}'s control plane was Ready",
            k + 1,
            control_plane_ready[k - 1] - cordoned[k],
            k
        );
    }
    let last = assert_run_succeeded(rf, manager)
        .last_run
        .expect("last run");
    assert_eq!(last.replaced, 3);
    // One master out at a time, never an extra one.
    assert_eq!(samples.min_ready(), 2, "{samples:?}");
    assert_eq!(samples.max_desired(), 3, "{samples:?}");
    let now_in_service = all_instances(world, &kops.asgs).await;
    assert!(now_in_service.is_disjoint(&original));
    let terminated = terminated_instances(world).await;
    assert_eq!(terminated, original, "exactly the old masters terminated");
}

#[tokio::test]
async fn a_manager_killed_mid_refresh_resumes_and_terminates_each_node_once() {
    let g = three_workers("rf-restart").await;
    // Pods make each drain take two steps, so the Draining phase lasts.
    let Baseline { before, original } = g.baseline_with_pods().await;
    let sampler = g.sample(3).await;
    let mut manager = g.manager;
    let (world, kops) = (&g.world, &g.kops);
    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;

    // Kill -9 at two different points of the run, restarting each time:
    // mid-pipeline the second time (a node draining, its replacement
    // launched ahead).
    let phases = [RefreshPhase::WaitingForReplacement, RefreshPhase::Draining];
    let _configs = kill_at_phases(world, &mut manager, &phases, |s| {
        s.phase != RefreshPhase::Draining || !s.launched_ahead.is_empty()
    })
    .await;
    assert_taken_over_run_finished(world, &kops.asgs, &manager, sampler, &original, &before).await;
}

/// maxSurge 3 on three nodes: the manager is killed while nodes are
/// drained alongside the first (`status.alongside` non-empty); the
/// restarted one finishes the batch, terminating each node once.
#[tokio::test]
async fn a_manager_killed_mid_batch_resumes_it_and_terminates_each_node_once() {
    let g = three_workers("rf-restart-batch").await;
    let Baseline { before, original } = g.baseline_with_pods().await;
    let sampler = g.sample(3).await;
    let mut manager = g.manager;
    let (world, kops) = (&g.world, &g.kops);
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "maxSurge": 3}),
    )
    .await;
    let alongside = refresher_until(world, "workers", "nodes drained alongside", RUN, |s| {
        (!s.alongside.is_empty()).then_some(s.alongside.len())
    })
    .await;
    eprintln!("killing the manager with {alongside} node(s) drained alongside");
    let _config = restart_manager(world, &mut manager).await;
    assert_taken_over_run_finished(world, &kops.asgs, &manager, sampler, &original, &before).await;
}

#[tokio::test]
async fn a_dry_run_refresh_plans_and_changes_nothing() {
    let g = SteadyGroup::workers("rf-dry")
        .zones(&ZONES[..2])
        .manager_args(&["--dry-run"])
        .start()
        .await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let before = world.asg_snapshot(&kops.asgs).await;
    schedule_refresh(world, "workers", serde_json::json!({})).await;
    let rf = run_finished(world, "workers").await;
    let last = assert_run_ended(rf, RunResult::Skipped, manager).last_run;
    let reason = last.and_then(|l| l.reason).unwrap_or_default();
    assert!(reason.starts_with("dry run: would add 1 on"), "{reason}");
    assert!(reason.contains("replace 2 node(s)"), "{reason}");
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let g = groups.get("workers").await.expect("group");
    assert_eq!(g.status.and_then(|s| s.operation), None, "no lock taken");
    // The Event follows the status write that ends the run.
    assert_event(world, "RefreshPlanned").await;
}

#[tokio::test]
async fn a_replacement_that_never_joins_fails_the_run_and_keeps_the_old_nodes() {
    let g = three_workers("rf-fail").await;
    let (world, kops, manager, sim) = (&g.world, &g.kops, &g.manager, &g.sim);
    // Pods make each drain take two steps, so the Draining phase lasts.
    let original = g.baseline_with_pods().await.original;
    let sampler = g.sample(3).await;
    // The surplus and the first node's replacement, launched together, join;
    // the next replacement (launched as the first is validated) never does.
    // A limit set before the run, not a tag set once the first node is
    // replaced: by then the next replacement may have joined (seen in CI).
    sim.limit_joins(2);
    schedule_refresh(
        world,
        "workers",
        // Long enough for the surplus at the emulator's own pace (launch
        // 1 s, Pending 2 s, then seen at the next describe, up to 5 s
        // later): 8 s failed once under the full suite's load, and 15 s
        // under the suite's load beside the image's build.
        serde_json::json!({"surplusNodes": 1, "readyTimeout": "45s"}),
    )
    .await;
    let rf = run_finished(world, "workers").await;
    let samples = sampler.stop().await;
    let last = assert_run_ended(rf, RunResult::Failed, manager)
        .last_run
        .expect("last run");
    let reason = last.reason.clone().unwrap_or_default();
    assert!(reason.contains("was not Ready within 45s"), "{reason}");
    assert_eq!(last.replaced, 1);
    // Never below 3 Ready, even with the replacement missing.
    assert_eq!(samples.min_ready(), 3, "{samples:?}");
    // The first node replaced, the second gone (its replacement never
    // came); the third is kept and schedulable.
    let now_in_service = all_instances(world, &kops.asgs).await;
    let kept: Vec<String> = original.intersection(&now_in_service).cloned().collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let cordoned = world.cordoned_nodes().await.expect("nodes");
    let names = node_names(world, &kept.iter().cloned().collect()).await;
    // The kept node's Node itself, not a loop over none when it is gone.
    assert_eq!(names.len(), kept.len(), "{kept:?} have Nodes {names:?}");
    for name in names {
        assert!(!cordoned.contains(&name), "{name} left cordoned");
    }
    // The lock is back for the replenisher; the failure is visible.
    g.lock_released("workers").await;
    assert_event(world, "RefreshFailed").await;
    manager
        .assert_metric_values(&[(
            r#"spot_node_manager_refresh_runs_total{result="Failed"}"#,
            1.0,
        )])
        .await;
}

/// Found by the walk over every path (`controllers::walk`): a failed run
/// that cannot take its surplus back (a replacement never joined) leaves
/// it to the replenisher; the never-joined instance then goes with
/// decrement (its ASG at min 0), one ASG below its count. The surplus is
/// taken over as a raise of the replenisher's own, so the layout comes
/// back (before, nothing owned it and the layout stayed off for good).
#[tokio::test]
async fn the_surplus_a_failed_run_leaves_is_taken_over_and_the_layout_comes_back() {
    let g = three_workers("rf-left").await;
    let (world, kops, groups, manager, sim) = (&g.world, &g.kops, &g.groups, &g.manager, &g.sim);
    // Spot instance groups at min 0: a removal there lowers the count.
    for asg in &kops.asgs {
        world.set_min(asg, 0).await;
    }
    let replenish = serde_json::json!({"cooldown": "1s", "joinTimeout": "30s"});
    world
        .patch_group("workers", serde_json::json!({ "replenish": replenish }))
        .await;
    let before = g.baseline_with_pods().await.before;
    // The surplus joins; then the replacements up to the first outside the
    // surplus's ASG join, and that one never does. (A replacement that
    // never joins beside the surplus is taken back as the surplus itself:
    // nothing would be left for the replenisher.) Which that is, the plan
    // says: the joins it allows are added to the surplus's, whether or not
    // it has joined meanwhile (set only once it was seen, the next join
    // waited on the test's polling, and a slow machine ran out the first
    // replacement's readyTimeout before the one meant never to join).
    sim.limit_joins(1);
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "readyTimeout": "45s"}),
    )
    .await;
    let (planned, surplus_asg) = refresher_until(world, "workers", "the run's plan", WAIT, |s| {
        let asg = s.surplus.first()?.auto_scaling_group.clone();
        (!s.planned_instances.is_empty()).then_some((s.planned_instances, asg))
    })
    .await;
    // One node per ASG: the first target's replacement joins, and the
    // second's too when the second is beside the surplus.
    let second = planned.get(1).expect("three targets");
    let beside = before
        .iter()
        .any(|(asg, _, ids)| *asg == surplus_asg && ids.contains(second));
    sim.allow_joins(if beside { 2 } else { 1 });
    let rf = run_finished(world, "workers").await;
    let status = assert_run_ended(rf, RunResult::Failed, manager);
    let reason = status.last_run.as_ref().and_then(|l| l.reason.clone());
    assert!(
        reason
            .as_deref()
            .unwrap_or_default()
            .contains("surplus left in"),
        "the run's reason: {reason:?}\n{}",
        manager.logs()
    );
    let left = status.surplus_left.clone().expect("status.surplusLeft");
    // The replenisher removes the instance that never joined, with
    // decrement: its ASG lowered. Only then do launches join again (lifted
    // earlier, that instance would join late instead).
    let replenishers: Api<spot_node_manager::crd::Replenisher> = world.api();
    assert_eventually(
        "the never-joined instance removed, its ASG lowered",
        RUN,
        || async {
            let s = replenishers.get("workers").await.ok()?.status?;
            (!s.lowered.is_empty()).then_some(())
        },
    )
    .await;
    // The surplus taken over, the lowered ASG raised back, then the
    // surplus taken back where it was left.
    sim.limit_joins(usize::MAX);
    layout_back(world, &kops.asgs, &before).await;
    assert_eventually(
        "the surplus taken over, nothing raised or lowered",
        RUN,
        || async {
            let s = replenishers.get("workers").await.ok()?.status?;
            (s.taken_over == Some(left.at) && s.raised.is_empty() && s.lowered.is_empty())
                .then_some(())
        },
    )
    .await;
    // The surplus's termination is recorded (its raise taken back) before
    // it is made: its node goes a moment later.
    assert_eventually("back at 3 Ready", WAIT, || async {
        (ready_count(groups, "workers").await? == 3).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_next_run_is_shown_in_its_zone_and_an_invalid_schedule_runs_nothing() {
    use spot_node_manager::crd::nodegroup::parse_schedule;
    use spot_node_manager::schedule::next_run;
    let g = SteadyGroup::workers("rf-schedule")
        .zones(&ZONES[..1])
        .start()
        .await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    // Daily at 02:30 in Tokyo: status shows that instant.
    let schedule = "30 2 * * *";
    let expected = next_run(
        &parse_schedule(schedule).expect("schedule"),
        chrono_tz::Asia::Tokyo,
        chrono::Utc::now(),
    )
    .expect("a next run");
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"schedule": schedule, "timeZone": "Asia/Tokyo"}),
    )
    .await;
    refresher_until(world, "workers", "nextRun in status", WAIT, |s| {
        (s.next_run == Some(expected) && s.phase == RefreshPhase::Idle).then_some(())
    })
    .await;
    // `kubectl get rf` shows it.
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(world.client.clone());
    let crd = crds.get("refreshers.nodemanager.dev").await.expect("crd");
    let columns = crd.spec.versions[0]
        .additional_printer_columns
        .clone()
        .unwrap_or_default();
    assert!(
        columns
            .iter()
            .any(|c| c.name == "Next Run" && c.json_path == ".status.nextRun"),
        "{columns:?}"
    );

    // A Refresher with an unknown zone (the NodeGroup's validation refuses
    // one, a hand-made Refresher can carry it), due every second: reported,
    // and nothing runs.
    let before = world.asg_snapshot(&kops.asgs).await;
    let bad: Refresher = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "Refresher",
        "metadata": {"name": "hand-made"},
        "spec": {"nodeGroup": "workers", "role": "Worker", "schedule": "* * * * * *",
                 "timeZone": "Mars/Olympus", "surplusNodes": 1, "drainTimeout": "30s",
                 "drainTimeoutAction": "Abort", "readyTimeout": "60s"}
    }))
    .expect("refresher");
    let refreshers: Api<Refresher> = world.api();
    refreshers
        .create(&kube::api::PostParams::default(), &bad)
        .await
        .expect("create");
    let status = assert_eventually("ScheduleValid False", WAIT, || async {
        let s = refreshers.get("hand-made").await.ok()?.status?;
        let valid = s.conditions.iter().find(|c| c.type_ == "ScheduleValid")?;
        (valid.status == spot_node_manager::crd::condition::ConditionStatus::False)
            .then_some((s.clone(), valid.message.clone()))
    })
    .await;
    assert!(status.1.contains("Mars/Olympus"), "{}", status.1);
    assert_eq!(status.0.phase, RefreshPhase::Blocked);
    assert_eq!(status.0.next_run, None);
    // Changed twice (each change is reconciled), and still nothing runs.
    let looked = manager.reconciles_of_child("refresher", "workers", "hand-made");
    for poke in ["1", "2"] {
        refreshers
            .patch(
                "hand-made",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    serde_json::json!({"metadata": {"annotations": {"test/poke": poke}}}),
                ),
            )
            .await
            .expect("poke");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let ran = manager.reconciles_of_child("refresher", "workers", "hand-made") - looked;
    assert!(
        ran >= 2,
        "hand-made reconciled {ran} time(s) after two changes"
    );
    let s = refresher_status(world, "hand-made").await;
    assert!(s.last_run.is_none() && s.run_start.is_none(), "{s:?}");
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let g = groups.get("workers").await.expect("group");
    assert_eq!(g.status.and_then(|s| s.operation), None);
}

#[tokio::test]
async fn a_run_is_skipped_while_an_asg_has_launch_suspended_naming_it() {
    let g = three_workers("rf-suspended").await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    world.scaling_process(&kops.asgs[1], "Launch", false).await;
    let before = world.asg_snapshot(&kops.asgs).await;

    schedule_refresh(world, "workers", serde_json::json!({})).await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_ended(rf, RunResult::Skipped, manager);
    let expected = format!("{} has its Launch process suspended", kops.asgs[1]);
    let reason = status.last_run.as_ref().and_then(|l| l.reason.as_deref());
    assert_eq!(reason, Some(expected.as_str()));
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "ScalingProcesses")
        .expect("ScalingProcesses condition");
    assert_eq!(
        (condition.status.clone(), condition.reason.as_str()),
        (
            spot_node_manager::crd::condition::ConditionStatus::False,
            "ProcessSuspended"
        )
    );
    assert_eq!(condition.message, expected);
    // The Event follows the status write that ends the run.
    assert_event(world, "RefreshSkipped").await;
    // Nothing was touched.
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let metrics = manager.assert_metrics().await;
    assert!(
        !metrics.contains(r#"target="aws",action="set_desired_capacity",outcome="performed""#),
        "{metrics}"
    );
}

#[tokio::test]
async fn with_most_nodes_not_ready_the_circuit_breaker_skips_the_refresh_until_they_recover() {
    use spot_node_manager::crd::ConditionStatus;
    use spot_node_manager::crd::condition::find;
    let steady = SteadyGroup::workers("rf-breaker").start().await;
    let (world, kops) = (&steady.world, &steady.kops);
    let before = world.asg_snapshot(&kops.asgs).await;
    // Two of three kubelets stop reporting Ready (a partition, a bad
    // kubelet rollout): replacing nodes now would make it worse.
    for (asg, _, ids) in &before[..2] {
        world
            .tag_asg(asg, support::sim::NOT_READY_TAG, &ids[0])
            .await;
    }
    let breaker = |open: bool| {
        move |s: &NodeGroupStatus| {
            let c = find(&s.conditions, "CircuitBreakerOpen");
            c.is_some_and(|c| (c.status == ConditionStatus::True) == open)
        }
    };
    let open = steady.status_where("workers", "the breaker open", breaker(true));
    let message = find(&open.await.conditions, "CircuitBreakerOpen").map(|c| c.message.clone());
    assert!(
        message.as_deref().is_some_and(|m| m.contains("2 of 3")),
        "{message:?}"
    );
    assert_event(world, "TooManyNotReady").await;
    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let rf = run_finished(world, "workers").await;
    let outcome = assert_run_ended(rf, RunResult::Skipped, &steady.manager)
        .last_run
        .expect("an outcome");
    assert!(
        outcome
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("circuit breaker open")),
        "{outcome:?}"
    );
    assert_eq!(
        world.asg_snapshot(&kops.asgs).await,
        before,
        "nothing launched or terminated while the breaker is open"
    );
    // They recover: the breaker closes and the next run replaces the nodes.
    for (asg, _, _) in &before[..2] {
        world.tag_asg(asg, support::sim::NOT_READY_TAG, "").await;
    }
    steady
        .status_where("workers", "the breaker closed", breaker(false))
        .await;
    let first = outcome.started;
    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let rf = assert_eventually("the next run to end", RUN, || async {
        let rf = run_finished(world, "workers").await;
        let started = rf.status.as_ref()?.last_run.as_ref()?.started;
        (started > first).then_some(rf)
    })
    .await;
    let status = assert_run_succeeded(rf, &steady.manager);
    assert!(status.last_run.is_some_and(|r| r.replaced == 3));
}

/// Issue 69 item 6: a cluster of one master (kops's default). A masters
/// refresh would stop the Kubernetes API, so by default the run is skipped,
/// saying why and what allows it, and nothing is touched. Allowed
/// (`disruption.allowControlPlaneOutage`), the run replaces the master;
/// the manager's own pod, bound to it with nowhere else to run (a
/// nodeSelector only this master matches), is not evicted (its budget,
/// as the Deployment's, would refuse it, and its replacement could run
/// nowhere): it stays and goes with the instance, while every other pod
/// of the node, the standby replica included, is evicted.
#[tokio::test]
async fn a_one_master_cluster_is_refreshed_only_when_allowed_and_the_managers_pod_goes_with_it() {
    use kube::api::{Patch, PatchParams, PostParams};
    use spot_node_manager::crd::NodeGroup;
    let g = SteadyGroup::masters("rf-one-master")
        .zones(&ZONES[..1])
        .own_pod("mgr-one")
        .start()
        .await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);
    let original = g.baseline().await.original;
    let master = nodes_oldest_first(&g.groups, "masters").await[0].clone();
    // The manager's two replicas, as manifests/deployment.yaml places them
    // (the control plane, its taint tolerated; here also this test's own
    // Nodes, as other tests' masters share the apiserver), under the
    // Deployment's budget (minAvailable 1); a workload pod beside them.
    let pods: Api<Pod> = world.api();
    let owner = app_owner(world).await;
    let labels = [("app", "protected"), ("app.kubernetes.io/name", "snm-one")];
    let account = world.account.clone();
    for name in ["mgr-one", "mgr-two"] {
        let mut pod = support::bound_pod(name, &master, &labels);
        pod.metadata.owner_references = Some(vec![owner.clone()]);
        let spec = pod.spec.get_or_insert_with(Default::default);
        spec.node_selector = Some(
            [
                (spot_node_manager::crd::labels::CONTROL_PLANE_LABEL, ""),
                (support::sim::SIM_ACCOUNT_LABEL, account.as_str()),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        spec.tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration {
            key: Some(spot_node_manager::crd::labels::CONTROL_PLANE_LABEL.into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create a replica's pod");
    }
    let mut web = support::bound_pod("web-0", &master, &[("app", "web")]);
    web.metadata.owner_references = Some(vec![owner.clone()]);
    pods.create(&PostParams::default(), &web)
        .await
        .expect("create pod");
    support::cluster::create_pdb(world, 1).await;
    support::cluster::assert_pdb_allows(world, 1).await;

    // Not allowed: skipped, saying why; the master untouched.
    schedule_refresh(
        world,
        "masters",
        serde_json::json!({"masterSettleTime": "2s"}),
    )
    .await;
    let skipped = run_finished(world, "masters").await;
    let last = skipped
        .status
        .and_then(|s| s.last_run)
        .expect("the skipped run");
    let why = last.reason.clone().unwrap_or_default();
    assert_eq!(last.result, RunResult::Skipped, "{last:?}");
    assert!(
        why.contains("1 master(s)") && why.contains("allowControlPlaneOutage"),
        "{why}"
    );
    assert!(terminated_instances(world).await.is_empty());
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.client.clone());
    let node = nodes.get(&master).await.expect("node");
    let cordoned = node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
    assert!(!cordoned, "the only master was cordoned");
    assert_eq!(
        pods.list(&ListParams::default())
            .await
            .expect("pods")
            .items
            .len(),
        3
    );

    // Allowed: the master is replaced.
    let groups: Api<NodeGroup> = world.api();
    let allow = serde_json::json!({"spec": {"disruption": {"allowControlPlaneOutage": true}}});
    groups
        .patch("masters", &PatchParams::default(), &Patch::Merge(&allow))
        .await
        .expect("allow the outage");
    let skipped_at = last.finished;
    schedule_refresh(
        world,
        "masters",
        serde_json::json!({"masterSettleTime": "2s"}),
    )
    .await;
    let refreshers: Api<Refresher> = world.api();
    let rf = assert_eventually("the allowed run to end", RUN, || async {
        let rf = refreshers.get("masters").await.ok()?;
        let status = rf.status.as_ref()?;
        let last = status.last_run.as_ref()?;
        (last.finished != skipped_at && status.run_start.is_none()).then_some(rf)
    })
    .await;
    let last = assert_run_succeeded(rf, manager)
        .last_run
        .expect("last run");
    assert_eq!(last.replaced, 1);
    assert!(
        all_instances(world, &kops.asgs)
            .await
            .is_disjoint(&original)
    );
    assert_eq!(terminated_instances(world).await, original);
    let ns = &world.namespace;
    let logs = manager.logs();
    for moved in ["mgr-two", "web-0"] {
        assert!(
            logs.contains(&format!("pod/{ns}/{moved}")),
            "{moved} evicted:\n{logs}"
        );
    }
    assert!(
        !logs.contains(&format!("pod/{ns}/mgr-one")),
        "the manager's own pod was never evicted:\n{logs}"
    );
    assert!(
        logs.contains("our own pod stays on the node it drains"),
        "{logs}"
    );
}
