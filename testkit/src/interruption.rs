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

impl TestQueue {
    /// Sets the queue's access policy (a JSON document).
    pub async fn set_policy(&self, policy: &str) {
        self.client
            .set_queue_attributes()
            .queue_url(&self.url)
            .attributes(aws_sdk_sqs::types::QueueAttributeName::Policy, policy)
            .send()
            .await
            .expect("set the queue's policy");
    }
}

impl World {
    /// A fresh queue in this world's moto account, messages invisible for 5 s
    /// after a receive.
    pub async fn queue(&self, name: &str) -> TestQueue {
        Self::create_queue(self.queue_client(), name).await
    }

    async fn create_queue(client: aws_sdk_sqs::Client, name: &str) -> TestQueue {
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

/// A second emulator of its own (the same rude wrapper, nothing in it but
/// what a test puts there), so that SQS does not share the main emulator's
/// one lock with Auto Scaling, EC2 and the simulated kubelet: what a burst
/// of notices meets on AWS, where SQS is a service of its own. Stopped on
/// drop.
pub struct SeparateSqs {
    pub endpoint: String,
    child: std::process::Child,
}

impl SeparateSqs {
    pub async fn start() -> SeparateSqs {
        let root = crate::repo_root();
        let python = std::process::Command::new(root.join("scripts/install-moto"))
            .output()
            .expect("scripts/install-moto");
        let python = String::from_utf8_lossy(&python.stdout).trim().to_string();
        let port = crate::free_port();
        let child = std::process::Command::new(python)
            .arg(root.join("scripts/moto_server.py"))
            .args(["--port", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start a second moto");
        let endpoint = format!("http://127.0.0.1:{port}");
        crate::assert_eventually("the second moto up", Duration::from_secs(60), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        SeparateSqs { endpoint, child }
    }
}

impl Drop for SeparateSqs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl World {
    /// A queue named `name` on another SQS endpoint (a [`SeparateSqs`]),
    /// in this world's account.
    pub async fn queue_on(&self, endpoint: &str, name: &str) -> TestQueue {
        let config = aws_sdk_sqs::config::Builder::from(&self.aws_sdk)
            .endpoint_url(endpoint)
            .interceptor(spot_node_manager::cloud::emulator::EmulatorAccount(
                self.account.clone(),
            ))
            .build();
        let client = aws_sdk_sqs::Client::from_conf(config);
        Self::create_queue(client, name).await
    }

    /// Deploys the queue we ship (`manifests/aws/interruption-queue.yaml`)
    /// into this world's moto account through CloudFormation, for cluster
    /// `cluster`; returns its queue once the stack is complete.
    pub async fn queue_stack(&self, cluster: &str) -> TestQueue {
        let template = std::fs::read_to_string(
            crate::repo_root().join("manifests/aws/interruption-queue.yaml"),
        )
        .expect("read the queue template");
        let config = aws_sdk_cloudformation::config::Builder::from(&self.aws_sdk)
            .interceptor(spot_node_manager::cloud::emulator::EmulatorAccount(
                self.account.clone(),
            ))
            .build();
        let cfn = aws_sdk_cloudformation::Client::from_conf(config);
        cfn.create_stack()
            .stack_name("interruption-queue")
            .template_body(template)
            .parameters(
                aws_sdk_cloudformation::types::Parameter::builder()
                    .parameter_key("ClusterName")
                    .parameter_value(cluster)
                    .build(),
            )
            .send()
            .await
            .expect("create the queue stack");
        let status = crate::assert_eventually(
            "the queue stack created",
            Duration::from_secs(60),
            || async {
                let out = cfn
                    .describe_stacks()
                    .stack_name("interruption-queue")
                    .send()
                    .await
                    .ok()?;
                let stack = out.stacks().first()?;
                let status = stack.stack_status()?.as_str().to_string();
                (!status.ends_with("IN_PROGRESS")).then_some(status)
            },
        )
        .await;
        assert_eq!(status, "CREATE_COMPLETE");
        let name = format!("{}-interruptions", cluster.replace('.', "-"));
        let queue = self.queue_client();
        let url = queue
            .get_queue_url()
            .queue_name(&name)
            .send()
            .await
            .expect("the stack's queue")
            .queue_url()
            .expect("queue url")
            .to_string();
        TestQueue { url, client: queue }
    }

    /// An event put on this world's default EventBridge bus, as AWS would
    /// emit it (EventBridge's rules route it).
    pub async fn put_event(&self, source: &str, detail_type: &str, detail: serde_json::Value) {
        let config = aws_sdk_eventbridge::config::Builder::from(&self.aws_sdk)
            .interceptor(spot_node_manager::cloud::emulator::EmulatorAccount(
                self.account.clone(),
            ))
            .build();
        let out = aws_sdk_eventbridge::Client::from_conf(config)
            .put_events()
            .entries(
                aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                    .source(source)
                    .detail_type(detail_type)
                    .detail(detail.to_string())
                    .build(),
            )
            .send()
            .await
            .expect("put event");
        assert_eq!(out.failed_entry_count(), 0, "{out:?}");
    }

    fn queue_client(&self) -> aws_sdk_sqs::Client {
        let config = aws_sdk_sqs::config::Builder::from(&self.aws_sdk)
            .interceptor(spot_node_manager::cloud::emulator::EmulatorAccount(
                self.account.clone(),
            ))
            .build();
        aws_sdk_sqs::Client::from_conf(config)
    }
}

impl TestQueue {
    /// One attribute of the queue (e.g. `RedrivePolicy`).
    pub async fn attribute(&self, name: aws_sdk_sqs::types::QueueAttributeName) -> Option<String> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(name.clone())
            .send()
            .await
            .expect("queue attributes");
        out.attributes().and_then(|a| a.get(&name).cloned())
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

/// An AWS Health scheduled change for EC2 naming every instance in `ids`
/// (a retirement, say), one message for all of them.
pub fn scheduled_change(ids: &[String], time: DateTime<Utc>) -> String {
    scheduled_event(
        ids,
        "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        time,
        time + chrono::Duration::days(2),
    )
}

/// An AWS Health scheduled change of kind `code` (e.g.
/// `AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED`, `AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED`)
/// emitted at `time` for a change starting at `start`, written as AWS writes
/// it (RFC 2822, "GMT").
pub fn scheduled_event(
    ids: &[String],
    code: &str,
    time: DateTime<Utc>,
    start: DateTime<Utc>,
) -> String {
    serde_json::json!({
        "version": "0",
        "id": format!("health-{}", ids.join("-")),
        "detail-type": "AWS Health Event",
        "source": "aws.health",
        "account": "123456789012",
        "time": time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": "ap-northeast-1",
        "resources": ids,
        "detail": {
            "eventArn": format!("arn:aws:health:ap-northeast-1::event/EC2/{code}/x"),
            "service": "EC2",
            "eventTypeCode": code,
            "eventTypeCategory": "scheduledChange",
            "startTime": start.format("%a, %d %b %Y %H:%M:%S GMT").to_string(),
            "affectedEntities": ids.iter().map(|id| serde_json::json!({"entityValue": id})).collect::<Vec<_>>(),
        },
    })
    .to_string()
}

/// An EventBridge "EC2 Instance State-change Notification".
pub fn state_change(instance_id: &str, state: &str, time: DateTime<Utc>) -> String {
    serde_json::json!({
        "version": "0",
        "id": format!("state-{instance_id}-{state}"),
        "detail-type": "EC2 Instance State-change Notification",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": "ap-northeast-1",
        "resources": [format!("arn:aws:ec2:ap-northeast-1a:instance/{instance_id}")],
        "detail": {"instance-id": instance_id, "state": state},
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

    /// Up to 10 messages in one call (SendMessageBatch): a burst put on
    /// the queue without loading the emulator with one request per notice
    /// (on AWS the sender is EventBridge, not the SQS we measure).
    pub async fn send_batch(&self, bodies: &[String]) {
        let entries: Vec<aws_sdk_sqs::types::SendMessageBatchRequestEntry> = bodies
            .iter()
            .enumerate()
            .map(|(i, body)| {
                aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                    .id(format!("m{i}"))
                    .message_body(body)
                    .build()
                    .expect("batch entry")
            })
            .collect();
        let out = self
            .client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .expect("send message batch");
        assert!(out.failed().is_empty(), "{:?}", out.failed());
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

impl TestQueue {
    /// The queue's ARN (its name is the URL's last segment).
    pub fn arn(&self, world: &World) -> String {
        let name = self.url.rsplit('/').next().unwrap_or_default();
        let region = world
            .aws_sdk
            .region()
            .map(|r| r.to_string())
            .unwrap_or_else(|| "us-east-1".into());
        format!("arn:aws:sqs:{region}:{}:{name}", world.account)
    }
}

impl World {
    /// A terminate lifecycle hook on `asg` (CONTINUE by default), notifying
    /// `queue` directly as an ASG does: what kops creates when its own
    /// termination handler runs in queue mode.
    pub async fn terminate_hook(
        &self,
        asg: &str,
        hook: &str,
        queue: &TestQueue,
        heartbeat_timeout: i32,
    ) {
        self.aws
            .autoscaling
            .put_lifecycle_hook()
            .auto_scaling_group_name(asg)
            .lifecycle_hook_name(hook)
            .lifecycle_transition("autoscaling:EC2_INSTANCE_TERMINATING")
            .heartbeat_timeout(heartbeat_timeout)
            .default_result("CONTINUE")
            .notification_target_arn(queue.arn(self))
            .role_arn(format!(
                "arn:aws:iam::{}:role/asg-notifications",
                self.account
            ))
            .send()
            .await
            .expect("put lifecycle hook");
    }
}

impl World {
    /// The lifecycle state of `instance_id` in `asg` (None once it left).
    pub async fn lifecycle_state(&self, asg: &str, instance_id: &str) -> Option<String> {
        self.asg_members(asg)
            .await
            .into_iter()
            .find(|(id, _)| id == instance_id)
            .map(|(_, state)| state)
    }

    /// What an operator does to replace an instance: terminate it through
    /// its ASG, which launches another in its place.
    pub async fn terminate_through_asg(&self, instance_id: &str) {
        self.aws
            .autoscaling
            .terminate_instance_in_auto_scaling_group()
            .instance_id(instance_id)
            .should_decrement_desired_capacity(false)
            .send()
            .await
            .expect("terminate through the ASG");
    }

    /// Stops an instance through EC2 (a user, or AWS for a stop-interruption).
    pub async fn stop_instance(&self, instance_id: &str) {
        self.aws
            .ec2
            .stop_instances()
            .instance_ids(instance_id)
            .send()
            .await
            .expect("stop instance");
    }
}
