//! Which nodes a run replaces: a refresh, every member old enough; a drift
//! roll, the drifted ones. Never a node on the on-demand fallback.

use super::Input;
use crate::controllers::group_view::after;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// The instances a run replaces, oldest first: nodes of the group whose
/// instance is active in a group ASG and whose launch time is known and
/// (with `max_age`) at least that old, never on the on-demand fallback (it
/// returns to spot through the replenisher). Nodes launched later are new.
pub(super) fn targets(input: &Input, max_age: Option<Duration>) -> Vec<String> {
    let mut old: Vec<(&DateTime<Utc>, &str, &str)> = input
        .group
        .nodes
        .iter()
        .filter_map(|n| {
            let id = n.instance_id.as_deref()?;
            let launched = n.launch_time.as_ref()?;
            let member = input.members.iter().any(|m| m.instance_id == id);
            let old_enough = max_age.is_none_or(|age| after(*launched, age) <= input.group.now);
            (member && old_enough && !input.group.on_fallback(n)).then_some((
                launched,
                n.name.as_str(),
                id,
            ))
        })
        .collect();
    old.sort();
    old.into_iter().map(|(_, _, id)| id.to_string()).collect()
}

/// The drifted members a drift roll replaces, oldest first: nodes the
/// inventory reports drifted whose instance is active in a group ASG.
pub(super) fn drifted_targets(input: &Input) -> Vec<String> {
    let mut drifted: Vec<(Option<DateTime<Utc>>, &str)> = input
        .group
        .nodes
        .iter()
        .filter(|n| n.drifted && !input.group.on_fallback(n))
        .filter_map(|n| {
            let id = n.instance_id.as_deref()?;
            let member = input.members.iter().any(|m| m.instance_id == id);
            member.then_some((n.launch_time, id))
        })
        .collect();
    drifted.sort();
    drifted.into_iter().map(|(_, id)| id.to_string()).collect()
}
