//! What the receivers look up per message, cached briefly: the NodeGroups
//! (whose status says which instances are ours, and whose spec says how to
//! handle them) and, only for a loss notice naming an instance no group
//! has, the cluster's Nodes (a node of an instance group nobody named).

use super::message;
use super::ownership::{Owner, Ownership, Unmanaged};
use super::plan::GroupSpecs;
use crate::config::UnmanagedNodes;
use crate::context::Context;
use crate::crd::NodeGroup;
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long one listing of the NodeGroups (or Nodes) serves the receivers
/// (the inventory's status it reads changes far less often).
const FRESH: Duration = Duration::from_secs(1);

/// A listing kept at most [`FRESH`], shared by the receivers (one listing
/// at a time: the others wait for it rather than list again).
pub struct Brief<T>(tokio::sync::Mutex<Option<(std::time::Instant, Arc<T>)>>);

impl<T> Default for Brief<T> {
    fn default() -> Self {
        Brief(Default::default())
    }
}

impl<T> Brief<T> {
    async fn get_or<F, Fut>(&self, list: F) -> Result<Arc<T>>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut cached = self.0.lock().await;
        if let Some((at, value)) = cached.as_ref()
            && at.elapsed() < FRESH
        {
            return Ok(value.clone());
        }
        let value = Arc::new(list().await?);
        *cached = Some((std::time::Instant::now(), value.clone()));
        Ok(value)
    }
}

/// The NodeGroups listed at most [`FRESH`] ago.
pub type GroupCache = Brief<Groups>;

impl Brief<Groups> {
    pub async fn get(&self, ctx: &Context) -> Result<Arc<Groups>> {
        self.get_or(|| list_groups(ctx)).await
    }
}

/// The managed groups, as the inventory last wrote them.
pub struct Groups {
    pub ownership: Ownership,
    pub by_name: HashMap<(String, String), NodeGroup>,
}

async fn list_groups(ctx: &Context) -> Result<Groups> {
    let api: Api<NodeGroup> = match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let list = api
        .list(&Default::default())
        .await
        .map_err(Error::kube("list NodeGroups"))?;
    Ok(Groups {
        ownership: Ownership::of(&list.items),
        by_name: list
            .items
            .into_iter()
            .map(|g| ((g.namespace().unwrap_or_default(), g.name_any()), g))
            .collect(),
    })
}

impl GroupSpecs for Groups {
    fn drain_deadline(&self, owner: &Owner) -> chrono::Duration {
        let configured = self
            .by_name
            .get(&(owner.namespace.clone(), owner.group.clone()))
            .map(|g| g.spec.interruption.drain_deadline())
            .unwrap_or(crate::crd::nodegroup::DEFAULT_DRAIN_DEADLINE);
        chrono::Duration::from_std(configured).unwrap_or(chrono::Duration::seconds(90))
    }

    fn replace_on_rebalance(&self, owner: &Owner) -> bool {
        self.by_name
            .get(&(owner.namespace.clone(), owner.group.clone()))
            .is_some_and(|g| {
                g.spec.interruption.on_rebalance_recommendation
                    == crate::crd::nodegroup::OnRebalance::Replace
            })
    }

    fn region(&self, owner: &Owner) -> Option<String> {
        self.by_name
            .get(&(owner.namespace.clone(), owner.group.clone()))
            .and_then(|g| g.spec.region.clone())
    }
}

/// The cluster's Nodes no group lists, read (at most once per
/// [`FRESH`]) only when a loss notice names an instance no group has
/// and `unmanagedNodes` is `Drain`.
pub async fn unmanaged(
    ctx: &Context,
    nodes: &NodeCache,
    groups: &Groups,
    parsed: &message::Parsed,
) -> Result<Unmanaged> {
    let message::Parsed::Notice(notice) = parsed else {
        return Ok(Unmanaged::default());
    };
    let wanted = ctx.settings.interruption.unmanaged_nodes == UnmanagedNodes::Drain
        && notice.kind.is_loss()
        && notice
            .instance_ids
            .iter()
            .any(|id| groups.ownership.owner(id).is_none());
    if !wanted {
        return Ok(Unmanaged::default());
    }
    let listed = nodes.get(ctx).await?;
    Ok(Unmanaged::of_nodes(&listed, &groups.ownership))
}

/// The cluster's Nodes listed at most [`FRESH`] ago.
pub type NodeCache = Brief<Vec<Node>>;

impl Brief<Vec<Node>> {
    async fn get(&self, ctx: &Context) -> Result<Arc<Vec<Node>>> {
        self.get_or(|| async {
            let api: Api<Node> = Api::all(ctx.client.clone());
            let list = api
                .list(&Default::default())
                .await
                .map_err(Error::kube("list Nodes"))?;
            Ok(list.items)
        })
        .await
    }
}
