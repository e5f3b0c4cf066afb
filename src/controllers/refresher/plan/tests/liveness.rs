//! No operation holds a group for ever: whatever pauses, deaths,
//! recoveries, refusals of the disruption authority and restarts come, a
//! run that stays paused gives its lock and slot back within its pause
//! timeout, and once nothing stands in its way it ends.

use super::*;

fn disturbance() -> impl Strategy<Value = Event> {
    prop_oneof![
        8 => Just(Event::Reconcile(None)),
        1 => Just(Event::Reconcile(Some(Crash::BeforeAction))),
        1 => Just(Event::Reconcile(Some(Crash::BeforeTermination))),
        2 => (0..8usize).prop_map(Event::Join),
        2 => (0..8usize).prop_map(Event::Ready),
        1 => (0..8usize).prop_map(Event::NotReady),
        1 => (0..8usize).prop_map(Event::Dies),
        1 => Just(Event::Recover),
        1 => any::<bool>().prop_map(Event::Breaker),
        1 => any::<bool>().prop_map(Event::MasterElsewhere),
        1 => any::<bool>().prop_map(Event::Window),
        2 => (1..600i64).prop_map(Event::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_run_gives_the_group_back_within_its_pause_timeout_and_ends_once_it_may(
        master in any::<bool>(),
        events in proptest::collection::vec(disturbance(), 0..200),
        paused_for_good in any::<bool>(),
    ) {
        let mut sim = match master {
            true => Sim::new(Role::Master, 3, 1, 0),
            false => Sim::new(Role::Worker, 3, 1, 1),
        };
        sim.master_elsewhere(false);
        for e in events {
            sim.apply(e);
        }
        if paused_for_good {
            // The breaker stays open: within its pause timeout (1h) and a
            // few steps, the run holds neither the lock nor the slot.
            sim.breaker = Some("2 of 3 node(s) NotReady".into());
            sim.steps(70, 60);
            prop_assert!(sim.status.run_start.is_none(), "still holding: {:?}", sim.status.message);
            prop_assert_eq!(sim.lock.clone(), LockState::Free, "{:?}", sim.status.message);
            prop_assert!(sim.slot != SlotState::Ours, "{:?}", sim.status.message);
        }
        // Nothing stands in its way any more: it ends, the group free.
        sim.breaker = None;
        sim.dead.clear();
        sim.master_elsewhere(false);
        sim.window = WindowState::Always;
        sim.run_to_end(600);
        prop_assert!(sim.status.run_start.is_none(), "run did not end: {:?}", sim.status.message);
        prop_assert!(sim.status.pending_run.is_none(), "a run left set aside: {:?}", sim.status.message);
        prop_assert_eq!(sim.lock.clone(), LockState::Free);
    }
}
