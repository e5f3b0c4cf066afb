//! Room above a worker group's count: the `NoRoomAboveDesired` condition.
//! A refresh's surplus, a replacement launched ahead of a repair or of an
//! interrupted node, and a shortage in another zone all launch above the
//! group's count, inside the ASGs' MaxSize. kops sends MinSize and MaxSize
//! on every `kops update cluster`: a maxSize lowered to the count takes
//! that room away (and one lowered below a count the manager raised lets
//! AWS remove instances of its own choosing, without a drain). Read from
//! the descriptions the inventory makes anyway; the manager changes no
//! MaxSize: the instance group's is the user's.
//!
//! Masters are not judged: a master is replaced in its own ASG after it
//! goes (kops's control-plane groups are min = max = 1), never ahead.

use crate::cloud::AsgDescription;
use crate::crd::condition::{ConditionStatus, NO_ROOM_ABOVE_DESIRED, set_condition};
use crate::crd::nodegroup::Role;
use crate::crd::{NodeGroup, NodeGroupStatus};
use chrono::{DateTime, Utc};

/// Pure: the condition's (status, reason, message) for a worker group;
/// None for a master group, or while a spot ASG is not described (the
/// Degraded condition says so).
pub fn room(
    group: &NodeGroup,
    asgs: &[AsgDescription],
) -> Option<(ConditionStatus, &'static str, String)> {
    if group.spec.role != Role::Worker {
        return None;
    }
    let spot: Vec<&AsgDescription> = group
        .spec
        .auto_scaling_groups
        .iter()
        .map(|a| asgs.iter().find(|d| d.name == a.name))
        .collect::<Option<_>>()?;
    // In i64: a MaxSize or count from AWS or the user never overflows it.
    let count = i64::from(group.spec.desired);
    let most: i64 = spot.iter().map(|a| i64::from(a.max)).sum();
    let room = most - count;
    // One node above the count for a repair or an interruption replaced
    // first; the refresh's surplus, when it adds more.
    let surplus = group
        .spec
        .refresh
        .as_ref()
        .map_or(0, |r| r.effective_surplus(group.spec.role));
    let need = i64::from(surplus.max(1));
    let figures = spot
        .iter()
        .map(|a| format!("{} {}/{}", a.name, a.desired, a.max))
        .collect::<Vec<_>>()
        .join(", ");
    if room >= need {
        return Some((
            ConditionStatus::False,
            "Room",
            format!(
                "the ASGs' maxSize adds up to {most}: room for {room} node(s) above the group's {count} (needs {need}); desired/max: {figures}"
            ),
        ));
    }
    let at_max: Vec<&str> = spot
        .iter()
        .filter(|a| a.desired >= a.max)
        .map(|a| a.name.as_str())
        .collect();
    let surplus_said = match surplus {
        0 => String::new(),
        n => format!("a refresh's surplus of {n} cannot be added, so its runs are skipped; "),
    };
    let at_max_said = match at_max.is_empty() {
        true => String::new(),
        false => format!("; at max: {}", at_max.join(", ")),
    };
    Some((
        ConditionStatus::True,
        "NoRoom",
        format!(
            "the ASGs' maxSize adds up to {most} for the group's {count} nodes: room for {} above it, {need} needed (desired/max: {figures}{at_max_said}); {surplus_said}a dead or interrupted worker is removed before its replacement launches, and a zone short of spot capacity cannot be made up elsewhere; raise maxSize on the kops instance groups (kops edit ig, then kops update cluster --yes) to add up to at least {}",
            room.max(0),
            count + need
        ),
    ))
}

/// Sets the condition on `status` from `asgs` (a master group has none).
pub fn set_room(
    group: &NodeGroup,
    asgs: &[AsgDescription],
    status: &mut NodeGroupStatus,
    now: DateTime<Utc>,
) {
    let Some((value, reason, message)) = room(group, asgs) else {
        return;
    };
    set_condition(
        &mut status.conditions,
        NO_ROOM_ABOVE_DESIRED,
        value,
        reason,
        message,
        group.metadata.generation,
        now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::group_view::tests::fresh;

    fn group(role: &str, desired: i32, refresh: serde_json::Value) -> NodeGroup {
        let mut spec = serde_json::json!({
            "role": role,
            "autoScalingGroups": [{"name": "a"}, {"name": "b"}],
            "desired": desired,
        });
        if !refresh.is_null() {
            spec["refresh"] = refresh;
        }
        NodeGroup::new("g", serde_json::from_value(spec).expect("spec"))
    }

    fn asg(name: &str, desired: i32, max: i32) -> AsgDescription {
        let mut a = fresh(name, &[]);
        (a.desired, a.max) = (desired, max);
        a
    }

    #[test]
    fn a_max_lowered_to_the_count_leaves_no_room_and_says_what_to_raise() {
        let g = group("Worker", 4, serde_json::json!({"schedule": "0 3 * * *"}));
        let (value, reason, message) = room(&g, &[asg("a", 2, 2), asg("b", 2, 2)]).expect("judged");
        assert_eq!((value, reason), (ConditionStatus::True, "NoRoom"));
        for said in [
            "adds up to 4 for the group's 4 nodes",
            "room for 0 above it, 1 needed",
            "a 2/2, b 2/2",
            "at max: a, b",
            "a refresh's surplus of 1 cannot be added",
            "removed before its replacement launches",
            "to add up to at least 5",
        ] {
            assert!(message.contains(said), "{said}: {message}");
        }
    }

    #[test]
    fn one_asg_with_room_is_room_for_the_group() {
        let g = group("Worker", 4, serde_json::Value::Null);
        let (value, reason, message) = room(&g, &[asg("a", 2, 2), asg("b", 2, 3)]).expect("judged");
        assert_eq!(
            (value, reason),
            (ConditionStatus::False, "Room"),
            "{message}"
        );
        // No refresh: a repair's one node is all it needs.
        assert!(message.contains("(needs 1)"), "{message}");
    }

    #[test]
    fn less_room_than_the_refresh_s_surplus_is_no_room() {
        let g = group(
            "Worker",
            4,
            serde_json::json!({"schedule": "0 3 * * *", "surplusNodes": 2}),
        );
        let (value, _, message) = room(&g, &[asg("a", 2, 3), asg("b", 2, 2)]).expect("judged");
        assert_eq!(value, ConditionStatus::True, "{message}");
        assert!(
            message.contains("room for 1 above it, 2 needed"),
            "{message}"
        );
        assert!(message.contains("at max: b"), "{message}");
        assert!(message.contains("at least 6"), "{message}");
    }

    #[test]
    fn masters_and_groups_with_an_asg_not_described_are_not_judged() {
        let masters = group("Master", 2, serde_json::Value::Null);
        assert_eq!(room(&masters, &[asg("a", 1, 1), asg("b", 1, 1)]), None);
        let workers = group("Worker", 2, serde_json::Value::Null);
        assert_eq!(room(&workers, &[asg("a", 1, 1)]), None);
        let mut status = NodeGroupStatus::default();
        set_room(
            &masters,
            &[asg("a", 1, 1), asg("b", 1, 1)],
            &mut status,
            Utc::now(),
        );
        assert!(status.conditions.is_empty());
    }
}
