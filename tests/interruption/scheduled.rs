//! AWS Health scheduled changes keep their real start; a reboot is only
//! reported; a notice that arrives after its deadline still drains.

use super::*;

#[tokio::test]
async fn a_scheduled_reboot_is_reported_and_nothing_is_cordoned_or_replaced() {
    let steady = SteadyGroup::workers("int-reboot")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let before = world.asg_snapshot(&kops.asgs).await;
    let victim = before[0].2[0].clone();
    let start = Utc::now() + chrono::Duration::days(3);
    queue
        .send(&scheduled_event(
            std::slice::from_ref(&victim),
            "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
            Utc::now(),
            start,
        ))
        .await;
    assert_eventually("the reboot reported", WAIT, || async {
        (event_count(world, "ScheduledMaintenance").await >= 1).then_some(())
    })
    .await;
    assert_eventually("the message deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    // A few resyncs later: the node serves on, nothing ordered of AWS.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let nodes = world.nodes().await.unwrap_or_default();
    let node = nodes
        .iter()
        .find(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| p.ends_with(victim.as_str()))
        })
        .expect("the victim's node");
    assert_eq!(record_of(node), None, "not recorded as a loss");
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert_eq!(our_taints(node), 0);
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(&metrics, 0, 0, "a reboot replaces nothing");
    assert!(
        metrics.contains("kind=\"scheduled_maintenance\""),
        "{metrics}"
    );
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

#[tokio::test]
async fn a_warning_that_arrives_after_its_deadline_still_evicts_and_says_it_came_late() {
    let steady = SteadyGroup::workers("int-late")
        .interruption_queue()
        .start()
        .await;
    let (world, queue) = (&steady.world, steady.queue());
    // A budget that lets every pod go: the test is about the late notice.
    deploy_web(world, 6, 6).await;
    assert_web_ready(world, 6).await;
    let victim = node_with_web_pods(world, 1).await;
    // Sent by AWS 100 s ago: past the 90 s drain deadline, 20 s before the
    // instance goes.
    let sent = Utc::now() - chrono::Duration::seconds(100);
    queue.send(&spot_warning(&victim, sent)).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = assert_eventually("the node marked", WAIT, || marked(&nodes, &victim)).await;
    let record = record_of(&node).expect("record");
    assert_eq!(record.late, Some(true), "{record:?}");
    assert!(record.deadline > Utc::now() - chrono::Duration::seconds(30));
    assert_eventually("the drain's end recorded", WAIT, || {
        drain_ended(&steady.groups, &victim)
    })
    .await;
    // Its pods were evicted (today's code recorded them all as left).
    assert_event(world, "InterruptionDrained").await;
    assert_eq!(event_count(world, "InterruptionDrainIncomplete").await, 0);
    let last = world.group_status("workers").await.last_interruption;
    let last = last.expect("last interruption");
    assert_eq!(last.late, Some(true), "{last:?}");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

/// Issue 54, hole 4: a retirement AWS schedules days ahead was drained on
/// the notice (its node cordoned, its master leaving, for days). Now the
/// node serves on until `scheduledChangeLead` before AWS takes it, then is
/// cordoned, replaced and drained, and removed by us before AWS's time.
#[tokio::test]
async fn a_scheduled_retirement_serves_on_until_its_lead_then_is_replaced_and_drained() {
    let steady = SteadyGroup::workers("int-lead")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    set_interruption(&steady, serde_json::json!({"scheduledChangeLead": "10m"})).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = instances(world, &kops.asgs).await;
    let victim = before[0].2[0].clone();
    // AWS gives the start to the second; the drain starts 10 minutes
    // before it, 45 s from now.
    let now = Utc::now();
    let start = now - chrono::Duration::nanoseconds(now.timestamp_subsec_nanos().into())
        + chrono::Duration::seconds(600 + 45);
    let drain_from = start - chrono::Duration::seconds(600);
    queue
        .send(&scheduled_event(
            std::slice::from_ref(&victim),
            "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            now,
            start,
        ))
        .await;
    let record = assert_eventually("the retirement recorded", WAIT, || async {
        let node = nodes.get(&victim).await.ok()?;
        record_of(&node)
    })
    .await;
    assert_eq!(record.loss_at, Some(start), "{record:?}");
    assert_eq!(record.drain_from, Some(drain_from), "{record:?}");
    assert!(
        Utc::now() < drain_from,
        "recorded only after its drain start: the receiver took over 45 s"
    );
    // Before its drain start: in service, nothing launched or ordered.
    let node = nodes.get(&victim).await.expect("the victim's node");
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert_eq!(our_taints(&node), 0);
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    assert_eq!(ready_count(&steady.groups, "workers").await, Some(3));
    let announced = events_with_reason(world, "InterruptionNotice").await;
    assert!(
        announced.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|m| m.contains("serves on until"))),
        "{announced:?}"
    );
    // From its drain start: cordoned and tainted, never before.
    assert_eventually("cordoned from its drain start", RUN, || async {
        let node = marked(&nodes, &victim).await?;
        Some(node)
    })
    .await;
    assert!(Utc::now() >= drain_from, "cordoned before its drain start");
    // Replaced, drained and removed by us, long before AWS's time.
    assert_settled(&steady, &before, &original, std::slice::from_ref(&victim)).await;
    assert!(Utc::now() < start - chrono::Duration::seconds(300));
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}
