//! What the inventory describes of an ASG at most once an hour, beside its
//! description: its terminate lifecycle hooks and its warm pool.

use super::AwsCloud;
use crate::Result;
use crate::cloud::{LifecycleHook, TERMINATING, WarmPool};

impl AwsCloud {
    pub(super) async fn describe_terminate_hooks(&self, asg: &str) -> Result<Vec<LifecycleHook>> {
        self.count("DescribeLifecycleHooks");
        let out = self
            .clients
            .autoscaling
            .describe_lifecycle_hooks()
            .auto_scaling_group_name(asg)
            .send()
            .await
            .map_err(self.failed("DescribeLifecycleHooks", asg.to_string()))?;
        Ok(out
            .lifecycle_hooks()
            .iter()
            .filter(|h| h.lifecycle_transition() == Some(TERMINATING))
            .map(|h| LifecycleHook {
                name: h.lifecycle_hook_name().unwrap_or_default().to_string(),
                heartbeat_timeout: h
                    .heartbeat_timeout()
                    .map(|s| std::time::Duration::from_secs(s.max(0) as u64)),
                default_result: h.default_result().map(str::to_string),
                notification_target: h
                    .notification_target_arn()
                    .filter(|t| !t.is_empty())
                    .map(str::to_string),
            })
            .collect())
    }

    pub(super) async fn describe_warm_pool(&self, asg: &str) -> Result<Option<WarmPool>> {
        self.count("DescribeWarmPool");
        let out = self
            .clients
            .autoscaling
            .describe_warm_pool()
            .auto_scaling_group_name(asg)
            .send()
            .await
            .map_err(self.failed("DescribeWarmPool", asg.to_string()))?;
        Ok(out.warm_pool_configuration().map(|c| WarmPool {
            min_size: c.min_size().unwrap_or(0),
            max_prepared: c.max_group_prepared_capacity(),
            state: c
                .pool_state()
                .map_or("Stopped".to_string(), |s| s.as_str().to_string()),
            instances: out.instances().len(),
        }))
    }
}
