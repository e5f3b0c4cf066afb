//! The walked world as each controller's effects: every mutation checked
//! against what the maker holds, stored and asked its guard.

use super::{Who, World, node_name};
use crate::controllers::authority::rules::Reason;
use crate::controllers::command::Effect;
use crate::controllers::execute::{self as executor, Drained, Effects, Taken};
use crate::controllers::group_view::DesiredChange;
use crate::controllers::guard::Refusal;
use crate::crd::ReplenisherStatus;
use crate::crd::refresher::{RefreshTarget, RefresherStatus, TargetPurpose};
use crate::crd::replenisher::ScaleInTarget;
use crate::k8s::drain::DrainProgress;
use crate::k8s::lock::LockState;
use std::time::Duration;

/// The world as the replenisher's effects.
pub(super) struct AsReplenisher<'a>(pub(super) &'a mut World, pub(super) usize);

impl Effects for AsReplenisher<'_> {
    type Record = ReplenisherStatus;

    fn guard(
        &self,
        recorded: &ReplenisherStatus,
        check: Effect<'_, ScaleInTarget>,
    ) -> Result<(), Refusal> {
        use crate::controllers::guard::replenish::Guard;
        self.0.guarded.borrow_mut().extend(asked(&check));
        let seen = self.0.observe(self.1);
        let status = seen.group.status.clone().unwrap_or_default();
        let parts = self.0.scene_parts(self.1, Who::Replenisher);
        Guard {
            group: &seen.group,
            status: &status,
            fresh: &seen.described,
            scene: parts.scene(&seen),
            now: self.0.now,
        }
        .check(recorded, check)
    }

    async fn write_status(&mut self, status: &ReplenisherStatus) -> crate::Result<()> {
        self.0.groups[self.1].replenisher = status.clone();
        Ok(())
    }

    fn reached(&mut self, point: &str) -> crate::Result<()> {
        self.0.reached(point, point.ends_with(":persisted"))
    }

    fn lock(&self) -> Option<LockState> {
        Some(self.0.lock_for(self.1, Who::Replenisher))
    }

    async fn take_lock(&mut self) -> crate::Result<Taken> {
        Ok(self.0.take_lock(self.1, Who::Replenisher))
    }

    async fn take_slot(&mut self) -> crate::Result<bool> {
        Ok(self.0.take_slot(self.1, Who::Replenisher))
    }

    fn holds_slot(&self) -> bool {
        self.0.slot == Some((self.1, Who::Replenisher))
    }

    async fn release_slot(&mut self) -> crate::Result<()> {
        self.0.release_slot(self.1, Who::Replenisher);
        Ok(())
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        self.0.release_lock(self.1, Who::Replenisher);
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        _: &ReplenisherStatus,
        _: &str,
    ) -> crate::Result<bool> {
        for change in changes {
            self.0.assert_holds(self.1, Who::Replenisher, "a raise");
            self.0.assert_guarded(&format!("asg:{}", change.asg));
            let recorded = self.0.groups[self.1]
                .replenisher
                .raising
                .iter()
                .any(|r| r.auto_scaling_group == change.asg && r.to == change.to);
            assert!(recorded, "{change:?} made before its record was stored");
            self.0.set_desired(self.1, change);
            self.0.see("raise");
        }
        Ok(true)
    }

    async fn drain_step(
        &mut self,
        target: &ScaleInTarget,
        status: &ReplenisherStatus,
        _: bool,
        _: &str,
    ) -> crate::Result<Drained> {
        let (w, g) = (&mut *self.0, self.1);
        let node = target.node.as_str();
        w.assert_holds(g, Who::Replenisher, "a drain");
        w.assert_guarded(&target.instance_id);
        assert_eq!(
            &w.groups[g].replenisher, status,
            "drains {node} before its scale-in is stored"
        );
        assert!(
            w.groups[g]
                .replenisher
                .scale_in
                .as_ref()
                .is_some_and(|t| t.node == node),
            "drains {node} before its scale-in is stored"
        );
        let steps = w.cordon_step(node);
        w.acted(g);
        if steps == 1 {
            // A scale-in and a node at risk bind the same rules.
            let reason = match target.repair {
                true => Reason::repair(w.groups[g].role),
                false => Reason::ScaleIn,
            };
            w.first_drain(g, Who::Replenisher, node, reason);
        }
        let progress = DrainProgress {
            waiting: match steps {
                1 => vec!["ns/pod".into()],
                _ => vec![],
            },
            ..Default::default()
        };
        Ok(Drained {
            done: crate::controllers::replenisher::drained(target, &progress, w.now),
            requeue: Duration::from_secs(5),
            blocked_by: None,
        })
    }

    async fn terminate(
        &mut self,
        removal: Effect<'_, ScaleInTarget>,
        status: &ReplenisherStatus,
    ) -> crate::Result<bool> {
        let (w, g) = (&mut *self.0, self.1);
        assert_eq!(
            &w.groups[g].replenisher, status,
            "a termination before its record was stored"
        );
        w.assert_holds(g, Who::Replenisher, "a termination");
        let s = &w.groups[g].replenisher;
        let (id, decrement, kind) = match removal {
            Effect::Terminate(t) => {
                let recorded = s
                    .scale_in
                    .as_ref()
                    .filter(|r| r.instance_id == t.instance_id);
                let recorded =
                    recorded.unwrap_or_else(|| panic!("{t:?} terminated before its record: {s:?}"));
                assert!(
                    recorded.terminating.is_some(),
                    "{} terminated before its record",
                    t.instance_id
                );
                let kind = match t.repair {
                    true => "repair",
                    false => "scale-in",
                };
                (t.instance_id.clone(), t.decrement, kind)
            }
            Effect::NotJoined(c) => {
                assert!(
                    s.cleanup
                        .as_ref()
                        .is_some_and(|r| r.instance_id == c.instance_id),
                    "{} removed before its record: {s:?}",
                    c.instance_id
                );
                (c.instance_id.clone(), c.decrement, "never joined")
            }
            Effect::Retire([r]) => {
                assert!(
                    s.retiring.iter().any(|x| x.instance_id == r.instance_id),
                    "{} retired before its record: {s:?}",
                    r.instance_id
                );
                (r.instance_id.clone(), r.decrement, "retirement")
            }
            other => panic!("not a removal of one instance: {other:?}"),
        };
        w.assert_guarded(&id);
        w.terminate(g, Who::Replenisher, kind, &id, decrement);
        Ok(true)
    }

    async fn uncordon(&mut self, node: &str, _: &ReplenisherStatus) -> crate::Result<()> {
        self.0.assert_guarded(node);
        self.0.uncordon(node);
        Ok(())
    }
}

/// The group's lock and the manager's one slot, as both controllers take
/// and give them back: the lock is refused while the group's other
/// controller holds it; the slot is taken under the lock only.
impl World {
    fn take_lock(&mut self, g: usize, who: Who) -> Taken {
        let lock = &mut self.groups[g].lock;
        match *lock {
            Some(other) if other != who => Taken::HeldElsewhere,
            _ => {
                *lock = Some(who);
                Taken::Yes
            }
        }
    }

    fn take_slot(&mut self, g: usize, who: Who) -> bool {
        self.assert_holds(g, who, "a slot");
        if self.slot.is_none() && !self.slot_elsewhere {
            self.slot = Some((g, who));
        }
        self.slot == Some((g, who))
    }

    fn release_slot(&mut self, g: usize, who: Who) {
        if self.slot == Some((g, who)) {
            self.slot = None;
        }
    }

    fn release_lock(&mut self, g: usize, who: Who) {
        if self.groups[g].lock == Some(who) {
            self.groups[g].lock = None;
        }
    }
}

/// What a guard was asked about, as the walk's effects look it up.
fn asked<T: executor::Target>(check: &Effect<'_, T>) -> Vec<String> {
    match check {
        Effect::GiveBack { target, .. } => target.node().map(str::to_string).into_iter().collect(),
        Effect::SetDesired(changes) => changes.iter().map(|c| format!("asg:{}", c.asg)).collect(),
        Effect::Drain { target: t, .. } | Effect::Terminate(t) => {
            vec![t.instance_id().to_string()]
        }
        Effect::NotJoined(c) => vec![c.instance_id.clone()],
        Effect::Retire(retiring) => retiring.iter().map(|r| r.instance_id.clone()).collect(),
    }
}

/// The world as the refresher's effects.
pub(super) struct AsRefresher<'a>(pub(super) &'a mut World, pub(super) usize);

impl AsRefresher<'_> {
    fn assert_recorded(&self, status: &RefresherStatus, what: &str) {
        assert_eq!(
            &self.0.groups[self.1].refresher, status,
            "{what} before the status recording it was stored"
        );
        self.0.assert_holds(self.1, Who::Refresher, what);
        // The slot too, which the executor takes itself.
        assert_eq!(
            self.0.slot,
            Some((self.1, Who::Refresher)),
            "{what} without the slot"
        );
    }
}

impl Effects for AsRefresher<'_> {
    type Record = RefresherStatus;

    fn guard(
        &self,
        status: &RefresherStatus,
        check: Effect<'_, RefreshTarget>,
    ) -> Result<(), Refusal> {
        use crate::controllers::guard::refresh::Guard;
        self.0.guarded.borrow_mut().extend(asked(&check));
        let seen = self.0.observe(self.1);
        let parts = self.0.scene_parts(self.1, Who::Refresher);
        Guard {
            group: &seen.group,
            fresh: &seen.described,
            nodes: &seen.nodes,
            status,
            scene: parts.scene(&seen),
        }
        .check(check)
    }

    async fn uncordon(&mut self, node: &str, _: &RefresherStatus) -> crate::Result<()> {
        self.0.assert_guarded(node);
        self.0.uncordon(node);
        Ok(())
    }

    async fn write_status(&mut self, status: &RefresherStatus) -> crate::Result<()> {
        self.0.groups[self.1].refresher = status.clone();
        Ok(())
    }

    fn reached(&mut self, point: &str) -> crate::Result<()> {
        self.0.reached(point, point.ends_with(":persisted"))
    }

    fn lock(&self) -> Option<LockState> {
        Some(self.0.lock_for(self.1, Who::Refresher))
    }

    async fn take_lock(&mut self) -> crate::Result<Taken> {
        Ok(self.0.take_lock(self.1, Who::Refresher))
    }

    async fn take_slot(&mut self) -> crate::Result<bool> {
        Ok(self.0.take_slot(self.1, Who::Refresher))
    }

    fn holds_slot(&self) -> bool {
        self.0.slot == Some((self.1, Who::Refresher))
    }

    async fn release_slot(&mut self) -> crate::Result<()> {
        self.0.release_slot(self.1, Who::Refresher);
        Ok(())
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        self.0.release_lock(self.1, Who::Refresher);
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        status: &RefresherStatus,
        _: &str,
    ) -> crate::Result<bool> {
        self.assert_recorded(status, "a desired count set");
        for c in changes {
            self.0.assert_guarded(&format!("asg:{}", c.asg));
            self.0.set_desired(self.1, c);
        }
        self.0.see("refresh desired set");
        Ok(true)
    }

    async fn workloads_on(&mut self, _: &RefreshTarget) -> crate::Result<Vec<String>> {
        Ok(vec![])
    }

    async fn drain_step(
        &mut self,
        target: &RefreshTarget,
        status: &RefresherStatus,
        first: bool,
        _: &str,
    ) -> crate::Result<Drained> {
        self.assert_recorded(status, "a drain");
        self.0.assert_guarded(&target.instance_id);
        let node = target
            .node
            .clone()
            .unwrap_or_else(|| node_name(&target.instance_id));
        let steps = self.0.cordon_step(&node);
        self.0.acted(self.1);
        if first {
            let reason = match (target.unhealthy, target.purpose) {
                (true, _) => Reason::repair(self.0.groups[self.1].role),
                (false, TargetPurpose::RemoveSurplus) => Reason::RefreshSurplus,
                // A drift roll binds the same rules.
                (false, TargetPurpose::Replace) => Reason::Refresh,
            };
            self.0.first_drain(self.1, Who::Refresher, &node, reason);
        }
        let dead = self
            .0
            .instances
            .iter()
            .any(|i| i.id == target.instance_id && i.dead_since.is_some());
        Ok(Drained {
            done: match dead {
                // Its pods never finish terminating: done only as a repair.
                true => target.unhealthy,
                false => steps >= 2,
            },
            requeue: Duration::from_secs(5),
            blocked_by: None,
        })
    }

    async fn terminate(
        &mut self,
        removal: Effect<'_, RefreshTarget>,
        status: &RefresherStatus,
    ) -> crate::Result<bool> {
        let Effect::Terminate(target) = removal else {
            panic!("a refresher removes only its targets: {removal:?}");
        };
        self.assert_recorded(status, "a termination");
        self.0.assert_guarded(&target.instance_id);
        assert!(
            target.terminated.is_some(),
            "termination not recorded first"
        );
        let kind = match target.decrements() {
            true => "refresh removal",
            false => "refresh replacement",
        };
        self.0.terminate(
            self.1,
            Who::Refresher,
            kind,
            &target.instance_id,
            target.decrements(),
        );
        Ok(true)
    }
}
