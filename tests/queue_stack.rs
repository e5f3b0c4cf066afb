//! The interruption queue we ship (`manifests/aws/interruption-queue.yaml`):
//! deployed through CloudFormation into the emulator, AWS-shaped events put
//! on EventBridge reach the manager through its rules, the queue keeps
//! notices past a restart and hands repeated failures to a dead-letter
//! queue; and its policy lets only this stack's rules, in this account, send.

use snm_testkit as support;

use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use spot_node_manager::k8s::interruption_record::record_of;
use support::assert_eventually;
use support::refresh::*;
use support::steady::*;

#[tokio::test]
async fn the_shipped_stack_delivers_aws_events_to_the_manager_and_keeps_failures() {
    let steady = SteadyGroup::workers("queue-stack")
        .interruption_queue_stack()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let retention: i64 = queue
        .attribute(A::MessageRetentionPeriod)
        .await
        .and_then(|v| v.parse().ok())
        .expect("retention");
    assert!(retention >= 3600, "outlasts a restart: {retention}");
    let redrive: serde_json::Value = serde_json::from_str(
        &queue
            .attribute(A::RedrivePolicy)
            .await
            .expect("a redrive policy"),
    )
    .expect("redrive JSON");
    assert!(
        redrive["deadLetterTargetArn"]
            .as_str()
            .is_some_and(|a| a.ends_with("example-com-interruptions-dlq")),
        "{redrive}"
    );
    assert_eq!(redrive["maxReceiveCount"].as_i64(), Some(10), "{redrive}");
    // A state change the rules filter out never reaches the queue; a spot
    // warning for one of our nodes does, and the manager marks the node.
    let victim = world.asg_snapshot(&kops.asgs).await[0].2[0].clone();
    world
        .put_event(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            serde_json::json!({"instance-id": victim, "state": "running"}),
        )
        .await;
    world
        .put_event(
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            serde_json::json!({"instance-id": victim, "instance-action": "terminate"}),
        )
        .await;
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = assert_eventually("the node marked through the rules", WAIT, || async {
        let list = nodes.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|n| {
            record_of(n).is_some_and(|r| r.instance_id == victim && r.kind == "spot_interruption")
        })
    })
    .await;
    let record = record_of(&node).expect("record");
    assert!(record.noticed <= Utc::now());
    let metrics = steady.manager.assert_metrics().await;
    // No state-change message came (its failures' series is exported at 0
    // from the start, for the alert).
    let state_changes = metrics
        .lines()
        .filter(|l| l.contains("kind=\"state_change\""))
        .filter(|l| !l.ends_with(" 0"));
    assert_eq!(state_changes.count(), 0, "{metrics}");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

/// The template's queue policy, read as CloudFormation would: the one Allow
/// names every rule of the stack as `aws:SourceArn` and this account as
/// `aws:SourceAccount` (the emulator does not enforce queue policies, so
/// this is read from the template).
#[test]
fn only_the_stacks_rules_in_this_account_may_send() {
    let text =
        std::fs::read_to_string(support::repo_root().join("manifests/aws/interruption-queue.yaml"))
            .expect("template");
    let template: serde_yaml::Value = serde_yaml::from_str(&text).expect("template YAML");
    let resources = template["Resources"].as_mapping().expect("Resources");
    let rules: Vec<String> = resources
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some("AWS::Events::Rule"))
        .map(|(name, _)| name.as_str().expect("name").to_string())
        .collect();
    assert_eq!(rules.len(), 5, "{rules:?}");
    let statements =
        template["Resources"]["QueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
            .as_sequence()
            .expect("statements");
    let allows: Vec<&serde_yaml::Value> = statements
        .iter()
        .filter(|s| s["Effect"].as_str() == Some("Allow"))
        .collect();
    assert_eq!(allows.len(), 1, "{allows:?}");
    let allow = allows[0];
    assert_eq!(
        allow["Principal"]["Service"].as_str(),
        Some("events.amazonaws.com")
    );
    let tag_value = |v: &serde_yaml::Value| match v {
        serde_yaml::Value::Tagged(t) => {
            format!("{} {}", t.tag, t.value.as_str().unwrap_or_default())
        }
        other => format!("{other:?}"),
    };
    let sources: Vec<String> = allow["Condition"]["ArnEquals"]["aws:SourceArn"]
        .as_sequence()
        .expect("aws:SourceArn")
        .iter()
        .map(tag_value)
        .collect();
    for rule in &rules {
        assert!(
            sources.contains(&format!("!GetAtt {rule}.Arn")),
            "{rule} missing from {sources:?}"
        );
    }
    assert_eq!(
        tag_value(&allow["Condition"]["StringEquals"]["aws:SourceAccount"]),
        "!Ref AWS::AccountId"
    );
}
