//! A due run that waits or is skipped: the lock, suspension, suspended processes, too few Ready nodes.

use super::*;

#[test]
fn a_lock_held_by_the_replenisher_is_waited_for() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.lock = LockState::Other("Replenish workers".into());
    for _ in 0..3 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing);
        assert_eq!(plan.status.phase, RefreshPhase::WaitingForLock);
        assert!(
            plan.message.contains("Replenish workers"),
            "{}",
            plan.message
        );
        assert_eq!(plan.status.run_start, None);
        sim.advance(60);
    }
    sim.lock = LockState::Free;
    sim.takes_the_lock();
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_slot_taken_before_the_lock_was_refused_is_given_back_while_waiting() {
    // The slot was taken; the replenisher took the group's lock meanwhile.
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.slot = SlotState::Ours;
    sim.lock = LockState::Other("Replenish workers".into());
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
    assert!(
        plan.message.contains("waiting for the group's lock"),
        "{}",
        plan.message
    );
    assert_eq!(sim.slot, SlotState::Free, "the slot given back");
    assert_eq!(
        sim.lock,
        LockState::Other("Replenish workers".into()),
        "the other holder's lock stays theirs"
    );
    // Then it waits, holding nothing.
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
    assert_eq!(plan.status.phase, RefreshPhase::WaitingForLock);
    assert_eq!(sim.slot, SlotState::Free);
}

#[test]
fn a_suspended_group_skips_the_run_and_says_why() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.suspended = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(
        sim.result(),
        Some((RunResult::Skipped, Some("the group is suspended".into())))
    );
    assert_eq!(sim.status.next_run, Some(utc(2026, 6, 2, 12, 0)));
    assert!(sim.terminated.is_empty());
    assert!(matches!(sim.happenings[0], Happening::Skipped(_)));
}

#[test]
fn an_asg_with_launch_or_terminate_suspended_skips_the_run_naming_both() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.asgs[1].suspended = vec!["AZRebalance".into(), "Launch".into()];
    sim.asgs[2].suspended = vec!["Terminate".into()];
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(
        sim.result(),
        Some((
            RunResult::Skipped,
            Some(
                "asg-1 has its Launch process suspended; asg-2 has its Terminate process suspended"
                    .into()
            )
        ))
    );
    assert!(sim.terminated.is_empty());
    // AZRebalance alone does not stop a run.
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.asgs[1].suspended = vec!["AZRebalance".into()];
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn too_few_ready_nodes_skip_the_run() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.instances[0].ready = false;
    sim.step(false);
    assert_eq!(
        sim.result(),
        Some((
            RunResult::Skipped,
            Some("only 2 of 3 nodes are Ready".into())
        ))
    );
    assert_eq!(sim.lock, LockState::Free);
    assert!(sim.actions.iter().all(|a| !a.mutates()));
}

#[test]
fn a_run_due_during_a_kops_rolling_update_is_skipped_and_says_why() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let why = "a kops rolling update is in progress (3 node(s) tainted kops.k8s.io/scheduled-for-update): no AWS mutation of our own until it ends";
    sim.external_update = Some(why.into());
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(sim.result(), Some((RunResult::Skipped, Some(why.into()))));
    assert!(sim.terminated.is_empty());
    assert_eq!(sim.lock, LockState::Free);
}
