//! The shipped IAM policy grants exactly the AWS operations the adapter calls.

use std::collections::BTreeSet;

/// Operation names the adapter and the interruption queue report in their
/// errors: every SDK call they make is wrapped by `self.failed("<Operation>", ..)`
/// (which counts the failure and maps it with `aws_error`).
fn adapter_operations() -> BTreeSet<String> {
    // rustfmt may wrap the call: compare without whitespace.
    let source: String = [
        include_str!("../src/cloud/aws.rs"),
        include_str!("../src/cloud/aws/extras.rs"),
        include_str!("../src/cloud/aws/prices.rs"),
        include_str!("../src/cloud/sqs.rs"),
    ]
    .concat()
    .chars()
    .filter(|c| !c.is_whitespace())
    .collect();
    source
        .split(".failed(\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_string)
        .collect()
}

fn policy_actions() -> BTreeSet<String> {
    let text = include_str!("../manifests/iam-policy.json");
    let policy: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
    policy["Statement"]
        .as_array()
        .expect("statements")
        .iter()
        .flat_map(|s| s["Action"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

#[test]
fn policy_matches_the_adapter_calls() {
    let service = |op: &str| match op {
        "DescribeInstances" | "DescribeLaunchTemplates" | "DescribeSpotPriceHistory" => "ec2",
        "GetProducts" => "pricing",
        "ReceiveMessage" | "DeleteMessage" | "GetQueueAttributes" => "sqs",
        _ => "autoscaling",
    };
    let expected: BTreeSet<String> = adapter_operations()
        .iter()
        .map(|op| format!("{}:{op}", service(op)))
        .collect();
    assert!(
        expected.len() >= 5,
        "adapter operations found: {expected:?}"
    );
    assert_eq!(
        policy_actions(),
        expected,
        "manifests/iam-policy.json must grant exactly what the code calls"
    );
}

#[test]
fn mutating_actions_are_limited_to_the_clusters_tagged_resources() {
    let text = include_str!("../manifests/iam-policy.json");
    let policy: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
    for statement in policy["Statement"].as_array().expect("statements") {
        let actions: Vec<&str> = statement["Action"]
            .as_array()
            .expect("actions")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        if actions.iter().all(|a| a.starts_with("sqs:")) {
            // The queue's messages: one queue, named by its ARN.
            let resource = statement["Resource"].as_str().unwrap_or("*");
            assert!(
                resource.starts_with("arn:aws:sqs:") && !resource.contains('*'),
                "{actions:?} must name the interruption queue, not {resource}"
            );
            continue;
        }
        // Reads: Describe* and Get* (the Price List's GetProducts).
        let mutating = actions
            .iter()
            .any(|a| !(a.contains(":Describe") || a.contains(":Get")));
        if mutating {
            let tag = &statement["Condition"]["StringEquals"]["aws:ResourceTag/KubernetesCluster"];
            assert!(
                tag.is_string(),
                "{actions:?} must be conditioned on the cluster tag"
            );
        }
    }
}
