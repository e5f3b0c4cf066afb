//! Runs that fail: surplus or replacements never Ready, drain timeouts.

use super::*;

/// Three workers, one per ASG, the oldest in asg-1: a run under way, its
/// surplus in asg-0, until its first node (in asg-1) is terminated; the
/// ids before the run.
fn first_replaced_in_asg_1() -> (Sim, Vec<String>) {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let original = sim.ids();
    sim.instances[1].launched -= chrono::Duration::days(1);
    sim.start_run();
    sim.all_join_and_ready();
    while sim.terminated.is_empty() {
        sim.step(false);
    }
    (sim, original)
}

#[test]
fn surplus_that_never_gets_ready_fails_the_run_and_is_removed() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let layout = sim.layout();
    let old = sim.ids();
    sim.step(false); // lock
    sim.step(false); // start, raise
    assert!(sim.asgs.iter().map(|a| a.desired).sum::<i32>() == 4);
    sim.step(false); // the first replacement launched with the surplus
    assert!(sim.asgs.iter().map(|a| a.desired).sum::<i32>() == 5);
    // The surplus never becomes Ready.
    sim.steps(20, 60);
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    assert!(
        reason
            .unwrap_or_default()
            .contains("surplus not Ready within 15m")
    );
    assert_eq!(sim.layout(), layout);
    // The not-Ready instances (the surplus and the replacement launched
    // with it) were removed; no old node was touched.
    assert_eq!(sim.terminated.len(), 2);
    assert!(sim.terminated.iter().all(|t| !old.contains(t)));
    assert_eq!(sim.instances.iter().filter(|i| i.ready).count(), 3);
    assert!(sim.instances.iter().all(|i| !i.cordoned));
    assert_eq!(sim.lock, LockState::Free);
}

#[test]
fn surplus_that_cannot_launch_is_cancelled_without_terminating_anything() {
    let mut sim = Sim::new(Role::Worker, 2, 1, 1);
    for a in &mut sim.asgs {
        a.launching = false;
    }
    // Not launching anywhere: the run does not start.
    sim.step(false);
    let (result, reason) = sim.result().expect("skipped");
    assert_eq!(result, RunResult::Skipped);
    assert!(reason.unwrap_or_default().contains("cannot add 1 surplus"));
    // Launching per the describe, but nothing comes: timed out, desired set back.
    let mut sim = Sim::new(Role::Worker, 2, 1, 1);
    sim.start_run();
    for a in &mut sim.asgs {
        a.launching = false;
    }
    sim.instances.retain(|i| i.ready);
    sim.steps(20, 60);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Failed));
    assert_eq!(sim.layout(), vec![("asg-0".into(), 1), ("asg-1".into(), 1)]);
    assert!(sim.terminated.is_empty());
}

#[test]
fn a_replacement_that_never_gets_ready_fails_and_keeps_the_other_old_nodes() {
    // Surplus Ready (in asg-0), the first old node (in asg-1) replaced;
    // its replacement never joins.
    let layout = Sim::new(Role::Worker, 3, 1, 1).layout();
    let (mut sim, original) = first_replaced_in_asg_1();
    sim.steps(16, 60);
    let reason = sim.status.failure.clone().unwrap_or_default();
    assert!(reason.contains("was not Ready within 15m"), "{reason}");
    assert_eq!(sim.status.phase, RefreshPhase::ScalingDown);
    // The surplus is what keeps 3 Ready: it stays while the replacement is not Ready.
    assert_eq!(sim.terminated.len(), 1);
    assert_eq!(sim.ready_count(), 3);
    // The replacement comes up late: the surplus goes, the layout is back.
    sim.all_join_and_ready();
    sim.run_to_end(50);
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    assert!(
        reason
            .unwrap_or_default()
            .contains("was not Ready within 15m")
    );
    assert_eq!(sim.layout(), layout);
    // One old node replaced, the other two kept and schedulable.
    let kept: Vec<&Instance> = sim
        .instances
        .iter()
        .filter(|i| original.contains(&i.id))
        .collect();
    assert_eq!(kept.len(), 2);
    assert!(kept.iter().all(|i| i.ready && !i.cordoned));
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 3));
    assert!(
        sim.happenings
            .iter()
            .any(|h| matches!(h, Happening::Failed(_)))
    );
    assert_eq!(sim.lock, LockState::Free);
}

#[test]
fn a_surplus_still_needed_after_a_failure_is_kept_and_the_run_ends() {
    let (mut sim, _) = first_replaced_in_asg_1();
    sim.steps(40, 60);
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("surplus left in asg-0"), "{reason}");
    assert_eq!(sim.ready_count(), 3);
    assert_eq!(sim.lock, LockState::Free);
    // Handed to the replenisher, which takes it over as a raise of its own.
    let left = sim.status.surplus_left.clone().expect("the surplus left");
    let asgs: Vec<(&str, i32)> = left
        .asgs
        .iter()
        .map(|a| (a.auto_scaling_group.as_str(), a.count))
        .collect();
    assert_eq!(asgs, [("asg-0", 1)]);
}

fn stuck_first_drain(action: DrainTimeoutAction) -> Sim {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    if let Ok(s) = &mut sim.settings {
        s.drain_timeout_action = action;
    }
    let first = Sim::node_name(&sim.instances[0].id);
    sim.stuck = vec![first];
    sim
}

#[test]
fn a_drain_timeout_with_proceed_terminates_the_node_anyway() {
    let mut sim = stuck_first_drain(DrainTimeoutAction::Proceed);
    let first = sim.instances[0].id.clone();
    for _ in 0..30 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(20);
    }
    assert!(sim.terminated.contains(&first));
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(3));
}

#[test]
fn a_drain_timeout_with_abort_ends_the_run_and_keeps_the_node() {
    let mut sim = stuck_first_drain(DrainTimeoutAction::Abort);
    let layout = sim.layout();
    let first = sim.instances[0].id.clone();
    let old = sim.ids();
    for _ in 0..40 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(20);
    }
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("timed out after 5m"), "{reason}");
    assert!(
        reason.contains(&format!("blocked by: {STUCK_BY}")),
        "names the budget that held it: {reason}"
    );
    assert!(!sim.terminated.contains(&first));
    let node = sim.instances.iter().find(|i| i.id == first).expect("kept");
    assert!(!node.cordoned, "the kept node is back in service");
    assert_eq!(sim.layout(), layout);
    // Only what the run added went: the surplus and the replacement
    // launched ahead for the node kept.
    assert_eq!(sim.terminated.len(), 2, "{:?}", sim.terminated);
    assert!(sim.terminated.iter().all(|id| !old.contains(id)));
}

#[test]
fn a_refresh_that_meets_a_dead_node_replaces_it_as_a_repair_instead_of_aborting() {
    // drainTimeoutAction Abort (the default).
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    if let Ok(s) = &mut sim.settings {
        s.drain_timeout_action = DrainTimeoutAction::Abort;
    }
    // The run starts; once its first node is being drained, the last
    // planned node's kubelet dies (and stays dead past the timeout): its
    // pods never finish terminating.
    let last = sim.instances[2].id.clone();
    for _ in 0..50 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(5);
        if sim.status.phase == RefreshPhase::Draining {
            break;
        }
    }
    assert_eq!(sim.status.phase, RefreshPhase::Draining);
    sim.dead = vec![Sim::node_name(&last)];
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert!(sim.terminated.contains(&last), "the dead node is gone");
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(3));
    // Its drain was a best-effort one: one step (every deletion asked),
    // not a wait for pods a dead kubelet never lets go.
    let steps = sim
        .drain_steps
        .iter()
        .filter(|n| **n == Sim::node_name(&last))
        .count();
    assert_eq!(steps, 1, "drained once, then terminated");
}

#[test]
fn a_desired_count_someone_else_lowered_during_the_run_is_not_raised_back() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    for _ in 0..200 {
        if sim.status.phase == RefreshPhase::ScalingDown {
            break;
        }
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
    }
    assert_eq!(sim.status.phase, RefreshPhase::ScalingDown);
    let before = sim.actions.len();
    // Someone else (the user, shrinking the group to 2) lowers asg-2 from
    // 1 to 0; AWS takes its node.
    sim.desired = 2;
    sim.asgs[2].desired = 0;
    sim.instances.retain(|i| i.asg != "asg-2");
    sim.run_to_end(200);
    assert!(
        matches!(sim.result(), Some((RunResult::Succeeded, None))),
        "{:?}",
        sim.result()
    );
    assert_eq!(
        sim.layout(),
        [
            ("asg-0".into(), 1),
            ("asg-1".into(), 1),
            ("asg-2".into(), 0)
        ],
        "asg-2 left as its owner set it"
    );
    let raised_back = sim.actions[before..].iter().any(|c| match c {
        Command::SetDesired(changes) => changes.iter().any(|c| c.asg == "asg-2" && c.to > 0),
        _ => false,
    });
    assert!(!raised_back, "{:?}", sim.actions);
    let told: Vec<_> = sim
        .happenings
        .iter()
        .filter(|h| matches!(h, Happening::LayoutLowered { asg, recorded: 1, now: 0 } if asg == "asg-2"))
        .collect();
    assert_eq!(told.len(), 1, "told once: {:?}", sim.happenings);
}

#[test]
fn a_node_marked_unhealthy_that_is_ready_again_is_drained_as_a_healthy_node() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    if let Ok(s) = &mut sim.settings {
        s.drain_timeout_action = DrainTimeoutAction::Abort;
    }
    sim.run_until(|sim| sim.status.phase == RefreshPhase::Draining);
    let target = sim.status.current_target.clone().expect("a target");
    let node = target.node.clone().expect("a node");
    // Marked unhealthy while its kubelet was dead; Ready again now, and a
    // budget holds its drain.
    if let Some(t) = sim.status.current_target.as_mut() {
        t.unhealthy = true;
    }
    sim.stuck = vec![node.clone()];
    sim.step(false);
    let marked = sim.status.current_target.clone().expect("still the target");
    assert!(!marked.unhealthy, "the mark is gone");
    assert_eq!(marked.since, sim.now, "its drain timeout runs from now");
    // Past the repair's 2-minute bound: still drained, never terminated.
    sim.advance(180);
    sim.steps(5, 1);
    assert!(sim.terminated.is_empty(), "{:?}", sim.terminated);
    assert!(sim.status.failure.is_none(), "{:?}", sim.status.failure);
    // Past its drain timeout: drainTimeoutAction (Abort) decides, as for
    // any healthy node: kept, the run fails.
    sim.advance(3600);
    sim.run_to_end(50);
    assert!(!sim.terminated.contains(&target.instance_id));
    assert!(
        matches!(sim.result(), Some((RunResult::Failed, Some(ref r))) if r.contains("Abort")),
        "{:?}",
        sim.result()
    );
}

/// The walk over every path (`controllers::walk`): a surplus node whose
/// drain is given up is kept, its ASG's count becoming the layout the run
/// ends at; that surplus was then no one's (the replenisher never took it
/// back, and the layout stayed off). It is part of `surplusLeft` now.
#[test]
fn a_surplus_node_kept_when_its_drain_is_given_up_is_left_to_the_replenisher() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let mut surplus = None;
    for _ in 0..200 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if let Some(t) = sim.status.current_target.clone()
            && t.purpose == TargetPurpose::RemoveSurplus
        {
            surplus = Some(t);
            break;
        }
    }
    let surplus = surplus.expect("the surplus chosen for removal");
    // Its drain never ends (a budget): given up at the drain timeout.
    sim.stuck = vec![surplus.node.clone().expect("a node")];
    for _ in 0..40 {
        sim.step(false);
        sim.advance(15);
        if sim.status.run_start.is_none() {
            break;
        }
    }
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    assert!(
        reason.unwrap_or_default().contains("kept"),
        "{:?}",
        sim.status
    );
    let left = sim.status.surplus_left.clone().expect("the surplus left");
    let asgs: Vec<(&str, i32)> = left
        .asgs
        .iter()
        .map(|a| (a.auto_scaling_group.as_str(), a.count))
        .collect();
    assert_eq!(asgs, [(surplus.auto_scaling_group.as_str(), 1)]);
    assert!(sim.status.surplus_kept.is_empty(), "handed over once");
}

/// Found by the walk (issue 54): the surplus of a run is in an ASG that
/// leaves the spec before the run ends. That ASG is no longer described,
/// so what the run raised there is left by the run's own record, for the
/// replenisher to take back there once it is back, not elsewhere.
#[test]
fn a_surplus_in_an_asg_that_left_the_spec_is_left_by_the_runs_own_record() {
    let (mut sim, _) = first_replaced_in_asg_1();
    assert_eq!(sim.status.surplus[0].auto_scaling_group, "asg-0");
    // The user drops asg-0 from the NodeGroup; its instances run on.
    let gone = sim.asgs.remove(0);
    for _ in 0..60 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(60);
        if sim.status.run_start.is_none() {
            break;
        }
    }
    assert!(sim.result().is_some(), "the run ended: {:?}", sim.status);
    let left = sim.status.surplus_left.clone().expect("the surplus left");
    let asgs: Vec<(&str, i32)> = left
        .asgs
        .iter()
        .map(|a| (a.auto_scaling_group.as_str(), a.count))
        .collect();
    assert_eq!(asgs, [("asg-0", gone.desired - 1)], "{:?}", sim.status);
}

/// A surplus node terminated (with decrement) by the run, its ASG then
/// dropped from the spec before its lowered count is seen: nothing is left
/// there (the run's record counts the removal), so the replenisher does
/// not take a node from it later for a surplus that is gone.
#[test]
fn a_surplus_removed_before_its_asg_left_the_spec_is_not_left_there() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.instances[1].launched -= chrono::Duration::days(1);
    sim.start_run();
    sim.all_join_and_ready();
    let mut removed = None;
    for _ in 0..200 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if let Some(t) = sim.status.current_target.clone()
            && t.purpose == TargetPurpose::RemoveSurplus
            && t.terminated.is_some()
        {
            removed = Some(t);
            break;
        }
    }
    let removed = removed.expect("the surplus removed");
    assert_eq!(removed.auto_scaling_group, "asg-0");
    sim.asgs.retain(|a| a.name != removed.auto_scaling_group);
    for _ in 0..60 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(60);
        if sim.status.run_start.is_none() {
            break;
        }
    }
    assert!(sim.result().is_some(), "the run ended: {:?}", sim.status);
    let left: Vec<String> = sim
        .status
        .surplus_left
        .iter()
        .flat_map(|l| l.asgs.iter().map(|a| a.auto_scaling_group.clone()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
