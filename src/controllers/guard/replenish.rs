//! The replenisher's safety checks, over the shared vocabulary
//! (`controllers::guard`): each mutation re-checked against the fresh
//! describe just before it is made.

use crate::cloud::AsgDescription;
use crate::controllers::authority::Reason;
use crate::controllers::authority::validate::{Disruption, Floor, Scene, validate};
use crate::controllers::group_view::{DesiredChange, Fate, group_nodes};
use crate::controllers::guard::{Refusal, carried, desired_changes, removable};
use crate::crd::replenisher::ScaleInTarget;
use crate::crd::{NodeGroup, ReplenisherStatus};

/// The replenisher's mutations re-checked on one reconcile's observations:
/// the group (spec and inventory), its ASGs as just described, the rule
/// book's scene (the control plane, windows, protection, the slot, the
/// breaker, a stop), and now.
#[derive(Clone, Copy)]
pub struct Guard<'a> {
    pub group: &'a NodeGroup,
    pub status: &'a crate::crd::NodeGroupStatus,
    pub fresh: &'a [AsgDescription],
    pub scene: Scene<'a>,
    pub now: chrono::DateTime<chrono::Utc>,
}

/// A mutation the executor is about to make, as the replenisher's guard
/// checks it.
pub type Effect<'a> = crate::controllers::command::Effect<'a, ScaleInTarget>;

impl Guard<'_> {
    /// The check for `effect`: the executor asks it before each mutation,
    /// with the Replenisher's status as it records the mutation.
    pub fn check(&self, recorded: &ReplenisherStatus, effect: Effect) -> Result<(), Refusal> {
        let (group, status, fresh, scene, now) =
            (self.group, self.status, self.fresh, &self.scene, self.now);
        match effect {
            Effect::GiveBack { target, .. } => gives_back(group, recorded, &target.node),
            Effect::SetDesired(changes) => scale_up(group, fresh, changes),
            Effect::NotJoined(target) => not_joined(group, fresh, target, scene),
            // A drain step is a removal begun: checked as its termination
            // will be, so a removal the rules refuse now is not driven on.
            Effect::Drain { target, begins } => {
                removal(group, status, fresh, target, scene, now, !begins)
            }
            Effect::Terminate(t) => removal(group, status, fresh, t, scene, now, true),
            Effect::Retire(retiring) => retiring
                .iter()
                .try_for_each(|r| retire(group, status, fresh, r, scene, now)),
        }
    }
}

/// A repair or a scale-in: the step `in_hand` once its drain has begun.
fn removal(
    group: &NodeGroup,
    status: &crate::crd::NodeGroupStatus,
    fresh: &[AsgDescription],
    target: &ScaleInTarget,
    scene: &Scene,
    now: chrono::DateTime<chrono::Utc>,
    in_hand: bool,
) -> Result<(), Refusal> {
    match target.repair {
        true => repair(group, status, fresh, target, scene, now),
        false => scale_in(group, status, fresh, target, scene, now, in_hand),
    }
}

/// A node put back in service: the group's, or the one the Replenisher
/// holds as its scale-in target (its ASG may have left the spec since).
fn gives_back(group: &NodeGroup, recorded: &ReplenisherStatus, node: &str) -> Result<(), Refusal> {
    let held = recorded.scale_in.as_ref().is_some_and(|t| t.node == node);
    let known = group
        .status
        .as_ref()
        .is_some_and(|s| s.nodes.iter().any(|n| n.name == node));
    match held || known {
        true => Ok(()),
        false => Err(Refusal::NotTheGroupsNode { node: node.into() }),
    }
}

/// Safety: only this group's ASGs, never above their max, never from a
/// stale count (a raise never lowers, so AWS never picks a victim).
pub fn scale_up(
    group: &NodeGroup,
    fresh: &[AsgDescription],
    changes: &[DesiredChange],
) -> Result<(), Refusal> {
    desired_changes(group, fresh, changes)?;
    // The on-demand fallback only while no spot ASG can launch: one that is
    // at its desired count, below max, with Launch not suspended could.
    let names = group.spec.asg_names();
    let spot_can = |a: &&AsgDescription| {
        let view = crate::controllers::group_view::AsgView::from(*a);
        !group.spec.is_fallback(&a.name)
            && names.contains(&a.name)
            && view.launching
            && !view.is_behind()
            && view.desired < view.max
    };
    if fresh.iter().any(|a| spot_can(&a)) {
        crate::controllers::guard::no_fallback_raise(group, changes)?;
    }
    Ok(())
}

/// Safety: the instance is active in that ASG of this group, no Node runs on
/// it, a decrement keeps the ASG at or above its min, and the rule book
/// allows it.
pub fn not_joined(
    group: &NodeGroup,
    fresh: &[AsgDescription],
    target: &crate::crd::replenisher::CleanupTarget,
    scene: &Scene,
) -> Result<(), Refusal> {
    removable(
        group,
        fresh,
        &target.auto_scaling_group,
        &target.instance_id,
        target.decrement,
    )?;
    let has_node = group.status.as_ref().is_some_and(|s| {
        s.nodes
            .iter()
            .any(|n| n.instance_id.as_deref() == Some(target.instance_id.as_str()))
    });
    if has_node {
        return Err(Refusal::HasANode {
            instance: target.instance_id.clone(),
        });
    }
    let d = Disruption {
        reason: Reason::NeverJoined,
        instance: &target.instance_id,
        node: None,
        in_hand: true,
        dead: false,
        floor: None,
    };
    validate(&d, scene).map_err(Refusal::Rule)
}

/// The reasons the replenisher gives a removal that is no repair: a
/// surplus, a node at risk, the on-demand fallback's return (the rule book
/// binds the three alike).
pub const REMOVALS: [Reason; 3] = [Reason::ScaleIn, Reason::AtRisk, Reason::FallbackReturn];

/// The Ready floor of removing `instance`: the group's desired count of
/// Ready nodes besides it.
fn floor(
    group: &NodeGroup,
    status: &crate::crd::NodeGroupStatus,
    fresh: &[AsgDescription],
    instance: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Floor {
    let nodes = group_nodes(&status.nodes, fresh, now);
    let ready = |n: &&crate::controllers::group_view::GroupNode| n.ready;
    let is =
        |n: &&crate::controllers::group_view::GroupNode| n.instance_id.as_deref() == Some(instance);
    let ready_besides = nodes.iter().filter(ready).filter(|n| !is(n)).count() as i32;
    Floor::of(ready_besides, group.spec.desired)
}

/// Safety: the target is active in its ASG, above min when the termination
/// decrements, and the rule book allows its removal for its reason (the
/// Ready floor, the slot, the window for a removal not yet in hand,
/// protection, the masters' rule, the breaker, a stop).
pub fn scale_in(
    group: &NodeGroup,
    status: &crate::crd::NodeGroupStatus,
    fresh: &[AsgDescription],
    target: &ScaleInTarget,
    scene: &Scene,
    now: chrono::DateTime<chrono::Utc>,
    in_hand: bool,
) -> Result<(), Refusal> {
    removable(
        group,
        fresh,
        &target.auto_scaling_group,
        &target.instance_id,
        target.decrement,
    )?;
    let d = Disruption {
        reason: carried(&target.instance_id, target.reason.as_deref(), &REMOVALS)?,
        instance: &target.instance_id,
        node: Some(&target.node),
        in_hand,
        dead: false,
        floor: Some(floor(group, status, fresh, &target.instance_id, now)),
    };
    validate(&d, scene).map_err(Refusal::Rule)
}

/// Safety for a repair: the target is active in that ASG of the group (above
/// min when the termination decrements), its node is still NotReady for
/// longer than the unhealthy timeout per the inventory, is not leaving on
/// an interruption notice, and the rule book allows it: a worker while the
/// group's circuit breaker is closed, a master while every other master of
/// the cluster is Ready (counted across every Master group, which replaces
/// the group's breaker: one dead master of a group of one is 100% of it).
/// Ready nodes are not counted: an unhealthy node costs none.
pub fn repair(
    group: &NodeGroup,
    status: &crate::crd::NodeGroupStatus,
    fresh: &[AsgDescription],
    target: &ScaleInTarget,
    scene: &Scene,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), Refusal> {
    removable(
        group,
        fresh,
        &target.auto_scaling_group,
        &target.instance_id,
        target.decrement,
    )?;
    // A repair's reason is its role's: a worker's would be free of the
    // masters' rule.
    let repairs = [Reason::repair(group.spec.role)];
    let d = Disruption {
        reason: carried(&target.instance_id, target.reason.as_deref(), &repairs)?,
        instance: &target.instance_id,
        node: Some(&target.node),
        in_hand: true,
        dead: true,
        floor: None,
    };
    validate(&d, scene).map_err(Refusal::Rule)?;
    let timeout = group.spec.replenish.unhealthy_timeout();
    let unhealthy = status.nodes.iter().any(|n| {
        n.name == target.node
            && n.instance_id.as_deref() == Some(target.instance_id.as_str())
            && !n.ready
            && n.interruption.as_ref().is_none_or(|i| !i.in_force(now))
            && n.unhealthy_since
                .is_some_and(|t| now >= crate::controllers::group_view::after(t, timeout))
    });
    if !unhealthy {
        return Err(Refusal::NotUnhealthy {
            node: target.node.clone(),
            timeout: crate::duration::format(timeout),
        });
    }
    Ok(())
}

/// Safety: an interrupted instance is terminated only while it is active in
/// that ASG of the group, its node records a notice in force that AWS
/// reclaims it (spot interruption, scheduled change from its drain start), a decrement keeps the ASG at or
/// above its min, and the rule book allows it (a master: while the other
/// masters are up; not while the group is stopped).
pub fn retire(
    group: &NodeGroup,
    status: &crate::crd::NodeGroupStatus,
    fresh: &[AsgDescription],
    r: &crate::crd::replenisher::Retirement,
    scene: &Scene,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), Refusal> {
    removable(
        group,
        fresh,
        &r.auto_scaling_group,
        &r.instance_id,
        r.decrement,
    )?;
    let d = Disruption {
        reason: Reason::Retirement,
        instance: &r.instance_id,
        node: Some(&r.node),
        in_hand: true,
        dead: false,
        floor: None,
    };
    validate(&d, scene).map_err(Refusal::Rule)?;
    let reclaimed = status.nodes.iter().any(|n| {
        n.instance_id.as_deref() == Some(r.instance_id.as_str())
            && n.interruption
                .as_ref()
                .filter(|i| i.in_force(now))
                .is_some_and(|i| matches!(Fate::of(i), Fate::Reclaimed { .. }))
    });
    if !reclaimed {
        return Err(Refusal::NotReclaimed {
            instance: r.instance_id.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::authority::ControlPlane;
    use crate::controllers::authority::validate::Refused;
    use crate::controllers::authority::validate::tests::open_scene;
    use crate::controllers::group_view::tests::{fresh, status_node};
    use crate::controllers::inventory::plan::tests::{group, t0};
    use crate::crd::Role;
    use crate::crd::replenisher::CleanupTarget;
    use crate::k8s::disruption_slot::SlotState;
    use std::collections::BTreeMap;

    const NONE: BTreeMap<String, String> = BTreeMap::new();
    const OURS: SlotState = SlotState::Ours;

    /// Every rule open, a worker's.
    fn open() -> Scene<'static> {
        static PROTECTED: BTreeMap<String, String> = NONE;
        static SLOT: SlotState = OURS;
        open_scene(Role::Worker, &PROTECTED, &SLOT)
    }

    /// A master's, the control plane as given.
    fn masters(cp: Option<&ControlPlane>) -> Scene<'_> {
        Scene {
            role: Role::Master,
            control_plane: cp,
            ..open()
        }
    }

    /// Group of ASGs a (i-1, i-2 with nodes n1, n2; i-9 never joined) and b
    /// (i-3 with n3), desired 2; a sits above its min of 1, b at its min.
    struct Case {
        group: NodeGroup,
        fresh: Vec<AsgDescription>,
    }

    impl Case {
        fn new() -> Case {
            let mut g = group(&["a", "b"], 2);
            g.status = Some(crate::crd::NodeGroupStatus {
                nodes: vec![
                    status_node("n1", "a", "i-1"),
                    status_node("n2", "a", "i-2"),
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
            a.min = 1;
            a.max = 4;
            let mut b = fresh("b", &[("i-3", "InService")]);
            b.min = 1;
            Case {
                group: g,
                fresh: vec![a, b],
            }
        }

        fn status(&self) -> &crate::crd::NodeGroupStatus {
            self.group.status.as_ref().expect("status")
        }
    }

    fn change(asg: &str, from: i32, to: i32) -> DesiredChange {
        DesiredChange {
            asg: asg.into(),
            from,
            to,
        }
    }

    fn cleanup(instance: &str, asg: &str, decrement: bool) -> CleanupTarget {
        CleanupTarget {
            instance_id: instance.into(),
            auto_scaling_group: asg.into(),
            reason: "not joined".into(),
            decrement,
            since: t0(),
        }
    }

    fn target(node: &str, instance: &str, asg: &str) -> ScaleInTarget {
        ScaleInTarget {
            node: node.into(),
            instance_id: instance.into(),
            auto_scaling_group: asg.into(),
            since: t0(),
            terminating: None,
            decrement: true,
            repair: false,
            reason: Some(Reason::ScaleIn.label().into()),
        }
    }

    #[test]
    fn a_raise_goes_only_to_the_groups_asgs_within_max_from_the_current_count() {
        let c = Case::new();
        let check = |changes: &[DesiredChange]| scale_up(&c.group, &c.fresh, changes);
        assert_eq!(check(&[change("a", 3, 4)]), Ok(()));
        assert_eq!(
            check(&[change("a", 3, 5)]),
            Err(Refusal::AboveMax {
                asg: "a".into(),
                to: 5,
                max: 4
            })
        );
        assert_eq!(
            check(&[change("a", 2, 3)]),
            Err(Refusal::StaleCount {
                asg: "a".into(),
                planned_from: 2,
                desired: 3
            })
        );
        assert_eq!(
            check(&[change("elsewhere", 1, 2)]),
            Err(Refusal::NotTheGroupsAsg {
                asg: "elsewhere".into()
            })
        );
    }

    #[test]
    fn only_an_active_instance_without_a_node_is_removed_and_decremented_only_above_min() {
        let c = Case::new();
        let check = |t: &CleanupTarget| not_joined(&c.group, &c.fresh, t, &open());
        assert_eq!(check(&cleanup("i-9", "a", true)), Ok(()));
        assert_eq!(
            check(&cleanup("i-1", "a", false)),
            Err(Refusal::HasANode {
                instance: "i-1".into()
            })
        );
        assert_eq!(
            check(&cleanup("i-42", "a", false)),
            Err(Refusal::NotActive {
                instance: "i-42".into(),
                asg: "a".into()
            })
        );
        let mut at_min = Case::new();
        at_min.fresh[0].min = 3;
        assert_eq!(
            not_joined(
                &at_min.group,
                &at_min.fresh,
                &cleanup("i-9", "a", true),
                &open()
            ),
            Err(Refusal::DecrementAtMin {
                instance: "i-9".into(),
                asg: "a".into()
            })
        );
        assert_eq!(
            not_joined(
                &at_min.group,
                &at_min.fresh,
                &cleanup("i-9", "a", false),
                &open()
            ),
            Ok(()),
            "at min, removed without decrement: the ASG replaces it"
        );
    }

    #[test]
    fn a_scale_in_keeps_ready_at_desired_and_its_asg_at_min() {
        let c = Case::new();
        let check =
            |t: &ScaleInTarget| scale_in(&c.group, c.status(), &c.fresh, t, &open(), t0(), true);
        assert_eq!(check(&target("n2", "i-2", "a")), Ok(()));
        assert_eq!(
            check(&target("n3", "i-3", "b")),
            Err(Refusal::DecrementAtMin {
                instance: "i-3".into(),
                asg: "b".into()
            })
        );
        let mut short = Case::new();
        if let Some(s) = short.group.status.as_mut() {
            s.nodes[2].ready = false;
        }
        assert_eq!(
            scale_in(
                &short.group,
                short.status(),
                &short.fresh,
                &target("n2", "i-2", "a"),
                &open(),
                t0(),
                true
            ),
            Err(Refusal::Rule(Refused::Floor {
                instance: "i-2".into(),
                ready_besides: 1,
                needed: 2
            }))
        );
    }

    #[test]
    fn a_removal_carrying_no_reason_or_one_its_kind_is_not_given_is_refused() {
        let c = Case::new();
        let check = |t: &ScaleInTarget| {
            let (status, fresh) = (c.status(), &c.fresh);
            removal(&c.group, status, fresh, t, &open(), t0(), true)
        };
        let unfit = |carried: Option<&str>, fits: &str| {
            Err(Refusal::UnfitReason {
                instance: "i-2".into(),
                carried: carried.map(String::from),
                fits: fits.into(),
            })
        };
        let removals = "scale_in or at_risk or fallback_return";
        let mut t = target("n2", "i-2", "a");
        t.reason = None;
        assert_eq!(check(&t), unfit(None, removals));
        // A removal carrying a repair's reason would be free of the window
        // and of protection.
        t.reason = Some(Reason::WorkerRepair.label().into());
        assert_eq!(check(&t), unfit(Some("worker_repair"), removals));
        // A repair carries its role's reason, nothing else.
        t.repair = true;
        t.reason = Some(Reason::ScaleIn.label().into());
        assert_eq!(check(&t), unfit(Some("scale_in"), "worker_repair"));
        t.reason = Some(Reason::MasterRepair.label().into());
        assert_eq!(check(&t), unfit(Some("master_repair"), "worker_repair"));
        t.reason = Some(Reason::AtRisk.label().into());
        t.repair = false;
        assert_eq!(check(&t), Ok(()));
    }

    #[test]
    fn only_a_reclaimed_instance_active_in_the_groups_asg_is_retired() {
        use crate::crd::nodegroup::NodeInterruption;
        use crate::crd::replenisher::Retirement;
        let mut c = Case::new();
        let retirement = |instance: &str, asg: &str, decrement: bool| Retirement {
            node: "n".into(),
            instance_id: instance.into(),
            auto_scaling_group: asg.into(),
            decrement,
            since: t0(),
            desired_before: None,
        };
        let interruption = |kind: &str| NodeInterruption {
            kind: kind.into(),
            noticed: t0(),
            deadline: t0(),
            loss_at: None,
            drain_from: None,
            late: None,
            drained: None,
        };
        let check =
            |c: &Case, r: &Retirement| retire(&c.group, c.status(), &c.fresh, r, &open(), t0());
        assert_eq!(
            check(&c, &retirement("i-2", "a", true)),
            Err(Refusal::NotReclaimed {
                instance: "i-2".into()
            }),
            "no notice on its node"
        );
        if let Some(s) = c.group.status.as_mut() {
            s.nodes[1].interruption = Some(interruption("state_change"));
            s.nodes[2].interruption = Some(interruption("spot_interruption"));
        }
        assert_eq!(
            check(&c, &retirement("i-2", "a", false)),
            Err(Refusal::NotReclaimed {
                instance: "i-2".into()
            }),
            "going by itself: its ASG replaces it"
        );
        assert_eq!(check(&c, &retirement("i-3", "b", false)), Ok(()));
        assert_eq!(
            check(&c, &retirement("i-3", "b", true)),
            Err(Refusal::DecrementAtMin {
                instance: "i-3".into(),
                asg: "b".into()
            })
        );
        assert_eq!(
            check(&c, &retirement("i-3", "a", false)),
            Err(Refusal::NotActive {
                instance: "i-3".into(),
                asg: "a".into()
            })
        );
    }

    #[test]
    fn a_masters_retirement_asks_whether_the_other_masters_are_up() {
        use crate::controllers::authority::{Blocked, DownWhy, MasterDown};
        use crate::crd::nodegroup::NodeInterruption;
        use crate::crd::replenisher::Retirement;
        let mut c = Case::new();
        c.group.spec.role = Role::Master;
        if let Some(s) = c.group.status.as_mut() {
            s.nodes[2].interruption = Some(NodeInterruption {
                kind: "spot_interruption".into(),
                noticed: t0(),
                deadline: t0(),
                loss_at: None,
                drain_from: None,
                late: None,
                drained: None,
            });
        }
        let r = Retirement {
            node: "n3".into(),
            instance_id: "i-3".into(),
            auto_scaling_group: "b".into(),
            decrement: false,
            since: t0(),
            desired_before: None,
        };
        let unobserved = retire(&c.group, c.status(), &c.fresh, &r, &masters(None), t0());
        assert!(
            matches!(
                unobserved,
                Err(Refusal::Rule(Refused::Masters(
                    Blocked::ControlPlaneUnobserved { .. }
                )))
            ),
            "{unobserved:?}"
        );
        // i-1 up, i-2's kubelet dead: taking i-3 too leaves one master of 3.
        let short = ControlPlane {
            expected: 3,
            ready: ["i-1".to_string()].into(),
            down: ["i-2", "i-3"]
                .iter()
                .map(|id| MasterDown {
                    group: "masters".into(),
                    instance: Some(id.to_string()),
                    why: DownWhy::NotReady,
                })
                .collect(),
            ..Default::default()
        };
        let refused = retire(
            &c.group,
            c.status(),
            &c.fresh,
            &r,
            &masters(Some(&short)),
            t0(),
        );
        assert!(
            matches!(
                &refused,
                Err(Refusal::Rule(Refused::Masters(Blocked::OtherMastersDown {
                    ready_besides: 1,
                    needed: 2,
                    ..
                })))
            ),
            "{refused:?}"
        );
        let whole = ControlPlane {
            expected: 3,
            ready: ["i-1", "i-2"].iter().map(|s| s.to_string()).collect(),
            down: vec![],
            ..Default::default()
        };
        assert_eq!(
            retire(
                &c.group,
                c.status(),
                &c.fresh,
                &r,
                &masters(Some(&whole)),
                t0()
            ),
            Ok(())
        );
    }

    #[test]
    fn the_fallback_is_raised_only_while_no_spot_asg_could_launch() {
        let mut case = Case::new();
        case.group.spec.fallback = Some(crate::crd::nodegroup::FallbackSpec {
            auto_scaling_groups: vec![crate::crd::nodegroup::AutoScalingGroupRef {
                name: "od".into(),
            }],
            after: "3m".into(),
            return_after: "10m".into(),
        });
        case.fresh.push(fresh("od", &[]));
        let raise = [DesiredChange {
            asg: "od".into(),
            from: 0,
            to: 1,
        }];
        // a and b at their desired count, below max: spot could launch.
        assert_eq!(
            scale_up(&case.group, &case.fresh, &raise),
            Err(Refusal::FallbackRaise { asg: "od".into() })
        );
        // Both behind and failing: the fallback may go up.
        for asg in &mut case.fresh[..2] {
            asg.desired += 1;
            asg.recent_failure = Some("InsufficientInstanceCapacity".into());
        }
        assert_eq!(scale_up(&case.group, &case.fresh, &raise), Ok(()));
    }
}
