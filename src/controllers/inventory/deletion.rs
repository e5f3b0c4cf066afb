//! Deleting a NodeGroup. The inventory puts a finalizer on every group, so a
//! deletion waits until the group's work is unwound: a refresh run failed
//! into its scale-down (drain given up and uncordoned, surplus removed, every
//! ASG back at its recorded count), a replenisher scale-in given back or
//! finished, the group's lock free. Only then is the finalizer removed and
//! the garbage collector takes the Refresher and Replenisher. Without it the
//! collector deletes them at once and a run's records (the counts to restore,
//! the surplus it added, the node it cordoned) are lost mid-run.

use crate::context::Context;
use crate::crd::labels::FINALIZER;
use crate::crd::nodegroup::OperationLock;
use crate::crd::refresher::RefresherStatus;
use crate::crd::replenisher::ReplenisherStatus;
use crate::crd::{NodeGroup, Refresher, Replenisher};
use crate::k8s::lock;
use crate::mutation::Intent;
use crate::{Error, Result};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

/// What a group's children are doing, as far as its deletion cares.
#[derive(Debug, Default)]
pub struct Children<'a> {
    pub refresher: Option<&'a RefresherStatus>,
    pub replenisher: Option<&'a ReplenisherStatus>,
    /// The group's lock, if its holder still exists.
    pub lock: Option<&'a OperationLock>,
}

/// Pure: what the deletion still waits for, or None when nothing is under
/// way and the finalizer can go.
pub fn waiting_for(children: &Children) -> Option<String> {
    let mut waits = vec![];
    if let Some(rf) = children.refresher.filter(|s| s.run_start.is_some()) {
        waits.push(format!(
            "the refresh run to unwind (phase {:?}: {})",
            rf.phase,
            rf.message.as_deref().unwrap_or("-")
        ));
    }
    if let Some(rp) = children.replenisher {
        if let Some(target) = &rp.scale_in {
            waits.push(format!(
                "the replenisher's scale-in of {} to end",
                target.node
            ));
        }
        if let Some(cleanup) = &rp.cleanup {
            waits.push(format!(
                "the replenisher's removal of {} to end",
                cleanup.instance_id
            ));
        }
    }
    if let Some(lock) = children.lock {
        waits.push(format!(
            "{:?} {} to release the group's lock",
            lock.holder, lock.holder_name
        ));
    }
    (!waits.is_empty()).then(|| waits.join("; "))
}

pub fn has_finalizer(group: &NodeGroup) -> bool {
    group.finalizers().iter().any(|f| f == FINALIZER)
}

/// Reads the children and the lock holder: what the deletion waits for.
pub async fn observe_waits(
    ctx: &Context,
    group: &NodeGroup,
    namespace: &str,
    name: &str,
) -> Result<Option<String>> {
    let refresher = Api::<Refresher>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get Refresher {namespace}/{name}")))?;
    let replenisher = Api::<Replenisher>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get Replenisher {namespace}/{name}")))?;
    let held = group.status.as_ref().and_then(|s| s.operation.as_ref());
    let lock = match held {
        Some(l) if lock::holder_exists(&ctx.client, namespace, l).await? => Some(l),
        _ => None,
    };
    Ok(waiting_for(&Children {
        refresher: refresher.as_ref().and_then(|r| r.status.as_ref()),
        replenisher: replenisher.as_ref().and_then(|r| r.status.as_ref()),
        lock,
    }))
}

/// Adds our finalizer (a live group) or removes it (a group whose deletion
/// waits for nothing more). A merge patch carrying the resourceVersion we
/// read: if the group changed since (a lock taken), it fails with a conflict
/// and the next reconcile decides again.
pub async fn set_finalizer(ctx: &Context, group: &NodeGroup, present: bool) -> Result<()> {
    let namespace = group.namespace().unwrap_or_default();
    let name = group.name_any();
    let version = lock::version_read(group)?;
    let mut finalizers: Vec<String> = group
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(FINALIZER.to_string());
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": version, "finalizers": finalizers},
    });
    let api: Api<NodeGroup> = Api::namespaced(ctx.client.clone(), &namespace);
    let action = if present {
        "add_finalizer"
    } else {
        "remove_finalizer"
    };
    ctx.mutations
        .perform(
            Intent::own(action, format!("NodeGroup/{namespace}/{name}")),
            || async {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(Error::kube(format!(
                        "{action} on NodeGroup {namespace}/{name}"
                    )))
            },
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::nodegroup::OperationKind;
    use crate::crd::refresher::RefreshPhase;
    use crate::crd::replenisher::ScaleInTarget;
    use chrono::{TimeZone, Utc};

    #[test]
    fn nothing_under_way_lets_the_deletion_go_on() {
        assert_eq!(waiting_for(&Children::default()), None);
        let idle = RefresherStatus::default();
        let steady = ReplenisherStatus::default();
        assert_eq!(
            waiting_for(&Children {
                refresher: Some(&idle),
                replenisher: Some(&steady),
                lock: None,
            }),
            None
        );
    }

    #[test]
    fn a_run_a_scale_in_or_a_held_lock_each_hold_the_deletion_and_are_named() {
        let t = Utc.with_ymd_and_hms(2026, 11, 23, 0, 0, 0).unwrap();
        let running = RefresherStatus {
            run_start: Some(t),
            phase: RefreshPhase::ScalingDown,
            message: Some("draining surplus node n9".into()),
            ..Default::default()
        };
        let scaling_in = ReplenisherStatus {
            scale_in: Some(ScaleInTarget {
                node: "n4".into(),
                instance_id: "i-4".into(),
                auto_scaling_group: "a".into(),
                since: t,
                terminating: None,
                decrement: true,
                repair: false,
                reason: None,
            }),
            ..Default::default()
        };
        let lock = OperationLock {
            holder: OperationKind::Replenish,
            holder_name: "workers".into(),
            since: t,
        };
        let run = waiting_for(&Children {
            refresher: Some(&running),
            ..Default::default()
        })
        .expect("waits");
        assert!(
            run.contains("ScalingDown") && run.contains("draining surplus node n9"),
            "{run}"
        );
        let scale_in = waiting_for(&Children {
            replenisher: Some(&scaling_in),
            ..Default::default()
        })
        .expect("waits");
        assert!(scale_in.contains("n4"), "{scale_in}");
        let held = waiting_for(&Children {
            lock: Some(&lock),
            ..Default::default()
        })
        .expect("waits");
        assert!(held.contains("Replenish workers"), "{held}");
    }
}
