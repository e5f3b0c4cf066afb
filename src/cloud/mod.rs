//! The AWS layer: a small trait owned by the project with exactly the
//! operations the controllers need ([`Cloud`]), the real adapter over the SDK
//! ([`aws::AwsCloud`]); for tests only (feature `test-support`), an in-memory
//! fake (`fake`) and the emulator's account header (`emulator`).
//!
//! Mutations here are not guarded: controllers call them only through the
//! mutation gate (`crate::mutation`), after checking what they may touch.

pub mod aws;
pub mod cache;
#[cfg(feature = "test-support")]
pub mod emulator;
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
pub mod leader_fence;
pub mod prices;
pub mod sqs;

use crate::Result;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::AwsSettings;
use aws_config::{BehaviorVersion, SdkConfig};

/// An Auto Scaling Group as the controllers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsgDescription {
    pub name: String,
    pub desired: i32,
    pub min: i32,
    pub max: i32,
    pub instances: Vec<AsgInstance>,
    /// What it launches new instances from now: its launch template (plain
    /// or in its MixedInstancesPolicy) or launch configuration.
    pub launches_from: Option<LaunchSource>,
    pub tags: BTreeMap<String, String>,
    /// The newest launch activity's failure message, when that activity
    /// failed. Filled by [`cache::CachedCloud`], only for an ASG below its
    /// desired count (a plain `describe_groups` leaves it None).
    pub recent_failure: Option<String>,
    /// Suspended scaling processes (Launch, Terminate, HealthCheck, ...).
    pub suspended_processes: Vec<String>,
    /// Capacity Rebalancing on: AWS replaces an instance with a rebalance
    /// recommendation by itself, and terminates it without our drain.
    pub capacity_rebalance: bool,
    /// The ASG's maximum instance lifetime (seconds), when set: AWS
    /// replaces older instances by itself, without our drain.
    pub max_instance_lifetime: Option<i32>,
    /// The zones it launches in (kops's ASGs have one each).
    pub zones: Vec<String>,
}

/// How long an ASG may sit below its desired count, its launch in flight
/// (AWS starts a launch some seconds after it is asked for, and the instance
/// is Pending for a while), before it counts as short. A failed launch
/// activity makes it short at once.
pub const LAUNCH_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// The scaling processes without which an ASG cannot do what we ask of it.
pub const LAUNCH: &str = "Launch";
pub const TERMINATE: &str = "Terminate";

impl AsgDescription {
    /// Instances that count as capacity (InService or Pending).
    pub fn active_instances(&self) -> usize {
        self.instances.iter().filter(|i| i.is_active()).count()
    }

    /// Instances still Pending (launched, not yet InService).
    pub fn pending_instances(&self) -> usize {
        self.instances.iter().filter(|i| i.is_pending()).count()
    }

    pub fn is_suspended(&self, process: &str) -> bool {
        self.suspended_processes.iter().any(|p| p == process)
    }
}

impl AsgInstance {
    /// Counts as capacity, as AWS counts it: InService or Pending. Not
    /// Standby, terminating, detaching, or warm-pool states.
    pub fn is_active(&self) -> bool {
        self.lifecycle_state == "InService" || self.is_pending()
    }

    pub fn is_pending(&self) -> bool {
        self.lifecycle_state.starts_with("Pending")
    }

    /// Launched and in service: AWS is done with it (a Pending instance may
    /// still be abandoned by a lifecycle hook).
    pub fn is_in_service(&self) -> bool {
        self.lifecycle_state == "InService"
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
    /// What it was launched from, at the version it was launched with.
    pub launched_from: Option<LaunchSource>,
}

/// A launch template at a version, or a launch configuration: what an ASG
/// launches from, or what one of its instances was launched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchSource {
    Template {
        id: Option<String>,
        name: Option<String>,
        /// A number, `$Latest` or `$Default` (None: `$Default`, as AWS
        /// reads an ASG's template without a version). An instance's is
        /// always the number it was launched from.
        version: Option<String>,
    },
    Configuration(String),
}

impl LaunchSource {
    /// A template whose version names no number: it must be resolved
    /// through DescribeLaunchTemplates.
    pub fn symbolic_template(&self) -> Option<TemplateKey> {
        match self {
            LaunchSource::Template { id, name, version } => {
                let numbered = version.as_deref().is_some_and(|v| v.parse::<i64>().is_ok());
                if numbered {
                    return None;
                }
                // By name where known: a filter on names tolerates a
                // template deleted since, where an unknown id fails the call.
                match (name, id) {
                    (Some(name), _) => Some(TemplateKey::Name(name.clone())),
                    (None, Some(id)) => Some(TemplateKey::Id(id.clone())),
                    (None, None) => None,
                }
            }
            LaunchSource::Configuration(_) => None,
        }
    }
}

/// How a launch template is asked for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TemplateKey {
    Id(String),
    Name(String),
}

/// A launch template's current version numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateVersions {
    pub id: String,
    pub name: String,
    pub latest: i64,
    pub default: i64,
}

impl TemplateVersions {
    pub fn is(&self, key: &TemplateKey) -> bool {
        match key {
            TemplateKey::Id(id) => &self.id == id,
            TemplateKey::Name(name) => &self.name == name,
        }
    }
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
    /// Forgets any shared description of these ASGs, so the next describe
    /// asks AWS (see [`cache::CachedCloud`]); nothing to forget otherwise.
    fn forget(&self, _asgs: &[String]) {}
    /// The same, unless every one of them was described less than `age`
    /// ago (after our own last mutation of it, which forgets it): the
    /// fresh read a mutation is planned on, without asking twice within a
    /// reconcile.
    fn forget_older_than(&self, asgs: &[String], _age: std::time::Duration) {
        self.forget(asgs)
    }
    /// Whether what waits on these ASGs now waits on the cluster only (a
    /// drain, a replacement's Node to be Ready): while it does, a shared
    /// description is kept longer (see [`cache::QUIET_FLOOR`]); nothing is
    /// shared otherwise.
    fn quiet(&self, _asgs: &[String], _quiet: bool) {}
    /// Whether a shared description that still lists these instances
    /// Pending, while their Nodes are Ready, is worth asking again: true the
    /// first time any of them is named (see [`cache::CachedCloud`]). Nothing
    /// is shared otherwise, so nothing is to be asked again.
    fn recheck_pending(&self, _instances: &[String]) -> bool {
        false
    }
    /// The failure message of the ASG's newest launch activity, when that
    /// activity failed (an older failure followed by a launch is none).
    async fn launch_failure(&self, asg: &str) -> Result<Option<String>>;
    /// The given instances that exist, described in pages of ids.
    async fn describe_instances(&self, ids: &[String]) -> Result<Vec<InstanceDescription>>;
    /// The version numbers of the given launch templates that exist, in one
    /// call for all of them (two when some are known by name only).
    async fn template_versions(&self, keys: &[TemplateKey]) -> Result<Vec<TemplateVersions>>;
    async fn set_desired_capacity(&self, asg: &str, desired: i32) -> Result<()>;
    /// Terminates one instance through its ASG, with or without lowering
    /// the ASG's desired count. The only way we remove an instance: it never
    /// leaves an instance running outside every ASG (as detach-then-terminate
    /// can, when the second call fails).
    async fn terminate_in_group(&self, instance_id: &str, decrement: bool) -> Result<()>;
    /// The ASG's terminate lifecycle hooks (`autoscaling:EC2_INSTANCE_TERMINATING`).
    async fn terminate_hooks(&self, asg: &str) -> Result<Vec<LifecycleHook>>;
    /// The ASG's warm pool, when it has one.
    async fn warm_pool(&self, asg: &str) -> Result<Option<WarmPool>>;
    /// The heartbeat timeout of a terminate lifecycle hook; None when it
    /// is not found.
    async fn hook_heartbeat_timeout(
        &self,
        asg: &str,
        hook: &str,
    ) -> Result<Option<std::time::Duration>> {
        let hooks = self.terminate_hooks(asg).await?;
        Ok(hooks
            .into_iter()
            .find(|h| h.name == hook)
            .and_then(|h| h.heartbeat_timeout))
    }

    /// The current spot prices of `types` (Linux) in every zone of this
    /// cloud's region, in one paginated DescribeSpotPriceHistory.
    async fn spot_prices(&self, types: &[String]) -> Result<Vec<prices::SpotPrice>>;
    /// The on-demand price (in [`Cloud::price_list`]'s currency, an hour)
    /// of `instance_type` (Linux, shared tenancy) in this cloud's region,
    /// from the Price List API; None when it lists none.
    async fn on_demand_price(&self, instance_type: &str) -> Result<Option<f64>>;
    /// Where this cloud's region's on-demand prices are read, and in what
    /// currency (no call).
    fn price_list(&self) -> prices::PriceList {
        prices::price_list("us-east-1", None)
    }

    /// Extends (heartbeat) or completes with CONTINUE the lifecycle action
    /// `token` holding `instance_id`. False when no such action is waiting
    /// any more (completed, timed out, or the instance gone).
    async fn lifecycle_action(&self, action: &HookCall<'_>, step: HookCallKind) -> Result<bool>;
}

/// A terminate lifecycle hook of an ASG: every termination waits in
/// `Terminating:Wait` until something completes its action, or for its
/// heartbeat timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleHook {
    pub name: String,
    pub heartbeat_timeout: Option<std::time::Duration>,
    /// CONTINUE or ABANDON: what AWS does at the timeout.
    pub default_result: Option<String>,
    /// Where its notifications go, when the hook itself names a target (an
    /// SQS queue or SNS topic ARN); None: to EventBridge only.
    pub notification_target: Option<String>,
}

/// An ASG's warm pool: instances launched ahead, kept stopped (or
/// running, or hibernated), that join when the ASG scales out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPool {
    pub min_size: i32,
    pub max_prepared: Option<i32>,
    /// Stopped, Running or Hibernated.
    pub state: String,
    /// Warm instances now.
    pub instances: usize,
}

/// The lifecycle transition of a terminate hook.
pub const TERMINATING: &str = "autoscaling:EC2_INSTANCE_TERMINATING";

/// A terminate lifecycle action to extend or complete.
#[derive(Debug, Clone, Copy)]
pub struct HookCall<'a> {
    pub asg: &'a str,
    pub hook: &'a str,
    pub token: &'a str,
    pub instance_id: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookCallKind {
    /// RecordLifecycleActionHeartbeat.
    Heartbeat,
    /// CompleteLifecycleAction with CONTINUE.
    Continue,
}

/// AWS's ValidationError text when a lifecycle action is no longer waiting.
pub const NO_ACTIVE_ACTION: &str = "No active Lifecycle Action found";

/// Gives the [`Cloud`] for a region (groups may name their own region).
pub trait CloudProvider: Send + Sync {
    fn cloud(&self, region: Option<&str>) -> Arc<dyn Cloud>;
}

#[derive(Clone, Debug)]
pub struct AwsClients {
    pub autoscaling: aws_sdk_autoscaling::Client,
    pub ec2: aws_sdk_ec2::Client,
    /// The Price List API, at the endpoint region that serves this region.
    pub pricing: aws_sdk_pricing::Client,
    /// Where that is, and the currency it quotes this region's prices in.
    pub price_list: prices::PriceList,
}

/// How a throttled or failed AWS request is retried: within its step, with
/// jittered exponential backoff (at most 0.2, 0.4, 0.8, 1.6 s between the 5
/// attempts), inside the operation bound (4.5 s by default), so a throttle
/// costs a fraction of a second instead of a reconcile requeued.
///
/// Standard, not adaptive: adaptive mode's client-side rate limiter charges
/// a retry 5 tokens at a fill rate that throttling cuts to 0.5 a second, so
/// under steady throttling each retry waited ~10 s, past the operation bound,
/// and a 3-node refresh took 9x as long. Our share of the account's Describe
/// budget is kept by the manager itself (one shared description, floors:
/// docs/operations.md), and the standard mode's retry quota still stops
/// retrying when most attempts fail.
pub fn retry_config() -> aws_config::retry::RetryConfig {
    aws_config::retry::RetryConfig::standard()
        .with_max_attempts(5)
        .with_initial_backoff(std::time::Duration::from_millis(200))
        .with_max_backoff(std::time::Duration::from_secs(2))
}

/// Loads the SDK configuration: the standard chain (env, profile, IRSA web
/// identity, instance metadata) with our region and endpoint overrides.
pub async fn load_sdk_config(settings: &AwsSettings) -> SdkConfig {
    // The app name goes in every request's user agent: CloudTrail shows
    // which calls are ours.
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(retry_config())
        .app_name(aws_config::AppName::new("spot-node-manager").expect("a valid app name"));
    if let Some(region) = &settings.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint.clone());
    }
    loader.load().await
}

/// What the manager's own clients carry beyond the SDK configuration.
#[derive(Clone)]
pub struct Fencing {
    /// Every request attempt is refused while this replica does not lead.
    pub leadership: crate::leadership::Leadership,
    /// Each operation, retries included, ends within this: shorter than
    /// the time between a missed renewal and another replica leading.
    pub operation_timeout: std::time::Duration,
}

impl AwsClients {
    pub fn new(sdk: &SdkConfig, emulator_account: Option<&str>) -> Self {
        Self::build(sdk, emulator_account, None, None)
    }

    /// The manager's clients: fenced by leadership, bounded in time.
    pub fn fenced(sdk: &SdkConfig, emulator_account: Option<&str>, fencing: &Fencing) -> Self {
        Self::build(sdk, emulator_account, Some(fencing), None)
    }

    /// The clients for `sdk`'s region; `pricing_region` (`aws.pricingRegion`)
    /// names the Price List endpoint when set.
    pub fn build(
        sdk: &SdkConfig,
        emulator_account: Option<&str>,
        fencing: Option<&Fencing>,
        pricing_region: Option<&str>,
    ) -> Self {
        let mut asg = aws_sdk_autoscaling::config::Builder::from(sdk);
        let mut ec2 = aws_sdk_ec2::config::Builder::from(sdk);
        let region = sdk.region().map(|r| r.to_string()).unwrap_or_default();
        let price_list = prices::price_list(&region, pricing_region);
        // GovCloud's clients point at an endpoint never asked (no Price List).
        let endpoint = match &price_list {
            prices::PriceList::At { endpoint, .. } => endpoint.clone(),
            prices::PriceList::Absent(_) => region.clone(),
        };
        let mut pricing =
            aws_sdk_pricing::config::Builder::from(sdk).region(aws_config::Region::new(endpoint));
        if let Some(f) = fencing {
            let timeouts = aws_config::timeout::TimeoutConfig::builder()
                .operation_timeout(f.operation_timeout)
                .build();
            asg = asg
                .interceptor(leader_fence::LeaderFence(f.leadership.clone()))
                .timeout_config(timeouts.clone());
            ec2 = ec2
                .interceptor(leader_fence::LeaderFence(f.leadership.clone()))
                .timeout_config(timeouts.clone());
            pricing = pricing
                .interceptor(leader_fence::LeaderFence(f.leadership.clone()))
                .timeout_config(timeouts);
        }
        #[cfg(feature = "test-support")]
        let (asg, ec2, pricing) = match emulator_account {
            Some(account) => (
                asg.interceptor(emulator::EmulatorAccount(account.to_string())),
                ec2.interceptor(emulator::EmulatorAccount(account.to_string())),
                pricing.interceptor(emulator::EmulatorAccount(account.to_string())),
            ),
            None => (asg, ec2, pricing),
        };
        // Without the test-only feature the configuration refuses an account.
        #[cfg(not(feature = "test-support"))]
        let _ = emulator_account;
        Self {
            autoscaling: aws_sdk_autoscaling::Client::from_conf(asg.build()),
            ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
            pricing: aws_sdk_pricing::Client::from_conf(pricing.build()),
            price_list,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_sdk_retries_within_the_step_and_the_managers_calls_are_bounded() {
        let sdk = load_sdk_config(&AwsSettings {
            region: Some("ap-northeast-1".into()),
            endpoint: Some("http://127.0.0.1:1".into()),
            emulator_account: None,
            pricing_region: None,
        })
        .await;
        let retry = sdk.retry_config().expect("a retry config");
        assert_eq!(retry.mode(), aws_config::retry::RetryMode::Standard);
        assert_eq!(retry.max_attempts(), 5);
        // Every backoff together fits the default operation bound (4.5 s).
        let backoffs: std::time::Duration = (0..retry.max_attempts() - 1)
            .map(|n| (retry.initial_backoff() * 2u32.pow(n)).min(retry.max_backoff()))
            .sum();
        assert!(
            backoffs < std::time::Duration::from_millis(4500),
            "{backoffs:?}"
        );
        let fenced = AwsClients::fenced(
            &sdk,
            None,
            &Fencing {
                leadership: crate::leadership::Leadership::always(),
                operation_timeout: std::time::Duration::from_millis(4500),
            },
        );
        assert_eq!(
            fenced
                .autoscaling
                .config()
                .timeout_config()
                .and_then(|t| t.operation_timeout()),
            Some(std::time::Duration::from_millis(4500))
        );
    }
}
