//! The emulator every test runs against (`scripts/moto_server.py`) is as rude
//! as a real Auto Scaling Group: launches take time, min/max are enforced,
//! scaling activities are recorded, lost instances are replaced by the ASG's
//! own loop, suspended processes are honoured. Checked here through the SDK,
//! so a test elsewhere that passes does not pass because the emulator is kind.

use snm_testkit as support;

use aws_sdk_autoscaling::error::ProvideErrorMetadata;
use std::time::{Duration, Instant};
use support::{World, ZONES, assert_eventually};

const WAIT: Duration = Duration::from_secs(60);

async fn describe(world: &World, asg: &str) -> aws_sdk_autoscaling::types::AutoScalingGroup {
    world
        .aws
        .autoscaling
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(asg)
        .send()
        .await
        .expect("describe")
        .auto_scaling_groups()
        .first()
        .cloned()
        .expect("the ASG")
}

fn states(g: &aws_sdk_autoscaling::types::AutoScalingGroup) -> Vec<String> {
    g.instances()
        .iter()
        .map(|i| {
            i.lifecycle_state()
                .map(|s| s.as_str().to_string())
                .unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn a_launch_starts_after_a_lag_and_is_pending_before_in_service() {
    let world = World::new("emu-lag").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = &kops.asgs[0];
    world.set_timing(asg, "launch-lag", 1.5).await;
    world.set_timing(asg, "pending-time", 1.5).await;
    let asked = Instant::now();
    world
        .aws
        .autoscaling
        .set_desired_capacity()
        .auto_scaling_group_name(asg)
        .desired_capacity(2)
        .send()
        .await
        .expect("raise");
    // Asked for, not launched: desired above the instance count meanwhile.
    let g = describe(&world, asg).await;
    assert_eq!((g.desired_capacity(), g.instances().len()), (Some(2), 1));
    assert_eventually("a Pending instance", WAIT, || async {
        states(&describe(&world, asg).await)
            .contains(&"Pending".to_string())
            .then_some(())
    })
    .await;
    world.wait_in_service(asg, 2).await;
    eprintln!("raise to InService: {:?}", asked.elapsed());
    let activities = world.activities(asg).await;
    assert_eq!(activities[0].0, "Successful", "{activities:?}");
    assert!(
        activities[0]
            .1
            .starts_with("Launching a new EC2 instance: i-")
    );
}

#[tokio::test]
async fn spot_groups_launch_spot_instances_of_an_override_type() {
    let world = World::new("emu-spot").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 2, &[]).await;
    let ids = world.asg_instances(&kops.asgs[0]).await;
    let out = world
        .aws
        .ec2
        .describe_instances()
        .set_instance_ids(Some(ids))
        .send()
        .await
        .expect("describe instances");
    let instances: Vec<_> = out
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .collect();
    assert_eq!(instances.len(), 2);
    for i in instances {
        assert_eq!(
            i.instance_lifecycle(),
            Some(&aws_sdk_ec2::types::InstanceLifecycleType::Spot)
        );
        let t = i.instance_type().map(|t| t.as_str()).unwrap_or_default();
        assert!(["m5.large", "m5a.large"].contains(&t), "{t}");
    }
}

#[tokio::test]
async fn calls_outside_the_bounds_are_refused_with_aws_text() {
    let world = World::new("emu-bounds").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = &kops.asgs[0];
    let id = world.asg_instances(asg).await.remove(0);
    let asg_api = &world.aws.autoscaling;

    let above = asg_api
        .set_desired_capacity()
        .auto_scaling_group_name(asg)
        .desired_capacity(21)
        .send()
        .await
        .expect_err("above max");
    assert_eq!(above.code(), Some("ValidationError"));
    assert!(
        above
            .message()
            .unwrap_or_default()
            .contains("above max value 20"),
        "{above:?}"
    );
    let below = asg_api
        .set_desired_capacity()
        .auto_scaling_group_name(asg)
        .desired_capacity(0)
        .send()
        .await
        .expect_err("below min");
    assert!(
        below
            .message()
            .unwrap_or_default()
            .contains("below min value 1")
    );
    let terminate = asg_api
        .terminate_instance_in_auto_scaling_group()
        .instance_id(&id)
        .should_decrement_desired_capacity(true)
        .send()
        .await
        .expect_err("decrement below min");
    assert!(
        terminate
            .message()
            .unwrap_or_default()
            .contains("desiredSize equals minSize (1)"),
        "{terminate:?}"
    );
    let detach = asg_api
        .detach_instances()
        .auto_scaling_group_name(asg)
        .instance_ids(&id)
        .should_decrement_desired_capacity(true)
        .send()
        .await
        .expect_err("detach below min");
    assert!(
        detach
            .message()
            .unwrap_or_default()
            .contains("desiredSize equals minSize (1)")
    );
    // Nothing happened.
    let g = describe(&world, asg).await;
    assert_eq!(
        (g.desired_capacity(), states(&g)),
        (Some(1), vec!["InService".to_string()])
    );
}

#[tokio::test]
async fn an_instance_terminated_through_ec2_is_replaced_by_the_asgs_health_check() {
    let world = World::new("emu-loss").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = &kops.asgs[0];
    let lost = world.asg_instances(asg).await.remove(0);
    world.lose_instance(&lost).await;
    // Not at once: the ASG still lists it until its health check notices.
    assert_eq!(world.asg_instances(asg).await, vec![lost.clone()]);
    let replacement = assert_eventually("a replacement", WAIT, || async {
        let ids = world.wait_in_service(asg, 1).await;
        (ids[0] != lost).then(|| ids[0].clone())
    })
    .await;
    let activities = world.activities(asg).await;
    assert!(
        activities
            .iter()
            .any(|(_, d)| d == &format!("Terminating EC2 instance: {lost}")),
        "{activities:?}"
    );
    assert_eq!(
        activities[0].1,
        format!("Launching a new EC2 instance: {replacement}"),
        "newest first"
    );
}

#[tokio::test]
async fn a_short_asg_records_failed_launches_and_keeps_retrying_until_capacity_returns() {
    let world = World::new("emu-short").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = &kops.asgs[0];
    world.set_timing(asg, "capacity-retry", 1.0).await;
    world.tag_asg(asg, "snm.test/no-capacity", "true").await;
    world
        .aws
        .autoscaling
        .set_desired_capacity()
        .auto_scaling_group_name(asg)
        .desired_capacity(2)
        .send()
        .await
        .expect("raise");
    let failed = assert_eventually("two failed attempts", WAIT, || async {
        let failed: Vec<_> = world
            .activities(asg)
            .await
            .into_iter()
            .filter(|(s, _)| s == "Failed")
            .collect();
        (failed.len() >= 2).then_some(failed)
    })
    .await;
    assert!(
        failed[0]
            .1
            .contains("Could not launch Spot Instances. InsufficientInstanceCapacity"),
        "{failed:?}"
    );
    let message = world
        .aws
        .autoscaling
        .describe_scaling_activities()
        .auto_scaling_group_name(asg)
        .send()
        .await
        .expect("activities")
        .activities()[0]
        .status_message()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.starts_with("Could not launch Spot Instances"),
        "{message}"
    );
    // Capacity returns: the ASG's own retry launches, nobody asks again.
    world.untag_asg(asg, "snm.test/no-capacity", "true").await;
    world.wait_in_service(asg, 2).await;
}

#[tokio::test]
async fn suspended_launch_and_standby_are_honoured() {
    let world = World::new("emu-suspend").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = &kops.asgs[0];
    let asg_api = &world.aws.autoscaling;
    world.scaling_process(asg, "Launch", false).await;
    asg_api
        .set_desired_capacity()
        .auto_scaling_group_name(asg)
        .desired_capacity(2)
        .send()
        .await
        .expect("raise");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(world.asg_instances(asg).await.len(), 1, "Launch suspended");
    let g = describe(&world, asg).await;
    assert_eq!(
        g.suspended_processes()
            .iter()
            .filter_map(|p| p.process_name())
            .collect::<Vec<_>>(),
        ["Launch"]
    );
    asg_api
        .resume_processes()
        .auto_scaling_group_name(asg)
        .scaling_processes("Launch")
        .send()
        .await
        .expect("resume");
    let ids = world.wait_in_service(asg, 2).await;

    // Standby is not capacity: without a decrement, the ASG launches another.
    asg_api
        .enter_standby()
        .auto_scaling_group_name(asg)
        .instance_ids(&ids[0])
        .should_decrement_desired_capacity(false)
        .send()
        .await
        .expect("standby");
    assert_eventually("a replacement for the Standby instance", WAIT, || async {
        let s = states(&describe(&world, asg).await);
        (s.iter().filter(|s| *s == "InService").count() == 2 && s.contains(&"Standby".into()))
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_sqs_long_poll_waits_for_a_message_without_stalling_other_calls() {
    let world = World::new("emu-long-poll").await;
    let queue = world.queue("long-poll").await;
    // A 10 s long poll in flight: other calls are answered meanwhile, as
    // by SQS, and the poll returns the message sent while it waits.
    let poll = queue.receive_waiting(10);
    tokio::pin!(poll);
    let other = world.aws.autoscaling.describe_auto_scaling_groups().send();
    tokio::select! {
        answered = other => { answered.expect("describe"); }
        _ = &mut poll => panic!("the describe waited for the long poll"),
    }
    queue.send("hello").await;
    let received = poll.await;
    assert_eq!(received, vec!["hello".to_string()]);
}

#[tokio::test]
async fn a_terminate_hook_holds_a_leaving_instance_until_completed_or_timed_out() {
    let world = World::new("emu-hook").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 3, &[]).await;
    let asg = &kops.asgs[0];
    world.wait_in_service(asg, 3).await;
    let queue = world.queue("hooks").await;
    world.terminate_hook(asg, "drain", &queue, 3).await;
    // AWS tests the target when the hook is put.
    let test = queue.receive_waiting(5).await;
    assert!(
        test.iter()
            .any(|b| b.contains("autoscaling:TEST_NOTIFICATION")),
        "{test:?}"
    );
    let ids = world.asg_instances(asg).await;
    let terminate = |id: String| {
        let world = &world;
        async move {
            world
                .aws
                .autoscaling
                .terminate_instance_in_auto_scaling_group()
                .instance_id(id)
                .should_decrement_desired_capacity(false)
                .send()
                .await
                .expect("terminate")
        }
    };
    // The hook's notice for `id` (messages left undeleted come back).
    let notice = |id: String| {
        let queue = &queue;
        async move {
            assert_eventually("the hook's notice", WAIT, || async {
                queue
                    .receive_waiting(1)
                    .await
                    .into_iter()
                    .filter(|b| b.contains("LifecycleActionToken") && b.contains(&id))
                    .find_map(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
            })
            .await
        }
    };
    let state_of = |id: String| {
        let world = &world;
        async move {
            describe(world, asg)
                .await
                .instances()
                .iter()
                .find(|i| i.instance_id() == Some(id.as_str()))
                .and_then(|i| i.lifecycle_state().map(|s| s.as_str().to_string()))
        }
    };
    let call = |token: &str, id: &str, complete: bool| {
        let (world, token, id) = (&world, token.to_string(), id.to_string());
        async move {
            let a = &world.aws.autoscaling;
            if complete {
                a.complete_lifecycle_action()
                    .auto_scaling_group_name(asg)
                    .lifecycle_hook_name("drain")
                    .lifecycle_action_token(token)
                    .instance_id(id)
                    .lifecycle_action_result("CONTINUE")
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| e.message().unwrap_or_default().to_string())
            } else {
                a.record_lifecycle_action_heartbeat()
                    .auto_scaling_group_name(asg)
                    .lifecycle_hook_name("drain")
                    .lifecycle_action_token(token)
                    .instance_id(id)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| e.message().unwrap_or_default().to_string())
            }
        }
    };

    // Held: Terminating:Wait with its instance running, the notice queued.
    terminate(ids[0].clone()).await;
    let first = notice(ids[0].clone()).await;
    assert_eq!(first["EC2InstanceId"], ids[0].as_str());
    assert_eq!(first["LifecycleHookName"], "drain");
    let token = first["LifecycleActionToken"]
        .as_str()
        .expect("token")
        .to_string();
    assert_eq!(
        state_of(ids[0].clone()).await.as_deref(),
        Some("Terminating:Wait")
    );
    // Heartbeats keep it past its 3 s timeout.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        call(&token, &ids[0], false).await.expect("heartbeat");
    }
    assert_eq!(
        state_of(ids[0].clone()).await.as_deref(),
        Some("Terminating:Wait")
    );
    let stale = call("not-the-token", &ids[0], true).await;
    assert!(
        stale
            .as_ref()
            .is_err_and(|m| m.contains("No active Lifecycle Action found")),
        "{stale:?}"
    );
    call(&token, &ids[0], true).await.expect("complete");
    assert_eventually("completed: terminated", WAIT, || async {
        (state_of(ids[0].clone()).await.is_none()).then_some(())
    })
    .await;
    let again = call(&token, &ids[0], true).await;
    assert!(again.is_err(), "an action completes once: {again:?}");

    // Without a heartbeat it goes at its timeout.
    terminate(ids[1].clone()).await;
    let held = Instant::now();
    // Its notice too: the timeout is of the action this notice announced.
    let second = notice(ids[1].clone()).await;
    assert_eq!(second["EC2InstanceId"], ids[1].as_str(), "{second}");
    assert_eq!(second["LifecycleHookName"], "drain", "{second}");
    assert_eventually("timed out: terminated", WAIT, || async {
        (state_of(ids[1].clone()).await.is_none()).then_some(())
    })
    .await;
    assert!(
        held.elapsed() >= Duration::from_secs(2),
        "{:?}",
        held.elapsed()
    );
}

/// The emulator's price answers as AWS gives them (issue 70): spot price
/// history per product description, the whole history when no start time
/// is asked and the entry in force plus later ones when one is, oldest
/// first, in pages; GetProducts narrowed by every filter, one document a
/// page, the reserved terms beside the on-demand one.
#[tokio::test]
async fn prices_come_with_history_per_product_description_and_in_pages() {
    use aws_sdk_ec2::types::InstanceType;
    let world = World::new("emu-prices").await;
    world
        .set_spot_price("m5.large", ZONES[0], Some(0.031))
        .await;
    let ec2 = &world.aws.ec2;
    // Every page of one read: (product description, price, time) in order.
    let read = |start: Option<aws_sdk_ec2::primitives::DateTime>, products: Vec<String>| async move {
        let (mut entries, mut pages) = (vec![], 0);
        let mut answers = ec2
            .describe_spot_price_history()
            .instance_types(InstanceType::M5Large)
            .set_product_descriptions(Some(products))
            .set_start_time(start)
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("availability-zone")
                    .values(ZONES[0])
                    .build(),
            )
            .into_paginator()
            .send();
        while let Some(page) = answers.next().await {
            pages += 1;
            for p in page.expect("a page").spot_price_history() {
                let product = p.product_description().map(|d| d.as_str().to_string());
                let at = p.timestamp().map(|t| t.secs());
                entries.push((
                    product.unwrap_or_default(),
                    p.spot_price().unwrap_or_default().to_string(),
                    at,
                ));
            }
        }
        (entries, pages)
    };
    let both = vec![
        "Linux/UNIX".to_string(),
        "Linux/UNIX (Amazon VPC)".to_string(),
    ];
    // No start time: the whole history of both descriptions, oldest first.
    let (all, _) = read(None, both.clone()).await;
    let products: Vec<&str> = all.iter().map(|(d, _, _)| d.as_str()).collect();
    assert_eq!(
        products,
        ["Linux/UNIX (Amazon VPC)", "Linux/UNIX", "Linux/UNIX"],
        "{all:?}"
    );
    let times: Vec<Option<i64>> = all.iter().map(|(_, _, t)| *t).collect();
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted, "oldest first: {all:?}");
    assert_eq!(
        all.last().map(|(_, p, _)| p.as_str()),
        Some("0.031000"),
        "{all:?}"
    );
    // As of now: the entry in force under each description, no older one.
    let now = aws_sdk_ec2::primitives::DateTime::from(std::time::SystemTime::now());
    let (in_force, _) = read(Some(now), both).await;
    assert_eq!(in_force.len(), 2, "{in_force:?}");
    // One description asked: only its entries.
    let (vpc, _) = read(None, vec!["Linux/UNIX (Amazon VPC)".to_string()]).await;
    assert_eq!(vpc.len(), 1, "{vpc:?}");
    // Pages of 5: every zone of two types is more than one page.
    let pages = {
        let mut answers = ec2
            .describe_spot_price_history()
            .instance_types(InstanceType::M5Large)
            .instance_types(InstanceType::M5aLarge)
            .into_paginator()
            .send();
        let mut pages = 0;
        while let Some(page) = answers.next().await {
            pages += 1;
            let page = page.expect("a page");
            assert!(page.spot_price_history().len() <= 5, "{page:?}");
        }
        pages
    };
    assert!(pages > 1, "{pages} page(s)");

    // GetProducts: the Linux product alone under every filter, one page
    // each; one filter left out lets its decoys through, a page each.
    let pricing = &world.aws.pricing;
    let products = |filters: &[(&str, &str)]| {
        let filters: Vec<aws_sdk_pricing::types::Filter> = filters
            .iter()
            .map(|(f, v)| {
                aws_sdk_pricing::types::Filter::builder()
                    .r#type(aws_sdk_pricing::types::FilterType::TermMatch)
                    .field(*f)
                    .value(*v)
                    .build()
                    .expect("a filter")
            })
            .collect();
        async move {
            let mut answers = pricing
                .get_products()
                .service_code("AmazonEC2")
                .set_filters(Some(filters))
                .into_paginator()
                .send();
            let mut documents = vec![];
            while let Some(page) = answers.next().await {
                let page = page.expect("a page");
                assert!(page.price_list().len() <= 1, "one document a page");
                documents.extend(page.price_list().iter().cloned());
            }
            documents
        }
    };
    let linux = [
        ("instanceType", "m5.large"),
        ("regionCode", support::REGION),
        ("operatingSystem", "Linux"),
        ("tenancy", "Shared"),
        ("preInstalledSw", "NA"),
        ("capacitystatus", "Used"),
        ("marketoption", "OnDemand"),
        ("operation", "RunInstances"),
    ];
    let one = products(&linux).await;
    assert_eq!(one.len(), 1, "{one:?}");
    let document: serde_json::Value = serde_json::from_str(&one[0]).expect("JSON");
    assert!(document["terms"]["OnDemand"].is_object(), "{document}");
    assert!(document["terms"]["Reserved"].is_object(), "{document}");
    let without_operation = products(&linux[..7]).await;
    assert_eq!(without_operation.len(), 2, "the other usage operation too");
}
