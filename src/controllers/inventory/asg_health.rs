//! Pure: what the ASGs' state says of the group: the Degraded condition
//! (an ASG not found, or not launching) and the FallbackOnDemand one
//! (instances on the on-demand fallback, and why).

use crate::cloud::AsgDescription;
use crate::crd::NodeGroup;
use crate::crd::condition::ConditionStatus;
use crate::crd::nodegroup::AutoScalingGroupStatus;

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
    let short: Vec<String> = asgs
        .iter()
        .filter(|a| !a.fallback && !a.launching)
        .map(|a| {
            format!(
                "{} ({})",
                a.name,
                a.reason.as_deref().unwrap_or("not launching")
            )
        })
        .collect();
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
    let not_launching: Vec<String> = asg_statuses
        .iter()
        .filter(|a| !a.launching)
        .map(|a| {
            format!(
                "{} ({})",
                a.name,
                a.reason.as_deref().unwrap_or("not launching")
            )
        })
        .collect();
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
