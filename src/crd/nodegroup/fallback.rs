//! `spec.fallback`: on-demand ASGs a worker group falls back to when every
//! spot ASG of it is short at once, and returns from once spot launches
//! again (docs/concepts/fallback.md).

use super::{AutoScalingGroupRef, NodeGroupSpec, Role};
use crate::duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSpec {
    /// On-demand ASGs, in the same shape as `autoScalingGroups`: kops
    /// instance groups with an on-demand launch template and `minSize: 0`.
    /// Inventoried with the group (their nodes count as its Ready nodes),
    /// never in its layout: raised only while every spot ASG is short,
    /// emptied once spot launches again. Workers only.
    #[schemars(length(min = 1))]
    pub auto_scaling_groups: Vec<AutoScalingGroupRef>,
    /// How long Ready must stay below `desired` with no spot ASG of the
    /// group able to launch (each failing its launches, at max, or backing
    /// off) before the fallback is raised, by the missing count. Default
    /// `3m`; 1m to 24h.
    #[serde(default = "default_after")]
    pub after: String,
    /// How long a spot ASG must have been launching (no failed launch)
    /// before a fallback node is replaced by spot: a spot node raised and
    /// Ready first, then the fallback node drained (budgets, windows and
    /// do-not-disrupt respected) and terminated with decrement. A spot ASG
    /// that fails again restarts its clock. Default `10m`; 1m to 24h.
    #[serde(default = "default_return_after")]
    pub return_after: String,
}

fn default_after() -> String {
    "3m".into()
}

fn default_return_after() -> String {
    "10m".into()
}

/// The defaults when a duration does not parse (validation reports it).
const DEFAULT_AFTER: Duration = Duration::from_secs(180);
const DEFAULT_RETURN_AFTER: Duration = Duration::from_secs(600);

/// `spec.fallback` resolved: what the replenisher decides with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedFallback {
    pub after: Duration,
    pub return_after: Duration,
}

impl FallbackSpec {
    pub fn resolve(&self) -> ResolvedFallback {
        ResolvedFallback {
            after: duration::parse(&self.after).unwrap_or(DEFAULT_AFTER),
            return_after: duration::parse(&self.return_after).unwrap_or(DEFAULT_RETURN_AFTER),
        }
    }
}

impl NodeGroupSpec {
    /// Whether `asg` is one of the group's on-demand fallback ASGs.
    pub fn is_fallback(&self, asg: &str) -> bool {
        self.fallback
            .as_ref()
            .is_some_and(|f| f.auto_scaling_groups.iter().any(|a| a.name == asg))
    }

    /// What a fallback ASG or its settings get wrong: (field, reason,
    /// message). Masters never fall back (a master is replaced only in its
    /// own ASG); a fallback ASG is named once, and never as a spot one.
    pub(super) fn fallback_problems(&self) -> Vec<(String, &'static str, String)> {
        let Some(fallback) = &self.fallback else {
            return vec![];
        };
        let mut out = vec![];
        if self.role == Role::Master {
            out.push((
                "fallback".to_string(),
                "FallbackOnMasters",
                "fallback is for workers: a master is replaced only in its own ASG".to_string(),
            ));
        }
        if fallback.auto_scaling_groups.is_empty() {
            out.push((
                "fallback.autoScalingGroups".to_string(),
                "NoAutoScalingGroups",
                "at least one fallback Auto Scaling Group is required".to_string(),
            ));
        }
        let mut seen: std::collections::BTreeSet<&str> = self
            .auto_scaling_groups
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        for (i, asg) in fallback.auto_scaling_groups.iter().enumerate() {
            let field = format!("fallback.autoScalingGroups[{i}].name");
            if asg.name.trim().is_empty() {
                out.push((
                    field,
                    "InvalidAutoScalingGroup",
                    "name must not be empty".into(),
                ));
            } else if !seen.insert(asg.name.as_str()) {
                out.push((
                    field,
                    "DuplicateAutoScalingGroup",
                    format!(
                        "Auto Scaling Group {:?} is listed twice (a fallback ASG is never a spot one)",
                        asg.name
                    ),
                ));
            }
        }
        out
    }
}
