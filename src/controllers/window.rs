//! Maintenance windows, evaluated: whether voluntary disruption may start
//! (or take its next node) at an instant, and until when. Pure.

use crate::controllers::authority::{Reason, rules};
use crate::crd::nodegroup::ResolvedDisruption;
use crate::schedule::{last_run, next_run};
use chrono::{DateTime, Utc};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowState {
    /// No windows: voluntary disruption may always run.
    Always,
    /// A window is open until `closes` (at least: a later firing may extend it).
    Open { closes: DateTime<Utc> },
    /// Every window is closed; the next opens at `opens` (None: never again).
    Closed { opens: Option<DateTime<Utc>> },
}

impl WindowState {
    /// The windows as a disruption for `reason` sees them: always open when
    /// the rule book binds no window to it (`authority::rules`).
    pub fn seen_by(&self, reason: Reason) -> WindowState {
        match rules::binds(reason, rules::Rule::Window) {
            true => self.clone(),
            false => WindowState::Always,
        }
    }

    /// As the rule book's check takes it (`authority::validate`).
    pub fn for_rules(&self) -> crate::controllers::authority::validate::Window {
        use crate::controllers::authority::validate::Window;
        match self {
            WindowState::Closed { opens } => Window::Closed { opens: *opens },
            _ => Window::Open,
        }
    }

    pub fn is_open(&self) -> bool {
        !matches!(self, WindowState::Closed { .. })
    }

    /// When a closed window opens next, if it is closed and ever opens.
    pub fn opens(&self) -> Option<DateTime<Utc>> {
        match self {
            WindowState::Closed { opens } => *opens,
            _ => None,
        }
    }

    /// For status: `Open until <t>`, `Closed until <t>`; None without windows.
    pub fn describe(&self) -> Option<String> {
        match self {
            WindowState::Always => None,
            WindowState::Open { closes } => Some(format!("Open until {}", closes.to_rfc3339())),
            WindowState::Closed { opens: Some(t) } => {
                Some(format!("Closed until {}", t.to_rfc3339()))
            }
            WindowState::Closed { opens: None } => Some("Closed".into()),
        }
    }

    /// When a disruption waiting for a window should look again: when the
    /// next one opens, at most `IDLE` from now.
    pub fn recheck_in(&self, now: DateTime<Utc>) -> std::time::Duration {
        use crate::controllers::group_view::{IDLE, until};
        match self {
            WindowState::Closed { opens: Some(t) } => until(now, *t).min(IDLE),
            _ => IDLE,
        }
    }

    /// Why a voluntary disruption waits, when it does.
    pub fn closed_reason(&self) -> Option<String> {
        match self {
            WindowState::Closed { opens: Some(t) } => Some(format!(
                "outside the maintenance windows (the next opens at {})",
                t.to_rfc3339()
            )),
            WindowState::Closed { opens: None } => {
                Some("outside the maintenance windows (none opens again)".into())
            }
            _ => None,
        }
    }
}

/// The windows at `now`: open while some window fired at most its duration
/// ago, until the latest such firing's end. Two cron steps per window (its
/// last firing, its next), whatever the schedule and the duration: the cost
/// of an evaluation is bounded by the number of windows.
pub fn window_state(disruption: &ResolvedDisruption, now: DateTime<Utc>) -> WindowState {
    if disruption.windows.is_empty() {
        return WindowState::Always;
    }
    let tz = disruption.time_zone;
    let mut closes: Option<DateTime<Utc>> = None;
    let mut opens: Option<DateTime<Utc>> = None;
    for (schedule, duration) in &disruption.windows {
        let Ok(span) = chrono::Duration::from_std(*duration) else {
            continue;
        };
        if let Some(fired) = last_run(schedule, tz, now) {
            let end = fired.checked_add_signed(span).unwrap_or(fired);
            closes = Some(closes.map_or(end, |c| c.max(end)));
        }
        if let Some(next) = next_run(schedule, tz, now) {
            opens = Some(opens.map_or(next, |o| o.min(next)));
        }
    }
    match closes {
        Some(closes) if closes > now => WindowState::Open { closes },
        _ => WindowState::Closed { opens },
    }
}

/// The group's maintenance windows at `now`; closed for good while they
/// are invalid (the group's SpecValid condition names the problem).
pub fn group_window(group: &crate::crd::NodeGroup, now: DateTime<Utc>) -> WindowState {
    match group.spec.resolved_disruption() {
        Some(d) => window_state(&d, now),
        None => WindowState::Closed { opens: None },
    }
}

/// Whether a run fired by `schedule` at any of its next `count` firings
/// after `now` would start inside a window; None when it never fires.
pub fn schedule_meets_a_window(
    schedule: &cron::Schedule,
    schedule_zone: chrono_tz::Tz,
    disruption: &ResolvedDisruption,
    now: DateTime<Utc>,
    count: usize,
) -> Option<bool> {
    let mut t = now;
    let mut any = None;
    for _ in 0..count {
        let Some(fired) = next_run(schedule, schedule_zone, t) else {
            break;
        };
        if window_state(disruption, fired).is_open() {
            return Some(true);
        }
        any = Some(false);
        t = fired;
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_no_window_binds_sees_every_window_open() {
        let closed = WindowState::Closed { opens: None };
        assert_eq!(closed.seen_by(Reason::ScaleIn), closed);
        assert_eq!(closed.seen_by(Reason::MasterRepair), WindowState::Always);
    }
    use crate::crd::nodegroup::parse_schedule;
    use chrono::TimeZone;
    use std::time::Duration;

    fn utc(d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        // 2026-06-01 is a Monday.
        Utc.with_ymd_and_hms(2026, 6, d, h, mi, 0).unwrap()
    }

    fn windows(list: &[(&str, u64)], zone: chrono_tz::Tz) -> ResolvedDisruption {
        ResolvedDisruption {
            windows: list
                .iter()
                .map(|(s, secs)| (parse_schedule(s).expect("cron"), Duration::from_secs(*secs)))
                .collect(),
            time_zone: zone,
            ..Default::default()
        }
    }

    #[test]
    fn no_windows_is_always_open() {
        assert_eq!(
            window_state(&windows(&[], chrono_tz::UTC), utc(1, 12, 0)),
            WindowState::Always
        );
    }

    #[test]
    fn a_nightly_window_is_open_inside_and_closed_outside_with_the_next_opening() {
        let w = windows(&[("0 2 * * *", 4 * 3600)], chrono_tz::UTC);
        assert_eq!(
            window_state(&w, utc(2, 2, 0)),
            WindowState::Open {
                closes: utc(2, 6, 0)
            }
        );
        assert_eq!(
            window_state(&w, utc(2, 5, 59)),
            WindowState::Open {
                closes: utc(2, 6, 0)
            }
        );
        assert_eq!(
            window_state(&w, utc(2, 6, 0)),
            WindowState::Closed {
                opens: Some(utc(3, 2, 0))
            }
        );
        assert_eq!(
            window_state(&w, utc(2, 1, 59)),
            WindowState::Closed {
                opens: Some(utc(2, 2, 0))
            }
        );
    }

    #[test]
    fn windows_are_read_in_their_zone() {
        // 02:00 in Tokyo is 17:00 UTC the day before.
        let w = windows(&[("0 2 * * *", 3600)], chrono_tz::Asia::Tokyo);
        assert!(window_state(&w, utc(1, 17, 30)).is_open());
        assert!(!window_state(&w, utc(1, 2, 30)).is_open());
    }

    #[test]
    fn the_latest_close_of_overlapping_windows_counts() {
        let w = windows(&[("0 2 * * *", 3600), ("30 2 * * *", 3600)], chrono_tz::UTC);
        assert_eq!(
            window_state(&w, utc(2, 2, 45)),
            WindowState::Open {
                closes: utc(2, 3, 30)
            }
        );
    }

    #[test]
    fn a_refresh_at_noon_never_meets_a_night_window() {
        let night = windows(&[("0 2 * * *", 4 * 3600)], chrono_tz::UTC);
        let noon = parse_schedule("0 12 * * *").expect("cron");
        let three = parse_schedule("0 3 * * Sat").expect("cron");
        assert_eq!(
            schedule_meets_a_window(&noon, chrono_tz::UTC, &night, utc(1, 0, 0), 20),
            Some(false)
        );
        assert_eq!(
            schedule_meets_a_window(&three, chrono_tz::UTC, &night, utc(1, 0, 0), 20),
            Some(true)
        );
    }
}

#[cfg(test)]
mod once_tests {
    use super::*;
    use crate::crd::nodegroup::parse_schedule;
    use chrono::TimeZone;

    #[test]
    fn a_one_off_run_outside_a_new_year_window() {
        let w = ResolvedDisruption {
            windows: vec![(
                parse_schedule("0 0 1 1 *").expect("cron"),
                std::time::Duration::from_secs(60),
            )],
            time_zone: chrono_tz::UTC,
            ..Default::default()
        };
        let now = Utc.with_ymd_and_hms(2026, 11, 26, 1, 12, 30).unwrap();
        let once = parse_schedule("33 12 1 26 11 * 2026").expect("cron");
        assert!(!window_state(&w, now).is_open());
        assert_eq!(
            schedule_meets_a_window(&once, chrono_tz::UTC, &w, now, 20),
            Some(false)
        );
    }

    /// The windows at `now` by walking every firing since `now - duration`
    /// (the evaluation before the backward step): the oracle the bounded
    /// evaluation must agree with.
    fn walked(disruption: &ResolvedDisruption, now: DateTime<Utc>) -> WindowState {
        let tz = disruption.time_zone;
        let (mut closes, mut opens) = (None::<DateTime<Utc>>, None::<DateTime<Utc>>);
        for (schedule, duration) in &disruption.windows {
            let span = chrono::Duration::from_std(*duration).expect("span");
            let mut t = now - span;
            while let Some(fired) = next_run(schedule, tz, t) {
                if fired > now {
                    opens = Some(opens.map_or(fired, |o| o.min(fired)));
                    break;
                }
                let end = fired + span;
                closes = Some(closes.map_or(end, |c| c.max(end)));
                t = fired;
            }
        }
        match closes {
            Some(c) if c > now => WindowState::Open { closes: c },
            _ => WindowState::Closed { opens },
        }
    }

    fn windows(list: &[(&str, u64)], zone: chrono_tz::Tz) -> ResolvedDisruption {
        ResolvedDisruption {
            windows: list
                .iter()
                .map(|(s, secs)| {
                    let schedule = parse_schedule(s).expect("cron");
                    (schedule, std::time::Duration::from_secs(*secs))
                })
                .collect(),
            time_zone: zone,
            ..Default::default()
        }
    }

    #[test]
    fn two_cron_steps_per_window_agree_with_walking_every_firing() {
        use chrono_tz::America::New_York;
        use chrono_tz::Asia::Tokyo;
        let utc = |d, h, mi| Utc.with_ymd_and_hms(2026, 6, d, h, mi, 0).unwrap();
        let cases = [
            windows(&[("* * * * *", 3600)], chrono_tz::UTC),
            windows(&[("*/7 * * * *", 600), ("0 2 * * 1-5", 4 * 3600)], Tokyo),
            // Across New York's spring-forward and fall-back nights.
            windows(
                &[("30 1 * * *", 3 * 3600), ("0 2 * * *", 2 * 3600)],
                New_York,
            ),
            windows(
                &[("0 0 1 1 *", 60), ("15 4 * * Sun", 168 * 3600)],
                chrono_tz::UTC,
            ),
        ];
        let starts = [
            utc(1, 0, 0),
            Utc.with_ymd_and_hms(2026, 3, 7, 20, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(2026, 10, 31, 20, 0, 0).unwrap(),
        ];
        for (i, w) in cases.iter().enumerate() {
            for start in starts {
                // Every 13 minutes over two days.
                for step in 0..(2 * 24 * 60 / 13) {
                    let now = start + chrono::Duration::minutes(13 * step);
                    assert_eq!(window_state(w, now), walked(w, now), "case {i} at {now}");
                }
            }
        }
    }
}
