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
    let last = steady
        .groups
        .get("workers")
        .await
        .expect("group")
        .status
        .and_then(|s| s.last_interruption)
        .expect("last interruption");
    assert_eq!(last.late, Some(true), "{last:?}");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}
