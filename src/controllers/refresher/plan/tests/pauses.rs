//! Runs paused: dry-run, an invalid spec, the circuit breaker, suspension midway.

use super::*;

#[test]
fn a_dry_run_plans_and_logs_without_mutating() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.dry_run = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    let (result, reason) = sim.result().expect("recorded");
    assert_eq!(result, RunResult::Skipped);
    let reason = reason.unwrap_or_default();
    assert!(
        reason.starts_with("dry run: would add 1 on asg-0 and replace 3"),
        "{reason}"
    );
    assert!(matches!(sim.happenings[0], Happening::Planned(_)));
    assert_eq!(sim.lock, LockState::Free);
}

#[test]
fn a_run_in_progress_is_paused_under_dry_run() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.step(false);
    sim.step(false);
    let before = sim.status.clone();
    sim.dry_run = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(plan.message.contains("--dry-run"), "{}", plan.message);
    assert_eq!(plan.status.phase, before.phase);
    assert_eq!(plan.status.run_start, before.run_start);
}

#[test]
fn an_invalid_spec_blocks_runs_and_pauses_a_run_in_progress() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.settings = Err("spec.timeZone: unknown".into());
    let plan = sim.step(false);
    assert_eq!(plan.status.phase, RefreshPhase::Blocked);
    assert_eq!(plan.status.next_run, None);
    assert!(plan.message.contains("spec.timeZone"));

    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.step(false);
    sim.step(false);
    sim.settings = Err("spec.timeZone: unknown".into());
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(plan.status.run_start.is_some(), "the run is kept");
    assert!(plan.message.contains("paused"));
}

#[test]
fn an_open_circuit_breaker_skips_a_due_run_and_pauses_one_under_way() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.breaker = Some("3 of 4 node(s) NotReady".into());
    sim.step(false);
    let Some((RunResult::Skipped, Some(why))) = sim.result() else {
        panic!("{:?}", sim.result())
    };
    assert!(why.contains("circuit breaker open"), "{why}");
    // Under way: paused at once, nothing drained, terminated or launched,
    // then resumed to the end once it closes.
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    while sim.terminated.is_empty() {
        sim.step(false);
        sim.all_join_and_ready();
    }
    sim.breaker = Some("3 of 4 node(s) NotReady".into());
    let terminated = sim.terminated.len();
    for _ in 0..5 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
        assert!(
            plan.message.contains("circuit breaker open"),
            "{}",
            plan.message
        );
        sim.advance(600);
    }
    assert_eq!(sim.terminated.len(), terminated);
    sim.breaker = None;
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_run_suspended_midway_pauses_and_resumes() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    while sim.terminated.is_empty() {
        sim.step(false);
        sim.all_join_and_ready();
    }
    sim.suspended = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(plan.message.contains("suspended"));
    sim.suspended = false;
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_kops_rolling_update_pauses_a_run_between_steps_and_it_resumes_after() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    while sim.terminated.is_empty() {
        sim.step(false);
        sim.all_join_and_ready();
    }
    sim.external_update = Some("a kops rolling update is in progress".into());
    let terminated = sim.terminated.len();
    for _ in 0..5 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing);
        assert!(
            plan.message.contains("kops rolling update"),
            "{}",
            plan.message
        );
        sim.all_join_and_ready();
        sim.advance(60);
    }
    assert_eq!(
        sim.terminated.len(),
        terminated,
        "nothing more while kops runs"
    );
    sim.external_update = None;
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}
