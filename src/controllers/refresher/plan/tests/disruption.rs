//! Disruption controls: the manager-wide slot (held for a run's disruptions,
//! given back at its quiet waits) and maintenance windows.

use super::*;

fn night(opens_in_minutes: i64, now: DateTime<Utc>) -> WindowState {
    WindowState::Closed {
        opens: Some(now + chrono::Duration::minutes(opens_in_minutes)),
    }
}

/// Steps a run, its window open for an hour, up to its first node being
/// drained.
fn draining_in_an_open_window(sim: &mut Sim) {
    sim.window = WindowState::Open {
        closes: sim.now + chrono::Duration::hours(1),
    };
    for _ in 0..20 {
        sim.step(false);
        sim.all_join_and_ready();
        if sim.status.phase == RefreshPhase::Draining {
            break;
        }
    }
}

#[test]
fn a_due_run_waits_for_a_slot_held_elsewhere_without_taking_the_lock_then_starts() {
    let mut sim = Sim::new(Role::Master, 3, 1, 0);
    sim.slot = SlotState::Full("ns/masters-b is disrupting a control-plane node".into());
    for _ in 0..3 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing);
        assert!(
            plan.message.contains("waiting for a disruption slot"),
            "{}",
            plan.message
        );
        assert!(plan.message.contains("ns/masters-b"), "{}", plan.message);
        assert_eq!(plan.status.phase, RefreshPhase::WaitingForSlot);
        assert_eq!(plan.status.run_start, None, "not skipped, not started");
        assert!(plan.status.last_run.is_none(), "not skipped");
        sim.advance(30);
    }
    assert_eq!(
        sim.lock,
        LockState::Free,
        "the group's lock is not held while waiting"
    );
    sim.slot = SlotState::Free;
    // The lock first; the slot is the executor's, taken before the first
    // node goes (one order for every path).
    sim.takes_the_lock();
    sim.step(false);
    assert!(sim.status.run_start.is_some(), "{:?}", sim.status.message);
    sim.run_to_end(300);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
    assert!(sim.slot_takes > 0, "no node taken away with a slot");
    assert_eq!(sim.slot, SlotState::Free, "released at the end of the run");
}

#[test]
fn a_run_that_finds_its_slot_taken_pauses_without_acting() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.start_run();
    sim.all_join_and_ready();
    sim.step(false);
    let before = sim.status.clone();
    assert!(before.run_start.is_some());
    sim.slot = SlotState::Full("1 of 1 disruption slot(s) held, by ns/other".into());
    let actions = sim.actions.len();
    for _ in 0..5 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
        assert!(plan.message.contains("run paused"), "{}", plan.message);
        sim.advance(30);
    }
    assert!(
        sim.actions[actions..]
            .iter()
            .all(|a| *a == Command::Nothing)
    );
    assert_eq!(sim.status.run_start, before.run_start);
    // Free again (the other group's run ended): the run goes on, the
    // executor taking the slot before its first drain step.
    sim.slot = SlotState::Free;
    sim.steps_until_a_drain();
    assert_eq!(sim.slot, SlotState::Ours, "taken by the executor to drain");
    sim.run_to_end(300);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
}

#[test]
fn a_due_run_outside_every_window_waits_for_one_and_is_not_skipped() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.window = night(120, sim.now);
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(
        plan.message.contains("outside the maintenance windows"),
        "{}",
        plan.message
    );
    assert_eq!(plan.status.run_start, None);
    assert_eq!(plan.status.phase, RefreshPhase::WaitingForWindow);
    assert!(plan.status.last_run.is_none(), "a wait, not a skipped run");
    assert!(plan.requeue <= Duration::from_secs(7200));
    // The window opens: the run starts.
    sim.advance(7200);
    sim.window = WindowState::Open {
        closes: sim.now + chrono::Duration::hours(4),
    };
    sim.takes_the_lock();
    sim.step(false);
    assert!(sim.status.run_start.is_some(), "{:?}", sim.status.message);
}

/// Issue 68, hole 7: a due run waiting for its window is not skipped by a
/// blocker met during the wait that passes before the window opens (a
/// node NotReady for a while): blockers are judged when it may start, as
/// its preview says it starts when the window opens.
#[test]
fn a_due_run_waiting_for_its_window_is_not_skipped_by_a_blocker_that_passes_meanwhile() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.window = night(120, sim.now);
    let node = Sim::node_name(&sim.instances[0].id);
    sim.dead.push(node);
    let plan = sim.step(false);
    assert_eq!(
        plan.status.phase,
        RefreshPhase::WaitingForWindow,
        "{}",
        plan.message
    );
    assert!(plan.status.last_run.is_none(), "skipped: {}", plan.message);
    assert!(plan.status.next_run.is_some(), "the due run forgotten");
    // It passes; the window opens: the run starts.
    sim.dead.clear();
    sim.advance(7200);
    sim.window = WindowState::Open {
        closes: sim.now + chrono::Duration::hours(4),
    };
    sim.takes_the_lock();
    sim.step(false);
    assert!(sim.status.run_start.is_some(), "{:?}", sim.status.message);
    assert!(sim.status.last_run.is_none(), "{:?}", sim.status.last_run);
}

#[test]
fn a_run_whose_window_closes_finishes_the_node_in_hand_then_waits_with_its_surplus() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let layout = sim.layout();
    draining_in_an_open_window(&mut sim);
    let in_hand = sim.status.current_target.clone().expect("a node in hand");
    sim.window = night(600, sim.now);
    // The node in hand is finished: drained, terminated, replaced.
    for _ in 0..10 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(5);
    }
    assert_eq!(sim.terminated, vec![in_hand.instance_id.clone()]);
    assert_eq!(sim.status.replaced, 1);
    // Then it waits, its surplus kept, taking no other node.
    for _ in 0..20 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
        assert!(
            plan.message.contains("keeping its surplus"),
            "{}",
            plan.message
        );
        sim.advance(60);
    }
    assert_eq!(sim.terminated.len(), 1);
    assert!(!sim.status.surplus.is_empty(), "surplus kept");
    assert_eq!(sim.ready_count(), 4, "desired 3 + surplus 1");
    // The next window: it resumes and ends with the layout as it was.
    sim.window = WindowState::Open {
        closes: sim.now + chrono::Duration::hours(4),
    };
    sim.run_to_end(300);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
    assert_eq!(sim.terminated.len(), 4, "3 old nodes and the surplus");
    assert_eq!(sim.layout(), layout);
}

/// Steps (new nodes Ready at once) until a node is being drained.
fn up_to_the_first_drain(sim: &mut Sim) -> RefreshTarget {
    for _ in 0..20 {
        sim.step(false);
        sim.all_join_and_ready();
        if sim.status.phase == RefreshPhase::Draining {
            break;
        }
    }
    sim.status.current_target.clone().expect("a node in hand")
}

#[test]
fn a_run_whose_window_closes_with_scale_down_removes_its_surplus_and_resumes_in_the_next() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.on_window_close = OnWindowClose::ScaleDown;
    let layout = sim.layout();
    let old = sim.ids();
    sim.window = WindowState::Open {
        closes: sim.now + chrono::Duration::hours(1),
    };
    let in_hand = up_to_the_first_drain(&mut sim);
    let started = sim.status.run_start.expect("started");
    sim.window = night(600, sim.now);
    // The node in hand is finished, then the surplus goes and the leg ends.
    for _ in 0..40 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(5);
        if sim.status.pending_run.is_some() && sim.status.run_start.is_none() {
            break;
        }
    }
    let pending = sim.status.pending_run.clone().expect("set aside");
    assert_eq!(sim.status.run_start, None, "{:?}", sim.status.message);
    assert_eq!(pending.replaced, 1);
    assert_eq!(pending.total, 3);
    assert_eq!(pending.started, started);
    assert_eq!(pending.remaining.len(), 2);
    assert!(!pending.remaining.contains(&in_hand.instance_id));
    assert_eq!(sim.terminated.len(), 2, "the node in hand and the surplus");
    assert_eq!(sim.terminated[0], in_hand.instance_id);
    assert_eq!(sim.layout(), layout, "the original layout back");
    assert_eq!(sim.ready_count(), 3);
    assert_eq!(sim.lock, LockState::Free);
    assert_eq!(sim.slot, SlotState::Free);
    assert!(sim.status.last_run.is_none(), "the run is not over");
    assert!(
        sim.happenings
            .iter()
            .any(|h| matches!(h, Happening::SetAside { remaining: 2, .. }))
    );
    // Closed: nothing more, and it says what it waits for.
    for _ in 0..10 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
        assert!(
            plan.message.contains("2 node(s) left of a run set aside"),
            "{}",
            plan.message
        );
        assert!(plan.status.pending_run.is_some());
        sim.advance(60);
    }
    assert_eq!(sim.terminated.len(), 2);
    // The next window: it resumes with a new surplus and replaces the rest.
    sim.window = WindowState::Open {
        closes: sim.now + chrono::Duration::hours(4),
    };
    sim.run_to_end(300);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
    let last = sim.status.last_run.clone().expect("finished");
    assert_eq!((last.replaced, last.started), (3, started));
    assert_eq!(sim.status.pending_run, None);
    assert!(old.iter().all(|id| sim.terminated.contains(id)));
    assert_eq!(sim.terminated.len(), 5, "3 old nodes and 2 surplus nodes");
    assert_eq!(sim.layout(), layout);
    assert!(
        sim.happenings
            .iter()
            .any(|h| matches!(h, Happening::Resumed { remaining: 2 }))
    );
}

#[test]
fn a_run_set_aside_whose_nodes_left_meanwhile_ends_without_a_surplus() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.status.next_run = Some(sim.now + chrono::Duration::days(1));
    sim.status.pending_run = Some(crate::crd::refresher::PendingRun {
        started: sim.now - chrono::Duration::hours(20),
        trigger: Some(RunTrigger::Schedule),
        remaining: vec!["i-gone".into()],
        replaced: 2,
        total: 3,
    });
    let plan = sim.step(false);
    assert_eq!(plan.status.pending_run, None);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
    assert_eq!(plan.status.last_run.map(|r| r.replaced), Some(2));
    assert!(
        sim.actions.iter().all(|a| !a.mutates()),
        "{:?}",
        sim.actions
    );
}

#[test]
fn a_drift_roll_waits_for_a_window() {
    let mut sim = Sim::new(Role::Worker, 2, 1, 1);
    sim.status.next_run = Some(sim.now + chrono::Duration::days(1));
    sim.drift_replace = true;
    sim.version = 2;
    sim.window = night(30, sim.now);
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(
        plan.message.contains("the drift roll waits"),
        "{}",
        plan.message
    );
    assert!(
        plan.message.contains("maintenance windows"),
        "{}",
        plan.message
    );
    assert_eq!(plan.status.run_start, None);
}

#[test]
fn a_protected_node_is_taken_last_then_skipped_and_reported_by_default() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let first = sim.instances[0].id.clone();
    let node = Sim::node_name(&first);
    sim.protected.insert(
        node.clone(),
        "pod app/db is annotated nodemanager.dev/do-not-disrupt".into(),
    );
    sim.run_to_end(300);
    let (result, _) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Succeeded);
    assert!(!sim.terminated.contains(&first), "the protected node stays");
    assert!(!sim.drain_steps.contains(&node), "and is never drained");
    assert_eq!(sim.status.replaced, 2);
    assert_eq!(sim.status.skipped.len(), 1);
    assert_eq!(sim.status.skipped[0].node, node);
    assert!(sim.status.skipped[0].reason.contains("do-not-disrupt"));
    assert!(sim.happenings.iter().any(|h| matches!(
        h,
        Happening::NodesSkipped(n) if n.len() == 1 && n[0].0 == node
    )));
}

#[test]
fn a_run_waits_for_a_protected_node_up_to_its_timeout_and_takes_it_once_free() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.do_not_disrupt_timeout = Duration::from_secs(600);
    let first = sim.instances[0].id.clone();
    let node = Sim::node_name(&first);
    sim.protected
        .insert(node.clone(), "cordoned by someone else".into());
    // The other two are replaced; then the run waits for the protected one.
    for _ in 0..200 {
        let plan = sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if plan.message.contains("waiting for protected node(s)") {
            break;
        }
    }
    assert_eq!(sim.status.replaced, 2, "{:?}", sim.status.message);
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(
        plan.message.contains("cordoned by someone else"),
        "{}",
        plan.message
    );
    // Freed within the timeout: it is replaced after all.
    sim.advance(300);
    sim.protected.clear();
    sim.run_to_end(300);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
    assert!(sim.terminated.contains(&first));
    assert!(sim.status.skipped.is_empty());
}

/// A run keeps its group's lock while it waits for a protected node, so
/// it waits no longer than its `pauseTimeout`, whatever
/// `doNotDisruptTimeout` says: past it the node is skipped (reported), and
/// the run goes on.
#[test]
fn a_run_waits_for_a_protected_node_no_longer_than_its_pause_timeout() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.do_not_disrupt_timeout = Duration::from_secs(24 * 3600);
    let first = sim.instances[0].id.clone();
    let node = Sim::node_name(&first);
    sim.protected
        .insert(node.clone(), "the Node is annotated".into());
    let (mut waiting, mut skipped) = (None, None);
    for _ in 0..400 {
        let plan = sim.step(false);
        sim.all_join_and_ready();
        if waiting.is_none() && plan.message.contains("waiting for protected node(s)") {
            waiting = Some(sim.now);
        }
        let skip = |h: &Happening| matches!(h, Happening::NodesSkipped(_));
        if skipped.is_none() && sim.happenings.iter().any(skip) {
            skipped = Some(sim.now);
        }
        if waiting.is_some() && sim.status.run_start.is_none() {
            break;
        }
        sim.advance(60);
    }
    let waiting = waiting.expect("it waited for the protected node");
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
    assert_eq!(sim.status.last_run.map(|r| r.replaced), Some(2));
    assert!(
        !sim.terminated.contains(&first),
        "protected: never replaced"
    );
    let waited = skipped.map(|t| t - waiting);
    assert!(
        waited.is_some_and(|w| w <= chrono::Duration::minutes(62)),
        "skipped after {waited:?}, the pause timeout is 1 h"
    );
}

#[test]
fn a_protected_node_that_died_is_replaced_as_a_repair() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let first = sim.instances[0].id.clone();
    let node = Sim::node_name(&first);
    sim.protected
        .insert(node.clone(), "the Node is annotated".into());
    // Once the run drains its first node, the protected one dies.
    for _ in 0..50 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(5);
        if sim.status.phase == RefreshPhase::Draining {
            break;
        }
    }
    sim.dead.push(node.clone());
    sim.run_to_end(400);
    assert!(sim.terminated.contains(&first), "{:?}", sim.status);
    assert!(sim.status.skipped.is_empty());
}

/// A run with a surplus of one, every step protecting the nodes `protect`
/// picks: to its end. The original instances, every instance that was
/// protected at some step, and the last plan's message.
fn run_protecting(
    protect: impl Fn(&Sim) -> Vec<String>,
) -> (Sim, Vec<String>, BTreeSet<String>, String) {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let original = sim.ids();
    let mut ever = BTreeSet::new();
    let mut message = String::new();
    for _ in 0..300 {
        let now = protect(&sim);
        ever.extend(now.iter().cloned());
        sim.protected = now
            .into_iter()
            .map(|id| (Sim::node_name(&id), "pod app/job has no controller".into()))
            .collect();
        message = sim.step(false).message;
        sim.all_join_and_ready();
        sim.advance(1);
        if sim.status.run_start.is_none() && sim.status.last_run.is_some() {
            break;
        }
    }
    (sim, original, ever, message)
}

#[test]
fn the_surplus_removed_at_the_end_is_never_a_protected_node() {
    // Unprotected, the run removes one new node as its surplus (the sim is
    // deterministic: the same one each time).
    let (sim, original, _, _) = run_protecting(|_| vec![]);
    let removed_first: Vec<String> = sim
        .terminated
        .iter()
        .filter(|id| !original.contains(id))
        .cloned()
        .collect();
    let [victim] = removed_first.as_slice() else {
        panic!("one surplus removed: {:?}", sim.terminated);
    };
    // That node carries a pod no controller would recreate from the start:
    // another new node goes.
    let (sim, original, protected, _) = run_protecting(|_| vec![victim.clone()]);
    assert_eq!(protected, BTreeSet::from([victim.clone()]));
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    let removed: Vec<&String> = sim
        .terminated
        .iter()
        .filter(|id| !original.contains(id))
        .collect();
    assert_eq!(
        removed.len(),
        1,
        "one surplus removed: {:?}",
        sim.terminated
    );
    assert_ne!(removed[0], victim, "the protected node stays");
    assert_eq!(
        sim.layout(),
        vec![
            ("asg-0".into(), 1),
            ("asg-1".into(), 1),
            ("asg-2".into(), 1)
        ]
    );
}

#[test]
fn a_surplus_whose_nodes_are_all_protected_is_kept_and_the_run_says_so() {
    let (sim, original, _, message) = run_protecting(|sim| {
        sim.instances
            .iter()
            .map(|i| i.id.clone())
            .filter(|id| !sim.status.planned_instances.contains(id))
            .collect()
    });
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert!(
        sim.terminated.iter().all(|id| original.contains(id)),
        "only the replaced nodes were terminated: {:?}",
        sim.terminated
    );
    assert!(
        message.contains("surplus kept on protected nodes in asg-0"),
        "{message}"
    );
    assert_eq!(sim.layout()[0], ("asg-0".into(), 2), "the surplus stays");
    assert_eq!(sim.lock, LockState::Free, "the run ended: lock given back");
}

#[test]
fn a_target_whose_asg_left_the_spec_mid_drain_is_given_back() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.drain_length = 5;
    sim.run_until(|s| {
        s.status
            .current_target
            .as_ref()
            .is_some_and(|t| t.purpose == TargetPurpose::Replace)
            && s.instances.iter().any(|i| i.cordoned)
    });
    let target = sim.status.current_target.clone().expect("a target");
    let node = target.node.clone().expect("a node");
    // The user drops its ASG from the NodeGroup (and its node from the
    // group's count).
    sim.asgs.retain(|a| a.name != target.auto_scaling_group);
    sim.desired -= 1;
    let plan = sim.step(false);
    assert!(
        matches!(&plan.command, Command::GiveBack { target, .. } if target.node.as_ref() == Some(&node)),
        "{:?}: {}",
        plan.command,
        plan.message
    );
    assert!(
        plan.message
            .contains("is no longer one of the group's ASGs"),
        "{}",
        plan.message
    );
    assert!(
        !sim.instances.iter().any(|i| i.cordoned),
        "the node is back in service"
    );
    assert!(
        sim.status
            .batch()
            .all(|t| t.instance_id != target.instance_id)
    );
    // Stepping on, it is neither terminated nor cordoned again.
    for _ in 0..20 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
    }
    assert!(
        !sim.terminated.contains(&target.instance_id),
        "not ours to terminate"
    );
    assert!(
        !sim.instances
            .iter()
            .any(|i| i.id == target.instance_id && i.cordoned),
        "nor cordoned again"
    );
}

/// Issue 68: a node in hand that turns protected mid-drain (a
/// do-not-disrupt mark added while its pods move) is given back and
/// skipped: the rule book's check refuses its next step, and the run goes
/// on without it instead of asking again and again.
#[test]
fn a_node_that_turns_protected_mid_drain_is_given_back_and_skipped() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let mut in_hand = None;
    for _ in 0..100 {
        let plan = sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if let Command::Drain(batch) = &plan.command {
            in_hand = batch.first.node.clone();
            break;
        }
    }
    let node = in_hand.expect("a drain began");
    let id = sim
        .ids()
        .into_iter()
        .find(|id| Sim::node_name(id) == node)
        .expect("its instance");
    sim.stuck.push(node.clone());
    sim.protected
        .insert(node.clone(), "the Node is annotated".into());
    let plan = sim.step(false);
    assert!(
        matches!(&plan.command, Command::GiveBack { target, .. } if target.node.as_ref() == Some(&node)),
        "{:?}: {}",
        plan.command,
        plan.message
    );
    assert!(
        plan.message.contains("turned protected"),
        "{}",
        plan.message
    );
    sim.stuck.clear();
    sim.run_to_end(400);
    let (result, _) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Succeeded);
    assert!(!sim.terminated.contains(&id), "{node} was terminated");
    assert_eq!(sim.status.skipped.len(), 1, "{:?}", sim.status.skipped);
    assert_eq!(sim.status.skipped[0].node, node);
}

/// Issue 68, nothing held while a path waits: a run whose window closes
/// finishes the node in hand, then waits with its lock, its surplus and
/// its place, but gives the manager-wide slot back (a dead master or
/// another group's run may need it meanwhile). When the window opens it
/// takes the slot again before acting, and waits (paused) while another
/// holds it.
#[test]
fn a_run_waiting_for_its_window_gives_the_slot_back_and_takes_it_again_to_go_on() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    draining_in_an_open_window(&mut sim);
    sim.window = night(600, sim.now);
    let gives = sim.slot_gives;
    for _ in 0..30 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(5);
    }
    assert_eq!(sim.slot_gives - gives, 1, "given back once");
    assert_eq!(sim.slot, SlotState::Free, "{:?}", sim.status.message);
    assert_eq!(sim.lock, LockState::Ours, "the run keeps its lock");
    assert!(sim.status.run_start.is_some());
    assert!(!sim.status.surplus.is_empty(), "surplus kept");
    assert_eq!(sim.status.replaced, 1);
    // Another group takes the slot; the window opens: the run waits.
    sim.slot = SlotState::Full("Refresh ns/other".into());
    sim.window = WindowState::Open {
        closes: sim.now + chrono::Duration::hours(4),
    };
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
    assert!(
        plan.message.contains("Refresh ns/other"),
        "{}",
        plan.message
    );
    // Free again: taken by the executor before the first drain step, then
    // the run ends.
    sim.slot = SlotState::Free;
    sim.steps_until_a_drain();
    assert_eq!(sim.slot, SlotState::Ours, "taken by the executor to drain");
    sim.run_to_end(300);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
    assert_eq!(sim.status.last_run.map(|r| r.replaced), Some(3));
}

/// The slot bounds disruptions, not runs, and a run gives it back only at a
/// quiet point: a master run paused (its group suspended) while its
/// terminated master's replacement is still coming keeps the slot (a
/// master is out), and gives it back once the replacement has joined and
/// left its batch, a Master group's run as a worker's.
#[test]
fn a_run_keeps_the_slot_while_its_terminated_nodes_replacement_is_coming() {
    let mut sim = Sim::new(Role::Master, 3, 1, 0);
    sim.window = WindowState::Open {
        closes: sim.now + chrono::Duration::hours(1),
    };
    for _ in 0..40 {
        if !sim.terminated.is_empty() {
            break;
        }
        sim.step(false);
        sim.advance(1);
    }
    assert_eq!(sim.terminated.len(), 1, "{:?}", sim.status.message);
    sim.suspended = true;
    for _ in 0..30 {
        let plan = sim.step(false);
        assert!(plan.message.contains("suspended"), "{}", plan.message);
        assert_eq!(sim.slot, SlotState::Ours, "{}", plan.message);
        sim.advance(5);
    }
    assert_eq!(sim.slot, SlotState::Ours, "{:?}", sim.status.message);
    assert!(sim.status.batch().next().is_some());
    // Joined while suspended: the paused run does not step, so the
    // replacement stays in its batch and the slot with it.
    sim.all_join_and_ready();
    sim.steps(5, 5);
    assert_eq!(sim.slot, SlotState::Ours);
    // Resumed with its window closed: the replacement leaves the batch, and
    // the run, waiting for its window at a quiet point, gives the slot back.
    sim.suspended = false;
    sim.window = night(600, sim.now);
    let gives = sim.slot_gives;
    for _ in 0..40 {
        let held = sim.slot == SlotState::Ours;
        sim.step(false);
        if held && sim.slot != SlotState::Ours {
            assert!(sim.status.batch().next().is_none(), "{:?}", sim.status);
        }
        sim.advance(5);
    }
    assert_eq!(sim.slot_gives - gives, 1, "{:?}", sim.status.message);
    assert_eq!(sim.slot, SlotState::Free);
    assert_eq!(sim.lock, LockState::Ours, "the run keeps its lock");
    assert_eq!(sim.status.replaced, 1);
}

/// A run waiting on a protected node, its slot given back, while another
/// group holds every slot: it says what it waits for (the protected node,
/// not the slot), and no pause clock runs, so it is not set aside past
/// `pauseTimeout` for a slot it does not need yet. Once the node is free,
/// it waits for the slot (paused from then), then takes it and goes on.
#[test]
fn a_run_waiting_on_time_without_its_slot_is_not_paused_for_it_until_it_acts() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.do_not_disrupt_timeout = Duration::from_secs(48 * 3600);
    // Its lock held as long as it waits for the node: allowed that long.
    if let Ok(s) = sim.settings.as_mut() {
        s.pause_timeout = Duration::from_secs(48 * 3600);
    }
    let first = sim.instances[0].id.clone();
    let node = Sim::node_name(&first);
    sim.protected
        .insert(node.clone(), "the Node is annotated".into());
    for _ in 0..200 {
        let gives = sim.slot_gives;
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if sim.slot_gives > gives {
            break;
        }
    }
    assert_eq!(sim.slot, SlotState::Free, "{:?}", sim.status.message);
    assert_eq!(sim.status.replaced, 2);
    sim.slot = SlotState::Full("Refresh ns/other".into());
    // A day: past the pause clock's default (1 h) many times over.
    for _ in 0..24 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
        assert!(
            plan.message.contains("waiting for protected node(s)"),
            "{}",
            plan.message
        );
        assert_eq!(plan.status.paused_since, None);
        sim.advance(3600);
    }
    assert!(sim.status.run_start.is_some(), "set aside");
    sim.protected.clear();
    let plan = sim.step(false);
    assert!(
        plan.message
            .contains("waiting for a disruption slot: Refresh ns/other"),
        "{}",
        plan.message
    );
    assert!(plan.status.paused_since.is_some());
    assert!(plan.status.current_target.is_none(), "chose nothing yet");
    sim.slot = SlotState::Free;
    sim.steps_until_a_drain();
    assert_eq!(sim.slot, SlotState::Ours, "taken by the executor to drain");
    sim.run_to_end(300);
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Succeeded));
    assert_eq!(sim.status.last_run.map(|r| r.replaced), Some(3));
}
