//! Draining a warned node by its deadline, what a budget holds, an interruption during a refresh.

use super::*;

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
    let sampler = sample_web(world).await;
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
    let samples = sampler.stop().await;
    assert!(samples.min_ready() >= 5, "{samples:?}");
    assert_event(world, "InterruptionDrained").await;
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
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
    let sampler = sample_web(world).await;
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
    let samples = sampler.stop().await;
    assert_eq!(samples.min_ready(), 6, "{samples:?}");
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
}
