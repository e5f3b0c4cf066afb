//! Pure: what the ASGs' state says of the group: the Degraded condition
//! (an ASG not found, or not launching) and the FallbackOnDemand one
//! (instances on the on-demand fallback, and why), and each ASG's record
//! of the last 24 hours (which pools to trust).

use crate::cloud::AsgDescription;
use crate::controllers::group_view::AsgView;
use crate::crd::NodeGroup;
use crate::crd::condition::ConditionStatus;
use crate::crd::nodegroup::{AutoScalingGroupStatus, NodeStatus};
use chrono::{DateTime, Utc};

/// The FallbackOnDemand condition: instances on the fallback ASGs, how
/// many, and the spot ASGs not launching (why it fell back).
pub(super) fn fallback(asgs: &[AutoScalingGroupStatus]) -> (ConditionStatus, &'static str, String) {
    let on: i32 = asgs
        .iter()
        .filter(|a| a.fallback)
        .map(|a| a.instances)
        .sum();
    if on == 0 {
        return (
            ConditionStatus::False,
            "OnSpot",
            "no instance on the on-demand fallback".into(),
        );
    }
    let short = not_launching(asgs.iter().filter(|a| !a.fallback));
    let why = match short.is_empty() {
        true => "spot launches again; returning".to_string(),
        false => format!("short: {}", short.join("; ")),
    };
    (
        ConditionStatus::True,
        "FallbackRaised",
        format!("{on} instance(s) on the on-demand fallback; {why}"),
    )
}

/// Of `asgs`, those not launching, each as "name (why)".
fn not_launching<'a>(asgs: impl Iterator<Item = &'a AutoScalingGroupStatus>) -> Vec<String> {
    asgs.filter(|a| !a.launching)
        .map(|a| {
            let why = a.reason.as_deref().unwrap_or("not launching");
            format!("{} ({why})", a.name)
        })
        .collect()
}

/// The Degraded condition: an ASG not found, or not launching.
pub(super) fn degradation(
    group: &NodeGroup,
    described: &[AsgDescription],
    asg_statuses: &[AutoScalingGroupStatus],
) -> (ConditionStatus, &'static str, String) {
    let names = group.spec.asg_names();
    let missing: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|name| !described.iter().any(|a| a.name == *name))
        .collect();
    let not_launching = not_launching(asg_statuses.iter());
    if !missing.is_empty() {
        (
            ConditionStatus::True,
            "AutoScalingGroupNotFound",
            format!("Auto Scaling Group(s) not found: {}", missing.join(", ")),
        )
    } else if !not_launching.is_empty() {
        (
            ConditionStatus::True,
            "NotLaunching",
            format!("not launching: {}", not_launching.join("; ")),
        )
    } else {
        (
            ConditionStatus::False,
            "AllLaunching",
            "every Auto Scaling Group is launching".to_string(),
        )
    }
}

/// The ASG's record of the last 24 hours, with this observation: the
/// notices on its members' nodes, a launch failure that starts now.
pub(super) fn pool_record(
    name: &str,
    view: &AsgView,
    before: Option<&AutoScalingGroupStatus>,
    members: &[NodeStatus],
    now: DateTime<Utc>,
) -> Vec<crate::crd::nodegroup::PoolEvent> {
    use crate::crd::nodegroup::PoolEventKind;
    let notices: Vec<(PoolEventKind, String, DateTime<Utc>)> = members
        .iter()
        .filter(|m| m.auto_scaling_group.as_deref() == Some(name))
        .filter_map(|m| {
            let i = m.interruption.as_ref()?;
            let kind = match i.kind.as_str() {
                "spot_interruption" => PoolEventKind::Interruption,
                "rebalance_recommendation" => PoolEventKind::Rebalance,
                _ => return None,
            };
            Some((kind, m.instance_id.clone()?, i.noticed))
        })
        .collect();
    crate::crd::nodegroup::update_record(
        before.map_or(&[][..], |b| b.recent.as_slice()),
        &notices,
        view.launch_failure.is_some(),
        before.is_some_and(|b| b.launch_failure.is_some()),
        now,
    )
}
