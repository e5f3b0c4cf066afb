//! The SQS queue the interruption notices arrive on: long polling (20 s, 10 messages) and
//! deletion. Every request is counted in `aws_calls_total`.

use crate::cloud::aws::aws_error;
use crate::metrics::Metrics;
use crate::mutation::{Applied, Intent, Mutations};
use crate::{Error, Result};
use aws_config::SdkConfig;
use std::sync::Arc;

/// One message as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub receipt: String,
    pub body: String,
    pub message_id: Option<String>,
}

pub struct Queue {
    client: aws_sdk_sqs::Client,
    url: String,
    metrics: Arc<Metrics>,
}

/// The queue's region, from its URL (`https://sqs.<region>.amazonaws.com/...`
/// or the legacy `https://<region>.queue.amazonaws.com/...`); None for other
/// endpoints (an emulator), which use the configured region.
pub fn region_of(url: &str) -> Option<String> {
    let host = url.split("://").nth(1)?.split('/').next()?;
    let parts: Vec<&str> = host.split('.').collect();
    match parts.as_slice() {
        ["sqs", region, "amazonaws", ..] => Some(region.to_string()),
        [region, "queue", "amazonaws", ..] => Some(region.to_string()),
        _ => None,
    }
}

impl Queue {
    pub fn new(
        sdk: &SdkConfig,
        url: &str,
        emulator_account: Option<&str>,
        metrics: Arc<Metrics>,
    ) -> Queue {
        let mut config = aws_sdk_sqs::config::Builder::from(sdk);
        if let Some(region) = region_of(url) {
            config = config.region(aws_config::Region::new(region));
        }
        // AWS's own variable for SQS's endpoint (a VPC endpoint, or an
        // emulator of its own), which the SDK ignores once `aws.endpoint`
        // sets one in code: honoured here over it.
        if let Some(endpoint) = std::env::var("AWS_ENDPOINT_URL_SQS")
            .ok()
            .filter(|e| !e.trim().is_empty())
        {
            config = config.endpoint_url(endpoint);
        }
        #[cfg(feature = "test-support")]
        if let Some(account) = emulator_account {
            config =
                config.interceptor(crate::cloud::emulator::EmulatorAccount(account.to_string()));
        }
        #[cfg(not(feature = "test-support"))]
        let _ = emulator_account;
        Queue {
            client: aws_sdk_sqs::Client::from_conf(config.build()),
            url: url.to_string(),
            metrics,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Maps a failed request to our error, counting it.
    fn failed<E>(&self, operation: &'static str) -> impl FnOnce(E) -> Error + '_
    where
        E: aws_sdk_sqs::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        let to_error = aws_error(operation, self.url.clone());
        move |err| {
            let error = to_error(err);
            if let Error::Aws { code, .. } = &error {
                self.metrics.aws_call_failed(operation, code.as_deref());
            }
            error
        }
    }

    /// Up to 10 messages, waiting up to 20 s for the first.
    pub async fn receive(&self) -> Result<Vec<Received>> {
        self.receive_waiting(20).await
    }

    /// Up to 10 messages, waiting up to `wait_seconds` (0 to 20) for the
    /// first.
    pub async fn receive_waiting(&self, wait_seconds: i32) -> Result<Vec<Received>> {
        self.metrics.aws_call("ReceiveMessage");
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait_seconds.clamp(0, 20))
            .send()
            .await
            .map_err(self.failed("ReceiveMessage"))?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                Some(Received {
                    receipt: m.receipt_handle()?.to_string(),
                    body: m.body().unwrap_or_default().to_string(),
                    message_id: m.message_id().map(str::to_string),
                })
            })
            .collect())
    }

    /// The queue's access policy (a read, for `check`): None when it has
    /// none. Err when the queue does not exist or cannot be read.
    pub async fn policy(&self) -> Result<Option<String>> {
        use aws_sdk_sqs::types::QueueAttributeName;
        self.metrics.aws_call("GetQueueAttributes");
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::Policy)
            .send()
            .await
            .map_err(self.failed("GetQueueAttributes"))?;
        Ok(out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::Policy))
            .cloned())
    }

    /// Deletes a handled message, through the mutation gate: not while
    /// another replica leads, and not under dry-run (a dry-run manager must
    /// not take messages from the handler that acts on them).
    pub async fn delete(&self, mutations: &Mutations, receipt: &str) -> Result<()> {
        let applied = mutations
            .perform(
                Intent::aws("delete_message", self.url.clone(), "handled"),
                || async {
                    self.metrics.aws_call("DeleteMessage");
                    self.client
                        .delete_message()
                        .queue_url(&self.url)
                        .receipt_handle(receipt)
                        .send()
                        .await
                        .map_err(self.failed("DeleteMessage"))
                },
            )
            .await?;
        if let Applied::DryRun = applied {
            tracing::info!(queue = %self.url, "dry-run: message left on the queue");
        }
        Ok(())
    }
}

/// Pure: whether a queue's access policy lets EventBridge rules send to
/// it: an Allow statement whose principal's services include
/// `events.amazonaws.com` and whose actions include `sqs:SendMessage` (as
/// kops's queue and ours say). Without one, no spot warning arrives.
pub fn lets_eventbridge_send(policy: Option<&str>) -> bool {
    let Some(policy) = policy.and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
    else {
        return false;
    };
    // A field is a string or a list of strings.
    let has = |v: &serde_json::Value, wanted: &dyn Fn(&str) -> bool| match v {
        serde_json::Value::String(s) => wanted(s),
        serde_json::Value::Array(a) => a.iter().filter_map(|v| v.as_str()).any(wanted),
        _ => false,
    };
    let statements = match &policy["Statement"] {
        serde_json::Value::Array(a) => a.clone(),
        one => vec![one.clone()],
    };
    statements.iter().any(|s| {
        s["Effect"] == "Allow"
            && has(&s["Principal"]["Service"], &|p| p == "events.amazonaws.com")
            && has(&s["Action"], &|a| {
                matches!(a, "sqs:SendMessage" | "sqs:*" | "*")
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kops's own queue (pkg/model/awsmodel/nodeterminationhandler.go at
    /// kops 268927e2: Service events.amazonaws.com and sqs.amazonaws.com,
    /// Action sqs:SendMessage) and ours (manifests/aws/interruption-queue.yaml).
    #[test]
    fn a_queue_policy_lets_eventbridge_send_as_kops_and_our_stack_write_it() {
        let kops = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":["events.amazonaws.com","sqs.amazonaws.com"]},"Action":"sqs:SendMessage","Resource":"arn:aws:sqs:ap-northeast-1:123456789012:example-com-nth"}]}"#;
        assert!(lets_eventbridge_send(Some(kops)));
        let ours = r#"{"Version":"2012-10-17","Statement":{"Sid":"EventBridgeRulesSend","Effect":"Allow","Principal":{"Service":"events.amazonaws.com"},"Action":["sqs:SendMessage"],"Resource":"arn"}}"#;
        assert!(lets_eventbridge_send(Some(ours)));
        let others = r#"{"Statement":[{"Effect":"Allow","Principal":{"AWS":"arn:aws:iam::123456789012:root"},"Action":"sqs:*"},{"Effect":"Deny","Principal":{"Service":"events.amazonaws.com"},"Action":"sqs:SendMessage"}]}"#;
        assert!(!lets_eventbridge_send(Some(others)));
        assert!(!lets_eventbridge_send(None));
        assert!(!lets_eventbridge_send(Some("not json")));
    }

    #[test]
    fn the_region_comes_from_an_aws_queue_url() {
        assert_eq!(
            region_of("https://sqs.ap-northeast-1.amazonaws.com/123456789012/q").as_deref(),
            Some("ap-northeast-1")
        );
        assert_eq!(
            region_of("https://eu-west-1.queue.amazonaws.com/123456789012/q").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(region_of("http://127.0.0.1:5000/123456789012/q"), None);
    }
}
