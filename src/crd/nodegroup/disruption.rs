//! `spec.disruption`: when, and what, voluntary disruption (a refresh, a
//! drift roll, a rebalance replacement, the scale-in back to the original
//! layout) may touch. Interruptions and repairs ignore it: a spot loss or a
//! dead kubelet does not wait.

use crate::duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Pods and Nodes with this annotation set to "true" protect their node from
/// voluntary disruption.
pub const DO_NOT_DISRUPT: &str = "nodemanager.dev/do-not-disrupt";

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionSpec {
    /// Maintenance windows, at most 10. Voluntary disruption (a refresh, a
    /// drift roll, the removal of a surplus node or a node at risk) starts,
    /// and takes its next node, only while one is open. None: always open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowSpec>,
    /// IANA time zone the windows' schedules are read in. Default: the
    /// refresh's `timeZone`, else UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// How long a run waits for a node that is protected (a do-not-disrupt
    /// pod or Node, a foreign cordon, a pod nothing would recreate) before it
    /// skips it; at most 24h, and waited for at most the refresh's
    /// `pauseTimeout` (the run keeps its group's lock while it waits).
    /// Default `0s`: skipped at once, and reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub do_not_disrupt_timeout: Option<String>,
    /// Evict pods that no controller would recreate (what `kubectl drain
    /// --force` does). Default false: their node is protected like a
    /// do-not-disrupt pod's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evict_unmanaged_pods: bool,
    /// What a run does when its window closes before it is done: `Wait`
    /// (default) finishes the node in hand and waits, keeping its surplus;
    /// `ScaleDown` also removes the surplus (the original layout back) and
    /// resumes the rest of the run in the next window.
    #[serde(default, skip_serializing_if = "OnWindowClose::is_default")]
    pub on_window_close: OnWindowClose,
    /// Master groups: let the manager take a master away where that stops
    /// the Kubernetes API, as in a cluster of one or two masters (etcd keeps
    /// no quorum with one fewer): a refresh, a drift roll, a repair or a
    /// master at risk then replaces it, and the API is down until the
    /// replacement's etcd has joined. Default false: those are refused,
    /// said in the Refresher's and Replenisher's status, and a run is
    /// skipped. Takes effect only when every Master group of the namespace
    /// sets it; a Worker group's is ignored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_control_plane_outage: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OnWindowClose {
    #[default]
    Wait,
    ScaleDown,
}

impl OnWindowClose {
    fn is_default(&self) -> bool {
        *self == OnWindowClose::Wait
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowSpec {
    /// When the window opens: cron, as `refresh.schedule`, but opening at
    /// most once a minute (a seconds field, when given, is one number).
    pub schedule: String,
    /// How long it stays open, e.g. `4h`; 1m to 168h.
    pub duration: String,
}

/// The bounds of a window's duration.
pub const WINDOW_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(60), Duration::from_secs(168 * 3600));
/// The most a run waits for a protected node.
pub const DO_NOT_DISRUPT_TIMEOUT_MOST: Duration = Duration::from_secs(24 * 3600);

/// The most maintenance windows a group may have: each is evaluated on
/// every reconcile of its Refresher and Replenisher.
pub const MOST_WINDOWS: usize = 10;

/// A 6- or 7-field cron whose seconds field is not one number: it fires
/// many times a minute, and evaluating a window walks its firings.
fn fires_by_the_second(expr: &str) -> bool {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    fields.len() >= 6 && fields[0].parse::<u8>().is_err()
}

/// The windows, parsed.
#[derive(Debug, Clone, Default)]
pub struct ResolvedDisruption {
    pub windows: Vec<(cron::Schedule, Duration)>,
    pub time_zone: chrono_tz::Tz,
    pub do_not_disrupt_timeout: Duration,
    pub evict_unmanaged_pods: bool,
    pub on_window_close: OnWindowClose,
}

impl DisruptionSpec {
    /// The zone windows are read in: their own, the refresh's, else UTC.
    pub fn zone<'a>(&'a self, refresh_zone: Option<&'a str>) -> &'a str {
        self.time_zone.as_deref().or(refresh_zone).unwrap_or("UTC")
    }

    /// Problems as (field, reason, message). `lifted`: the least duration
    /// is not enforced (a test build against the emulator).
    pub fn problems(
        &self,
        refresh_zone: Option<&str>,
        lifted: bool,
    ) -> Vec<(String, &'static str, String)> {
        let mut out = vec![];
        if self.windows.len() > MOST_WINDOWS {
            out.push((
                "disruption.windows".into(),
                "TooManyWindows",
                format!(
                    "at most {MOST_WINDOWS} windows, got {}: each is evaluated on every reconcile",
                    self.windows.len()
                ),
            ));
        }
        for (i, w) in self.windows.iter().enumerate() {
            let field = format!("disruption.windows[{i}].schedule");
            match super::parse_schedule(&w.schedule) {
                Err(e) => out.push((field, "InvalidSchedule", e)),
                Ok(_) if fires_by_the_second(&w.schedule) => out.push((
                    field,
                    "InvalidSchedule",
                    format!(
                        "{:?} opens a window more than once a minute: a window's seconds field, when given, is one number",
                        w.schedule
                    ),
                )),
                Ok(_) => {}
            }
            let field = format!("disruption.windows[{i}].duration");
            match duration::parse(&w.duration) {
                Err(e) => out.push((field, "InvalidDuration", e.to_string())),
                Ok(d) if d > WINDOW_BOUNDS.1 || (d < WINDOW_BOUNDS.0 && !lifted) || d.is_zero() => {
                    out.push((
                        field,
                        "InvalidDuration",
                        format!(
                            "must be between {} and {}, got {}",
                            duration::format(WINDOW_BOUNDS.0),
                            duration::format(WINDOW_BOUNDS.1),
                            w.duration
                        ),
                    ))
                }
                Ok(_) => {}
            }
        }
        // An inherited refresh zone is reported as the refresh's.
        let zone = self.zone(refresh_zone);
        if self.time_zone.is_some()
            && let Err(e) = zone.parse::<chrono_tz::Tz>()
        {
            out.push((
                "disruption.timeZone".into(),
                "InvalidTimeZone",
                format!("unknown IANA time zone {zone:?}: {e}"),
            ));
        }
        if let Some(t) = &self.do_not_disrupt_timeout {
            match duration::parse(t) {
                Err(e) => out.push((
                    "disruption.doNotDisruptTimeout".into(),
                    "InvalidDuration",
                    e.to_string(),
                )),
                Ok(d) if d > DO_NOT_DISRUPT_TIMEOUT_MOST => out.push((
                    "disruption.doNotDisruptTimeout".into(),
                    "InvalidDuration",
                    format!(
                        "must be at most {}, got {t}",
                        duration::format(DO_NOT_DISRUPT_TIMEOUT_MOST)
                    ),
                )),
                Ok(_) => {}
            }
        }
        out
    }

    /// Parsed; None when anything is invalid (callers report the problems).
    pub fn resolve(&self, refresh_zone: Option<&str>) -> Option<ResolvedDisruption> {
        let windows = self
            .windows
            .iter()
            .map(|w| {
                Some((
                    super::parse_schedule(&w.schedule).ok()?,
                    duration::parse(&w.duration).ok().filter(|d| !d.is_zero())?,
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ResolvedDisruption {
            windows,
            time_zone: self.zone(refresh_zone).parse().ok()?,
            do_not_disrupt_timeout: match &self.do_not_disrupt_timeout {
                Some(t) => duration::parse(t).ok()?,
                None => Duration::ZERO,
            },
            evict_unmanaged_pods: self.evict_unmanaged_pods,
            on_window_close: self.on_window_close,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(schedule: &str, duration: &str) -> WindowSpec {
        WindowSpec {
            schedule: schedule.into(),
            duration: duration.into(),
        }
    }

    #[test]
    fn windows_firing_by_the_second_or_too_many_are_refused() {
        let spec = |windows: Vec<WindowSpec>| DisruptionSpec {
            windows,
            time_zone: None,
            do_not_disrupt_timeout: None,
            evict_unmanaged_pods: false,
            on_window_close: OnWindowClose::Wait,
            allow_control_plane_outage: false,
        };
        let reasons = |s: DisruptionSpec| -> Vec<(String, &'static str)> {
            s.problems(None, false)
                .into_iter()
                .map(|(field, reason, _)| (field, reason))
                .collect()
        };
        assert_eq!(
            reasons(spec(vec![
                window("*/5 * * * * *", "1h"),
                window("30 0 2 * * *", "1h"),
                window("0 2 * * *", "1h"),
            ])),
            [(
                "disruption.windows[0].schedule".to_string(),
                "InvalidSchedule"
            )],
            "one second of the minute is fine; every fifth second is not"
        );
        let many = vec![window("0 2 * * *", "1h"); MOST_WINDOWS + 1];
        assert_eq!(
            reasons(spec(many)),
            [("disruption.windows".to_string(), "TooManyWindows")]
        );
        assert!(reasons(spec(vec![window("0 2 * * *", "1h"); MOST_WINDOWS])).is_empty());
    }

    #[test]
    fn each_bad_field_is_named() {
        let spec = DisruptionSpec {
            windows: vec![window("0 2 * * *", "4h"), window("nope", "9999h")],
            time_zone: Some("Mars/Base".into()),
            do_not_disrupt_timeout: Some("2d".into()),
            evict_unmanaged_pods: false,
            on_window_close: OnWindowClose::ScaleDown,
            allow_control_plane_outage: false,
        };
        let fields: Vec<String> = spec
            .problems(None, false)
            .into_iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(
            fields,
            [
                "disruption.windows[1].schedule",
                "disruption.windows[1].duration",
                "disruption.timeZone",
                "disruption.doNotDisruptTimeout"
            ]
        );
        assert!(spec.resolve(None).is_none());
    }

    #[test]
    fn windows_default_to_the_refresh_zone_then_utc() {
        let spec = DisruptionSpec {
            windows: vec![window("0 2 * * Sat", "4h")],
            ..Default::default()
        };
        assert!(spec.problems(Some("Asia/Tokyo"), false).is_empty());
        let resolved = spec.resolve(Some("Asia/Tokyo")).expect("valid");
        assert_eq!(resolved.time_zone, chrono_tz::Asia::Tokyo);
        assert_eq!(resolved.do_not_disrupt_timeout, Duration::ZERO);
        assert_eq!(spec.resolve(None).expect("valid").time_zone, chrono_tz::UTC);
    }

    #[test]
    fn a_window_shorter_than_a_minute_is_refused_unless_lifted() {
        let spec = DisruptionSpec {
            windows: vec![window("0 2 * * *", "20s")],
            ..Default::default()
        };
        assert_eq!(spec.problems(None, false).len(), 1);
        assert!(spec.problems(None, true).is_empty());
    }
}
