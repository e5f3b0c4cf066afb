//! Which spot pools to trust: per ASG, what happened to it over the last
//! 24 hours (interruption warnings, rebalance recommendations, launch
//! failures), kept in the NodeGroup's status by the inventory and read by
//! the replenisher when it must choose where to raise.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How far back the record goes.
pub const POOL_WINDOW: chrono::Duration = chrono::Duration::hours(24);
/// The most events kept per ASG (the newest), so a status stays small.
pub const POOL_EVENTS: usize = 50;
/// Interruption warnings and rebalance recommendations in the window from
/// which a pool is called unreliable (a Warning Event, once per episode).
pub const UNRELIABLE_AT: usize = 3;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PoolEventKind {
    /// A spot interruption warning for one of its instances.
    Interruption,
    /// A rebalance recommendation for one of its instances.
    Rebalance,
    /// Its launches started failing (one per episode, not per retry).
    LaunchFailure,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolEvent {
    /// `Interruption`, `Rebalance` or `LaunchFailure`.
    pub kind: PoolEventKind,
    /// When AWS sent the notice, or when the failure was first seen.
    pub at: DateTime<Utc>,
    /// The instance a notice was for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// The interruption warnings and rebalance recommendations of `recent`
/// within the window before `now`.
pub fn notices_in_window(recent: &[PoolEvent], now: DateTime<Utc>) -> usize {
    recent
        .iter()
        .filter(|e| e.kind != PoolEventKind::LaunchFailure && now - e.at <= POOL_WINDOW)
        .count()
}

/// The record after this observation: `previous` pruned to the window,
/// each notice on one of `notices` (kind, instance, when) added once, a
/// launch failure added when one starts (`failing` now, not before), the
/// newest [`POOL_EVENTS`] kept.
pub fn update_record(
    previous: &[PoolEvent],
    notices: &[(PoolEventKind, String, DateTime<Utc>)],
    failing: bool,
    failing_before: bool,
    now: DateTime<Utc>,
) -> Vec<PoolEvent> {
    let mut events: Vec<PoolEvent> = previous
        .iter()
        .filter(|e| now - e.at <= POOL_WINDOW)
        .cloned()
        .collect();
    for (kind, instance, at) in notices {
        let known = events
            .iter()
            .any(|e| e.kind == *kind && e.instance_id.as_deref() == Some(instance.as_str()));
        if !known {
            events.push(PoolEvent {
                kind: *kind,
                at: *at,
                instance_id: Some(instance.clone()),
            });
        }
    }
    if failing && !failing_before {
        events.push(PoolEvent {
            kind: PoolEventKind::LaunchFailure,
            at: now,
            instance_id: None,
        });
    }
    events.sort_by_key(|e| e.at);
    let drop = events.len().saturating_sub(POOL_EVENTS);
    events.drain(..drop);
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap()
    }

    #[test]
    fn each_notice_counts_once_a_failure_once_per_episode_and_a_day_at_most() {
        let warned = (PoolEventKind::Interruption, "i-1".to_string(), t0());
        let r = update_record(&[], std::slice::from_ref(&warned), true, false, t0());
        assert_eq!(r.len(), 2);
        // Seen again (the notice stays on the node; the failure goes on).
        let again = update_record(&r, &[warned], true, true, t0());
        assert_eq!(again, r);
        assert_eq!(again.len(), 2);
        assert_eq!(notices_in_window(&again, t0()), 1);
        // A rebalance for the same instance is another kind of notice.
        let rebalance = (PoolEventKind::Rebalance, "i-1".to_string(), t0());
        assert_eq!(update_record(&r, &[rebalance], false, true, t0()).len(), 3);
        // A day later, gone.
        let later = t0() + POOL_WINDOW + chrono::Duration::seconds(1);
        assert_eq!(notices_in_window(&r, later), 0);
        assert!(update_record(&r, &[], false, false, later).is_empty());
    }

    #[test]
    fn the_newest_are_kept() {
        let notices: Vec<_> = (0..(POOL_EVENTS as i64 + 10))
            .map(|i| {
                (
                    PoolEventKind::Interruption,
                    format!("i-{i}"),
                    t0() + chrono::Duration::seconds(i),
                )
            })
            .collect();
        let r = update_record(
            &[],
            &notices,
            false,
            false,
            t0() + chrono::Duration::hours(1),
        );
        assert_eq!(r.len(), POOL_EVENTS);
        assert_eq!(r[0].instance_id.as_deref(), Some("i-10"));
    }
}
