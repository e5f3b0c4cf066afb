//! What the authority sees of the control plane: every Master group of the
//! namespace (its spec's count, the inventory's Nodes, the notices recorded
//! on them), its ASGs as AWS describes them now, and kops's control-plane
//! pods, counted by instance. Looked at only by a Master group about to
//! decide on one of its masters.

use super::{ControlPlane, DownWhy, MasterDown};
use crate::cloud::AsgDescription;
use crate::context::Context;
use crate::controllers::group_view::Fate;
use crate::crd::nodegroup::NodeInterruption;
use crate::crd::{NodeGroup, Role};
use crate::k8s::control_plane::Serving;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use kube::api::{Api, ListParams};

/// The control plane of `namespace`'s Master groups, as AWS and the
/// inventory see it now (one NodeGroup list; one ASG description per
/// group, shared with the group's own controllers for a few seconds).
pub async fn observe(ctx: &Context, namespace: &str) -> Result<ControlPlane> {
    let groups = Api::<NodeGroup>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("list NodeGroups in {namespace}")))?;
    let mut seen = vec![];
    for group in groups.items {
        if group.spec.role != Role::Master {
            continue;
        }
        let cloud = ctx.cloud.cloud(group.spec.region.as_deref());
        let fresh = cloud.describe_groups(&group.spec.asg_names()).await?;
        seen.push((group, fresh));
    }
    let serving = crate::k8s::control_plane::ready_nodes(ctx).await?;
    Ok(control_plane_of(&seen, &serving, ctx.clock.now()))
}

/// Whether the loss a notice announces is imminent at `now`: a spot
/// warning, an instance already stopping or terminating, or a scheduled
/// loss from its drain start (the group's `scheduledChangeLead` before AWS
/// takes it: about the time a master takes to be replaced). Before that
/// the master serves etcd like any other, and a dead master elsewhere may
/// be repaired. A rebalance recommendation is a risk, not a loss.
pub fn loss_imminent(notice: &NodeInterruption, now: DateTime<Utc>) -> bool {
    match Fate::of(notice) {
        Fate::AtRisk => false,
        Fate::Lost | Fate::Reclaimed { .. } => notice.in_force(now),
    }
}

/// Pure: each Master group's masters by instance, counted as etcd counts
/// them. A master is up while its instance is in service, its Node Ready,
/// its control-plane pods (`serving`: the Nodes whose kube-apiserver and
/// etcd-manager are Ready) Ready, and no loss imminent for it. A
/// terminating instance, or one whose loss is imminent, is leaving; a Node
/// Ready whose etcd has not joined yet is joining; a place the group's
/// ASGs have not launched an instance for yet (its count above what is
/// active or leaving) is launching.
pub fn control_plane_of(
    groups: &[(NodeGroup, Vec<AsgDescription>)],
    serving: &Serving,
    now: DateTime<Utc>,
) -> ControlPlane {
    let mut cp = ControlPlane::default();
    for (group, fresh) in groups {
        use kube::ResourceExt;
        // None of its ASGs exists (a group naming one that was never made,
        // reported Degraded by its inventory): it has no master, and none
        // is on its way; counting its places as down would hold back every
        // master of the cluster for good.
        if fresh.is_empty() {
            continue;
        }
        let name = group.name_any();
        let settle = settle_time(group);
        cp.expected += group.spec.desired;
        let nodes = group.status.as_ref().map(|s| s.nodes.as_slice());
        let nodes = nodes.unwrap_or_default();
        let mut counted = 0;
        for instance in fresh.iter().flat_map(|a| &a.instances) {
            let id = &instance.instance_id;
            if !instance.is_active() && !instance.lifecycle_state.starts_with("Terminat") {
                continue; // Standby, detached: not a master place.
            }
            counted += 1;
            let node = nodes.iter().find(|n| n.instance_id.as_ref() == Some(id));
            let in_service = instance.is_in_service();
            let why = match node {
                _ if !instance.is_active() => DownWhy::Leaving,
                Some(n)
                    if n.interruption
                        .as_ref()
                        .is_some_and(|i| loss_imminent(i, now)) =>
                {
                    DownWhy::Leaving
                }
                Some(n) if n.ready && in_service && serving.contains_key(&n.name) => {
                    // A settle time past what a date can hold (an invalid
                    // spec, reported by validation) never ends: no panic.
                    let until = serving
                        .get(&n.name)
                        .and_then(|since| since.checked_add_signed(settle))
                        .unwrap_or(DateTime::<Utc>::MAX_UTC);
                    if now < until {
                        DownWhy::Settling { until }
                    } else {
                        cp.ready.insert(id.clone());
                        continue;
                    }
                }
                Some(n) if n.ready && in_service => DownWhy::Joining,
                Some(_) if in_service => DownWhy::NotReady,
                _ => DownWhy::Launching,
            };
            cp.down.push(MasterDown {
                group: name.clone(),
                instance: Some(id.clone()),
                why,
            });
        }
        for _ in counted..group.spec.desired {
            cp.down.push(MasterDown {
                group: name.clone(),
                instance: None,
                why: DownWhy::Launching,
            });
        }
    }
    cp
}

/// The group's `refresh.masterSettleTime`, its default without a refresh
/// (a value that does not parse is reported by validation; the default
/// holds meanwhile).
fn settle_time(group: &NodeGroup) -> chrono::Duration {
    let set = group
        .spec
        .refresh
        .as_ref()
        .and_then(|r| crate::duration::parse(&r.master_settle_time).ok());
    let settle = set.unwrap_or(crate::crd::nodegroup::DEFAULT_MASTER_SETTLE_TIME);
    chrono::Duration::from_std(settle).unwrap_or(chrono::Duration::MAX)
}
