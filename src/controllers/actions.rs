//! What the child controllers do, and in which order: the one
//! persist-then-act executor, status writes, and the AWS mutations they make
//! (each through the mutation gate).

use super::vocabulary::DesiredChange;
use crate::context::Context;
use crate::error::Error;
use crate::mutation::{Applied, Intent};
use kube::Resource;
use serde::de::DeserializeOwned;
use std::future::Future;

/// The one executor of the child controllers' steps: the status that records
/// what is about to be done is written first (when it changed), then the
/// action runs. Killed between the two, the next reconcile finds the record
/// and settles it against what AWS and the cluster say; killed before the
/// write, nothing was decided. `written` tracks what is stored.
pub async fn persist_then<K, S, T, F, Fut>(
    ctx: &Context,
    (namespace, name): (&str, &str),
    written: &mut Option<S>,
    next: &S,
    step: &str,
    act: F,
) -> Result<T, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    S: serde::Serialize + PartialEq + Clone,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    if written.as_ref() != Some(next) {
        ctx.apply_status::<K>(namespace, name, next).await?;
        *written = Some(next.clone());
    }
    crate::fault::crash_point(&format!("{step}:persisted"));
    let done = act().await?;
    crate::fault::crash_point(&format!("{step}:acted"));
    Ok(done)
}

/// Writes the status when it differs from what is stored.
pub async fn write_if_changed<K, S>(
    ctx: &Context,
    (namespace, name): (&str, &str),
    written: &mut Option<S>,
    next: &S,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    S: serde::Serialize + PartialEq + Clone,
{
    if written.as_ref() != Some(next) {
        ctx.apply_status::<K>(namespace, name, next).await?;
        *written = Some(next.clone());
    }
    Ok(())
}

/// Sets an ASG's desired capacity, through the mutation gate.
pub async fn set_desired_capacity(
    ctx: &Context,
    cloud: &dyn crate::cloud::Cloud,
    change: &DesiredChange,
    why: &str,
) -> Result<Applied<()>, Error> {
    ctx.mutations
        .perform(
            Intent::aws(
                "set_desired_capacity",
                format!("asg/{}", change.asg),
                format!("{} -> {} ({why})", change.from, change.to),
            ),
            || cloud.set_desired_capacity(&change.asg, change.to),
        )
        .await
}

/// Terminates an instance through its ASG (with or without decrementing its
/// desired count), through the mutation gate.
pub async fn terminate_in_group(
    ctx: &Context,
    cloud: &dyn crate::cloud::Cloud,
    instance_id: &str,
    decrement: bool,
    why: String,
) -> Result<Applied<()>, Error> {
    ctx.mutations
        .perform(
            Intent::aws(
                "terminate_instance_in_auto_scaling_group",
                format!("instance/{instance_id}"),
                why,
            ),
            || cloud.terminate_in_group(instance_id, decrement),
        )
        .await
}
