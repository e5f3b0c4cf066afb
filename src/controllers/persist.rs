//! Status is the memory: the persist-then-act step both child controllers'
//! executors make each action through, and their status writes.

use crate::context::Context;
use crate::error::Error;
use kube::Resource;
use serde::de::DeserializeOwned;
use std::future::Future;

/// The one persist-then-act step of the child controllers: the status that records
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
    write_if_changed::<K, S>(ctx, (namespace, name), written, next).await?;
    crate::crash_points::crash_point(&format!("{step}:persisted"));
    let done = act().await?;
    crate::crash_points::crash_point(&format!("{step}:acted"));
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
