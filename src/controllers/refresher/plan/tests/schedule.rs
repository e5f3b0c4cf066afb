//! The schedule in a time zone, across daylight-saving changes and edits.

use super::*;

#[test]
fn schedule_in_a_zone_across_spring_forward_runs_at_the_end_of_the_gap() {
    // 02:30 does not exist in New York on 2026-03-08: the run is at 03:00 EDT (07:00 UTC).
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.settings = Ok(settings("30 2 * * *", "America/New_York", 1));
    sim.key = "ny".into();
    sim.now = utc(2026, 3, 8, 5, 0);
    for i in &mut sim.instances {
        i.launched = utc(2026, 3, 1, 0, 0);
    }
    sim.status = RefresherStatus::default();
    let plan = sim.step(false);
    assert_eq!(plan.status.next_run, Some(utc(2026, 3, 8, 7, 0)));
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(plan.status.phase, RefreshPhase::Idle);
    sim.now = utc(2026, 3, 8, 6, 59);
    assert_eq!(sim.step(false).command, Command::Nothing);
    sim.now = utc(2026, 3, 8, 7, 0);
    sim.takes_the_lock();
    let plan = sim.step(false);
    assert_eq!(plan.status.run_start, Some(utc(2026, 3, 8, 7, 0)));
    assert!(matches!(plan.command, Command::SetDesired(_)));
    sim.run_to_end(200);
    // Next: 02:30 EDT on the 9th = 06:30 UTC.
    assert_eq!(sim.status.next_run, Some(utc(2026, 3, 9, 6, 30)));
}

#[test]
fn schedule_in_a_zone_across_fall_back_runs_once() {
    // 01:30 happens twice in New York on 2026-11-01: one run, at the first.
    let mut sim = Sim::new(Role::Worker, 1, 1, 1);
    sim.settings = Ok(settings("30 1 * * *", "America/New_York", 1));
    sim.key = "ny".into();
    sim.now = utc(2026, 11, 1, 4, 0);
    sim.status = RefresherStatus::default();
    sim.step(false);
    assert_eq!(sim.status.next_run, Some(utc(2026, 11, 1, 5, 30)));
    sim.now = utc(2026, 11, 1, 5, 30);
    sim.run_to_end(100);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.next_run, Some(utc(2026, 11, 2, 6, 30)));
}

#[test]
fn an_edited_schedule_is_re_evaluated() {
    let mut sim = Sim::new(Role::Worker, 1, 1, 1);
    sim.status.next_run = Some(utc(2026, 6, 2, 12, 0));
    sim.key = "hourly".into();
    sim.settings = Ok(settings("0 * * * *", "UTC", 1));
    sim.now = utc(2026, 6, 1, 12, 10);
    let plan = sim.step(false);
    assert_eq!(plan.status.next_run, Some(utc(2026, 6, 1, 13, 0)));
    assert_eq!(plan.status.next_run_from.as_deref(), Some("hourly"));
}
