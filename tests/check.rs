//! `spot-node-manager check` against the real apiserver and the emulator
//! (issue 69): a healthy install passes, and each seeded fault is named
//! with what to do, failing the check when it blocks operation.

use kube::api::{Api, PostParams};
use snm_testkit as support;
use spot_node_manager::crd::NodeGroup;
use std::collections::BTreeSet;
use support::World;
use support::refresh::group;

/// The queue policy our stack writes (manifests/aws/interruption-queue.yaml,
/// QueuePolicy): moto's CloudFormation makes the queue but does not apply an
/// AWS::SQS::QueuePolicy, so the test sets it as AWS would.
const STACK_POLICY: &str = r#"{"Version":"2012-10-17","Statement":[{"Sid":"EventBridgeRulesSend","Effect":"Allow","Principal":{"Service":"events.amazonaws.com"},"Action":"sqs:SendMessage","Resource":"*"}]}"#;

/// The findings of `answer` whose check is `check`, as (level, said).
fn lines<'a>(answer: &'a serde_json::Value, check: &str) -> Vec<(&'a str, &'a str)> {
    answer
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            (
                f["level"].as_str().unwrap_or_default(),
                f["said"].as_str().unwrap_or_default(),
            )
        })
        .collect()
}

fn failures(answer: &serde_json::Value) -> Vec<String> {
    answer
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["level"] == "fail")
        .map(|f| format!("{}: {}", f["check"], f["said"]))
        .collect()
}

#[tokio::test]
async fn check_passes_on_a_healthy_install_and_names_each_seeded_fault() {
    let world = World::new("check").await;
    let kops = world
        .kops_group("nodes", &["ap-northeast-1a"], 1, &[])
        .await;
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(
            &PostParams::default(),
            &group("workers", "Worker", &kops.asgs, 1),
        )
        .await
        .expect("create group");
    let queue = world.queue("interruptions").await;
    queue.set_policy(STACK_POLICY).await;
    let url = ["--interruption-queue-url", queue.url.as_str()];
    let ns = world.namespace.clone();

    // Healthy: nothing fails, and each IAM read was asked and allowed.
    let before = world.aws_actions().await.len();
    let (passed, answer) = world.check(&url).await;
    assert!(passed, "{answer:#}");
    assert_eq!(failures(&answer), Vec::<String>::new());
    for action in spot_node_manager::check::judge::PROBED
        .iter()
        .filter(|a| !a.starts_with("sqs:"))
    {
        assert_eq!(
            lines(&answer, &format!("aws {action}")),
            vec![("ok", "allowed")],
            "{answer:#}"
        );
    }
    // Each was asked of AWS, and nothing else was: check changes nothing.
    let asked: BTreeSet<String> = world.aws_actions().await[before..]
        .iter()
        .map(|(_, action)| action.clone())
        .collect();
    let probed: BTreeSet<String> = spot_node_manager::check::judge::PROBED
        .iter()
        .filter_map(|a| a.split_once(':').map(|(_, op)| op.to_string()))
        .collect();
    assert_eq!(asked, probed, "the AWS requests check made");
    let group_said = lines(&answer, &format!("group {ns}/workers"));
    assert!(!group_said.is_empty(), "{answer:#}");
    assert!(
        group_said.iter().all(|(level, _)| *level != "fail"),
        "{group_said:?}"
    );
    let queue_said = lines(&answer, "interruption queue");
    assert_eq!(queue_said.len(), 1);
    assert_eq!(queue_said[0].0, "ok", "{queue_said:?}");
    assert_eq!(lines(&answer, "cluster termination handler")[0].0, "ok");

    // The faults a new install meets: an IAM action the role lacks, an ASG
    // named wrong, a queue that does not exist, kops's handler left running.
    world.deny_aws_action("DescribeInstances").await;
    groups
        .create(
            &PostParams::default(),
            &group("typo", "Worker", &["nodes-a.example.con".to_string()], 1),
        )
        .await
        .expect("create group");
    let missing_queue = queue.url.replace("interruptions", "no-such-queue");
    let nth = serde_json::json!({
        "app.kubernetes.io/name": "aws-node-termination-handler",
        "k8s-app": "aws-node-termination-handler",
    });
    let container = serde_json::json!({"name": "nth", "image": "registry.invalid/nth"});
    let handler = support::unscheduled("aws-node-termination-handler", &nth, &nth, container);
    world
        .api::<k8s_openapi::api::apps::v1::Deployment>()
        .create(&PostParams::default(), &handler)
        .await
        .expect("create the handler");

    let (passed, answer) = world
        .check(&["--interruption-queue-url", &missing_queue])
        .await;
    assert!(
        !passed,
        "a fault that blocks operation fails the check: {answer:#}"
    );
    let denied = lines(&answer, "aws ec2:DescribeInstances");
    assert_eq!(denied.len(), 1, "{answer:#}");
    assert_eq!(denied[0].0, "fail");
    assert!(
        denied[0].1.starts_with("refused (UnauthorizedOperation")
            && denied[0].1.contains("manifests/iam-policy.json"),
        "{denied:?}"
    );
    let typo = lines(&answer, &format!("group {ns}/typo"));
    assert!(
        typo.iter().any(|(level, said)| *level == "fail"
            && said.contains("ASG(s) not found")
            && said.contains("nodes-a.example.con")),
        "{typo:?}"
    );
    let queue_said = lines(&answer, "interruption queue");
    assert_eq!(queue_said[0].0, "fail", "{queue_said:?}");
    assert!(
        queue_said[0].1.contains("no-such-queue cannot be read"),
        "{queue_said:?}"
    );
    let handler_said = lines(&answer, "cluster termination handler");
    assert_eq!(handler_said[0].0, "warn", "{handler_said:?}");
    assert!(
        handler_said[0].1.contains(&format!(
            "kubectl -n {ns} delete deployment,daemonset,poddisruptionbudget,serviceaccount aws-node-termination-handler"
        )),
        "{handler_said:?}"
    );
    // What was not seeded still passes.
    assert_eq!(
        lines(&answer, "aws autoscaling:DescribeAutoScalingGroups"),
        vec![("ok", "allowed")]
    );
    let workers = lines(&answer, &format!("group {ns}/workers"));
    assert!(!workers.is_empty(), "{answer:#}");
    assert!(
        workers.iter().all(|(level, _)| *level != "fail"),
        "{workers:?}"
    );

    // The text a person reads: one line per finding, the failures marked.
    let output = world
        .read_only_output(
            "check",
            &["-o", "text", "--interruption-queue-url", &missing_queue],
        )
        .await;
    assert_eq!(output.status.code(), Some(1));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL  aws ec2:DescribeInstances: refused")),
        "{text}"
    );
    assert_eq!(
        text.lines().count(),
        answer.as_array().map_or(0, Vec::len),
        "{text}"
    );
}

/// Issue 69 item 7, "the scrape blocked": check asks the manager in its
/// pod (its admin port) when Prometheus last scraped it. Not yet, then a
/// request carrying Prometheus's scrape header (a curl without it is no
/// scrape), then no manager there at all.
#[tokio::test]
async fn check_says_whether_prometheus_scrapes_the_manager() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let world = World::new("check-scrape").await;
    let (manager, _config) = world.start_manager(&[]);
    let admin = format!("127.0.0.1:{}", manager.admin_port);
    // Up, and read once without the header (no scrape).
    support::assert_eventually(
        "the admin port up",
        std::time::Duration::from_secs(60),
        || async { manager.metrics().await.map(|_| ()) },
    )
    .await;
    let scrape_line = |answer: &serde_json::Value| {
        let said = lines(answer, "scrape");
        assert_eq!(said.len(), 1, "{answer:#}");
        (said[0].0.to_string(), said[0].1.to_string())
    };
    let (_, answer) = world.check(&["--admin-address", &admin]).await;
    let (level, said) = scrape_line(&answer);
    assert_eq!(level, "note", "{said}");
    assert!(said.contains("not scraped yet"), "{said}");

    let mut stream = tokio::net::TcpStream::connect(&admin)
        .await
        .expect("the admin port");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n")
        .await
        .expect("a scrape");
    let mut body = String::new();
    stream.read_to_string(&mut body).await.expect("its answer");
    assert!(body.starts_with("HTTP/1.0 200"), "{body}");
    let (_, answer) = world.check(&["--admin-address", &admin]).await;
    let (level, said) = scrape_line(&answer);
    assert_eq!(level, "ok", "{said}");
    assert!(said.contains("from 127.0.0.1"), "{said}");

    let nobody = format!("127.0.0.1:{}", support::free_port());
    let (_, answer) = world.check(&["--admin-address", &nobody]).await;
    let (level, said) = scrape_line(&answer);
    assert_eq!(level, "note", "{said}");
    assert!(said.contains("not asked"), "{said}");
}
