//! Persist, then act, in the replenisher: the manager is killed (abort, as
//! `kill -9`) right after writing what it is about to do and right after
//! doing it, at every step of a shortage and its end, and restarted each time.
//! No raise is ordered twice, no record of a raise is lost, exactly one
//! surplus instance is removed, and the layout comes back.
//! Needs the `fault-injection` feature (scripts/test enables it).
#![cfg(feature = "fault-injection")]

use snm_testkit as support;

use kube::api::Api;
use spot_node_manager::crd::replenisher::ReplenishPhase;
use spot_node_manager::crd::{NodeGroup, Replenisher};
use std::time::Duration;
use support::{World, ZONES, assert_eventually};

const WAIT: Duration = Duration::from_secs(90);
const FAST: Duration = Duration::from_millis(300);
const NO_CAPACITY: &str = "snm.test/no-capacity";

fn group(asgs: &[String]) -> NodeGroup {
    support::refresh::workers_joining_within(asgs, 3, "15m")
}

async fn ready_nodes(groups: &Api<NodeGroup>) -> Option<i32> {
    groups.get("workers").await.ok()?.status?.ready_nodes
}

#[tokio::test]
async fn killed_after_each_persist_and_each_action_it_orders_once_and_restores_the_layout() {
    let world = World::new("rp-restart").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let short = kops.asgs[0].clone();
    world.set_timing(&short, "capacity-retry", 3.0).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world.create_group(&group(&kops.asgs)).await;
    assert_eventually("3 nodes", WAIT, || async {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.client.clone());
        let n = nodes
            .list(&kube::api::ListParams::default().labels(&format!(
                "{}={}",
                snm_testkit::sim::SIM_ACCOUNT_LABEL,
                world.account
            )))
            .await
            .ok()?
            .items
            .len();
        (n == 3).then_some(())
    })
    .await;
    let original = world.asg_snapshot(&kops.asgs).await;

    // A shortage in zone a, and its node reclaimed.
    world.tag_asg(&short, NO_CAPACITY, "true").await;
    let lost = world.asg_instances(&short).await.remove(0);
    world.lose_instance(&lost).await;

    // The raise: killed after recording it, then after making it.
    world
        .assert_crashes_at("replenisher:set_desired:persisted")
        .await;
    world
        .assert_crashes_at("replenisher:set_desired:acted")
        .await;
    let raised = world.asg_snapshot(&kops.asgs).await;
    let total: i32 = raised.iter().map(|(_, d, _)| d).sum();
    assert_eq!(total, 4, "one raise, not two: {raised:?}");

    // The shortage ends; the surplus goes: killed after recording the
    // termination, then after making it.
    world.untag_asg(&short, NO_CAPACITY, "true").await;
    world
        .assert_crashes_at("replenisher:terminate:persisted")
        .await;
    world.assert_crashes_at("replenisher:terminate:acted").await;

    let (_manager, _config) = world.start_manager(&[]);
    let replenishers: Api<Replenisher> = world.api();
    assert_eventually("layout restored", WAIT, || async {
        let now = world.asg_snapshot(&kops.asgs).await;
        let counts = |s: &[(String, i32, Vec<String>)]| {
            s.iter()
                .map(|(n, d, ids)| (n.clone(), *d, ids.len()))
                .collect::<Vec<_>>()
        };
        let rp = replenishers.get("workers").await.ok()?.status?;
        (counts(&now) == counts(&original)
            && ready_nodes(&groups).await? == 3
            && rp.raised.is_empty()
            && rp.raising.is_empty()
            && rp.scale_in.is_none()
            && rp.phase == ReplenishPhase::Steady)
            .then_some(())
    })
    .await;
    // Exactly one instance was removed by scale-in: the raised ASG's extra.
    let terminations = world.terminations_in(&kops.asgs).await;
    assert_eq!(
        terminations, 2,
        "the lost instance (health check) and one surplus instance"
    );
}

#[tokio::test]
async fn killed_after_recording_and_after_removing_a_never_joined_instance_it_removes_it_once() {
    let world = World::new("rp-restart-join").await;
    let _sim = world.start_sim(FAST, FAST);
    let support::NeverJoining {
        late_asg,
        first,
        asgs,
        ..
    } = world.joined_and_never_joining().await;
    let mut spec = group(&asgs);
    spec.spec.desired = 2;
    // Longer than the raise's own instance takes to join under the full
    // suite's load (launch 1 s, Pending 2 s, then the kubelet): at 3 s that
    // instance was once overdue too, and removed in place of the recorded one.
    spec.spec.replenish.join_timeout = "8s".into();
    let _groups: Api<NodeGroup> = world.api();
    world.create_group(&spec).await;

    // Killed right after recording the removal: the record survives.
    world
        .assert_crashes_at("replenisher:remove_not_joined:persisted")
        .await;
    let replenishers: Api<Replenisher> = world.api();
    let recorded = world.replenisher_status("workers").await.cleanup;
    let recorded = recorded.expect("the removal is recorded before the call");
    assert_eq!(recorded.instance_id, first);
    assert!(!recorded.decrement, "no decrement at min");
    assert!(
        world.asg_instances(&late_asg).await.contains(&first),
        "not terminated before the crash"
    );

    // Restarted, it retries that same removal once its backoff is over, and
    // is killed right after making it.
    world
        .assert_crashes_at("replenisher:remove_not_joined:acted")
        .await;
    let (_manager, _config) = world.start_manager(&[]);
    let status = assert_eventually("the removal settled", WAIT, || async {
        let status = replenishers.get("workers").await.ok()?.status?;
        (status.cleanup.is_none() && status.last_action.is_some()).then_some(status)
    })
    .await;
    let terminations: Vec<String> = world
        .activities(&late_asg)
        .await
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| d.starts_with("Terminating EC2 instance"))
        .collect();
    assert_eq!(
        terminations,
        vec![format!("Terminating EC2 instance: {first}")],
        "the never-joined instance is terminated once, and nothing else"
    );
    assert!(
        status
            .removals
            .iter()
            .any(|r| r.auto_scaling_group == late_asg && r.count == 1),
        "the retry of the recorded removal is not counted as another instance: {:?}",
        status.removals
    );
    assert_eq!(
        world.asg_snapshot(std::slice::from_ref(&late_asg)).await[0].1,
        1,
        "desired unchanged at min: the ASG replaces the instance"
    );
}
