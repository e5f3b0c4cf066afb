//! `spot-node-manager iam-policy`: the shipped IAM policy
//! (`manifests/iam-policy.json`) with a cluster's own values filled in, so
//! nobody edits JSON by hand: the cluster tag the mutations are limited to,
//! and the interruption queue's ARN (partition, region, account, name).
//! Changed by structure (the statements by their Sid), not by text, so a
//! statement added to the shipped file is carried over as it is.

use serde_json::Value;

/// The policy the manager's role needs, as shipped (its example values:
/// cluster `example.com`, account 123456789012, `ap-northeast-1`).
pub const SHIPPED: &str = include_str!("../manifests/iam-policy.json");

const MUTATIONS_SID: &str = "MutateOnlyThisClustersGroups";
const QUEUE_SID: &str = "ReadOnlyThisClustersInterruptionQueue";
/// kops tags every resource of a cluster with this key, valued its name.
const CLUSTER_TAG_CONDITION: &str = "aws:ResourceTag/KubernetesCluster";

/// A cluster's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterValues {
    /// The kops cluster name (`KubernetesCluster` tag value).
    pub cluster: String,
    /// The 12-digit AWS account id.
    pub account: String,
    pub region: String,
    /// `aws`, or `aws-cn`, `aws-us-gov`.
    pub partition: String,
    /// The interruption queue's name; None: the one our stack makes for
    /// the cluster (`<cluster, dots as dashes>-interruptions`).
    pub queue: Option<String>,
}

impl ClusterValues {
    /// The queue the stack `manifests/aws/interruption-queue.yaml` makes:
    /// its QueueName is the cluster name with dots as dashes, then
    /// `-interruptions`.
    pub fn queue_name(&self) -> String {
        self.queue
            .clone()
            .unwrap_or_else(|| format!("{}-interruptions", self.cluster.replace('.', "-")))
    }

    fn check(&self) -> Result<(), String> {
        if self.cluster.trim().is_empty() {
            return Err("--cluster: the kops cluster name is empty".into());
        }
        if self.account.len() != 12 || !self.account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "--account: {:?} is not a 12-digit AWS account id",
                self.account
            ));
        }
        let part =
            |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !part(&self.region) {
            return Err(format!("--region: {:?} is not a region name", self.region));
        }
        if !part(&self.partition) {
            return Err(format!(
                "--partition: {:?} is not a partition",
                self.partition
            ));
        }
        let name = self.queue_name();
        let queue_ok = !name.is_empty()
            && name.len() <= 80
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !queue_ok {
            return Err(format!(
                "--queue-name: {name:?} is not an SQS queue name (1 to 80 letters, digits, - or _)"
            ));
        }
        Ok(())
    }
}

/// The shipped policy document with `values` filled in.
pub fn policy(values: &ClusterValues) -> Result<Value, String> {
    values.check()?;
    let mut policy: Value =
        serde_json::from_str(SHIPPED).map_err(|e| format!("the shipped policy: {e}"))?;
    let statements = policy["Statement"]
        .as_array_mut()
        .ok_or("the shipped policy has no Statement list")?;
    let mut filled = 0;
    for statement in statements.iter_mut() {
        match statement["Sid"].as_str() {
            Some(MUTATIONS_SID) => {
                statement["Condition"]["StringEquals"][CLUSTER_TAG_CONDITION] =
                    Value::String(values.cluster.clone());
                filled += 1;
            }
            Some(QUEUE_SID) => {
                statement["Resource"] = Value::String(format!(
                    "arn:{}:sqs:{}:{}:{}",
                    values.partition,
                    values.region,
                    values.account,
                    values.queue_name()
                ));
                filled += 1;
            }
            _ => {}
        }
    }
    if filled != 2 {
        return Err(format!(
            "the shipped policy lacks {MUTATIONS_SID} or {QUEUE_SID}"
        ));
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> ClusterValues {
        ClusterValues {
            cluster: "example.com".into(),
            account: "123456789012".into(),
            region: "ap-northeast-1".into(),
            partition: "aws".into(),
            queue: None,
        }
    }

    #[test]
    fn the_example_values_give_back_the_shipped_policy() {
        let shipped: Value = serde_json::from_str(SHIPPED).expect("JSON");
        assert_eq!(policy(&example()).expect("policy"), shipped);
    }

    #[test]
    fn a_clusters_values_change_only_the_cluster_tag_and_the_queue() {
        let values = ClusterValues {
            cluster: "prod.k8s.local".into(),
            account: "210987654321".into(),
            region: "eu-west-1".into(),
            partition: "aws".into(),
            queue: None,
        };
        let filled = policy(&values).expect("policy");
        let mut expected: Value = serde_json::from_str(SHIPPED).expect("JSON");
        for s in expected["Statement"].as_array_mut().expect("statements") {
            if s["Sid"] == MUTATIONS_SID {
                s["Condition"]["StringEquals"][CLUSTER_TAG_CONDITION] = "prod.k8s.local".into();
            }
            if s["Sid"] == QUEUE_SID {
                s["Resource"] =
                    "arn:aws:sqs:eu-west-1:210987654321:prod-k8s-local-interruptions".into();
            }
        }
        assert_eq!(filled, expected);
        // kops's own queue instead, in China.
        let kops_queue = ClusterValues {
            queue: Some("prod-k8s-local-nth".into()),
            partition: "aws-cn".into(),
            region: "cn-north-1".into(),
            ..values
        };
        let filled = policy(&kops_queue).expect("policy");
        let queue = filled["Statement"]
            .as_array()
            .expect("statements")
            .iter()
            .find(|s| s["Sid"] == QUEUE_SID)
            .expect("the queue statement");
        assert_eq!(
            queue["Resource"],
            "arn:aws-cn:sqs:cn-north-1:210987654321:prod-k8s-local-nth"
        );
    }

    #[test]
    fn values_that_cannot_be_in_an_arn_are_refused_by_name() {
        let refused = |change: &dyn Fn(&mut ClusterValues)| {
            let mut v = example();
            change(&mut v);
            policy(&v).expect_err("refused")
        };
        assert!(refused(&|v| v.account = "12345".into()).starts_with("--account"));
        assert!(refused(&|v| v.account = "12345678901a".into()).starts_with("--account"));
        assert!(refused(&|v| v.cluster = " ".into()).starts_with("--cluster"));
        assert!(refused(&|v| v.region = "eu west".into()).starts_with("--region"));
        assert!(refused(&|v| v.queue = Some("a:b".into())).starts_with("--queue-name"));
    }

    /// The default queue name is the one our stack makes (QueueName in
    /// manifests/aws/interruption-queue.yaml).
    #[test]
    fn the_default_queue_is_the_stacks() {
        let stack = include_str!("../manifests/aws/interruption-queue.yaml");
        assert!(
            stack.contains("- \"${Name}-interruptions\"")
                && stack.contains("- Name: !Join [\"-\", !Split [\".\", !Ref ClusterName]]"),
            "the stack names its queue otherwise: update queue_name"
        );
        assert_eq!(example().queue_name(), "example-com-interruptions");
    }
}
