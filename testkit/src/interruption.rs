//! Interruptions the way AWS delivers them: an SQS queue in the world's moto
//! account, EventBridge-shaped notices put on it, and the instance
//! terminated a while after its warning (two minutes on AWS, seconds here).

use crate::world::World;
use chrono::{DateTime, Utc};
use std::time::Duration;

pub struct TestQueue {
    pub url: String,
    client: aws_sdk_sqs::Client,
}

impl World {
    /// A fresh queue in this world's moto account, messages invisible for 5 s
    /// after a receive.
    pub async fn queue(&self, name: &str) -> TestQueue {
        let config = aws_sdk_sqs::config::Builder::from(&self.aws_sdk)
            .interceptor(spot_node_manager::cloud::emulator::EmulatorAccount(
                self.account.clone(),
            ))
            .build();
        let client = aws_sdk_sqs::Client::from_conf(config);
        // A message received and not deleted comes back after 5 s (SQS's
        // default is 30 s): redeliveries within a test's patience.
        let out = client
            .create_queue()
            .queue_name(name)
            .attributes(
                aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
                "5",
            )
            .send()
            .await
            .expect("create queue");
        TestQueue {
            url: out.queue_url().expect("queue url").to_string(),
            client,
        }
    }
}

/// An EventBridge "EC2 Spot Instance Interruption Warning".
pub fn spot_warning(instance_id: &str, time: DateTime<Utc>) -> String {
    serde_json::json!({
        "version": "0",
        "id": format!("warning-{instance_id}"),
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": "ap-northeast-1",
        "resources": [format!("arn:aws:ec2:ap-northeast-1a:instance/{instance_id}")],
        "detail": {"instance-id": instance_id, "instance-action": "terminate"},
    })
    .to_string()
}

/// An EventBridge "EC2 Instance Rebalance Recommendation" for `instance_id`.
pub fn rebalance_recommendation(instance_id: &str, time: DateTime<Utc>) -> String {
    serde_json::json!({
        "version": "0",
        "id": format!("rebalance-{instance_id}"),
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": "ap-northeast-1",
        "resources": [format!("arn:aws:ec2:ap-northeast-1a:instance/{instance_id}")],
        "detail": {"instance-id": instance_id},
    })
    .to_string()
}

impl TestQueue {
    pub async fn send(&self, body: &str) {
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .send()
            .await
            .expect("send message");
    }

    /// Bodies received by one long poll of up to `wait_seconds`.
    pub async fn receive_waiting(&self, wait_seconds: i32) -> Vec<String> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .wait_time_seconds(wait_seconds)
            .send()
            .await
            .expect("receive");
        out.messages()
            .iter()
            .filter_map(|m| m.body().map(str::to_string))
            .collect()
    }

    /// Messages on the queue, visible or in flight.
    pub async fn remaining(&self) -> i64 {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(
                aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            )
            .send()
            .await
            .expect("queue attributes");
        out.attributes()
            .map(|a| {
                a.values()
                    .filter_map(|v| v.parse::<i64>().ok())
                    .sum::<i64>()
            })
            .unwrap_or(0)
    }
}

/// What AWS does to a spot instance it reclaims: the warning on the queue
/// now, the instance terminated `after` it.
pub async fn interrupt(world: &World, queue: &TestQueue, instance_id: &str, after: Duration) {
    queue.send(&spot_warning(instance_id, Utc::now())).await;
    tokio::time::sleep(after).await;
    world.lose_instance(instance_id).await;
}
