//! What a child controller observes before planning: its NodeGroup (with the
//! inventory), the group's lock from its side, and, as a separate step, a
//! fresh describe of the group's ASGs.

use super::authority::{self, ControlPlane};
use super::group_view::{AsgView, GroupFacts, GroupNode, group_nodes, ready_while_pending};
use crate::cloud::cache::FRESH_ENOUGH;
use crate::cloud::{AsgDescription, Cloud};
use crate::context::Context;
use crate::crd::nodegroup::OperationKind;
use crate::crd::{NodeGroup, NodeGroupStatus};
use crate::error::Error;
use crate::k8s::lock::{self, Holder, LockState};
use kube::api::Api;
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// The group as a child controller sees it: its NodeGroup with a status that
/// has seen the current spec (act only on such an inventory), and the
/// group's lock from its side.
pub struct ObservedGroup {
    pub namespace: String,
    pub name: String,
    pub me: Holder,
    pub group: NodeGroup,
    pub group_status: NodeGroupStatus,
    pub lock: LockState,
    pub cloud: Arc<dyn Cloud>,
    /// Masters: the cluster's control plane, once looked at
    /// ([`ObservedGroup::observe_control_plane`]).
    pub control_plane: Option<ControlPlane>,
}

/// Whether there is a group to plan for.
pub enum Observation {
    Group(Box<ObservedGroup>),
    /// Nothing to act on yet (no NodeGroup, or its status has not seen its
    /// spec): look again after this long.
    NotYet(Duration),
}

/// A fresh describe of the group's ASGs, and the group's nodes judged by it.
#[derive(Default)]
pub struct DescribedAsgs {
    pub fresh: Vec<AsgDescription>,
    pub asgs: Vec<AsgView>,
    /// The group's nodes, Ready only while their instance is in service.
    pub nodes: Vec<GroupNode>,
}

/// Observes the group for `child` (of `kind`) working on NodeGroup `node_group`.
pub async fn observe_group<K: Resource>(
    ctx: &Context,
    child: &K,
    kind: OperationKind,
    node_group: &str,
) -> Result<Observation, Error> {
    let name = child.name_any();
    let namespace = child.namespace().ok_or_else(|| {
        Error::InvalidObject(format!("{kind:?} resource {name} has no namespace"))
    })?;
    let groups: Api<NodeGroup> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(group) = groups
        .get_opt(node_group)
        .await
        .map_err(Error::kube(format!(
            "get NodeGroup {namespace}/{node_group}"
        )))?
    else {
        // No garbage collector guaranteed (and none on test apiservers): idle.
        return Ok(Observation::NotYet(Duration::from_secs(60)));
    };
    let Some(group_status) = group
        .status
        .clone()
        .filter(|s| s.observed_generation == group.metadata.generation)
    else {
        return Ok(Observation::NotYet(Duration::from_secs(2)));
    };
    let me = Holder {
        kind,
        name: name.clone(),
    };
    let lock = lock::observe(
        &ctx.client,
        &namespace,
        group_status.operation.as_ref(),
        &me,
    )
    .await?;
    let cloud = ctx.cloud.cloud(group.spec.region.as_deref());
    Ok(Observation::Group(Box::new(ObservedGroup {
        namespace,
        name,
        me,
        group,
        group_status,
        lock,
        cloud,
        control_plane: None,
    })))
}

impl ObservedGroup {
    /// What every child plan is told, from this observation and the ASGs
    /// as `described`; `suspended` adds the child's own suspension to the
    /// group's.
    pub fn facts<'a>(
        &'a self,
        described: &'a DescribedAsgs,
        suspended: bool,
        now: chrono::DateTime<chrono::Utc>,
    ) -> GroupFacts<'a> {
        GroupFacts {
            role: self.group.spec.role,
            desired: self.group.spec.desired,
            suspended: self.group.spec.suspend || suspended,
            deleting: self.group.metadata.deletion_timestamp.is_some(),
            external_update: self.group.external_update(),
            invalid_spec: self.group.invalid_spec(),
            breaker: self.group.breaker_open(),
            unhealthy_timeout: self.group.spec.replenish.unhealthy_timeout(),
            repair: self.group.spec.replenish.repair,
            asgs: &described.asgs,
            nodes: &described.nodes,
            lock: self.lock.clone(),
            control_plane: self.control_plane.as_ref(),
            now,
        }
    }

    /// Describes the group's ASGs (one AWS call, or a description shared
    /// for a few seconds) and judges its nodes by it.
    pub async fn describe(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<DescribedAsgs, Error> {
        let names = self.group.spec.asg_names();
        let mut fresh = self.cloud.describe_groups(&names).await?;
        // A Node Ready on an instance the shared description has Pending:
        // the description is older than the Node, and the node would count
        // only at the next describe, up to its floor (5 s) later. Asked
        // again, once per instance.
        let joined = ready_while_pending(&self.group_status.nodes, &fresh);
        if !joined.is_empty() && self.cloud.recheck_pending(&joined) {
            self.cloud.forget(&names);
            fresh = self.cloud.describe_groups(&names).await?;
        }
        let spec = &self.group.spec;
        let asgs = fresh
            .iter()
            .map(|a| AsgView {
                fallback: spec.is_fallback(&a.name),
                risk: self.risk_of(&a.name),
                price: self.price_of(&a.name, |s| s.spot_price.as_deref()),
                on_demand_price: self.price_of(&a.name, |s| s.on_demand_price.as_deref()),
                ..AsgView::from(a)
            })
            .collect();
        let nodes = group_nodes(&self.group_status.nodes, &fresh, now);
        Ok(DescribedAsgs { fresh, asgs, nodes })
    }

    /// The ASG's recent record, as a raise weighs it: its events (the
    /// inventory keeps the last 24 hours' at each sync).
    fn risk_of(&self, asg: &str) -> u32 {
        self.group_status
            .auto_scaling_groups
            .iter()
            .find(|a| a.name == asg)
            .map_or(0, |a| u32::try_from(a.recent.len()).unwrap_or(u32::MAX))
    }

    /// A price of the ASG (`which`) as the inventory last read it, in
    /// millionths of a dollar an hour.
    fn price_of(
        &self,
        asg: &str,
        which: impl Fn(&crate::crd::nodegroup::AutoScalingGroupStatus) -> Option<&str>,
    ) -> Option<u64> {
        let status = self
            .group_status
            .auto_scaling_groups
            .iter()
            .find(|a| a.name == asg)?;
        let dollars: f64 = which(status)?.parse().ok()?;
        (dollars.is_finite() && dollars >= 0.0).then(|| (dollars * 1e6).round() as u64)
    }

    /// A Master group that may take a master away (`needed`): looks at the
    /// cluster's control plane, which the authority decides on (a worker
    /// group never needs it).
    pub async fn observe_control_plane(
        &mut self,
        ctx: &Context,
        needed: bool,
    ) -> Result<(), Error> {
        if needed && self.group.spec.role == crate::crd::Role::Master {
            self.control_plane = Some(authority::observe::observe(ctx, &self.namespace).await?);
        }
        Ok(())
    }

    /// The same, asking AWS now rather than sharing a description older
    /// than [`FRESH_ENOUGH`] (one this reconcile asked moments before
    /// serves): what a plan about to call AWS must be based on.
    pub async fn describe_fresh(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<DescribedAsgs, Error> {
        self.cloud
            .forget_older_than(&self.group.spec.asg_names(), FRESH_ENOUGH);
        self.describe(now).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::cache::CachedCloud;
    use crate::cloud::fake::FakeCloud;
    use crate::controllers::group_view::tests::status_node;
    use crate::controllers::inventory::plan::tests::group;

    fn observed(cloud: Arc<dyn Cloud>, ready_on: &str) -> ObservedGroup {
        ObservedGroup {
            namespace: "ns".into(),
            name: "workers".into(),
            me: Holder {
                kind: OperationKind::Refresh,
                name: "workers".into(),
            },
            group: group(&["a"], 1),
            group_status: NodeGroupStatus {
                nodes: vec![status_node("n", "a", ready_on)],
                ..Default::default()
            },
            lock: LockState::Free,
            cloud,
            control_plane: None,
        }
    }

    #[tokio::test]
    async fn a_node_ready_on_an_instance_shared_as_pending_is_described_again_once() {
        let fake = FakeCloud::new();
        let ids = fake.add_group("a", "zone-a", 1, 10, chrono::Utc::now());
        let cached: Arc<dyn Cloud> = Arc::new(CachedCloud::new(
            Arc::new(fake.clone()),
            Duration::from_secs(60),
        ));
        // Shared while AWS still launched it; in service since, and its
        // Node Ready.
        fake.set_lifecycle_state(&ids[0], "Pending");
        cached
            .describe_groups(&["a".into()])
            .await
            .expect("describe");
        fake.set_lifecycle_state(&ids[0], "InService");
        let group = observed(cached.clone(), &ids[0]);
        let described = group.describe(chrono::Utc::now()).await.expect("describe");
        assert!(
            described.nodes[0].ready,
            "counted now, not at the next floor"
        );
        assert_eq!(fake.calls("describe_groups"), 2);

        // Held Pending (a launch hook): asked again once, not at every look.
        let held = fake.add_group("b", "zone-b", 1, 10, chrono::Utc::now());
        fake.set_lifecycle_state(&held[0], "Pending:Wait");
        let mut group = observed(cached.clone(), &held[0]);
        group.group = crate::controllers::inventory::plan::tests::group(&["b"], 1);
        for _ in 0..3 {
            let described = group.describe(chrono::Utc::now()).await.expect("describe");
            assert!(!described.nodes[0].ready, "not in service: not counted");
        }
        assert_eq!(
            fake.calls("describe_groups"),
            4,
            "b: the first look and one look again"
        );
    }
}
