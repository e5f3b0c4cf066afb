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
    sim.start_run();
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
    sim.start_run();
    sim.settings = Err("spec.timeZone: unknown".into());
    let plan = sim.step(false);
    assert!(holds_still(&plan.command));
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
        assert!(holds_still(&plan.command), "{}", plan.message);
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
    assert!(holds_still(&plan.command));
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
        assert!(holds_still(&plan.command));
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

/// A run under way with its first node replaced, then paused by `pause`.
fn paused_midway(pause: impl FnOnce(&mut Sim)) -> Sim {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    while sim.terminated.is_empty() {
        sim.step(false);
        sim.all_join_and_ready();
    }
    pause(&mut sim);
    sim
}

#[test]
fn a_run_paused_past_its_pause_timeout_is_set_aside_and_resumes_once_it_may() {
    let mut sim = paused_midway(|sim| sim.breaker = Some("3 of 4 node(s) NotReady".into()));
    let planned = sim.status.planned_instances.len();
    // Within the hour: it waits, holding its lock and slot, and says until when.
    for _ in 0..5 {
        let plan = sim.step(false);
        assert!(holds_still(&plan.command), "{}", plan.message);
        assert!(plan.message.contains("set aside at"), "{}", plan.message);
        sim.advance(600);
    }
    assert_eq!(sim.lock, LockState::Ours);
    // Past it: a node in hand goes back in service, then the lock and the
    // slot are given back, the rest recorded for later.
    sim.advance(600);
    for _ in 0..3 {
        sim.step(false);
    }
    assert_eq!(sim.lock, LockState::Free, "the lock given back");
    assert_eq!(sim.slot, SlotState::Free, "the slot given back");
    assert_eq!(sim.status.run_start, None);
    assert_eq!(sim.status.paused_since, None);
    let pending = sim.status.pending_run.clone().expect("the rest recorded");
    assert_eq!(pending.remaining.len(), planned - 1);
    assert_eq!(sim.original_cordoned(), 0, "nothing left cordoned");
    assert!(
        sim.happenings.iter().any(
            |h| matches!(h, Happening::SetAside { why: Some(w), .. } if w.contains("paused for over 1h"))
        ),
        "{:?}",
        sim.happenings
    );
    // Still open: it does not resume.
    sim.step(false);
    assert_eq!(sim.lock, LockState::Free);
    // Closed: the rest is replaced.
    sim.breaker = None;
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_run_whose_settings_turn_invalid_midway_is_set_aside_after_the_default_pause_timeout() {
    // Another NodeGroup names one of its ASGs while it runs (or its spec
    // is edited to something invalid): the run cannot go on, and must not
    // keep its surplus, a cordoned node, its lock and its slot for good.
    let mut sim = paused_midway(|sim| {
        sim.settings = Err("another NodeGroup names asg-0 too".into());
    });
    for _ in 0..5 {
        let plan = sim.step(false);
        assert!(holds_still(&plan.command), "{}", plan.message);
        assert!(plan.message.contains("set aside at"), "{}", plan.message);
        assert!(plan.message.contains("names asg-0"), "{}", plan.message);
        sim.advance(600);
    }
    assert_eq!(sim.lock, LockState::Ours);
    sim.advance(600);
    for _ in 0..3 {
        sim.step(false);
    }
    assert_eq!(sim.lock, LockState::Free, "the lock given back");
    assert_eq!(sim.slot, SlotState::Free, "the slot given back");
    assert_eq!(sim.status.run_start, None);
    assert_eq!(sim.original_cordoned(), 0, "nothing left cordoned");
    assert!(sim.status.pending_run.is_some(), "the rest recorded");
    assert!(
        sim.happenings.iter().any(
            |h| matches!(h, Happening::SetAside { why: Some(w), .. } if w.contains("paused for over 1h"))
        ),
        "{:?}",
        sim.happenings
    );
    // While still invalid, no run: the Refresher says why.
    let plan = sim.step(false);
    assert_eq!(plan.status.phase, RefreshPhase::Blocked, "{}", plan.message);
}

/// Another group naming one of its ASGs leaves the Refresher's own
/// settings readable: its `pauseTimeout` (20 min here) bounds the pause,
/// not the default hour.
#[test]
fn a_run_paused_by_an_asg_another_group_names_is_set_aside_after_its_own_pause_timeout() {
    let mut sim = paused_midway(|sim| {
        sim.settings = Err("another NodeGroup names asg-0 too".into());
        sim.invalid_pause = std::time::Duration::from_secs(20 * 60);
    });
    sim.steps(1, 15 * 60);
    assert_eq!(sim.lock, LockState::Ours, "paused, not yet set aside");
    sim.steps(1, 10 * 60);
    for _ in 0..3 {
        sim.step(false);
    }
    assert_eq!(sim.lock, LockState::Free, "set aside after 20 min");
    assert!(sim.status.pending_run.is_some(), "the rest recorded");
    assert!(
        sim.happenings.iter().any(
            |h| matches!(h, Happening::SetAside { why: Some(w), .. } if w.contains("paused for over 20m"))
        ),
        "{:?}",
        sim.happenings
    );
}

#[test]
fn a_paused_run_that_loses_a_node_is_set_aside_at_once_for_the_replenisher() {
    // Its first node replaced and validated: nothing of its own in flight.
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.run_until(|sim| sim.status.replaced >= 1);
    sim.suspended = true;
    sim.step(false);
    assert_eq!(sim.lock, LockState::Ours, "paused, not yet set aside");
    // Spot losses of the new nodes (not those left to replace) until
    // Ready is below desired, though the run kept a surplus.
    while sim.ready_count() >= 3 {
        let new = sim
            .instances
            .iter()
            .position(|i| !sim.status.planned_instances.contains(&i.id))
            .expect("a new node to lose");
        sim.instances.remove(new);
    }
    for _ in 0..3 {
        sim.step(false);
    }
    assert_eq!(sim.lock, LockState::Free, "the replenisher may act");
    assert!(sim.status.pending_run.is_some());
    assert!(
        sim.happenings.iter().any(
            |h| matches!(h, Happening::SetAside { why: Some(w), .. } if w.contains("the replenisher replaces them"))
        ),
        "{:?}",
        sim.happenings
    );
}

#[test]
fn an_invalid_group_spec_blocks_a_run_and_pauses_one_under_way() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.invalid_spec = Some("spec.replenish.unhealthyTimeout: 1s is below 1m".into());
    sim.step(false);
    let Some((RunResult::Skipped, Some(why))) = sim.result() else {
        panic!("{:?}", sim.result())
    };
    assert!(why.contains("spec is invalid"), "{why}");
    assert!(sim.terminated.is_empty() && sim.drain_steps.is_empty());

    let mut sim = paused_midway(|sim| sim.invalid_spec = Some("spec.desired: -1".into()));
    let steps = sim.drain_steps.len();
    for _ in 0..5 {
        let plan = sim.step(false);
        assert!(holds_still(&plan.command), "{}", plan.message);
        assert!(plan.message.contains("spec is invalid"), "{}", plan.message);
        sim.advance(60);
    }
    assert_eq!(sim.drain_steps.len(), steps, "nothing drained meanwhile");
    sim.invalid_spec = None;
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_run_waiting_for_its_window_with_its_surplus_is_set_aside_past_its_pause_timeout() {
    let mut sim = paused_midway(|sim| {
        sim.window = WindowState::Closed {
            opens: Some(sim.now + chrono::Duration::days(1)),
        }
    });
    let mut waited = 0;
    while sim.lock == LockState::Ours && waited < 200 {
        let plan = sim.step(false);
        if plan.message.starts_with("run paused")
            || plan.message.contains("; the run waits")
                && !plan.message.starts_with("run set aside")
        {
            assert!(plan.message.contains("set aside at"), "{}", plan.message);
        }
        sim.all_join_and_ready();
        sim.advance(60);
        waited += 1;
    }
    assert_eq!(sim.lock, LockState::Free, "set aside, lock given back");
    assert!(
        (55..70).contains(&waited),
        "set aside after about an hour of waiting, not at once nor never: {waited} minutes"
    );
    assert!(sim.status.pending_run.is_some());
}

#[test]
fn a_master_run_waiting_for_its_own_replacement_is_not_set_aside_as_short() {
    let mut sim = Sim::new(Role::Master, 1, 1, 0);
    // One master: its replacement stops the API, which the user allowed.
    sim.outage_allowed = true;
    // Its one master terminated, the replacement not Ready yet; the
    // group's breaker sees 1 of 1 NotReady and pauses the run.
    sim.run_until(|sim| !sim.terminated.is_empty());
    sim.breaker = Some("1 of 1 node(s) NotReady".into());
    for _ in 0..5 {
        let plan = sim.step(false);
        assert!(plan.message.contains("set aside at"), "{}", plan.message);
        sim.advance(10);
    }
    assert_eq!(sim.lock, LockState::Ours, "waiting, not set aside");
    sim.breaker = None;
    sim.all_join_and_ready();
    sim.run_to_end(100);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(1));
}

/// A paused run does nothing to nodes or AWS: it waits (and, issue 68, the
/// executor gives the manager-wide slot back once nothing is in hand,
/// keeping its lock).
fn holds_still(command: &Command) -> bool {
    matches!(command, Command::Nothing)
}
