//! The node inventory end to end: real apiserver + moto + simulated kubelet,
//! and the manager as a separate process.

use snm_testkit as support;

use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use spot_node_manager::crd::condition::find;
use spot_node_manager::crd::{ConditionStatus, NodeGroup, NodeGroupStatus, Refresher, Replenisher};
use std::time::Duration;
use support::{World, ZONES, assert_eventually, unscheduled};

const WAIT: Duration = Duration::from_secs(60);
const FAST: Duration = Duration::from_millis(300);

fn worker_group(name: &str, asgs: &[String], desired: i32, extra: serde_json::Value) -> NodeGroup {
    support::refresh::node_group(name, "Worker", asgs, desired, extra)
}

async fn status_of(api: &Api<NodeGroup>, name: &str) -> Option<NodeGroupStatus> {
    api.get(name).await.ok()?.status
}

/// Condition `type_` of group `workers`, once it is `value`: (value, reason, message).
async fn workers_condition(
    groups: Api<NodeGroup>,
    type_: &str,
    value: ConditionStatus,
) -> Option<(ConditionStatus, String, String)> {
    condition(&status_of(&groups, "workers").await?, type_).filter(|(v, _, _)| *v == value)
}

fn condition(status: &NodeGroupStatus, type_: &str) -> Option<(ConditionStatus, String, String)> {
    find(&status.conditions, type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn nodes_in_three_asgs_are_mapped_with_readiness_and_cordons() {
    let world = World::new("inv-map").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    // The third ASG's instance reports NotReady.
    let not_ready_id = world.asg_instances(&kops.asgs[2]).await.remove(0);
    world
        .tag_asg(
            &kops.asgs[2],
            snm_testkit::sim::NOT_READY_TAG,
            &not_ready_id,
        )
        .await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&worker_group(
            "workers",
            &kops.asgs,
            3,
            serde_json::json!({}),
        ))
        .await;
    let (_manager, _config) = world.start_manager(&[]);

    let status = assert_eventually("3 nodes inventoried", WAIT, || async {
        let s = status_of(&groups, "workers").await?;
        (s.nodes.len() == 3 && s.ready_nodes == Some(2)).then_some(s)
    })
    .await;
    for (i, asg) in kops.asgs.iter().enumerate() {
        let id = world.asg_instances(asg).await.remove(0);
        let node = status
            .nodes
            .iter()
            .find(|n| n.name == id)
            .unwrap_or_else(|| panic!("node {id} listed"));
        assert_eq!(node.instance_id.as_deref(), Some(id.as_str()));
        assert_eq!(node.auto_scaling_group.as_deref(), Some(asg.as_str()));
        assert_eq!(node.availability_zone.as_deref(), Some(ZONES[i]));
        assert!(node.launch_time.is_some());
        assert!(node.instance_type.is_some());
        assert_eq!(node.ready, id != not_ready_id);
    }
    assert_eq!(status.desired_nodes, Some(3));
    assert!(status.not_joined.is_empty(), "{:?}", status.not_joined);
    assert_eq!(status.auto_scaling_groups.len(), 3);
    assert!(
        status
            .auto_scaling_groups
            .iter()
            .all(|a| a.launching && a.desired == 1 && a.instances == 1)
    );
    let (synced, _, _) = condition(&status, "InventorySynced").expect("synced");
    assert_eq!(synced, ConditionStatus::True);

    // Cordon one node: the inventory says so.
    let cordon_id = world.asg_instances(&kops.asgs[0]).await.remove(0);
    world.cordon(&cordon_id).await;
    assert_eventually("cordon reported", WAIT, || async {
        let s = status_of(&groups, "workers").await?;
        s.nodes
            .iter()
            .any(|n| n.name == cordon_id && n.unschedulable)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn never_joined_instances_and_bad_provider_ids_are_reported() {
    let world = World::new("inv-join").await;
    let layout = world.joined_and_never_joining().await;
    let never_id = layout.first.clone();
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    let group = worker_group("workers", &layout.asgs, 2, serde_json::json!({}));
    world.create_group(&group).await;
    // A Node of this group whose providerID names no AWS instance.
    let nodes: Api<Node> = Api::all(world.client.clone());
    let bad_name = format!("{}-bad-provider", world.prefix());
    nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(bad_name.clone()),
                    labels: Some(
                        [(
                            "kops.k8s.io/instancegroup".to_string(),
                            layout.joined_instance_group.clone(),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
                spec: Some(NodeSpec {
                    provider_id: Some("kind://docker/not-aws".into()),
                    ..Default::default()
                }),
                status: None,
            },
        )
        .await
        .expect("create bad node");
    let (_manager, _config) = world.start_manager(&[]);

    let status = assert_eventually("not-joined and bad node reported", WAIT, || async {
        let s = status_of(&groups, "workers").await?;
        (s.not_joined.len() == 1 && s.nodes.len() == 2 && s.ready_nodes == Some(1)).then_some(s)
    })
    .await;
    let late = &status.not_joined[0];
    assert_eq!(late.instance_id, never_id);
    assert_eq!(late.auto_scaling_group, layout.late_asg);
    assert!(late.launch_time.is_some(), "launch time comes from EC2");
    let bad = status
        .nodes
        .iter()
        .find(|n| n.name == bad_name)
        .expect("bad node listed");
    assert!(bad.instance_id.is_none());
    assert!(
        bad.problem
            .as_deref()
            .is_some_and(|p| p.contains("kind://docker/not-aws")),
        "{bad:?}"
    );
    let good = status
        .nodes
        .iter()
        .find(|n| n.name != bad_name)
        .expect("good node");
    assert_eq!(
        good.auto_scaling_group.as_deref(),
        Some(layout.joined_asg.as_str())
    );
    let _ = nodes.delete(&bad_name, &Default::default()).await;
}

#[tokio::test]
async fn an_unknown_asg_degrades_only_its_group() {
    let world = World::new("inv-missing").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    let typo = format!("{}-nodes-typo.example.com", world.prefix());
    world
        .create_group(&worker_group(
            "broken",
            std::slice::from_ref(&typo),
            1,
            serde_json::json!({}),
        ))
        .await;
    world
        .create_group(&worker_group("fine", &kops.asgs, 1, serde_json::json!({})))
        .await;
    let (manager, _config) = world.start_manager(&[]);

    let (degraded, reason, message) = assert_eventually("broken degraded", WAIT, || async {
        condition(&status_of(&groups, "broken").await?, "Degraded")
    })
    .await;
    assert_eq!(
        (degraded, reason.as_str()),
        (ConditionStatus::True, "AutoScalingGroupNotFound")
    );
    assert!(message.contains(&typo), "{message}");
    assert_eventually("fine is fine", WAIT, || async {
        let s = status_of(&groups, "fine").await?;
        let (degraded, _, _) = condition(&s, "Degraded")?;
        (degraded == ConditionStatus::False && s.ready_nodes == Some(1)).then_some(())
    })
    .await;
    assert!(
        manager.child_alive(),
        "the manager must not crash:\n{}",
        manager.logs()
    );
}

#[tokio::test]
async fn invalid_specs_are_reported_without_any_aws_mutation() {
    let world = World::new("inv-invalid").await;
    let nodes_group = world.kops_group("nodes", &ZONES[..2], 1, &[]).await;
    let masters = world.kops_group("master", &ZONES[..1], 1, &[]).await;
    let mut all = nodes_group.asgs.clone();
    all.extend(masters.asgs.clone());
    let before = world.asg_snapshot(&all).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(
            &PostParams::default(),
            &worker_group(
                "bad-cron",
                &nodes_group.asgs,
                1, // fewer than the 2 running: a valid group might act; this one must not
                serde_json::json!({"refresh": {"schedule": "at dawn", "timeZone": "Atlantis/Capital"}}),
            ),
        )
        .await
        .expect("create");
    let mut master: NodeGroup = worker_group(
        "master-surplus",
        &masters.asgs,
        3, // more than the 1 running
        serde_json::json!({"refresh": {"schedule": "0 3 * * *", "surplusNodes": 1}}),
    );
    master.spec.role = spot_node_manager::crd::Role::Master;
    world.create_group(&master).await;
    let (manager, _config) = world.start_manager(&[]);

    let (valid, reason, message) = assert_eventually("bad-cron invalid", WAIT, || async {
        condition(&status_of(&groups, "bad-cron").await?, "SpecValid")
    })
    .await;
    assert_eq!(
        (valid, reason.as_str()),
        (ConditionStatus::False, "InvalidSchedule")
    );
    assert!(message.contains("spec.refresh.timeZone"), "{message}");
    let (valid, reason, _) = assert_eventually("master invalid", WAIT, || async {
        condition(&status_of(&groups, "master-surplus").await?, "SpecValid")
    })
    .await;
    assert_eq!(
        (valid, reason.as_str()),
        (ConditionStatus::False, "SurplusForMasters")
    );
    // Several resyncs later: no child resources, and moto unchanged.
    manager
        .idle_while_reconciling(
            "inventory",
            &["bad-cron", "master-surplus"],
            Duration::from_secs(10),
        )
        .await;
    let refreshers: Api<Refresher> = world.api();
    let replenishers: Api<Replenisher> = world.api();
    assert!(
        refreshers
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert!(
        replenishers
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert_eq!(
        world.asg_snapshot(&all).await,
        before,
        "no AWS mutation for an invalid spec"
    );
    let metrics = manager.assert_metrics().await;
    assert!(
        !metrics.contains(r#"target="aws""#),
        "no AWS mutation attempted:\n{metrics}"
    );
}

#[tokio::test]
async fn child_resources_follow_the_group_spec() {
    let world = World::new("inv-children").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let created = world
        .create_group(&worker_group(
            "workers",
            &kops.asgs,
            1,
            serde_json::json!({"refresh": {"schedule": "0 3 * * Mon", "timeZone": "Asia/Tokyo"}}),
        ))
        .await;
    let uid = created.metadata.uid.clone().expect("uid");
    let (_manager, _config) = world.start_manager(&[]);
    let refreshers: Api<Refresher> = world.api();
    let replenishers: Api<Replenisher> = world.api();

    let rf = assert_eventually("refresher created", WAIT, || async {
        refreshers.get("workers").await.ok()
    })
    .await;
    assert_eq!(rf.spec.node_group, "workers");
    assert_eq!(rf.spec.surplus_nodes, 1);
    assert_eq!(rf.spec.time_zone, "Asia/Tokyo");
    let owner = rf.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true)),
        "{owner:?}"
    );
    let rp = assert_eventually("replenisher created", WAIT, || async {
        replenishers.get("workers").await.ok()
    })
    .await;
    assert_eq!((rp.spec.desired, rp.spec.join_timeout.as_str()), (1, "15m"));

    // A spec change reaches the children.
    let change = serde_json::json!({"desired": 2, "refresh": {"schedule": "0 5 * * Tue"}});
    world.patch_group("workers", change).await;
    assert_eventually("children updated", WAIT, || async {
        let rf = refreshers.get("workers").await.ok()?;
        let rp = replenishers.get("workers").await.ok()?;
        (rf.spec.schedule.as_deref() == Some("0 5 * * Tue") && rp.spec.desired == 2).then_some(())
    })
    .await;

    // Disabling removes them.
    let disable = serde_json::json!({"refresh": null, "replenish": {"enabled": false}});
    world.patch_group("workers", disable).await;
    assert_eventually("children removed", WAIT, || async {
        let rf = refreshers.get_opt("workers").await.ok()?;
        let rp = replenishers.get_opt("workers").await.ok()?;
        (rf.is_none() && rp.is_none()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_settled_group_status_is_not_rewritten_on_resync() {
    let world = World::new("sim-quiet").await;
    let kops = world.kops_group("nodes", &ZONES[..2], 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    let group = worker_group("workers", &kops.asgs, 2, serde_json::json!({}));
    world.create_group(&group).await;
    let (manager, _config) = world.start_manager(&[]);
    assert_eventually("settled", WAIT, || async {
        (groups.get("workers").await.ok()?.status?.ready_nodes == Some(2)).then_some(())
    })
    .await;
    // Let any in-flight write land, then watch several 2 s resyncs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let version = groups
        .get("workers")
        .await
        .expect("get")
        .metadata
        .resource_version;
    let reconciles_before = support::reconciles(&manager.assert_metrics().await, "inventory");
    tokio::time::sleep(Duration::from_secs(7)).await;
    let reconciles_after = support::reconciles(&manager.assert_metrics().await, "inventory");
    assert!(
        reconciles_after >= reconciles_before + 2,
        "resyncs ran ({reconciles_before} -> {reconciles_after})"
    );
    assert_eq!(
        groups
            .get("workers")
            .await
            .expect("get")
            .metadata
            .resource_version,
        version,
        "nothing changed, so nothing is written"
    );
}

#[tokio::test]
async fn deleting_a_group_garbage_collects_its_children() {
    let world = World::new("inv-gc").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&worker_group(
            "workers",
            &kops.asgs,
            1,
            serde_json::json!({"refresh": {"schedule": "0 3 * * Mon"}}),
        ))
        .await;
    let (manager, _config) = world.start_manager(&[]);
    let refreshers: Api<Refresher> = world.api();
    let replenishers: Api<Replenisher> = world.api();
    assert_eventually("children created", WAIT, || async {
        let rf = refreshers.get_opt("workers").await.ok()?;
        let rp = replenishers.get_opt("workers").await.ok()?;
        (rf.is_some() && rp.is_some()).then_some(())
    })
    .await;
    // The real garbage collector, not the manager, removes what the group owns.
    groups
        .delete("workers", &Default::default())
        .await
        .expect("delete group");
    assert_eventually("children garbage-collected", WAIT, || async {
        let rf = refreshers.get_opt("workers").await.ok()?;
        let rp = replenishers.get_opt("workers").await.ok()?;
        (rf.is_none() && rp.is_none()).then_some(())
    })
    .await;
    assert!(manager.child_alive(), "{}", manager.logs());
}

#[tokio::test]
async fn an_asg_named_by_two_groups_stops_both_until_one_lets_go() {
    let world = World::new("inv-conflict").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&worker_group("first", &kops.asgs, 3, serde_json::json!({})))
        .await;
    let (manager, _config) = world.start_manager(&[]);
    assert_eventually("first valid with its replenisher", WAIT, || async {
        let (valid, _, _) = condition(&status_of(&groups, "first").await?, "SpecValid")?;
        let replenishers: Api<Replenisher> = world.api();
        replenishers.get("first").await.ok()?;
        (valid == ConditionStatus::True).then_some(())
    })
    .await;
    // A second group claims one of first's ASGs (desired 2 over its 1 node:
    // a valid group would raise it).
    world
        .create_group(&worker_group(
            "second",
            &kops.asgs[..1],
            2,
            serde_json::json!({}),
        ))
        .await;
    for (name, other) in [("first", "second"), ("second", "first")] {
        let (valid, _, message) = assert_eventually("both in conflict", WAIT, || async {
            let c = condition(&status_of(&groups, name).await?, "SpecValid")?;
            (c.1 == "AutoScalingGroupConflict").then_some(c)
        })
        .await;
        assert_eq!(valid, ConditionStatus::False, "{name}: {message}");
        assert!(message.contains(&format!("/{other}")), "{name}: {message}");
        assert!(message.contains(&kops.asgs[0]), "{name}: {message}");
    }
    // first now asks for one more node: it must not act while in conflict.
    let before = world.asg_snapshot(&kops.asgs).await;
    let replenished_before = manager.reconciles_of("replenisher", "first");
    world
        .patch_group("first", serde_json::json!({"desired": 4}))
        .await;
    // Both groups are looked at again and again, first's replenisher sees
    // its group change, and nothing acts.
    manager
        .idle_while_reconciling("inventory", &["first", "second"], Duration::from_secs(10))
        .await;
    assert!(
        manager.reconciles_of("replenisher", "first") > replenished_before,
        "first's replenisher looked at the change"
    );
    assert_eq!(
        world.asg_snapshot(&kops.asgs).await,
        before,
        "no group acted"
    );
    let metrics = manager.assert_metrics().await;
    assert!(
        !metrics.contains(r#"target="aws""#),
        "no AWS mutation attempted:\n{metrics}"
    );
    // second lets go: first is valid again.
    let elsewhere = serde_json::json!({"autoScalingGroups": [{"name": "elsewhere"}]});
    world.patch_group("second", elsewhere).await;
    assert_eventually("first valid again", WAIT, || async {
        let (valid, _, _) = condition(&status_of(&groups, "first").await?, "SpecValid")?;
        (valid == ConditionStatus::True).then_some(())
    })
    .await;
}

/// `kubectl get nodegroups` as the apiserver serves it (a Table): each
/// column's name and priority (1: only with `-o wide`), and each row's cells
/// by group name.
async fn nodegroup_table(
    world: &World,
) -> Option<(
    Vec<(String, i64)>,
    std::collections::BTreeMap<String, Vec<serde_json::Value>>,
)> {
    let request = http::Request::get(format!(
        "/apis/nodemanager.dev/v1alpha1/namespaces/{}/nodegroups",
        world.namespace
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(vec![])
    .ok()?;
    let table: serde_json::Value =
        serde_json::from_str(&world.client.request_text(request).await.ok()?).ok()?;
    let columns = table["columnDefinitions"]
        .as_array()?
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let rows = table["rows"]
        .as_array()?
        .iter()
        .filter_map(|r| {
            let cells = r["cells"].as_array()?.clone();
            Some((cells.first()?.as_str()?.to_string(), cells))
        })
        .collect();
    Some((columns, rows))
}

#[tokio::test]
async fn kubectl_get_says_whether_a_group_is_ready_invalid_or_degraded() {
    let world = World::new("inv-columns").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    // Its own ASG: one named by two groups would make both invalid.
    let other = world.kops_group("batch", &ZONES[..1], 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let typo = format!("{}-nodes-typo.example.com", world.prefix());
    for group in [
        worker_group(
            "healthy",
            &kops.asgs,
            3,
            serde_json::json!({"refresh": {"schedule": "0 3 * * Mon"}}),
        ),
        worker_group(
            "invalid",
            &other.asgs,
            1,
            serde_json::json!({"refresh": {"schedule": "at dawn"}}),
        ),
        worker_group(
            "degraded",
            std::slice::from_ref(&typo),
            1,
            serde_json::json!({}),
        ),
    ] {
        world.create_group(&group).await;
    }
    let (manager, _config) = world.start_manager(&[]);
    let (columns, rows) = assert_eventually("every group's state in the table", WAIT, || async {
        let (columns, rows) = nodegroup_table(&world).await?;
        let at = columns.iter().position(|(name, _)| name == "State")?;
        let state = |group: &str| rows.get(group)?.get(at)?.as_str().map(str::to_string);
        let next = columns
            .iter()
            .position(|(name, _)| name == "Next Refresh")?;
        let scheduled = rows
            .get("healthy")?
            .get(next)?
            .as_str()
            .is_some_and(|s| !s.is_empty());
        (state("healthy")?.as_str() == "Ready"
            && state("invalid")?.as_str() == "InvalidSpec"
            && state("degraded")?.as_str() == "Degraded"
            && scheduled)
            .then_some((columns, rows))
    })
    .await;
    let priority = |name: &str| {
        columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("no column {name}: {columns:?}"))
    };
    assert_eq!(priority("State"), 0, "State is in the default view");
    assert_eq!(priority("ASGs"), 1, "ASGs only with -o wide");
    assert_eq!(
        priority("Next Refresh"),
        1,
        "Next Refresh only with -o wide"
    );
    let asgs = columns.iter().position(|(n, _)| n == "ASGs").expect("ASGs");
    assert_eq!(rows["healthy"][asgs], serde_json::json!(3));
    assert_eq!(rows["invalid"][asgs], serde_json::json!(1));
    // The same counts as metrics, per group. "Ready" in the table means the
    // desired count was Ready when the status was written; the gauges are
    // set in that same reconcile.
    let series = |name: &str, group: &str| {
        format!(
            "spot_node_manager_{name}{{namespace=\"{}\",group=\"{group}\"}}",
            world.namespace
        )
    };
    let lines = [
        format!("{} 3", series("group_ready_nodes", "healthy")),
        format!("{} 3", series("group_desired_nodes", "healthy")),
        format!("{} 0", series("group_ready_nodes", "degraded")),
    ];
    let metrics = manager.assert_metrics().await;
    for line in &lines {
        assert!(metrics.contains(line.as_str()), "no {line} in:\n{metrics}");
    }
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Issue 55: ASG settings that make AWS or cluster-autoscaler replace or
/// remove the group's instances without the manager's drain are reported,
/// each with its ASG and what to do, in a condition and a Warning Event;
/// nothing is changed on the ASG; the condition clears once they are gone.
#[tokio::test]
async fn competing_asg_settings_are_reported_and_left_as_they_are() {
    let world = World::new("inv-competing").await;
    let kops = world.kops_group("nodes", &ZONES[..2], 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&worker_group(
            "workers",
            &kops.asgs,
            2,
            serde_json::json!({}),
        ))
        .await;
    let (a, b) = (kops.asgs[0].clone(), kops.asgs[1].clone());
    let autoscaling = &world.aws.autoscaling;
    autoscaling
        .update_auto_scaling_group()
        .auto_scaling_group_name(&a)
        .capacity_rebalance(true)
        .max_instance_lifetime(7 * 86_400)
        .send()
        .await
        .expect("capacity rebalance and lifetime");
    let tag = || {
        aws_sdk_autoscaling::types::Tag::builder()
            .key("k8s.io/cluster-autoscaler/enabled")
            .value("true")
            .resource_id(&b)
            .resource_type("auto-scaling-group")
            .propagate_at_launch(false)
            .build()
    };
    autoscaling
        .create_or_update_tags()
        .tags(tag())
        .send()
        .await
        .expect("cluster-autoscaler's tag");
    // b spans two zones, AZRebalance not suspended (kops's are one zone
    // each): a default subnet in each.
    let in_zones = [
        world.default_subnet(ZONES[0]).await,
        world.default_subnet(ZONES[1]).await,
    ];
    autoscaling
        .update_auto_scaling_group()
        .auto_scaling_group_name(&b)
        .availability_zones(ZONES[0])
        .availability_zones(ZONES[1])
        .vpc_zone_identifier(in_zones.join(","))
        .send()
        .await
        .expect("two zones");
    let (manager, _config) = world.start_manager(&[]);
    let (value, reason, message) = assert_eventually("reported", WAIT, || {
        workers_condition(
            groups.clone(),
            "CompetingAsgSettings",
            ConditionStatus::True,
        )
    })
    .await;
    assert_eq!(
        (value, reason.as_str()),
        (ConditionStatus::True, "SettingsCompete")
    );
    for said in [
        format!("{a} has Capacity Rebalancing on"),
        format!("{a} has a maximum instance lifetime of 7.0 day(s)"),
        format!("{b} carries k8s.io/cluster-autoscaler/enabled"),
        format!(
            "{b} spans 2 zones ({}, {}) with AZRebalance not suspended",
            ZONES[0], ZONES[1]
        ),
    ] {
        assert!(message.contains(&said), "{said}: {message}");
    }
    support::refresh::assert_event(&world, "SettingsCompete").await;
    // Left as they are: the manager changes none of them.
    let described = autoscaling
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(&a)
        .send()
        .await
        .expect("describe");
    let asg = &described.auto_scaling_groups()[0];
    assert_eq!(asg.capacity_rebalance(), Some(true));
    assert_eq!(asg.max_instance_lifetime(), Some(7 * 86_400));
    // The user turns them off: the condition clears.
    autoscaling
        .update_auto_scaling_group()
        .auto_scaling_group_name(&a)
        .capacity_rebalance(false)
        .max_instance_lifetime(0)
        .send()
        .await
        .expect("off");
    autoscaling
        .delete_tags()
        .tags(tag())
        .send()
        .await
        .expect("untag");
    world.scaling_process(&b, "AZRebalance", false).await;
    assert_eventually("cleared", WAIT, || {
        workers_condition(
            groups.clone(),
            "CompetingAsgSettings",
            ConditionStatus::False,
        )
    })
    .await;
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Issue 55: a `kops update cluster` that lowers the instance groups'
/// maxSize to the group's count leaves no room for a node launched ahead:
/// reported in NoRoomAboveDesired (which ASGs, what cannot happen, what to
/// raise) with a Warning Event; no MaxSize is changed by the manager; the
/// condition clears once the user raises maxSize again.
#[tokio::test]
async fn a_max_lowered_to_the_count_is_reported_as_no_room_and_left_as_it_is() {
    let world = World::new("inv-room").await;
    let kops = world.kops_group("nodes", &ZONES[..2], 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&worker_group(
            "workers",
            &kops.asgs,
            2,
            serde_json::json!({}),
        ))
        .await;
    let (manager, _config) = world.start_manager(&[]);
    let room = |value| workers_condition(groups.clone(), "NoRoomAboveDesired", value);
    // As the test kit's kops groups are: max 20 each.
    let (_, reason, message) =
        assert_eventually("room seen", WAIT, || room(ConditionStatus::False)).await;
    assert_eq!(reason, "Room", "{message}");
    // kops update cluster with maxSize: 1 on both instance groups.
    world.set_max(&kops.asgs, 1).await;
    let (_, reason, message) =
        assert_eventually("no room reported", WAIT, || room(ConditionStatus::True)).await;
    assert_eq!(reason, "NoRoom", "{message}");
    for said in [
        format!("{} 1/1", kops.asgs[0]),
        format!("{} 1/1", kops.asgs[1]),
        "room for 0 above it, 1 needed".to_string(),
        "at least 3".to_string(),
    ] {
        assert!(message.contains(&said), "{said}: {message}");
    }
    support::refresh::assert_event(&world, "NoRoom").await;
    // Left as it is: the manager raises no MaxSize of its own.
    assert_eq!(asg_maxes(&world, &kops.asgs).await, vec![1, 1]);
    // The user raises one again: room for the group.
    world.set_max(&kops.asgs[..1], 2).await;
    assert_eventually("room again", WAIT, || room(ConditionStatus::False)).await;
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Each of `asgs`' MaxSize, as AWS describes it.
async fn asg_maxes(world: &World, asgs: &[String]) -> Vec<i32> {
    let described = world
        .aws
        .autoscaling
        .describe_auto_scaling_groups()
        .set_auto_scaling_group_names(Some(asgs.to_vec()))
        .send()
        .await
        .expect("describe");
    asgs.iter()
        .map(|name| {
            described
                .auto_scaling_groups()
                .iter()
                .find(|g| g.auto_scaling_group_name() == Some(name.as_str()))
                .and_then(|g| g.max_size())
                .unwrap_or(-1)
        })
        .collect()
}

/// A one-node worker group with, in its world's namespace, a Deployment of
/// another controller kops can install, and the manager started: what the
/// manager sees of that controller. (Against the emulator it looks in its
/// own namespace only: the tests share one apiserver.)
struct Beside {
    _sim: support::SimGuard,
    manager: support::ManagerProcess,
    _config: tempfile::NamedTempFile,
    groups: Api<NodeGroup>,
    deployments: Api<k8s_openapi::api::apps::v1::Deployment>,
    kops: support::KopsGroup,
    world: World,
}

impl Beside {
    /// `deployment`: made from the group's ASG names.
    async fn start(
        test: &str,
        deployment: impl FnOnce(&[String]) -> k8s_openapi::api::apps::v1::Deployment,
    ) -> Beside {
        let world = World::new(test).await;
        let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
        // Joins without lag: what is judged is the other controller's
        // Deployment, listed whatever the nodes do, not a launch.
        let sim = world.start_sim(FAST, FAST);
        let groups: Api<NodeGroup> = world.api();
        let group = worker_group("workers", &kops.asgs, 1, serde_json::json!({}));
        world.create_group(&group).await;
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = world.api();
        deployments
            .create(&PostParams::default(), &deployment(&kops.asgs))
            .await
            .expect("create the Deployment");
        let (manager, config) = world.start_manager(&[]);
        Beside {
            _sim: sim,
            manager,
            _config: config,
            groups,
            deployments,
            kops,
            world,
        }
    }
}

/// Issue 55: aws-node-termination-handler running in the cluster (kops
/// runs it by default) is reported on the group in OtherTerminationHandler
/// with what to do, and a Warning Event; nothing of it is changed; the
/// condition clears once it is scaled to nothing. (Against the emulator
/// the manager looks in its own namespace only: the tests share one
/// apiserver.)
#[tokio::test]
async fn kops_s_termination_handler_running_beside_the_manager_is_reported() {
    // As kops's addon labels it, in queue mode.
    let labels = serde_json::json!({
        "app.kubernetes.io/name": "aws-node-termination-handler",
        "k8s-app": "aws-node-termination-handler",
    });
    let container = serde_json::json!({"name": "nth", "image": "registry.invalid/nth"});
    let beside = Beside::start("inv-nth", |_| {
        unscheduled("aws-node-termination-handler", &labels, &labels, container)
    })
    .await;
    let Beside {
        world,
        groups,
        deployments,
        manager,
        ..
    } = &beside;
    let handler = |value| workers_condition(groups.clone(), "OtherTerminationHandler", value);
    let (_, reason, message) = assert_eventually("the handler reported", WAIT, || {
        handler(ConditionStatus::True)
    })
    .await;
    assert_eq!(reason, "OtherHandlerRunning", "{message}");
    let namespace = world.namespace.clone();
    for said in [
        format!("Deployment {namespace}/aws-node-termination-handler (queue mode)"),
        "spec.nodeTerminationHandler.enabled: false".to_string(),
        // The guide's command for what kops leaves running (issue 69).
        format!(
            "kubectl -n {namespace} delete deployment,daemonset,poddisruptionbudget,serviceaccount aws-node-termination-handler --ignore-not-found"
        ),
    ] {
        assert!(message.contains(&said), "{said}: {message}");
    }
    support::refresh::assert_event(world, "OtherHandlerRunning").await;
    // Left as it is.
    let kept = deployments
        .get("aws-node-termination-handler")
        .await
        .expect("still there");
    assert_eq!(kept.spec.and_then(|s| s.replicas), Some(1));
    // The user turns it off (kops scales nothing: it removes the addon;
    // scaled to 0 is as good): cleared within a listing's minute.
    deployments
        .patch(
            "aws-node-termination-handler",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("scale to 0");
    assert_eventually("cleared", Duration::from_secs(150), || {
        handler(ConditionStatus::False)
    })
    .await;
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Issue 69: kops's cluster-autoscaler addon (`spec.clusterAutoscaler`)
/// names the ASGs it scales with `--nodes=<min>:<max>:<ig>.<cluster>` in
/// its container's command, with no discovery tag (kops's
/// upup/models/cloudup/resources/addons/cluster-autoscaler.addons.k8s.io/
/// k8s-1.15.yaml.template, read at 268927e2): one naming the group's ASG
/// is reported in CompetingAsgSettings, with a Warning Event, and the
/// condition clears once it goes. Nothing of it is changed.
#[tokio::test]
async fn kops_s_cluster_autoscaler_naming_the_groups_asg_is_reported() {
    // As kops's addon labels and runs it (an instance group of another
    // group named too: not this one's concern).
    let labels = serde_json::json!({
        "app.kubernetes.io/name": "cluster-autoscaler",
        "k8s-app": "cluster-autoscaler",
    });
    let pods = serde_json::json!({"app": "cluster-autoscaler"});
    let beside = Beside::start("inv-ca", |asgs| {
        let command = vec![
            "./cluster-autoscaler".to_string(),
            "--cloud-provider=aws".to_string(),
            format!("--nodes=1:5:{}", asgs[0]),
            "--nodes=0:3:gpu.example.com".to_string(),
        ];
        let container = serde_json::json!(
            {"name": "cluster-autoscaler", "image": "registry.invalid/ca", "command": command}
        );
        unscheduled("cluster-autoscaler", &labels, &pods, container)
    })
    .await;
    let Beside {
        world,
        kops,
        groups,
        deployments,
        manager,
        ..
    } = &beside;
    let competing = |value| workers_condition(groups.clone(), "CompetingAsgSettings", value);
    let (_, reason, message) = assert_eventually("the autoscaler reported", WAIT, || {
        competing(ConditionStatus::True)
    })
    .await;
    assert_eq!(reason, "SettingsCompete", "{message}");
    let namespace = world.namespace.clone();
    for said in [
        format!(
            "cluster-autoscaler (Deployment {namespace}/cluster-autoscaler) scales {} (--nodes)",
            kops.asgs[0]
        ),
        "spec.autoscale: false".to_string(),
    ] {
        assert!(message.contains(&said), "{said}: {message}");
    }
    assert!(!message.contains("gpu.example.com"), "{message}");
    support::refresh::assert_event(world, "SettingsCompete").await;
    // The user takes the group's instance groups from it (here: the addon
    // goes): cleared within a listing's minute.
    deployments
        .delete("cluster-autoscaler", &Default::default())
        .await
        .expect("delete the autoscaler");
    assert_eventually("cleared", Duration::from_secs(150), || {
        competing(ConditionStatus::False)
    })
    .await;
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Karpenter's NodePool CRD, reduced to what a listing needs: the
/// apiserver is shared, so it is made once and left (a cluster without
/// it is `no NodePool`, tested by every other test here).
async fn node_pool_crd(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nodepools.karpenter.sh"},
        "spec": {
            "group": "karpenter.sh",
            "names": {"kind": "NodePool", "plural": "nodepools", "singular": "nodepool", "listKind": "NodePoolList"},
            "scope": "Cluster",
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .expect("crd");
    let apply = PatchParams::apply("snm-test").force();
    crds.patch("nodepools.karpenter.sh", &apply, &Patch::Apply(&crd))
        .await
        .expect("apply the NodePool CRD");
    assert_eventually("the NodePool CRD established", WAIT, || async {
        let crd = crds.get("nodepools.karpenter.sh").await.ok()?;
        let conditions = crd.status?.conditions?;
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
}

/// Issue 69: a NodeGroup naming the ASG of an instance group kops hands to
/// Karpenter. kops names a node instance group's ASG `<ig>.<cluster>`
/// (pkg/model/names.go AutoscalingGroupName), makes none for one with
/// `spec.manager: Karpenter` (pkg/model/awsmodel/autoscalinggroup.go) and
/// writes a `karpenter.sh/v1` NodePool named after the instance group
/// instead (upup/pkg/fi/cloudup/template_functions_karpenter.go
/// buildKarpenterNodePool); read at kops 268927e2. The group says in
/// CompetingAsgSettings that Karpenter has those nodes and what to do, with
/// a Warning Event, beside the ASG not found; cleared once the NodePool
/// goes. Nothing of it is changed.
#[tokio::test]
async fn an_asg_of_an_instance_group_kops_hands_to_karpenter_is_reported() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let world = World::new("inv-karpenter").await;
    node_pool_crd(&world.client).await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let cluster = kops.asgs[0]
        .split_once('.')
        .map(|(_, cluster)| cluster.to_string())
        .expect("kops names ASGs <ig>.<cluster>");
    // The instance group's name is the world's (unique: NodePools are
    // cluster-scoped and the apiserver is shared).
    let ig = world.namespace.clone();
    let karpenters = format!("{ig}.{cluster}");
    let pools: Api<DynamicObject> = Api::all_with(
        world.client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool")),
    );
    let pool: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": ig},
        "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": ig}}}},
    }))
    .expect("nodepool");
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the NodePool");
    // Joins without lag: what is judged is a NodePool and an ASG that
    // does not exist, listed whatever the nodes do, not a launch.
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    let asgs = vec![kops.asgs[0].clone(), karpenters.clone()];
    let group = worker_group("workers", &asgs, 1, serde_json::json!({}));
    world.create_group(&group).await;
    let (manager, _config) = world.start_manager(&[]);
    let competing = |value| workers_condition(groups.clone(), "CompetingAsgSettings", value);
    let (_, reason, message) = assert_eventually("Karpenter reported", WAIT, || {
        competing(ConditionStatus::True)
    })
    .await;
    assert_eq!(reason, "SettingsCompete", "{message}");
    for said in [
        format!("Karpenter NodePool {ig} manages instance group {ig}"),
        format!("kops makes no ASG {karpenters}"),
        "spec.manager: CloudGroup".to_string(),
    ] {
        assert!(message.contains(&said), "{said}: {message}");
    }
    assert!(
        !message.contains(&kops.asgs[0]),
        "kops's own ASG: {message}"
    );
    support::refresh::assert_event(&world, "SettingsCompete").await;
    // The ASG not found is said too, where it always is.
    let degraded = condition(
        &status_of(&groups, "workers").await.expect("status"),
        "Degraded",
    );
    let (_, reason, _) = degraded.expect("Degraded");
    assert_eq!(reason, "AutoScalingGroupNotFound");
    // The user hands the instance group back to kops (here: the NodePool
    // goes): cleared within a listing's minute.
    pools
        .delete(&ig, &Default::default())
        .await
        .expect("delete the NodePool");
    assert_eventually("cleared", Duration::from_secs(150), || {
        competing(ConditionStatus::False)
    })
    .await;
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Issue 55: a terminate lifecycle hook kops left on an ASG when its own
/// handler was turned off (EventBridge only, no target of its own), while
/// the manager has no interruption queue, is reported in
/// OtherTerminationHandler (reason UncompletedLifecycleHook) with what it
/// does and the command that removes it, and a Warning Event; the manager
/// removes nothing.
#[tokio::test]
async fn a_terminate_hook_nothing_completes_is_reported() {
    let world = World::new("inv-hook").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = kops.asgs[0].clone();
    let autoscaling = &world.aws.autoscaling;
    autoscaling
        .put_lifecycle_hook()
        .auto_scaling_group_name(&asg)
        .lifecycle_hook_name("nodes-NTHLifecycleHook")
        .lifecycle_transition("autoscaling:EC2_INSTANCE_TERMINATING")
        .heartbeat_timeout(300)
        .default_result("CONTINUE")
        .send()
        .await
        .expect("put lifecycle hook");
    let Reported {
        manager,
        reason,
        message,
        ..
    } = reported(&world, &kops.asgs, "OtherTerminationHandler").await;
    assert_eq!(reason, "UncompletedLifecycleHook", "{message}");
    for said in [
        format!("{asg} has the terminate lifecycle hook nodes-NTHLifecycleHook"),
        "the manager has no interruption queue".to_string(),
        "waits 5m (then CONTINUE)".to_string(),
        format!(
            "delete-lifecycle-hook --auto-scaling-group-name {asg} --lifecycle-hook-name nodes-NTHLifecycleHook"
        ),
    ] {
        assert!(message.contains(&said), "{said}: {message}");
    }
    support::refresh::assert_event(&world, "UncompletedLifecycleHook").await;
    let hooks = autoscaling
        .describe_lifecycle_hooks()
        .auto_scaling_group_name(&asg)
        .send()
        .await
        .expect("describe hooks");
    assert_eq!(hooks.lifecycle_hooks().len(), 1, "left as it is");
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// Issue 55: an ASG with a warm pool (kops `spec.warmPool`) is reported in
/// CompetingAsgSettings with what it does and how to remove it; the
/// manager leaves it as it is. (Described once an hour: its removal is
/// seen within the hour, not tested here.)
#[tokio::test]
async fn a_warm_pool_is_reported_and_left_as_it_is() {
    let world = World::new("inv-warm").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = kops.asgs[0].clone();
    let autoscaling = &world.aws.autoscaling;
    autoscaling
        .put_warm_pool()
        .auto_scaling_group_name(&asg)
        .min_size(1)
        .pool_state(aws_sdk_autoscaling::types::WarmPoolState::Stopped)
        .send()
        .await
        .expect("put warm pool");
    let Reported {
        manager,
        reason,
        message,
        ..
    } = reported(&world, &kops.asgs, "CompetingAsgSettings").await;
    assert_eq!(reason, "SettingsCompete", "{message}");
    for said in [
        format!("{asg} has a warm pool"),
        "stopped, at least 1".to_string(),
        format!("delete-warm-pool --auto-scaling-group-name {asg}"),
    ] {
        assert!(message.contains(&said), "{said}: {message}");
    }
    let pool = autoscaling
        .describe_warm_pool()
        .auto_scaling_group_name(&asg)
        .send()
        .await
        .expect("describe warm pool");
    assert!(pool.warm_pool_configuration().is_some(), "left as it is");
    assert!(manager.child_alive(), "{}", manager.logs());
}

/// A running manager over one worker group of `asgs` (with its simulated
/// kubelet), once the group's `condition` turned True.
struct Reported {
    manager: support::ManagerProcess,
    _config: tempfile::NamedTempFile,
    _sim: support::SimGuard,
    reason: String,
    message: String,
}

async fn reported(world: &World, asgs: &[String], condition_type: &str) -> Reported {
    let sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world
        .create_group(&worker_group("workers", asgs, 1, serde_json::json!({})))
        .await;
    let (manager, config) = world.start_manager(&[]);
    let (_, reason, message) = assert_eventually("reported", WAIT, || {
        workers_condition(groups.clone(), condition_type, ConditionStatus::True)
    })
    .await;
    Reported {
        manager,
        _config: config,
        _sim: sim,
        reason,
        message,
    }
}
