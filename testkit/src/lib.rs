//! Test support for spot-node-manager, kept out of the product: the
//! simulated kubelet ([`sim`], and the `sim-kubelet` binary the demo runs)
//! that turns the emulator's instances into Nodes, and what the integration
//! tests and benches build on, by topic: the local control plane
//! ([`plane`]), an isolated world per test ([`world`]), kops-like ASGs in it
//! ([`kops`]) and what kops does to them ([`kops_rolling`]), Kubernetes objects in it ([`cluster`]), a manager process
//! ([`manager`]), refresh helpers ([`refresh`]), recorders running beside a
//! test ([`recorders`]), a Deployment with a budget
//! and its availability ([`workload`]), maintenance windows and disruption
//! slots ([`windows`]). The product crate uses it as
//! a dev-dependency only; `cargo install --path .` installs the manager alone.
//!
//! Tests use it as `use snm_testkit as support;`.

pub mod cluster;
pub mod coverage;
pub mod interruption;
pub mod kops;
pub mod kops_rolling;
pub mod manager;
pub mod plane;
pub mod proxy;
pub mod recorders;
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

/// Takes `samples` samples `every` apart. `check` returns None when it
/// could not read what it checks (and asserts on what it did read); fails
/// unless at least `at_least` samples were read, since a check that read
/// nothing checked nothing. Returns how many were read.
pub async fn sample_checked<F, Fut>(
    what: &str,
    samples: usize,
    at_least: usize,
    every: Duration,
    mut check: F,
) -> usize
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let mut read = 0;
    for _ in 0..samples {
        if check().await.is_some() {
            read += 1;
        }
        tokio::time::sleep(every).await;
    }
    assert!(
        read >= at_least,
        "{what}: only {read} of {samples} samples could be read (at least {at_least} needed)"
    );
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sampled_check_that_reads_enough_passes_and_counts() {
        let mut n = 0;
        let read = sample_checked("every other", 6, 3, Duration::ZERO, || {
            n += 1;
            let got = (n % 2 == 0).then_some(());
            async move { got }
        })
        .await;
        assert_eq!(read, 3);
    }

    /// Unreadable metrics (every sample None) used to pass by checking
    /// nothing.
    #[tokio::test]
    #[should_panic(expected = "only 0 of 5 samples could be read")]
    async fn a_sampled_check_that_reads_nothing_fails() {
        sample_checked("never read", 5, 1, Duration::ZERO, || async { None }).await;
    }
}
