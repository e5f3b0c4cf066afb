//! The rule book as a plan reads it. A plan never sees the group's windows,
//! its protected nodes or the slot as they are: it sees them through the
//! table (`authority::rules`) for a reason, or asks the one check
//! (`authority::validate`) on the scene this builds, the scene the
//! executor's guard is given from its own fresh view. So a plan chooses by
//! the same rules the executor enforces, and one that forgot a rule would
//! be refused, not obeyed. `scripts/check-structure` keeps the raw reads
//! (`seen_by`, `for_rules`, `rules::protected`) here and in their
//! definitions.

use crate::controllers::authority::ControlPlane;
use crate::controllers::authority::rules::{self, Reason};
use crate::controllers::authority::validate::Scene;
use crate::controllers::window::WindowState;
use crate::crd::Role;
pub use crate::k8s::disruption_slot::SlotState;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A slot this path holds, for a scene to point at once the executor has
/// taken one (`execute::Effects::take_slot`).
pub static TAKEN: SlotState = SlotState::Ours;

/// The group's windows, protected nodes and the manager-wide slot, held
/// where no plan reads them raw.
#[derive(Debug, Clone)]
pub struct Book<'a> {
    window: WindowState,
    protected: &'a BTreeMap<String, String>,
    slot: SlotState,
}

impl<'a> Book<'a> {
    /// `protected`: the group's nodes protected from voluntary disruption,
    /// with why (`k8s::protection`); `slot`: this path's side of the
    /// manager-wide disruption slots (`k8s::disruption_slot`).
    pub fn new(
        window: WindowState,
        protected: &'a BTreeMap<String, String>,
        slot: SlotState,
    ) -> Book<'a> {
        Book {
            window,
            protected,
            slot,
        }
    }

    /// The windows as a disruption for `reason` sees them: always open to
    /// a reason the window rule does not bind.
    pub fn window(&self, reason: Reason) -> WindowState {
        Book::seen_by(self.window.clone(), reason)
    }

    /// The windows at another instant (a preview's), as `reason` sees them.
    pub fn seen_by(window: WindowState, reason: Reason) -> WindowState {
        window.seen_by(reason)
    }

    /// The protected nodes, and why, as `reason` sees them: none to a
    /// reason protection does not bind.
    pub fn protected(&self, reason: Reason) -> Cow<'a, BTreeMap<String, String>> {
        rules::protected(reason, self.protected)
    }

    /// Who holds every slot this path could take, when none is free: a
    /// plan's choice to wait rather than begin what the executor would
    /// refuse (the executor takes a free slot itself, before the effect
    /// that needs one).
    pub fn slots_full(&self) -> Option<&str> {
        match &self.slot {
            SlotState::Full(holders) => Some(holders),
            SlotState::Ours | SlotState::Free => None,
        }
    }

    /// Whether this path holds a slot: for a plan only to give it back
    /// with the lock (a release takes nothing away), or to tell a removal
    /// still in hand from one resumed after a stop gave it back.
    pub fn holds_slot(&self) -> bool {
        self.slot == SlotState::Ours
    }

    /// `scene` as a plan chooses on it: the executor's, but a free slot
    /// seen as taken, since the executor takes it before the effect that
    /// needs it. A slot the others hold refuses as it will in the executor.
    pub fn to_choose(scene: Scene<'_>) -> Scene<'_> {
        match scene.slot {
            SlotState::Free => Scene {
                slot: &TAKEN,
                ..scene
            },
            _ => scene,
        }
    }

    /// The scene the one check judges on, these parts with the group's:
    /// what each guard is given from its own fresh view.
    pub fn scene<'s>(
        &'s self,
        role: Role,
        control_plane: Option<&'s ControlPlane>,
        breaker: Option<&'s str>,
        stopped: Option<&'s str>,
    ) -> Scene<'s> {
        Scene {
            role,
            control_plane,
            window: self.window.for_rules(),
            protected: self.protected,
            slot: &self.slot,
            breaker,
            stopped,
        }
    }

    /// For status: the windows as they are (`WindowState::describe`).
    pub fn describe_window(&self) -> Option<String> {
        self.window.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    #[test]
    fn a_plan_sees_windows_and_protection_only_as_the_table_binds_them() {
        let opens = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single();
        let closed = WindowState::Closed { opens };
        let mut protected = BTreeMap::new();
        protected.insert("n1".to_string(), "do-not-disrupt".to_string());
        let book = Book::new(closed.clone(), &protected, SlotState::Free);
        // A scale-in keeps both rules; a repair neither.
        assert_eq!(book.window(Reason::ScaleIn), closed);
        assert_eq!(book.protected(Reason::ScaleIn).len(), 1);
        assert_eq!(book.window(Reason::WorkerRepair), WindowState::Always);
        assert!(book.protected(Reason::WorkerRepair).is_empty());
        // The scene carries the parts as they are: the check applies the
        // table itself.
        let scene = book.scene(Role::Worker, None, None, None);
        assert_eq!(
            scene.window,
            crate::controllers::authority::validate::Window::Closed { opens }
        );
        assert_eq!(scene.protected.len(), 1);
        assert_eq!(scene.slot, &SlotState::Free);
    }
}
