//! The Refresher's own conditions: its spec (schedule) valid, the ASGs'
//! scaling processes active, the last run's outcome, and whether the
//! schedule meets a maintenance window.

use crate::controllers::refresher::plan as refresh_plan;
use crate::controllers::window::schedule_meets_a_window;
use crate::crd::condition::{
    ConditionStatus, LAST_RUN_SUCCEEDED, SCALING_PROCESSES, SCHEDULE_IN_WINDOW, SCHEDULE_VALID,
    set_condition,
};
use crate::crd::refresher::RunResult;
use crate::crd::{NodeGroup, Refresher, RefresherStatus};
use chrono::{DateTime, Utc};

/// The Refresher's own conditions: the spec (schedule) valid, the ASGs'
/// scaling processes active, the last run's outcome.
pub(super) fn set_conditions(
    status: &mut RefresherStatus,
    rf: &Refresher,
    settings: &std::result::Result<crate::crd::nodegroup::ResolvedRefresh, String>,
    schedule_key: &str,
    asgs: &[crate::controllers::group_view::AsgView],
    now: DateTime<Utc>,
) {
    let generation = rf.metadata.generation;
    match &settings {
        Ok(_) => set_condition(
            &mut status.conditions,
            SCHEDULE_VALID,
            ConditionStatus::True,
            "Valid",
            format!("schedule {schedule_key}"),
            generation,
            now,
        ),
        Err(problem) => set_condition(
            &mut status.conditions,
            SCHEDULE_VALID,
            ConditionStatus::False,
            "InvalidSpec",
            problem.clone(),
            generation,
            now,
        ),
    }
    // Whether the ASGs let a run do its work (Launch, Terminate not suspended).
    match refresh_plan::blocking_processes(asgs) {
        Some(why) => set_condition(
            &mut status.conditions,
            SCALING_PROCESSES,
            ConditionStatus::False,
            "ProcessSuspended",
            why,
            generation,
            now,
        ),
        None if !asgs.is_empty() => set_condition(
            &mut status.conditions,
            SCALING_PROCESSES,
            ConditionStatus::True,
            "Active",
            "Launch and Terminate are active on every ASG",
            generation,
            now,
        ),
        // Not described this reconcile (idle, not due): keep what was known.
        None => {}
    }
    if let Some(last) = status
        .last_run
        .clone()
        .filter(|l| l.result != RunResult::Skipped)
    {
        set_condition(
            &mut status.conditions,
            LAST_RUN_SUCCEEDED,
            if last.result == RunResult::Succeeded {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            &format!("{:?}", last.result),
            last.reason
                .unwrap_or_else(|| format!("replaced {}", last.replaced)),
            generation,
            now,
        );
    }
}

/// Whether the refresh schedule's next runs fall inside a maintenance
/// window: a schedule that never does is reported, not silently waited on.
pub(super) fn set_window_condition(
    status: &mut RefresherStatus,
    rf: &Refresher,
    settings: &std::result::Result<crate::crd::nodegroup::ResolvedRefresh, String>,
    group: &NodeGroup,
    now: DateTime<Utc>,
) {
    const RUNS: usize = 20;
    let (Ok(settings), Some(disruption)) = (settings, group.spec.resolved_disruption()) else {
        return;
    };
    let (state, reason, message) = match &settings.schedule {
        _ if disruption.windows.is_empty() => (
            ConditionStatus::True,
            "NoWindows",
            "no maintenance windows: runs start when due".to_string(),
        ),
        None => (
            ConditionStatus::True,
            "NoSchedule",
            "no schedule: drift rolls wait for a window".to_string(),
        ),
        Some(schedule) => {
            // From the run that is due, if one is (it may be waiting now).
            let from = status
                .next_run
                .map_or(now, |t| t - chrono::Duration::seconds(1))
                .min(now);
            match schedule_meets_a_window(schedule, settings.time_zone, &disruption, from, RUNS) {
                Some(false) => (
                    ConditionStatus::False,
                    "ScheduleOutsideWindows",
                    format!(
                        "none of the schedule's next {RUNS} runs falls inside a maintenance window: each would wait for the next window to open"
                    ),
                ),
                _ => (
                    ConditionStatus::True,
                    "InWindow",
                    "the schedule's runs fall inside a maintenance window".to_string(),
                ),
            }
        }
    };
    set_condition(
        &mut status.conditions,
        SCHEDULE_IN_WINDOW,
        state,
        reason,
        message,
        rf.metadata.generation,
        now,
    );
}
