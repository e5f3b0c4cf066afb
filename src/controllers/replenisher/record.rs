//! The replenisher's status to the one executor (`controllers::execute`):
//! what each outcome of a command writes in it (a raise landed or not made,
//! a drained target's termination recorded and done, a removal given back,
//! a cleanup or a retirement done).

use super::plan as replenish_plan;
use crate::controllers::authority::rules::Reason;
use crate::controllers::command::Effect;
use crate::controllers::execute::{Record, Target};
use crate::crd::ReplenisherStatus;
use crate::crd::replenisher::{ReplenishPhase, ScaleInTarget};
use chrono::{DateTime, Utc};

impl Target for ScaleInTarget {
    fn instance_id(&self) -> &str {
        &self.instance_id
    }

    fn node(&self) -> Option<&str> {
        Some(&self.node)
    }

    fn reason(&self) -> Option<Reason> {
        self.reason.as_deref().and_then(Reason::from_label)
    }
}

impl Record for ReplenisherStatus {
    type Target = ScaleInTarget;
    const PATH: &'static str = "replenisher";

    fn draining(&self, instance: &str) -> Option<&ScaleInTarget> {
        self.scale_in.as_ref().filter(|t| t.instance_id == instance)
    }

    fn drained(&mut self, instance: &str, now: DateTime<Utc>) -> Option<ScaleInTarget> {
        self.draining(instance)?;
        replenish_plan::record_termination(self, now)
    }

    /// A removal recorded (a scale-in, an at-risk node, a fallback
    /// return, a repair) keeps its slot until it is done or given back,
    /// unless a stop holds it (paused: suspended, a kops rolling update,
    /// the breaker; blocked: an invalid spec), which may last: the slot
    /// goes back meanwhile, the removal kept, and is taken again when it
    /// resumes.
    fn in_hand(&self) -> bool {
        self.scale_in.is_some() && !stopped(self)
    }

    fn made(&mut self, effect: Effect<'_, ScaleInTarget>, now: DateTime<Utc>) {
        match effect {
            Effect::SetDesired(_) => replenish_plan::raise_landed(self),
            Effect::Terminate(target) => replenish_plan::finish_scale_in(self, target),
            Effect::GiveBack { reason, .. } => replenish_plan::abandon_scale_in(self, reason, now),
            Effect::NotJoined(_) => replenish_plan::finish_cleanup(self),
            Effect::Retire(retired) => {
                let ids: Vec<String> = retired.iter().map(|r| r.instance_id.clone()).collect();
                replenish_plan::finish_retiring(self, &ids);
            }
            // A drain step's outcome is `drained`'s.
            Effect::Drain { .. } => {}
        }
    }

    fn not_made(&mut self, effect: Effect<'_, ScaleInTarget>) {
        if let Effect::SetDesired(_) = effect {
            replenish_plan::raise_not_made(self);
        }
    }

    /// The group's lock covers what the replenisher has in hand: a removal,
    /// a never-joined instance's, a raise or retirements recorded, and
    /// every acting phase (what it raised on its way included), so its
    /// refresher does not start a run over them; it is given back on a
    /// wait on time, a stop (what is recorded kept) or once steady.
    fn keeps_lock(&self) -> bool {
        let acting = matches!(
            self.phase,
            ReplenishPhase::ScalingUp
                | ReplenishPhase::ScalingDown
                | ReplenishPhase::CleaningUp
                | ReplenishPhase::Repairing
        );
        let recorded = self.scale_in.is_some()
            || self.cleanup.is_some()
            || !self.raising.is_empty()
            || !self.retiring.is_empty();
        acting || (recorded && !stopped(self))
    }
}

/// Held by a stop (paused or blocked): nothing happens until it ends, so
/// neither the lock nor a slot is kept for what is recorded.
fn stopped(status: &ReplenisherStatus) -> bool {
    matches!(
        status.phase,
        ReplenishPhase::Paused | ReplenishPhase::Blocked
    )
}
