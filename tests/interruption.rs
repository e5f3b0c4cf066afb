//! The interruption handler against moto's SQS and the real apiserver: a
//! notice for one of our nodes marks it (cordon, taint, load-balancer
//! exclusion, record) before AWS takes the instance, and the message is
//! deleted only then; duplicates, foreign instances and bad bodies.

use snm_testkit as support;
use spot_node_manager::crd::labels::{
    EXCLUDE_FROM_LOAD_BALANCERS, INTERRUPTED_TAINT, INTERRUPTION_ANNOTATION,
};

use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use spot_node_manager::controllers::interruption::record::record_of;
use std::time::Duration;
use support::assert_eventually;
use support::interruption::{
    interrupt, rebalance_recommendation, scheduled_change, spot_warning, state_change,
};
use support::refresh::*;
use support::workload::{assert_web_ready, deploy_web, ready_web_pods, sample_web};

/// How many of our taints `node` carries.
fn our_taints(node: &Node) -> usize {
    node.spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .filter(|t| t.key == INTERRUPTED_TAINT)
        .count()
}

/// The group's node on `instance`, if it is marked as interrupted.
async fn marked(nodes: &Api<Node>, instance: &str) -> Option<Node> {
    let list = nodes.list(&Default::default()).await.ok()?;
    let node = list.items.into_iter().find(|n| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| p.ends_with(instance))
    })?;
    let spec = node.spec.as_ref()?;
    let cordoned = spec.unschedulable == Some(true);
    let tainted = spec
        .taints
        .iter()
        .flatten()
        .any(|t| t.key == INTERRUPTED_TAINT && t.effect == "NoSchedule");
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LOAD_BALANCERS));
    (cordoned && tainted && labelled && record_of(&node).is_some()).then_some(node)
}

/// What the manager ordered of AWS (its own counters): raises
/// (SetDesiredCapacity) and terminations through an ASG.
fn assert_orders(metrics: &str, raises: u64, terminations: u64, why: &str) {
    assert_eq!(
        (
            support::performed(metrics, "set_desired_capacity"),
            support::performed(metrics, "terminate_instance_in_auto_scaling_group"),
        ),
        (raises, terminations),
        "{why}: {metrics}"
    );
}

/// When the drain of `instance` ended, from the group's last interruption
/// (kept there after the node is gone: it is terminated soon after).
async fn drain_ended(
    groups: &Api<spot_node_manager::crd::NodeGroup>,
    instance: &str,
) -> Option<chrono::DateTime<Utc>> {
    let last = groups
        .get("workers")
        .await
        .ok()?
        .status?
        .last_interruption?;
    (last.instance_id == instance)
        .then_some(last.drained)
        .flatten()
}

/// Sets the group's `spec.interruption`.
async fn set_interruption(steady: &SteadyGroup, interruption: serde_json::Value) {
    steady
        .groups
        .patch(
            "workers",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"interruption": interruption}})),
        )
        .await
        .expect("patch group");
}

async fn instances(world: &support::World, asgs: &[String]) -> Vec<String> {
    all_instances(world, asgs).await.into_iter().collect()
}

#[tokio::test]
async fn a_spot_warning_marks_our_node_before_the_instance_goes_and_the_message_is_deleted() {
    let steady = SteadyGroup::workers("int-warning")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let nodes: Api<Node> = Api::all(world.client.clone());
    let before = world.asg_snapshot(&kops.asgs).await;
    let victim = before[0].2[0].clone();
    // AWS: the warning now; it would take the instance two minutes later.
    // Before then: the node marked while its instance runs, a replacement
    // launched in its ASG, and only then the instance terminated by us.
    let asg = before[0].0.clone();
    let noticed = Utc::now();
    let started = std::time::Instant::now();
    queue.send(&spot_warning(&victim, noticed)).await;
    let node = assert_eventually("the node marked", WAIT, || marked(&nodes, &victim)).await;
    let running = instances(world, &kops.asgs).await;
    assert!(
        running.contains(&victim),
        "the node must be marked before its instance is terminated"
    );
    let record = record_of(&node).expect("record");
    assert_eq!(record.kind, "spot_interruption");
    assert_eq!(record.instance_id, victim);
    // The deadline counts from AWS's time, not from receipt: 90 s by default.
    let from_notice = (record.deadline - record.noticed).num_seconds();
    assert_eq!(from_notice, 90, "{record:?}");
    assert!(
        (record.noticed - noticed).num_seconds().abs() <= 1,
        "{record:?}"
    );
    assert!(
        node.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(INTERRUPTION_ANNOTATION))
    );
    assert_eventually("the message deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    let replacement = assert_eventually("a replacement launched beside it", WAIT, || async {
        let ids = world.asg_instances(&asg).await;
        assert!(
            ids.contains(&victim),
            "{victim} left {asg} before a replacement was launched: {ids:?}"
        );
        ids.into_iter().find(|id| *id != victim)
    })
    .await;
    eprintln!("{:?}: marked, replacement launched", started.elapsed());
    assert_eventually(
        "the interrupted instance terminated by us",
        WAIT,
        || async {
            let ids = world.asg_instances(&asg).await;
            (ids == [replacement.clone()]).then_some(())
        },
    )
    .await;
    eprintln!("{:?}: interrupted instance removed", started.elapsed());
    // AWS's own termination at its time finds it gone already.
    world.lose_instance(&victim).await;
    assert_eventually("the lost node gone, 3 Ready", RUN, || async {
        let gone = world
            .nodes()
            .await
            .unwrap_or_default()
            .iter()
            .all(|n| n.metadata.name.as_deref() != Some(victim.as_str()));
        (gone && ready_count(&steady.groups, "workers").await? == 3).then_some(())
    })
    .await;
    eprintln!("{:?}: 3 Ready", started.elapsed());
    // The layout as before, the raise for the replacement taken back.
    let settled = world.asg_snapshot(&kops.asgs).await;
    assert_eq!(desired_counts(&settled), desired_counts(&before));
    let after = instances(world, &kops.asgs).await;
    assert_eq!(after.len(), 3, "exactly one new instance: {after:?}");
    assert!(event_count(world, "InterruptionNotice").await >= 1);
    let metrics = steady.manager.assert_metrics().await;
    assert!(
        metrics.contains(
            "spot_node_manager_interruption_messages_total{kind=\"spot_interruption\",outcome=\"acted\"} 1"
        ),
        "{metrics}"
    );
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn duplicates_foreign_instances_and_bad_bodies_never_act_twice_or_block_the_queue() {
    let steady = SteadyGroup::workers("int-dupes")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let nodes: Api<Node> = Api::all(world.client.clone());
    let victim = world.asg_snapshot(&kops.asgs).await[1].2[0].clone();
    let warning = spot_warning(&victim, Utc::now());
    queue.send(&warning).await;
    queue.send(&warning).await;
    queue
        .send(&spot_warning("i-0123456789abcdef0", Utc::now()))
        .await;
    queue.send("{this is not json").await;
    queue
        .send(r#"{"version": "0", "source": "aws.ec2", "detail-type": "EC2 Something New", "time": "2026-11-23T00:00:00Z", "detail": {}}"#)
        .await;
    let node = assert_eventually("the node marked", WAIT, || marked(&nodes, &victim)).await;
    assert_eventually("every message deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    // Marked once: one taint of ours, one Event for it.
    assert_eq!(our_taints(&node), 1);
    assert_eq!(event_count(world, "InterruptionNotice").await, 1);
    // No other node touched.
    let marked_nodes = world
        .nodes()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|n| record_of(n).is_some())
        .count();
    assert_eq!(marked_nodes, 1, "only the victim is marked");
    let metrics = steady.manager.assert_metrics().await;
    for series in [
        "kind=\"spot_interruption\",outcome=\"acted\"} 2",
        "kind=\"spot_interruption\",outcome=\"foreign_deleted\"} 1",
        "kind=\"malformed\",outcome=\"rejected\"} 1",
        "kind=\"unknown_kind\",outcome=\"rejected\"} 1",
    ] {
        assert!(
            metrics.contains(&format!(
                "spot_node_manager_interruption_messages_total{{{series}"
            )),
            "{series} missing:\n{metrics}"
        );
    }
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn on_a_shared_queue_a_foreign_notice_is_left_for_its_cluster() {
    let steady = SteadyGroup::workers("int-shared")
        .interruption_queue()
        .manager_config("interruption:\n  foreignMessages: Leave\n")
        .start()
        .await;
    let (world, queue) = (&steady.world, steady.queue());
    queue
        .send(&spot_warning("i-0123456789abcdef0", Utc::now()))
        .await;
    let metrics = assert_eventually("the foreign notice seen", WAIT, || async {
        let m = steady.manager.assert_metrics().await;
        m.contains("outcome=\"foreign_left\"").then_some(m)
    })
    .await;
    assert!(!metrics.contains("foreign_deleted"), "{metrics}");
    assert_eq!(queue.remaining().await, 1, "left on the queue");
    let nodes = world.nodes().await.unwrap_or_default();
    assert_eq!(nodes.len(), 3);
    assert!(nodes.iter().all(|n| record_of(n).is_none()));
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

/// The instance of a node running `n` or more web pods.
async fn node_with_web_pods(world: &support::World, n: usize) -> String {
    assert_eventually("a node with web pods", WAIT, || async {
        let pods = ready_web_pods(world).await;
        let mut per_node: std::collections::BTreeMap<String, usize> = Default::default();
        for (_, node) in pods {
            *per_node.entry(node).or_default() += 1;
        }
        per_node
            .into_iter()
            .find(|(_, c)| *c >= n)
            .map(|(node, _)| node)
    })
    .await
}

#[tokio::test]
async fn a_warned_node_is_drained_by_its_deadline_within_the_budget() {
    let steady = SteadyGroup::workers("int-drain")
        .interruption_queue()
        .start()
        .await;
    let (world, queue) = (&steady.world, steady.queue());
    deploy_web(world, 6, 1).await;
    assert_web_ready(world, 6).await;
    let victim = node_with_web_pods(world, 1).await;
    let sampler = sample_web(world);
    queue.send(&spot_warning(&victim, Utc::now())).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let marked_node = assert_eventually("the node marked", WAIT, || marked(&nodes, &victim)).await;
    let record = record_of(&marked_node).expect("record");
    let drained = assert_eventually("the drain's end recorded", WAIT, || {
        drain_ended(&steady.groups, &victim)
    })
    .await;
    assert!(drained <= record.deadline, "{drained} after {record:?}");
    // Every web pod moved off the node and is Ready elsewhere; the budget's
    // floor held throughout.
    assert_eventually("6 Ready pods elsewhere", WAIT, || async {
        let pods = ready_web_pods(world).await;
        (pods.len() == 6 && pods.iter().all(|(_, node)| *node != victim)).then_some(())
    })
    .await;
    let samples = sampler.stop();
    assert!(samples.min_ready >= Some(5), "{samples:?}");
    assert!(event_count(world, "InterruptionDrained").await >= 1);
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn what_a_budget_holds_past_the_deadline_is_named_and_not_evicted() {
    let steady = SteadyGroup::workers("int-deadline")
        .interruption_queue()
        .start()
        .await;
    let (world, queue) = (&steady.world, steady.queue());
    set_interruption(&steady, serde_json::json!({"drainDeadline": "10s"})).await;
    deploy_web(world, 6, 0).await;
    assert_web_ready(world, 6).await;
    let victim = node_with_web_pods(world, 1).await;
    let held: Vec<String> = ready_web_pods(world)
        .await
        .into_iter()
        .filter(|(_, node)| *node == victim)
        .map(|(pod, _)| pod)
        .collect();
    let sampler = sample_web(world);
    queue.send(&spot_warning(&victim, Utc::now())).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let marked_node = assert_eventually("the node marked", WAIT, || marked(&nodes, &victim)).await;
    let record = record_of(&marked_node).expect("record");
    assert_eq!((record.deadline - record.noticed).num_seconds(), 10);
    let drained = assert_eventually("the drain's end recorded", WAIT, || {
        drain_ended(&steady.groups, &victim)
    })
    .await;
    assert!(drained >= record.deadline, "{drained} before {record:?}");
    // Nothing evicted against the budget; the Event names what was left.
    let samples = sampler.stop();
    assert_eq!(samples.min_ready, Some(6), "{samples:?}");
    let events: Api<k8s_openapi::api::events::v1::Event> = world.api();
    let note = assert_eventually("the incomplete drain reported", WAIT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InterruptionDrainIncomplete"))
            .and_then(|e| e.note)
    })
    .await;
    for pod in &held {
        assert!(note.contains(pod.as_str()), "{pod} not named: {note}");
    }
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn a_manager_killed_between_marking_and_deleting_finishes_the_job_once_on_redelivery() {
    let world = support::World::new("int-kill").await;
    let kops = world.kops_group("nodes", &support::ZONES, 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<spot_node_manager::crd::NodeGroup> = world.api();
    groups
        .create(
            &Default::default(),
            &support::refresh::group("workers", "Worker", &kops.asgs, 3),
        )
        .await
        .expect("create group");
    let queue = world.queue("interruptions").await;
    let flags = ["--interruption-queue-url", queue.url.as_str()];
    let config = "resyncInterval: 2s\n";
    // The first manager dies (as kill -9 would) right after the node is
    // marked, before the message is deleted.
    let (mut first, _c1) =
        world.start_manager_with(config, &flags, &[("SNM_CRASH_AT", "interruption:marked")]);
    assert_eventually("3 Ready", RUN, || async {
        (ready_count(&groups, "workers").await? == 3).then_some(())
    })
    .await;
    let victim = world.asg_snapshot(&kops.asgs).await[2].2[0].clone();
    queue.send(&spot_warning(&victim, Utc::now())).await;
    assert_eventually("a crash after marking", WAIT, || async {
        (!first.child_alive()).then_some(())
    })
    .await;
    assert!(
        first.logs().contains("crash point interruption:marked"),
        "{}",
        first.logs()
    );
    first.kill();
    let nodes: Api<Node> = Api::all(world.client.clone());
    assert!(
        marked(&nodes, &victim).await.is_some(),
        "marked before the crash"
    );
    assert_eq!(
        queue.remaining().await,
        1,
        "the message is still on the queue"
    );
    // The next manager gets the message again and finishes: deleted, and
    // nothing done twice.
    let (second, _c2) = world.start_manager_with(config, &flags, &[]);
    assert_eventually("the redelivered message deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    if let Ok(node) = nodes.get(&victim).await {
        assert!(our_taints(&node) <= 1, "{node:?}");
    }
    assert_eq!(
        event_count(&world, "InterruptionNotice").await,
        1,
        "noticed once"
    );
    // One replacement, the interrupted instance removed by us, the layout
    // as before.
    assert_eventually("replaced once, the layout as before", RUN, || async {
        let after = world.asg_snapshot(&kops.asgs).await;
        let ids: Vec<&String> = after.iter().flat_map(|(_, _, ids)| ids).collect();
        let layout = after.iter().all(|(_, desired, _)| *desired == 1);
        let ready = ready_count(&groups, "workers").await? == 3;
        (layout && ids.len() == 3 && !ids.contains(&&victim) && ready).then_some(())
    })
    .await;
    assert!(second.child_alive(), "{}", second.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn an_interruption_during_a_refresh_is_handled_and_the_run_goes_on() {
    let steady = SteadyGroup::workers("int-refresh")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let before = world.asg_snapshot(&kops.asgs).await;
    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;
    let refreshers: Api<spot_node_manager::crd::Refresher> = world.api();
    // While the run replaces its old nodes, AWS reclaims one it has not
    // reached yet.
    let victim = assert_eventually("a run under way with an old node left", RUN, || async {
        use spot_node_manager::crd::refresher::RefreshPhase;
        let status = refreshers.get("workers").await.ok()?.status?;
        if !matches!(
            status.phase,
            RefreshPhase::Draining | RefreshPhase::WaitingForReplacement
        ) {
            return None;
        }
        let target = status.current_target.map(|t| t.instance_id);
        status
            .planned_instances
            .into_iter()
            .find(|id| !status.replaced_instances.contains(id) && Some(id) != target.as_ref())
    })
    .await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let (_, marked_node) = tokio::join!(
        interrupt(world, queue, &victim, Duration::from_secs(10)),
        assert_eventually("the victim marked", WAIT, || marked(&nodes, &victim)),
    );
    assert!(record_of(&marked_node).is_some());
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, &steady.manager);
    // Whether the run reached the reclaimed node before AWS took it depends
    // on timing; either way the run ends Succeeded and the group settles.
    assert!(status.last_run.is_some());
    // Settled: the layout as recorded, one instance per ASG, none cordoned,
    // the reclaimed one gone.
    assert_eventually("settled", RUN, || async {
        let after = world.asg_snapshot(&kops.asgs).await;
        let layout = desired_counts(&after) == desired_counts(&before);
        let one_each = after.iter().all(|(_, _, ids)| ids.len() == 1);
        let nodes = world.nodes().await.unwrap_or_default();
        let none_cordoned = nodes
            .iter()
            .all(|n| n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true));
        let gone = nodes
            .iter()
            .all(|n| n.metadata.name.as_deref() != Some(victim.as_str()));
        let ready = ready_count(&steady.groups, "workers").await? == 3;
        (layout && one_each && none_cordoned && gone && ready).then_some(())
    })
    .await;
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

/// The group's instances launched since `before`, and whether `victim` is
/// still in its ASG.
async fn since(
    world: &support::World,
    asgs: &[String],
    before: &[String],
    victim: &str,
) -> (Vec<String>, bool) {
    let now = instances(world, asgs).await;
    let new = now
        .iter()
        .filter(|id| !before.contains(id))
        .cloned()
        .collect();
    (new, now.iter().any(|id| id == victim))
}

#[tokio::test]
async fn with_replace_a_rebalance_recommendation_replaces_first_and_a_following_warning_changes_nothing()
 {
    let steady = SteadyGroup::workers("int-rebalance")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    set_interruption(
        &steady,
        serde_json::json!({"onRebalanceRecommendation": "Replace"}),
    )
    .await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = instances(world, &kops.asgs).await;
    deploy_web(world, 6, 1).await;
    assert_web_ready(world, 6).await;

    // At risk: a replacement first, Ready, while the node keeps serving
    // (not cordoned); then the node drained and removed with decrement.
    let victim = before[0].2[0].clone();
    queue
        .send(&rebalance_recommendation(&victim, Utc::now()))
        .await;
    let replacement = assert_eventually("a replacement Ready beside it", WAIT, || async {
        let (new, present) = since(world, &kops.asgs, &original, &victim).await;
        assert!(present, "{victim} removed before its replacement was Ready");
        let new = new.into_iter().next()?;
        let node = world
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(new.as_str()))?;
        let ready = node
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(new)
    })
    .await;
    assert_eventually(
        "the at-risk node removed, the layout as before",
        RUN,
        || async {
            let (new, present) = since(world, &kops.asgs, &original, &victim).await;
            assert_eq!(new, std::slice::from_ref(&replacement), "one replacement");
            let layout =
                desired_counts(&world.asg_snapshot(&kops.asgs).await) == desired_counts(&before);
            let ready = ready_count(&steady.groups, "workers").await? == 3;
            (!present && layout && ready).then_some(())
        },
    )
    .await;
    assert_web_ready(world, 6).await;
    assert!(event_count(world, "RebalanceRecommendation").await >= 1);

    // A recommendation and then the interruption for the same instance:
    // handled once, one replacement.
    let original = instances(world, &kops.asgs).await;
    let victim = world.asg_snapshot(&kops.asgs).await[1].2[0].clone();
    queue
        .send(&rebalance_recommendation(&victim, Utc::now()))
        .await;
    assert_eventually("a replacement launched", WAIT, || async {
        let (new, _) = since(world, &kops.asgs, &original, &victim).await;
        (!new.is_empty()).then_some(())
    })
    .await;
    queue.send(&spot_warning(&victim, Utc::now())).await;
    assert_eventually("replaced once, the layout as before", RUN, || async {
        let (new, present) = since(world, &kops.asgs, &original, &victim).await;
        assert!(new.len() <= 1, "one replacement: {new:?}");
        let layout =
            desired_counts(&world.asg_snapshot(&kops.asgs).await) == desired_counts(&before);
        let ready = ready_count(&steady.groups, "workers").await? == 3;
        (!present && new.len() == 1 && layout && ready).then_some(())
    })
    .await;
    assert_eventually("the queue empty", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    let metrics = steady.manager.assert_metrics().await;
    assert_eq!(
        support::performed(&metrics, "set_desired_capacity"),
        2,
        "one raise per at-risk node: {metrics}"
    );
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

/// Suspends or resumes an ASG's Launch process.
async fn launch(world: &support::World, asg: &str, on: bool) {
    let api = &world.aws.autoscaling;
    if on {
        api.resume_processes()
            .auto_scaling_group_name(asg)
            .scaling_processes("Launch")
            .send()
            .await
            .expect("resume Launch");
    } else {
        api.suspend_processes()
            .auto_scaling_group_name(asg)
            .scaling_processes("Launch")
            .send()
            .await
            .expect("suspend Launch");
    }
}

#[tokio::test]
async fn when_its_own_asg_cannot_launch_the_replacement_comes_from_another_and_the_layout_comes_back()
 {
    let steady = SteadyGroup::workers("int-elsewhere")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = instances(world, &kops.asgs).await;
    let own = before[0].0.clone();
    let victim = before[0].2[0].clone();
    launch(world, &own, false).await;
    queue.send(&spot_warning(&victim, Utc::now())).await;
    // The replacement in another ASG, launched while the victim still runs.
    let elsewhere = assert_eventually("a replacement in another ASG", WAIT, || async {
        let snapshot = world.asg_snapshot(&kops.asgs).await;
        let (_, _, own_ids) = snapshot.iter().find(|(name, _, _)| *name == own)?;
        let new = snapshot
            .iter()
            .filter(|(name, _, _)| *name != own)
            .find(|(_, _, ids)| ids.iter().any(|id| !original.contains(id)))
            .map(|(name, _, _)| name.clone());
        assert!(
            new.is_some() || own_ids.contains(&victim),
            "{victim} left before a replacement was launched"
        );
        new
    })
    .await;
    // The victim removed by us without decrement: its ASG keeps its count
    // (and will launch one in its place once it can).
    assert_eventually("the victim removed, its ASG still at 1", WAIT, || async {
        let snapshot = world.asg_snapshot(&kops.asgs).await;
        let (_, desired, ids) = snapshot.iter().find(|(name, _, _)| *name == own)?;
        let ready = ready_count(&steady.groups, "workers").await? == 3;
        (ids.is_empty() && *desired == 1 && ready).then_some(())
    })
    .await;
    // Launch resumes: its ASG launches its own, and the other ASG's surplus
    // is drained and removed; the layout is the original one.
    launch(world, &own, true).await;
    let replenishers: Api<spot_node_manager::crd::Replenisher> = world.api();
    assert_eventually("the layout as before", RUN, || async {
        let snapshot = world.asg_snapshot(&kops.asgs).await;
        let one_each = snapshot.iter().all(|(_, _, ids)| ids.len() == 1);
        let layout = desired_counts(&snapshot) == desired_counts(&before);
        let ready = ready_count(&steady.groups, "workers").await? == 3;
        let settled = replenishers
            .get("workers")
            .await
            .ok()?
            .status?
            .raised
            .is_empty();
        (one_each && layout && ready && settled).then_some(())
    })
    .await;
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(
        &metrics,
        1,
        2,
        &format!("one raise, in {elsewhere} / the interrupted instance, then the surplus"),
    );
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

/// The ASG holding `instance`, from a snapshot.
fn asg_of(snapshot: &[(String, i32, Vec<String>)], instance: &str) -> String {
    snapshot
        .iter()
        .find(|(_, _, ids)| ids.iter().any(|id| id == instance))
        .map(|(name, _, _)| name.clone())
        .expect("the instance's ASG")
}

/// Settled after losing `lost`: the layout as before, one instance per ASG,
/// 3 Ready, none of `lost` left, and exactly one new instance per lost one.
async fn assert_settled(
    steady: &SteadyGroup,
    before: &[(String, i32, Vec<String>)],
    original: &[String],
    lost: &[String],
) {
    let (world, kops) = (&steady.world, &steady.kops);
    assert_eventually(
        "settled: layout, 3 Ready, one new per lost",
        RUN,
        || async {
            let after = world.asg_snapshot(&kops.asgs).await;
            let layout = desired_counts(&after) == desired_counts(before);
            let one_each = after.iter().all(|(_, _, ids)| ids.len() == 1);
            let now: Vec<String> = after.iter().flat_map(|(_, _, ids)| ids.clone()).collect();
            let new = now.iter().filter(|id| !original.contains(id)).count();
            let gone = lost.iter().all(|id| !now.contains(id));
            let nodes_gone = world.nodes().await.unwrap_or_default().iter().all(|n| {
                !lost
                    .iter()
                    .any(|id| n.metadata.name.as_deref() == Some(id.as_str()))
            });
            let ready = ready_count(&steady.groups, "workers").await? == 3;
            (layout && one_each && new == lost.len() && gone && nodes_gone && ready).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn an_asg_terminate_lifecycle_action_is_drained_kept_waiting_by_heartbeats_then_completed() {
    let steady = SteadyGroup::workers("int-hook")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    // The drain outlasts the hook's heartbeat timeout: a budget holds every
    // web pod until the 12 s deadline.
    set_interruption(&steady, serde_json::json!({"drainDeadline": "12s"})).await;
    deploy_web(world, 6, 0).await;
    assert_web_ready(world, 6).await;
    let victim = node_with_web_pods(world, 1).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = instances(world, &kops.asgs).await;
    let asg = asg_of(&before, &victim);
    // kops's hook, notifying the queue directly: the ASG holds a leaving
    // instance for its handler, 4 s at most without a heartbeat. (AWS's least
    // is 30 s; compressed like every timing here so that the drain outlasts
    // it within seconds. The manager reads the timeout from the hook, so only
    // the ratio of drain to timeout matters.)
    world
        .terminate_hook(&asg, "kops-nth-lifecycle-hook", queue, 4)
        .await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    // An operator replaces the instance through its ASG.
    world.terminate_through_asg(&victim).await;
    let held_since = std::time::Instant::now();
    let node = assert_eventually("the node marked", WAIT, || marked(&nodes, &victim)).await;
    assert_eq!(
        world.lifecycle_state(&asg, &victim).await.as_deref(),
        Some("Terminating:Wait"),
        "the node must be marked while its instance is held"
    );
    let record = record_of(&node).expect("record");
    assert_eq!(record.kind, "terminate_lifecycle_action");
    assert_eq!(
        record.lifecycle.as_ref().map(|a| a.hook.as_str()),
        Some("kops-nth-lifecycle-hook")
    );
    // Its ASG launches the replacement while the instance is held.
    assert_eventually("a replacement beside the held instance", WAIT, || async {
        let ids = world.asg_instances(&asg).await;
        assert!(
            ids.contains(&victim),
            "{victim} left before a replacement came"
        );
        ids.iter().any(|id| !original.contains(id)).then_some(())
    })
    .await;
    // Two heartbeat timeouts later the ASG still holds it: heartbeats.
    tokio::time::sleep(Duration::from_secs(9).saturating_sub(held_since.elapsed())).await;
    assert_eq!(
        world.lifecycle_state(&asg, &victim).await.as_deref(),
        Some("Terminating:Wait"),
        "the hook timed out: no heartbeat"
    );
    // The deadline ends the drain, nothing evicted against the budget: what
    // it left is reported (the node itself goes a moment later, so the
    // Event on the group is what stays to be read).
    assert_eventually("the drain's end reported", WAIT, || async {
        (event_count(world, "InterruptionDrainIncomplete").await >= 1).then_some(())
    })
    .await;
    // Then the action is completed and the ASG lets the instance go.
    assert_eventually("completed: the held instance gone", WAIT, || async {
        world
            .lifecycle_state(&asg, &victim)
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_settled(&steady, &before, &original, std::slice::from_ref(&victim)).await;
    assert_eventually(
        "the notices deleted (and the hook's test)",
        WAIT,
        || async { (queue.remaining().await == 0).then_some(()) },
    )
    .await;
    let metrics = steady.manager.assert_metrics().await;
    let heartbeats = support::performed(&metrics, "lifecycle_action_heartbeat");
    assert!(heartbeats >= 2, "{heartbeats} heartbeats: {metrics}");
    assert_eq!(
        support::performed(&metrics, "complete_lifecycle_action"),
        1,
        "{metrics}"
    );
    // Its ASG replaced it: nothing ordered or removed by us.
    assert_orders(&metrics, 0, 0, "its ASG replaces it: nothing ordered by us");
    assert!(event_count(world, "LifecycleActionCompleted").await >= 1);
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn a_scheduled_change_naming_two_nodes_replaces_both_before_their_loss() {
    let steady = SteadyGroup::workers("int-health")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    deploy_web(world, 6, 1).await;
    assert_web_ready(world, 6).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = instances(world, &kops.asgs).await;
    let victims = vec![before[0].2[0].clone(), before[1].2[0].clone()];
    let sampler = sample_web(world);
    // One AWS Health event retiring two of our instances.
    queue.send(&scheduled_change(&victims, Utc::now())).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    for victim in &victims {
        let node = assert_eventually("both marked", WAIT, || marked(&nodes, victim)).await;
        assert_eq!(
            record_of(&node).map(|r| r.kind).as_deref(),
            Some("scheduled_change")
        );
    }
    // A replacement in each victim's ASG while the victim still runs there.
    for (asg, _, _) in &before[..2] {
        assert_eventually("a replacement beside the victim", WAIT, || async {
            let ids = world.asg_instances(asg).await;
            assert!(
                victims.iter().any(|v| ids.contains(v)),
                "the victim left {asg} before a replacement was launched: {ids:?}"
            );
            ids.iter().any(|id| !original.contains(id)).then_some(())
        })
        .await;
    }
    assert_settled(&steady, &before, &original, &victims).await;
    // Their pods moved and stayed available.
    assert_eventually("6 Ready pods off the victims", WAIT, || async {
        let pods = ready_web_pods(world).await;
        (pods.len() == 6 && pods.iter().all(|(_, node)| !victims.contains(node))).then_some(())
    })
    .await;
    let samples = sampler.stop();
    assert!(samples.min_ready >= Some(5), "{samples:?}");
    assert_eq!(queue.remaining().await, 0);
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(
        &metrics,
        2,
        2,
        "one raise per victim / each victim removed by us",
    );
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn a_stopping_instance_is_cordoned_and_drained_and_its_asg_replaces_it_once() {
    let steady = SteadyGroup::workers("int-stopping")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    deploy_web(world, 6, 1).await;
    assert_web_ready(world, 6).await;
    let victim = node_with_web_pods(world, 1).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = instances(world, &kops.asgs).await;
    // AWS says it is stopping (its OS shuts down over the next seconds).
    queue
        .send(&state_change(&victim, "stopping", Utc::now()))
        .await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = assert_eventually("the node marked", WAIT, || marked(&nodes, &victim)).await;
    assert_eq!(
        record_of(&node).map(|r| r.kind).as_deref(),
        Some("state_change")
    );
    assert!(
        instances(world, &kops.asgs).await.contains(&victim),
        "marked before the instance went"
    );
    assert_eventually("its pods evicted", WAIT, || async {
        let pods = ready_web_pods(world).await;
        (pods.len() == 6 && pods.iter().all(|(_, node)| *node != victim)).then_some(())
    })
    .await;
    world.stop_instance(&victim).await;
    // Its ASG's health check replaces it; we order nothing.
    assert_settled(&steady, &before, &original, std::slice::from_ref(&victim)).await;
    assert_eq!(queue.remaining().await, 0);
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(&metrics, 0, 0, "its ASG replaces it: nothing ordered by us");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn with_ignore_a_rebalance_recommendation_writes_an_event_and_touches_nothing() {
    let steady = SteadyGroup::workers("int-ignore")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let before = world.asg_snapshot(&kops.asgs).await;
    let victim = before[0].2[0].clone();
    queue
        .send(&rebalance_recommendation(&victim, Utc::now()))
        .await;
    assert_eventually("the recommendation reported", WAIT, || async {
        (event_count(world, "RebalanceRecommendation").await >= 1).then_some(())
    })
    .await;
    assert_eventually("the message deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    // A few inventory syncs later (each would carry a record to the
    // replenisher): nothing recorded, cordoned, ordered or removed.
    steady
        .manager
        .idle_while_reconciling("inventory", &["workers"], Duration::from_secs(5))
        .await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = nodes.get(&victim).await.expect("the node");
    assert_eq!(record_of(&node), None);
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(&metrics, 0, 0, "Ignore: nothing ordered");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}

#[tokio::test]
async fn a_lifecycle_action_on_an_instance_that_never_joined_is_completed_at_once() {
    let steady = SteadyGroup::workers("int-hook-unjoined")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let asg = kops.asgs[0].clone();
    // One more instance in the first ASG, which never registers a Node.
    world
        .tag_asg(&asg, support::sim::NEVER_JOIN_TAG, "true")
        .await;
    let original = world.asg_instances(&asg).await;
    world
        .aws
        .autoscaling
        .set_desired_capacity()
        .auto_scaling_group_name(&asg)
        .desired_capacity(2)
        .send()
        .await
        .expect("raise");
    let late = assert_eventually("an instance that never joined", WAIT, || async {
        let status = steady.groups.get("workers").await.ok()?.status?;
        status
            .not_joined
            .into_iter()
            .map(|n| n.instance_id)
            .find(|id| !original.contains(id))
    })
    .await;
    // A hook whose timeout outlasts this test: only a completion by the
    // manager lets the instance go.
    world
        .terminate_hook(&asg, "kops-nth-lifecycle-hook", queue, 600)
        .await;
    world.terminate_through_asg(&late).await;
    assert_eventually("held, then completed and gone", WAIT, || async {
        world
            .lifecycle_state(&asg, &late)
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_eventually("the notices deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    let metrics = steady.manager.assert_metrics().await;
    assert_eq!(
        support::performed(&metrics, "complete_lifecycle_action"),
        1,
        "{metrics}"
    );
    assert_eq!(
        support::performed(&metrics, "lifecycle_action_heartbeat"),
        0
    );
    assert!(event_count(world, "LifecycleActionCompleted").await >= 1);
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
    world.cleanup().await;
}
