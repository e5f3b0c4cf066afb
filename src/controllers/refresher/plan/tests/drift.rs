//! Drift rolls (`drift.action: Replace`): started by drifted nodes, not the
//! schedule; only those nodes; following a newer version or a rollback.

use super::*;

/// Three Ready workers on version 1 with one surplus node, drift rolled,
/// the schedule an hour away; then `kops update cluster` (version 2).
fn drifted_group() -> Sim {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.drift_replace = true;
    sim.status.next_run = Some(sim.now + chrono::Duration::hours(1));
    sim.version = 2;
    sim
}

/// The layout a run must end at: one node per ASG, as `drifted_group` starts.
fn one_per_asg() -> Vec<(String, i32)> {
    (0..3).map(|i| (format!("asg-{i}"), 1)).collect()
}

fn ids(sim: &Sim) -> Vec<String> {
    sim.instances.iter().map(|i| i.id.clone()).collect()
}

fn drifted(sim: &Sim) -> Vec<String> {
    sim.instances
        .iter()
        .filter(|i| i.version != sim.version)
        .map(|i| i.id.clone())
        .collect()
}

#[test]
fn drifted_nodes_are_rolled_without_waiting_for_the_schedule() {
    let mut sim = drifted_group();
    let old = ids(&sim);
    let next_run = sim.status.next_run;
    let layout = sim.layout();
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    let last = sim.status.last_run.clone().expect("a run");
    assert_eq!(last.trigger, Some(RunTrigger::Drift));
    assert_eq!(last.replaced, 3);
    // Every drifted node once, then the surplus; the schedule untouched.
    assert!(old.iter().all(|o| sim.terminated.contains(o)));
    assert_eq!(sim.terminated.len(), 4, "{:?}", sim.terminated);
    assert!(drifted(&sim).is_empty());
    assert_eq!(sim.layout(), layout);
    assert_eq!(sim.lock, LockState::Free);
    assert_eq!(sim.status.next_run, next_run);
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 3));
    assert!(sim.happenings.iter().any(|h| matches!(
        h,
        Happening::Started {
            total: 3,
            surplus: 1,
            trigger: RunTrigger::Drift
        }
    )));
    // Nothing drifted any more: the refresher waits for its schedule.
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(sim.status.run_start, None);
}

#[test]
fn only_drifted_nodes_are_rolled() {
    let mut sim = drifted_group();
    // One node was launched after the update: on version 2 already.
    sim.instances[1].version = 2;
    let current = sim.instances[1].id.clone();
    sim.run_to_end(200);
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(2));
    // The two drifted nodes and the surplus (the newest node goes): the
    // node already on version 2 stays.
    assert_eq!(sim.terminated.len(), 3, "{:?}", sim.terminated);
    assert!(!sim.terminated.contains(&current));
    assert!(drifted(&sim).is_empty());
}

#[test]
fn drift_is_only_reported_without_replace() {
    let mut sim = drifted_group();
    sim.drift_replace = false;
    sim.steps(20, 10);
    assert!(sim.terminated.is_empty());
    assert_eq!(sim.status.run_start, None);
    assert_eq!(sim.lock, LockState::Free);
    assert!(sim.actions.iter().all(|a| !a.mutates()));
}

#[test]
fn a_drift_roll_waits_without_skipping_while_one_may_not_start() {
    let mut sim = drifted_group();
    sim.instances[0].ready = false;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(
        plan.message.contains("drift roll waits"),
        "{}",
        plan.message
    );
    assert!(plan.message.contains("only 2 of 3"), "{}", plan.message);
    assert_eq!(sim.status.last_run, None, "a wait is not a skipped run");
    assert!(sim.happenings.is_empty());
    // A kops rolling update under way: no roll either.
    sim.instances[0].ready = true;
    sim.external_update = Some("a kops rolling update is in progress".into());
    let plan = sim.step(false);
    assert!(
        plan.message.contains("kops rolling update"),
        "{}",
        plan.message
    );
    assert_eq!(sim.lock, LockState::Free);
    // Dry run: what it would do, nothing done.
    sim.external_update = None;
    sim.dry_run = true;
    let plan = sim.step(false);
    assert!(
        plan.message.contains("dry run: would add 1 on"),
        "{}",
        plan.message
    );
    assert_eq!(sim.lock, LockState::Free);
    // Free to go: it starts.
    sim.dry_run = false;
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn nodes_drifted_by_a_newer_version_mid_roll_join_it() {
    let mut sim = drifted_group();
    let old = ids(&sim);
    // Until the first replacement is made (launched from version 2).
    sim.run_until(|s| !s.status.replaced_instances.is_empty());
    // `kops update cluster` again: version 3.
    sim.version = 3;
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert!(old.iter().all(|o| sim.terminated.contains(o)));
    assert!(drifted(&sim).is_empty(), "every node on version 3");
    // The three old nodes, and both nodes launched from version 2 (the
    // surplus and the first replacement): one of them replaced, one
    // removed as the surplus.
    assert_eq!(sim.terminated.len(), 5, "{:?}", sim.terminated);
    assert!(sim.happenings.iter().any(|h| matches!(
        h,
        Happening::DriftChanged { joined, left } if !joined.is_empty() && left.is_empty()
    )));
    assert_eq!(sim.layout(), one_per_asg());
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 3));
}

#[test]
fn a_rollback_mid_roll_keeps_the_nodes_not_yet_replaced() {
    let mut sim = drifted_group();
    let old = ids(&sim);
    sim.run_until(|s| !s.status.replaced_instances.is_empty());
    let replaced = sim.status.replaced_instances.clone();
    // Version 1 made current again.
    sim.version = 1;
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    // The old nodes not yet replaced stay; nothing is drifted at the end
    // (what was launched from version 2 went), the layout is back.
    for o in old.iter().filter(|o| !replaced.contains(o)) {
        assert!(
            !sim.terminated.contains(o),
            "{o} terminated after the rollback"
        );
    }
    assert!(drifted(&sim).is_empty(), "{:?}", sim.instances);
    // The first old node, then the two launched from version 2: one
    // replaced, the other removed as the surplus.
    assert_eq!(sim.terminated.len(), 3, "{:?}", sim.terminated);
    assert!(sim.happenings.iter().any(|h| matches!(
        h,
        Happening::DriftChanged { left, .. } if left.len() == 2
    )));
    assert_eq!(sim.layout(), one_per_asg());
    assert_eq!(sim.lock, LockState::Free);
}

#[test]
fn the_surplus_removed_is_a_drifted_node_when_there_is_one() {
    let mut sim = drifted_group();
    // Until the surplus is up and Ready and the first replacement launched
    // ahead (both from version 2).
    sim.run_until(|s| s.status.phase == RefreshPhase::Draining);
    let mut launched: Vec<String> = sim
        .instances
        .iter()
        .filter(|i| i.version == 2)
        .map(|i| i.id.clone())
        .collect();
    assert_eq!(launched.len(), 2);
    // Rolled back before any replacement: the roll ends, and the nodes
    // that go are the two launched from version 2.
    sim.version = 1;
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    let mut terminated = sim.terminated.clone();
    terminated.sort();
    launched.sort();
    assert_eq!(terminated, launched);
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(0));
}

#[test]
fn a_drift_roll_survives_restarts_at_every_step() {
    for crash in [Crash::BeforeAction, Crash::BeforeTermination] {
        let mut sim = drifted_group();
        let old = ids(&sim);
        for i in 0..400 {
            // Every third reconcile dies at the crash point.
            sim.step_with((i % 3 == 0).then_some(crash));
            sim.all_join_and_ready();
            sim.advance(1);
            if sim.status.last_run.is_some() {
                break;
            }
        }
        assert_eq!(
            sim.result(),
            Some((RunResult::Succeeded, None)),
            "{crash:?}"
        );
        assert!(old.iter().all(|o| sim.terminated.contains(o)), "{crash:?}");
        // `terminate` asserts no instance goes twice.
        assert_eq!(sim.terminated.len(), 4, "{crash:?}: {:?}", sim.terminated);
        assert!(drifted(&sim).is_empty());
    }
}

#[test]
fn a_group_without_a_schedule_only_rolls_drift() {
    let mut sim = drifted_group();
    sim.settings = Ok(ResolvedRefresh {
        schedule: None,
        ..settings("0 12 * * *", "UTC", 1)
    });
    sim.status.next_run = None;
    sim.key = "no schedule".into();
    sim.status.next_run_from = Some(sim.key.clone());
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.next_run, None, "never scheduled");
    let plan = sim.step(false);
    assert!(plan.message.contains("no schedule"), "{}", plan.message);
}

#[test]
fn a_newer_version_after_two_replacements_costs_no_node_launched_from_it() {
    let mut sim = drifted_group();
    let old = ids(&sim);
    sim.run_until(|s| s.status.replaced_instances.len() >= 2);
    // Version 2 is on the surplus (asg-0) and two replacements (asg-0,
    // asg-1); from here on every launch is from version 3.
    sim.version = 3;
    let first_v3 = sim.next_id;
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert!(drifted(&sim).is_empty());
    assert!(old.iter().all(|o| sim.terminated.contains(o)));
    let from_v3: Vec<&String> = sim
        .terminated
        .iter()
        .filter(|id| id[2..].parse::<u32>().is_ok_and(|n| n > first_v3))
        .collect();
    assert!(
        from_v3.is_empty(),
        "terminated {from_v3:?} launched from version 3"
    );
    // 3 old nodes and the 3 launched from version 2.
    assert_eq!(sim.terminated.len(), 6, "{:?}", sim.terminated);
    assert_eq!(sim.layout(), one_per_asg());
}

#[test]
fn a_failed_drift_roll_is_not_retried_for_an_hour() {
    let mut sim = drifted_group();
    sim.status.next_run = Some(sim.now + chrono::Duration::days(1));
    let old = ids(&sim);
    // The new version's nodes never join: the surplus is never Ready.
    for _ in 0..100 {
        sim.step(false);
        sim.advance(60);
        if sim.status.last_run.is_some() {
            break;
        }
    }
    let (result, reason) = sim.result().expect("the roll ended");
    assert_eq!(result, RunResult::Failed, "{reason:?}");
    assert!(
        old.iter().all(|o| !sim.terminated.contains(o)),
        "old nodes kept"
    );
    assert_eq!(
        sim.status.last_run.as_ref().and_then(|r| r.trigger),
        Some(RunTrigger::Drift)
    );
    // The surplus went; the nodes stay drifted, and no roll starts for an hour.
    sim.instances.retain(|i| i.version == 1);
    let ended = sim
        .status
        .last_run
        .as_ref()
        .and_then(|r| r.finished)
        .expect("finished");
    let plan = sim.step(false);
    assert!(
        plan.message.contains("the last drift roll failed"),
        "{}",
        plan.message
    );
    assert_eq!(plan.command, Command::Nothing);
    sim.now = ended + chrono::Duration::minutes(59);
    let plan = sim.step(false);
    assert_eq!(sim.status.run_start, None, "{}", plan.message);
    assert_eq!(sim.lock, LockState::Free);
    // An hour on, it tries again.
    sim.now = ended + chrono::Duration::minutes(61);
    sim.step(false);
    sim.step(false);
    sim.step(false);
    assert!(sim.status.run_start.is_some(), "{:?}", sim.status.message);
    assert_eq!(sim.status.trigger, Some(RunTrigger::Drift));
}

/// Found by the walk over kops's per-zone layout: the roll took the group's
/// lock, another group took the one slot, then a node died. The roll waits
/// for it to be Ready; holding the lock meanwhile, it kept the replenisher
/// from repairing that node, for good.
#[test]
fn a_drift_roll_that_must_wait_gives_the_groups_lock_back() {
    let mut sim = drifted_group();
    sim.takes_the_lock();
    sim.slot = SlotState::Full("Refresh ns/control-plane-a".into());
    sim.instances[0].ready = false;
    let plan = sim.step(false);
    assert!(
        plan.message
            .contains("the drift roll waits: only 2 of 3 nodes are Ready"),
        "{}",
        plan.message
    );
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(sim.lock, LockState::Free, "given back by the executor");
    // Waiting on, it holds nothing.
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
    assert_eq!(plan.status.run_start, None);
}
