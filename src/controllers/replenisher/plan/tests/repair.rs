//! Node repair: a node NotReady past the unhealthy timeout is replaced
//! (workers) and terminated; a shorter NotReady is a blip and changes
//! nothing; the circuit breaker and the master rule hold repairs back.

use super::properties::arb_state;
use super::*;
use crate::crd::replenisher::Replacement;

fn minutes(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

/// `na` (in a) NotReady for `minutes_down`; nc and nd Ready.
fn na_down(minutes_down: i64) -> Scenario {
    let mut s = Scenario::steady();
    s.nodes[0] = not_ready_for("na", "a", minutes_down);
    s
}

fn replaced_in(asg: &str) -> Replacement {
    Replacement {
        node: "na".into(),
        instance_id: "i-na".into(),
        auto_scaling_group: asg.into(),
        since: t0(),
    }
}

/// The replacement raised in `a` is Ready: a at 2, its node `na2` Ready.
fn replacement_ready(mut s: Scenario, p: Plan) -> Scenario {
    s.status = p.status;
    raise_landed(&mut s.status);
    s.asgs[0] = asg("a", 2, 2, 3);
    s.nodes.push(node("na2", "a", true, 1));
    s
}

fn drained_target(p: &Plan) -> &ScaleInTarget {
    match &p.command {
        Command::Drain(t) => t,
        other => panic!("expected a drain, got {other:?}: {}", p.message),
    }
}

#[test]
fn a_notready_blip_shorter_than_the_timeout_launches_and_terminates_nothing() {
    let s = na_down(3);
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    assert!(p.message.contains("on their way"), "{}", p.message);
    assert_eq!(p.repair_held, None);
    // It wakes when the node would turn unhealthy, not later.
    assert!(
        p.requeue <= Duration::from_secs(7 * 60),
        "requeue {:?}",
        p.requeue
    );
    // An old node (launched long ago) is not stuck the moment it goes
    // NotReady: its NotReady time counts, not its launch time.
    assert_eq!(s.nodes[0].launch_time, Some(t0() - minutes(600)));
}

#[test]
fn an_unhealthy_worker_is_replaced_in_its_own_asg_then_drained_and_terminated_with_decrement() {
    let s = na_down(11);
    let p = s.plan();
    assert_eq!(
        p.command,
        Command::SetDesired(vec![DesiredChange {
            asg: "a".into(),
            from: 1,
            to: 2
        }]),
        "{}",
        p.message
    );
    assert_eq!(p.status.replacing, vec![replaced_in("a")]);
    assert!(p.message.contains("replacing na"), "{}", p.message);

    let s = replacement_ready(s, p);
    let p = s.plan();
    let target = drained_target(&p);
    assert_eq!(target.node, "na");
    assert!(target.repair, "drained as a repair (best effort)");
    assert!(
        target.decrement,
        "its replacement was raised in its own ASG"
    );
    assert_eq!(p.status.phase, ReplenishPhase::Repairing);
    assert_eq!(p.status.scale_in.as_ref(), Some(target), "recorded first");
}

#[test]
fn a_repair_in_progress_is_never_abandoned_and_its_termination_is_recorded_first() {
    let s = na_down(11);
    let p = s.plan();
    let mut s = replacement_ready(s, p);
    let p = s.plan();
    s.status = p.status.clone();
    // The replacement goes NotReady too: a scale-in would be abandoned
    // (Ready below desired), a repair goes on: its node costs no Ready node.
    s.nodes[3].ready = false;
    let p = s.plan();
    assert!(matches!(p.command, Command::Drain(_)), "{:?}", p.command);
    // Well past a scale-in's drain timeout: still not abandoned.
    let later = t0() + minutes(30);
    let p = s.plan_with(Duration::from_secs(300), Duration::from_secs(900), later);
    assert!(matches!(p.command, Command::Drain(_)), "{:?}", p.command);
    // Drained: the termination is recorded, then made (after a restart, the
    // recorded one, never a second node).
    let recorded = record_termination(&mut s.status, t0()).expect("a target");
    let p = s.plan();
    assert_eq!(p.command, Command::Terminate(recorded), "{}", p.message);
}

#[test]
fn an_unhealthy_master_is_terminated_in_its_asg_without_decrement_and_never_surged() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    s.asgs = vec![asg("a", 1, 1, 1), asg("c", 1, 1, 1), asg("d", 1, 1, 1)];
    s.nodes[0] = not_ready_for("na", "a", 11);
    let p = s.plan();
    let target = drained_target(&p);
    assert_eq!(
        (target.node.as_str(), target.repair, target.decrement),
        ("na", true, false),
        "{}",
        p.message
    );
    // Its ASG was not raised: masters cannot surge.
    assert!(p.status.raising.is_empty());
}

#[test]
fn a_master_is_repaired_only_while_every_other_master_is_ready() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    s.asgs = vec![asg("a", 1, 1, 1), asg("c", 1, 1, 1), asg("d", 1, 1, 1)];
    s.nodes[0] = not_ready_for("na", "a", 11);
    // Another master in a blip.
    s.nodes[1] = not_ready_for("nc", "c", 1);
    let p = s.plan();
    assert!(
        !matches!(p.command, Command::Drain(_) | Command::Terminate(_)),
        "{:?}",
        p.command
    );
    let held = p.repair_held.expect("the condition says why");
    // Two of three masters NotReady, neither on its way back: only the
    // user can tell a blip from a second death.
    assert_eq!(held.reason, "ControlPlaneQuorumAtRisk");
    assert_eq!(held.nodes, vec!["na".to_string()]);
}

#[test]
fn a_worker_no_asg_can_replace_is_terminated_without_decrement_so_its_asg_replaces_it() {
    // kops groups often have min = max: nothing can be raised.
    let mut s = na_down(11);
    s.asgs = vec![asg("a", 1, 1, 1), asg("c", 1, 1, 1), asg("d", 1, 1, 1)];
    let p = s.plan();
    let target = drained_target(&p);
    assert_eq!((target.node.as_str(), target.decrement), ("na", false));
    assert!(target.repair);
}

#[test]
fn the_circuit_breaker_holds_every_repair_back_and_says_why() {
    let mut s = na_down(11);
    s.nodes[1] = not_ready_for("nc", "c", 11);
    s.breaker = Some("2 of 3 node(s) NotReady, more than 50%".into());
    let p = s.plan();
    assert!(
        !matches!(p.command, Command::Drain(_) | Command::Terminate(_)),
        "{:?}",
        p.command
    );
    let held = p.repair_held.clone().expect("the condition says why");
    assert_eq!(held.reason, "CircuitBreakerOpen");
    assert!(held.message.contains("2 of 3"), "{}", held.message);
    assert_eq!(held.nodes, vec!["na".to_string(), "nc".to_string()]);
    // With the replacements Ready, still nothing is terminated.
    let mut s = replacement_ready(s, p);
    s.nodes.push(node("nc2", "c", true, 1));
    let p = s.plan();
    assert!(
        !matches!(p.command, Command::Drain(_) | Command::Terminate(_)),
        "{:?}",
        p.command
    );
}

#[test]
fn with_repair_off_an_unhealthy_worker_is_replaced_beside_but_never_terminated() {
    let mut s = na_down(11);
    s.repair = false;
    let p = s.plan();
    assert!(
        matches!(p.command, Command::SetDesired(_)),
        "not on its way: {}",
        p.message
    );
    assert!(p.status.replacing.is_empty(), "not leaving through us");
    assert_eq!(
        p.repair_held.as_ref().map(|h| h.reason),
        Some("RepairDisabled")
    );
    let s = replacement_ready(s, p);
    let p = s.plan();
    assert!(
        !matches!(p.command, Command::Drain(_) | Command::Terminate(_)),
        "{:?}",
        p.command
    );
}

#[test]
fn a_node_that_recovers_after_its_replacement_was_raised_is_kept_and_the_surplus_taken_back() {
    let s = na_down(11);
    let p = s.plan();
    let mut s = replacement_ready(s, p);
    assert_eq!(s.status.replacing, vec![replaced_in("a")]);
    // The kubelet came back.
    s.nodes[0] = node("na", "a", true, 600);
    s.status.last_modification = None;
    let p = s.plan();
    assert!(p.status.replacing.is_empty(), "its replacement record goes");
    let target = drained_target(&p);
    assert!(!target.repair, "a plain scale-in of the surplus");
    assert_eq!(target.node, "na2", "the newest node of the raised ASG");
}

proptest! {
    /// A repair only ever targets a node that is NotReady past the
    /// unhealthy timeout, and never while the circuit breaker is open.
    #[test]
    fn a_repair_targets_only_an_unhealthy_node(s in arb_state()) {
        let p = s.plan();
        if let Some(t) = p.status.scale_in.as_ref().filter(|t| t.repair)
            && s.status.scale_in.is_none()
        {
            let node = s.nodes.iter().find(|n| n.name == t.node).expect("a node of the group");
            prop_assert!(!node.ready, "{} is Ready", t.node);
            prop_assert!(
                node.unhealthy_since.is_some_and(|since| t0() - since >= minutes(10)),
                "{} is not past the timeout: {:?}", t.node, node.unhealthy_since
            );
            prop_assert!(s.breaker.is_none());
        }
    }
}

/// The control plane beside a Master group of one (`na`, in a): masters
/// i-mb and i-mc of two other groups, Ready unless listed `down` (why).
fn elsewhere(down: &[(&str, crate::controllers::authority::DownWhy)]) -> ControlPlane {
    use crate::controllers::authority::MasterDown;
    let mut cp = ControlPlane {
        expected: 3,
        ..Default::default()
    };
    for id in ["i-mb", "i-mc"] {
        match down.iter().find(|(d, _)| *d == id) {
            Some((_, why)) => cp.down.push(MasterDown {
                group: "other".into(),
                instance: Some(id.into()),
                why: *why,
            }),
            None => {
                cp.ready.insert(id.into());
            }
        }
    }
    cp
}

/// kops's per-zone layout: a Master group of one whose master `na` is dead
/// (so its own breaker, 100% NotReady, is open).
fn dead_master_of_one(
    down_elsewhere: &[(&str, crate::controllers::authority::DownWhy)],
) -> Scenario {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    s.desired = 1;
    s.asgs = vec![asg("a", 1, 1, 1)];
    s.nodes = vec![not_ready_for("na", "a", 11)];
    s.breaker = Some("1 of 1 nodes NotReady (100%)".into());
    let mut cp = elsewhere(down_elsewhere);
    cp.down.push(crate::controllers::authority::MasterDown {
        group: "masters-a".into(),
        instance: Some("i-na".into()),
        why: crate::controllers::authority::DownWhy::NotReady,
    });
    s.control_plane = Some(cp);
    s
}

use crate::controllers::authority::{ControlPlane, DownWhy};

/// A plan that drains and terminates nothing, its condition saying why.
fn held_back(p: &Plan) -> super::super::RepairHeld {
    assert!(
        !matches!(p.command, Command::Drain(_) | Command::Terminate(_)),
        "{:?}: {}",
        p.command,
        p.message
    );
    p.repair_held.clone().expect("the condition says why")
}

#[test]
fn a_dead_master_of_a_group_of_one_is_repaired_while_the_clusters_other_masters_are_ready() {
    let s = dead_master_of_one(&[]);
    let p = s.plan();
    let target = drained_target(&p);
    assert_eq!((target.node.as_str(), target.repair), ("na", true));
    assert_eq!(
        p.repair_held, None,
        "one master of three is not a partition"
    );
}

#[test]
fn a_dead_master_waits_while_another_groups_master_boots_and_says_why() {
    let s = dead_master_of_one(&[("i-mb", DownWhy::Launching)]);
    let p = s.plan();
    let held = held_back(&p);
    assert_eq!(held.reason, "OtherMastersNotReady");
    assert!(
        held.message.contains("i-mb of other (launching)"),
        "{}",
        held.message
    );
    assert!(
        p.requeue <= Duration::from_secs(10),
        "looked at again soon: another group's master does not wake it ({:?})",
        p.requeue
    );
}

#[test]
fn two_dead_masters_of_three_are_left_to_the_user_and_the_condition_says_so() {
    let s = dead_master_of_one(&[("i-mb", DownWhy::NotReady)]);
    let p = s.plan();
    assert!(!matches!(
        p.command,
        Command::Drain(_) | Command::Terminate(_)
    ));
    let held = p.repair_held.expect("the condition says why");
    assert_eq!(held.reason, "ControlPlaneQuorumAtRisk");
    assert!(held.message.contains("by hand"), "{}", held.message);
    // The user's fix (the other master back) wakes nothing of this
    // group: with nothing of its own to hold, it looks again all the same.
    let mut s = dead_master_of_one(&[("i-mb", DownWhy::NotReady)]);
    s.lock = LockState::Free;
    s.slot = Some(SlotState::Free);
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    assert!(
        p.requeue <= Duration::from_secs(30),
        "looked at again: {:?}",
        p.requeue
    );
}

/// Issue 68, hole 1: a master's repair needs no disruption slot (its
/// master is down already; the masters' rule serialises it with any other
/// master's removal), so another group holding the slot, or none taken,
/// holds nothing back.
#[test]
fn a_master_repair_needs_no_slot_and_goes_on_while_another_group_holds_it() {
    for slot in [
        SlotState::Free,
        SlotState::Full("masters-b is disrupting a control-plane node".into()),
    ] {
        let mut s = dead_master_of_one(&[]);
        s.slot = Some(slot.clone());
        let p = s.plan();
        assert!(
            matches!(p.command, Command::Drain(_)),
            "{slot:?}: {:?}: {}",
            p.command,
            p.message
        );
        assert_eq!(p.status.phase, ReplenishPhase::Repairing);
        assert_eq!(p.repair_held, None, "{slot:?}");
    }
}

#[test]
fn a_repair_whose_node_is_ready_again_is_given_up_before_or_after_its_termination_is_recorded() {
    let s = na_down(11);
    let p = s.plan();
    let mut s = replacement_ready(s, p);
    let p = s.plan();
    s.status = p.status.clone();
    assert!(matches!(p.command, Command::Drain(_)), "{:?}", p.command);
    // Its kubelet comes back while a budget holds the drain.
    s.nodes[0] = node("na", "a", true, 600);
    let p = s.plan();
    match &p.command {
        Command::GiveBack { target, reason } => {
            assert_eq!(target.node, "na");
            assert!(reason.contains("Ready again"), "{reason}");
        }
        other => panic!("expected the repair given up, got {other:?}: {}", p.message),
    }
    // The same once the termination was recorded (the guard would refuse
    // it on every reconcile: the group hung).
    let recorded = record_termination(&mut s.status, t0()).expect("a target");
    assert!(recorded.terminating.is_some());
    let p = s.plan();
    assert!(
        matches!(p.command, Command::GiveBack { .. }),
        "{:?}: {}",
        p.command,
        p.message
    );
    // Given up, the group goes on: what was raised for it is surplus.
    let mut after = s;
    abandon_scale_in(&mut after.status, "Ready again", t0());
    let p = after.plan_with(Duration::ZERO, Duration::from_secs(900), t0() + minutes(1));
    assert!(after.status.scale_in.is_none());
    assert!(
        matches!(p.command, Command::Drain(ref t) if !t.repair && t.node == "na2"),
        "the surplus goes: {:?}: {}",
        p.command,
        p.message
    );
}

#[test]
fn a_master_repair_is_given_up_when_another_master_goes_down_before_its_termination() {
    let mut s = dead_master_of_one(&[]);
    let p = s.plan();
    s.status = p.status.clone();
    assert!(matches!(p.command, Command::Drain(_)));
    s.control_plane = dead_master_of_one(&[("i-mc", DownWhy::NotReady)]).control_plane;
    let p = s.plan();
    match &p.command {
        Command::GiveBack { reason, .. } => {
            assert!(reason.contains("i-mc"), "{reason}")
        }
        other => panic!("expected the repair given up, got {other:?}: {}", p.message),
    }
}

/// Issue 69 item 6: the only master of the cluster, its kubelet dead while
/// its apiserver answers: replacing it stops the API, so it is held, the
/// condition saying why and what allows it (looked at again, as another
/// Master group's setting wakes nothing here); allowed, it is repaired.
#[test]
fn the_only_master_is_repaired_only_when_the_outage_is_allowed() {
    let only = |allowed: bool| {
        let mut s = dead_master_of_one(&[]);
        s.control_plane = Some(ControlPlane {
            expected: 1,
            down: vec![crate::controllers::authority::MasterDown {
                group: "masters-a".into(),
                instance: Some("i-na".into()),
                why: DownWhy::NotReady,
            }],
            outage_allowed: allowed,
            ..Default::default()
        });
        s
    };
    let p = only(false).plan();
    let held = held_back(&p);
    assert_eq!(held.reason, "ControlPlaneOutage");
    assert!(
        held.message.contains("allowControlPlaneOutage"),
        "{}",
        held.message
    );
    assert!(p.requeue <= Duration::from_secs(30), "{:?}", p.requeue);

    let p = only(true).plan();
    let target = drained_target(&p);
    assert_eq!((target.node.as_str(), target.repair), ("na", true));
    assert_eq!(p.repair_held, None);
}
