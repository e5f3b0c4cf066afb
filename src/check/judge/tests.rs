use super::*;
use crate::controllers::group_view::tests::fresh;
use crate::controllers::inventory::autoscalers::Autoscaler;

fn workers(asgs: &[&str], desired: i32) -> NodeGroup {
    let spec = serde_json::json!({
        "role": "Worker",
        "autoScalingGroups": asgs.iter().map(|a| serde_json::json!({"name": a})).collect::<Vec<_>>(),
        "desired": desired,
    });
    let mut g = NodeGroup::new("workers", serde_json::from_value(spec).expect("spec"));
    g.metadata.namespace = Some("prod".into());
    g
}

fn asg(name: &str, desired: i32, max: i32) -> AsgDescription {
    let mut a = fresh(name, &[]);
    (a.desired, a.max) = (desired, max);
    a
}

fn aws_error(code: &str) -> Error {
    Error::Aws {
        operation: "DescribeInstances",
        resource: "1 instance(s)".into(),
        code: Some(code.into()),
        message: "You are not authorized to perform this operation.".into(),
    }
}

fn levels(findings: &[Finding]) -> Vec<Level> {
    findings.iter().map(|f| f.level).collect()
}

/// Every action of the shipped policy is either asked about or said to be
/// unaskable: a new action in the policy fails here until `check` knows it.
#[test]
fn every_action_of_the_shipped_policy_is_probed_or_said_to_be_unaskable() {
    let policy: serde_json::Value =
        serde_json::from_str(include_str!("../../../manifests/iam-policy.json")).expect("JSON");
    let granted: BTreeSet<String> = policy["Statement"]
        .as_array()
        .expect("statements")
        .iter()
        .flat_map(|s| s["Action"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    let known: BTreeSet<String> = PROBED
        .iter()
        .chain(&NOT_PROBED)
        .map(|a| a.to_string())
        .collect();
    assert_eq!(known, granted);
    assert!(PROBED.iter().all(|a| !NOT_PROBED.contains(a)));
    let note = not_probed();
    assert_eq!(note.level, Level::Note);
    assert!(
        NOT_PROBED.iter().all(|a| note.said.contains(a)),
        "{}",
        note.said
    );
}

/// EC2 answers an action IAM does not grant with `UnauthorizedOperation`
/// ("Troubleshooting API request errors", Unauthorized operation:
/// docs.aws.amazon.com/AWSEC2/latest/APIReference/query-api-troubleshooting.html);
/// the query services (Auto Scaling) with `AccessDenied`, the JSON ones
/// (the Price List) with `AccessDeniedException`, as the emulator's
/// refusals (scripts/moto_server.py `denied`) answer.
#[test]
fn a_refusal_by_iam_fails_and_says_what_to_grant() {
    assert_eq!(probe("ec2:DescribeInstances", &Ok(())).level, Level::Ok);
    for code in [
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
    ] {
        let f = probe::<()>("ec2:DescribeInstances", &Err(aws_error(code)));
        assert_eq!(f.level, Level::Fail, "{code}");
        assert_eq!(f.check, "aws ec2:DescribeInstances");
        assert!(
            f.said.starts_with(&format!("refused ({code}")),
            "{}",
            f.said
        );
        assert!(f.said.contains("manifests/iam-policy.json"), "{}", f.said);
    }
    // Not a refusal: AWS could not be asked at all.
    let f = probe::<()>("ec2:DescribeInstances", &Err(aws_error("Throttling")));
    assert_eq!(f.level, Level::Fail);
    assert!(f.said.starts_with("could not be asked"), "{}", f.said);
}

#[test]
fn a_missing_asg_fails_and_a_healthy_group_passes() {
    let g = workers(&["nodes-a.example.com", "nodes-b.example.com"], 2);
    let found = [asg("nodes-a.example.com", 1, 3)];
    let f = group(&g, &found, Others::default());
    assert_eq!(levels(&f), vec![Level::Fail]);
    assert_eq!(f[0].check, "group prod/workers");
    assert!(
        f[0].said
            .contains("not found in the manager's region: nodes-b.example.com"),
        "{}",
        f[0].said
    );
    let found = [
        asg("nodes-a.example.com", 1, 3),
        asg("nodes-b.example.com", 1, 3),
    ];
    let f = group(&g, &found, Others::default());
    assert_eq!(levels(&f), vec![Level::Ok], "{f:?}");
    assert!(passes(&f));
}

#[test]
fn no_room_above_the_count_and_a_competing_autoscaler_warn() {
    let g = workers(&["nodes-a.example.com"], 2);
    let found = [asg("nodes-a.example.com", 2, 2)];
    let autoscalers = [Autoscaler {
        deployment: "kube-system/cluster-autoscaler".into(),
        asgs: vec!["nodes-a.example.com".into()],
    }];
    let others = Others {
        autoscalers: &autoscalers,
        node_pools: &[],
    };
    let f = group(&g, &found, others);
    assert_eq!(levels(&f), vec![Level::Warn, Level::Warn], "{f:?}");
    assert!(f[0].said.contains("raise maxSize"), "{}", f[0].said);
    assert!(
        f[1].said
            .contains("cluster-autoscaler (Deployment kube-system/cluster-autoscaler)"),
        "{}",
        f[1].said
    );
    // Warnings do not block operation.
    assert!(passes(&f));
}

#[test]
fn another_termination_handler_warns_with_the_commands_that_delete_it() {
    assert_eq!(handlers(&[]).level, Level::Ok);
    let f = handlers(&["Deployment kube-system/aws-node-termination-handler (queue mode)".into()]);
    assert_eq!(f.level, Level::Warn);
    assert!(
        f.said.contains("kubectl -n kube-system delete deployment,daemonset,poddisruptionbudget,serviceaccount aws-node-termination-handler"),
        "{}",
        f.said
    );
}

#[test]
fn masters_without_control_plane_pods_are_named() {
    let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(control_plane(&set(&[]), &set(&[])).level, Level::Ok);
    assert_eq!(
        control_plane(&set(&["m1", "m2"]), &set(&["m1", "m2", "w"])).level,
        Level::Ok
    );
    let none = control_plane(&set(&["m1", "m2"]), &set(&[]));
    assert_eq!(none.level, Level::Warn);
    assert!(
        none.said.contains("by Node Ready plus masterSettleTime"),
        "{}",
        none.said
    );
    let one = control_plane(&set(&["m1", "m2"]), &set(&["m1"]));
    assert_eq!(one.level, Level::Warn);
    assert!(
        one.said.starts_with("master(s) m2 show none"),
        "{}",
        one.said
    );
}

#[test]
fn a_queue_that_cannot_be_read_or_fed_fails_and_none_warns() {
    let url = "https://sqs.ap-northeast-1.amazonaws.com/123456789012/example-com-interruptions";
    assert_eq!(queue(None, None).level, Level::Warn);
    let missing = aws_error("AWS.SimpleQueueService.NonExistentQueue");
    let f = queue(Some(url), Some(&Err(missing)));
    assert_eq!(f.level, Level::Fail);
    assert!(f.said.contains("cannot be read"), "{}", f.said);
    let f = queue(Some(url), Some(&Ok(None)));
    assert_eq!(f.level, Level::Fail);
    assert!(
        f.said.contains("lets no EventBridge rule send"),
        "{}",
        f.said
    );
    let policy = r#"{"Statement":[{"Effect":"Allow","Principal":{"Service":"events.amazonaws.com"},"Action":"sqs:SendMessage"}]}"#;
    assert_eq!(
        queue(Some(url), Some(&Ok(Some(policy.into())))).level,
        Level::Ok
    );
}

#[test]
fn the_text_is_one_line_per_finding_and_a_failure_fails_the_whole() {
    let findings = vec![
        Finding::new(Level::Ok, "kubernetes", "the apiserver answers"),
        Finding::new(Level::Fail, "aws ec2:DescribeInstances", "refused"),
    ];
    assert_eq!(
        text(&findings),
        "ok    kubernetes: the apiserver answers\nFAIL  aws ec2:DescribeInstances: refused\n"
    );
    assert!(!passes(&findings));
}

/// Issue 69 item 6: a namespace of one or two masters is said, with what
/// the manager refuses there and the setting that allows it; three are not.
#[test]
fn one_or_two_masters_are_a_note_naming_the_setting() {
    let masters = |name: &str, desired: i32, allow: bool| {
        let mut g = workers(&["m"], desired);
        g.spec.role = crate::crd::Role::Master;
        g.metadata.name = Some(name.into());
        g.spec.disruption.allow_control_plane_outage = allow;
        g
    };
    let one = masters("masters", 1, false);
    let said = super::masters(std::slice::from_ref(&one));
    assert_eq!(levels(&said), [Level::Note]);
    assert_eq!(said[0].check, "masters prod");
    assert!(
        said[0].said.contains("1 master(s)") && said[0].said.contains("allowControlPlaneOutage"),
        "{}",
        said[0].said
    );
    let allowed = super::masters(&[masters("masters", 1, true)]);
    assert!(
        allowed[0].said.contains("API is down while"),
        "{}",
        allowed[0].said
    );
    // Two groups of one: both must allow it.
    let half = super::masters(&[masters("a", 1, true), masters("b", 1, false)]);
    assert!(
        half[0].said.contains("no master is refreshed"),
        "{}",
        half[0].said
    );
    assert!(super::masters(&[masters("masters", 3, false), workers(&["w"], 1)]).is_empty());
}

/// Issue 69 item 7, the scrape: seen recently is ok; none for ten of the
/// ServiceMonitor's intervals, or none since the replica started that long
/// ago, is a warning naming what blocks it; a young replica is asked again
/// later; no manager answering (check run elsewhere) is said, not judged.
#[test]
fn the_scrape_is_judged_by_when_prometheus_last_came() {
    use crate::admin::{Scrape, Scrapes};
    let now = chrono::Utc::now();
    let minutes = chrono::Duration::minutes;
    let served = |since: i64, last: Option<i64>| {
        Ok(Scrapes {
            serving_since: now - minutes(since),
            last_scrape: last.map(|m| Scrape {
                at: now - minutes(m),
                from: "10.0.3.7".into(),
            }),
        })
    };
    let judged = |answer| super::scrape("127.0.0.1:8080", answer, now);
    let ok = judged(served(60, Some(1)));
    assert_eq!((ok.level, ok.check.as_str()), (Level::Ok, "scrape"));
    assert!(ok.said.contains("10.0.3.7"), "{}", ok.said);
    for (since, last) in [(60, Some(20)), (60, None)] {
        let warned = judged(served(since, last));
        assert_eq!(warned.level, Level::Warn, "{last:?}");
        assert!(
            warned.said.contains("NetworkPolicy") && warned.said.contains("ServiceMonitor"),
            "{}",
            warned.said
        );
    }
    let young = judged(served(2, None));
    assert_eq!(young.level, Level::Note);
    assert!(young.said.contains("again"), "{}", young.said);
    let elsewhere = judged(Err("connection refused".into()));
    assert_eq!(elsewhere.level, Level::Note);
    assert!(
        elsewhere.said.contains("manager's pod"),
        "{}",
        elsewhere.said
    );
}
