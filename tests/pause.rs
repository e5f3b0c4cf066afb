//! A paused run is bounded (real apiserver + the rude emulator + simulated
//! kubelet, the manager as a process): a run that waits for a closed window
//! with its surplus is set aside past `refresh.pauseTimeout`, its lock and
//! slot given back; a spot loss while it waits is replenished.

use snm_testkit as support;

use kube::api::Api;
use spot_node_manager::crd::{NodeGroup, Refresher, RefresherStatus};
use std::time::{Duration, Instant};
use support::assert_eventually;
use support::refresh::*;
use support::steady::*;
use support::windows::*;

/// Simulated spot shortage: the ASG's launches fail (see scripts/moto_server.py).
const NO_CAPACITY: &str = "snm.test/no-capacity";

/// Waits until the run waits for the window, keeping its surplus.
async fn waiting_with_its_surplus(refreshers: &Api<Refresher>) -> RefresherStatus {
    assert_eventually("the run to wait with its surplus", WAIT, || async {
        let status = refreshers.get("workers").await.ok()?.status?;
        let message = status.message.clone().unwrap_or_default();
        message.contains("keeping its surplus").then_some(status)
    })
    .await
}

/// Waits until the run is set aside (no run in progress, the rest pending)
/// and the group's lock is free.
async fn set_aside(refreshers: &Api<Refresher>, groups: &Api<NodeGroup>) -> RefresherStatus {
    let status = assert_eventually("the run set aside", WAIT, || async {
        let status = refreshers.get("workers").await.ok()?.status?;
        (status.run_start.is_none() && status.pending_run.is_some()).then_some(status)
    })
    .await;
    assert_eventually("the group's lock given back", WAIT, || async {
        let status = groups.get("workers").await.ok()?.status?;
        status.operation.is_none().then_some(())
    })
    .await;
    status
}

#[tokio::test]
async fn a_run_paused_past_its_pause_timeout_is_set_aside_and_resumes_in_the_next_window() {
    let g = three_workers("pause-timeout").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let before = world.asg_snapshot(&kops.asgs).await;
    set_windows(groups, windows(OPEN)).await;
    close_the_window_mid_run(world, groups, serde_json::json!({"pauseTimeout": "20s"})).await;
    let refreshers: Api<Refresher> = world.api();
    let waiting = waiting_with_its_surplus(&refreshers).await;
    let paused = Instant::now();
    assert!(
        waiting
            .message
            .as_deref()
            .is_some_and(|m| m.contains("set aside at")),
        "{:?}",
        waiting.message
    );
    let aside = set_aside(&refreshers, groups).await;
    eprintln!(
        "figure: the run paused -> set aside {:.1}s (pauseTimeout 20s)",
        paused.elapsed().as_secs_f64()
    );
    assert!(
        paused.elapsed() >= Duration::from_secs(10),
        "set aside only once paused for its timeout"
    );
    let pending = aside.pending_run.expect("the rest recorded");
    assert!(!pending.remaining.is_empty(), "{pending:?}");
    assert_slots_given_back(world).await;
    support::cluster::assert_events(world, &["RefreshSetAside"]).await;

    // The next window: the rest is replaced, the layout is back.
    set_windows(groups, windows(OPEN)).await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.map(|r| r.replaced), Some(3));
    layout_back(world, &kops.asgs, &before).await;
}

#[tokio::test]
async fn a_spot_loss_while_a_run_waits_is_replenished_at_once() {
    let g = three_workers("pause-loss").await;
    let (world, kops, groups) = (&g.world, &g.kops, &g.groups);
    set_windows(groups, windows(OPEN)).await;
    // A pause far longer than the test: only the loss sets the run aside.
    close_the_window_mid_run(world, groups, serde_json::json!({"pauseTimeout": "1h"})).await;
    let refreshers: Api<Refresher> = world.api();
    waiting_with_its_surplus(&refreshers).await;
    // The node replaced before the wait leaves its ASG once its termination
    // completes: desired 3 + surplus 1 remain.
    assert_eventually("the replaced node gone", WAIT, || async {
        (all_instances(world, &kops.asgs).await.len() == 4).then_some(())
    })
    .await;
    // The ASG holding two nodes runs out of spot capacity and loses both:
    // Ready 2 of 3, though the run kept a surplus.
    let (short, lost) = assert_eventually("an ASG with two nodes", WAIT, || async {
        world
            .asg_snapshot(&kops.asgs)
            .await
            .into_iter()
            .find(|(_, _, ids)| ids.len() == 2)
            .map(|(name, _, ids)| (name, ids))
    })
    .await;
    world.tag_asg(&short, NO_CAPACITY, "true").await;
    for id in &lost {
        world.lose_instance(id).await;
    }
    let loss = Instant::now();
    set_aside(&refreshers, groups).await;
    assert_eventually("Ready back at 3", Duration::from_secs(180), || async {
        (ready_count(groups, "workers").await? >= 3).then_some(())
    })
    .await;
    eprintln!(
        "figure: two nodes lost while the run waited -> Ready back at 3 {:.1}s",
        loss.elapsed().as_secs_f64()
    );
    // Replaced by raises elsewhere: the short ASG launched nothing.
    let now = world.asg_instances(&short).await;
    assert!(!now.iter().any(|id| lost.contains(id)), "{now:?}");
}

/// Issue 54, hole 3: a run whose settings turn invalid midway (another
/// NodeGroup names one of its ASGs) waited for good, keeping its lock, its
/// slot and its surplus. It is now set aside once paused for its
/// `pauseTimeout`, the lock and the slot given back; valid again, the rest
/// is replaced and the layout comes back.
#[tokio::test]
async fn a_run_whose_spec_turns_invalid_midway_is_set_aside_past_its_pause_timeout() {
    let g = three_workers("pause-invalid").await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = all_instances(world, &kops.asgs).await;
    pods_on(world, &node_names(world, &original).await).await;
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"surplusNodes": 1, "pauseTimeout": "20s"}),
    )
    .await;
    refresher_where(world, "workers", "the run under way", |s| {
        s.run_start.is_some()
    })
    .await;
    // An ASG named by two NodeGroups makes both invalid.
    world
        .create_group(&group("other", "Worker", &kops.asgs[..1], 1))
        .await;
    let invalid = Instant::now();
    let refreshers: Api<Refresher> = world.api();
    let aside = set_aside(&refreshers, groups).await;
    eprintln!(
        "figure: spec invalid -> run set aside {:.1}s (pauseTimeout 20s)",
        invalid.elapsed().as_secs_f64()
    );
    assert!(
        invalid.elapsed() >= Duration::from_secs(10),
        "set aside only once paused for its timeout"
    );
    assert!(aside.pending_run.is_some(), "{:?}", aside.message);
    assert_slots_given_back(world).await;
    support::cluster::assert_events(world, &["RefreshSetAside"]).await;

    // Valid again: the rest of the run is replaced, the layout back.
    let others: Api<NodeGroup> = world.api();
    others
        .delete("other", &Default::default())
        .await
        .expect("delete the other group");
    assert_eventually("the set-aside run resumed and done", RUN, || async {
        let s = refresher_status(world, "workers").await;
        (s.pending_run.is_none() && s.run_start.is_none() && s.last_run.is_some()).then_some(())
    })
    .await;
    let status = refresher_status(world, "workers").await;
    assert_eq!(
        status.last_run.as_ref().map(|r| r.result),
        Some(spot_node_manager::crd::refresher::RunResult::Succeeded),
        "{:?}\n{}",
        status.last_run,
        manager.logs()
    );
    layout_back(world, &kops.asgs, &before).await;
    let terminated = terminated_instances(world).await;
    assert!(original.is_subset(&terminated), "every old node replaced");
}
