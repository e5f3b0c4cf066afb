//! One eviction through the `pods/eviction` subresource, with the body
//! written here rather than by kube's `Api::evict`.
//!
//! kube-core 5.0's `Request::evict` serialises `EvictParams` as
//! `{"delete_options": ..., "metadata": ...}`, with neither `apiVersion` nor
//! `kind`, and the Eviction type's field is `deleteOptions`: the apiserver
//! drops the unknown key, so a grace period given there never arrives and
//! each pod keeps its own `terminationGracePeriodSeconds` (a pod with 300 s
//! outlives a spot warning's two minutes). Here the body is a proper
//! Eviction, `policy/v1`, or `policy/v1beta1` on an apiserver older than
//! 1.22 (remembered once it has refused `policy/v1`).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use std::sync::atomic::{AtomicBool, Ordering};

/// The Eviction version to send: `policy/v1` until the apiserver refused
/// it (`legacy`, remembered in the context).
fn api_version(legacy: &AtomicBool) -> &'static str {
    match legacy.load(Ordering::Relaxed) {
        true => "policy/v1beta1",
        false => "policy/v1",
    }
}

/// Pure: the Eviction of `namespace/name`, its pods' grace period set to
/// `grace_seconds` when given.
pub fn body(
    api_version: &str,
    namespace: &str,
    name: &str,
    grace_seconds: Option<i64>,
) -> serde_json::Value {
    let mut eviction = serde_json::json!({
        "apiVersion": api_version,
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    });
    if let Some(grace) = grace_seconds {
        eviction["deleteOptions"] = serde_json::json!({"gracePeriodSeconds": grace.max(0)});
    }
    eviction
}

/// Pure: whether the apiserver's answer says it does not know the Eviction
/// version sent (an apiserver older than `policy/v1`'s Eviction, 1.22).
pub fn version_refused(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(s) => {
            matches!(s.code, 400 | 404 | 415 | 422)
                && (s.message.contains("no kind \"Eviction\" is registered")
                    || s.message.contains("policy/v1"))
        }
        _ => false,
    }
}

/// Evicts `name` through `api` (a namespaced Pod API), its grace period
/// capped at `grace_seconds` when given. Errors are the apiserver's: 429
/// for a budget's refusal, 404 for a pod already gone.
pub async fn evict(
    api: &Api<Pod>,
    namespace: &str,
    name: &str,
    grace_seconds: Option<i64>,
    legacy: &AtomicBool,
) -> Result<(), kube::Error> {
    let send = |api_version: &str| {
        let eviction = body(api_version, namespace, name, grace_seconds);
        async move {
            api.create_subresource::<_, serde_json::Value>(
                "eviction",
                name,
                &PostParams::default(),
                &eviction,
            )
            .await
            .map(|_| ())
        }
    };
    let first = api_version(legacy);
    match send(first).await {
        Err(e) if first == "policy/v1" && version_refused(&e) => {
            legacy.store(true, Ordering::Relaxed);
            send("policy/v1beta1").await
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_period_is_in_delete_options_as_the_apiserver_reads_it() {
        let capped = body("policy/v1", "default", "web-1", Some(20));
        assert_eq!(
            capped,
            serde_json::json!({
                "apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "web-1", "namespace": "default"},
                "deleteOptions": {"gracePeriodSeconds": 20}
            })
        );
        let own = body("policy/v1", "default", "web-1", None);
        assert!(own.get("deleteOptions").is_none(), "the pod's own grace");
        assert_eq!(
            body("policy/v1beta1", "ns", "p", Some(-5))["deleteOptions"]["gracePeriodSeconds"],
            0
        );
    }

    #[test]
    fn only_an_unknown_version_falls_back() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.into(),
                ..Default::default()
            }))
        };
        assert!(version_refused(&status(
            400,
            "no kind \"Eviction\" is registered for version \"policy/v1\" in scheme"
        )));
        assert!(!version_refused(&status(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget."
        )));
        assert!(!version_refused(&status(404, "pods \"web-1\" not found")));
    }
}
