//! What the authority sees of the control plane: every Master group of the
//! namespace (its spec's count, the inventory's Nodes, the notices recorded
//! on them), its ASGs as AWS describes them now, and kops's control-plane
//! pods, counted by instance. Looked at only by a Master group about to
//! decide on one of its masters.

use super::{ControlPlane, DownWhy, MasterDown};
use crate::cloud::AsgDescription;
use crate::context::Context;
use crate::crd::nodegroup::{NodeInterruption, NoticeClass};
use crate::crd::{NodeGroup, Role};
use crate::k8s::control_plane::{CountedBy, MasterNode, Serving};
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use kube::api::{Api, ListParams};
use std::collections::BTreeSet;

/// The control plane of `namespace`'s Master groups, as AWS and the
/// inventory see it now (one NodeGroup list; one ASG description per
/// group, shared with the group's own controllers for a few seconds).
pub async fn observe(ctx: &Context, namespace: &str) -> Result<ControlPlane> {
    let mut seen = vec![];
    for group in master_groups(ctx, namespace).await? {
        let cloud = ctx.cloud.cloud(group.spec.region.as_deref());
        let fresh = cloud.describe_groups(&group.spec.asg_names()).await?;
        seen.push((group, fresh));
    }
    let groups: Vec<&NodeGroup> = seen.iter().map(|(g, _)| g).collect();
    let unlisted = unlisted_of(&seen, &crate::k8s::control_plane::master_nodes(ctx).await?);
    let extra: BTreeSet<String> = unlisted.iter().map(|n| n.name.clone()).collect();
    let (serving, counted_by) = observe_serving(ctx, &groups, extra).await?;
    let now = ctx.clock.now();
    let mut cp = control_plane_of(&seen, &serving, now);
    count_unlisted(&mut cp, &unlisted, &serving, now);
    cp.counted_by = counted_by;
    Ok(cp)
}

/// Pure: the control-plane Nodes whose instance no described ASG of the
/// Master groups holds, and whose name no group's inventory lists.
pub fn unlisted_of(
    groups: &[(NodeGroup, Vec<AsgDescription>)],
    nodes: &[MasterNode],
) -> Vec<MasterNode> {
    let instances: BTreeSet<&str> = groups
        .iter()
        .flat_map(|(_, fresh)| fresh.iter().flat_map(|a| &a.instances))
        .map(|i| i.instance_id.as_str())
        .collect();
    let names: BTreeSet<&str> = groups
        .iter()
        .flat_map(|(g, _)| g.status.iter().flat_map(|s| s.nodes.iter()))
        .map(|n| n.name.as_str())
        .collect();
    nodes
        .iter()
        .filter(|n| !names.contains(n.name.as_str()))
        .filter(|n| n.instance.as_deref().is_none_or(|i| !instances.contains(i)))
        .cloned()
        .collect()
}

/// Pure: the count cross-checked against the cluster's control-plane
/// Nodes. Each Node the groups do not hold ([`unlisted_of`]) is a master
/// of the cluster (etcd counts it whatever our NodeGroups say): one more
/// expected, up when its Node is Ready and its control plane has served
/// for the default `masterSettleTime`, else down
/// ([`DownWhy::Unlisted`]). One more up and expected leaves every
/// decision as it was, one more down makes each stricter: the cross-check
/// never lets more go than the groups' count alone.
pub fn count_unlisted(
    cp: &mut ControlPlane,
    unlisted: &[MasterNode],
    serving: &Serving,
    now: DateTime<Utc>,
) {
    let settle = chrono::Duration::from_std(crate::crd::nodegroup::DEFAULT_MASTER_SETTLE_TIME)
        .unwrap_or(chrono::Duration::MAX);
    for node in unlisted {
        let id = node.instance.clone().unwrap_or_else(|| node.name.clone());
        cp.expected += 1;
        let settled = serving
            .get(&node.name)
            .and_then(|since| since.checked_add_signed(settle))
            .is_some_and(|until| now >= until);
        if node.ready && settled {
            cp.ready.insert(id);
        } else {
            cp.down.push(MasterDown {
                group: String::new(),
                instance: Some(id),
                why: DownWhy::Unlisted,
            });
        }
    }
}

/// The Master groups of `namespace`.
async fn master_groups(ctx: &Context, namespace: &str) -> Result<Vec<NodeGroup>> {
    let groups = Api::<NodeGroup>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("list NodeGroups in {namespace}")))?;
    Ok(groups
        .items
        .into_iter()
        .filter(|g| g.spec.role == Role::Master)
        .collect())
}

/// Which masters of `namespace`'s Master groups serve, and how they were
/// counted (by control-plane pods, or by Node where no master shows any).
pub async fn serving(ctx: &Context, namespace: &str) -> Result<(Serving, CountedBy)> {
    let groups = master_groups(ctx, namespace).await?;
    observe_serving(ctx, &groups.iter().collect::<Vec<_>>(), BTreeSet::new()).await
}

/// `extra`: masters the groups do not list (see [`unlisted_of`]).
async fn observe_serving(
    ctx: &Context,
    groups: &[&NodeGroup],
    extra: BTreeSet<String>,
) -> Result<(Serving, CountedBy)> {
    let mut masters: BTreeSet<String> = groups
        .iter()
        .flat_map(|g| g.status.iter().flat_map(|s| s.nodes.iter()))
        .map(|n| n.name.clone())
        .collect();
    masters.extend(extra);
    let (serving, counted_by) = crate::k8s::control_plane::observe(ctx, &masters).await?;
    // Said when it changes, not at every look.
    static BY_NODES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let by_nodes = counted_by == CountedBy::Nodes;
    if BY_NODES.swap(by_nodes, std::sync::atomic::Ordering::Relaxed) != by_nodes && by_nodes {
        tracing::warn!(
            masters = masters.len(),
            "no master shows kops's control-plane pods (kube-system pods labelled k8s-app=kube-apiserver or etcd-manager-main): masters are counted by Node Ready plus masterSettleTime"
        );
    }
    Ok((serving, counted_by))
}

/// Whether the loss a notice announces is imminent at `now`: a spot
/// warning, an instance already stopping or terminating, or a scheduled
/// loss from its drain start (the group's `scheduledChangeLead` before AWS
/// takes it: about the time a master takes to be replaced). Before that
/// the master serves etcd like any other, and a dead master elsewhere may
/// be repaired. A rebalance recommendation is a risk, not a loss.
pub fn loss_imminent(notice: &NodeInterruption, now: DateTime<Utc>) -> bool {
    notice.class() != NoticeClass::RebalanceRecommendation && notice.in_force(now)
}

/// Pure: each Master group's masters by instance, counted as etcd counts
/// them. A master is up while its instance is in service, its Node Ready,
/// its control-plane pods (`serving`: the Nodes whose kube-apiserver and
/// etcd-manager are Ready, or, counted by Node, the Ready Nodes) Ready for
/// its group's settle time, and no loss imminent for it. A terminating
/// instance, or one whose loss is imminent, is leaving; a Node Ready whose
/// etcd has not joined yet is joining, and past its group's `joinTimeout`
/// from launch not serving (reported by name; nothing brings it back
/// without the user); a place the group's ASGs have not launched an
/// instance for yet (its count above what is active or leaving) is
/// launching. At most a group's desired count of its masters count as up:
/// an instance beyond it (a replacement launched beside its predecessor)
/// is not an etcd member while the predecessor is there, leaving or not,
/// so the newest such are beside. (kops keeps each etcd member's data on one EBS volume
/// per master place, tagged `k8s.io/etcd/main: <member>/<members>`: kops's
/// docs, "Backing up etcd", and its Terraform output's `ebs.tf`. A volume
/// attaches to one instance at a time, so a second instance in the place
/// has no member until the first lets the volume go: our inference, not
/// a documented etcd-manager behaviour.)
pub fn control_plane_of(
    groups: &[(NodeGroup, Vec<AsgDescription>)],
    serving: &Serving,
    now: DateTime<Utc>,
) -> ControlPlane {
    let mut cp = ControlPlane::default();
    // Allowed only by every Master group that counts: one that does not
    // say so keeps the API up for all.
    let counted = groups.iter().filter(|(_, fresh)| !fresh.is_empty());
    let mut allowing = counted.map(|(g, _)| g.spec.disruption.allow_control_plane_outage);
    cp.outage_allowed = allowing
        .next()
        .is_some_and(|first| first && allowing.all(|a| a));
    for (group, fresh) in groups {
        // None of its ASGs exists (a group naming one that was never made,
        // reported Degraded by its inventory): it has no master, and none
        // is on its way; counting its places as down would hold back every
        // master of the cluster for good.
        if fresh.is_empty() {
            continue;
        }
        cp.expected += group.spec.desired;
        let (up, down) = group_masters(group, fresh, serving, now);
        cp.ready.extend(up);
        cp.down.extend(down);
    }
    cp
}

/// The etcd members among a Master group's instances (`seen`, with what
/// each would be on its own): the oldest not leaving. Where the group has
/// one master per ASG (kops's layout: a place per zone, its etcd volume
/// mounted by one instance), each ASG's oldest is its place's member, and
/// a second instance of an ASG is beside it whatever its age, and beside
/// its predecessor until that one is gone ([`handing_over`]); otherwise
/// the group's oldest, up to its desired count.
fn members<'a>(
    group: &NodeGroup,
    fresh: &[AsgDescription],
    seen: &'a [(String, Result<(), DownWhy>)],
    launched: impl Fn(&str) -> Option<DateTime<Utc>>,
) -> BTreeSet<&'a String> {
    let oldest_first = |ids: &mut Vec<&'a String>| {
        ids.sort_by_key(|id| (launched(id).is_none(), launched(id), id.to_string()));
    };
    let staying = |asg: Option<&AsgDescription>| -> Vec<&'a String> {
        seen.iter()
            .filter(|(_, s)| *s != Err(DownWhy::Leaving))
            .map(|(id, _)| id)
            .filter(|id| asg.is_none_or(|a| a.instances.iter().any(|i| i.instance_id == **id)))
            .collect()
    };
    if !fresh.is_empty() && fresh.len() == group.spec.desired.max(0) as usize {
        return fresh
            .iter()
            .filter(|asg| !handing_over(asg, seen))
            .filter_map(|asg| {
                let mut ids = staying(Some(asg));
                oldest_first(&mut ids);
                ids.into_iter().next()
            })
            .collect();
    }
    let mut ids = staying(None);
    oldest_first(&mut ids);
    ids.into_iter()
        .take(group.spec.desired.max(0) as usize)
        .collect()
}

/// Pure: a place whose ASG still holds a leaving instance (its member
/// terminating, or its loss imminent) is handing over: the etcd volume is
/// the leaving instance's until it is gone, so no newcomer of the place is
/// a member yet, however Ready its pods (kops points each kube-apiserver at
/// the etcd on its own machine, `--etcd-servers=https://127.0.0.1:4001`:
/// kops's `pkg/model/components/apiserver.go`).
fn handing_over(asg: &AsgDescription, seen: &[(String, Result<(), DownWhy>)]) -> bool {
    seen.iter().any(|(id, state)| {
        *state == Err(DownWhy::Leaving) && asg.instances.iter().any(|i| i.instance_id == *id)
    })
}

/// One Master group's masters: the instances up, and those down (with the
/// places not launched yet).
fn group_masters(
    group: &NodeGroup,
    fresh: &[AsgDescription],
    serving: &Serving,
    now: DateTime<Utc>,
) -> (Vec<String>, Vec<MasterDown>) {
    use kube::ResourceExt;
    let name = group.name_any();
    let settle = settle_time(group);
    let join = join_timeout(group);
    let nodes = group.status.as_ref().map(|s| s.nodes.as_slice());
    let nodes = nodes.unwrap_or_default();
    let node_of = |id: &str| nodes.iter().find(|n| n.instance_id.as_deref() == Some(id));
    let mut counted = 0;
    // Each place's instance, with what it would be on its own.
    let mut seen: Vec<(String, Result<(), DownWhy>)> = vec![];
    for instance in fresh.iter().flat_map(|a| &a.instances) {
        let id = &instance.instance_id;
        if !instance.is_active() && !instance.lifecycle_state.starts_with("Terminat") {
            continue; // Standby, detached: not a master place.
        }
        counted += 1;
        let node = node_of(id);
        let in_service = instance.is_in_service();
        let state = match node {
            _ if !instance.is_active() => Err(DownWhy::Leaving),
            Some(n)
                if n.interruption
                    .as_ref()
                    .is_some_and(|i| loss_imminent(i, now)) =>
            {
                Err(DownWhy::Leaving)
            }
            Some(n) if n.ready && in_service && serving.contains_key(&n.name) => {
                // A settle time past what a date can hold (an invalid
                // spec, reported by validation) never ends: no panic.
                let until = serving
                    .get(&n.name)
                    .and_then(|since| since.checked_add_signed(settle))
                    .unwrap_or(DateTime::<Utc>::MAX_UTC);
                match now < until {
                    true => Err(DownWhy::Settling { until }),
                    false => Ok(()),
                }
            }
            Some(n) if n.ready && in_service => {
                let stuck = n
                    .launch_time
                    .and_then(|t| t.checked_add_signed(join))
                    .is_some_and(|t| now >= t);
                match stuck {
                    true => Err(DownWhy::NotServing),
                    false => Err(DownWhy::Joining),
                }
            }
            Some(_) if in_service => Err(DownWhy::NotReady),
            _ => Err(DownWhy::Launching),
        };
        seen.push((id.clone(), state));
    }
    let members = members(group, fresh, &seen, |id| {
        node_of(id).and_then(|n| n.launch_time)
    });
    let mut up = vec![];
    let mut down = vec![];
    for (id, state) in &seen {
        let state = match state {
            // Not its place's member: whatever its pods show, it serves no
            // etcd until its place is its (neither stuck nor settling).
            Ok(()) | Err(DownWhy::Joining | DownWhy::NotServing | DownWhy::Settling { .. })
                if !members.contains(id) =>
            {
                Err(DownWhy::Beside)
            }
            other => *other,
        };
        match state {
            Ok(()) => up.push(id.clone()),
            Err(why) => down.push(MasterDown {
                group: name.clone(),
                instance: Some(id.clone()),
                why,
            }),
        }
    }
    for _ in counted..group.spec.desired {
        down.push(MasterDown {
            group: name.clone(),
            instance: None,
            why: DownWhy::Launching,
        });
    }
    (up, down)
}

/// The group's `replenish.joinTimeout`, its default when it does not
/// parse (reported by validation).
fn join_timeout(group: &NodeGroup) -> chrono::Duration {
    let set = crate::duration::parse(&group.spec.replenish.join_timeout).ok();
    let join = set.unwrap_or(std::time::Duration::from_secs(900));
    chrono::Duration::from_std(join).unwrap_or(chrono::Duration::MAX)
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
