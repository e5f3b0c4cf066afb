//! The group's spec against what the schema cannot check, and against the
//! other groups (an ASG named twice): the `SpecValid` condition.

use crate::crd::condition::{ConditionStatus, SPEC_VALID, set_condition};
use crate::crd::nodegroup::ASG_CONFLICT as CONFLICT;
use crate::crd::{NodeGroup, NodeGroupStatus};
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use std::sync::Arc;

/// Pure: the ASGs of `group` that another group also names (same region).
/// Two groups acting on one ASG would each take the other's nodes for its
/// own: both are invalid, and neither acts until one lets go.
pub fn asg_conflicts<'a>(
    group: &NodeGroup,
    others: impl IntoIterator<Item = &'a NodeGroup>,
) -> Vec<crate::crd::nodegroup::SpecProblem> {
    let me = (group.namespace(), group.name_any());
    let others: Vec<&NodeGroup> = others.into_iter().collect();
    let mut problems = vec![];
    // The on-demand fallback ASGs too: a fallback shared, or another
    // group's spot ASG, would be raised and emptied by both.
    let spot = group.spec.auto_scaling_groups.len();
    for (i, name) in group.spec.asg_names().iter().enumerate() {
        let field = match i.checked_sub(spot) {
            None => format!("autoScalingGroups[{i}].name"),
            Some(j) => format!("fallback.autoScalingGroups[{j}].name"),
        };
        let mut claimed_by: Vec<String> = others
            .iter()
            .filter(|o| (o.namespace(), o.name_any()) != me)
            .filter(|o| o.spec.region == group.spec.region)
            .filter(|o| o.spec.asg_names().contains(name))
            .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
            .collect();
        if claimed_by.is_empty() {
            continue;
        }
        claimed_by.sort();
        problems.push(crate::crd::nodegroup::SpecProblem {
            field,
            reason: CONFLICT,
            message: format!(
                "Auto Scaling Group {:?} is also in NodeGroup {}; neither group acts on it until one lets go",
                name,
                claimed_by.join(", ")
            ),
        });
    }
    problems
}

/// Pure: the status after validating the spec, against the other groups
/// too (`others` may include this one). Keeps every other field as is.
pub fn validated_status(
    group: &NodeGroup,
    others: &[Arc<NodeGroup>],
    current: &NodeGroupStatus,
    now: DateTime<Utc>,
) -> NodeGroupStatus {
    let generation = group.metadata.generation;
    let mut next = current.clone();
    let mut problems = group.spec.validate();
    problems.extend(asg_conflicts(group, others.iter().map(|g| g.as_ref())));
    match problems.first() {
        None => set_condition(
            &mut next.conditions,
            SPEC_VALID,
            ConditionStatus::True,
            "Valid",
            "spec is valid",
            generation,
            now,
        ),
        Some(first) => {
            let message = problems
                .iter()
                .map(|p| format!("spec.{}: {}", p.field, p.message))
                .collect::<Vec<_>>()
                .join("; ");
            set_condition(
                &mut next.conditions,
                SPEC_VALID,
                ConditionStatus::False,
                first.reason,
                message,
                generation,
                now,
            );
        }
    }
    next.observed_generation = generation;
    next.desired_nodes = Some(group.spec.desired);
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::NodeGroupSpec;
    use chrono::TimeZone;

    fn group(spec: serde_json::Value, generation: i64) -> NodeGroup {
        let spec: NodeGroupSpec = serde_json::from_value(spec).expect("spec");
        let mut g = NodeGroup::new("workers", spec);
        g.metadata.namespace = Some("ns".into());
        g.metadata.generation = Some(generation);
        g
    }

    #[test]
    fn invalid_schedule_gives_a_false_condition_naming_the_field() {
        let now = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let g = group(
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "a"}], "desired": 3,
                               "refresh": {"schedule": "whenever", "timeZone": "Nowhere/City"}}),
            4,
        );
        let status = validated_status(&g, &[], &NodeGroupStatus::default(), now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason, "InvalidSchedule");
        assert!(c.message.contains("spec.refresh.schedule"), "{}", c.message);
        assert!(c.message.contains("spec.refresh.timeZone"), "{}", c.message);
        assert_eq!(status.observed_generation, Some(4));
    }

    #[test]
    fn a_valid_spec_is_stable_so_nothing_is_rewritten() {
        let t0 = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let g = group(
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "a"}], "desired": 3}),
            1,
        );
        let first = validated_status(&g, &[], &NodeGroupStatus::default(), t0);
        let second = validated_status(&g, &[], &first, t0 + chrono::Duration::minutes(1));
        assert_eq!(
            first, second,
            "an unchanged group must produce an identical status"
        );
    }

    #[test]
    fn an_asg_named_by_two_groups_makes_both_invalid_naming_the_other() {
        let now = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let named = |name: &str, asgs: serde_json::Value, region: Option<&str>| {
            let mut g = group(
                serde_json::json!({"role": "Worker", "autoScalingGroups": asgs, "desired": 3,
                                   "region": region}),
                1,
            );
            g.metadata.name = Some(name.into());
            Arc::new(g)
        };
        let a = named(
            "a",
            serde_json::json!([{"name": "x"}, {"name": "shared"}]),
            None,
        );
        let b = named("b", serde_json::json!([{"name": "shared"}]), None);
        let elsewhere = named("c", serde_json::json!([{"name": "x"}]), Some("eu-west-1"));
        let all = vec![a.clone(), b.clone(), elsewhere.clone()];
        for (me, other, field) in [
            (&a, "ns/b", "spec.autoScalingGroups[1].name"),
            (&b, "ns/a", "spec.autoScalingGroups[0].name"),
        ] {
            let status = validated_status(me, &all, &NodeGroupStatus::default(), now);
            let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
            assert_eq!(
                (c.status.clone(), c.reason.as_str()),
                (ConditionStatus::False, CONFLICT)
            );
            assert!(
                c.message.contains(other) && c.message.contains(field),
                "{}",
                c.message
            );
            // Read back by both child controllers: neither acts.
            let mut g = (**me).clone();
            g.status = Some(status);
            assert!(g.asg_conflict().is_some_and(|m| m.contains(other)));
        }
        // The same name in another region is another ASG; a group is never
        // in conflict with itself.
        let status = validated_status(&elsewhere, &all, &NodeGroupStatus::default(), now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::True, "{}", c.message);
        assert!(asg_conflicts(&b, [b.as_ref()]).is_empty());
        // Once one lets go, the other is valid again.
        let b_moved = named("b", serde_json::json!([{"name": "other"}]), None);
        let status = validated_status(&a, &[a.clone(), b_moved], &NodeGroupStatus::default(), now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::True);
    }

    #[test]
    fn a_fallback_asg_another_group_names_is_a_conflict_too() {
        let named = |name: &str, spec: serde_json::Value| {
            let mut g = group(spec, 1);
            g.metadata.name = Some(name.into());
            g
        };
        let a = named(
            "a",
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "x"}], "desired": 3,
                               "fallback": {"autoScalingGroups": [{"name": "od"}]}}),
        );
        // Another group's fallback, and another group's spot ASG.
        for other in [
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "y"}], "desired": 3,
                               "fallback": {"autoScalingGroups": [{"name": "od"}]}}),
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "od"}], "desired": 3}),
        ] {
            let b = named("b", other);
            let problems = asg_conflicts(&a, [&b]);
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert_eq!(problems[0].field, "fallback.autoScalingGroups[0].name");
            assert_eq!(asg_conflicts(&b, [&a]).len(), 1);
        }
    }
}
