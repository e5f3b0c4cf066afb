//! The AWS adapter against moto in server mode (not only the fake).

use snm_testkit as support;

use spot_node_manager::cloud::Cloud;
use spot_node_manager::cloud::aws::AwsCloud;
use std::time::Duration;
use support::{World, ZONES, assert_eventually};

fn cloud(world: &World) -> AwsCloud {
    AwsCloud::new(world.aws.clone())
}

async fn desired(world: &World, asg: &str) -> i32 {
    cloud(world)
        .describe_groups(&[asg.to_string()])
        .await
        .expect("describe")[0]
        .desired
}

#[tokio::test]
async fn describe_groups_returns_existing_groups_with_their_instances() {
    let world = World::new("aws-describe").await;
    let kops = world.kops_group("nodes", &ZONES[..2], 2, &[]).await;
    let mut names = kops.asgs.clone();
    names.push("does-not-exist".into());
    let groups = cloud(&world)
        .describe_groups(&names)
        .await
        .expect("describe");
    assert_eq!(groups.len(), 2, "an unknown ASG is simply absent");
    let g = groups
        .iter()
        .find(|g| g.name == kops.asgs[0])
        .expect("first ASG");
    assert_eq!((g.desired, g.min, g.max), (2, 2, 20));
    assert_eq!(g.instances.len(), 2);
    assert!(
        g.instances
            .iter()
            .all(|i| i.availability_zone.as_deref() == Some(ZONES[0]))
    );
    assert!(g.instances.iter().all(|i| i.lifecycle_state == "InService"));
    assert_eq!(
        g.launch_template.as_deref(),
        Some(format!("{}-nodes", world.prefix()).as_str())
    );
    assert_eq!(
        g.tags.get("kops.k8s.io/instancegroup"),
        Some(&kops.instance_groups[0])
    );
    assert!(g.recent_failure.is_none());
    assert!(g.suspended_processes.is_empty());
    world.cleanup().await;
}

#[tokio::test]
async fn a_short_asg_reports_its_newest_launch_failure_and_suspended_processes() {
    let world = World::new("aws-short").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = &kops.asgs[0];
    world.tag_asg(asg, "snm.test/no-capacity", "true").await;
    world
        .aws
        .autoscaling
        .suspend_processes()
        .auto_scaling_group_name(asg)
        .scaling_processes("AZRebalance")
        .send()
        .await
        .expect("suspend");
    let aws = cloud(&world);
    aws.set_desired_capacity(asg, 2).await.expect("raise");
    let failure = assert_eventually("a failed launch", Duration::from_secs(30), || async {
        aws.launch_failure(asg).await.ok()?
    })
    .await;
    assert!(
        failure.starts_with("Could not launch Spot Instances"),
        "{failure}"
    );
    let g = aws
        .describe_groups(std::slice::from_ref(asg))
        .await
        .expect("describe");
    assert_eq!(g[0].suspended_processes, ["AZRebalance"]);
    assert!(
        g[0].recent_failure.is_none(),
        "a plain describe asks no activity"
    );
    // Capacity returns: the newest launch succeeds, and the old failure no
    // longer counts.
    world.untag_asg(asg, "snm.test/no-capacity", "true").await;
    world.wait_in_service(asg, 2).await;
    aws.set_desired_capacity(asg, 3).await.expect("raise");
    assert_eventually("a launch in flight", Duration::from_secs(30), || async {
        let g = aws.describe_groups(std::slice::from_ref(asg)).await.ok()?;
        g.into_iter().find(|g| g.active_instances() < 3)
    })
    .await;
    assert_eq!(aws.launch_failure(asg).await.expect("activities"), None);
    world.cleanup().await;
}

#[tokio::test]
async fn describe_instances_pages_through_more_ids_than_one_page() {
    let world = World::new("aws-pages").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 12, &[]).await;
    let ids = world.asg_instances(&kops.asgs[0]).await;
    assert_eq!(ids.len(), 12);
    let mut with_unknown = ids.clone();
    with_unknown.push("i-00000000000000000".into());
    let described = cloud(&world)
        .with_instance_page(5)
        .describe_instances(&with_unknown)
        .await
        .expect("describe in pages of 5");
    let mut got: Vec<_> = described.iter().map(|i| i.instance_id.clone()).collect();
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(
        got, want,
        "every instance across 3 pages; an unknown id is skipped, not an error"
    );
    let one = &described[0];
    assert!(one.launch_time.is_some());
    assert_eq!(one.availability_zone.as_deref(), Some(ZONES[0]));
    assert_eq!(one.state, "running");
    assert!(one.instance_type.is_some());
    world.cleanup().await;
}

#[tokio::test]
async fn set_desired_capacity_launches_and_an_unknown_asg_is_a_clear_error() {
    let world = World::new("aws-desired").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let aws = cloud(&world);
    aws.set_desired_capacity(&kops.asgs[0], 3)
        .await
        .expect("set desired");
    assert_eq!(desired(&world, &kops.asgs[0]).await, 3);
    // Launched by the ASG after its lag, not inside the call.
    world.wait_in_service(&kops.asgs[0], 3).await;
    let err = aws
        .set_desired_capacity("nodes-nowhere", 2)
        .await
        .expect_err("unknown ASG");
    let text = err.to_string();
    assert!(
        text.contains("SetDesiredCapacity") && text.contains("nodes-nowhere"),
        "{text}"
    );
    assert_eq!(err.category(), "aws");
    world.cleanup().await;
}

#[tokio::test]
async fn terminate_in_group_honours_the_decrement_flag_and_the_asgs_min() {
    let world = World::new("aws-terminate").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 3, &[]).await;
    let asg = kops.asgs[0].clone();
    let aws = cloud(&world);
    let ids = world.wait_in_service(&asg, 3).await;

    // kops groups sit at their min: a decrement below it is refused, with
    // AWS's message, and nothing happens.
    let err = aws
        .terminate_in_group(&ids[0], true)
        .await
        .expect_err("below min");
    assert!(
        err.to_string().contains("desiredSize equals minSize"),
        "{err}"
    );
    assert_eq!(desired(&world, &asg).await, 3);

    // Without decrement: terminated, and the ASG launches a replacement
    // (after its launch lag, Pending first).
    aws.terminate_in_group(&ids[0], false)
        .await
        .expect("terminate in group");
    assert_eq!(desired(&world, &asg).await, 3);
    let after = world.wait_in_service(&asg, 3).await;
    assert!(!after.contains(&ids[0]), "a replacement was launched");

    // Above min: decremented, no replacement.
    world.set_min(&asg, 1).await;
    aws.terminate_in_group(&ids[1], true)
        .await
        .expect("terminate in group");
    assert_eq!(desired(&world, &asg).await, 2);
    let left = world.wait_in_service(&asg, 2).await;
    assert!(!left.contains(&ids[1]));
    world.cleanup().await;
}

#[tokio::test]
async fn a_replica_that_stops_leading_makes_no_further_aws_call() {
    use spot_node_manager::cloud::fence::NOT_LEADING;
    use spot_node_manager::cloud::{AwsClients, Fencing};
    use spot_node_manager::leader::Leadership;
    let world = World::new("aws-fence").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = kops.asgs[0].clone();
    let leadership = Leadership::elected();
    let fenced = AwsCloud::new(AwsClients::fenced(
        &world.aws_sdk,
        Some(&world.account),
        &Fencing {
            leadership: leadership.clone(),
            operation_timeout: Duration::from_secs(5),
        },
    ));
    // Never led: refused before any request leaves.
    let refused = fenced.set_desired_capacity(&asg, 2).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| format!("{e:?}").contains(NOT_LEADING)),
        "{refused:?}"
    );
    assert_eq!(desired(&world, &asg).await, 1, "the emulator saw nothing");
    // Leading: the call goes through.
    leadership.lead_until(tokio::time::Instant::now() + Duration::from_secs(2));
    fenced
        .set_desired_capacity(&asg, 2)
        .await
        .expect("as leader");
    assert_eq!(desired(&world, &asg).await, 2);
    // The lease runs out (renewals blocked): the next attempt is refused,
    // the emulator unchanged.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let refused = fenced.set_desired_capacity(&asg, 3).await;
    assert!(refused.is_err(), "{refused:?}");
    let refused = fenced.describe_groups(std::slice::from_ref(&asg)).await;
    assert!(refused.is_err(), "reads are fenced too: {refused:?}");
    assert_eq!(desired(&world, &asg).await, 2, "no call reached AWS");
    world.cleanup().await;
}
