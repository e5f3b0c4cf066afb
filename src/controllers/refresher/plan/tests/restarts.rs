//! Restarts, vanished targets, group deletion, and the property test driving the executor through crashes.

use super::*;

#[test]
fn a_restart_after_recording_a_termination_terminates_that_same_node() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    loop {
        let plan = sim.plan();
        if matches!(plan.command, Command::Drain(_)) {
            sim.status = plan.status;
            break;
        }
        sim.step(false);
        sim.all_join_and_ready();
    }
    // Drain completes, the termination is recorded, the manager dies.
    let target = sim.status.current_target.clone().expect("target");
    let recorded = after_drain(&mut sim.status, &target.instance_id, sim.now).expect("recorded");
    assert_eq!(recorded.instance_id, target.instance_id);
    // Restarted: the same instance, once.
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Terminate(recorded.clone()));
    assert_eq!(sim.terminated, vec![target.instance_id.clone()]);
    let next = sim.step(false);
    assert!(!matches!(next.command, Command::Terminate(_)));
}

#[test]
fn a_run_recorded_before_targets_carried_reasons_goes_on_with_its_reason_given() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.steps_until_a_drain();
    // As an earlier version recorded it: the node in hand carries no reason.
    let target = sim.status.current_target.as_mut().expect("target");
    assert_eq!(target.reason.as_deref(), Some("refresh"), "chosen with one");
    target.reason = None;
    let plan = sim.plan();
    let carried = plan
        .status
        .current_target
        .as_ref()
        .and_then(|t| t.reason.as_deref());
    assert_eq!(carried, Some("refresh"), "given at the plan's entry");
    // The executor's guard refuses a step of a target without one (the
    // run would never end); with it given, the run goes on to its end.
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.terminated.len(), 4, "3 old nodes and the surplus");
}

#[test]
fn a_target_that_vanishes_is_skipped_not_counted() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.stuck = sim
        .instances
        .iter()
        .map(|i| Sim::node_name(&i.id))
        .collect();
    loop {
        let plan = sim.step(false);
        sim.all_join_and_ready();
        if matches!(plan.command, Command::Drain(_)) {
            break;
        }
    }
    let target = sim.status.current_target.clone().expect("target");
    // The drain is in progress when a spot interruption takes the node.
    sim.instances.retain(|i| i.id != target.instance_id);
    sim.launch(sim.now);
    sim.stuck.clear();
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert!(!sim.terminated.contains(&target.instance_id));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(2));
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => Just(Event::Reconcile(None)),
        1 => Just(Event::Reconcile(Some(Crash::BeforeAction))),
        1 => Just(Event::Reconcile(Some(Crash::BeforeTermination))),
        1 => (0..8usize).prop_map(Event::NotReady),
        2 => (0..8usize).prop_map(Event::Join),
        2 => (0..8usize).prop_map(Event::Ready),
        1 => (1..40i64).prop_map(Event::Tick),
    ]
}

#[test]
fn a_group_being_deleted_starts_no_run() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.deleting = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
    assert!(sim.status.run_start.is_none());
    assert_eq!(
        sim.result(),
        Some((
            RunResult::Skipped,
            Some("the NodeGroup is being deleted".into())
        ))
    );
    assert_eq!(sim.lock, LockState::Free);
    assert!(sim.layouts.is_empty(), "no run recorded");
}

#[test]
fn deleting_the_group_mid_drain_uncordons_the_node_and_unwinds_the_run() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let start = sim.layout();
    // Run up to the first drain step of an old node.
    for _ in 0..20 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if sim.original_cordoned() == 1 {
            break;
        }
    }
    assert_eq!(
        sim.original_cordoned(),
        1,
        "a drain under way: {:?}",
        sim.status
    );
    sim.deleting = true;
    let plan = sim.step(false);
    assert!(
        matches!(plan.command, Command::GiveBack { .. }),
        "the drain is given up first: {:?}",
        plan.command
    );
    assert_eq!(sim.original_cordoned(), 0);
    assert_eq!(sim.status.phase, RefreshPhase::ScalingDown);
    sim.run_to_end(100);
    let (result, reason) = sim.result().expect("run ended");
    assert_eq!(result, RunResult::Failed);
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("the NodeGroup is being deleted")),
        "{reason:?}"
    );
    assert_eq!(sim.layout(), start, "every ASG back at its recorded count");
    assert!(sim.instances.iter().all(|i| !i.cordoned));
    assert_eq!(sim.lock, LockState::Free);
    assert_eq!(sim.layouts.len(), 1, "no new run after the deletion");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// No duration, however long, and no clock, however far off, makes a
    /// refresher plan panic, at any point of a run; no requeue is longer
    /// than the runtime can take.
    #[test]
    fn extreme_durations_and_clocks_never_panic(
        before in proptest::collection::vec(event(), 0..60),
        drain in any::<u64>(),
        ready in any::<u64>(),
        settle in any::<u64>(),
        age in proptest::option::of(any::<u64>()),
        now in prop_oneof![
            Just(DateTime::<Utc>::MIN_UTC),
            Just(DateTime::<Utc>::MAX_UTC),
            (DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp())
                .prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)),
        ],
        master in any::<bool>(),
    ) {
        let role = if master { Role::Master } else { Role::Worker };
        let mut sim = Sim::new(role, 3, 1, if master { 0 } else { 1 });
        for e in before {
            sim.apply(e);
        }
        if let Ok(s) = sim.settings.as_mut() {
            s.drain_timeout = Duration::from_secs(drain);
            s.ready_timeout = Duration::from_secs(ready);
            s.master_settle_time = Duration::from_secs(settle);
            s.max_node_age = age.map(Duration::from_secs);
        }
        sim.now = now;
        let plan = sim.plan();
        prop_assert!(
            plan.requeue <= crate::controllers::group_view::LONGEST_WAIT,
            "a requeue of {:?}", plan.requeue
        );
    }

}

/// A property run of 300 cases, its failures kept beside this file as the
/// `proptest!` macro keeps them.
fn runner() -> proptest::test_runner::TestRunner {
    proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 300,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    })
}

/// How many cases reached each guarded check: a property behind an `if`
/// that no case enters checked nothing.
#[derive(Default)]
struct Reached(std::collections::BTreeMap<&'static str, std::sync::atomic::AtomicUsize>);

impl Reached {
    fn of(checks: &[&'static str]) -> Reached {
        Reached(checks.iter().map(|c| (*c, Default::default())).collect())
    }

    fn hit(&self, check: &'static str) {
        if let Some(n) = self.0.get(check) {
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Panics unless every check was reached by some case.
    fn assert_all(&self) {
        for (check, n) in &self.0 {
            let n = n.load(std::sync::atomic::Ordering::Relaxed);
            assert!(n > 0, "no case reached the check that {check}");
        }
    }
}

/// Runs `property` on 300 cases of `strategy`; fails on a failing case,
/// or on a guarded check (one of `checks`) that no case reached.
fn check_cases<S: Strategy>(
    checks: &[&'static str],
    strategy: S,
    property: impl Fn(S::Value, &Reached) -> Result<(), TestCaseError>,
) {
    let reached = Reached::of(checks);
    let run = runner().run(&strategy, |case| property(case, &reached));
    run.unwrap_or_else(|e| panic!("{e}"));
    reached.assert_all();
}

/// A worker group of `asgs` ASGs of `per_asg` nodes, run with `surplus`
/// and `maxSurge: max_surge`.
fn worker_sim(asgs: usize, per_asg: i32, surplus: i32, max_surge: i32) -> Sim {
    let mut sim = Sim::new(Role::Worker, asgs, per_asg, surplus);
    if let Ok(s) = sim.settings.as_mut() {
        s.max_surge = crate::crd::nodegroup::MaxSurge::Count(max_surge);
    }
    sim
}

/// After each event of a worker run: at most `maxSurge` old nodes worked
/// on at once (one without it), and Ready never below `desired`.
fn safe_so_far(sim: &Sim, desired: i32, max_surge: i32) -> Result<(), TestCaseError> {
    prop_assert!(
        sim.original_cordoned() <= (max_surge as usize).max(1),
        "more old nodes worked on at once than maxSurge"
    );
    prop_assert!(
        sim.ready_after_terminations.iter().all(|r| *r >= desired),
        "Ready fell below {desired}: {:?}",
        sim.ready_after_terminations
    );
    Ok(())
}

/// At a run's end: Ready never fell below `desired`, the layout the run
/// started with is back (unless it says it kept nodes), the lock is free.
fn ended_clean(sim: &Sim, desired: i32, reached: &Reached) -> Result<(), TestCaseError> {
    prop_assert!(sim.ready_after_terminations.iter().all(|r| *r >= desired));
    let kept = sim
        .result()
        .and_then(|r| r.1)
        .is_some_and(|r| r.contains("kept"));
    if let (Some(start), false) = (sim.layouts.last(), kept) {
        reached.hit("the layout is restored");
        prop_assert_eq!(
            &sim.layout(),
            start,
            "layout not restored: {:?}",
            sim.result()
        );
    }
    prop_assert_eq!(sim.lock.clone(), LockState::Free);
    Ok(())
}

/// Deleting the NodeGroup at any point of a run (nodes drained at once
/// or not): the run ends, no node is left cordoned, no new run starts, Ready never drops below
/// desired, every ASG gets its recorded count back, the lock is free.
#[test]
fn deleting_the_group_at_any_point_unwinds_the_run() {
    let checks = &["the layout is restored"];
    let strategy = (
        1..4usize,
        1..3i32,
        1..3i32,
        0..4i32,
        1..4usize,
        proptest::collection::vec(event(), 0..120),
        proptest::collection::vec(event(), 0..60),
    );
    check_cases(
        checks,
        strategy,
        |(asgs, per_asg, surplus, max_surge, drain_length, before, after), reached| {
            let mut sim = worker_sim(asgs, per_asg, surplus, max_surge);
            sim.drain_length = drain_length;
            let desired = sim.desired;
            for e in before {
                sim.apply(e);
            }
            sim.deleting = true;
            let runs = sim.layouts.len();
            for e in after {
                sim.apply(e);
            }
            sim.run_to_end(500);
            prop_assert!(
                sim.status.run_start.is_none(),
                "run did not end: {:?}",
                sim.status
            );
            prop_assert_eq!(sim.layouts.len(), runs, "a run started after the deletion");
            prop_assert!(
                sim.instances.iter().all(|i| !i.cordoned),
                "a node left cordoned"
            );
            ended_clean(&sim, desired, reached)?;
            Ok(())
        },
    );
}

/// Whatever the order of nodes joining, becoming Ready, time passing
/// and the manager dying: our terminations never leave fewer Ready
/// than desired, at most `maxSurge` old nodes are worked on at a time
/// (one without it), at most `maxSurge` replacements are launched ahead (no ASG raised beyond
/// its surplus and those), no instance is terminated twice (asserted
/// in the sim), and the run ends with every ASG at its recorded count.
#[test]
fn a_worker_refresh_is_safe_under_any_event_order() {
    let checks = &[
        "a successful run left no old node",
        "the layout is restored",
    ];
    let strategy = (
        1..4usize,
        1..3i32,
        1..3i32,
        0..4i32,
        1..4usize,
        proptest::collection::vec(event(), 0..300),
    );
    check_cases(
        checks,
        strategy,
        |(asgs, per_asg, surplus, max_surge, drain_length, events), reached| {
            let mut sim = worker_sim(asgs, per_asg, surplus, max_surge);
            let desired = sim.desired;
            let start_total: i32 = sim.asgs.iter().map(|a| a.desired).sum();
            sim.drain_length = drain_length;
            for e in events {
                sim.apply(e);
                safe_so_far(&sim, desired, max_surge)?;
                prop_assert!(sim.status.launched_ahead.len() <= max_surge as usize);
                prop_assert!(sim.status.batch().count() <= (max_surge as usize).max(1));
                let total: i32 = sim.asgs.iter().map(|a| a.desired).sum();
                prop_assert!(
                    total <= start_total + surplus + max_surge,
                    "raised beyond surplus and maxSurge: {:?}",
                    sim.layout()
                );
            }
            let started = sim.layouts.len();
            let before_end = sim.ids();
            sim.run_to_end(500);
            prop_assert!(
                sim.status.run_start.is_none(),
                "run did not end: {:?}",
                sim.status
            );
            // A run that succeeded (and was under way) left none of the nodes it started with.
            if started > 0
                && sim.result().map(|r| r.0) == Some(RunResult::Succeeded)
                && sim.layouts.len() == started
            {
                reached.hit("a successful run left no old node");
                let original_left = sim
                    .instances
                    .iter()
                    .filter(|i| {
                        i.launched < Sim::new(Role::Worker, 1, 1, 1).now
                            && before_end.contains(&i.id)
                    })
                    .count();
                prop_assert_eq!(
                    original_left,
                    0,
                    "old nodes left after success: {:?}",
                    sim.status.last_run
                );
            }
            ended_clean(&sim, desired, reached)?;
            Ok(())
        },
    );
}

/// The same with maintenance windows opening and closing, whichever
/// `onWindowClose`: Ready never below desired, at most `maxSurge` old
/// nodes at a time,
/// and once a window stays open the run (set aside or not) ends, with
/// the layout it started with (and every old node replaced if it
/// succeeded), its lock and slot given back.
#[test]
fn a_worker_refresh_across_windows_is_safe_under_any_event_order() {
    let checks = &[
        "a successful run replaced every old node",
        "the layout is restored",
    ];
    let strategy = (
        1..4usize,
        1..3i32,
        any::<bool>(),
        0..4i32,
        1..4usize,
        proptest::collection::vec(
            prop_oneof![8 => event(), 1 => any::<bool>().prop_map(Event::Window)],
            0..300,
        ),
    );
    check_cases(
        checks,
        strategy,
        |(asgs, surplus, scale_down, max_surge, drain_length, events), reached| {
            let mut sim = worker_sim(asgs, 1, surplus, max_surge);
            sim.drain_length = drain_length;
            sim.on_window_close = match scale_down {
                true => OnWindowClose::ScaleDown,
                false => OnWindowClose::Wait,
            };
            let desired = sim.desired;
            let old = sim.ids();
            for e in events {
                sim.apply(e);
                safe_so_far(&sim, desired, max_surge)?;
            }
            sim.window = WindowState::Always;
            for _ in 0..500 {
                sim.step(false);
                sim.all_join_and_ready();
                sim.advance(1);
                if sim.status.run_start.is_none()
                    && sim.status.pending_run.is_none()
                    && sim.status.last_run.is_some()
                {
                    break;
                }
            }
            prop_assert!(
                sim.status.run_start.is_none(),
                "run did not end: {:?}",
                sim.status
            );
            prop_assert_eq!(sim.status.pending_run.clone(), None);
            if sim.result().map(|r| r.0) == Some(RunResult::Succeeded) {
                reached.hit("a successful run replaced every old node");
                prop_assert!(
                    old.iter().all(|id| sim.terminated.contains(id)),
                    "an old node left"
                );
            }
            ended_clean(&sim, desired, reached)?;
            prop_assert_eq!(sim.slot.clone(), SlotState::Free);
            Ok(())
        },
    );
}

#[test]
fn a_recorded_termination_not_yet_made_is_taken_back_when_the_group_is_deleted() {
    let mut sim = Sim::new(Role::Worker, 3, 2, 1);
    // Run until an old node is drained and its termination recorded, and
    // the manager dies before making it.
    for _ in 0..30 {
        let drained = sim.status.current_target.as_ref().is_some_and(|t| {
            t.purpose == TargetPurpose::Replace
                && t.terminated.is_none()
                && sim.original_cordoned() == 1
        });
        sim.step_with(drained.then_some(Crash::BeforeTermination));
        sim.all_join_and_ready();
        if sim.status.current_target.as_ref().is_some_and(|t| {
            t.terminated.is_some() && sim.instances.iter().any(|i| i.id == t.instance_id)
        }) {
            break;
        }
    }
    let target = sim
        .status
        .current_target
        .clone()
        .expect("a recorded termination");
    assert!(target.terminated.is_some());
    sim.deleting = true;
    let plan = sim.step(false);
    assert!(
        matches!(&plan.command, Command::GiveBack { target: t, .. } if t.node == target.node),
        "{:?}",
        plan.command
    );
    sim.run_to_end(100);
    assert!(
        !sim.terminated.contains(&target.instance_id),
        "the drained node is kept, not terminated after the deletion"
    );
    assert!(sim.instances.iter().all(|i| !i.cordoned));
    assert_eq!(sim.lock, LockState::Free);
}

/// The coverage count's own check: a guarded check no case reached fails.
#[test]
#[should_panic(expected = "no case reached the check that never holds")]
fn a_guarded_check_no_case_reached_fails() {
    let reached = Reached::of(&["never holds", "holds"]);
    reached.hit("holds");
    reached.assert_all();
}
