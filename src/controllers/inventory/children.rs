//! The group's child Refresher and Replenisher: created, updated and deleted
//! with the group's spec (owner references, so deleting the group deletes
//! them).

use crate::context::{CHILDREN_FIELD_MANAGER, Context};
use crate::crd::nodegroup::{DriftAction, RefreshSpec};
use crate::crd::refresher::RefresherSpec;
use crate::crd::replenisher::ReplenisherSpec;
use crate::crd::{NodeGroup, Refresher, Replenisher};
use crate::mutation::Intent;
use crate::{Error, Result};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

/// Pure: the children a valid group should have (None = should not exist).
pub fn child_specs(group: &NodeGroup) -> (Option<RefresherSpec>, Option<ReplenisherSpec>) {
    let spec = &group.spec;
    let name = group.name_any();
    let drift_replace = spec.drift.action == DriftAction::Replace;
    // A group without `refresh` but with drift rolls gets a Refresher with no
    // schedule and the refresh defaults (one surplus node for workers).
    let defaults;
    let refresh = match (&spec.refresh, drift_replace) {
        (Some(r), _) => Some(r),
        (None, true) => {
            defaults = RefreshSpec::unscheduled();
            Some(&defaults)
        }
        (None, false) => None,
    };
    let refresher = refresh.map(|r| RefresherSpec {
        node_group: name.clone(),
        role: spec.role,
        schedule: spec.refresh.as_ref().map(|_| r.schedule.clone()),
        time_zone: r.time_zone.clone(),
        surplus_nodes: r.effective_surplus(spec.role),
        max_node_age: r.max_node_age.clone(),
        drain_timeout: r.drain_timeout.clone(),
        drain_timeout_action: r.drain_timeout_action,
        ready_timeout: r.ready_timeout.clone(),
        master_settle_time: r.master_settle_time.clone(),
        validation_timeout: r.validation_timeout.clone(),
        validation_timeout_action: r.validation_timeout_action,
        settle_time: r.settle_time.clone(),
        max_surge: r.max_surge.clone(),
        pause_timeout: r.pause_timeout.clone(),
        suspend: spec.suspend,
        drift_replace,
    });
    let replenisher = spec.replenish.enabled.then(|| ReplenisherSpec {
        node_group: name.clone(),
        role: spec.role,
        desired: spec.desired,
        cooldown: spec.replenish.cooldown.clone(),
        join_timeout: spec.replenish.join_timeout.clone(),
        suspend: spec.suspend,
    });
    (refresher, replenisher)
}

pub(super) async fn sync_children(
    ctx: &Context,
    group: &NodeGroup,
    namespace: &str,
    name: &str,
) -> Result<()> {
    let owner = group.controller_owner_ref(&()).ok_or_else(|| {
        Error::InvalidObject(format!("NodeGroup {namespace}/{name} has no uid yet"))
    })?;
    let (refresher, replenisher) = child_specs(group);
    let refreshers: Api<Refresher> = Api::namespaced(ctx.client.clone(), namespace);
    let replenishers: Api<Replenisher> = Api::namespaced(ctx.client.clone(), namespace);

    match refresher {
        Some(spec) => {
            apply_child::<Refresher, _>(ctx, &refreshers, name, &owner, "Refresher", spec).await?
        }
        None => {
            if let Some(existing) = refreshers
                .get_opt(name)
                .await
                .map_err(Error::kube("get Refresher"))?
            {
                // A run in progress holds the original desired counts and the
                // surplus it added: removing it now would lose them.
                if existing
                    .status
                    .as_ref()
                    .is_some_and(|s| s.run_start.is_some())
                {
                    warn!(group = %name, "refresh removed from spec but a run is in progress; keeping the Refresher");
                } else {
                    delete_child(ctx, &refreshers, namespace, name, "Refresher").await?;
                }
            }
        }
    }
    match replenisher {
        Some(spec) => {
            apply_child::<Replenisher, _>(ctx, &replenishers, name, &owner, "Replenisher", spec)
                .await?
        }
        None => {
            if replenishers
                .get_opt(name)
                .await
                .map_err(Error::kube("get Replenisher"))?
                .is_some()
            {
                delete_child(ctx, &replenishers, namespace, name, "Replenisher").await?;
            }
        }
    }
    Ok(())
}

async fn apply_child<K, S>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    kind: &'static str,
    spec: S,
) -> Result<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + serde::Serialize,
    S: serde::Serialize + PartialEq + serde::de::DeserializeOwned,
{
    // Skip the write when the child already has exactly this spec and owner.
    if let Some(existing) = api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get {kind} {name}")))?
    {
        let value = serde_json::to_value(&existing).map_err(|source| Error::Serialization {
            context: format!("{kind} {name}"),
            source,
        })?;
        let same_spec = value
            .get("spec")
            .and_then(|s| serde_json::from_value::<S>(s.clone()).ok())
            .is_some_and(|s| s == spec);
        let owned = existing
            .meta()
            .owner_references
            .as_ref()
            .is_some_and(|refs| refs.iter().any(|r| r.uid == owner.uid));
        if same_spec && owned {
            return Ok(());
        }
    }
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": spec,
    });
    let namespace = api.resource_url().to_string();
    ctx.mutations
        .perform(
            Intent::own("apply_child", format!("{kind}/{name}")),
            || async {
                api.patch(
                    name,
                    &PatchParams::apply(CHILDREN_FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
                .map_err(Error::kube(format!("apply {kind} {name} ({namespace})")))
            },
        )
        .await?;
    info!(kind, name, "child resource applied");
    Ok(())
}

async fn delete_child<K>(
    ctx: &Context,
    api: &Api<K>,
    namespace: &str,
    name: &str,
    kind: &'static str,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    ctx.mutations
        .perform(
            Intent::own("delete_child", format!("{kind}/{namespace}/{name}")),
            || async {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                    Err(e) => Err(Error::kube(format!("delete {kind} {namespace}/{name}"))(e)),
                }
            },
        )
        .await?;
    info!(kind, name, "child resource removed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::inventory::plan::tests::group;

    #[test]
    fn children_follow_the_spec() {
        let mut g = group(&["nodes-a"], 3);
        let (refresher, replenisher) = child_specs(&g);
        assert!(refresher.is_none(), "no refresh configured");
        let rp = replenisher.expect("replenish is on by default");
        assert_eq!(
            (rp.node_group.as_str(), rp.desired, rp.cooldown.as_str()),
            ("workers", 3, "5m")
        );
        g.spec.refresh =
            Some(serde_json::from_value(serde_json::json!({"schedule": "0 3 * * *"})).unwrap());
        g.spec.replenish.enabled = false;
        let (refresher, replenisher) = child_specs(&g);
        let rf = refresher.expect("refresher");
        assert_eq!(rf.surplus_nodes, 1, "worker default");
        assert_eq!(rf.time_zone, "UTC");
        assert!(replenisher.is_none());
    }
    #[test]
    fn drift_replace_without_refresh_gets_an_unscheduled_refresher() {
        let mut g = group(&["nodes-a"], 3);
        g.spec.drift.action = DriftAction::Replace;
        let rf = child_specs(&g).0.expect("a Refresher for drift rolls");
        assert!(rf.drift_replace);
        assert_eq!(rf.schedule, None, "no scheduled run");
        assert_eq!(rf.surplus_nodes, 1, "the worker default surplus");
        let resolved = rf.resolve().expect("the defaults resolve");
        assert!(resolved.schedule.is_none());
        assert_eq!(resolved.drain_timeout, std::time::Duration::from_secs(300));

        g.spec.refresh = Some(
            serde_json::from_value(serde_json::json!({"schedule": "0 3 * * *", "surplusNodes": 2}))
                .unwrap(),
        );
        let rf = child_specs(&g).0.expect("refresher");
        assert!(rf.drift_replace);
        assert_eq!(
            (rf.schedule.as_deref(), rf.surplus_nodes),
            (Some("0 3 * * *"), 2),
            "refresh's settings"
        );

        g.spec.drift.action = DriftAction::Report;
        assert!(!child_specs(&g).0.expect("refresher").drift_replace);
    }
}
