//! Interrupted nodes: replaced before their loss, terminated by us once
//! drained or at their deadline, exactly one new instance per lost one.

use super::properties::arb_state;
use super::*;
use crate::controllers::replenisher::plan::interrupted::RETIRE_GRACE;
use crate::crd::replenisher::{Replacement, Retirement};

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

/// `na` (in a) reclaimed by AWS, its deadline at `t0 + deadline_in`.
fn reclaimed_in_a(deadline_in: i64) -> Scenario {
    let mut s = Scenario::steady();
    s.nodes[0].ready = false;
    s.nodes[0].fate = Some(Fate::Reclaimed {
        deadline: t0() + secs(deadline_in),
        drained: false,
    });
    s
}

fn replaced(node: &str, asg: &str) -> Replacement {
    Replacement {
        node: node.into(),
        instance_id: format!("i-{node}"),
        auto_scaling_group: asg.into(),
        since: t0(),
    }
}

/// The end of `na`'s drain recorded (at its deadline, or drained).
fn drain_ended(mut s: Scenario) -> Scenario {
    if let Some(Fate::Reclaimed { drained, .. }) = s.nodes[0].fate.as_mut() {
        *drained = true;
    }
    s
}

/// Its Launch process is suspended.
fn not_launching(mut a: AsgView) -> AsgView {
    a.suspended_processes = vec![crate::cloud::LAUNCH.into()];
    a.judge(None, t0())
}

fn change(asg: &str, from: i32, to: i32) -> Command {
    Command::SetDesired(vec![DesiredChange {
        asg: asg.into(),
        from,
        to,
    }])
}

#[test]
fn a_reclaimed_node_is_replaced_at_once_in_its_own_asg_even_in_the_cooldown() {
    let mut s = reclaimed_in_a(60);
    // A modification 10 s ago: the cooldown (5 m) is running.
    s.status.last_modification = Some(t0() - secs(10));
    let p = s.plan();
    assert_eq!(p.command, change("a", 1, 2), "{}", p.message);
    assert_eq!(p.status.replacing, vec![replaced("na", "a")]);
    assert!(p.message.contains("replacing na"), "{}", p.message);
    // The raise landed, the new instance is on its way: nothing more is
    // ordered for it, and the reclaimed node is not terminated before due.
    s.status = p.status;
    raise_landed(&mut s.status);
    s.asgs[0] = asg("a", 2, 2, 3);
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    assert!(p.message.contains("on their way"), "{}", p.message);
    assert_eq!(p.requeue, SOON);
    // Drained before the replacement is launched: kept until it is.
    s.nodes[0].fate = Some(Fate::Reclaimed {
        deadline: t0() + secs(60),
        drained: true,
    });
    s.asgs[0] = asg("a", 2, 1, 3);
    assert_eq!(s.plan().command, Command::Nothing);
    s.asgs[0] = asg("a", 2, 2, 3);
    let p = s.plan();
    assert!(matches!(&p.command, Command::Retire(r) if r[0].node == "na" && r[0].decrement));
}

#[test]
fn a_replaced_node_is_terminated_when_due_taking_back_the_raise_in_its_own_asg() {
    let mut s = drain_ended(reclaimed_in_a(0));
    s.asgs[0] = asg("a", 2, 2, 3);
    s.status.replacing = vec![replaced("na", "a")];
    s.status.raised = vec![AsgCount {
        auto_scaling_group: "a".into(),
        count: 1,
    }];
    let p = s.plan();
    let retirement = Retirement {
        node: "na".into(),
        instance_id: "i-na".into(),
        auto_scaling_group: "a".into(),
        decrement: true,
        since: t0(),
        desired_before: Some(2),
    };
    assert_eq!(p.command, Command::Retire(vec![retirement.clone()]));
    assert_eq!(p.status.retiring, vec![retirement.clone()]);
    assert!(p.status.raised.is_empty(), "{:?}", p.status.raised);
    // Killed after the record: the same termination is retried, nothing else.
    s.status = p.status;
    let p = s.plan();
    assert_eq!(p.command, Command::Retire(vec![retirement]));
    assert!(p.status.raised.is_empty());
    // Once its instance has left the ASG, the record is settled.
    s.nodes.remove(0);
    s.nodes.push(node("na2", "a", true, 1));
    let taken = s.status.clone();
    s.asgs[0] = asg("a", 1, 1, 3);
    let p = s.plan();
    assert!(p.status.retiring.is_empty() && p.status.replacing.is_empty());
    assert!(
        p.status.raised.is_empty(),
        "decremented: {:?}",
        p.status.raised
    );
    releases(&p);
    // AWS took it first (a's count still 2, its ASG launching in its
    // place): the raise the decrement was to take back is kept, a surplus
    // the scale-in takes back.
    s.status = taken;
    s.asgs[0] = asg("a", 2, 1, 3);
    let p = s.plan();
    assert!(p.status.retiring.is_empty());
    assert_eq!(
        p.status.raised,
        vec![AsgCount {
            auto_scaling_group: "a".into(),
            count: 1
        }]
    );
}

#[test]
fn when_its_own_asg_cannot_launch_the_replacement_goes_elsewhere_and_no_decrement_is_made() {
    let mut s = reclaimed_in_a(60);
    s.asgs[0] = not_launching(asg("a", 1, 1, 3));
    let p = s.plan();
    assert_eq!(p.command, change("c", 1, 2), "{}", p.message);
    assert_eq!(p.status.replacing, vec![replaced("na", "c")]);
    // Due: terminated without decrement, so a keeps its count and launches
    // one in its place once it can; c's raise stays, to be taken back.
    let mut s = drain_ended(reclaimed_in_a(0));
    s.asgs[0] = not_launching(asg("a", 1, 1, 3));
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 1));
    s.status = p.status;
    raise_landed(&mut s.status);
    let p = s.plan();
    let Command::Retire(r) = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert_eq!((r.len(), r[0].decrement), (1, false), "{r:?}");
    assert_eq!(p.status.raised[0].auto_scaling_group, "c");
    assert_eq!(p.status.raised[0].count, 1);
}

#[test]
fn a_reclaimed_node_that_could_not_be_replaced_is_left_to_aws() {
    let mut s = reclaimed_in_a(0);
    for a in &mut s.asgs {
        *a = not_launching(a.clone());
    }
    let p = s.plan();
    assert!(!matches!(p.command, Command::Retire(_)), "{:?}", p.command);
    assert_eq!(p.status.phase, ReplenishPhase::Blocked, "{}", p.message);
    assert!(p.status.replacing.is_empty());
}

#[test]
fn one_replacement_per_reclaimed_node_even_for_several_at_once() {
    let mut s = reclaimed_in_a(60);
    s.nodes[1].ready = false;
    s.nodes[1].fate = s.nodes[0].fate;
    let p = s.plan();
    assert_eq!(
        p.command,
        Command::SetDesired(vec![
            DesiredChange {
                asg: "a".into(),
                from: 1,
                to: 2
            },
            DesiredChange {
                asg: "c".into(),
                from: 1,
                to: 2
            },
        ])
    );
    assert_eq!(p.status.replacing.len(), 2);
}

#[test]
fn a_node_already_going_by_itself_is_replaced_by_its_asg_not_by_us() {
    let mut s = Scenario::steady();
    s.nodes[0].ready = false;
    s.nodes[0].fate = Some(Fate::Lost);
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    assert!(p.message.contains("on their way"), "{}", p.message);
}

#[test]
fn an_at_risk_node_is_replaced_first_then_removed_once_the_replacement_is_ready() {
    let mut s = Scenario::steady();
    s.nodes[0].ready = false;
    s.nodes[0].fate = Some(Fate::AtRisk);
    let p = s.plan();
    assert_eq!(p.command, change("a", 1, 2), "{}", p.message);
    s.status = p.status;
    raise_landed(&mut s.status);
    // Launched, not yet Ready: the node stays.
    s.asgs[0] = asg("a", 2, 2, 3);
    s.nodes.push(node("na2", "a", false, 0));
    assert_eq!(s.plan().command, Command::Nothing);
    // Ready: drained and removed with decrement, the cooldown regardless.
    s.nodes[3].ready = true;
    let p = s.plan();
    let Command::Drain(target) = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert_eq!((target.node.as_str(), target.decrement), ("na", true));
    // Its termination takes back the raise made for it.
    s.status = p.status;
    let target = record_termination(&mut s.status, t0()).expect("target");
    assert!(target.terminating.is_some());
    assert!(s.status.raised.is_empty(), "{:?}", s.status.raised);
}

#[test]
fn an_interrupted_master_is_replaced_only_in_its_own_asg() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    s.nodes[0].ready = false;
    s.nodes[0].fate = Some(Fate::Reclaimed {
        deadline: t0() + secs(60),
        drained: false,
    });
    assert_eq!(s.plan().command, change("a", 1, 2));
    // Its ASG at max: blocked, never another master ASG.
    s.asgs[0] = asg("a", 1, 1, 1);
    let p = s.plan();
    assert_eq!(p.status.phase, ReplenishPhase::Blocked, "{}", p.message);
    assert!(!matches!(p.command, Command::SetDesired(_)));
}

#[test]
fn without_the_lock_nothing_is_recorded() {
    let mut s = reclaimed_in_a(0);
    s.status.replacing = vec![replaced("na", "a")];
    s.lock = LockState::Free;
    let p = s.plan();
    needs_the_lock(&p);
    assert!(p.status.retiring.is_empty());
}

// ---- properties over random states with interrupted nodes ----

/// Random states where some nodes carry an interruption notice (reclaimed,
/// due or not; at risk; lost), some with a replacement already recorded.
fn arb_interrupted() -> impl Strategy<Value = Scenario> {
    (
        arb_state(),
        prop::collection::vec((0u8..6, 0u8..3), 12),
        any::<bool>(),
    )
        .prop_map(|(mut s, fates, retiring)| {
            let asgs: Vec<String> = s.asgs.iter().map(|a| a.name.clone()).collect();
            for (n, (fate, replaced)) in s.nodes.iter_mut().zip(fates) {
                n.fate = match fate {
                    0 => Some(Fate::Reclaimed {
                        deadline: t0() - secs(1),
                        drained: true,
                    }),
                    1 => Some(Fate::Reclaimed {
                        deadline: t0() + secs(30),
                        drained: replaced == 1,
                    }),
                    2 => Some(Fate::AtRisk),
                    3 => Some(Fate::Lost),
                    _ => None,
                };
                if n.fate.is_none() {
                    continue;
                }
                n.ready = false;
                let own = n.asg.clone().unwrap_or_default();
                let elsewhere = asgs.iter().find(|a| **a != own).cloned();
                let asg = match replaced {
                    0 => None,
                    1 => Some(own),
                    _ => elsewhere,
                };
                if let Some(asg) = asg {
                    s.status.replacing.push(replaced_in(&n.name, &asg));
                }
            }
            if retiring && let Some(r) = s.status.replacing.first() {
                s.status.retiring.push(Retirement {
                    node: r.node.clone(),
                    instance_id: r.instance_id.clone(),
                    auto_scaling_group: r.auto_scaling_group.clone(),
                    decrement: false,
                    since: t0(),
                    desired_before: None,
                });
            }
            s
        })
}

fn replaced_in(node: &str, asg: &str) -> Replacement {
    Replacement {
        instance_id: node.into(),
        ..replaced(node, asg)
    }
}

proptest! {
    /// We terminate only reclaimed nodes we replaced, once due, with a
    /// decrement only in the ASG that was raised for them (or what a
    /// restart found recorded).
    #[test]
    fn only_replaced_reclaimed_nodes_are_terminated_when_due(s in arb_interrupted()) {
        let p = s.plan();
        if matches!(s.lock, LockState::Other(_)) {
            prop_assert!(!p.command.mutates(), "{:?}", p.command);
        }
        if let Command::Retire(rs) = &p.command {
            for r in rs {
                if s.status.retiring.contains(r) {
                    continue;
                }
                let node = s.nodes.iter().find(|n| n.instance_id.as_deref() == Some(&r.instance_id));
                let node = node.expect("a node of the group");
                let replacement = s.status.replacing.iter().find(|x| x.instance_id == r.instance_id);
                prop_assert!(replacement.is_some(), "{} never replaced", r.node);
                let launched = s.asgs.iter().any(|a| replacement.is_some_and(|x| x.auto_scaling_group == a.name) && !a.is_behind());
                let restored = s.nodes.iter().filter(|n| n.ready).count() as i32 >= s.desired;
                let due = matches!(node.fate, Some(Fate::Reclaimed { deadline, drained }) if deadline <= t0() || (drained && (launched || restored)));
                prop_assert!(due, "{:?} not due", node);
                if r.decrement {
                    prop_assert_eq!(&replacement.expect("replacement").auto_scaling_group, &r.auto_scaling_group);
                }
            }
        }
    }

    /// One replacement per interrupted node, and only for nodes leaving
    /// through us; a scale-up stays within max and only while short.
    #[test]
    fn each_interrupted_node_is_replaced_at_most_once(s in arb_interrupted()) {
        let p = s.plan();
        let mut ids: Vec<&str> = p.status.replacing.iter().map(|r| r.instance_id.as_str()).collect();
        let all = ids.len();
        ids.sort();
        ids.dedup();
        prop_assert_eq!(ids.len(), all, "{:?}", p.status.replacing);
        for r in &p.status.replacing {
            if s.status.replacing.contains(r) {
                continue;
            }
            let node = s.nodes.iter().find(|n| n.instance_id.as_deref() == Some(&r.instance_id));
            // Interrupted, or an unhealthy worker repaired (replaced first).
            let unhealthy = |n: &GroupNode| {
                s.role == Role::Worker
                    && s.repair
                    && !n.ready
                    && n.fate.is_none()
                    && n.unhealthy_since.is_some_and(|t| t0() - t >= chrono::Duration::minutes(10))
            };
            prop_assert!(
                node.is_some_and(|n| matches!(n.fate, Some(Fate::Reclaimed { .. } | Fate::AtRisk)) || unhealthy(n)),
                "{:?}", r
            );
            prop_assert!(matches!(p.command, Command::SetDesired(_)), "{:?}", p.command);
        }
        let ready = s.nodes.iter().filter(|n| n.ready).count() as i32;
        if let Command::SetDesired(changes) = &p.command {
            prop_assert!(ready < s.desired);
            for c in changes {
                let a = s.asgs.iter().find(|a| a.name == c.asg).expect("known ASG");
                prop_assert!(c.to <= a.max && c.to > c.from && a.launching, "{:?}", c);
            }
        }
        if let Command::Drain(t) = &p.command {
            let target_ready = s.nodes.iter().any(|n| n.instance_id.as_deref() == Some(&t.instance_id) && n.ready);
            // A repair's target is not Ready: it costs no Ready node.
            prop_assert!(
                (t.repair && !target_ready) || ready - i32::from(target_ready) >= s.desired,
                "drains {:?} with {} Ready of {}", t, ready, s.desired
            );
        }
    }
}

#[test]
fn at_its_deadline_a_node_waits_for_its_drains_report_or_a_grace() {
    // Deadline now, the drain's end not recorded yet: kept, so the drain can
    // report what it left; woken for the grace's end.
    let mut s = reclaimed_in_a(0);
    s.asgs[0] = asg("a", 2, 2, 3);
    s.status.replacing = vec![replaced("na", "a")];
    let p = s.plan();
    assert!(!matches!(p.command, Command::Retire(_)), "{:?}", p.command);
    assert!(p.requeue <= RETIRE_GRACE, "{:?}", p.requeue);
    // Recorded: terminated at once.
    let recorded = drain_ended(s);
    assert!(matches!(recorded.plan().command, Command::Retire(_)));
    // Never recorded: terminated once the grace is over.
    let mut late = reclaimed_in_a(-(RETIRE_GRACE.as_secs() as i64));
    late.asgs[0] = asg("a", 2, 2, 3);
    late.status.replacing = vec![replaced("na", "a")];
    assert!(matches!(late.plan().command, Command::Retire(_)));
}

/// Node `na` gets a rebalance recommendation: its replacement is launched
/// in its own ASG at once, and is Ready.
fn at_risk_and_replaced(s: &mut Scenario) {
    s.nodes[0].ready = false;
    s.nodes[0].fate = Some(Fate::AtRisk);
    let p = s.plan();
    assert_eq!(p.command, change("a", 1, 2), "{}", p.message);
    s.status = p.status;
    raise_landed(&mut s.status);
    s.asgs[0] = asg("a", 2, 2, 3);
    s.nodes.push(node("na2", "a", true, 0));
}

#[test]
fn an_at_risk_node_is_replaced_at_once_but_removed_only_inside_a_window() {
    let mut s = Scenario::steady();
    s.window = crate::controllers::window::WindowState::Closed { opens: None };
    // The replacement is launched (nothing is disrupted by that) ...
    at_risk_and_replaced(&mut s);
    // ... the node at risk is kept while every window is closed ...
    let p = s.plan();
    releases(&p);
    assert!(p.message.contains("maintenance windows"), "{}", p.message);
    // ... and removed once one opens.
    s.window = crate::controllers::window::WindowState::Always;
    let p = s.plan();
    let Command::Drain(target) = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert_eq!(target.node, "na");
}

#[test]
fn a_protected_node_at_risk_is_replaced_but_kept() {
    let mut s = Scenario::steady();
    s.protected = [("na".to_string(), "the Node is annotated".to_string())].into();
    // The replacement is launched: that disrupts nothing.
    at_risk_and_replaced(&mut s);
    // The node at risk stays while protected, and neither it nor its
    // replacement is taken as a surplus.
    let p = s.plan();
    releases(&p);
    assert!(
        p.message.contains(
            "na at risk of interruption, replaced, kept: protected: the Node is annotated"
        ),
        "{}",
        p.message
    );
    // No longer protected: removed.
    s.protected.clear();
    let Command::Drain(target) = s.plan().command else {
        panic!("expected the node at risk to be drained")
    };
    assert_eq!(target.node, "na");
}

#[test]
fn removing_a_node_at_risk_waits_for_a_disruption_slot() {
    let mut s = Scenario::steady();
    at_risk_and_replaced(&mut s);
    s.slot = Some(SlotState::Full(
        "team/masters is disrupting a control-plane node".into(),
    ));
    let p = s.plan();
    releases(&p);
    assert!(
        p.message.contains("waiting for a disruption slot"),
        "{}",
        p.message
    );
    s.slot = Some(SlotState::Free);
    assert!(matches!(s.plan().command, Command::Drain(_)));
}

/// Every ASG at max (kops's instance groups with min = max), with an
/// on-demand fallback set.
fn at_max_with_a_fallback(mut s: Scenario) -> Scenario {
    for a in s.asgs.iter_mut() {
        *a = asg(&a.name, a.desired, a.instances, a.desired);
    }
    s.fallback = Some(crate::crd::nodegroup::ResolvedFallback {
        after: Duration::from_secs(60),
        return_after: Duration::from_secs(600),
    });
    s.asgs.push(AsgView {
        fallback: true,
        ..asg("od", 0, 0, 5)
    });
    s
}

/// Issue 54, hole 5: a worker at risk on ASGs at max was never replaced and
/// never counted as Ready again: the replenisher was Blocked for good. It
/// serves on; and no fallback is raised for it.
#[test]
fn a_worker_at_risk_that_nothing_can_replace_serves_on_and_nothing_falls_back() {
    let mut s = at_max_with_a_fallback(Scenario::steady());
    s.nodes[0].ready = false;
    s.nodes[0].fate = Some(Fate::AtRisk);
    for later in [0, 120, 3600] {
        let p = s.plan_with(
            Duration::from_secs(300),
            Duration::from_secs(900),
            t0() + secs(later),
        );
        assert!(
            matches!(p.command, Command::Nothing),
            "{later}s: {:?}: {}",
            p.command,
            p.message
        );
        assert_eq!(p.status.phase, ReplenishPhase::Steady, "{}", p.message);
        assert!(
            p.message
                .contains("na at risk of interruption, serving on: no ASG can launch"),
            "{}",
            p.message
        );
    }
    // The hold ends in 100 s: the plan looks again then, not at the next
    // resync (the node then counts as Ready again).
    s.nodes[0].fate_changes = Some(t0() + secs(3700));
    s.lock = LockState::Free;
    let p = s.plan_with(
        Duration::from_secs(300),
        Duration::from_secs(900),
        t0() + secs(3600),
    );
    assert_eq!(
        p.requeue,
        Duration::from_secs(100),
        "{:?}: {}",
        p.command,
        p.message
    );
    // A node that is lost, not at risk, still falls back once `after` is over.
    let mut lost = at_max_with_a_fallback(Scenario::steady());
    lost.nodes.retain(|n| n.name != "na");
    let p = lost.plan_with(
        Duration::from_secs(300),
        Duration::from_secs(900),
        t0() + secs(3600),
    );
    assert!(
        p.status.phase != ReplenishPhase::Steady,
        "{:?}: {}",
        p.command,
        p.message
    );
}

#[test]
fn a_master_at_risk_whose_asg_is_at_max_serves_on_and_is_not_blocked() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    s.asgs[0] = asg("a", 1, 1, 1);
    s.nodes[0].ready = false;
    s.nodes[0].fate = Some(Fate::AtRisk);
    let p = s.plan();
    assert_eq!(p.status.phase, ReplenishPhase::Steady, "{}", p.message);
    assert!(
        p.message.contains("a master only in its own ASG"),
        "{}",
        p.message
    );
    // Its own ASG can launch: replaced there.
    s.asgs[0] = asg("a", 1, 1, 3);
    assert_eq!(s.plan().command, change("a", 1, 2));
}

/// The control plane with `ready` up and every other master of `s`
/// settling (its etcd joined a moment ago).
fn masters_settling(s: &Scenario, ready: &[&str]) -> crate::controllers::authority::ControlPlane {
    use crate::controllers::authority::{ControlPlane, DownWhy, MasterDown};
    let ids = s.nodes.iter().filter_map(|n| n.instance_id.clone());
    let (up, down): (Vec<String>, Vec<String>) =
        ids.partition(|id| ready.iter().any(|r| format!("i-{r}") == *id));
    ControlPlane {
        expected: s.desired,
        ready: up.into_iter().collect(),
        down: down
            .into_iter()
            .map(|id| MasterDown {
                group: "sim".into(),
                instance: Some(id),
                why: DownWhy::Settling {
                    until: t0() + secs(120),
                },
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn a_master_at_risk_is_removed_only_once_the_other_masters_etcd_has_settled() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    at_risk_and_replaced(&mut s);
    // Its replacement's Node is Ready, its etcd still settling, and so is
    // another master's: removing it would leave one master up.
    s.control_plane = Some(masters_settling(&s, &["nc"]));
    let p = s.plan();
    releases(&p);
    assert!(
        p.message.contains("kept") && p.message.contains("refusing"),
        "{}",
        p.message
    );
    // Settled: it goes.
    s.control_plane = Some(masters_settling(&s, &["na2", "nc", "nd"]));
    let p = s.plan();
    assert!(
        matches!(p.command, Command::Drain(_)),
        "{:?}: {}",
        p.command,
        p.message
    );
}

#[test]
fn a_masters_removal_under_way_is_put_off_when_the_masters_rule_refuses_it_now() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    at_risk_and_replaced(&mut s);
    s.control_plane = Some(masters_settling(&s, &["na2", "nc", "nd"]));
    let p = s.plan();
    assert!(
        matches!(p.command, Command::Drain(_)),
        "{:?}: {}",
        p.command,
        p.message
    );
    s.status = p.status;
    // Another master went down meanwhile: the drain is given back, not
    // finished into a termination the guard would refuse.
    s.control_plane = Some(masters_settling(&s, &["nc"]));
    let p = s.plan();
    let Command::GiveBack { reason, .. } = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert!(reason.contains("put off"), "{reason}");
}

#[test]
fn a_master_at_risk_whose_raise_was_taken_back_is_replaced_in_place_not_decremented() {
    // `na` at risk, replaced in its own ASG; that raise since taken back
    // (its replacement, at risk too, went first with the decrement), yet
    // `a` still runs two: removing `na` with decrement would leave its ASG
    // below its count, and a master launches nowhere else.
    let at_risk_in_a = |role: Role| {
        let mut s = Scenario::steady();
        s.role = role;
        s.nodes[0].ready = false;
        s.nodes[0].fate = Some(Fate::AtRisk);
        s.asgs[0] = asg("a", 2, 2, 3);
        s.nodes.push(node("na2", "a", true, 0));
        s.status.replacing = vec![replaced("na", "a")];
        s.control_plane = Some(masters_settling(&s, &["na2", "nc", "nd"]));
        s
    };
    let p = at_risk_in_a(Role::Master).plan();
    let Command::Drain(target) = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert_eq!(target.node, "na");
    assert!(!target.decrement, "{target:?}");
    // A worker's ASG may go below its count: the layout is restored later.
    let p = at_risk_in_a(Role::Worker).plan();
    let Command::Drain(target) = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert!(target.decrement, "{target:?}");
}

#[test]
fn a_masters_surplus_is_not_begun_while_the_other_masters_settle() {
    // Found by the walk once the guard checked every drain step: a master
    // surplus was drained while the others' etcd settled, its first drain
    // step then refused by the guard.
    let mut s = Scenario::steady().surplus_in_c();
    s.role = Role::Master;
    s.control_plane = Some(masters_settling(&s, &["na"]));
    let p = s.plan();
    assert!(
        !matches!(p.command, Command::Drain(_)),
        "{:?}: {}",
        p.command,
        p.message
    );
    assert!(p.status.scale_in.is_none(), "{:?}", p.status.scale_in);
    assert!(p.message.contains("refusing"), "{}", p.message);
    // Settled: the surplus goes.
    let all: Vec<String> = s.nodes.iter().map(|n| n.name.clone()).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    s.control_plane = Some(masters_settling(&s, &all));
    let p = s.plan();
    assert!(
        matches!(p.command, Command::Drain(_)),
        "{:?}: {}",
        p.command,
        p.message
    );
}
