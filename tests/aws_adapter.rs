//! The AWS adapter against moto in server mode (not only the fake).

use snm_testkit as support;

use spot_node_manager::cloud::aws::AwsCloud;
use spot_node_manager::cloud::{Cloud, LaunchSource, TemplateKey};
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
    match &g.launches_from {
        Some(LaunchSource::Template { name, version, .. }) => {
            assert_eq!(
                name.as_deref(),
                Some(g.name.as_str()),
                "kops names it as its ASG"
            );
            assert_eq!(
                version.as_deref(),
                Some("$Latest"),
                "as the test kit sets it"
            );
        }
        other => panic!("launches from {other:?}"),
    }
    assert_eq!(
        g.tags.get("kops.k8s.io/instancegroup"),
        Some(&kops.instance_groups[0])
    );
    assert!(g.recent_failure.is_none());
    assert!(g.suspended_processes.is_empty());
}

#[tokio::test]
async fn a_short_asg_reports_its_newest_launch_failure_and_suspended_processes() {
    let world = World::new("aws-short").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = &kops.asgs[0];
    world.tag_asg(asg, "snm.test/no-capacity", "true").await;
    world.scaling_process(asg, "AZRebalance", false).await;
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
}

#[tokio::test]
async fn set_desired_capacity_launches_and_an_unknown_asg_is_a_clear_error() {
    let world = World::new("aws-desired").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let metrics = std::sync::Arc::new(spot_node_manager::metrics::Metrics::default());
    let aws = cloud(&world).with_metrics(metrics.clone());
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
    // Both requests counted, the refused one as an error too.
    let text = metrics.encode();
    for line in [
        r#"spot_node_manager_aws_calls_total{operation="SetDesiredCapacity"} 2"#,
        r#"spot_node_manager_aws_call_errors_total{operation="SetDesiredCapacity",kind="refused"} 1"#,
    ] {
        assert!(text.contains(line), "no {line} in:\n{text}");
    }
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
}

#[tokio::test]
async fn a_replica_that_stops_leading_makes_no_further_aws_call() {
    use spot_node_manager::cloud::leader_fence::NOT_LEADING;
    use spot_node_manager::cloud::{AwsClients, Fencing};
    use spot_node_manager::leadership::Leadership;
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
}

/// A stand-in for AWS that refuses every request with `Throttling` (which
/// the SDK retries), counts them, and calls `on_request` with each count.
async fn throttling_endpoint(
    on_request: impl Fn(usize) + Send + Sync + 'static,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            // The whole request: headers, then the body its length names.
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&request);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break;
                    }
                }
            }
            let count = counter.fetch_add(1, Ordering::SeqCst) + 1;
            on_request(count);
            let body = "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>\
                        <Message>Rate exceeded</Message></Error><RequestId>1</RequestId></ErrorResponse>";
            let response = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    (url, seen)
}

/// Static credentials, a retry policy with 4 attempts and short backoffs,
/// against `endpoint`.
fn sdk_for(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("ap-northeast-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_ec2::config::SharedCredentialsProvider::new(
            aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "tests"),
        ))
        .retry_config(
            aws_config::retry::RetryConfig::standard()
                .with_max_attempts(4)
                .with_initial_backoff(Duration::from_millis(50)),
        )
        .build()
}

#[tokio::test]
async fn a_retry_due_after_the_lease_ran_out_is_never_sent() {
    use spot_node_manager::cloud::leader_fence::NOT_LEADING;
    use spot_node_manager::cloud::{AwsClients, Fencing};
    use spot_node_manager::leadership::Leadership;
    use std::sync::atomic::Ordering;
    let names = ["nodes-a".to_string()];

    // Unfenced, the SDK makes every attempt its policy allows: the endpoint
    // does make it retry.
    let (url, seen) = throttling_endpoint(|_| {}).await;
    let plain = AwsCloud::new(AwsClients::new(&sdk_for(&url), None));
    let err = plain.describe_groups(&names).await.expect_err("throttled");
    assert!(format!("{err:?}").contains("Throttling"), "{err:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 4, "4 attempts");

    // Fenced: the lease runs out (renewals blocked) while the first attempt
    // is in flight. The retries it would make are refused before they leave.
    let leadership = Leadership::elected();
    leadership.lead_until(tokio::time::Instant::now() + Duration::from_secs(60));
    let lease = leadership.clone();
    let (url, seen) = throttling_endpoint(move |count| {
        if count == 1 {
            lease.lead_until(tokio::time::Instant::now());
        }
    })
    .await;
    let fenced = AwsCloud::new(AwsClients::fenced(
        &sdk_for(&url),
        None,
        &Fencing {
            leadership: leadership.clone(),
            operation_timeout: Duration::from_secs(30),
        },
    ));
    let err = fenced.describe_groups(&names).await.expect_err("refused");
    assert!(
        format!("{err:?}").contains(NOT_LEADING),
        "the retry was refused by the fence: {err:?}"
    );
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "only the attempt made while leading reached AWS"
    );
}

#[tokio::test]
async fn each_instance_reports_the_template_version_it_was_launched_from() {
    let world = World::new("aws-template-versions").await;
    let kops = world.kops_group("nodes", &ZONES[..1], 1, &[]).await;
    let asg = &kops.asgs[0];
    let cloud = cloud(&world);
    let version_of = |g: &spot_node_manager::cloud::AsgDescription, id: &str| match g
        .instances
        .iter()
        .find(|i| i.instance_id == id)
        .and_then(|i| i.launched_from.clone())
    {
        Some(LaunchSource::Template { name, version, .. }) => {
            assert_eq!(
                name.as_deref(),
                Some(asg.as_str()),
                "kops names it as its ASG"
            );
            version
        }
        other => panic!("{id} launched from {other:?}"),
    };
    let first = world.asg_instances(asg).await.remove(0);
    let g = cloud
        .describe_groups(std::slice::from_ref(asg))
        .await
        .expect("describe")[0]
        .clone();
    assert_eq!(version_of(&g, &first).as_deref(), Some("1"));

    // `kops update cluster`: version 2, which the ASG ($Latest) launches now.
    assert_eq!(world.kops_update_cluster(&kops).await, [2]);
    let key = TemplateKey::Name(asg.clone());
    let versions = cloud
        .template_versions(&[key.clone(), TemplateKey::Name("no-such-template".into())])
        .await
        .expect("a template not found is simply absent");
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!((versions[0].latest, versions[0].default), (2, 1));
    assert!(versions[0].is(&key));

    cloud.set_desired_capacity(asg, 2).await.expect("scale up");
    let second = assert_eventually("a second instance", Duration::from_secs(30), || async {
        world
            .asg_instances(asg)
            .await
            .into_iter()
            .find(|i| *i != first)
    })
    .await;
    let g = cloud
        .describe_groups(std::slice::from_ref(asg))
        .await
        .expect("describe")[0]
        .clone();
    assert_eq!(
        version_of(&g, &first).as_deref(),
        Some("1"),
        "a running instance stays on the version it was launched from"
    );
    assert_eq!(version_of(&g, &second).as_deref(), Some("2"));
}
