//! The replenisher's status to the one executor (`controllers::execute`):
//! what each outcome of a command writes in it (a raise landed or not made,
//! a drained target's termination recorded and done, a removal given back,
//! a cleanup or a retirement done).

use super::plan as replenish_plan;
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
    /// return, a repair) keeps its slot until it is done or given back.
    fn in_hand(&self) -> bool {
        self.scale_in.is_some()
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

    fn lock_held_elsewhere(&mut self) {
        self.phase = ReplenishPhase::Paused;
    }
}
