//! What the receivers look up per message: the NodeGroups, watched (whose
//! status says which instances are ours, and whose spec says how to handle
//! them) and, only for a loss notice naming an instance no group has, the
//! cluster's Nodes, listed at most once a second (a node of an instance
//! group nobody named).

use super::message;
use super::ownership::{Owner, Ownership, Unmanaged};
use super::plan::GroupSpecs;
use crate::config::UnmanagedNodes;
use crate::context::Context;
use crate::crd::NodeGroup;
use crate::{Error, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How long one listing of the Nodes serves the receivers.
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

/// Every NodeGroup, kept current by a watch: a burst of messages reads
/// them without a call (a listing per second held every receiver of a
/// burst behind it, up to 0.65 s at 150 warnings).
pub struct GroupWatch {
    store: Store<NodeGroup>,
}

impl GroupWatch {
    /// Starts the watch (until `shutdown`) and returns once its initial
    /// list is in, so no message is judged on an empty view; `None` if
    /// `shutdown` comes first. A failing watch retries with backoff, and
    /// messages wait on the queue meanwhile.
    pub async fn start(ctx: &Context, shutdown: &CancellationToken) -> Option<GroupWatch> {
        let api: Api<NodeGroup> = match &ctx.settings.namespace {
            Some(ns) => Api::namespaced(ctx.client.clone(), ns),
            None => Api::all(ctx.client.clone()),
        };
        let (store, writer) = reflector::store();
        let (ready_tx, mut ready) = tokio::sync::watch::channel(false);
        let stream = watcher(api, watcher::Config::default().any_semantic())
            .default_backoff()
            .reflect(writer);
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => break,
                    event = stream.next() => event,
                };
                match event {
                    Some(Ok(watcher::Event::InitDone)) => {
                        let _ = ready_tx.send(true);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        warn!(error = %e, "watching the NodeGroups failed; retrying")
                    }
                    None => break,
                }
            }
        });
        tokio::select! {
            _ = shutdown.cancelled() => None,
            ready = ready.wait_for(|ready| *ready) => ready.ok().map(|_| GroupWatch { store }),
        }
    }

    /// The groups as the watch has them now.
    pub fn groups(&self) -> Groups {
        Groups::of(self.store.state())
    }
}

/// The managed groups, as the inventory last wrote them.
pub struct Groups {
    pub ownership: Ownership,
    pub by_name: HashMap<(String, String), Arc<NodeGroup>>,
}

impl Groups {
    pub fn of(groups: Vec<Arc<NodeGroup>>) -> Groups {
        Groups {
            ownership: Ownership::of(&groups),
            by_name: groups
                .into_iter()
                .map(|g| ((g.namespace().unwrap_or_default(), g.name_any()), g))
                .collect(),
        }
    }
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

    fn scheduled_change_lead(&self, owner: &Owner) -> chrono::Duration {
        let configured = self
            .by_name
            .get(&(owner.namespace.clone(), owner.group.clone()))
            .map(|g| g.spec.interruption.scheduled_change_lead())
            .unwrap_or(crate::crd::nodegroup::DEFAULT_SCHEDULED_CHANGE_LEAD);
        crate::controllers::group_view::to_chrono(configured)
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
