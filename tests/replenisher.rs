//! The replenisher end to end: real apiserver + moto (with a simulated spot
//! shortage) + simulated kubelet, and the manager as a separate process.

mod support;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use spot_node_manager::cloud::Cloud;
use spot_node_manager::cloud::aws::AwsCloud;
use spot_node_manager::crd::replenisher::ReplenishPhase;
use spot_node_manager::crd::{NodeGroup, Replenisher};
use std::time::Duration;
use support::{World, ZONES, eventually};

const WAIT: Duration = Duration::from_secs(90);
const FAST: Duration = Duration::from_millis(300);
const NO_CAPACITY: &str = "snm.test/no-capacity";

fn group(asgs: &[String], desired: i32, join_timeout: &str) -> NodeGroup {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": "workers"},
        "spec": {
            "role": "Worker",
            "autoScalingGroups": asgs.iter().map(|a| serde_json::json!({"name": a})).collect::<Vec<_>>(),
            "desired": desired,
            "replenish": {"cooldown": "1s", "joinTimeout": join_timeout}
        }
    }))
    .expect("group")
}

async fn ready_nodes(groups: &Api<NodeGroup>) -> Option<i32> {
    groups.get("workers").await.ok()?.status?.ready_nodes
}

#[tokio::test]
async fn a_shortage_is_replenished_elsewhere_and_the_layout_comes_back() {
    let world = World::new("rp-shortage").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(&PostParams::default(), &group(&kops.asgs, 3, "15m"))
        .await
        .expect("create");
    let (manager, _config) = world.start_manager(&[]);
    let replenishers: Api<Replenisher> = world.api();
    eventually("steady with 3 Ready", WAIT, || async {
        let rp = replenishers.get("workers").await.ok()?;
        (ready_nodes(&groups).await? == 3 && rp.status?.phase == ReplenishPhase::Steady)
            .then_some(())
    })
    .await;
    let original = world.asg_snapshot(&kops.asgs).await;

    // Spot capacity runs out in zone a, and its node is reclaimed.
    let short = &kops.asgs[0];
    world.tag_asg(short, NO_CAPACITY, "true").await;
    let lost = world.asg_instances(short).await.remove(0);
    AwsCloud::new(world.aws.clone())
        .terminate_in_group(&lost, false)
        .await
        .expect("reclaim");
    assert!(
        world.asg_instances(short).await.is_empty(),
        "the short ASG cannot replace it"
    );

    // The replenisher launches the missing node in another zone.
    let rp = eventually("replenished in another ASG", WAIT, || async {
        let rp = replenishers.get("workers").await.ok()?;
        let s = rp.status.clone()?;
        (ready_nodes(&groups).await? == 3 && !s.raised.is_empty()).then_some(s)
    })
    .await;
    assert!(
        rp.raised.iter().all(|r| r.auto_scaling_group != *short),
        "{:?}",
        rp.raised
    );
    assert!(
        rp.excluded.iter().any(|e| e.auto_scaling_group == *short),
        "{:?}",
        rp.excluded
    );
    let raised_asg = rp.raised[0].auto_scaling_group.clone();
    assert_eq!(world.asg_instances(&raised_asg).await.len(), 2);

    // The shortage ends: the original ASG launches again. (Real ASGs keep
    // retrying; moto launches only when asked, so the test asks.)
    world.untag_asg(short, NO_CAPACITY, "true").await;
    AwsCloud::new(world.aws.clone())
        .set_desired_capacity(short, 1)
        .await
        .expect("retry launch");

    // The temporary node is drained and removed; the layout is the original one.
    eventually("layout restored", WAIT, || async {
        let now = world.asg_snapshot(&kops.asgs).await;
        let desired_now: Vec<_> = now
            .iter()
            .map(|(n, d, ids)| (n.clone(), *d, ids.len()))
            .collect();
        let desired_then: Vec<_> = original
            .iter()
            .map(|(n, d, ids)| (n.clone(), *d, ids.len()))
            .collect();
        let rp = replenishers.get("workers").await.ok()?.status?;
        (desired_now == desired_then
            && ready_nodes(&groups).await? == 3
            && rp.raised.is_empty()
            && rp.phase == ReplenishPhase::Steady)
            .then_some(())
    })
    .await;
    let g = groups.get("workers").await.expect("group");
    assert!(
        g.status.and_then(|s| s.operation).is_none(),
        "the lock is released when steady"
    );
    let metrics = manager.metrics().await.unwrap_or_default();
    assert!(
        metrics.contains(r#"action="set_desired_capacity",outcome="performed"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"action="terminate_instance_in_auto_scaling_group",outcome="performed"} 1"#
        ),
        "{metrics}"
    );
    // Each drain is counted, and each action is an Event on the group and in status.
    assert!(
        metrics.contains(r#"spot_node_manager_drains_total{outcome="started"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"spot_node_manager_drains_total{outcome="finished"} 1"#),
        "{metrics}"
    );
    let reasons = support::event_reasons(&world).await;
    for reason in ["ScaledUp", "DrainStarted", "ScaledDown"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} Event in {reasons:?}"
        );
    }
    let last = replenishers
        .get("workers")
        .await
        .expect("rp")
        .status
        .and_then(|s| s.last_action)
        .expect("last action in status");
    assert!(last.description.contains("removed"), "{}", last.description);
    world.cleanup().await;
}

#[tokio::test]
async fn an_instance_that_never_joins_is_detached_and_terminated() {
    let world = World::new("rp-join").await;
    let joined = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let late = world
        .kops_group(
            "late",
            &ZONES[1..2],
            1,
            &[(spot_node_manager::sim::NEVER_JOIN_TAG, "true")],
        )
        .await;
    let late_id = world.asg_instances(&late.asgs[0]).await.remove(0);
    let _sim = world.start_sim(FAST, FAST);
    let mut asgs = joined.asgs.clone();
    asgs.extend(late.asgs.clone());
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(&PostParams::default(), &group(&asgs, 1, "3s"))
        .await
        .expect("create");
    let (_manager, _config) = world.start_manager(&[]);

    eventually("never-joined instance removed", WAIT, || async {
        world
            .asg_instances(&late.asgs[0])
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    // Detached first, then terminated: the second call follows the first.
    let cloud = AwsCloud::new(world.aws.clone());
    eventually("the detached instance terminated", WAIT, || async {
        let described = cloud
            .describe_instances(std::slice::from_ref(&late_id))
            .await
            .expect("describe");
        described.iter().all(|i| i.state != "running").then_some(())
    })
    .await;
    let snapshot = world.asg_snapshot(&late.asgs).await;
    assert_eq!(snapshot[0].1, 0, "detached with decrement");
    let rp: Api<Replenisher> = world.api();
    let last = rp
        .get("workers")
        .await
        .expect("rp")
        .status
        .and_then(|s| s.last_action)
        .expect("last action");
    assert!(last.description.contains(&late_id), "{}", last.description);
    world.cleanup().await;
}

#[tokio::test]
async fn a_pod_disruption_budget_holds_back_the_removal_of_a_surplus_node() {
    let world = World::new("rp-pdb").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 2, &[]).await;
    let ids = world.asg_instances(&kops.asgs[0]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    // Replenisher off until the pods are in place.
    let mut g = group(&kops.asgs, 1, "15m");
    g.spec.replenish.enabled = false;
    groups
        .create(&PostParams::default(), &g)
        .await
        .expect("create");
    let (_manager, _config) = world.start_manager(&[]);
    eventually("2 Ready", WAIT, || async {
        (ready_nodes(&groups).await? == 2).then_some(())
    })
    .await;

    // One protected, Running pod on each node; the budget allows no disruption.
    let pods: Api<Pod> = world.api();
    for (i, node) in ids.iter().enumerate() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(format!("db-{i}")),
                labels: Some([("app".to_string(), "protected".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.clone()),
                containers: vec![Container {
                    name: "db".into(),
                    image: Some("registry.invalid/db".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("pod");
        let running = serde_json::json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(
            &format!("db-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&running),
        )
        .await
        .expect("running");
    }
    let pdb: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "protected"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "protected"}}}
    }))
    .expect("pdb");
    support::pdb_api(&world)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("pdb");
    support::set_disruptions_allowed(&world, 2, 0).await;

    // Now let the replenisher act: one node too many.
    groups
        .patch(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replenish": {"enabled": true}}})),
        )
        .await
        .expect("enable");
    let replenishers: Api<Replenisher> = world.api();
    let target = eventually("a scale-in target is being drained", WAIT, || async {
        replenishers.get("workers").await.ok()?.status?.scale_in
    })
    .await;
    // Several drain steps later, the budget still holds: nothing terminated.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        world.asg_instances(&kops.asgs[0]).await.len(),
        2,
        "not terminated while the budget refuses"
    );
    let still = replenishers
        .get("workers")
        .await
        .expect("rp")
        .status
        .and_then(|s| s.scale_in);
    assert_eq!(
        still.as_ref().map(|t| &t.instance_id),
        Some(&target.instance_id),
        "the same target, not a second one"
    );
    let reasons = support::event_reasons(&world).await;
    assert!(
        reasons.iter().any(|r| r == "DrainBlocked"),
        "the refusal is an Event: {reasons:?}"
    );

    // The budget allows one disruption: the node is drained and removed.
    support::set_disruptions_allowed(&world, 2, 1).await;
    eventually("surplus removed", WAIT, || async {
        let ids = world.asg_instances(&kops.asgs[0]).await;
        (ids.len() == 1 && !ids.contains(&target.instance_id)).then_some(())
    })
    .await;
    assert_eq!(
        world.asg_snapshot(&kops.asgs).await[0].1,
        1,
        "terminated with decrement"
    );
    world.cleanup().await;
}

#[tokio::test]
async fn dry_run_plans_and_logs_but_mutates_nothing() {
    let world = World::new("rp-dry").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    // One node short of the desired count: a real run would scale up.
    groups
        .create(&PostParams::default(), &group(&kops.asgs, 4, "15m"))
        .await
        .expect("create");
    let before = world.asg_snapshot(&kops.asgs).await;
    let (manager, _config) = world.start_manager(&["--dry-run"]);
    eventually("a dry-run scale-up", WAIT, || async {
        let metrics = manager.metrics().await?;
        metrics
            .contains(r#"action="set_desired_capacity",outcome="dry_run""#)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        world.asg_snapshot(&kops.asgs).await,
        before,
        "nothing changed in AWS"
    );
    let metrics = manager.metrics().await.unwrap_or_default();
    assert!(
        !metrics.contains(r#"target="aws",action="set_desired_capacity",outcome="performed""#),
        "{metrics}"
    );
    assert!(
        manager.logs().contains("dry-run: would mutate"),
        "the intended mutation is logged"
    );
    let rp: Api<Replenisher> = world.api();
    let status = rp.get("workers").await.expect("rp").status.expect("status");
    assert!(
        status.raised.is_empty(),
        "nothing recorded as done: {:?}",
        status.raised
    );
    world.cleanup().await;
}
