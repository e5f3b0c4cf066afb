//! A worker refresh end to end, and which node goes first.

use super::*;

#[test]
fn a_plan_that_needs_no_observation_does_not_depend_on_it() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.status.next_run = Some(sim.now + chrono::Duration::hours(1));
    assert!(!needs_observation(
        Some(&sim.status),
        &sim.key,
        sim.now,
        false
    ));
    let with = sim.plan();
    sim.instances.clear();
    sim.asgs.clear();
    let without = sim.plan();
    assert_eq!(with, without);
    // Due, running, or a new schedule: observations are needed.
    assert!(needs_observation(
        Some(&sim.status),
        &sim.key,
        sim.now + chrono::Duration::hours(1),
        false
    ));
    assert!(needs_observation(
        Some(&sim.status),
        "edited",
        sim.now,
        false
    ));
    assert!(
        needs_observation(Some(&sim.status), &sim.key, sim.now, true),
        "drifted nodes to roll"
    );
    sim.status.run_start = Some(sim.now);
    assert!(needs_observation(
        Some(&sim.status),
        &sim.key,
        sim.now,
        false
    ));
    assert!(needs_observation(None, &sim.key, sim.now, false));
}

#[test]
fn a_worker_refresh_replaces_every_node_and_restores_the_layout() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let original = sim.ids();
    let layout = sim.layout();
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    let mut terminated = sim.terminated.clone();
    terminated.sort();
    // Every original node, then one surplus node.
    assert_eq!(terminated.len(), 4, "{terminated:?}");
    assert!(original.iter().all(|o| sim.terminated.contains(o)));
    assert_eq!(sim.layout(), layout);
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 3));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(3));
    assert_eq!(sim.lock, LockState::Free);
    assert_eq!(sim.status.phase, RefreshPhase::Idle);
    // Daily at noon UTC: the next run is tomorrow.
    assert_eq!(sim.status.next_run, Some(utc(2026, 6, 2, 12, 0)));
    let replaced = sim
        .happenings
        .iter()
        .filter(|h| matches!(h, Happening::Replaced { .. }))
        .count();
    assert_eq!(replaced, 3);
}

#[test]
fn the_oldest_node_goes_first() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.instances[1].launched -= chrono::Duration::days(3);
    let oldest = sim.instances[1].id.clone();
    sim.run_to_end(200);
    assert_eq!(sim.terminated.first(), Some(&oldest));
}
