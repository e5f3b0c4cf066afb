//! The preview says what the run then does: the same order, the same
//! start, the same nodes skipped, the same blockers. Each test runs the
//! plan after the preview and compares.

use super::*;
use crate::controllers::refresher::plan::preview::SKIPPED;

/// Windows that open at `opens` and stay open four hours.
fn opening_at(opens: DateTime<Utc>) -> impl Fn(DateTime<Utc>) -> WindowState {
    move |t| match t < opens {
        true => WindowState::Closed { opens: Some(opens) },
        false => WindowState::Open {
            closes: opens + chrono::Duration::hours(4),
        },
    }
}

/// The nodes the run replaced, in order (the surplus and replacements
/// launched during the run left out).
fn replaced_in_order(sim: &Sim, original: &[String]) -> Vec<String> {
    sim.terminated
        .iter()
        .filter(|id| original.contains(id))
        .cloned()
        .collect()
}

#[test]
fn the_preview_of_a_due_run_says_its_start_order_and_skipped_node_and_the_run_does_that() {
    // Six workers, a day old; the daily run is due now; one node runs a
    // do-not-disrupt pod; the window opens in a minute.
    let mut sim = Sim::new(Role::Worker, 3, 2, 1);
    let original = sim.ids();
    let protected_id = original[2].clone();
    let protected = Sim::node_name(&protected_id);
    sim.protected.insert(
        protected.clone(),
        "pod default/db-0 has nodemanager.dev/do-not-disrupt".into(),
    );
    let opens = sim.now + chrono::Duration::seconds(60);
    let windows = opening_at(opens);

    let next = sim.preview(&windows).expect("a run is coming");
    assert_eq!(next.what, "refresh");
    assert_eq!(next.at, Some(opens), "starts when the window opens");
    assert!(!next.under_way);
    assert_eq!(next.total, 6);
    assert_eq!(next.blocked_by, None);
    let order: Vec<String> = next.nodes.iter().map(|n| n.instance_id.clone()).collect();
    let last = next.nodes.last().expect("nodes");
    assert_eq!(last.node, protected, "a protected node is taken last");
    let held = last.blocked_by.as_deref().unwrap_or_default();
    assert!(held.contains("db-0") && held.contains("skipped"), "{held}");
    assert!(
        next.summary.contains("refresh 6 node(s) at"),
        "{}",
        next.summary
    );

    // The run: it waits for the window, then does what the preview said.
    sim.window = windows(sim.now);
    sim.steps(3, 20);
    assert_eq!(sim.status.run_start, None, "not before the window opens");
    sim.now = opens;
    sim.window = windows(sim.now);
    sim.run_to_end(400);
    let (result, _) = sim.result().expect("the run ended");
    assert_eq!(result, RunResult::Succeeded);
    let last_run = sim.status.last_run.clone().expect("last run");
    // Each simulated reconcile takes a second; taking the lock is one,
    // taking the slot another.
    let late = last_run.started - opens;
    assert!(
        late >= chrono::Duration::zero() && late <= chrono::Duration::seconds(2),
        "started at the window's opening, to the second: {}",
        last_run.started
    );
    let expected: Vec<String> = order
        .iter()
        .filter(|id| **id != protected_id)
        .cloned()
        .collect();
    assert_eq!(replaced_in_order(&sim, &original), expected);
    let skipped: Vec<String> = sim.status.skipped.iter().map(|s| s.node.clone()).collect();
    assert_eq!(skipped, vec![protected]);
}

#[test]
fn a_run_under_way_is_previewed_by_the_nodes_it_has_left_in_the_order_it_takes_them() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let original = sim.ids();
    // A node of the run dies: the run takes it first.
    sim.run_until(|s| s.status.phase == RefreshPhase::Draining);
    let first = sim
        .status
        .current_target
        .clone()
        .expect("target")
        .instance_id;
    let next = sim.preview(&|_| WindowState::Always).expect("under way");
    assert!(next.under_way);
    assert_eq!(next.nodes[0].instance_id, first, "the node in hand first");
    let previewed: Vec<String> = next.nodes.iter().map(|n| n.instance_id.clone()).collect();
    sim.run_to_end(400);
    assert_eq!(replaced_in_order(&sim, &original), previewed);
}

#[test]
fn what_would_hold_a_run_is_what_holds_it() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.breaker = Some("2 of 3 node(s) NotReady".into());
    let next = sim.preview(&|_| WindowState::Always).expect("coming");
    let held = next.blocked_by.expect("held");
    assert!(held.contains("circuit breaker open"), "{held}");
    // A due scheduled run that may not start is skipped, not waited for.
    assert!(
        next.summary.contains("skipped when due: circuit breaker"),
        "{}",
        next.summary
    );
    let plan = sim.step(false);
    assert!(
        plan.message.contains("circuit breaker open"),
        "{}",
        plan.message
    );

    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.slot = SlotState::Full("1 of 1 disruption slot(s) held, by ns/other".into());
    let next = sim.preview(&|_| WindowState::Always).expect("coming");
    assert!(next.blocked_by.expect("held").contains("ns/other"));
    let plan = sim.step(false);
    assert!(plan.message.contains("ns/other"), "{}", plan.message);
}

#[test]
fn a_drift_roll_is_previewed_by_exactly_the_drifted_nodes_and_rolls_them() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.status.next_run = Some(sim.now + chrono::Duration::days(1));
    // `kops update cluster`: every running node is on an old version.
    let drifted = sim.ids();
    sim.version += 1;
    sim.drift_replace = true;
    let next = sim.preview(&|_| WindowState::Always).expect("coming");
    assert_eq!(next.what, "drift roll");
    assert_eq!(next.at, None, "now");
    let previewed: Vec<String> = next.nodes.iter().map(|n| n.instance_id.clone()).collect();
    let mut sorted = previewed.clone();
    sorted.sort();
    let mut expected = drifted.clone();
    expected.sort();
    assert_eq!(sorted, expected);
    sim.run_to_end(400);
    assert_eq!(replaced_in_order(&sim, &drifted), previewed);
}

#[test]
fn nothing_to_come_is_no_preview_and_an_invalid_spec_says_so() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.status.next_run = None;
    sim.settings = Ok(ResolvedRefresh {
        schedule: None,
        ..settings("0 12 * * *", "UTC", 1)
    });
    sim.key = "none".into();
    sim.status.next_run_from = Some("none".into());
    assert_eq!(sim.preview(&|_| WindowState::Always), None);
    sim.settings = Err("refresh.schedule: not a cron expression".into());
    let next = sim.preview(&|_| WindowState::Always).expect("said");
    assert!(next.summary.starts_with("blocked:"), "{}", next.summary);
}

/// Issue 54, hole 9: `maxNodeAge` was counted at now, not at the run's
/// start: the preview of tomorrow's run said no node was old enough, and
/// the run then replaced the nodes that had aged past it overnight.
#[test]
fn max_node_age_is_counted_at_the_runs_start_as_the_run_counts_it() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let original = sim.ids();
    // Launched a day ago; replaced at 30 hours old; the run is in 12 hours.
    let start = sim.now + chrono::Duration::hours(12);
    sim.status.next_run = Some(start);
    if let Ok(s) = sim.settings.as_mut() {
        s.max_node_age = Some(Duration::from_secs(30 * 3600));
    }
    let next = sim.preview(&|_| WindowState::Always).expect("coming");
    assert_eq!(next.at, Some(start));
    assert_eq!(next.blocked_by, None, "{}", next.summary);
    assert_eq!(next.total, 3, "{}", next.summary);
    let previewed: Vec<String> = next.nodes.iter().map(|n| n.instance_id.clone()).collect();
    sim.now = start;
    sim.run_to_end(400);
    assert_eq!(replaced_in_order(&sim, &original), previewed);
}

/// Issue 54, hole 9: a due run with a start blocker is skipped, and the
/// preview said "blocked"; a surplus that cannot be added skips the run,
/// and the preview did not say it at all.
#[test]
fn a_run_that_would_be_skipped_is_previewed_as_skipped_and_is_skipped() {
    // Every ASG at its max: the surplus cannot be added.
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    for asg in sim.asgs.iter_mut() {
        asg.max = asg.desired;
    }
    let next = sim.preview(&|_| WindowState::Always).expect("coming");
    let held = next.blocked_by.clone().expect("said");
    assert!(held.starts_with(SKIPPED), "{held}");
    assert!(held.contains("cannot add 1 surplus node(s)"), "{held}");
    assert!(!next.summary.contains("blocked"), "{}", next.summary);
    sim.step(false);
    let (result, reason) = sim.result().expect("the run ended");
    assert_eq!(result, RunResult::Skipped);
    assert!(
        reason
            .as_deref()
            .unwrap_or_default()
            .contains("cannot add 1 surplus"),
        "{reason:?}"
    );
}

/// Issue 54, hole 9: after a failed drift roll, a scheduled run due before
/// its backoff ends starts first (the idle phase starts a due run before
/// it looks at drift); the preview said the drift roll came first.
#[test]
fn a_scheduled_run_due_within_a_drift_backoff_is_previewed_first_and_runs_first() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let original = sim.ids();
    sim.version += 1;
    sim.drift_replace = true;
    sim.status.last_run = Some(crate::crd::refresher::RunOutcome {
        started: sim.now - chrono::Duration::minutes(40),
        trigger: Some(RunTrigger::Drift),
        finished: Some(sim.now - chrono::Duration::minutes(10)),
        replaced: 0,
        result: RunResult::Failed,
        reason: Some("the new nodes never got Ready".into()),
    });
    let due = sim.now + chrono::Duration::minutes(5);
    sim.status.next_run = Some(due);
    let next = sim.preview(&|_| WindowState::Always).expect("coming");
    assert_eq!(next.what, "refresh", "{}", next.summary);
    assert_eq!(next.at, Some(due));
    sim.now = due;
    sim.run_until(|s| s.status.run_start.is_some());
    assert_eq!(sim.status.trigger, Some(RunTrigger::Schedule));
    sim.run_to_end(400);
    let last = sim.status.last_run.clone().expect("a run");
    assert_eq!(last.trigger, Some(RunTrigger::Schedule), "{last:?}");
    assert_eq!(last.result, RunResult::Succeeded, "{last:?}");
    assert!(original.iter().all(|id| sim.terminated.contains(id)));
}
