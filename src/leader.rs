//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! Follows client-go's algorithm: another holder's lease counts as expired only
//! after we have seen its record unchanged for its whole duration *on our own
//! clock*, so clock skew between replicas cannot cause two leaders. A leader
//! that cannot renew within `renew_deadline` (shorter than the lease duration)
//! stops leading on its own clock before anyone else may take over.
//!
//! [`Leadership::is_leading`] (in `leadership`, below the clients it fences) checks that deadline on every call, and the
//! mutation gateway asks it before every mutation, so a replica that loses the
//! lease stops mutating at once, even while its controllers are still winding down.

use crate::config::LeaderElectionSettings;
use crate::leadership::Leadership;
use crate::{Error, Result};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// What to do with the lease as last observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseDecision {
    /// No Lease object yet: create it holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    Acquire,
    /// Someone else holds a live lease: wait.
    Wait,
}

/// Pure decision. `unchanged_for` is how long the lease record has been seen
/// unchanged on our clock; `holder_duration` is the duration the holder claimed.
pub fn decide(
    lease_exists: bool,
    holder: Option<&str>,
    me: &str,
    unchanged_for: Duration,
    holder_duration: Duration,
) -> LeaseDecision {
    match holder {
        _ if !lease_exists => LeaseDecision::Create,
        Some(h) if h == me => LeaseDecision::Renew,
        None | Some("") => LeaseDecision::Acquire,
        Some(_) if unchanged_for >= holder_duration => LeaseDecision::Acquire,
        Some(_) => LeaseDecision::Wait,
    }
}

/// The record fields whose change proves the holder is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    transitions: Option<i32>,
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    settings: LeaderElectionSettings,
    leadership: Leadership,
    observed: Option<(Record, Instant)>,
}

impl Elector {
    pub fn new(
        client: kube::Client,
        settings: LeaderElectionSettings,
        identity: String,
        leadership: Leadership,
    ) -> Self {
        Self {
            api: Api::namespaced(client, &settings.lease_namespace),
            name: settings.lease_name.clone(),
            identity,
            settings,
            leadership,
            observed: None,
        }
    }

    /// Campaigns and renews until `shutdown`, then releases the lease if held.
    pub async fn run(mut self, shutdown: CancellationToken) {
        info!(lease = %self.name, identity = %self.identity, "leader election started");
        loop {
            if self.leadership.handing_over() {
                self.hand_over(&shutdown).await;
                if shutdown.is_cancelled() {
                    break;
                }
            }
            let started = Instant::now();
            // Bound each attempt so a hung apiserver cannot hold us past the deadline.
            let attempt =
                tokio::time::timeout(self.settings.renew_deadline, self.try_acquire_or_renew());
            let outcome = tokio::select! {
                _ = shutdown.cancelled() => break,
                outcome = attempt => outcome,
            };
            match outcome {
                Ok(Ok(true)) => {
                    if !self.leadership.is_leading() {
                        info!(lease = %self.name, identity = %self.identity, "became leader");
                    }
                    self.leadership
                        .renewed(started + self.settings.renew_deadline);
                }
                Ok(Ok(false)) => {
                    if self.leadership.is_leading() {
                        warn!(lease = %self.name, "lost the lease to another replica");
                    }
                    self.leadership.lost();
                }
                Ok(Err(e)) => warn!(lease = %self.name, error = %e, "lease update failed"),
                Err(_) => warn!(lease = %self.name, "lease update timed out"),
            }
            // Leadership also lapses by itself at the deadline; tell listeners.
            if !self.leadership.is_leading() {
                self.leadership.lost();
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.settings.retry_period) => {}
                _ = self.leadership.hand_over_asked() => {}
            }
        }
        let was_leading = self.leadership.is_leading();
        self.leadership.lost();
        if was_leading {
            match tokio::time::timeout(Duration::from_secs(5), self.release()).await {
                Ok(Ok(())) => info!(lease = %self.name, "released the lease"),
                Ok(Err(e)) => {
                    warn!(lease = %self.name, error = %e, "could not release the lease; it will expire")
                }
                Err(_) => {
                    warn!(lease = %self.name, "releasing the lease timed out; it will expire")
                }
            }
        }
    }

    /// Hands the lease over (its own node is being drained): released at
    /// once, then a lease duration without campaigning, so a standby takes
    /// it on its next round. With no standby, we take it back after that.
    async fn hand_over(&mut self, shutdown: &CancellationToken) {
        match tokio::time::timeout(Duration::from_secs(5), self.release()).await {
            Ok(Ok(())) => info!(lease = %self.name, "handed the lease over to a standby"),
            Ok(Err(e)) => {
                warn!(lease = %self.name, error = %e, "could not release the lease; it will expire")
            }
            Err(_) => warn!(lease = %self.name, "releasing the lease timed out; it will expire"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(self.settings.lease_duration) => {}
        }
        self.observed = None;
        self.leadership.handed_over();
    }

    /// One round. Ok(true): we hold the lease now.
    async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let duration_secs =
            i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let existing = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(Error::kube(format!("get lease {}", self.name)))?;
        let Some(lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(Error::kube(format!("create lease {}", self.name))(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = Record {
            holder: spec.holder_identity.clone(),
            renew_time: spec.renew_time.clone(),
            transitions: spec.lease_transitions,
        };
        let unchanged_since = match &self.observed {
            Some((seen, at)) if *seen == record => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((record, at));
                at
            }
        };
        let holder_duration =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration_secs).max(1) as u64);
        let decision = decide(
            true,
            spec.holder_identity.as_deref(),
            &self.identity,
            unchanged_since.elapsed(),
            holder_duration,
        );
        debug!(?decision, holder = ?spec.holder_identity, "lease observed");
        let mut updated = lease.clone();
        let new_spec = updated.spec.get_or_insert_with(Default::default);
        match decision {
            LeaseDecision::Wait => return Ok(false),
            LeaseDecision::Renew => {
                new_spec.renew_time = Some(now);
                new_spec.lease_duration_seconds = Some(duration_secs);
            }
            // Create is only answered for a missing lease, handled above.
            LeaseDecision::Acquire | LeaseDecision::Create => {
                new_spec.holder_identity = Some(self.identity.clone());
                new_spec.lease_duration_seconds = Some(duration_secs);
                new_spec.acquire_time = Some(now.clone());
                new_spec.renew_time = Some(now);
                new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
        }
        // `updated` carries the resourceVersion we read: a concurrent writer
        // makes this a 409 and we lose the round instead of both winning.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format!("update lease {}", self.name))(e)),
        }
    }

    /// Hands the lease over at once: no holder, so the next candidate acquires
    /// it on its next round instead of waiting for expiry.
    async fn release(&self) -> Result<()> {
        let lease = self
            .api
            .get(&self.name)
            .await
            .map_err(Error::kube(format!("get lease {}", self.name)))?;
        let mut updated = lease.clone();
        let spec = updated.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &updated)
            .await
            .map_err(Error::kube(format!("release lease {}", self.name)))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn a_missing_lease_is_created() {
        assert_eq!(
            decide(false, None, "a", Duration::ZERO, D),
            LeaseDecision::Create
        );
    }

    #[test]
    fn our_own_lease_is_renewed() {
        assert_eq!(
            decide(true, Some("a"), "a", Duration::from_secs(100), D),
            LeaseDecision::Renew
        );
    }

    #[test]
    fn a_free_lease_is_acquired() {
        assert_eq!(
            decide(true, None, "a", Duration::ZERO, D),
            LeaseDecision::Acquire
        );
        assert_eq!(
            decide(true, Some(""), "a", Duration::ZERO, D),
            LeaseDecision::Acquire
        );
    }

    #[test]
    fn a_live_foreign_lease_is_respected_until_seen_unchanged_for_its_duration() {
        assert_eq!(
            decide(true, Some("b"), "a", Duration::from_secs(14), D),
            LeaseDecision::Wait
        );
        assert_eq!(decide(true, Some("b"), "a", D, D), LeaseDecision::Acquire);
    }

    #[test]
    fn disabled_election_always_leads_and_elected_starts_as_follower() {
        assert!(Leadership::always().is_leading());
        let l = Leadership::elected();
        assert!(!l.is_leading());
        assert!(!*l.subscribe().borrow());
    }

    #[tokio::test]
    async fn leadership_lapses_at_the_renew_deadline_without_renewal() {
        let l = Leadership::elected();
        let rx = l.subscribe();
        l.renewed(Instant::now() + Duration::from_secs(10));
        assert!(l.is_leading());
        assert!(*rx.borrow());
        // The last renewal's deadline has passed: judged on every call, no timer needed.
        let passed = Instant::now()
            .checked_sub(Duration::from_millis(1))
            .expect("clock past boot");
        l.renewed(passed);
        assert!(
            !l.is_leading(),
            "a leader that could not renew must stop acting"
        );
        l.lost();
        assert!(!*rx.borrow());
    }
}
