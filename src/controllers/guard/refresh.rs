//! The refresher's safety checks: every mutation re-checked against this
//! reconcile's fresh observations before it is made. Each check that
//! refuses is named by a [`Refusal`] of the shared vocabulary
//! (`controllers::guard`).

use crate::cloud::AsgDescription;
use crate::controllers::authority::rules::{self, Reason, Rule, reason_of};
use crate::controllers::authority::validate::{Disruption, Floor, Refused, Scene, validate};
use crate::controllers::group_view::DesiredChange;
use crate::controllers::group_view::GroupNode;
use crate::controllers::guard::{Refusal, active_member, carried, desired_changes, groups_asg};
use crate::crd::refresher::{RefreshTarget, TargetPurpose, surplus_of};
use crate::crd::{NodeGroup, RefresherStatus};
use crate::k8s::disruption_slot::SlotState;

/// Re-checks each mutation against fresh observations before it is made:
/// only the group's ASGs and instances, never above max, never lowering an
/// ASG below its active instances (AWS would pick a victim), never removing
/// a node the group cannot spare, never replacing a node the run did not plan.
#[derive(Clone, Copy)]
pub struct Guard<'a> {
    pub group: &'a NodeGroup,
    pub fresh: &'a [AsgDescription],
    pub nodes: &'a [GroupNode],
    pub status: &'a RefresherStatus,
    /// What the rule book's check sees (the control plane, windows,
    /// protection, the slot, the breaker, a stop).
    pub scene: Scene<'a>,
}

/// A mutation the executor is about to make, as the refresher's guard
/// checks it.
pub type Effect<'a> = crate::controllers::command::Effect<'a, RefreshTarget>;

impl Guard<'_> {
    /// The check for `effect`: the executor asks it before each mutation.
    pub fn check(&self, effect: Effect) -> Result<(), Refusal> {
        match effect {
            Effect::GiveBack { target, .. } => match target.node.as_deref() {
                Some(node) => self.gives_back(node),
                None => Ok(()),
            },
            Effect::SetDesired(changes) => self.set_desired(changes),
            Effect::Drain { target, begins } => self.drain(target, begins),
            Effect::Terminate(target) => self.terminate(target),
            Effect::NotJoined(t) => Err(Refusal::NotThisPath {
                what: format!("remove never-joined {}", t.instance_id),
            }),
            Effect::Retire(retiring) => Err(Refusal::NotThisPath {
                what: format!("retire {} instance(s)", retiring.len()),
            }),
        }
    }

    fn asg(&self, name: &str) -> Result<&AsgDescription, Refusal> {
        groups_asg(self.group, self.fresh, name)
    }

    pub fn set_desired(&self, changes: &[DesiredChange]) -> Result<(), Refusal> {
        if self.status.run_start.is_none() {
            return Err(Refusal::OutsideARun);
        }
        crate::controllers::guard::no_fallback_raise(self.group, changes)?;
        desired_changes(self.group, self.fresh, changes)?;
        if changes.iter().any(|c| c.to > c.from) {
            self.raise_holds_a_slot(changes)?;
        }
        Ok(())
    }

    /// A run's raise (its surplus, a replacement launched ahead) is the
    /// first part of its disruption: it is made holding a slot, as the
    /// rule book binds the run's reason, so two runs do not both pay for
    /// surplus while only one of them may take nodes away. (Lowering gives
    /// back what the run raised, and needs none.)
    fn raise_holds_a_slot(&self, changes: &[DesiredChange]) -> Result<(), Refusal> {
        let reason = rules::run_reason(self.status.trigger);
        if !rules::binds(reason, Rule::Slot) || *self.scene.slot == SlotState::Ours {
            return Ok(());
        }
        let why = match self.scene.slot {
            SlotState::Full(holders) => holders.clone(),
            _ => "none taken".into(),
        };
        let asgs: Vec<&str> = changes.iter().map(|c| c.asg.as_str()).collect();
        Err(Refusal::Rule(Refused::NoSlot {
            instance: format!("raise {}", asgs.join(", ")),
            why,
        }))
    }

    pub fn owns_node(&self, node: &str) -> Result<(), Refusal> {
        let known = self
            .group
            .status
            .as_ref()
            .is_some_and(|s| s.nodes.iter().any(|n| n.name == node));
        if !known {
            return Err(Refusal::NotTheGroupsNode { node: node.into() });
        }
        Ok(())
    }

    /// A node put back in service: the group's, or one this run holds as a
    /// target (`status`, as stored before the step), whose ASG may have
    /// left the group's spec since it was cordoned. (The uncordon itself
    /// lifts only a cordon of ours.)
    pub fn gives_back(&self, node: &str) -> Result<(), Refusal> {
        let held = self.status.batch().any(|t| t.node.as_deref() == Some(node));
        if held {
            return Ok(());
        }
        self.owns_node(node)
    }

    /// Within a run, the target's instance is active in one of the group's
    /// ASGs, and a Replace target is one the run planned to replace.
    fn target(&self, t: &RefreshTarget) -> Result<(), Refusal> {
        if self.status.run_start.is_none() {
            return Err(Refusal::OutsideARun);
        }
        active_member(
            self.group,
            self.fresh,
            &t.auto_scaling_group,
            &t.instance_id,
        )?;
        if t.purpose == TargetPurpose::Replace
            && !self.status.planned_instances.contains(&t.instance_id)
        {
            return Err(Refusal::NotPlanned {
                instance: t.instance_id.clone(),
            });
        }
        if let Some(node) = &t.node {
            self.owns_node(node)?;
        }
        Ok(())
    }

    /// The rule book allows the target's next step for the run's reason
    /// (`in_hand`: its drain has begun; `floor`: what a termination
    /// leaves, None for a drain step, which takes no node yet).
    fn rules(&self, t: &RefreshTarget, in_hand: bool, floor: Option<Floor>) -> Result<(), Refusal> {
        let d = Disruption {
            reason: self.reason(t)?,
            instance: &t.instance_id,
            node: t.node.as_deref(),
            in_hand,
            dead: t.unhealthy,
            floor,
        };
        validate(&d, &self.scene).map_err(Refusal::Rule)
    }

    /// The reason the target carries, when it is the one its purpose and
    /// the run's trigger give it: a run's replacement a refresh or a drift
    /// roll, its surplus the surplus's (free of the window).
    fn reason(&self, t: &RefreshTarget) -> Result<Reason, Refusal> {
        let fits = reason_of(t, self.status.trigger);
        carried(&t.instance_id, t.reason.as_deref(), &[fits])
    }

    /// A drain step: the rules but the floor, which the termination keeps
    /// (nodes drained alongside a surge are judged one by one then).
    pub fn drain(&self, t: &RefreshTarget, begins: bool) -> Result<(), Refusal> {
        self.target(t)?;
        self.rules(t, !begins, None)
    }

    pub fn terminate(&self, t: &RefreshTarget) -> Result<(), Refusal> {
        self.target(t)?;
        if t.terminated.is_none() {
            return Err(Refusal::TerminationNotRecorded {
                instance: t.instance_id.clone(),
            });
        }
        if t.decrements() {
            // A decrement takes back a raise of this run: the surplus, or
            // (a replacement launched ahead) a raise above the surplus.
            let asg = self.asg(&t.auto_scaling_group)?;
            let above = match t.purpose {
                TargetPurpose::RemoveSurplus => 0,
                TargetPurpose::Replace => surplus_of(&self.status.surplus, &t.auto_scaling_group),
            };
            let recorded = self
                .status
                .original_desired
                .iter()
                .find(|o| o.auto_scaling_group == t.auto_scaling_group)
                .map(|o| o.desired + above);
            if recorded.is_none_or(|o| asg.desired <= o) {
                return Err(Refusal::NotAboveRecordedCount {
                    instance: t.instance_id.clone(),
                    asg: t.auto_scaling_group.clone(),
                    desired: asg.desired,
                    recorded,
                });
            }
        }
        let surplus: i32 = self.status.surplus.iter().map(|s| s.desired).sum();
        let r = removal(
            t,
            self.reason(t)?,
            self.nodes,
            (self.group.spec.desired, surplus),
        );
        let floor = Floor {
            ready_besides: r.ready_besides,
            needed: r.needed,
            kept: r.safe,
        };
        self.rules(t, true, Some(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::authority::validate::Refused;
    use crate::controllers::group_view::group_nodes;
    use crate::controllers::group_view::tests::{fresh, status_node};
    use crate::crd::NodeGroupStatus;
    use crate::crd::Role;
    use crate::crd::refresher::AsgDesired;
    use crate::k8s::disruption_slot::SlotState;
    use chrono::{TimeZone, Utc};

    /// A worker group of 3 over ASGs a and b: i-1, i-2 in a (a raised by one
    /// surplus, i-9), i-3 in b; a run in progress planning i-1..i-3.
    struct Case {
        group: NodeGroup,
        fresh: Vec<AsgDescription>,
        status: RefresherStatus,
    }

    impl Case {
        fn new() -> Case {
            let mut group: NodeGroup = serde_json::from_value(serde_json::json!({
                "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
                "metadata": {"name": "workers", "namespace": "ns"},
                "spec": {"role": "Worker", "desired": 3,
                         "autoScalingGroups": [{"name": "a"}, {"name": "b"}]}
            }))
            .expect("group");
            group.status = Some(NodeGroupStatus {
                nodes: vec![
                    status_node("n1", "a", "i-1"),
                    status_node("n2", "a", "i-2"),
                    status_node("n9", "a", "i-9"),
                    status_node("n3", "b", "i-3"),
                ],
                ..Default::default()
            });
            let mut a = fresh(
                "a",
                &[
                    ("i-1", "InService"),
                    ("i-2", "InService"),
                    ("i-9", "InService"),
                ],
            );
            a.max = 3;
            let fresh = vec![a, fresh("b", &[("i-3", "InService"), ("i-7", "InService")])];
            let status = RefresherStatus {
                run_start: Some(Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).unwrap()),
                original_desired: vec![
                    AsgDesired {
                        auto_scaling_group: "a".into(),
                        desired: 2,
                    },
                    AsgDesired {
                        auto_scaling_group: "b".into(),
                        desired: 2,
                    },
                ],
                surplus: vec![AsgDesired {
                    auto_scaling_group: "a".into(),
                    desired: 1,
                }],
                planned_instances: vec!["i-1".into(), "i-2".into(), "i-3".into()],
                ..Default::default()
            };
            Case {
                group,
                fresh,
                status,
            }
        }

        fn check<T>(&self, f: impl FnOnce(&Guard) -> Result<T, Refusal>) -> Result<T, Refusal> {
            self.check_with(SlotState::Ours, f)
        }

        /// The check with the slot as `slot` (this path's side).
        fn check_with<T>(
            &self,
            slot: SlotState,
            f: impl FnOnce(&Guard) -> Result<T, Refusal>,
        ) -> Result<T, Refusal> {
            let nodes = group_nodes(
                &self.group.status.as_ref().expect("status").nodes,
                &self.fresh,
                chrono::Utc::now(),
            );
            let protected = Default::default();
            f(&Guard {
                group: &self.group,
                fresh: &self.fresh,
                nodes: &nodes,
                status: &self.status,
                scene: crate::controllers::authority::validate::tests::open_scene(
                    Role::Worker,
                    &protected,
                    &slot,
                ),
            })
        }
    }

    fn target(id: &str, asg: &str, node: &str, purpose: TargetPurpose) -> RefreshTarget {
        let reason = match purpose {
            TargetPurpose::Replace => Reason::Refresh,
            TargetPurpose::RemoveSurplus => Reason::RefreshSurplus,
        };
        RefreshTarget {
            node: Some(node.into()),
            instance_id: id.into(),
            auto_scaling_group: asg.into(),
            purpose,
            reason: Some(reason.label().into()),
            since: Utc.with_ymd_and_hms(2026, 6, 1, 12, 1, 0).unwrap(),
            terminated: Some(Utc.with_ymd_and_hms(2026, 6, 1, 12, 2, 0).unwrap()),
            blocked_by: None,
            unhealthy: false,
            workloads: vec![],
            launched_ahead: None,
        }
    }

    fn change(asg: &str, from: i32, to: i32) -> DesiredChange {
        DesiredChange {
            asg: asg.into(),
            from,
            to,
        }
    }

    #[test]
    fn a_planned_node_may_be_replaced_while_enough_stay_ready() {
        let case = Case::new();
        let t = target("i-1", "a", "n1", TargetPurpose::Replace);
        assert!(case.check(|g| g.terminate(&t)).is_ok());
    }

    #[test]
    fn an_unplanned_node_is_never_replaced() {
        let case = Case::new();
        // i-9 is the surplus: new, not planned.
        let t = target("i-9", "a", "n9", TargetPurpose::Replace);
        let not_planned = Err(Refusal::NotPlanned {
            instance: "i-9".into(),
        });
        assert_eq!(case.check(|g| g.terminate(&t)), not_planned);
        assert_eq!(case.check(|g| g.drain(&t, true)), not_planned);
    }

    #[test]
    fn a_target_carrying_no_reason_or_another_than_its_runs_is_refused() {
        let case = Case::new();
        let unfit = |carried: Option<&str>, fits: &str| {
            Err(Refusal::UnfitReason {
                instance: "i-1".into(),
                carried: carried.map(String::from),
                fits: fits.into(),
            })
        };
        let mut t = target("i-1", "a", "n1", TargetPurpose::Replace);
        t.reason = None;
        assert_eq!(case.check(|g| g.drain(&t, true)), unfit(None, "refresh"));
        assert_eq!(case.check(|g| g.terminate(&t)), unfit(None, "refresh"));
        // A replacement carrying the surplus's reason would be free of the
        // window.
        t.reason = Some(Reason::RefreshSurplus.label().into());
        let surplus = Some("refresh_surplus");
        assert_eq!(case.check(|g| g.drain(&t, true)), unfit(surplus, "refresh"));
        t.reason = Some(Reason::Refresh.label().into());
        assert_eq!(case.check(|g| g.drain(&t, true)), Ok(()));
    }

    #[test]
    fn a_termination_not_recorded_first_is_refused() {
        let case = Case::new();
        let mut t = target("i-1", "a", "n1", TargetPurpose::Replace);
        t.terminated = None;
        assert_eq!(
            case.check(|g| g.terminate(&t)),
            Err(Refusal::TerminationNotRecorded {
                instance: "i-1".into()
            })
        );
    }

    #[test]
    fn a_replacement_that_would_leave_too_few_ready_is_refused() {
        let mut case = Case::new();
        // Another node not Ready: removing n1 would leave 2 Ready, 3 needed.
        if let Some(s) = case.group.status.as_mut() {
            s.nodes[1].ready = false;
        }
        let t = target("i-1", "a", "n1", TargetPurpose::Replace);
        assert_eq!(
            case.check(|g| g.terminate(&t)),
            Err(Refusal::Rule(Refused::Floor {
                instance: "i-1".into(),
                ready_besides: 2,
                needed: 3
            }))
        );
    }

    #[test]
    fn an_instance_outside_the_group_or_not_active_is_never_touched() {
        let case = Case::new();
        let elsewhere = target("i-1", "other-asg", "n1", TargetPurpose::Replace);
        assert_eq!(
            case.check(|g| g.terminate(&elsewhere)),
            Err(Refusal::NotTheGroupsAsg {
                asg: "other-asg".into()
            })
        );
        let mut leaving = Case::new();
        leaving.fresh[0].instances[0].lifecycle_state = "Terminating".into();
        let t = target("i-1", "a", "n1", TargetPurpose::Replace);
        assert_eq!(
            leaving.check(|g| g.terminate(&t)),
            Err(Refusal::NotActive {
                instance: "i-1".into(),
                asg: "a".into()
            })
        );
    }

    #[test]
    fn nothing_is_touched_outside_a_run() {
        let mut case = Case::new();
        case.status.run_start = None;
        let t = target("i-1", "a", "n1", TargetPurpose::Replace);
        assert_eq!(case.check(|g| g.terminate(&t)), Err(Refusal::OutsideARun));
        assert_eq!(
            case.check(|g| g.set_desired(&[change("b", 2, 3)])),
            Err(Refusal::OutsideARun)
        );
    }

    #[test]
    fn surplus_is_removed_only_from_an_asg_above_its_recorded_count() {
        let case = Case::new();
        let surplus = target("i-9", "a", "n9", TargetPurpose::RemoveSurplus);
        assert!(case.check(|g| g.terminate(&surplus)).is_ok());
        // b is at its recorded 2: nothing of it is surplus.
        let not_surplus = target("i-3", "b", "n3", TargetPurpose::RemoveSurplus);
        assert_eq!(
            case.check(|g| g.terminate(&not_surplus)),
            Err(Refusal::NotAboveRecordedCount {
                instance: "i-3".into(),
                asg: "b".into(),
                desired: 2,
                recorded: Some(2)
            })
        );
    }

    #[test]
    fn a_node_launched_ahead_goes_with_decrement_only_while_its_raise_is_there() {
        let mut case = Case::new();
        let ahead = |id: &str, asg: &str, node: &str| RefreshTarget {
            launched_ahead: Some(Utc.with_ymd_and_hms(2026, 6, 1, 12, 1, 0).unwrap()),
            ..target(id, asg, node, TargetPurpose::Replace)
        };
        // b raised for i-3's replacement: 3, above its recorded 2 (no surplus in b).
        case.fresh[1].desired = 3;
        assert!(
            case.check(|g| g.terminate(&ahead("i-3", "b", "n3")))
                .is_ok()
        );
        // a holds only its surplus: a decrement there would take the surplus.
        assert_eq!(
            case.check(|g| g.terminate(&ahead("i-1", "a", "n1"))),
            Err(Refusal::NotAboveRecordedCount {
                instance: "i-1".into(),
                asg: "a".into(),
                desired: 3,
                recorded: Some(3)
            })
        );
        // b's raise not made: its decrement would lower the layout.
        case.fresh[1].desired = 2;
        assert_eq!(
            case.check(|g| g.terminate(&ahead("i-3", "b", "n3"))),
            Err(Refusal::NotAboveRecordedCount {
                instance: "i-3".into(),
                asg: "b".into(),
                desired: 2,
                recorded: Some(2)
            })
        );
    }

    #[test]
    fn capacity_changes_stay_within_max_and_never_make_aws_pick_a_victim() {
        let case = Case::new();
        assert!(case.check(|g| g.set_desired(&[change("b", 2, 3)])).is_ok());
        // Above a's max of 3.
        assert_eq!(
            case.check(|g| g.set_desired(&[change("a", 3, 4)])),
            Err(Refusal::AboveMax {
                asg: "a".into(),
                to: 4,
                max: 3
            })
        );
        // Planned from a stale count.
        assert_eq!(
            case.check(|g| g.set_desired(&[change("b", 1, 3)])),
            Err(Refusal::StaleCount {
                asg: "b".into(),
                planned_from: 1,
                desired: 2
            })
        );
        // Below the 3 instances running in a: AWS would choose which to kill.
        assert_eq!(
            case.check(|g| g.set_desired(&[change("a", 3, 2)])),
            Err(Refusal::AwsWouldPickAVictim {
                asg: "a".into(),
                to: 2,
                active: 3
            })
        );
        // Not one of the group's ASGs.
        assert_eq!(
            case.check(|g| g.set_desired(&[change("c", 1, 2)])),
            Err(Refusal::NotTheGroupsAsg { asg: "c".into() })
        );
    }

    /// A run raises (its surplus, a replacement ahead) holding a slot, as
    /// its reason binds it, so two runs do not both pay for surplus while
    /// one may act; the executor takes a free one on this refusal. Giving
    /// back what it raised needs none.
    #[test]
    fn a_runs_raise_holds_a_slot_and_its_lowering_needs_none() {
        let mut case = Case::new();
        for slot in [SlotState::Free, SlotState::Full("Refresh ns/other".into())] {
            let refused = case.check_with(slot.clone(), |g| g.set_desired(&[change("b", 2, 3)]));
            assert!(
                matches!(refused, Err(Refusal::Rule(Refused::NoSlot { .. }))),
                "{slot:?}: {refused:?}"
            );
        }
        assert!(case.check(|g| g.set_desired(&[change("b", 2, 3)])).is_ok());
        // b raised to 3 with two instances in service: lowered back freely.
        case.fresh[1].desired = 3;
        let lowered = case.check_with(SlotState::Free, |g| g.set_desired(&[change("b", 3, 2)]));
        assert_eq!(lowered, Ok(()));
    }

    #[test]
    fn only_the_groups_nodes_are_uncordoned() {
        let case = Case::new();
        assert!(case.check(|g| g.owns_node("n1")).is_ok());
        assert_eq!(
            case.check(|g| g.owns_node("someone-elses")),
            Err(Refusal::NotTheGroupsNode {
                node: "someone-elses".into()
            })
        );
    }
}

/// Whether the group can spare a target, by the Ready nodes besides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removal {
    pub safe: bool,
    pub ready_besides: i32,
    pub needed: i32,
}

/// The one rule for removing a target, used by the plan and re-checked by the
/// reconcile before the termination: replacing an old node keeps Ready at
/// desired + surplus - 1 (workers with surplus: never below desired; without
/// surplus, masters: every other node Ready), and never below desired when
/// its replacement was launched ahead; removing surplus keeps Ready at
/// desired, and removing one that is not Ready costs no Ready node. Safe
/// whatever the count when the rule book frees the run's reason
/// (`reason`) of the Ready floor.
pub fn removal(
    target: &RefreshTarget,
    reason: Reason,
    nodes: &[GroupNode],
    (desired, surplus): (i32, i32),
) -> Removal {
    let id = Some(target.instance_id.as_str());
    let ready_besides = nodes
        .iter()
        .filter(|n| n.ready && n.instance_id.as_deref() != id)
        .count() as i32;
    let target_ready = nodes
        .iter()
        .any(|n| n.ready && n.instance_id.as_deref() == id);
    let (safe, needed) = match target.purpose {
        // Its replacement launched ahead: never below desired (without
        // surplus, the replacement must be Ready first).
        TargetPurpose::Replace if target.launched_ahead.is_some() => {
            let needed = desired + (surplus - 1).max(0);
            (ready_besides >= needed, needed)
        }
        TargetPurpose::Replace => {
            let needed = desired + surplus - 1;
            (ready_besides >= needed, needed)
        }
        TargetPurpose::RemoveSurplus => (!target_ready || ready_besides >= desired, desired),
    };
    let floor = rules::binds(reason, Rule::ReadyFloor);
    Removal {
        safe: safe || !floor,
        ready_besides,
        needed,
    }
}
