//! The AWS layer: a small trait owned by the project with exactly the
//! operations the controllers need ([`Cloud`]), the real adapter over the SDK
//! ([`aws::AwsCloud`]) and an in-memory fake ([`fake::FakeCloud`]).
//!
//! Mutations here are not guarded: controllers call them only through the
//! mutation gate (`crate::mutation`), after checking what they may touch.

pub mod aws;
pub mod fake;

use crate::Result;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::AwsSettings;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_ec2::error::BoxError;

/// An Auto Scaling Group as the controllers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsgDescription {
    pub name: String,
    pub desired: i32,
    pub min: i32,
    pub max: i32,
    pub instances: Vec<AsgInstance>,
    /// Launch template name (plain or from the MixedInstancesPolicy).
    pub launch_template: Option<String>,
    pub tags: BTreeMap<String, String>,
    /// The latest scaling activity's failure, when it failed recently.
    pub recent_failure: Option<String>,
}

impl AsgDescription {
    /// Instances that count towards capacity (not leaving the group).
    pub fn active_instances(&self) -> usize {
        self.instances.iter().filter(|i| i.is_active()).count()
    }

    /// Why the ASG is not launching what it is asked to, if it is not: its
    /// latest scaling activity failed, or it has fewer instances than desired.
    pub fn launch_problem(&self) -> Option<String> {
        let active = self.active_instances() as i32;
        match (&self.recent_failure, active < self.desired) {
            (Some(failure), _) => Some(format!("latest scaling activity failed: {failure}")),
            (None, true) => Some(format!("desired {} but {active} instance(s)", self.desired)),
            (None, false) => None,
        }
    }
}

impl AsgInstance {
    /// Counts towards capacity: not terminating or detaching.
    pub fn is_active(&self) -> bool {
        !self.lifecycle_state.starts_with("Terminat") && !self.lifecycle_state.starts_with("Detach")
    }
}

impl From<&AsgDescription> for crate::crd::nodegroup::AutoScalingGroupStatus {
    fn from(asg: &AsgDescription) -> Self {
        let reason = asg.launch_problem();
        Self {
            name: asg.name.clone(),
            desired: asg.desired,
            min: asg.min,
            max: asg.max,
            instances: asg.active_instances() as i32,
            launching: reason.is_none(),
            reason,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsgInstance {
    pub instance_id: String,
    pub availability_zone: Option<String>,
    pub instance_type: Option<String>,
    /// e.g. InService, Pending, Terminating.
    pub lifecycle_state: String,
    /// Healthy or Unhealthy.
    pub health_status: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Spot,
    OnDemand,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Spot => "spot",
            Lifecycle::OnDemand => "on-demand",
        }
    }
}

/// An EC2 instance as the controllers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceDescription {
    pub instance_id: String,
    pub launch_time: Option<DateTime<Utc>>,
    pub availability_zone: Option<String>,
    pub instance_type: Option<String>,
    pub lifecycle: Lifecycle,
    /// e.g. pending, running, terminated.
    pub state: String,
    pub private_dns_name: Option<String>,
    pub tags: BTreeMap<String, String>,
}

/// The operations the controllers need, nothing more.
#[async_trait::async_trait]
pub trait Cloud: Send + Sync {
    /// The named ASGs that exist (missing names are simply absent), in one
    /// batched, paginated call.
    async fn describe_groups(&self, names: &[String]) -> Result<Vec<AsgDescription>>;
    /// The given instances that exist, described in pages of ids.
    async fn describe_instances(&self, ids: &[String]) -> Result<Vec<InstanceDescription>>;
    async fn set_desired_capacity(&self, asg: &str, desired: i32) -> Result<()>;
    /// Detaches instances from their ASG (they keep running).
    async fn detach_instances(&self, asg: &str, ids: &[String], decrement: bool) -> Result<()>;
    /// Terminates one instance through its ASG.
    async fn terminate_in_group(&self, instance_id: &str, decrement: bool) -> Result<()>;
    /// Terminates instances (e.g. after detaching them).
    async fn terminate_instances(&self, ids: &[String]) -> Result<()>;
}

/// Gives the [`Cloud`] for a region (groups may name their own region).
pub trait CloudProvider: Send + Sync {
    fn cloud(&self, region: Option<&str>) -> Arc<dyn Cloud>;
}

/// Header moto uses to keep separate state per account.
pub const EMULATOR_ACCOUNT_HEADER: &str = "x-moto-account-id";

#[derive(Clone, Debug)]
pub struct AwsClients {
    pub autoscaling: aws_sdk_autoscaling::Client,
    pub ec2: aws_sdk_ec2::Client,
}

/// Loads the SDK configuration: the standard chain (env, profile, IRSA web
/// identity, instance metadata) with our region and endpoint overrides.
pub async fn load_sdk_config(settings: &AwsSettings) -> SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if let Some(region) = &settings.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint.clone());
    }
    loader.load().await
}

impl AwsClients {
    pub fn new(sdk: &SdkConfig, emulator_account: Option<&str>) -> Self {
        let mut asg = aws_sdk_autoscaling::config::Builder::from(sdk);
        let mut ec2 = aws_sdk_ec2::config::Builder::from(sdk);
        if let Some(account) = emulator_account {
            asg = asg.interceptor(EmulatorAccount(account.to_string()));
            ec2 = ec2.interceptor(EmulatorAccount(account.to_string()));
        }
        Self {
            autoscaling: aws_sdk_autoscaling::Client::from_conf(asg.build()),
            ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
        }
    }
}

/// Adds the emulator's account header to every request.
#[derive(Debug, Clone)]
pub struct EmulatorAccount(pub String);

impl Intercept for EmulatorAccount {
    fn name(&self) -> &'static str {
        "EmulatorAccount"
    }

    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        context
            .request_mut()
            .headers_mut()
            .insert(EMULATOR_ACCOUNT_HEADER, self.0.clone());
        Ok(())
    }
}
