//! Launch before terminate (`maxSurge`): workers' replacements come up
//! while their old nodes drain; masters and full ASGs replace after.

use super::*;
use crate::crd::nodegroup::MaxSurge;

fn with_surge(sim: &mut Sim, surge: MaxSurge) {
    if let Ok(s) = sim.settings.as_mut() {
        s.max_surge = surge;
    }
}

/// Steps (new nodes Ready at once) up to the first drain step; its target.
fn up_to_first_drain(sim: &mut Sim) -> RefreshTarget {
    for _ in 0..50 {
        let plan = sim.step(false);
        sim.all_join_and_ready();
        if let Command::Drain(targets) = plan.command {
            return targets.first;
        }
    }
    panic!("no drain: {:?}", sim.status.message);
}

fn desired_of(sim: &Sim, asg: &str) -> i32 {
    sim.asgs
        .iter()
        .find(|a| a.name == asg)
        .map(|a| a.desired)
        .expect("asg")
}

fn in_asg(sim: &Sim, asg: &str) -> usize {
    sim.instances.iter().filter(|i| i.asg == asg).count()
}

fn surplus_in(sim: &Sim, asg: &str) -> i32 {
    surplus_of(&sim.status.surplus, asg)
}

#[test]
fn a_workers_replacement_comes_up_while_it_drains_and_it_goes_with_decrement() {
    let mut sim = Sim::new(Role::Worker, 2, 2, 1);
    let start = sim.layout();
    let target = up_to_first_drain(&mut sim);
    let asg = target.auto_scaling_group.clone();
    let recorded = start.iter().find(|(a, _)| *a == asg).expect("asg").1;
    let base = recorded + surplus_in(&sim, &asg);
    // Raised for it before its drain: the replacement is there beside it.
    assert!(target.launched_ahead.is_some(), "{target:?}");
    assert_eq!(desired_of(&sim, &asg), base + 1);
    assert_eq!(in_asg(&sim, &asg), (base + 1) as usize);
    assert_eq!(
        sim.status.launched_ahead.len(),
        1,
        "{:?}",
        sim.status.launched_ahead
    );
    // Terminated with decrement: the ASG is back at its count with surplus.
    for _ in 0..20 {
        if sim.terminated.contains(&target.instance_id) {
            break;
        }
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
    }
    assert_eq!(desired_of(&sim, &asg), base);
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    assert!(
        sim.ready_after_terminations
            .iter()
            .all(|r| *r >= sim.desired)
    );
    // 4 old, 1 surplus, 4 replacements: launched once each.
    assert_eq!(sim.next_id, 9);
}

#[test]
fn the_first_replacement_is_launched_with_the_surplus_not_after_it() {
    let mut sim = Sim::new(Role::Worker, 2, 2, 1);
    let start = sim.layout();
    sim.step(false); // lock
    sim.step(false); // the surplus raised
    assert_eq!(sim.asgs.iter().map(|a| a.desired).sum::<i32>(), 5);
    // The surplus is not Ready yet: the first node's replacement is raised
    // for now, so both come up together.
    let plan = sim.step(false);
    assert!(
        matches!(plan.command, Command::SetDesired(_)),
        "{:?}",
        plan.command
    );
    assert_eq!(sim.status.phase, RefreshPhase::ScalingUp);
    assert_eq!(sim.status.launched_ahead.len(), 1);
    assert_eq!(sim.asgs.iter().map(|a| a.desired).sum::<i32>(), 6);
    // Nothing more while it waits; the first drain takes that node, its
    // replacement already coming.
    let plan = sim.step(false);
    assert!(
        matches!(plan.command, Command::Nothing),
        "{:?}",
        plan.command
    );
    sim.all_join_and_ready();
    let target = up_to_first_drain(&mut sim);
    assert_eq!(
        Some(&target.instance_id),
        sim.status.launched_ahead.first().map(|a| &a.instance_id)
    );
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    // 4 old, 1 surplus, 4 replacements: launched once each.
    assert_eq!(sim.next_id, 9);
    assert!(
        sim.ready_after_terminations
            .iter()
            .all(|r| *r >= sim.desired)
    );
}

#[test]
fn with_max_surge_zero_each_replacement_comes_after_its_node() {
    let mut sim = Sim::new(Role::Worker, 2, 2, 1);
    with_surge(&mut sim, MaxSurge::Count(0));
    let start = sim.layout();
    let target = up_to_first_drain(&mut sim);
    let asg = target.auto_scaling_group.clone();
    let recorded = start.iter().find(|(a, _)| *a == asg).expect("asg").1;
    assert_eq!(target.launched_ahead, None);
    assert_eq!(desired_of(&sim, &asg), recorded + surplus_in(&sim, &asg));
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    assert_eq!(sim.next_id, 9);
    assert!(
        sim.happenings
            .iter()
            .all(|h| !matches!(h, Happening::Failed(_))),
        "{:?}",
        sim.happenings
    );
}

#[test]
fn max_surge_launches_the_next_nodes_replacements_ahead_and_drains_up_to_its_count() {
    let mut sim = Sim::new(Role::Worker, 2, 2, 1);
    with_surge(&mut sim, MaxSurge::Count(2));
    let start = sim.layout();
    let start_total: i32 = start.iter().map(|(_, d)| d).sum();
    up_to_first_drain(&mut sim);
    assert_eq!(sim.status.launched_ahead.len(), 2);
    let total = |sim: &Sim| sim.asgs.iter().map(|a| a.desired).sum::<i32>();
    assert_eq!(total(&sim), start_total + 1 + 2);
    let mut most_draining = 0;
    for _ in 0..300 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        assert!(sim.status.launched_ahead.len() <= 2);
        assert!(total(&sim) <= start_total + 1 + 2, "{:?}", sim.layout());
        most_draining = most_draining.max(sim.original_cordoned());
        if sim.status.run_start.is_none() {
            break;
        }
    }
    // Two old nodes drained at once (their replacements Ready), never more.
    assert_eq!(most_draining, 2);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    assert_eq!(sim.next_id, 9);
}

#[test]
fn a_percentage_of_the_group_rounds_up() {
    assert_eq!(MaxSurge::Percent(25).of(48), 12);
    assert_eq!(MaxSurge::Percent(25).of(3), 1);
    assert_eq!(MaxSurge::Percent(25).of(0), 0);
    assert_eq!(MaxSurge::Percent(0).of(12), 0);
    assert_eq!(MaxSurge::Count(2).of(12), 2);
}

#[test]
fn masters_are_never_launched_ahead() {
    let mut sim = Sim::new(Role::Master, 3, 1, 0);
    with_surge(&mut sim, MaxSurge::Count(3));
    let start = sim.layout();
    for _ in 0..300 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        assert!(sim.status.launched_ahead.is_empty());
        assert_eq!(sim.layout(), start, "a master ASG raised");
        if sim.status.last_run.is_some() {
            break;
        }
    }
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.next_id, 6);
}

#[test]
fn an_asg_at_its_max_replaces_its_node_after_terminating_it() {
    let mut sim = Sim::new(Role::Worker, 1, 2, 1);
    // Room for the surplus only.
    sim.asgs[0].max = 3;
    let start = sim.layout();
    let target = up_to_first_drain(&mut sim);
    assert_eq!(target.launched_ahead, None);
    assert!(sim.status.launched_ahead.is_empty());
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    assert_eq!(sim.next_id, 5);
}

#[test]
fn without_surplus_a_node_launched_ahead_waits_for_its_replacement_ready() {
    let mut sim = Sim::new(Role::Worker, 1, 3, 0);
    let start = sim.layout();
    // The launch ahead, then no drain while the replacement is not Ready.
    let mut held = false;
    for _ in 0..10 {
        let plan = sim.step(false);
        assert!(!matches!(plan.command, Command::Drain(_)), "{plan:?}");
        held |= plan.message.starts_with("holding");
        sim.advance(1);
    }
    assert!(held);
    assert_eq!(sim.asgs[0].desired, 4);
    sim.all_join_and_ready();
    let target = up_to_first_drain(&mut sim);
    assert!(target.launched_ahead.is_some());
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    // Classic replacement without surplus would leave 2 Ready of 3.
    assert!(
        sim.ready_after_terminations.iter().all(|r| *r >= 3),
        "{:?}",
        sim.ready_after_terminations
    );
}

#[test]
fn a_restart_between_recording_a_launch_ahead_and_the_raise_raises_once() {
    let mut sim = Sim::new(Role::Worker, 1, 2, 1);
    let start = sim.layout();
    // Up to the launch ahead, which the manager dies before making.
    for _ in 0..50 {
        let plan = sim.plan();
        if plan.message.starts_with("launching the replacement") {
            sim.step(true);
            break;
        }
        sim.step(false);
        sim.all_join_and_ready();
    }
    assert_eq!(sim.status.launched_ahead.len(), 1);
    assert_eq!(sim.asgs[0].desired, 3, "raised before the restart");
    // Restarted: the raise recorded is made, once, then the drain.
    let plan = sim.step(false);
    assert!(matches!(plan.command, Command::SetDesired(_)), "{plan:?}");
    assert_eq!(sim.asgs[0].desired, 4);
    sim.all_join_and_ready();
    let plan = sim.step(false);
    assert!(matches!(plan.command, Command::Drain(_)), "{plan:?}");
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    assert_eq!(sim.next_id, 5);
}

#[test]
fn a_restart_after_recording_the_termination_of_a_node_launched_ahead_decrements_once() {
    let mut sim = Sim::new(Role::Worker, 1, 2, 1);
    let start = sim.layout();
    let target = up_to_first_drain(&mut sim);
    assert!(target.launched_ahead.is_some());
    // Its drain finishes, the termination is recorded, the manager dies.
    let plan = sim.step_with(Some(Crash::BeforeTermination));
    assert!(matches!(plan.command, Command::Drain(_)), "{plan:?}");
    assert!(!sim.terminated.contains(&target.instance_id));
    assert_eq!(sim.asgs[0].desired, 4);
    let plan = sim.step(false);
    assert!(
        matches!(&plan.command, Command::Terminate(t) if t.instance_id == target.instance_id && t.decrements()),
        "{plan:?}"
    );
    assert_eq!(sim.asgs[0].desired, 3);
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    assert_eq!(sim.next_id, 5);
}
