//! When a refresh runs: the next time a cron schedule fires in a time zone.
//!
//! Across daylight-saving changes the cron crate alone skips a run whose local
//! time does not exist (a weekly 02:30 refresh would silently lose a week) and
//! fires twice in a repeated hour. Here, as with Vixie cron:
//! - a run in the skipped hour happens at the first instant after the gap;
//! - a run in the repeated hour happens once, at its first occurrence.

use chrono::{DateTime, Datelike, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

/// The first run strictly after `after`, or None if the schedule never fires again.
pub fn next_run(schedule: &cron::Schedule, tz: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    // Outside any calendar a schedule is written for, the cron crate's own
    // arithmetic would overflow (it panics): a clock this wrong never fires.
    if !(1..=9999).contains(&after.year()) {
        return None;
    }
    // Evaluate the schedule on local wall-clock time (naive), then map each
    // candidate to a real instant with the rules above.
    let local_now = after.with_timezone(&tz).naive_local();
    // A later naive candidate can map to an earlier-or-equal instant (the
    // repeated hour), so look at a few.
    schedule
        .after(&Utc.from_utc_datetime(&local_now))
        .take(8)
        .filter_map(|naive| to_instant(tz, naive.naive_utc()))
        .find(|t| *t > after)
}

/// The schedule's latest firing at or before `at`, by the same wall-clock
/// rules as [`next_run`]; None when it never fired (or `at` lies outside
/// any calendar). Steps back over the firings within an hour of `at`'s
/// wall-clock time (a daylight-saving shift moves wall clocks by at most
/// that), not over every firing since some start.
pub fn last_run(schedule: &cron::Schedule, tz: Tz, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if !(2..=9999).contains(&at.year()) {
        return None;
    }
    let local = at.with_timezone(&tz).naive_local();
    let shift = chrono::Duration::hours(1);
    let mut latest: Option<DateTime<Utc>> = None;
    // From just past the latest wall-clock time that can still be `at` or
    // earlier (the repeated hour), back to the earliest that can be later.
    for naive in schedule
        .after(&Utc.from_utc_datetime(&(local + shift + chrono::Duration::seconds(1))))
        .rev()
    {
        let naive = naive.naive_utc();
        if let Some(t) = to_instant(tz, naive).filter(|t| *t <= at) {
            latest = Some(latest.map_or(t, |l| l.max(t)));
        }
        if naive < local - shift {
            break;
        }
    }
    latest
}

fn to_instant(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&local) {
        chrono::LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        chrono::LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
        // In a gap: the first local minute that exists is the end of the gap.
        chrono::LocalResult::None => (1..=24 * 60).find_map(|m| {
            tz.from_local_datetime(&(local + chrono::Duration::minutes(m)))
                .earliest()
                .map(|t| {
                    // Round down to the transition itself (e.g. 03:00, not 03:01).
                    let t = t.with_timezone(&Utc);
                    t - chrono::Duration::seconds(i64::from(t.timestamp().rem_euclid(60) as i32))
                })
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::nodegroup::parse_schedule;
    use chrono_tz::America::New_York;
    use chrono_tz::Asia::Tokyo;
    use proptest::prelude::*;

    #[test]
    fn a_clock_outside_any_calendar_never_fires_and_never_panics() {
        let s = parse_schedule("0 3 * * *").expect("schedule");
        for t in [DateTime::<Utc>::MAX_UTC, DateTime::<Utc>::MIN_UTC] {
            assert_eq!(next_run(&s, Tokyo, t), None);
            assert_eq!(next_run(&s, New_York, t), None);
        }
    }

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    fn runs(expr: &str, tz: Tz, from: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let schedule = parse_schedule(expr).expect("valid");
        let mut out = vec![];
        let mut t = from;
        for _ in 0..n {
            let Some(next) = next_run(&schedule, tz, t) else {
                break;
            };
            out.push(next);
            t = next;
        }
        out
    }

    #[test]
    fn a_weekly_schedule_in_tokyo() {
        // Mondays 04:00 JST = Sunday 19:00 UTC.
        let got = runs("0 4 * * Mon", Tokyo, utc(2026, 11, 22, 0, 0), 2);
        assert_eq!(
            got,
            vec![utc(2026, 11, 22, 19, 0), utc(2026, 11, 29, 19, 0)]
        );
    }

    #[test]
    fn a_run_in_the_spring_forward_gap_happens_when_the_gap_ends() {
        // 2027-03-14: New York jumps from 02:00 EST to 03:00 EDT; 02:30 does not exist.
        let got = runs("30 2 * * *", New_York, utc(2027, 3, 13, 12, 0), 3);
        assert_eq!(
            got,
            vec![
                utc(2027, 3, 14, 7, 0),  // 03:00 EDT, the end of the gap
                utc(2027, 3, 15, 6, 30), // 02:30 EDT
                utc(2027, 3, 16, 6, 30),
            ]
        );
    }

    #[test]
    fn a_weekly_run_in_the_gap_is_not_lost_for_a_week() {
        // Sunday 2027-03-14 02:30 falls in the gap.
        let got = runs("30 2 * * Sun", New_York, utc(2027, 3, 10, 0, 0), 2);
        assert_eq!(got, vec![utc(2027, 3, 14, 7, 0), utc(2027, 3, 21, 6, 30)]);
    }

    #[test]
    fn a_run_in_the_repeated_fall_back_hour_happens_once() {
        // 2027-11-07: 01:00-02:00 happens twice in New York (EDT, then EST).
        let got = runs("30 1 * * *", New_York, utc(2027, 11, 6, 12, 0), 3);
        assert_eq!(
            got,
            vec![
                utc(2027, 11, 7, 5, 30), // 01:30 EDT, first occurrence only
                utc(2027, 11, 8, 6, 30), // 01:30 EST
                utc(2027, 11, 9, 6, 30),
            ]
        );
    }

    #[test]
    fn seconds_and_year_fields_are_honoured() {
        let got = runs(
            "15 0 3 1 1 * 2030",
            chrono_tz::UTC,
            utc(2026, 1, 1, 0, 0),
            2,
        );
        assert_eq!(
            got,
            vec![Utc.with_ymd_and_hms(2030, 1, 1, 3, 0, 15).unwrap()]
        );
    }

    proptest! {
        #[test]
        fn next_run_is_strictly_later_and_at_most_one_per_day_for_a_daily_schedule(
            start in 0i64..(4 * 365 * 24 * 60), minute in 0u32..60, hour in 0u32..24
        ) {
            let expr = format!("{minute} {hour} * * *");
            let from = utc(2026, 1, 1, 0, 0) + chrono::Duration::minutes(start);
            for tz in [New_York, Tokyo, chrono_tz::Europe::London, chrono_tz::Australia::Sydney] {
                let got = runs(&expr, tz, from, 3);
                prop_assert_eq!(got.len(), 3);
                prop_assert!(got[0] > from);
                for pair in got.windows(2) {
                    let gap = pair[1] - pair[0];
                    // One run per local day: 23 to 25 hours apart across DST.
                    prop_assert!(gap >= chrono::Duration::hours(22) && gap <= chrono::Duration::hours(26), "{:?} in {}", pair, tz);
                }
            }
        }
    }
}
