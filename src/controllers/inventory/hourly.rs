//! What the inventory describes of each ASG beside its description, at
//! most once an hour (its terminate lifecycle hooks, its warm pool): one
//! call per ASG an hour, shared by every group's reconcile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::warn;

/// How long one description serves.
pub const FRESH: Duration = Duration::from_secs(3600);

/// A description of an ASG, and when it was made.
type Described<T> = (Instant, Arc<T>);

/// The last description of each ASG.
pub struct Hourly<T>(std::sync::Mutex<BTreeMap<String, Described<T>>>);

impl<T> Default for Hourly<T> {
    fn default() -> Self {
        Self(Default::default())
    }
}

impl<T> Hourly<T> {
    fn cached(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Described<T>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Each of `asgs` described (by `describe`, unless described within the
    /// hour); None while one of them cannot be (`what` and the IAM action
    /// are logged).
    pub async fn get<F, Fut>(
        &self,
        asgs: &[String],
        what: &str,
        describe: F,
    ) -> Option<Vec<(String, Arc<T>)>>
    where
        // The ASG's name owned: a closure over a borrowed one would make
        // the reconcile's future not Send (a higher-ranked bound).
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = crate::Result<T>>,
    {
        let mut out = vec![];
        for asg in asgs {
            // The lock is not held across the call: one group's slow
            // describe never holds up another group's sync.
            let known = self
                .cached()
                .get(asg)
                .filter(|(at, _)| at.elapsed() < FRESH)
                .map(|(_, found)| found.clone());
            let described = match known {
                Some(found) => found,
                None => match describe(asg.clone()).await {
                    Ok(found) => {
                        let found = Arc::new(found);
                        self.cached()
                            .insert(asg.clone(), (Instant::now(), found.clone()));
                        found
                    }
                    Err(e) => {
                        warn!(asg = %asg, error = %e, "cannot describe {what}");
                        return None;
                    }
                },
            };
            out.push((asg.clone(), described));
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn each_asg_is_described_once_within_the_hour_and_a_failure_says_not_known() {
        let hourly = Hourly::<usize>::default();
        let calls = AtomicUsize::new(0);
        let describe = |asg: String| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match asg.as_str() {
                    "bad" => Err(crate::Error::InvalidObject("denied".into())),
                    _ => Ok(asg.len()),
                }
            }
        };
        let asgs = ["a".to_string(), "bb".to_string()];
        let first = hourly.get(&asgs, "x", &describe).await.expect("known");
        assert_eq!(first.iter().map(|(_, n)| **n).collect::<Vec<_>>(), [1, 2]);
        assert!(hourly.get(&asgs, "x", &describe).await.is_some());
        assert_eq!(calls.load(Ordering::SeqCst), 2, "described once each");
        let with_bad = ["a".to_string(), "bad".to_string()];
        assert_eq!(hourly.get(&with_bad, "x", &describe).await, None);
        assert_eq!(calls.load(Ordering::SeqCst), 3, "a, known; bad, asked");
    }
}
