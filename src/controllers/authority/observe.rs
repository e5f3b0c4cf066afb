//! What the authority sees of the control plane: every Master group of the
//! namespace (its spec's count, the inventory's Nodes) and its ASGs as AWS
//! describes them now, counted by instance. Looked at only by a Master
//! group about to decide on one of its masters.

use super::{ControlPlane, DownWhy, MasterDown};
use crate::cloud::AsgDescription;
use crate::context::Context;
use crate::controllers::group_view::group_nodes;
use crate::crd::{NodeGroup, Role};
use crate::{Error, Result};
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
    Ok(control_plane_of(&seen))
}

/// Pure: each Master group's masters by instance. An active instance is
/// Ready only with a Ready Node that is not leaving; a terminating one is
/// leaving; a place the group's ASGs have not launched an instance for yet
/// (its count above what is active or leaving) is launching.
pub fn control_plane_of(groups: &[(NodeGroup, Vec<AsgDescription>)]) -> ControlPlane {
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
        cp.expected += group.spec.desired;
        let status_nodes = group.status.as_ref().map(|s| s.nodes.as_slice());
        let nodes = group_nodes(status_nodes.unwrap_or_default(), fresh);
        let mut counted = 0;
        for instance in fresh.iter().flat_map(|a| &a.instances) {
            let id = &instance.instance_id;
            let node = nodes.iter().find(|n| n.instance_id.as_ref() == Some(id));
            let why = match node {
                _ if !instance.is_active() => {
                    if !instance.lifecycle_state.starts_with("Terminat") {
                        continue; // Standby, detached: not a master place.
                    }
                    DownWhy::Leaving
                }
                Some(n) if n.ready => {
                    counted += 1;
                    cp.ready.insert(id.clone());
                    continue;
                }
                Some(n) if n.fate.is_some() => DownWhy::Leaving,
                Some(_) if instance.is_in_service() => DownWhy::NotReady,
                _ => DownWhy::Launching,
            };
            counted += 1;
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
