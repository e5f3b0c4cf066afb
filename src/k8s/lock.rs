//! The group's operation lock: refresh and replenish never run at once.
//!
//! Held in `NodeGroup.status.operation`. Taking and releasing it is a
//! compare-and-swap: a merge patch of the status carrying the
//! resourceVersion we read, so of two writers racing from the same version
//! exactly one wins (the other gets 409). The holder's name is recorded, so a
//! restarted manager resumes as the holder; a holder whose custom resource no
//! longer exists does not keep the lock.

use crate::context::Context;
use crate::crd::NodeGroup;
use crate::crd::nodegroup::{OperationKind, OperationLock};
use crate::mutation::Intent;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

/// Who wants the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub kind: OperationKind,
    /// Name of the Refresher or Replenisher.
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockDecision {
    /// Free (or its holder is gone): take it.
    Take,
    /// We hold it already (e.g. after a restart).
    Ours,
    /// Someone else holds it.
    HeldBy(OperationLock),
}

/// Pure. `holder_exists` says whether the current holder's resource exists.
pub fn decide(current: Option<&OperationLock>, me: &Holder, holder_exists: bool) -> LockDecision {
    match current {
        None => LockDecision::Take,
        Some(lock) if lock.holder == me.kind && lock.holder_name == me.name => LockDecision::Ours,
        Some(_) if !holder_exists => LockDecision::Take,
        Some(lock) => LockDecision::HeldBy(lock.clone()),
    }
}

/// The lock as a plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// Free, or held by an operation whose resource is gone.
    Free,
    Ours,
    /// Held by another operation, named.
    Other(String),
}

/// Observes the group's lock from `me`'s side.
pub async fn observe(
    client: &kube::Client,
    namespace: &str,
    current: Option<&OperationLock>,
    me: &Holder,
) -> Result<LockState> {
    let exists = match current {
        Some(lock) if !(lock.holder == me.kind && lock.holder_name == me.name) => {
            holder_exists(client, namespace, lock).await?
        }
        _ => true,
    };
    Ok(match decide(current, me, exists) {
        LockDecision::Take => LockState::Free,
        LockDecision::Ours => LockState::Ours,
        LockDecision::HeldBy(l) => LockState::Other(format!("{:?} {}", l.holder, l.holder_name)),
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// We hold the lock (newly or already).
    Yes,
    /// Held by another operation.
    No(OperationLock),
    /// Lost a race (the group changed under us): try again later.
    Conflict,
}

/// Does the resource named by a lock still exist?
pub async fn holder_exists(
    client: &kube::Client,
    namespace: &str,
    lock: &OperationLock,
) -> Result<bool> {
    let exists = match lock.holder {
        OperationKind::Refresh => {
            Api::<crate::crd::Refresher>::namespaced(client.clone(), namespace)
                .get_opt(&lock.holder_name)
                .await
                .map_err(Error::kube("get lock holder"))?
                .is_some()
        }
        OperationKind::Replenish => {
            Api::<crate::crd::Replenisher>::namespaced(client.clone(), namespace)
                .get_opt(&lock.holder_name)
                .await
                .map_err(Error::kube("get lock holder"))?
                .is_some()
        }
    };
    Ok(exists)
}

/// Takes the lock on `group` for `me` if it is free, ours, or orphaned.
pub async fn acquire(
    ctx: &Context,
    group: &NodeGroup,
    me: &Holder,
    now: DateTime<Utc>,
) -> Result<Acquired> {
    let namespace = group.namespace().unwrap_or_default();
    let current = group.status.as_ref().and_then(|s| s.operation.as_ref());
    let exists = match current {
        Some(lock) => holder_exists(&ctx.client, &namespace, lock).await?,
        None => false,
    };
    match decide(current, me, exists) {
        LockDecision::Ours => Ok(Acquired::Yes),
        LockDecision::HeldBy(lock) => Ok(Acquired::No(lock)),
        LockDecision::Take => {
            let lock = OperationLock {
                holder: me.kind,
                holder_name: me.name.clone(),
                since: now,
            };
            let value = serde_json::to_value(&lock).map_err(|source| Error::Serialization {
                context: "operation lock".into(),
                source,
            })?;
            match cas_operation(ctx, group, value, "take_lock").await? {
                true => Ok(Acquired::Yes),
                false => Ok(Acquired::Conflict),
            }
        }
    }
}

/// Releases the lock if `me` holds it. Ok(false) on a lost race.
pub async fn release(ctx: &Context, group: &NodeGroup, me: &Holder) -> Result<bool> {
    let current = group.status.as_ref().and_then(|s| s.operation.as_ref());
    match decide(current, me, true) {
        LockDecision::Ours => {
            cas_operation(ctx, group, serde_json::Value::Null, "release_lock").await
        }
        // Not ours (or already free): nothing to release.
        LockDecision::Take | LockDecision::HeldBy(_) => Ok(true),
    }
}

/// The resourceVersion a group was read at: a merge patch carrying it is a
/// compare-and-swap (409 if the group changed since).
pub(crate) fn version_read(group: &NodeGroup) -> Result<String> {
    group.resource_version().ok_or_else(|| {
        Error::InvalidObject(format!(
            "NodeGroup {}/{} has no resourceVersion",
            group.namespace().unwrap_or_default(),
            group.name_any()
        ))
    })
}

/// Writes `status.operation` only if the group is still at the version read.
async fn cas_operation(
    ctx: &Context,
    group: &NodeGroup,
    operation: serde_json::Value,
    action: &'static str,
) -> Result<bool> {
    let namespace = group.namespace().unwrap_or_default();
    let name = group.name_any();
    let version = version_read(group)?;
    let api: Api<NodeGroup> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": version},
        "status": {"operation": operation},
    });
    let result = ctx
        .mutations
        .perform(
            Intent::own(action, format!("nodegroup/{namespace}/{name}")),
            || async {
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(Error::kube(format!(
                        "{action} on NodeGroup {namespace}/{name}"
                    ))(e)),
                }
            },
        )
        .await?;
    Ok(result.performed().unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn lock(kind: OperationKind, name: &str) -> OperationLock {
        OperationLock {
            holder: kind,
            holder_name: name.into(),
            since: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
        }
    }

    fn me() -> Holder {
        Holder {
            kind: OperationKind::Replenish,
            name: "workers".into(),
        }
    }

    #[test]
    fn a_free_lock_is_taken() {
        assert_eq!(decide(None, &me(), false), LockDecision::Take);
    }

    #[test]
    fn our_own_lock_is_resumed_after_a_restart() {
        assert_eq!(
            decide(
                Some(&lock(OperationKind::Replenish, "workers")),
                &me(),
                true
            ),
            LockDecision::Ours
        );
    }

    #[test]
    fn a_live_refresh_blocks_the_replenisher() {
        let held = lock(OperationKind::Refresh, "workers");
        assert_eq!(decide(Some(&held), &me(), true), LockDecision::HeldBy(held));
    }

    #[test]
    fn a_lock_whose_holder_was_deleted_is_taken_over() {
        assert_eq!(
            decide(Some(&lock(OperationKind::Refresh, "gone")), &me(), false),
            LockDecision::Take
        );
    }

    #[test]
    fn same_name_other_kind_is_not_ours() {
        let held = lock(OperationKind::Refresh, "workers");
        assert!(matches!(
            decide(Some(&held), &me(), true),
            LockDecision::HeldBy(_)
        ));
    }
}
