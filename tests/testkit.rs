//! The test kit's own helpers against the real apiserver and the rude
//! emulator: each sees or changes what it says, so that a test built on it
//! checks what it claims. (The pure ones have unit tests in the test kit.)

use snm_testkit as support;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use std::time::Duration;
use support::refresh::{check_terminations_chosen, node_names};
use support::steady::{Baseline, SteadyGroup};
use support::{DO_NOT_DISRUPT, ZONES, assert_eventually};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn the_steady_group_and_world_helpers_see_and_change_what_they_say() {
    let g = SteadyGroup::workers("tk-steady")
        .zones(&ZONES[..2])
        .start()
        .await;
    let (world, kops, manager) = (&g.world, &g.kops, &g.manager);

    // The baseline: each ASG with its one instance, all of them in service;
    // with pods, one controlled pod bound to each node.
    let Baseline { before, original } = g.baseline_with_pods().await;
    assert_eq!(before.len(), 2, "{before:?}");
    for (asg, desired, ids) in &before {
        assert!(kops.asgs.contains(asg), "{asg}");
        assert_eq!((*desired, ids.len()), (1, 1), "{asg}");
        assert!(original.contains(&ids[0]), "{original:?}");
    }
    let names = node_names(world, &original).await;
    let pods: Api<Pod> = world.api();
    for (i, node) in names.iter().enumerate() {
        let pod = pods.get(&format!("app-{i}")).await.expect("the pod");
        assert_eq!(pod.spec.and_then(|s| s.node_name).as_ref(), Some(node));
    }

    // Status readers and waits agree with the manager's status.
    assert_eq!(world.group_status("workers").await.ready_nodes, Some(2));
    let seen = g.status_where("workers", "2 Ready", |s| s.ready_nodes == Some(2));
    assert_eq!(seen.await.nodes.len(), 2);
    g.lock_released("workers").await;
    let replenisher = world.replenisher_status("workers").await;
    assert!(replenisher.raised.is_empty(), "{replenisher:?}");

    // A spec patch merges into the spec and leaves the rest.
    let patched = world
        .patch_group(
            "workers",
            serde_json::json!({"replenish": {"cooldown": "2s"}}),
        )
        .await;
    assert_eq!(patched.spec.replenish.cooldown, "2s");
    assert_eq!(patched.spec.desired, 2);

    // Annotations set and removed; a cordon seen as a cordon, in the
    // manager's status too.
    let nodes: Api<Node> = Api::all(world.client.clone());
    let annotated = |name: String| {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(&name).await.expect("node");
            let annotations = node.metadata.annotations.unwrap_or_default();
            annotations.get(DO_NOT_DISRUPT).cloned()
        }
    };
    world
        .annotate_node(&names[0], DO_NOT_DISRUPT, Some("true"))
        .await;
    assert_eq!(annotated(names[0].clone()).await.as_deref(), Some("true"));
    world.annotate_node(&names[0], DO_NOT_DISRUPT, None).await;
    assert_eq!(annotated(names[0].clone()).await, None);
    world
        .annotate_pod("app-0", DO_NOT_DISRUPT, Some("true"))
        .await;
    let pod = pods.get("app-0").await.expect("pod");
    let on_pod = pod.metadata.annotations.unwrap_or_default();
    assert_eq!(on_pod.get(DO_NOT_DISRUPT).map(String::as_str), Some("true"));
    world.cordon(&names[1]).await;
    assert_eq!(world.cordoned_nodes().await, Some(vec![names[1].clone()]));
    g.status_where("workers", "the cordon in status", |s| {
        s.nodes
            .iter()
            .any(|n| n.name == names[1] && n.unschedulable)
    })
    .await;

    // A process suspended, then resumed, as AWS describes it.
    let suspended = |asg: String| {
        let autoscaling = world.aws.autoscaling.clone();
        async move {
            let out = autoscaling
                .describe_auto_scaling_groups()
                .auto_scaling_group_names(asg)
                .send()
                .await
                .expect("describe");
            let group = out.auto_scaling_groups().first().expect("the ASG").clone();
            let processes = group.suspended_processes();
            processes
                .iter()
                .filter_map(|p| p.process_name().map(str::to_string))
                .collect::<Vec<_>>()
        }
    };
    world.scaling_process(&kops.asgs[0], "Launch", false).await;
    assert_eq!(suspended(kops.asgs[0].clone()).await, ["Launch"]);
    world.scaling_process(&kops.asgs[0], "Launch", true).await;
    assert!(suspended(kops.asgs[0].clone()).await.is_empty());

    // An instance lost through EC2: its Node gone, its termination in the
    // ASG's activities, and that termination one the manager did not
    // choose, which the check of chosen terminations reports.
    assert_eq!(world.terminations_in(&kops.asgs).await, 0);
    let lost = before[0].2[0].clone();
    world.lose_instance_and_its_node(&lost).await;
    assert!(
        world
            .nodes()
            .await
            .expect("nodes")
            .iter()
            .all(|n| { n.metadata.name.as_deref() != Some(lost.as_str()) })
    );
    let activities = assert_eventually("the loss in the activities", WAIT, || async {
        let all = world.activities(&kops.asgs[0]).await;
        let terminating: Vec<String> = all.into_iter().map(|(_, d)| d).collect();
        // The wording check_terminations_chosen reads: pinned here, so an
        // emulator that words it otherwise fails this test too.
        let wanted = format!("Terminating EC2 instance: {lost}");
        terminating.contains(&wanted).then_some(terminating)
    })
    .await;
    assert!(
        world.terminations_in(&kops.asgs).await >= 1,
        "{activities:?}"
    );
    let checked = check_terminations_chosen(&activities, &manager.plain_logs(), 1);
    let error = checked.expect_err("a termination the manager never asked for");
    assert!(error.contains(&lost), "{error}");
}
