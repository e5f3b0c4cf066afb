//! The replenisher keeps the rule book (`authority::rules`): over random
//! states, windows, protection and slots, a removal it starts keeps every
//! rule the table binds to its reason.

use super::properties::{arb_state, protected_by};
use super::*;
use crate::controllers::authority::Reason;
use crate::controllers::authority::rules::{self, Rule};
use crate::controllers::window::WindowState;

fn arb_window() -> impl Strategy<Value = WindowState> {
    prop_oneof![
        2 => Just(WindowState::Always),
        1 => Just(WindowState::Open {
            closes: t0() + chrono::Duration::hours(1)
        }),
        1 => Just(WindowState::Closed {
            opens: Some(t0() + chrono::Duration::hours(5))
        }),
        1 => Just(WindowState::Closed { opens: None }),
    ]
}

fn arb_slot() -> impl Strategy<Value = Option<SlotState>> {
    prop_oneof![
        2 => Just(None),
        1 => Just(Some(SlotState::Free)),
        1 => Just(Some(SlotState::Ours)),
        1 => Just(Some(SlotState::Full("Refresh other".into()))),
    ]
}

/// Why the replenisher takes `node` away, as its guard names it.
fn reason_of(s: &Scenario, target: &ScaleInTarget) -> Reason {
    let node = s.nodes.iter().find(|n| n.name == target.node);
    if target.repair {
        Reason::repair(s.role)
    } else if node.is_some_and(|n| n.fate == Some(Fate::AtRisk)) {
        Reason::AtRisk
    } else if s
        .asgs
        .iter()
        .any(|a| a.name == target.auto_scaling_group && a.fallback)
    {
        Reason::FallbackReturn
    } else {
        Reason::ScaleIn
    }
}

/// A removal started by the plan, and the reason the rule book knows it by.
fn started(s: &Scenario) -> Option<(ScaleInTarget, Reason)> {
    let Command::Drain(Batch { first: target, .. }) = s.plan().command else {
        return None;
    };
    // A drain's first step: the scale-in is recorded now.
    if s.status.scale_in.is_some() {
        return None;
    }
    let reason = reason_of(s, &target);
    // Decided once, by the plan, and carried on the target to every step.
    assert_eq!(target.reason.as_deref(), Some(reason.label()), "{s:?}");
    Some((target, reason))
}

/// Every rule the table binds to `reason` holds for taking `target` now.
fn keeps_its_rules(s: &Scenario, target: &ScaleInTarget, reason: Reason) -> Result<(), String> {
    let why = |rule: &str| {
        Err(format!(
            "{reason:?} of {} breaks {rule}: {s:?}",
            target.node
        ))
    };
    if rules::binds(reason, Rule::Window) && !s.window.is_open() {
        return why("the window");
    }
    if rules::binds(reason, Rule::DoNotDisrupt) && s.protected.contains_key(&target.node) {
        return why("do-not-disrupt");
    }
    // Held, or free: the executor takes a free one before the first step
    // (and refuses without one); the plan begins none while others hold
    // them all.
    if rules::binds(reason, Rule::Slot) && matches!(s.slot, Some(SlotState::Full(_))) {
        return why("the slot");
    }
    let ready_besides = s
        .nodes
        .iter()
        .filter(|n| n.ready && n.name != target.node)
        .count() as i32;
    if rules::binds(reason, Rule::ReadyFloor) && ready_besides < s.desired {
        return why("the Ready floor");
    }
    Ok(())
}

fn arb_scenario() -> impl Strategy<Value = Scenario> {
    (
        arb_state(),
        arb_window(),
        arb_slot(),
        prop::collection::vec(prop::bool::weighted(0.25), 12),
        prop::collection::vec(prop::bool::weighted(0.25), 12),
    )
        .prop_map(|(mut s, window, slot, mask, at_risk)| {
            s.window = window;
            s.slot = slot;
            s.deleting = false;
            // Nothing is removed without the lock: every state may act.
            s.lock = LockState::Ours;
            s.protected = protected_by(&s, &mask);
            for (n, r) in s.nodes.iter_mut().zip(at_risk.iter().cycle()) {
                if *r && n.ready {
                    n.fate = Some(Fate::AtRisk);
                }
            }
            s
        })
}

/// Over random states, windows, protection and slots: a removal the plan
/// starts keeps every rule its reason is bound to. Counts what it checked,
/// and fails when the states never led to a removal of a reason (the
/// property would hold by checking nothing).
#[test]
fn a_removal_it_starts_keeps_every_rule_its_reason_is_bound_to() {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let seen = std::sync::Mutex::new(std::collections::BTreeMap::<Reason, usize>::new());
    // Seeded: the counts below are the same at every run.
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 2048,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let result = runner.run(&arb_scenario(), |s| {
        let Some((target, reason)) = started(&s) else {
            return Ok(());
        };
        *seen.lock().expect("counts").entry(reason).or_default() += 1;
        keeps_its_rules(&s, &target, reason).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let seen = seen.into_inner().expect("counts");
    eprintln!("removals checked, by reason: {seen:?}");
    for reason in [
        Reason::ScaleIn,
        Reason::AtRisk,
        Reason::WorkerRepair,
        Reason::MasterRepair,
    ] {
        assert!(
            seen.get(&reason).is_some_and(|n| *n > 0),
            "no {reason:?} started in 2048 states: the property checked nothing for it ({seen:?})"
        );
    }
}
