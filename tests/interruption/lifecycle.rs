//! ASG terminate lifecycle actions, scheduled changes naming two nodes, stopping instances.

use super::*;

#[tokio::test]
async fn an_asg_terminate_lifecycle_action_is_drained_kept_waiting_by_heartbeats_then_completed() {
    let steady = SteadyGroup::workers("int-hook")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    // The drain outlasts the hook's heartbeat timeout: a budget holds every
    // web pod until the 24 s deadline.
    set_interruption(&steady, serde_json::json!({"drainDeadline": "24s"})).await;
    deploy_web(world, 6, 0).await;
    assert_web_ready(world, 6).await;
    let victim = node_with_web_pods(world, 1).await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = instances(world, &kops.asgs).await;
    let asg = asg_of(&before, &victim);
    // kops's hook, notifying the queue directly: the ASG holds a leaving
    // instance for its handler, 8 s at most without a heartbeat. (AWS's least
    // is 30 s; compressed like every timing here so that the drain outlasts
    // it within seconds. The manager reads the timeout from the hook, so only
    // the ratio of drain to timeout matters. With 4 s it failed once in CI
    // under the full suite's load, where a heartbeat due every 2 s can be late.)
    world
        .terminate_hook(&asg, "kops-nth-lifecycle-hook", queue, 8)
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
    tokio::time::sleep(Duration::from_secs(18).saturating_sub(held_since.elapsed())).await;
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
    assert_released(world, &asg, &victim, "completed: the held instance gone").await;
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
    assert_event(world, "LifecycleActionCompleted").await;
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
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
    let sampler = sample_web(world).await;
    // One AWS Health event retiring two of our instances in two days, with
    // a group that replaces them two days ahead: at once.
    set_interruption(&steady, serde_json::json!({"scheduledChangeLead": "48h"})).await;
    let sent = Utc::now();
    let start = sent + chrono::Duration::days(2);
    let start = start - chrono::Duration::nanoseconds(start.timestamp_subsec_nanos().into());
    queue
        .send(&scheduled_event(
            &victims,
            "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            sent,
            start,
        ))
        .await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    for victim in &victims {
        let node = assert_eventually("both marked", WAIT, || marked(&nodes, victim)).await;
        let record = record_of(&node).expect("record");
        assert_eq!(record.kind, "scheduled_change");
        // The real start, not two minutes from the notice; drained the
        // group's drainDeadline (90 s) before it.
        assert_eq!(record.loss_at, Some(start), "{record:?}");
        assert_eq!(record.deadline, start - chrono::Duration::seconds(90));
        assert_eq!(record.drain_from, Some(start - chrono::Duration::hours(48)));
    }
    let last = assert_eventually("the group reports the start", WAIT, || async {
        steady
            .groups
            .get("workers")
            .await
            .ok()?
            .status?
            .last_interruption
    })
    .await;
    assert_eq!(last.loss_at, Some(start), "{last:?}");
    assert_eq!(last.deadline, Some(start - chrono::Duration::seconds(90)));
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
    let samples = sampler.stop().await;
    assert!(samples.min_ready() >= 5, "{samples:?}");
    assert_eq!(queue.remaining().await, 0);
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(
        &metrics,
        2,
        2,
        "one raise per victim / each victim removed by us",
    );
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
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
    assert_released(world, &asg, &late, "held, then completed and gone").await;
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
    assert_event(world, "LifecycleActionCompleted").await;
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

/// Persist, then act, for the drain's end: a manager killed once the end
/// is recorded on the Node and before the lifecycle action it lets go is
/// completed (`interruption-drain:terminate:persisted`, the one executor's
/// crash point between the two) leaves the instance held; the next manager
/// completes the action, once, and does not tell the drain again.
#[tokio::test]
async fn a_manager_killed_between_a_drains_end_and_its_lifecycle_completion_completes_it_once() {
    let mut steady = SteadyGroup::workers("int-hook-kill")
        .interruption_queue()
        .start()
        .await;
    steady.manager.kill();
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let flags = ["--interruption-queue-url", queue.url.as_str()];
    let config = "resyncInterval: 2s\n";
    let point = "interruption-drain:terminate:persisted";
    let (mut first, _c1) = world.start_manager_with(config, &flags, &[("SNM_CRASH_AT", point)]);
    let before = world.asg_snapshot(&kops.asgs).await;
    let victim = before[0].2[0].clone();
    let asg = asg_of(&before, &victim);
    // A heartbeat timeout long enough for a restart: the completion must be
    // the next manager's, not the hook's timeout.
    world
        .terminate_hook(&asg, "kops-nth-lifecycle-hook", queue, 120)
        .await;
    world.terminate_through_asg(&victim).await;
    assert_eventually("a crash once the drain's end is recorded", WAIT, || async {
        (!first.child_alive()).then_some(())
    })
    .await;
    assert!(
        first.logs().contains(&format!("crash point {point}")),
        "{}",
        first.logs()
    );
    first.kill();
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = marked(&nodes, &victim).await.expect("still marked");
    let record = record_of(&node).expect("record");
    assert!(
        record.drained.is_some(),
        "the end recorded first: {record:?}"
    );
    assert_eq!(
        record.lifecycle.as_ref().map(|a| a.completed),
        Some(None),
        "not completed before the crash: {record:?}"
    );
    assert_eq!(
        world.lifecycle_state(&asg, &victim).await.as_deref(),
        Some("Terminating:Wait"),
        "held: the action is not completed"
    );
    // Told once, before the completion's crash point.
    assert_eventually("the drain's end told", WAIT, || async {
        (event_count(world, "InterruptionDrained").await == 1).then_some(())
    })
    .await;
    let (second, _c2) = world.start_manager_with(config, &flags, &[]);
    assert_released(world, &asg, &victim, "completed: the held instance gone").await;
    assert_event(world, "LifecycleActionCompleted").await;
    let metrics = second.assert_metrics().await;
    assert_eq!(
        support::performed(&metrics, "complete_lifecycle_action"),
        1,
        "{metrics}"
    );
    assert_eq!(
        event_count(world, "InterruptionDrained").await,
        1,
        "the drain's end told twice"
    );
    assert!(second.child_alive(), "{}", second.logs());
}
