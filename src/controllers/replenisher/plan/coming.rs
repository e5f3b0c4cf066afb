//! The repairs to come, said before they happen: each NotReady node of the
//! group, when it becomes unhealthy (its Ready condition's last transition
//! plus `unhealthyTimeout`: `GroupFacts::unhealthy_at`, what the repair
//! stages use), and what would hold its repair then. The same order as the
//! repair stages take them: the earliest first, by name among equals.

use crate::controllers::authority::{self, Path, Request};
use crate::controllers::group_view::GroupFacts;
use crate::crd::Role;
use chrono::{DateTime, Utc};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComingRepair {
    pub node: String,
    pub instance_id: String,
    /// When it is unhealthy, and its repair starts (a worker's replacement
    /// raised first).
    pub at: DateTime<Utc>,
    /// What would hold the repair now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

/// The group's repairs to come; `active`: the instances in service in the
/// group's ASGs (a node on another is not the group's to repair).
pub fn repairs_to_come(group: &GroupFacts, active: &[String]) -> Vec<ComingRepair> {
    let mut coming: Vec<ComingRepair> = group
        .nodes
        .iter()
        .filter(|n| n.asg.is_some())
        .filter_map(|n| {
            let id = n.instance_id.clone().filter(|id| active.contains(id))?;
            let at = group.unhealthy_at(n)?;
            Some(ComingRepair {
                node: n.name.clone(),
                held_by: held_by(group, &id),
                instance_id: id,
                at,
            })
        })
        .collect();
    coming.sort_by(|a, b| (a.at, &a.node).cmp(&(b.at, &b.node)));
    coming
}

/// What holds a repair of `instance` now, as the repair stages check it.
fn held_by(group: &GroupFacts, instance: &str) -> Option<String> {
    if !group.repair {
        return Some(
            "repair is off (replenish.repair: false): a worker gets a replacement, the node is kept"
                .into(),
        );
    }
    match group.role {
        Role::Worker => group
            .breaker
            .as_ref()
            .map(|why| format!("circuit breaker open: {why}")),
        Role::Master => {
            let request = Request {
                path: Path::Repair,
                role: Role::Master,
                instance,
            };
            authority::decide(group.control_plane, &request)
                .err()
                .map(|b| b.to_string())
        }
    }
}
