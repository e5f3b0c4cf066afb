//! The next disruption a group's Refresher will make on its own, as its
//! plan sees it now (`Refresher.status.next`, and its one line in the
//! NodeGroup's `NEXT` column). Computed by the refresher's own plan
//! (`controllers::refresher::plan::preview`), never by a copy of its rules.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// At most this many nodes are listed in `nodes` (the rest are counted in
/// `total`), so a status stays small at a thousand nodes.
pub const LISTED_NODES: usize = 20;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NextDisruption {
    /// `refresh` (scheduled), `drift roll`, or `resume` (a run set aside).
    pub what: String,
    /// When it starts: the next firing of the schedule inside an open
    /// window, or the window's opening. Absent: now, or under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<DateTime<Utc>>,
    /// Why: the schedule, `maxNodeAge`, the drift. (Never sent empty: an
    /// apiserver 1.20 applying status reads "" as null and refuses it.)
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// Whether a run is under way (then `nodes` are those it has left).
    #[serde(default)]
    pub under_way: bool,
    /// How many nodes it replaces (or has left).
    pub total: i32,
    /// The nodes, in the order the run takes them, each with what would
    /// hold it now; at most 20 (the rest counted in `total`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NextNode>,
    /// What would hold the whole run if it were due now: the group
    /// suspended or invalid, the circuit breaker, a kops rolling update,
    /// suspended processes, too few Ready nodes, the masters' rule, the
    /// disruption slots or the group's lock held elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// One line, for `kubectl get` (the NodeGroup's `NEXT` column).
    pub summary: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NextNode {
    /// The node.
    pub node: String,
    /// Its EC2 instance.
    pub instance_id: String,
    /// What would hold it now (do-not-disrupt, a foreign cordon, a pod
    /// nothing recreates), and what the run then does: wait up to
    /// `doNotDisruptTimeout`, then skip it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
}

/// The one that comes first of two children's next disruptions: one under
/// way, else the soonest (now before any time); `a` among equals.
pub fn soonest(a: Option<NextDisruption>, b: Option<NextDisruption>) -> Option<NextDisruption> {
    let rank = |n: &NextDisruption| (!n.under_way, n.at.is_some(), n.at);
    match (a, b) {
        (Some(a), Some(b)) => Some(if rank(&b) < rank(&a) { b } else { a }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(what: &str, at: Option<i64>, under_way: bool) -> Option<NextDisruption> {
        Some(NextDisruption {
            what: what.into(),
            at: at.and_then(|s| DateTime::from_timestamp(s, 0)),
            under_way,
            summary: what.into(),
            ..Default::default()
        })
    }

    fn what(n: Option<NextDisruption>) -> String {
        n.map(|n| n.what).unwrap_or_default()
    }

    #[test]
    fn under_way_then_now_then_the_earliest_and_the_first_among_equals() {
        assert_eq!(
            what(soonest(next("a", None, false), next("b", None, true))),
            "b"
        );
        assert_eq!(
            what(soonest(next("a", Some(5), false), next("b", None, false))),
            "b"
        );
        assert_eq!(
            what(soonest(
                next("a", Some(5), false),
                next("b", Some(3), false)
            )),
            "b"
        );
        assert_eq!(
            what(soonest(
                next("a", Some(3), false),
                next("b", Some(5), false)
            )),
            "a"
        );
        assert_eq!(
            what(soonest(
                next("a", Some(3), false),
                next("b", Some(3), false)
            )),
            "a"
        );
        assert_eq!(what(soonest(None, next("b", Some(3), false))), "b");
        assert_eq!(what(soonest(next("a", Some(3), false), None)), "a");
        assert!(soonest(None, None).is_none());
    }
}
