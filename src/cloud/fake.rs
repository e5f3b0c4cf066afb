//! An in-memory [`Cloud`] for unit tests of controllers: a small stateful
//! model of ASGs and instances, call counts per operation, and injection of
//! the next error.

use super::{
    AsgDescription, AsgInstance, Cloud, CloudProvider, InstanceDescription, LaunchSource,
    Lifecycle, TemplateKey, TemplateVersions,
};
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct State {
    groups: BTreeMap<String, AsgDescription>,
    instances: BTreeMap<String, InstanceDescription>,
    /// Each ASG's own launch template (named `<asg>-template`), by name.
    templates: BTreeMap<String, TemplateVersions>,
    calls: BTreeMap<&'static str, usize>,
    /// Spot prices (type, zone) and on-demand prices (type), as set.
    spot_prices: BTreeMap<(String, String), f64>,
    on_demand_prices: BTreeMap<String, f64>,
    next_errors: VecDeque<(&'static str, String)>,
    /// The types each spot price call asked for, in order.
    spot_asks: Vec<Vec<String>>,
    /// The region's Price List, as set (default: us-east-1's, in USD).
    price_list: Option<super::prices::PriceList>,
    next_id: u64,
}

#[derive(Clone, Default)]
pub struct FakeCloud {
    state: Arc<Mutex<State>>,
}

impl FakeCloud {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the spot price of `instance_type` in `zone` (dollars an hour).
    pub fn set_spot_price(&self, instance_type: &str, zone: &str, price: f64) {
        let key = (instance_type.to_string(), zone.to_string());
        self.lock().spot_prices.insert(key, price);
    }

    /// Sets the on-demand price of `instance_type` (dollars an hour).
    pub fn set_on_demand_price(&self, instance_type: &str, price: f64) {
        self.lock()
            .on_demand_prices
            .insert(instance_type.to_string(), price);
    }

    /// Where the region's on-demand prices are read, as for `region`.
    pub fn set_price_list_of(&self, region: &str) {
        self.lock().price_list = Some(super::prices::price_list(region, None));
    }

    /// Adds an ASG with `instances` running spot instances launched at `launch_time`.
    pub fn add_group(
        &self,
        name: &str,
        zone: &str,
        instances: usize,
        max: i32,
        launch_time: DateTime<Utc>,
    ) -> Vec<String> {
        let mut state = self.lock();
        state.groups.insert(
            name.to_string(),
            AsgDescription {
                name: name.to_string(),
                desired: instances as i32,
                min: 0,
                max,
                instances: vec![],
                launches_from: Some(LaunchSource::Template {
                    id: Some(format!("lt-{name}")),
                    name: Some(format!("{name}-template")),
                    version: Some("$Latest".into()),
                }),
                tags: BTreeMap::new(),
                recent_failure: None,
                suspended_processes: vec![],
                capacity_rebalance: false,
                max_instance_lifetime: None,
                zones: vec![],
            },
        );
        state.templates.insert(
            format!("{name}-template"),
            TemplateVersions {
                id: format!("lt-{name}"),
                name: format!("{name}-template"),
                latest: 1,
                default: 1,
            },
        );
        (0..instances)
            .map(|_| launch(&mut state, name, zone, launch_time))
            .collect()
    }

    /// A new version of the ASG's template (what `kops update cluster`
    /// does): instances launched from now on use it.
    pub fn new_template_version(&self, asg: &str) {
        if let Some(t) = self.lock().templates.get_mut(&format!("{asg}-template")) {
            t.latest += 1;
        }
    }

    /// Sets desired without launching (an ASG that cannot launch).
    pub fn set_desired_without_launch(&self, name: &str, desired: i32) {
        if let Some(g) = self.lock().groups.get_mut(name) {
            g.desired = desired;
        }
    }

    /// Sets an instance's lifecycle state in its ASG (e.g. `Pending`).
    pub fn set_lifecycle_state(&self, instance_id: &str, state: &str) {
        for g in self.lock().groups.values_mut() {
            for i in g
                .instances
                .iter_mut()
                .filter(|i| i.instance_id == instance_id)
            {
                i.lifecycle_state = state.to_string();
            }
        }
    }

    pub fn set_recent_failure(&self, name: &str, failure: Option<&str>) {
        if let Some(g) = self.lock().groups.get_mut(name) {
            g.recent_failure = failure.map(str::to_string);
        }
    }

    /// Makes the next call of `operation` fail with `message`.
    pub fn fail_next(&self, operation: &'static str, message: &str) {
        self.lock()
            .next_errors
            .push_back((operation, message.to_string()));
    }

    pub fn calls(&self, operation: &str) -> usize {
        self.lock().calls.get(operation).copied().unwrap_or(0)
    }

    /// The types each spot price call asked for, in order.
    pub fn spot_asks(&self) -> Vec<Vec<String>> {
        self.lock().spot_asks.clone()
    }

    pub fn total_calls(&self) -> usize {
        self.lock().calls.values().sum()
    }

    pub fn reset_calls(&self) {
        self.lock().calls.clear();
    }

    pub fn group(&self, name: &str) -> Option<AsgDescription> {
        self.lock().groups.get(name).cloned()
    }

    pub fn instance(&self, id: &str) -> Option<InstanceDescription> {
        self.lock().instances.get(id).cloned()
    }

    fn enter(&self, operation: &'static str) -> Result<std::sync::MutexGuard<'_, State>> {
        let mut state = self.lock();
        *state.calls.entry(operation).or_default() += 1;
        if let Some(pos) = state
            .next_errors
            .iter()
            .position(|(op, _)| *op == operation)
        {
            let (_, message) = state
                .next_errors
                .remove(pos)
                .unwrap_or((operation, String::new()));
            return Err(Error::Aws {
                operation,
                resource: "fake".into(),
                code: Some("Injected".into()),
                message,
            });
        }
        Ok(state)
    }
}

fn launch(state: &mut State, group: &str, zone: &str, launch_time: DateTime<Utc>) -> String {
    state.next_id += 1;
    let id = format!("i-{:017x}", state.next_id);
    state.instances.insert(
        id.clone(),
        InstanceDescription {
            instance_id: id.clone(),
            launch_time: Some(launch_time),
            availability_zone: Some(zone.to_string()),
            instance_type: Some("m5.large".into()),
            lifecycle: Lifecycle::Spot,
            state: "running".into(),
            private_dns_name: None,
            tags: BTreeMap::new(),
        },
    );
    let version = state
        .templates
        .get(&format!("{group}-template"))
        .map(|t| t.latest.to_string());
    if let Some(g) = state.groups.get_mut(group) {
        let launched_from = g.launches_from.clone().map(|source| match source {
            LaunchSource::Template { id, name, .. } => LaunchSource::Template {
                id,
                name,
                version: version.clone(),
            },
            other => other,
        });
        g.instances.push(AsgInstance {
            instance_id: id.clone(),
            availability_zone: Some(zone.to_string()),
            instance_type: Some("m5.large".into()),
            lifecycle_state: "InService".into(),
            health_status: "Healthy".into(),
            launched_from,
        });
    }
    id
}

fn not_found(operation: &'static str, resource: &str) -> Error {
    Error::Aws {
        operation,
        resource: resource.to_string(),
        code: Some("ValidationError".into()),
        message: format!("{resource} not found"),
    }
}

/// AWS's refusal of a call that breaks the group's bounds.
fn refused(operation: &'static str, resource: &str, message: String) -> Error {
    Error::Aws {
        operation,
        resource: resource.to_string(),
        code: Some("ValidationError".into()),
        message,
    }
}

/// Removes an instance from its group (and optionally replaces it, as an ASG does).
fn remove_from_group(
    state: &mut State,
    instance_id: &str,
    decrement: bool,
    replace: bool,
) -> Result<()> {
    let (group, zone) = state
        .groups
        .values()
        .find_map(|g| {
            g.instances
                .iter()
                .find(|i| i.instance_id == instance_id)
                .map(|i| {
                    (
                        g.name.clone(),
                        i.availability_zone.clone().unwrap_or_default(),
                    )
                })
        })
        .ok_or_else(|| not_found("TerminateInstanceInAutoScalingGroup", instance_id))?;
    if let Some(g) = state.groups.get(&group)
        && decrement
        && g.desired - 1 < g.min
    {
        return Err(refused(
            "TerminateInstanceInAutoScalingGroup",
            instance_id,
            format!(
                "Currently, desiredSize equals minSize ({}). Terminating instance without replacement will violate group's min size constraint.",
                g.min
            ),
        ));
    }
    if let Some(g) = state.groups.get_mut(&group) {
        g.instances.retain(|i| i.instance_id != instance_id);
        if decrement {
            g.desired -= 1;
        }
    }
    if replace && !decrement {
        let now = Utc::now();
        launch(state, &group, &zone, now);
    }
    Ok(())
}

#[async_trait::async_trait]
impl Cloud for FakeCloud {
    async fn describe_groups(&self, names: &[String]) -> Result<Vec<AsgDescription>> {
        let state = self.enter("describe_groups")?;
        Ok(names
            .iter()
            .filter_map(|n| state.groups.get(n).cloned())
            .map(|g| AsgDescription {
                recent_failure: None,
                ..g
            })
            .collect())
    }

    async fn launch_failure(&self, asg: &str) -> Result<Option<String>> {
        let state = self.enter("launch_failure")?;
        Ok(state.groups.get(asg).and_then(|g| g.recent_failure.clone()))
    }

    async fn describe_instances(&self, ids: &[String]) -> Result<Vec<InstanceDescription>> {
        let state = self.enter("describe_instances")?;
        Ok(ids
            .iter()
            .filter_map(|id| state.instances.get(id).cloned())
            .collect())
    }

    async fn template_versions(&self, keys: &[TemplateKey]) -> Result<Vec<TemplateVersions>> {
        let state = self.enter("template_versions")?;
        Ok(state
            .templates
            .values()
            .filter(|t| keys.iter().any(|k| t.is(k)))
            .cloned()
            .collect())
    }

    async fn set_desired_capacity(&self, asg: &str, desired: i32) -> Result<()> {
        let mut state = self.enter("set_desired_capacity")?;
        let group = state
            .groups
            .get(asg)
            .cloned()
            .ok_or_else(|| not_found("SetDesiredCapacity", asg))?;
        if desired < group.min || desired > group.max {
            return Err(refused(
                "SetDesiredCapacity",
                asg,
                format!(
                    "New SetDesiredCapacity value {desired} is outside [{}, {}] for the AutoScalingGroup.",
                    group.min, group.max
                ),
            ));
        }
        let zone = group
            .instances
            .first()
            .and_then(|i| i.availability_zone.clone())
            .unwrap_or_else(|| "zone-a".into());
        for _ in group.instances.len() as i32..desired {
            launch(&mut state, asg, &zone, Utc::now());
        }
        if let Some(g) = state.groups.get_mut(asg) {
            g.desired = desired;
        }
        Ok(())
    }

    async fn terminate_in_group(&self, instance_id: &str, decrement: bool) -> Result<()> {
        let mut state = self.enter("terminate_in_group")?;
        remove_from_group(&mut state, instance_id, decrement, true)?;
        if let Some(i) = state.instances.get_mut(instance_id) {
            i.state = "terminated".into();
        }
        Ok(())
    }

    /// No hooks in this model.
    async fn terminate_hooks(&self, _asg: &str) -> Result<Vec<super::LifecycleHook>> {
        drop(self.enter("terminate_hooks")?);
        Ok(vec![])
    }

    async fn spot_prices(&self, types: &[String]) -> Result<Vec<super::prices::SpotPrice>> {
        // A call takes time: callers at once interleave here.
        tokio::task::yield_now().await;
        let mut state = self.enter("spot_prices")?;
        state.spot_asks.push(types.to_vec());
        Ok(state
            .spot_prices
            .iter()
            .filter(|((t, _), _)| types.contains(t))
            .map(|((t, z), p)| super::prices::SpotPrice {
                instance_type: t.clone(),
                zone: z.clone(),
                dollars_per_hour: *p,
            })
            .collect())
    }

    async fn on_demand_price(&self, instance_type: &str) -> Result<Option<f64>> {
        let state = self.enter("on_demand_price")?;
        Ok(state.on_demand_prices.get(instance_type).copied())
    }

    fn price_list(&self) -> super::prices::PriceList {
        let set = self.lock().price_list.clone();
        set.unwrap_or_else(|| super::prices::price_list("us-east-1", None))
    }

    /// No warm pools in this model.
    async fn warm_pool(&self, _asg: &str) -> Result<Option<super::WarmPool>> {
        drop(self.enter("warm_pool")?);
        Ok(None)
    }

    /// Waiting while the instance is a member of a group.
    async fn lifecycle_action(
        &self,
        call: &super::HookCall<'_>,
        _step: super::HookCallKind,
    ) -> Result<bool> {
        let state = self.enter("lifecycle_action")?;
        Ok(state.groups.values().any(|g| {
            g.instances
                .iter()
                .any(|i| i.instance_id == call.instance_id)
        }))
    }
}

impl CloudProvider for FakeCloud {
    /// Through the same launch-activity policy as the real provider, with no
    /// sharing window: each look sees the fake's state as it is now.
    fn cloud(&self, _region: Option<&str>) -> Arc<dyn Cloud> {
        Arc::new(super::cache::CachedCloud::new(
            Arc::new(self.clone()),
            std::time::Duration::ZERO,
        ))
    }
}
