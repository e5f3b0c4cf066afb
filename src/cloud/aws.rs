//! The real adapter over aws-sdk-autoscaling and aws-sdk-ec2: batched
//! describes, pagination, errors that name the call and the resource.
//! Throttling and 5xx are retried with backoff by the SDK's retry config.

mod extras;
mod prices;

use super::{
    AsgDescription, AsgInstance, AwsClients, Cloud, CloudProvider, HookCall, HookCallKind,
    InstanceDescription, LaunchSource, Lifecycle, NO_ACTIVE_ACTION, TemplateKey, TemplateVersions,
};
use crate::{Error, Result};
use aws_config::SdkConfig;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Ids per DescribeInstances request (an instance-id filter takes up to 200 values).
pub const INSTANCE_PAGE: usize = 100;
/// ASG names per DescribeAutoScalingGroups request (the API's limit is 100 records).
const GROUP_PAGE: usize = 50;

pub struct AwsCloud {
    clients: AwsClients,
    /// The region its clients are for (the Price List is asked for it).
    region: Option<String>,
    instance_page: usize,
    /// Counts every request, when set (the manager's; not the test tools').
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl AwsCloud {
    pub fn new(clients: AwsClients) -> Self {
        Self {
            region: clients.ec2.config().region().map(|r| r.to_string()),
            clients,
            instance_page: INSTANCE_PAGE,
            metrics: None,
        }
    }

    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn count(&self, operation: &'static str) {
        if let Some(m) = &self.metrics {
            m.aws_call(operation);
        }
    }

    /// Maps a failed request to our error, counting it.
    fn failed<E, R: Into<String>>(
        &self,
        operation: &'static str,
        resource: R,
    ) -> impl FnOnce(E) -> Error + use<'_, E, R>
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let to_error = aws_error(operation, resource);
        move |err| {
            let error = to_error(err);
            if let (Some(m), Error::Aws { code, .. }) = (&self.metrics, &error) {
                m.aws_call_failed(operation, code.as_deref());
            }
            error
        }
    }

    /// Smaller pages, so tests can exercise pagination with few instances.
    pub fn with_instance_page(mut self, size: usize) -> Self {
        self.instance_page = size.max(1);
        self
    }
}

pub(crate) fn aws_error<E>(
    operation: &'static str,
    resource: impl Into<String>,
) -> impl FnOnce(E) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let resource = resource.into();
    move |err| Error::Aws {
        operation,
        resource,
        code: err.code().map(str::to_string),
        message: err
            .message()
            .map(str::to_string)
            .unwrap_or_else(|| DisplayErrorContext(&err).to_string()),
    }
}

fn to_chrono(t: &aws_sdk_ec2::primitives::DateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.secs(), t.subsec_nanos())
}

#[async_trait::async_trait]
impl Cloud for AwsCloud {
    async fn describe_groups(&self, names: &[String]) -> Result<Vec<AsgDescription>> {
        let mut groups = Vec::new();
        for chunk in names.chunks(GROUP_PAGE) {
            let mut pages = self
                .clients
                .autoscaling
                .describe_auto_scaling_groups()
                .set_auto_scaling_group_names(Some(chunk.to_vec()))
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                self.count("DescribeAutoScalingGroups");
                let page =
                    page.map_err(self.failed("DescribeAutoScalingGroups", chunk.join(",")))?;
                for g in page.auto_scaling_groups() {
                    groups.push(describe_group(g));
                }
            }
        }
        Ok(groups)
    }

    async fn template_versions(&self, keys: &[TemplateKey]) -> Result<Vec<TemplateVersions>> {
        let (names, ids): (Vec<&TemplateKey>, Vec<&TemplateKey>) =
            keys.iter().partition(|k| matches!(k, TemplateKey::Name(_)));
        let raw = |k: &&TemplateKey| match k {
            TemplateKey::Id(s) | TemplateKey::Name(s) => s.clone(),
        };
        let mut out = Vec::new();
        let ec2 = &self.clients.ec2;
        if !names.is_empty() {
            // A filter, not LaunchTemplateNames: a template deleted since
            // must not fail the others.
            let filter = aws_sdk_ec2::types::Filter::builder()
                .name("launch-template-name")
                .set_values(Some(names.iter().map(raw).collect()))
                .build();
            let mut pages = ec2
                .describe_launch_templates()
                .filters(filter)
                .max_results(200)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                self.count("DescribeLaunchTemplates");
                let page = page.map_err(self.failed(
                    "DescribeLaunchTemplates",
                    format!("{} name(s)", names.len()),
                ))?;
                out.extend(page.launch_templates().iter().filter_map(template_versions));
            }
        }
        if !ids.is_empty() {
            self.count("DescribeLaunchTemplates");
            let ids: Vec<String> = ids.iter().map(raw).collect();
            let page = ec2
                .describe_launch_templates()
                .set_launch_template_ids(Some(ids.clone()))
                .send()
                .await
                .map_err(self.failed("DescribeLaunchTemplates", ids.join(",")))?;
            out.extend(page.launch_templates().iter().filter_map(template_versions));
        }
        Ok(out)
    }

    async fn launch_failure(&self, asg: &str) -> Result<Option<String>> {
        self.count("DescribeScalingActivities");
        let activities = self
            .clients
            .autoscaling
            .describe_scaling_activities()
            .auto_scaling_group_name(asg)
            .max_records(10)
            .send()
            .await
            .map_err(self.failed("DescribeScalingActivities", asg))?;
        // Only the newest launch counts: an old failure followed by a launch
        // in flight is not a shortage.
        Ok(activities
            .activities()
            .iter()
            .find(|a| a.description().is_some_and(|d| d.starts_with("Launching")))
            .and_then(|a| {
                let failed = matches!(
                    a.status_code(),
                    Some(aws_sdk_autoscaling::types::ScalingActivityStatusCode::Failed)
                        | Some(aws_sdk_autoscaling::types::ScalingActivityStatusCode::Cancelled)
                );
                failed.then(|| {
                    a.status_message()
                        .or(a.description())
                        .unwrap_or("scaling activity failed")
                        .to_string()
                })
            }))
    }

    async fn describe_instances(&self, ids: &[String]) -> Result<Vec<InstanceDescription>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(self.instance_page) {
            // A filter, not InstanceIds: an id that no longer exists must not
            // fail the whole page.
            let filter = aws_sdk_ec2::types::Filter::builder()
                .name("instance-id")
                .set_values(Some(chunk.to_vec()))
                .build();
            let mut pages = self
                .clients
                .ec2
                .describe_instances()
                .filters(filter)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                self.count("DescribeInstances");
                let page = page.map_err(
                    self.failed("DescribeInstances", format!("{} instance(s)", chunk.len())),
                )?;
                for reservation in page.reservations() {
                    for i in reservation.instances() {
                        let Some(id) = i.instance_id() else { continue };
                        out.push(InstanceDescription {
                            instance_id: id.to_string(),
                            launch_time: i.launch_time().and_then(to_chrono),
                            availability_zone: i
                                .placement()
                                .and_then(|p| p.availability_zone())
                                .map(str::to_string),
                            instance_type: i.instance_type().map(|t| t.as_str().to_string()),
                            lifecycle: match i.instance_lifecycle() {
                                Some(aws_sdk_ec2::types::InstanceLifecycleType::Spot) => {
                                    Lifecycle::Spot
                                }
                                _ => Lifecycle::OnDemand,
                            },
                            state: i
                                .state()
                                .and_then(|s| s.name())
                                .map(|n| n.as_str().to_string())
                                .unwrap_or_default(),
                            private_dns_name: i
                                .private_dns_name()
                                .filter(|d| !d.is_empty())
                                .map(str::to_string),
                            tags: i
                                .tags()
                                .iter()
                                .filter_map(|t| {
                                    Some((
                                        t.key()?.to_string(),
                                        t.value().unwrap_or("").to_string(),
                                    ))
                                })
                                .collect(),
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    async fn set_desired_capacity(&self, asg: &str, desired: i32) -> Result<()> {
        self.count("SetDesiredCapacity");
        self.clients
            .autoscaling
            .set_desired_capacity()
            .auto_scaling_group_name(asg)
            .desired_capacity(desired)
            .honor_cooldown(false)
            .send()
            .await
            .map_err(self.failed("SetDesiredCapacity", asg))?;
        Ok(())
    }

    async fn terminate_in_group(&self, instance_id: &str, decrement: bool) -> Result<()> {
        self.count("TerminateInstanceInAutoScalingGroup");
        self.clients
            .autoscaling
            .terminate_instance_in_auto_scaling_group()
            .instance_id(instance_id)
            .should_decrement_desired_capacity(decrement)
            .send()
            .await
            .map_err(self.failed("TerminateInstanceInAutoScalingGroup", instance_id))?;
        Ok(())
    }

    async fn terminate_hooks(&self, asg: &str) -> Result<Vec<super::LifecycleHook>> {
        self.describe_terminate_hooks(asg).await
    }

    async fn warm_pool(&self, asg: &str) -> Result<Option<super::WarmPool>> {
        self.describe_warm_pool(asg).await
    }

    async fn spot_prices(&self, types: &[String]) -> Result<Vec<super::prices::SpotPrice>> {
        self.describe_spot_prices(types).await
    }

    async fn on_demand_price(&self, instance_type: &str) -> Result<Option<f64>> {
        self.get_on_demand_price(instance_type).await
    }

    fn price_list(&self) -> super::prices::PriceList {
        self.clients.price_list.clone()
    }

    async fn lifecycle_action(&self, call: &HookCall<'_>, step: HookCallKind) -> Result<bool> {
        let asg = &self.clients.autoscaling;
        let resource = format!("{}/{} ({})", call.asg, call.hook, call.instance_id);
        let sent = match step {
            HookCallKind::Heartbeat => {
                self.count("RecordLifecycleActionHeartbeat");
                asg.record_lifecycle_action_heartbeat()
                    .auto_scaling_group_name(call.asg)
                    .lifecycle_hook_name(call.hook)
                    .lifecycle_action_token(call.token)
                    .instance_id(call.instance_id)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(self.failed("RecordLifecycleActionHeartbeat", resource))
            }
            HookCallKind::Continue => {
                self.count("CompleteLifecycleAction");
                asg.complete_lifecycle_action()
                    .auto_scaling_group_name(call.asg)
                    .lifecycle_hook_name(call.hook)
                    .lifecycle_action_token(call.token)
                    .instance_id(call.instance_id)
                    .lifecycle_action_result("CONTINUE")
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(self.failed("CompleteLifecycleAction", resource))
            }
        };
        match sent {
            Ok(()) => Ok(true),
            Err(Error::Aws { message, .. }) if message.contains(NO_ACTIVE_ACTION) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn template_versions(t: &aws_sdk_ec2::types::LaunchTemplate) -> Option<TemplateVersions> {
    Some(TemplateVersions {
        id: t.launch_template_id()?.to_string(),
        name: t.launch_template_name()?.to_string(),
        latest: t.latest_version_number()?,
        default: t.default_version_number()?,
    })
}

fn launch_source(
    template: Option<&aws_sdk_autoscaling::types::LaunchTemplateSpecification>,
    configuration: Option<&str>,
) -> Option<LaunchSource> {
    let own = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_string);
    match (template, own(configuration)) {
        (Some(t), _) => Some(LaunchSource::Template {
            id: own(t.launch_template_id()),
            name: own(t.launch_template_name()),
            version: own(t.version()),
        }),
        (None, Some(name)) => Some(LaunchSource::Configuration(name)),
        (None, None) => None,
    }
}

fn describe_group(g: &aws_sdk_autoscaling::types::AutoScalingGroup) -> AsgDescription {
    let mixed = g.mixed_instances_policy().and_then(|p| p.launch_template());
    let template = g
        .launch_template()
        .or_else(|| mixed.and_then(|t| t.launch_template_specification()));
    // An override with a template of its own launches some instances from
    // it: what the ASG launches from cannot be told as one source, so its
    // drift is not told either (never a roll that would never end).
    let per_override = mixed.is_some_and(|t| {
        t.overrides()
            .iter()
            .any(|o| o.launch_template_specification().is_some())
    });
    AsgDescription {
        name: g.auto_scaling_group_name().unwrap_or_default().to_string(),
        desired: g.desired_capacity().unwrap_or(0),
        min: g.min_size().unwrap_or(0),
        max: g.max_size().unwrap_or(0),
        instances: g
            .instances()
            .iter()
            .map(|i| AsgInstance {
                instance_id: i.instance_id().unwrap_or_default().to_string(),
                availability_zone: i.availability_zone().map(str::to_string),
                instance_type: i.instance_type().map(str::to_string),
                lifecycle_state: i
                    .lifecycle_state()
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_default(),
                health_status: i.health_status().unwrap_or_default().to_string(),
                launched_from: launch_source(i.launch_template(), i.launch_configuration_name()),
            })
            .filter(|i| !i.instance_id.is_empty())
            .collect(),
        launches_from: match per_override {
            true => None,
            false => launch_source(template, g.launch_configuration_name()),
        },
        tags: g
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
            .collect(),
        recent_failure: None,
        suspended_processes: g
            .suspended_processes()
            .iter()
            .filter_map(|p| p.process_name().map(str::to_string))
            .collect(),
        capacity_rebalance: g.capacity_rebalance().unwrap_or(false),
        max_instance_lifetime: g.max_instance_lifetime().filter(|s| *s > 0),
        zones: g.availability_zones().to_vec(),
    }
}

/// One [`AwsCloud`] per region, built on first use from the base SDK config.
pub struct AwsCloudProvider {
    sdk: SdkConfig,
    emulator_account: Option<String>,
    /// `aws.pricingRegion`: the Price List endpoint, when set.
    pricing_region: Option<String>,
    fencing: Option<super::Fencing>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    clouds: Mutex<HashMap<Option<String>, Arc<dyn Cloud>>>,
}

impl AwsCloudProvider {
    pub fn new(sdk: SdkConfig, emulator_account: Option<String>) -> Self {
        Self {
            sdk,
            emulator_account,
            pricing_region: None,
            fencing: None,
            metrics: None,
            clouds: Mutex::new(HashMap::new()),
        }
    }

    /// Fences every request by leadership and bounds each operation.
    pub fn with_fencing(mut self, fencing: super::Fencing) -> Self {
        self.fencing = Some(fencing);
        self
    }

    /// Reads on-demand prices at this Price List endpoint region
    /// (`aws.pricingRegion`) rather than the one that serves the region.
    pub fn with_pricing_region(mut self, region: Option<String>) -> Self {
        self.pricing_region = region;
        self
    }

    /// Counts the clouds' requests in `spot_node_manager_aws_calls_total`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

impl CloudProvider for AwsCloudProvider {
    fn cloud(&self, region: Option<&str>) -> Arc<dyn Cloud> {
        let key = region.map(str::to_string);
        let mut clouds = self.clouds.lock().unwrap_or_else(|p| p.into_inner());
        clouds
            .entry(key.clone())
            .or_insert_with(|| {
                let sdk = match &key {
                    Some(region) => self
                        .sdk
                        .to_builder()
                        .region(aws_config::Region::new(region.clone()))
                        .build(),
                    None => self.sdk.clone(),
                };
                let account = self.emulator_account.as_deref();
                let pricing = self.pricing_region.as_deref();
                let clients = AwsClients::build(&sdk, account, self.fencing.as_ref(), pricing);
                let cloud = AwsCloud::new(clients);
                let cloud: Arc<dyn Cloud> = Arc::new(match &self.metrics {
                    Some(m) => cloud.with_metrics(m.clone()),
                    None => cloud,
                });
                Arc::new(super::cache::CachedCloud::new(
                    cloud,
                    super::cache::DESCRIBE_FLOOR,
                ))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_autoscaling::types::{
        AutoScalingGroup, LaunchTemplate, LaunchTemplateOverrides, LaunchTemplateSpecification,
        MixedInstancesPolicy,
    };

    fn spec(name: &str, version: &str) -> LaunchTemplateSpecification {
        LaunchTemplateSpecification::builder()
            .launch_template_name(name)
            .version(version)
            .build()
    }

    fn group(overrides: Vec<LaunchTemplateOverrides>) -> AutoScalingGroup {
        AutoScalingGroup::builder()
            .auto_scaling_group_name("nodes-a")
            .mixed_instances_policy(
                MixedInstancesPolicy::builder()
                    .launch_template(
                        LaunchTemplate::builder()
                            .launch_template_specification(spec("nodes-a", "$Latest"))
                            .set_overrides(Some(overrides))
                            .build(),
                    )
                    .build(),
            )
            .build()
    }

    #[test]
    fn a_mixed_policy_launches_from_its_template_unless_an_override_has_its_own() {
        let plain = LaunchTemplateOverrides::builder()
            .instance_type("m5.large")
            .build();
        assert_eq!(
            describe_group(&group(vec![plain.clone()])).launches_from,
            Some(LaunchSource::Template {
                id: None,
                name: Some("nodes-a".into()),
                version: Some("$Latest".into()),
            })
        );
        let own = LaunchTemplateOverrides::builder()
            .instance_type("m6g.large")
            .launch_template_specification(spec("nodes-a-arm", "3"))
            .build();
        assert_eq!(describe_group(&group(vec![plain, own])).launches_from, None);
    }
}
