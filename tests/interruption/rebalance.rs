//! Rebalance recommendations (Replace and Ignore), and the replacement from another ASG when the node's own cannot launch.

use super::*;

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
    assert_event(world, "RebalanceRecommendation").await;

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
        .idle_while_reconciling("inventory", &["workers"], Duration::from_secs(10))
        .await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = nodes.get(&victim).await.expect("the node");
    assert_eq!(record_of(&node), None);
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(&metrics, 0, 0, "Ignore: nothing ordered");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

/// Issue 54, hole 5: AWS never withdraws a rebalance recommendation. One
/// whose node no ASG can replace (every instance group at its max, as
/// kops's often are: min = max) holds that node at risk, out of the Ready
/// count, for `AT_RISK_FOR` from AWS's time only; then the node counts as
/// Ready again. Before, it stayed out of the count for its whole life.
#[tokio::test]
async fn a_rebalance_recommendation_no_asg_can_replace_holds_its_node_at_risk_for_a_while_only() {
    use spot_node_manager::crd::nodegroup::AT_RISK_FOR;
    let steady = SteadyGroup::workers("int-risk-ends")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    set_interruption(
        &steady,
        serde_json::json!({"onRebalanceRecommendation": "Replace"}),
    )
    .await;
    steady.every_asg_at_max("workers").await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let victim = before[0].2[0].clone();
    // Sent by AWS as if 90 s short of the hold ago: it ends within the test.
    let hold = chrono::Duration::from_std(AT_RISK_FOR).expect("the hold");
    let sent = Utc::now() - hold + chrono::Duration::seconds(90);
    queue.send(&rebalance_recommendation(&victim, sent)).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let replenishers: Api<spot_node_manager::crd::Replenisher> = world.api();
    let replenished = || async {
        let status = replenishers.get("workers").await.ok()?.status?;
        let c = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Replenished")?;
        Some((c.status, c.message))
    };
    // At risk: out of the replenisher's Ready count, and kept (nothing can
    // replace it).
    assert_eventually("the node at risk, out of the count", WAIT, || async {
        let record = record_of(&nodes.get(&victim).await.ok()?)?;
        let (_, message) = replenished().await?;
        let kept = message.contains(&format!("{victim} at risk of interruption, serving on"));
        (record.kind == "rebalance_recommendation" && kept).then_some(())
    })
    .await;
    // Its time over: Ready again, the group replenished at 3.
    assert_eventually("counted Ready again", RUN, || async {
        let (status, message) = replenished().await?;
        (format!("{status:?}") == "True" && message == "3/3 Ready").then_some(())
    })
    .await;
    // The node kept throughout; nothing raised or removed for it.
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let node = nodes.get(&victim).await.expect("the node");
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(&metrics, 0, 0, "no ASG could replace it: nothing ordered");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}
