//! Nodes drained at once (`maxSurge` above 1): who joins the drain and
//! when, one validation for the batch, a node of it held or given up.

use super::*;
use crate::crd::nodegroup::MaxSurge;

/// `maxSurge` set, and room for it below each ASG's max.
fn with_surge(sim: &mut Sim, surge: i32) {
    if let Ok(s) = sim.settings.as_mut() {
        s.max_surge = MaxSurge::Count(surge);
    }
    for asg in &mut sim.asgs {
        asg.max = asg.desired + 1 + surge;
    }
}

/// Steps (new nodes Ready at once) up to the first drain step of `n`
/// nodes at once; their targets.
fn up_to_a_drain_of(sim: &mut Sim, n: usize) -> Vec<RefreshTarget> {
    for _ in 0..50 {
        let plan = sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if let Command::Drain(targets) = plan.command
            && targets.iter().count() == n
        {
            return targets.iter().cloned().collect();
        }
    }
    panic!("no drain of {n}: {:?}", sim.status.message);
}

/// Steps (new nodes Ready at once) until every node of `batch` is terminated.
fn until_terminated(sim: &mut Sim, batch: &[RefreshTarget]) {
    sim.run_until(|sim| {
        batch
            .iter()
            .all(|t| sim.terminated.contains(&t.instance_id))
    });
}

/// Steps (new nodes Ready at once) up to the launch ahead of the first
/// replacements, made but not Ready yet.
fn up_to_the_launch_ahead(sim: &mut Sim) {
    for _ in 0..50 {
        let plan = sim.step(false);
        if plan.message.starts_with("launching the replacement") {
            return;
        }
        sim.all_join_and_ready();
    }
    panic!("no launch ahead: {:?}", sim.status.message);
}

/// Four workers drifted (version 2 current), drift rolled with maxSurge 3,
/// drains of three steps.
fn drifted_batch_group() -> Sim {
    let mut sim = Sim::new(Role::Worker, 1, 4, 1);
    with_surge(&mut sim, 3);
    sim.drift_replace = true;
    sim.status.next_run = Some(sim.now + chrono::Duration::hours(1));
    sim.version = 2;
    sim.drain_length = 3;
    sim
}

#[test]
fn nodes_join_the_drain_only_once_their_replacements_are_ready() {
    let mut sim = Sim::new(Role::Worker, 1, 4, 1);
    with_surge(&mut sim, 3);
    sim.drain_length = 2;
    // Up to the launch ahead of three replacements.
    up_to_the_launch_ahead(&mut sim);
    assert_eq!(sim.status.launched_ahead.len(), 3);
    // Not Ready yet: the first node drains alone (the surplus holds its pods).
    let plan = sim.step(false);
    let Command::Drain(targets) = &plan.command else {
        panic!("{plan:?}")
    };
    assert_eq!(targets.iter().count(), 1, "{plan:?}");
    assert!(sim.status.alongside.is_empty());
    // Ready: the next two join it; the group stays whole besides the three.
    sim.all_join_and_ready();
    let plan = sim.step(false);
    let Command::Drain(targets) = &plan.command else {
        panic!("{plan:?}")
    };
    assert_eq!(targets.iter().count(), 3, "{plan:?}");
    assert!(targets.iter().all(|t| t.launched_ahead.is_some()));
    assert_eq!(sim.status.alongside.len(), 2);
    assert_eq!(sim.original_cordoned(), 3);
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), vec![("asg-0".to_string(), 4)]);
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 4));
    // 4 old, 1 surplus, 4 replacements: one launch each.
    assert_eq!(sim.next_id, 9);
}

#[test]
fn a_batch_is_validated_once_for_every_node_and_workload_it_moved() {
    let mut sim = Sim::new(Role::Worker, 1, 4, 1);
    with_surge(&mut sim, 2);
    sim.workloads = vec!["web/Deployment/web".into()];
    let batch = up_to_a_drain_of(&mut sim, 2);
    // Both terminated: the batch waits for its validation.
    until_terminated(&mut sim, &batch);
    sim.unsettled
        .insert("web/Deployment/web".into(), "1 pod Pending".into());
    for _ in 0..5 {
        let plan = sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        assert!(!matches!(plan.command, Command::Drain(_)), "{plan:?}");
        // (The next batch's replacements are launched meanwhile.)
        if !matches!(plan.command, Command::SetDesired(_)) {
            assert!(plan.message.contains("1 pod Pending"), "{}", plan.message);
        }
        assert_eq!(sim.status.replaced, 0);
    }
    sim.unsettled.clear();
    for _ in 0..5 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if sim.status.replaced > 0 {
            break;
        }
    }
    // Both counted at once, each reported.
    assert_eq!(sim.status.replaced, 2);
    let done = |t: &RefreshTarget| batch.iter().any(|b| b.instance_id == t.instance_id);
    assert!(!sim.status.batch().any(done));
    let replaced = |sim: &Sim| {
        sim.happenings
            .iter()
            .filter(|h| matches!(h, Happening::Replaced { .. }))
            .count()
    };
    assert_eq!(replaced(&sim), 2);
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(replaced(&sim), 4);
}

#[test]
fn a_node_drained_alongside_that_a_budget_holds_fails_the_run_and_every_old_node_stays() {
    let mut sim = Sim::new(Role::Worker, 1, 4, 1);
    with_surge(&mut sim, 3);
    let start = sim.layout();
    sim.drain_length = 3;
    let batch = up_to_a_drain_of(&mut sim, 3);
    let held = batch[2].node.clone().expect("node");
    sim.stuck.push(held.clone());
    for _ in 0..400 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if sim.status.last_run.is_some() {
            break;
        }
    }
    let (result, reason) = sim.result().expect("run ended");
    assert_eq!(result, RunResult::Failed);
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains(&held) && reason.contains("timed out"),
        "{reason}"
    );
    assert!(reason.contains(STUCK_BY), "{reason}");
    // The held node stays, back in service; the others went; the layout is back.
    assert!(!sim.terminated.contains(&batch[2].instance_id));
    assert!(
        batch[..2]
            .iter()
            .all(|t| sim.terminated.contains(&t.instance_id))
    );
    assert!(sim.instances.iter().all(|i| !i.cordoned));
    assert_eq!(sim.layout(), start);
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 4));
}

#[test]
fn a_restart_after_recording_the_termination_of_a_node_drained_alongside_terminates_it_once() {
    let mut sim = Sim::new(Role::Worker, 1, 4, 1);
    with_surge(&mut sim, 2);
    let start = sim.layout();
    let batch = up_to_a_drain_of(&mut sim, 2);
    // The first is terminated; the second's drain finishes next and the
    // manager dies with its termination recorded.
    let companion = batch[1].instance_id.clone();
    for _ in 0..20 {
        let recorded = sim
            .status
            .alongside
            .iter()
            .any(|t| t.instance_id == companion && t.terminated.is_some());
        if recorded {
            break;
        }
        sim.step_with(Some(Crash::BeforeTermination));
        sim.all_join_and_ready();
        sim.advance(1);
    }
    assert!(!sim.terminated.contains(&companion));
    let desired = sim.asgs[0].desired;
    let plan = sim.step(false);
    assert!(
        matches!(&plan.command, Command::Terminate(t) if t.instance_id == companion && t.decrements()),
        "{plan:?}"
    );
    assert_eq!(sim.asgs[0].desired, desired - 1);
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), start);
    assert_eq!(sim.next_id, 9);
}

#[test]
fn a_batch_waits_for_a_replacement_per_node_it_took() {
    let mut sim = Sim::new(Role::Worker, 1, 4, 1);
    with_surge(&mut sim, 2);
    let batch = up_to_a_drain_of(&mut sim, 2);
    until_terminated(&mut sim, &batch);
    // One of the two replacements is cordoned by someone else.
    let since = batch.iter().filter_map(|t| t.launched_ahead).min();
    let cordoned = sim
        .instances
        .iter()
        .find(|i| Some(i.launched) >= since)
        .map(|i| Sim::node_name(&i.id))
        .expect("a replacement");
    sim.unschedulable.insert(cordoned);
    // (The next nodes' replacements launched meanwhile are not Ready yet.)
    for _ in 0..5 {
        let plan = sim.step(false);
        sim.advance(1);
        assert_eq!(sim.status.replaced, 0, "{}", plan.message);
    }
    assert!(
        sim.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("fewer than 2 new node(s) in asg-0")),
        "{:?}",
        sim.status.message
    );
    sim.unschedulable.clear();
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.replaced, 4);
}

#[test]
fn nodes_join_a_batch_whose_first_node_drained_before_their_replacements_came_up() {
    let mut sim = Sim::new(Role::Worker, 1, 4, 1);
    with_surge(&mut sim, 3);
    up_to_the_launch_ahead(&mut sim);
    // The first node drains and goes (the surplus holds its pods) while
    // the three replacements are still coming up.
    let lead = sim.status.current_target.clone().expect("target");
    sim.steps(5, 1);
    assert!(sim.terminated.contains(&lead.instance_id));
    assert!(sim.status.alongside.is_empty());
    // Up: the next two join before the batch is validated.
    sim.all_join_and_ready();
    let plan = sim.step(false);
    let Command::Drain(targets) = &plan.command else {
        panic!("{plan:?}")
    };
    assert_eq!(targets.iter().count(), 2, "{plan:?}");
    assert_eq!(sim.status.replaced, 0);
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.layout(), vec![("asg-0".to_string(), 4)]);
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 4));
    assert_eq!(sim.next_id, 9);
}

#[test]
fn a_rollback_while_nodes_are_drained_alongside_puts_them_back_in_service() {
    let mut sim = drifted_batch_group();
    let old = sim.ids();
    let batch = up_to_a_drain_of(&mut sim, 3);
    assert_eq!(sim.original_cordoned(), 3);
    // Version 1 made current again: no old node is drifted any more.
    sim.version = 1;
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    // The nodes being drained are back in service and stay; whatever was
    // terminated before the rollback was drained first; nothing cordoned.
    assert!(
        sim.instances.iter().all(|i| !i.cordoned),
        "{:?}",
        sim.instances
    );
    for t in &batch[1..] {
        assert!(!sim.terminated.contains(&t.instance_id), "{t:?} terminated");
    }
    let kept = old.iter().filter(|o| !sim.terminated.contains(o)).count();
    assert!(kept >= 3, "{:?}", sim.terminated);
    assert!(
        sim.instances.iter().all(|i| i.version == 1),
        "{:?}",
        sim.instances
    );
    assert_eq!(sim.layout(), vec![("asg-0".to_string(), 4)]);
    assert_eq!(sim.lock, LockState::Free);
}

#[test]
fn a_rollback_after_the_first_node_went_puts_the_nodes_drained_alongside_back() {
    let mut sim = drifted_batch_group();
    // The first node drains and goes while the replacements come up.
    up_to_the_launch_ahead(&mut sim);
    let lead = sim.status.current_target.clone().expect("target");
    sim.steps(10, 1);
    assert!(sim.terminated.contains(&lead.instance_id));
    // Up: two join the batch, then version 1 is made current again.
    sim.all_join_and_ready();
    sim.step(false);
    let alongside: Vec<String> = sim
        .status
        .alongside
        .iter()
        .map(|t| t.instance_id.clone())
        .collect();
    assert_eq!(alongside.len(), 2, "{:?}", sim.status.message);
    sim.version = 1;
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    for id in &alongside {
        assert!(
            !sim.terminated.contains(id),
            "{id} terminated after the rollback"
        );
    }
    assert!(
        sim.instances.iter().all(|i| !i.cordoned),
        "{:?}",
        sim.instances
    );
    assert_eq!(sim.layout(), vec![("asg-0".to_string(), 4)]);
}

#[test]
fn a_run_says_when_it_waits_on_the_cluster_only_and_never_while_it_changes_aws() {
    let mut sim = Sim::new(Role::Worker, 1, 4, 1);
    sim.drain_length = 2;
    let (mut on_cluster, mut on_aws) = (0, 0);
    for _ in 0..300 {
        let plan = sim.step(false);
        if plan.waits_on_cluster {
            on_cluster += 1;
            assert!(
                matches!(
                    plan.status.phase,
                    RefreshPhase::Draining | RefreshPhase::WaitingForReplacement
                ),
                "{:?}",
                plan.status.phase
            );
        }
        on_aws += usize::from(plan.command.changes_aws());
        sim.advance(1);
        sim.all_join_and_ready();
        if sim.status.run_start.is_none() && sim.status.last_run.is_some() {
            break;
        }
    }
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert!(on_cluster > 0 && on_aws > 0, "{on_cluster} {on_aws}");
}
