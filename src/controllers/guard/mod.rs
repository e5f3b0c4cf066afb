//! The one vocabulary of safety refusals: every mutation a controller makes
//! is re-checked against this reconcile's fresh observations just before it
//! is made, and a check that refuses names itself with a [`Refusal`]. The
//! checks every controller shares (the group's own ASG, an active member,
//! desired changes within bounds, a removal from an ASG) live here; each
//! controller's own checks are a module of this one: `refresh` (a run's
//! desired changes, drains and terminations) and `replenish` (raises,
//! removals, retirements). The executors ask them, so no effects
//! implementation can forget to.

pub mod refresh;
pub mod replenish;

use crate::Error;
use crate::cloud::AsgDescription;
use crate::controllers::authority::rules::Reason;
use crate::controllers::group_view::DesiredChange;
use crate::crd::NodeGroup;

/// The check that refused a mutation, with what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A refresher mutation while no run is recorded.
    OutsideARun,
    NotTheGroupsAsg {
        asg: String,
    },
    /// A raise of an on-demand fallback ASG by anything but the
    /// replenisher's fallback (a refresh's surplus, a spot raise).
    FallbackRaise {
        asg: String,
    },
    NotTheGroupsNode {
        node: String,
    },
    AboveMax {
        asg: String,
        to: i32,
        max: i32,
    },
    StaleCount {
        asg: String,
        planned_from: i32,
        desired: i32,
    },
    /// Lowering desired below the active instances: AWS would pick a victim.
    AwsWouldPickAVictim {
        asg: String,
        to: i32,
        active: i32,
    },
    NotActive {
        instance: String,
        asg: String,
    },
    /// A refresh replacing a node its run did not plan.
    NotPlanned {
        instance: String,
    },
    TerminationNotRecorded {
        instance: String,
    },
    NotAboveRecordedCount {
        instance: String,
        asg: String,
        desired: i32,
        recorded: Option<i32>,
    },
    /// Removing a never-joined instance that a Node runs on after all.
    HasANode {
        instance: String,
    },
    DecrementAtMin {
        instance: String,
        asg: String,
    },
    /// Retiring an instance whose node records no loss.
    NotReclaimed {
        instance: String,
    },
    /// An interruption drain's effect on a node that does not carry, read
    /// afresh, a loss of ours whose drain is under way (`why` says which).
    NotLeaving {
        node: String,
        why: String,
    },
    /// Repairing a node that is Ready, or not NotReady for long enough.
    NotUnhealthy {
        node: String,
        timeout: String,
    },
    /// A step of a target whose record carries no reason, or one its
    /// path does not give such a target (a weaker reason would be free of
    /// rules that bind it).
    UnfitReason {
        instance: String,
        carried: Option<String>,
        fits: String,
    },
    /// A rule of the rule book refuses (`authority::validate`).
    Rule(crate::controllers::authority::validate::Refused),
    /// A mutation this path never makes (a refresher asked to retire).
    NotThisPath {
        what: String,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::OutsideARun => write!(f, "act outside a run"),
            Refusal::NotTheGroupsAsg { asg } => {
                write!(f, "touch {asg}: not one of the group's ASGs")
            }
            Refusal::FallbackRaise { asg } => write!(
                f,
                "raise {asg}: an on-demand fallback ASG is raised only while every spot ASG is short"
            ),
            Refusal::NotTheGroupsNode { node } => {
                write!(f, "touch node {node}: not one of the group's nodes")
            }
            Refusal::AboveMax { asg, to, max } => {
                write!(f, "set {asg} to {to}: above its max {max}")
            }
            Refusal::StaleCount {
                asg,
                planned_from,
                desired,
            } => write!(
                f,
                "set {asg}: planned from {planned_from}, desired is now {desired}"
            ),
            Refusal::AwsWouldPickAVictim { asg, to, active } => write!(
                f,
                "lower {asg} to {to}: {active} active instance(s), AWS would pick which to terminate"
            ),
            Refusal::NotActive { instance, asg } => {
                write!(f, "touch {instance}: not active in {asg}")
            }
            Refusal::NotPlanned { instance } => {
                write!(f, "replace {instance}: the run did not plan it")
            }
            Refusal::TerminationNotRecorded { instance } => {
                write!(f, "terminate {instance}: the termination is not recorded")
            }
            Refusal::NotAboveRecordedCount {
                instance,
                asg,
                desired,
                recorded,
            } => write!(
                f,
                "remove {instance} from {asg}: desired {desired} is not above the recorded {recorded:?}"
            ),
            Refusal::HasANode { instance } => write!(f, "remove {instance}: a Node runs on it"),
            Refusal::DecrementAtMin { instance, asg } => {
                write!(f, "remove {instance} with decrement: {asg} is at its min")
            }
            Refusal::NotThisPath { what } => write!(f, "{what}: not a mutation of this path"),
            Refusal::UnfitReason {
                instance,
                carried: None,
                fits,
            } => write!(
                f,
                "take {instance} away: its record carries no reason (its path gives {fits})"
            ),
            Refusal::UnfitReason {
                instance,
                carried: Some(carried),
                fits,
            } => write!(
                f,
                "take {instance} away for {carried}: its path gives it {fits}"
            ),
            Refusal::NotReclaimed { instance } => write!(
                f,
                "terminate {instance}: its node carries no spot interruption or scheduled change"
            ),
            Refusal::NotLeaving { node, why } => {
                write!(f, "drain node {node} for its interruption: {why}")
            }
            Refusal::NotUnhealthy { node, timeout } => write!(
                f,
                "repair {node}: it is not NotReady for over the unhealthy timeout ({timeout})"
            ),
            Refusal::Rule(refused) => write!(f, "{refused}"),
        }
    }
}

impl Refusal {
    /// Which check refused, as a fixed label (metrics, logs): the error's
    /// category, so a refusal stays typed all the way to the metric.
    pub fn check(&self) -> &'static str {
        match self {
            Refusal::OutsideARun => "refused_outside_a_run",
            Refusal::NotTheGroupsAsg { .. } => "refused_not_the_groups_asg",
            Refusal::FallbackRaise { .. } => "refused_fallback_raise",
            Refusal::NotTheGroupsNode { .. } => "refused_not_the_groups_node",
            Refusal::AboveMax { .. } => "refused_above_max",
            Refusal::StaleCount { .. } => "refused_stale_count",
            Refusal::AwsWouldPickAVictim { .. } => "refused_aws_would_pick_a_victim",
            Refusal::NotActive { .. } => "refused_not_active",
            Refusal::NotPlanned { .. } => "refused_not_planned",
            Refusal::TerminationNotRecorded { .. } => "refused_termination_not_recorded",
            Refusal::NotAboveRecordedCount { .. } => "refused_not_above_recorded_count",
            Refusal::HasANode { .. } => "refused_has_a_node",
            Refusal::DecrementAtMin { .. } => "refused_decrement_at_min",
            Refusal::NotReclaimed { .. } => "refused_not_reclaimed",
            Refusal::NotLeaving { .. } => "refused_not_leaving",
            Refusal::NotUnhealthy { .. } => "refused_not_unhealthy",
            Refusal::NotThisPath { .. } => "refused_not_this_path",
            Refusal::UnfitReason { .. } => "refused_unfit_reason",
            Refusal::Rule(refused) => refused.check(),
        }
    }
}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Error {
        tracing::warn!(%refusal, check = refusal.check(), "safety check");
        Error::Refused {
            check: refusal.check(),
            message: refusal.to_string(),
        }
    }
}

/// The reason a target carries (decided when its path chose it), when it
/// is one of `fits`: what its path gives such a target. A step of a
/// target that carries none, or another (a weaker reason would be free of
/// rules that bind the right one), is refused.
pub fn carried(instance: &str, label: Option<&str>, fits: &[Reason]) -> Result<Reason, Refusal> {
    match label.and_then(Reason::from_label) {
        Some(reason) if fits.contains(&reason) => Ok(reason),
        _ => Err(Refusal::UnfitReason {
            instance: instance.into(),
            carried: label.map(String::from),
            fits: fits
                .iter()
                .map(|r| r.label())
                .collect::<Vec<_>>()
                .join(" or "),
        }),
    }
}

/// No raise of an on-demand fallback ASG among `changes` (a refresh's
/// surplus never goes there).
pub fn no_fallback_raise(group: &NodeGroup, changes: &[DesiredChange]) -> Result<(), Refusal> {
    match changes
        .iter()
        .find(|c| c.to > c.from && group.spec.is_fallback(&c.asg))
    {
        Some(c) => Err(Refusal::FallbackRaise { asg: c.asg.clone() }),
        None => Ok(()),
    }
}

/// The group's ASG of that name, per the fresh describe.
pub fn groups_asg<'a>(
    group: &NodeGroup,
    fresh: &'a [AsgDescription],
    name: &str,
) -> Result<&'a AsgDescription, Refusal> {
    // (The on-demand fallback ASGs are the group's too.)
    let listed = group.spec.asg_names().iter().any(|r| r == name);
    fresh
        .iter()
        .find(|a| a.name == name && listed)
        .ok_or_else(|| Refusal::NotTheGroupsAsg { asg: name.into() })
}

/// The group's ASG of that name, with the instance active in it.
pub fn active_member<'a>(
    group: &NodeGroup,
    fresh: &'a [AsgDescription],
    asg_name: &str,
    instance: &str,
) -> Result<&'a AsgDescription, Refusal> {
    let asg = groups_asg(group, fresh, asg_name)?;
    if !asg
        .instances
        .iter()
        .any(|i| i.instance_id == instance && i.is_active())
    {
        return Err(Refusal::NotActive {
            instance: instance.into(),
            asg: asg_name.into(),
        });
    }
    Ok(asg)
}

/// The instance may leave its ASG: it is active in that ASG of the group,
/// and a termination with decrement keeps the ASG at or above its min.
pub fn removable(
    group: &NodeGroup,
    fresh: &[AsgDescription],
    asg_name: &str,
    instance: &str,
    decrement: bool,
) -> Result<(), Refusal> {
    let asg = active_member(group, fresh, asg_name, instance)?;
    if decrement && asg.desired <= asg.min {
        return Err(Refusal::DecrementAtMin {
            instance: instance.into(),
            asg: asg.name.clone(),
        });
    }
    Ok(())
}

/// Desired changes touch only the group's ASGs, never above their max,
/// never from a stale count, and never lower an ASG below its active
/// instances (AWS would then pick which to terminate).
pub fn desired_changes(
    group: &NodeGroup,
    fresh: &[AsgDescription],
    changes: &[DesiredChange],
) -> Result<(), Refusal> {
    for c in changes {
        let asg = groups_asg(group, fresh, &c.asg)?;
        let active = asg.active_instances() as i32;
        if c.to > asg.max {
            return Err(Refusal::AboveMax {
                asg: c.asg.clone(),
                to: c.to,
                max: asg.max,
            });
        }
        if c.from != asg.desired {
            return Err(Refusal::StaleCount {
                asg: c.asg.clone(),
                planned_from: c.from,
                desired: asg.desired,
            });
        }
        if c.to < c.from && c.to < active {
            return Err(Refusal::AwsWouldPickAVictim {
                asg: c.asg.clone(),
                to: c.to,
                active,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::authority::Blocked;
    use crate::controllers::authority::validate::Refused;

    #[test]
    fn a_refusal_stays_typed_in_the_errors_category() {
        let refused: Error = Refusal::Rule(Refused::Floor {
            instance: "i-1".into(),
            ready_besides: 1,
            needed: 2,
        })
        .into();
        assert_eq!(refused.category(), "refused_too_few_ready");
        assert_eq!(
            refused.to_string(),
            "refusing to terminate i-1: 1 other Ready node(s), 2 needed; until 2 other Ready node(s)"
        );
        let blocked: Error = Refusal::Rule(Refused::Masters(Blocked::ControlPlaneUnobserved {
            instance: "m-a".into(),
        }))
        .into();
        assert_eq!(blocked.category(), "refused_control_plane_unobserved");
        assert!(!blocked.is_expected_contention());
    }
}
