//! Spot warnings, duplicates, foreign and bad messages, shared queues, a kill between marking and deleting.

use super::*;

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
    assert_event(world, "InterruptionNotice").await;
    let metrics = steady.manager.assert_metrics().await;
    assert!(
        metrics.contains(
            "spot_node_manager_interruption_messages_total{kind=\"spot_interruption\",outcome=\"acted\"} 1"
        ),
        "{metrics}"
    );
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
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
    // Not ours and past the grace given to an instance the inventory may
    // not have recorded yet: deleted.
    let past_grace = Utc::now() - chrono::Duration::seconds(61);
    queue
        .send(&spot_warning("i-0123456789abcdef0", past_grace))
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
}

#[tokio::test]
async fn on_a_shared_queue_a_foreign_notice_is_left_for_its_cluster() {
    let steady = SteadyGroup::workers("int-shared")
        .interruption_queue()
        .manager_config("interruption:\n  foreignMessages: Leave\n")
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let theirs = "i-0123456789abcdef0";
    queue.send(&spot_warning(theirs, Utc::now())).await;
    // What we cannot read, and what we do not handle, may be another
    // handler's too.
    queue.send("{not json").await;
    queue
        .send(r#"{"Event": "autoscaling:TEST_NOTIFICATION", "AutoScalingGroupName": "x"}"#)
        .await;
    // One retirement naming one of ours and one of theirs (within the
    // group's scheduledChangeLead: marked in full at once).
    let ours = world.asg_snapshot(&kops.asgs).await[0].2[0].clone();
    queue
        .send(&scheduled_event(
            &[ours.clone(), theirs.to_string()],
            "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            Utc::now(),
            Utc::now() + chrono::Duration::minutes(30),
        ))
        .await;
    let metrics = assert_eventually("every message seen", WAIT, || async {
        let m = steady.manager.assert_metrics().await;
        (m.contains("outcome=\"foreign_left\"")
            && m.contains("outcome=\"rejected\"")
            && m.contains("outcome=\"ignored\"")
            && m.contains("outcome=\"acted\""))
        .then_some(m)
    })
    .await;
    assert!(
        !metrics.contains("outcome=\"foreign_deleted\""),
        "{metrics}"
    );
    let nodes: Api<Node> = Api::all(world.client.clone());
    assert_eventually("ours marked", WAIT, || marked(&nodes, &ours)).await;
    assert_eq!(queue.remaining().await, 4, "all left on the queue");
    let nodes = world.nodes().await.unwrap_or_default();
    let recorded: Vec<String> = nodes
        .iter()
        .filter_map(|n| record_of(n).map(|r| r.instance_id))
        .collect();
    assert_eq!(recorded, vec![ours], "only ours is marked");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
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
    let victim_node = marked(&nodes, &victim)
        .await
        .expect("marked before the crash");
    // Every version of the victim's Node from here on, watched: a get after
    // the drain found no Node once the instance was gone, and checked
    // nothing.
    let taints = TaintsSeen::watch(&nodes, &victim_node.metadata.name.unwrap_or_default());
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
    let (versions, most) = taints.stop().await;
    assert!(versions >= 1, "the victim's Node never seen");
    assert!(most <= 1, "our taint put on twice: {most} at once");
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
}

#[tokio::test]
async fn a_node_of_an_instance_group_no_nodegroup_names_is_cordoned_and_drained_not_replaced() {
    let steady = SteadyGroup::workers("int-unnamed")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    // A kops instance group nobody named in a NodeGroup.
    let spare = world
        .kops_group("spare", &[support::ZONES[0]], 1, &[])
        .await;
    let instance = world.asg_instances(&spare.asgs[0]).await[0].clone();
    let nodes: Api<Node> = Api::all(world.client.clone());
    assert_eventually("the spare node joined", WAIT, || async {
        world.nodes().await?.into_iter().find(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| p.ends_with(instance.as_str()))
        })
    })
    .await;
    let before = world.asg_snapshot(&kops.asgs).await;
    let spare_before = world.asg_snapshot(&spare.asgs).await;
    queue.send(&spot_warning(&instance, Utc::now())).await;
    let node = assert_eventually("the spare node marked", WAIT, || marked(&nodes, &instance)).await;
    let record = record_of(&node).expect("record");
    assert_eq!(record.group, None);
    assert_eq!((record.deadline - record.noticed).num_seconds(), 90);
    // Drained (nothing of ours runs there), recorded on the node.
    assert_eventually("its drain recorded", WAIT, || async {
        let node = marked(&nodes, &instance).await?;
        record_of(&node)?.drained
    })
    .await;
    assert_eventually("the message deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    // Nothing replaced or terminated by us, here or in the group.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let metrics = steady.manager.assert_metrics().await;
    assert_orders(&metrics, 0, 0, "a node of no group is never replaced by us");
    assert!(metrics.contains("outcome=\"unmanaged\""), "{metrics}");
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    assert_eq!(world.asg_snapshot(&spare.asgs).await, spare_before);
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

/// The group's Events with `reason`, as (the node they are related to, the
/// note, how many times the series counted it).
async fn group_events(world: &support::World, reason: &str) -> Vec<(String, String, i32)> {
    events_with_reason(world, reason)
        .await
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("NodeGroup"))
        .map(|e| {
            let related = e.related.as_ref().and_then(|r| r.name.clone());
            let count = e.series.as_ref().map_or(1, |s| s.count);
            (
                related.unwrap_or_default(),
                e.note.unwrap_or_default(),
                count,
            )
        })
        .collect()
}

#[tokio::test]
async fn each_warned_node_has_its_own_events_on_the_group_naming_it() {
    // kube's recorder makes an Event with the same object and reason the
    // next of a series, keeping the first note: the group's Events named the
    // first node only, and a burst raced to patch that one object.
    let steady = SteadyGroup::workers("int-events")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let before = world.asg_snapshot(&kops.asgs).await;
    let victims = [before[0].2[0].clone(), before[1].2[0].clone()];
    // One after the other: the second node's Events come while the first
    // node's are known to the recorder.
    for victim in &victims {
        queue.send(&spot_warning(victim, Utc::now())).await;
        assert_eventually("the node's drain reported", WAIT, || async {
            let events = group_events(world, "InterruptionDrained").await;
            events
                .iter()
                .any(|(related, note, _)| related == victim || note.contains(victim.as_str()))
                .then_some(())
        })
        .await;
    }
    for reason in ["InterruptionNotice", "InterruptionDrained"] {
        let events = assert_eventually("an Event per node on the group", WAIT, || async {
            let events = group_events(world, reason).await;
            let related = |v: &String| events.iter().any(|(r, _, _)| r == v);
            victims.iter().all(related).then_some(events)
        })
        .await;
        // Each node's own Events name it. A drain is reported once (another
        // test's manager, scoped to its own namespace, once drained and
        // reported it too); a notice may be noted again when its message is
        // redelivered.
        for victim in &victims {
            let own: Vec<_> = events.iter().filter(|(r, _, _)| r == victim).collect();
            assert!(!own.is_empty(), "{reason}: {events:?}");
            if reason == "InterruptionDrained" {
                let reports: i32 = own.iter().map(|(_, _, count)| count).sum();
                assert_eq!(reports, 1, "{reason}: {own:?}");
            }
            assert!(
                own.iter()
                    .all(|(_, note, _)| note.contains(victim.as_str())),
                "{reason}: {own:?}"
            );
        }
    }
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

#[tokio::test]
async fn a_manager_of_another_namespace_leaves_a_node_this_one_marked_alone() {
    // Nodes are the cluster's, and managers may each manage one namespace.
    // Each drainer watched every marked Node: a neighbour drained this one
    // too and reported it on our group (two Events for one drain); with a
    // lifecycle action it would have completed it as well.
    let steady = SteadyGroup::workers("int-scope")
        .interruption_queue()
        .start()
        .await;
    let (world, queue) = (&steady.world, steady.queue());
    let other = support::World::new("int-scope-other").await;
    let other_queue = other.queue("interruptions").await;
    let (neighbour, _config) =
        other.start_manager(&["--interruption-queue-url", other_queue.url.as_str()]);
    assert_eventually("the neighbour's drainer running", WAIT, || async {
        let logs = neighbour.logs();
        logs.lines()
            .any(|l| l.contains("controller started") && l.contains("interruption-drain"))
            .then_some(())
    })
    .await;
    // A drain the budget holds to its deadline: a neighbour that acted would
    // be evicting all the while.
    set_interruption(&steady, serde_json::json!({"drainDeadline": "10s"})).await;
    deploy_web(world, 6, 0).await;
    assert_web_ready(world, 6).await;
    let victim = node_with_web_pods(world, 1).await;
    queue.send(&spot_warning(&victim, Utc::now())).await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = assert_eventually("the node marked", WAIT, || marked(&nodes, &victim)).await;
    let record = record_of(&node).expect("record");
    assert_eq!(record.scope.as_deref(), Some(world.namespace.as_str()));
    assert_eventually("the drain's end recorded", WAIT, || {
        drain_ended(&steady.groups, &victim)
    })
    .await;
    // The neighbour looked at the marked node, and left it to us.
    assert_eventually(
        "the neighbour's drainer looked at the node",
        WAIT,
        || async {
            neighbour
                .logs()
                .lines()
                .any(|l| {
                    l.contains("interruption-drain")
                        && l.contains(victim.as_str())
                        && l.contains("reconcile ended")
                })
                .then_some(())
        },
    )
    .await;
    let metrics = neighbour.assert_metrics().await;
    for action in ["cordon_node", "evict_pod", "record_interruption_drain"] {
        let done = support::performed_in_kubernetes(&metrics, action);
        assert_eq!(done, 0, "{action}: {metrics}");
    }
    // (The series is the one the manager writes: ours has it.)
    let ours = steady.manager.assert_metrics().await;
    let recorded = support::performed_in_kubernetes(&ours, "record_interruption_drain");
    assert_eq!(recorded, 1, "{ours}");
    assert!(
        neighbour
            .logs()
            .contains("marked by a manager of another namespace"),
        "{}",
        neighbour.logs()
    );
    let reports: i32 = group_events(world, "InterruptionDrainIncomplete")
        .await
        .iter()
        .filter(|(related, _, _)| *related == victim)
        .map(|(_, _, count)| count)
        .sum();
    assert_eq!(reports, 1, "one drain, reported once");
    assert!(neighbour.child_alive(), "{}", neighbour.logs());
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

/// The most of our taints one Node carried at once, over every version of
/// it a watch saw, and how many versions it saw.
struct TaintsSeen {
    seen: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
    task: tokio::task::JoinHandle<()>,
}

impl TaintsSeen {
    fn watch(nodes: &Api<Node>, name: &str) -> TaintsSeen {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let seen: std::sync::Arc<std::sync::Mutex<(usize, usize)>> = Default::default();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (nodes, out) = (nodes.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let mut events = watcher(nodes, config)
                .default_backoff()
                .touched_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(node) = event else { continue };
                let mut s = out.lock().expect("taints");
                s.0 += 1;
                s.1 = s.1.max(our_taints(&node));
            }
        });
        TaintsSeen { seen, task }
    }

    /// (versions seen, most taints at once), after a moment for the last
    /// updates to arrive.
    async fn stop(self) -> (usize, usize) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.task.abort();
        *self.seen.lock().expect("taints")
    }
}
