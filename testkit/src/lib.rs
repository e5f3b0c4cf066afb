//! Test support for spot-node-manager, kept out of the product: the
//! simulated kubelet ([`sim`], and the `sim-kubelet` binary the demo runs)
//! that turns the emulator's instances into Nodes, and what the integration
//! tests and benches build on, by topic: the local control plane
//! ([`plane`]), an isolated world per test ([`world`]), kops-like ASGs in it
//! ([`kops`]) and what kops does to them ([`kops_rolling`]), Kubernetes objects in it ([`cluster`]), a manager process
//! ([`manager`]), refresh helpers ([`refresh`]), a Deployment with a budget
//! and its availability ([`workload`]), maintenance windows and disruption
//! slots ([`windows`]). The product crate uses it as
//! a dev-dependency only; `cargo install --path .` installs the manager alone.
//!
//! Tests use it as `use snm_testkit as support;`.

pub mod cluster;
pub mod interruption;
pub mod kops;
pub mod kops_rolling;
pub mod manager;
pub mod plane;
pub mod proxy;
pub mod refresh;
pub mod sim;
pub mod steady;
pub mod timeline;
pub mod windows;
pub mod workload;
pub mod world;

pub use cluster::*;
pub use kops::*;
pub use manager::*;
pub use plane::*;
pub use world::*;

use std::time::{Duration, Instant};

/// Polls `check` until it returns Some or `timeout` passes.
pub async fn assert_eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
