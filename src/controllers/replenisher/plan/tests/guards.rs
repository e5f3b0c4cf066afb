//! What stops or narrows the replenisher: a refresh's lock, suspension, asking for the lock, the circuit breaker.

use super::*;

#[test]
fn a_refresh_holding_the_lock_pauses_the_replenisher() {
    let mut s = Scenario::steady().shortage_in_a();
    s.lock = LockState::Other("Refresh workers".into());
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing);
    assert_eq!(p.status.phase, ReplenishPhase::Paused);
    assert!(p.message.contains("Refresh workers"));
}

#[test]
fn a_suspended_group_is_left_alone() {
    let mut s = Scenario::steady().shortage_in_a();
    s.suspend = true;
    let p = s.plan();
    releases(&p);
    assert_eq!(p.status.phase, ReplenishPhase::Paused);
}

#[test]
fn without_the_lock_it_asks_for_it_first() {
    let mut s = Scenario::steady().shortage_in_a();
    s.lock = LockState::Free;
    needs_the_lock(&s.plan());
}

#[test]
fn with_the_circuit_breaker_open_nothing_is_terminated_but_replacements_launch() {
    let open = Some("4 of 6 node(s) NotReady".to_string());
    // A surplus to take back: not while the breaker is open.
    let mut s = Scenario::steady().surplus_in_c();
    s.breaker = open.clone();
    let p = s.plan();
    releases(&p);
    assert_eq!(p.status.phase, ReplenishPhase::Blocked);
    assert!(p.message.contains("circuit breaker open"), "{}", p.message);
    // A termination recorded before it opened waits, its record kept.
    s.breaker = None;
    let drain = s.plan();
    let mut status = drain.status.clone();
    let recorded = record_termination(&mut status, t0()).expect("a target");
    s.status = status;
    assert_eq!(s.plan().command, Command::Terminate(recorded.clone()));
    s.breaker = open.clone();
    let held = s.plan();
    assert!(
        !matches!(held.command, Command::Terminate(_)),
        "{:?}",
        held.command
    );
    assert_eq!(held.status.scale_in, Some(recorded), "not forgotten");
    // A shortage is still replenished.
    let mut short = Scenario::steady().shortage_in_a();
    short.breaker = open;
    assert!(matches!(short.plan().command, Command::SetDesired(_)));
}

#[test]
fn a_kops_rolling_update_in_progress_gets_no_aws_mutation() {
    // One short (kops terminated a node first) and a surplus to take back:
    // both are kops's to settle while its update runs.
    for mut s in [
        Scenario::steady().shortage_in_a(),
        Scenario::steady().surplus_in_c(),
    ] {
        s.external_update = Some("a kops rolling update is in progress".into());
        let p = s.plan();
        releases(&p);
        assert_eq!(p.status.phase, ReplenishPhase::Paused);
        assert!(p.message.contains("kops rolling update"), "{}", p.message);
    }
}
