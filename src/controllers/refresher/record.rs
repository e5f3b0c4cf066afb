//! The refresher's status to the one executor (`controllers::execute`):
//! its plan records each step itself, so only a drain's outcomes are
//! written here: the workloads a drain moves, what blocked it, and a
//! drained target's termination.

use super::plan::after_drain;
use crate::controllers::authority::rules::Reason;
use crate::controllers::execute::{Record, Target};
use crate::crd::refresher::{RefreshTarget, RefresherStatus};
use chrono::{DateTime, Utc};

impl Target for RefreshTarget {
    fn instance_id(&self) -> &str {
        &self.instance_id
    }

    fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    fn reason(&self) -> Option<Reason> {
        self.reason.as_deref().and_then(Reason::from_label)
    }
}

impl Record for RefresherStatus {
    type Target = RefreshTarget;
    const PATH: &'static str = "refresher";

    fn draining(&self, instance: &str) -> Option<&RefreshTarget> {
        self.batch().find(|t| t.instance_id == instance)
    }

    fn drained(&mut self, instance: &str, now: DateTime<Utc>) -> Option<RefreshTarget> {
        after_drain(self, instance, now)
    }

    fn moving(&mut self, instance: &str, workloads: &[String]) {
        let Some(target) = self.batch_member_mut(instance) else {
            return;
        };
        for w in workloads {
            if !target.workloads.contains(w) {
                target.workloads.push(w.clone());
            }
        }
        target.workloads.sort();
    }

    /// A run under way keeps the slot it took (at its raise or its first
    /// drain) from node to node; while it waits on time (paused: a window,
    /// a stop, the lock; or waiting for protected nodes) with no node in
    /// its batch (none being drained, none terminated and not yet
    /// replaced), the slot goes back, its lock, surplus and place kept.
    fn in_hand(&self) -> bool {
        let waits_on_time = self.paused_since.is_some() || self.protected_since.is_some();
        self.run_start.is_some() && (self.batch().next().is_some() || !waits_on_time)
    }

    /// A run under way keeps the group's lock from its start to its end
    /// (paused, waiting for a window or protected nodes included: its
    /// surplus and place are the group's), bounded by `pauseTimeout`.
    fn keeps_lock(&self) -> bool {
        self.run_start.is_some()
    }

    fn blocked(&mut self, instance: &str, by: &str) {
        if let Some(t) = self.batch_member_mut(instance)
            && t.blocked_by.as_deref() != Some(by)
        {
            t.blocked_by = Some(by.to_string());
        }
    }
}
