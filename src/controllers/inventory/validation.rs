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

/// Pure: the group's on-demand fallback ASGs whose MinSize is above 0, per
/// `asgs` (AWS's description). Such an ASG keeps that many on-demand nodes
/// for good: the return to spot cannot lower it below its min, so each
/// fallback node it terminates is relaunched, drained and terminated again.
pub fn fallback_min_problems(
    group: &NodeGroup,
    asgs: &[crate::cloud::AsgDescription],
) -> Vec<crate::crd::nodegroup::SpecProblem> {
    let Some(fallback) = &group.spec.fallback else {
        return vec![];
    };
    fallback
        .auto_scaling_groups
        .iter()
        .enumerate()
        .filter_map(|(i, named)| {
            let asg = asgs.iter().find(|a| a.name == named.name)?;
            (asg.min > 0).then(|| crate::crd::nodegroup::SpecProblem {
                field: format!("fallback.autoScalingGroups[{i}].name"),
                reason: crate::crd::nodegroup::FALLBACK_MIN_SIZE,
                message: format!(
                    "Auto Scaling Group {:?} has MinSize {}: a fallback ASG must have MinSize 0, or its on-demand nodes can never all return to spot (each one terminated at min is relaunched); set it to 0 (kops: minSize: 0 in its instance group)",
                    asg.name, asg.min
                ),
            })
        })
        .collect()
}

/// Pure: the status after validating the spec, against the other groups
/// too (`others` may include this one) and the ASGs as AWS describes them
/// (`asgs`; None when AWS could not be read: what was found there before
/// is kept). Keeps every other field as is.
pub fn validated_status(
    group: &NodeGroup,
    others: &[Arc<NodeGroup>],
    asgs: Option<&[crate::cloud::AsgDescription]>,
    current: &NodeGroupStatus,
    now: DateTime<Utc>,
) -> NodeGroupStatus {
    let generation = group.metadata.generation;
    let mut next = current.clone();
    let mut problems = group.spec.validate();
    problems.extend(asg_conflicts(group, others.iter().map(|g| g.as_ref())));
    match asgs {
        Some(asgs) => problems.extend(fallback_min_problems(group, asgs)),
        None => {
            let said = crate::crd::condition::find(&current.conditions, SPEC_VALID)
                .filter(|c| c.reason == crate::crd::nodegroup::FALLBACK_MIN_SIZE);
            if problems.is_empty() && said.is_some() {
                next.observed_generation = generation;
                next.desired_nodes = Some(group.spec.desired);
                return next;
            }
        }
    }
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
        let status = validated_status(&g, &[], Some(&[]), &NodeGroupStatus::default(), now);
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
        let first = validated_status(&g, &[], Some(&[]), &NodeGroupStatus::default(), t0);
        let second = validated_status(
            &g,
            &[],
            Some(&[]),
            &first,
            t0 + chrono::Duration::minutes(1),
        );
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
            let status = validated_status(me, &all, Some(&[]), &NodeGroupStatus::default(), now);
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
            assert!(g.invalid_outside_spec().is_some_and(|m| m.contains(other)));
        }
        // The same name in another region is another ASG; a group is never
        // in conflict with itself.
        let status = validated_status(
            &elsewhere,
            &all,
            Some(&[]),
            &NodeGroupStatus::default(),
            now,
        );
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::True, "{}", c.message);
        assert!(asg_conflicts(&b, [b.as_ref()]).is_empty());
        // Once one lets go, the other is valid again.
        let b_moved = named("b", serde_json::json!([{"name": "other"}]), None);
        let status = validated_status(
            &a,
            &[a.clone(), b_moved],
            Some(&[]),
            &NodeGroupStatus::default(),
            now,
        );
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

    /// Issue 54, hole 6: a fallback ASG with MinSize above 0 churned (each
    /// fallback node terminated at min relaunched, drained, terminated
    /// again). It is refused: SpecValid False, naming the ASG and the fix;
    /// nothing acts. A describe that fails keeps what was found.
    #[test]
    fn a_fallback_asg_whose_min_size_is_above_zero_makes_the_group_invalid() {
        use crate::controllers::group_view::tests::fresh;
        let now = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let g = group(
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "x"}], "desired": 3,
                               "fallback": {"autoScalingGroups": [{"name": "od"}]}}),
            2,
        );
        let mut od = fresh("od", &[("i-1", "InService")]);
        od.min = 1;
        let asgs = [fresh("x", &[]), od.clone()];
        let status = validated_status(&g, &[], Some(&asgs), &NodeGroupStatus::default(), now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason, crate::crd::nodegroup::FALLBACK_MIN_SIZE);
        assert!(
            c.message
                .contains("spec.fallback.autoScalingGroups[0].name"),
            "{}",
            c.message
        );
        assert!(c.message.contains("MinSize 1"), "{}", c.message);
        let mut invalid = g.clone();
        invalid.status = Some(status.clone());
        assert!(invalid.invalid_spec().is_some(), "nothing acts on it");
        // AWS unreadable: what was found stays.
        let kept = validated_status(&g, &[], None, &status, now + chrono::Duration::minutes(1));
        let c = crate::crd::condition::find(&kept.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.reason, crate::crd::nodegroup::FALLBACK_MIN_SIZE);
        // MinSize 0: valid again.
        od.min = 0;
        let asgs = [fresh("x", &[]), od];
        let status = validated_status(&g, &[], Some(&asgs), &status, now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::True, "{}", c.message);
        // A spot ASG at min 1 is no problem (kops's instance groups).
        let mut x = fresh("x", &[("i-2", "InService")]);
        x.min = 1;
        assert!(fallback_min_problems(&g, &[x]).is_empty());
    }
}
