//! The simulated kubelet (test support) behaves like the kubelets it stands
//! in for.

use snm_testkit as support;

use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use std::time::Duration;
use support::{World, ZONES, assert_eventually};

const WAIT: Duration = Duration::from_secs(60);
const FAST: Duration = Duration::from_millis(300);

#[tokio::test]
async fn nodes_register_with_kops_labels_and_leave_with_their_instance() {
    let world = World::new("sim-nodes").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let id = world.asg_instances(&kops.asgs[0]).await.remove(0);
    let _sim = world.start_sim(FAST, FAST);
    let nodes: Api<Node> = Api::all(world.client.clone());

    let node = assert_eventually("node ready", WAIT, || async {
        let n = nodes.get(&id).await.ok()?;
        spot_node_manager::k8s::node::is_ready(&n).then_some(n)
    })
    .await;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kops.k8s.io/instancegroup"),
        Some(&kops.instance_groups[0])
    );
    assert_eq!(
        labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some(ZONES[0])
    );
    assert!(labels.contains_key("node-role.kubernetes.io/node"));
    assert_eq!(
        node.spec.and_then(|s| s.provider_id),
        Some(format!("aws:///{}/{id}", ZONES[0]))
    );

    // A pod being deleted on the node is finished, as a kubelet would.
    let pods: Api<Pod> = world.api();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("app".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(id.clone()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("registry.invalid/app".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    pods.delete("app", &DeleteParams::default())
        .await
        .expect("delete pod");
    assert_eventually("terminating pod finished", WAIT, || async {
        pods.get_opt("app").await.ok()?.is_none().then_some(())
    })
    .await;

    // The instance terminates: its Node goes.
    world.lose_instance(&id).await;
    assert_eventually("node deleted", WAIT, || async {
        nodes.get_opt(&id).await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_master_runs_the_static_control_plane_pods_ready_after_a_delay() {
    use spot_node_manager::k8s::control_plane::nodes_with_ready_control_plane;
    let world = World::new("sim-masters").await;
    let kops = world.kops_group("master", &ZONES[..1], 1, &[]).await;
    let id = world.asg_instances(&kops.asgs[0]).await.remove(0);
    let _sim = world.start_sim(FAST, FAST);
    let list = || control_plane_pods(&world);
    // Created with the node, not Ready at first (the delay is 2 s).
    let created = assert_eventually("control-plane pods", WAIT, || async {
        let items = list().await;
        (items.len() == 2).then_some(items)
    })
    .await;
    assert_eq!(created.len(), 2, "{created:?}");
    let mut names: Vec<String> = created
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            format!("etcd-manager-main-{id}"),
            format!("kube-apiserver-{id}")
        ]
    );
    assert!(
        created.iter().all(|p| p
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))),
        "mirror pods: never evicted"
    );
    assert_eventually("control plane Ready", WAIT, || async {
        nodes_with_ready_control_plane(&list().await)
            .contains(&id)
            .then_some(())
    })
    .await;
    // Gone with the instance.
    world.lose_instance(&id).await;
    assert_eventually("control-plane pods gone", WAIT, || async {
        list().await.is_empty().then_some(())
    })
    .await;
}

/// kops runs one etcd place per master ASG, its volume attached to one
/// instance at a time (kops's `pkg/model` gives each master instance group
/// its own EBS volumes, `k8s.io/etcd/main: a/a,b,c`; etcd-manager mounts a
/// place's volume before it starts etcd, and kube-apiserver reads the etcd
/// on its own machine, `--etcd-servers=https://127.0.0.1:4001` in
/// `pkg/model/components/apiserver.go`). A master beside the holder (its
/// ASG raised) runs its control-plane pods, never Ready; once the holder
/// is gone it takes the volume and its pods turn Ready.
#[tokio::test]
async fn a_master_beside_its_places_volume_holder_serves_only_once_the_holder_is_gone() {
    use spot_node_manager::k8s::control_plane::nodes_with_ready_control_plane;
    let world = World::new("sim-volumes").await;
    let kops = world.kops_group("master", &ZONES[..1], 1, &[]).await;
    let asg = kops.asgs[0].clone();
    let holder = world.asg_instances(&asg).await.remove(0);
    let _sim = world.start_sim_configured(snm_testkit::sim::SimConfig {
        register_delay: FAST,
        ready_delay: FAST,
        etcd_volumes: true,
        ..Default::default()
    });
    let list = || control_plane_pods(&world);
    assert_eventually("the holder serves", WAIT, || async {
        nodes_with_ready_control_plane(&list().await)
            .contains(&holder)
            .then_some(())
    })
    .await;
    world
        .aws
        .autoscaling
        .update_auto_scaling_group()
        .auto_scaling_group_name(&asg)
        .max_size(2)
        .desired_capacity(2)
        .send()
        .await
        .expect("raise the master ASG");
    let beside = assert_eventually("a master beside, its pods running", WAIT, || async {
        let ids = world.asg_instances(&asg).await;
        let beside = ids.into_iter().find(|id| *id != holder)?;
        let on_it = list()
            .await
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&*beside))
            .count();
        (on_it == 2).then_some(beside)
    })
    .await;
    // Well past the control-plane delay (2 s): still not Ready, every look.
    let mut looks = 0;
    for _ in 0..20 {
        let ready = nodes_with_ready_control_plane(&list().await);
        assert!(ready.contains(&holder), "the holder keeps serving");
        assert!(
            !ready.contains(&beside),
            "{beside} beside its place's holder serves"
        );
        looks += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(looks, 20);
    world.lose_instance(&holder).await;
    assert_eventually(
        "the one beside takes the volume and serves",
        WAIT,
        || async {
            nodes_with_ready_control_plane(&list().await)
                .contains(&beside)
                .then_some(())
        },
    )
    .await;
}

/// The control-plane mirror pods this test's simulated kubelet runs.
async fn control_plane_pods(world: &World) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(
        world.client.clone(),
        spot_node_manager::k8s::control_plane::NAMESPACE,
    );
    let selector = format!("{}={}", snm_testkit::sim::SIM_ACCOUNT_LABEL, world.account);
    pods.list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}
