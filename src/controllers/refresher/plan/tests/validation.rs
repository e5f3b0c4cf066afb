//! Validation between nodes, scoped to the group: the replacement itself
//! Ready and schedulable, the pods its drain moved back, both settled.

use super::*;

const WEB: &str = "team/ReplicaSet/web";

/// Steps (new nodes Ready at once) until the first replacement is Ready
/// and the next one launched ahead (not Ready yet): the run then
/// validates the first.
fn up_to_the_first_replacement(sim: &mut Sim) {
    for _ in 0..40 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if sim.terminated.len() == 1 && sim.ready_count() == 4 {
            let plan = sim.step(false);
            assert!(
                plan.message.starts_with("launching the replacement"),
                "{}",
                plan.message
            );
            return;
        }
    }
    panic!("no replacement: {:?}", sim.status.message);
}

#[test]
fn a_step_waits_while_pods_its_drain_moved_are_pending_then_goes_on() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.workloads = vec![WEB.into()];
    up_to_the_first_replacement(&mut sim);
    assert_eq!(
        sim.status
            .current_target
            .as_ref()
            .map(|t| t.workloads.clone()),
        Some(vec![WEB.to_string()]),
        "recorded before the eviction"
    );
    sim.unsettled = [(WEB.to_string(), "1 pod(s) Pending, 0 not Ready".to_string())].into();
    for round in 0..10 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
        // Looked at again soon while pods usually come back (the first
        // 10 s), then every 2 s.
        let again = match round {
            0 | 1 => Duration::from_millis(500),
            _ => Duration::from_secs(2),
        };
        assert_eq!(plan.requeue, again, "round {round}");
        assert!(
            plan.message.contains("validating the replacement"),
            "{}",
            plan.message
        );
        assert!(
            plan.message.contains("1 pod(s) Pending"),
            "{}",
            plan.message
        );
        sim.advance(5);
    }
    assert_eq!(sim.terminated.len(), 1, "no second node taken");
    assert_eq!(sim.status.replaced, 0, "not counted before it is validated");
    // The pods are back: the run goes on and ends as usual.
    sim.unsettled.clear();
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(3));
}

#[test]
fn a_validation_that_times_out_fails_the_run_or_goes_on_as_configured() {
    for action in [DrainTimeoutAction::Abort, DrainTimeoutAction::Proceed] {
        let mut sim = Sim::new(Role::Worker, 3, 1, 1);
        let layout = sim.layout();
        let old = sim.ids();
        if let Ok(s) = sim.settings.as_mut() {
            s.validation_timeout = Duration::from_secs(60);
            s.validation_timeout_action = action;
        }
        sim.workloads = vec![WEB.into()];
        sim.unsettled = [(WEB.to_string(), "1 pod(s) Pending, 0 not Ready".to_string())].into();
        up_to_the_first_replacement(&mut sim);
        for _ in 0..20 {
            sim.step(false);
            sim.all_join_and_ready();
            sim.advance(5);
        }
        match action {
            DrainTimeoutAction::Abort => {
                sim.run_to_end(300);
                let (result, reason) = sim.result().expect("ended");
                assert_eq!(result, RunResult::Failed);
                let reason = reason.unwrap_or_default();
                assert!(reason.contains("not whole within 1m"), "{reason}");
                assert!(reason.contains(WEB), "{reason}");
                // One old node, the surplus, and the replacement launched
                // ahead for the next node (surplus once the run failed).
                assert_eq!(sim.terminated.len(), 3, "{:?}", sim.terminated);
                assert!(sim.terminated.iter().filter(|id| old.contains(id)).count() == 1);
                assert_eq!(sim.layout(), layout);
            }
            DrainTimeoutAction::Proceed => {
                assert!(
                    sim.happenings
                        .iter()
                        .any(|h| matches!(h, Happening::ValidationTimedOut(_)))
                );
                assert!(sim.terminated.len() >= 2, "went on: {:?}", sim.terminated);
            }
        }
    }
}

#[test]
fn a_replacement_cordoned_by_someone_else_does_not_count() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    up_to_the_first_replacement(&mut sim);
    // Every node launched since the target was taken is cordoned.
    let since = sim.status.current_target.as_ref().expect("target").since;
    sim.unschedulable = sim
        .instances
        .iter()
        .filter(|i| i.launched >= since)
        .map(|i| Sim::node_name(&i.id))
        .collect();
    assert!(!sim.unschedulable.is_empty());
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
    assert!(
        plan.message.contains("Ready and schedulable"),
        "{}",
        plan.message
    );
    sim.unschedulable.clear();
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_validated_replacement_holds_for_the_settle_time_before_the_next_node() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    if let Ok(s) = sim.settings.as_mut() {
        s.settle_time = Duration::from_secs(30);
    }
    sim.workloads = vec![WEB.into()];
    up_to_the_first_replacement(&mut sim);
    let plan = sim.step(false);
    assert!(plan.message.contains("settling until"), "{}", plan.message);
    assert!(plan.requeue <= Duration::from_secs(30));
    sim.advance(20);
    assert!(sim.step(false).message.contains("settling until"));
    // A pod going Pending meanwhile starts the settle over.
    sim.unsettled = [(WEB.to_string(), "1 pod(s) Pending, 0 not Ready".to_string())].into();
    assert!(sim.step(false).message.contains("validating"));
    sim.unsettled.clear();
    assert!(sim.step(false).message.contains("settling until"));
    sim.advance(20);
    let plan = sim.step(false);
    assert!(plan.message.contains("settling until"), "{}", plan.message);
    sim.advance(11);
    let plan = sim.step(false);
    assert!(
        matches!(plan.command, Command::Drain(_)),
        "{}",
        plan.message
    );
    assert_eq!(sim.status.replaced, 1);
}
