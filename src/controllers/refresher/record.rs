//! The refresher's status to the one executor (`controllers::execute`):
//! its plan records each step itself, so only a drain's outcomes are
//! written here: the workloads a drain moves, what blocked it, and a
//! drained target's termination.

use super::plan::after_drain;
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

    /// A run's batch (a node being drained, or terminated and not yet
    /// replaced, a surplus node being removed) keeps its slot; between
    /// nodes, and while it waits on time with none, the slot goes back.
    fn in_hand(&self) -> bool {
        self.run_start.is_some() && self.batch().next().is_some()
    }

    fn blocked(&mut self, instance: &str, by: &str) {
        if let Some(t) = self.batch_member_mut(instance)
            && t.blocked_by.as_deref() != Some(by)
        {
            t.blocked_by = Some(by.to_string());
        }
    }
}
