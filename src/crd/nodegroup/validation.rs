//! What the schema cannot check of a NodeGroup's spec (cron, time zones,
//! duration bounds, surplus for masters, duplicate ASGs), and the spec's
//! settings resolved with their defaults.

use super::{
    DRAIN_DEADLINE_BOUNDS, DrainTimeoutAction, NodeGroupSpec, RefreshSpec, Role,
    SCHEDULED_CHANGE_LEAD_BOUNDS,
};
use crate::duration;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The bounds of each duration of the spec, inclusive: (field, least, most).
/// `validate` reports one outside them as `SpecValid=False` naming the
/// field. The least guard against settings that turn a slow boot or a slow
/// drain into a termination (a 30 s join timeout removes every node that
/// boots slowly); the most are far above any sensible setting, far below
/// where time arithmetic could overflow.
pub const DURATION_BOUNDS: [(&str, std::time::Duration, std::time::Duration); 12] = [
    ("replenish.cooldown", secs(10), HOURS_24),
    ("replenish.joinTimeout", secs(120), HOURS_24),
    ("replenish.unhealthyTimeout", secs(60), HOURS_24),
    ("refresh.drainTimeout", secs(30), HOURS_24),
    ("refresh.readyTimeout", secs(60), HOURS_24),
    ("refresh.masterSettleTime", secs(0), secs(3600)),
    ("refresh.maxNodeAge", secs(3600), secs(8760 * 3600)),
    ("refresh.validationTimeout", secs(30), HOURS_24),
    ("refresh.settleTime", secs(0), secs(3600)),
    ("refresh.pauseTimeout", secs(60), secs(168 * 3600)),
    ("fallback.after", secs(60), HOURS_24),
    ("fallback.returnAfter", secs(60), HOURS_24),
];

const fn secs(s: u64) -> std::time::Duration {
    std::time::Duration::from_secs(s)
}

/// Set once a process talks to the emulator: see [`lift_duration_minima`].
static MINIMA_LIFTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lifts the least durations for this process. Tests compress time against
/// the emulator (a 3 s join timeout stands for minutes), so the manager calls
/// this only when `aws.emulatorAccount` is set, which a product build
/// refuses: a real cluster always gets the minimums.
pub fn lift_duration_minima() {
    MINIMA_LIFTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn minima_lifted() -> bool {
    MINIMA_LIFTED.load(std::sync::atomic::Ordering::Relaxed)
}

const HOURS_24: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// The most nodes a group may ask for (`desired`; the schema says so too).
pub const MAX_DESIRED: i32 = 10_000;
/// The most surplus nodes a refresh may add (`refresh.surplusNodes`).
pub const MAX_SURPLUS: i32 = 100;

/// A problem in a NodeGroup's spec that the schema cannot express.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// The field, as a path from `spec`.
    pub field: String,
    /// CamelCase reason for the condition.
    pub reason: &'static str,
    pub message: String,
}

/// The problems found so far, in the order they were found.
#[derive(Default)]
struct Problems(Vec<SpecProblem>);

impl Problems {
    fn push(&mut self, field: &str, reason: &'static str, message: String) {
        self.0.push(SpecProblem {
            field: field.to_string(),
            reason,
            message,
        });
    }
}

/// The spec's settings with defaults applied and strings parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedRefresh {
    /// None for a group with drift rolls and no scheduled refresh.
    pub schedule: Option<cron::Schedule>,
    pub time_zone: chrono_tz::Tz,
    pub surplus_nodes: i32,
    pub max_node_age: Option<std::time::Duration>,
    pub drain_timeout: std::time::Duration,
    pub drain_timeout_action: DrainTimeoutAction,
    pub ready_timeout: std::time::Duration,
    pub master_settle_time: std::time::Duration,
    pub validation_timeout: std::time::Duration,
    pub validation_timeout_action: DrainTimeoutAction,
    pub settle_time: std::time::Duration,
    pub max_surge: MaxSurge,
    /// How long a run may stay paused before it is set aside.
    pub pause_timeout: std::time::Duration,
}

/// `refresh.maxSurge`: replacements launched ahead, as a count or a
/// percentage of the group's desired count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxSurge {
    Count(i32),
    Percent(i32),
}

impl MaxSurge {
    pub const DEFAULT: MaxSurge = MaxSurge::Count(1);

    /// Parses the field (unset: the default). The error names the field.
    pub fn parse(value: Option<&IntOrString>) -> Result<MaxSurge, String> {
        let invalid = |v: &str| {
            format!("maxSurge: {v:?} is neither a count (0 or more) nor a percentage like \"25%\"")
        };
        match value {
            None => Ok(MaxSurge::DEFAULT),
            Some(IntOrString::Int(n)) if *n >= 0 => Ok(MaxSurge::Count(*n)),
            Some(IntOrString::Int(n)) => Err(invalid(&n.to_string())),
            Some(IntOrString::String(s)) => {
                let t = s.trim();
                match t.strip_suffix('%') {
                    Some(p) => match p.trim().parse::<i32>() {
                        Ok(p) if (0..=100).contains(&p) => Ok(MaxSurge::Percent(p)),
                        _ => Err(invalid(s)),
                    },
                    None => match t.parse::<i32>() {
                        Ok(n) if n >= 0 => Ok(MaxSurge::Count(n)),
                        _ => Err(invalid(s)),
                    },
                }
            }
        }
    }

    /// How many, for a group of `desired` nodes (a percentage rounds up).
    pub fn of(self, desired: i32) -> i32 {
        match self {
            MaxSurge::Count(n) => n,
            MaxSurge::Percent(p) => (desired.max(0) * p + 99) / 100,
        }
    }
}

impl RefreshSpec {
    /// Surplus with the role's default (1 for workers, 0 for masters).
    pub fn effective_surplus(&self, role: Role) -> i32 {
        self.surplus_nodes.unwrap_or(match role {
            Role::Worker => 1,
            Role::Master => 0,
        })
    }
}

impl NodeGroupSpec {
    /// The names of the group's Auto Scaling Groups.
    /// (With the on-demand fallback ASGs: they are described, inventoried
    /// and locked with the group's own.)
    pub fn asg_names(&self) -> Vec<String> {
        self.auto_scaling_groups
            .iter()
            .chain(self.fallback.iter().flat_map(|f| &f.auto_scaling_groups))
            .map(|a| a.name.clone())
            .collect()
    }

    /// Checks what the CRD schema cannot: cron syntax, time zone names, duration
    /// strings, surplus for masters, duplicate ASGs. Pure: no I/O, never panics.
    pub fn validate(&self) -> Vec<SpecProblem> {
        let mut problems = Problems::default();
        self.check_counts(&mut problems);
        self.check_durations(&mut problems);
        self.check_refresh(&mut problems);
        let zone = self.refresh.as_ref().map(|r| r.time_zone.as_str());
        for (field, reason, message) in self.disruption.problems(zone, minima_lifted()) {
            problems.push(&field, reason, message);
        }
        for (field, reason, message) in self.fallback_problems() {
            problems.push(&field, reason, message);
        }
        problems.0
    }

    /// `desired` in range; ASGs listed, named, each once.
    fn check_counts(&self, problems: &mut Problems) {
        if !(0..=MAX_DESIRED).contains(&self.desired) {
            problems.push(
                "desired",
                "InvalidDesired",
                format!(
                    "desired must be between 0 and {MAX_DESIRED}, got {}",
                    self.desired
                ),
            );
        }
        if self.auto_scaling_groups.is_empty() {
            problems.push(
                "autoScalingGroups",
                "NoAutoScalingGroups",
                "at least one Auto Scaling Group is required".into(),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, asg) in self.auto_scaling_groups.iter().enumerate() {
            if asg.name.trim().is_empty() {
                problems.push(
                    &format!("autoScalingGroups[{i}].name"),
                    "InvalidAutoScalingGroup",
                    "name must not be empty".into(),
                );
            } else if !seen.insert(asg.name.as_str()) {
                problems.push(
                    &format!("autoScalingGroups[{i}].name"),
                    "DuplicateAutoScalingGroup",
                    format!("Auto Scaling Group {:?} is listed twice", asg.name),
                );
            }
        }
    }

    /// Every duration parses and lies within its bounds.
    fn check_durations(&self, problems: &mut Problems) {
        let mut durations: Vec<(&str, &String)> = vec![
            ("replenish.cooldown", &self.replenish.cooldown),
            ("replenish.joinTimeout", &self.replenish.join_timeout),
            (
                "replenish.unhealthyTimeout",
                &self.replenish.unhealthy_timeout,
            ),
        ];
        if let Some(refresh) = &self.refresh {
            durations.push(("refresh.drainTimeout", &refresh.drain_timeout));
            durations.push(("refresh.readyTimeout", &refresh.ready_timeout));
            durations.push(("refresh.masterSettleTime", &refresh.master_settle_time));
            durations.push(("refresh.validationTimeout", &refresh.validation_timeout));
            durations.push(("refresh.settleTime", &refresh.settle_time));
            durations.push(("refresh.pauseTimeout", &refresh.pause_timeout));
            if let Some(age) = &refresh.max_node_age {
                durations.push(("refresh.maxNodeAge", age));
            }
        }
        if let Some(fallback) = &self.fallback {
            durations.push(("fallback.after", &fallback.after));
            durations.push(("fallback.returnAfter", &fallback.return_after));
        }
        for (field, value) in durations {
            let Some((_, least, most)) = DURATION_BOUNDS.iter().find(|(f, _, _)| *f == field)
            else {
                continue;
            };
            match duration::parse(value) {
                Err(e) => problems.push(field, "InvalidDuration", e.to_string()),
                Ok(d) if d > *most => problems.push(
                    field,
                    "InvalidDuration",
                    format!(
                        "{value} is longer than the most allowed, {}",
                        duration::format(*most)
                    ),
                ),
                Ok(d) if d < *least && !minima_lifted() => problems.push(
                    field,
                    "InvalidDuration",
                    format!(
                        "{value} is shorter than the least allowed, {}",
                        duration::format(*least)
                    ),
                ),
                Ok(_) => {}
            }
        }
        match duration::parse(&self.interruption.drain_deadline) {
            Err(e) => problems.push(
                "interruption.drainDeadline",
                "InvalidDuration",
                e.to_string(),
            ),
            Ok(d) if !(DRAIN_DEADLINE_BOUNDS.0..=DRAIN_DEADLINE_BOUNDS.1).contains(&d) => problems
                .push(
                    "interruption.drainDeadline",
                    "InvalidDuration",
                    format!(
                        "must be between {} and {} (a spot warning gives two minutes), got {}",
                        duration::format(DRAIN_DEADLINE_BOUNDS.0),
                        duration::format(DRAIN_DEADLINE_BOUNDS.1),
                        self.interruption.drain_deadline
                    ),
                ),
            Ok(_) => {}
        }
        let (least, most) = SCHEDULED_CHANGE_LEAD_BOUNDS;
        match duration::parse(&self.interruption.scheduled_change_lead) {
            Err(e) => problems.push(
                "interruption.scheduledChangeLead",
                "InvalidDuration",
                e.to_string(),
            ),
            Ok(d) if !(least..=most).contains(&d) => problems.push(
                "interruption.scheduledChangeLead",
                "InvalidDuration",
                format!(
                    "must be between {} and {} (a replacement needs minutes to join; AWS announces a retirement up to weeks ahead), got {}",
                    duration::format(least),
                    duration::format(most),
                    self.interruption.scheduled_change_lead
                ),
            ),
            Ok(_) => {}
        }
    }

    /// The schedule, its time zone, and surplus (none for masters).
    fn check_refresh(&self, problems: &mut Problems) {
        if let Some(refresh) = &self.refresh {
            if let Err(e) = parse_schedule(&refresh.schedule) {
                problems.push("refresh.schedule", "InvalidSchedule", e);
            }
            if let Err(e) = refresh.time_zone.parse::<chrono_tz::Tz>() {
                problems.push(
                    "refresh.timeZone",
                    "InvalidTimeZone",
                    format!("unknown IANA time zone {:?}: {e}", refresh.time_zone),
                );
            }
            match (self.role, refresh.surplus_nodes) {
                (_, Some(n)) if !(0..=MAX_SURPLUS).contains(&n) => problems.push(
                    "refresh.surplusNodes",
                    "InvalidSurplus",
                    format!("surplusNodes must be between 0 and {MAX_SURPLUS}, got {n}"),
                ),
                (Role::Master, Some(n)) if n > 0 => problems.push(
                    "refresh.surplusNodes",
                    "SurplusForMasters",
                    format!(
                        "surplusNodes must be 0 for masters (kops cannot run an extra master), got {n}"
                    ),
                ),
                _ => {}
            }
            if let Err(e) = MaxSurge::parse(refresh.max_surge.as_ref()) {
                problems.push("refresh.maxSurge", "InvalidMaxSurge", e);
            }
        }
    }

    /// `spec.disruption`, parsed in its zone (its own, the refresh's, else
    /// UTC); None while invalid ([`NodeGroupSpec::validate`] says why).
    pub fn resolved_disruption(&self) -> Option<super::ResolvedDisruption> {
        let zone = self.refresh.as_ref().map(|r| r.time_zone.as_str());
        self.disruption.resolve(zone)
    }

    /// The refresh settings, parsed; `None` when refresh is unset or invalid
    /// (callers report [`NodeGroupSpec::validate`] problems instead).
    pub fn resolved_refresh(&self) -> Option<ResolvedRefresh> {
        let refresh = self.refresh.as_ref()?;
        Some(ResolvedRefresh {
            schedule: Some(parse_schedule(&refresh.schedule).ok()?),
            time_zone: refresh.time_zone.parse().ok()?,
            surplus_nodes: refresh.effective_surplus(self.role),
            max_node_age: match &refresh.max_node_age {
                Some(v) => Some(duration::parse(v).ok()?),
                None => None,
            },
            drain_timeout: duration::parse(&refresh.drain_timeout).ok()?,
            drain_timeout_action: refresh.drain_timeout_action,
            ready_timeout: duration::parse(&refresh.ready_timeout).ok()?,
            master_settle_time: duration::parse(&refresh.master_settle_time).ok()?,
            validation_timeout: duration::parse(&refresh.validation_timeout).ok()?,
            validation_timeout_action: refresh.validation_timeout_action,
            settle_time: duration::parse(&refresh.settle_time).ok()?,
            max_surge: MaxSurge::parse(refresh.max_surge.as_ref()).ok()?,
            pause_timeout: duration::parse(&refresh.pause_timeout).ok()?,
        })
    }
}

/// Parses a cron expression. The cron crate wants 6 or 7 fields (seconds first,
/// optional year); users mostly write the classic 5-field form, so a 5-field
/// expression gets "0" seconds prepended.
pub fn parse_schedule(expr: &str) -> Result<cron::Schedule, String> {
    use std::str::FromStr;
    let fields = expr.split_whitespace().count();
    let normalized = match fields {
        5 => format!("0 {}", expr.trim()),
        6 | 7 => expr.trim().to_string(),
        n => {
            return Err(format!(
                "cron expression {expr:?} has {n} fields; expected 5 (min hour day month weekday), 6 (with seconds) or 7 (with year)"
            ));
        }
    };
    cron::Schedule::from_str(&normalized)
        .map_err(|e| format!("invalid cron expression {expr:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::nodegroup::*;

    pub(crate) fn worker_spec() -> NodeGroupSpec {
        NodeGroupSpec {
            drift: Default::default(),
            disruption: Default::default(),
            fallback: None,
            role: Role::Worker,
            region: None,
            auto_scaling_groups: vec![
                AutoScalingGroupRef {
                    name: "nodes-a".into(),
                },
                AutoScalingGroupRef {
                    name: "nodes-c".into(),
                },
            ],
            node_selector: None,
            desired: 3,
            max_not_ready_percent: None,
            suspend: false,
            replenish: ReplenishSpec::default(),
            interruption: InterruptionSpec::default(),
            refresh: Some(RefreshSpec {
                schedule: "0 3 * * 1".into(),
                time_zone: "Asia/Tokyo".into(),
                surplus_nodes: None,
                max_node_age: Some("168h".into()),
                drain_timeout: "5m".into(),
                drain_timeout_action: DrainTimeoutAction::Abort,
                ready_timeout: "15m".into(),
                master_settle_time: "2m".into(),
                validation_timeout: "10m".into(),
                validation_timeout_action: DrainTimeoutAction::Abort,
                settle_time: "5s".into(),
                max_surge: None,
                pause_timeout: "1h".into(),
            }),
        }
    }

    fn problems_of(spec: &NodeGroupSpec) -> Vec<(&'static str, String)> {
        spec.validate()
            .into_iter()
            .map(|p| (p.reason, p.field))
            .collect()
    }

    #[test]
    fn a_valid_spec_has_no_problems_and_resolves() {
        let spec = worker_spec();
        assert!(spec.validate().is_empty(), "{:?}", spec.validate());
        let resolved = spec.resolved_refresh().expect("resolves");
        assert_eq!(resolved.surplus_nodes, 1);
        assert_eq!(resolved.time_zone, chrono_tz::Asia::Tokyo);
        assert_eq!(
            resolved.max_node_age,
            Some(std::time::Duration::from_secs(168 * 3600))
        );
    }

    #[test]
    fn invalid_cron_is_reported_on_the_schedule_field() {
        let mut spec = worker_spec();
        spec.refresh.as_mut().unwrap().schedule = "every monday".into();
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidSchedule", "refresh.schedule".to_string())]
        );
        spec.refresh.as_mut().unwrap().schedule = "61 * * * *".into();
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidSchedule", "refresh.schedule".to_string())]
        );
        assert!(spec.resolved_refresh().is_none());
    }

    #[test]
    fn cron_with_and_without_seconds_is_accepted() {
        assert!(parse_schedule("0 3 * * Mon").is_ok());
        assert!(parse_schedule("30 0 3 * * Mon").is_ok());
        assert!(parse_schedule("0 0 3 * * Mon 2027").is_ok());
        assert!(parse_schedule("* *").is_err());
    }

    #[test]
    fn unknown_time_zone_is_reported() {
        let mut spec = worker_spec();
        spec.refresh.as_mut().unwrap().time_zone = "Mars/Olympus".into();
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidTimeZone", "refresh.timeZone".to_string())]
        );
    }

    #[test]
    fn surplus_for_masters_is_rejected_but_defaults_to_zero() {
        let mut spec = worker_spec();
        spec.role = Role::Master;
        assert!(spec.validate().is_empty());
        assert_eq!(spec.resolved_refresh().map(|r| r.surplus_nodes), Some(0));
        spec.refresh.as_mut().unwrap().surplus_nodes = Some(1);
        assert_eq!(
            problems_of(&spec),
            vec![("SurplusForMasters", "refresh.surplusNodes".to_string())]
        );
    }

    #[test]
    fn max_surge_is_a_count_or_a_percentage() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString as Ios;
        let parse = |v: Ios| MaxSurge::parse(Some(&v));
        assert_eq!(MaxSurge::parse(None), Ok(MaxSurge::Count(1)));
        assert_eq!(parse(Ios::Int(2)), Ok(MaxSurge::Count(2)));
        assert_eq!(parse(Ios::String("3".into())), Ok(MaxSurge::Count(3)));
        assert_eq!(
            parse(Ios::String(" 25% ".into())),
            Ok(MaxSurge::Percent(25))
        );
        for bad in ["-1", "150%", "a lot", "%", ""] {
            assert!(parse(Ios::String(bad.into())).is_err(), "{bad:?}");
        }
        assert!(parse(Ios::Int(-1)).is_err());
        let mut spec = worker_spec();
        spec.refresh.as_mut().expect("refresh").max_surge = Some(Ios::String("25%".into()));
        assert!(spec.validate().is_empty());
        assert_eq!(
            spec.resolved_refresh().map(|r| r.max_surge),
            Some(MaxSurge::Percent(25))
        );
        spec.refresh.as_mut().expect("refresh").max_surge = Some(Ios::String("half".into()));
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidMaxSurge", "refresh.maxSurge".to_string())]
        );
        assert_eq!(spec.resolved_refresh(), None);
    }

    #[test]
    fn a_huge_duration_or_count_is_refused_naming_its_field() {
        // Accepted by the schema's pattern: 9999999999h once panicked every
        // controller (DateTime + TimeDelta overflow).
        for (field, _, _) in DURATION_BOUNDS {
            let mut spec = worker_spec();
            let huge = "9999999999h".to_string();
            let refresh = spec.refresh.as_mut().expect("refresh");
            match field {
                "replenish.cooldown" => spec.replenish.cooldown = huge,
                "replenish.joinTimeout" => spec.replenish.join_timeout = huge,
                "replenish.unhealthyTimeout" => spec.replenish.unhealthy_timeout = huge,
                "refresh.drainTimeout" => refresh.drain_timeout = huge,
                "refresh.readyTimeout" => refresh.ready_timeout = huge,
                "refresh.masterSettleTime" => refresh.master_settle_time = huge,
                "refresh.validationTimeout" => refresh.validation_timeout = huge,
                "refresh.settleTime" => refresh.settle_time = huge,
                "refresh.pauseTimeout" => refresh.pause_timeout = huge,
                "refresh.maxNodeAge" => refresh.max_node_age = Some(huge),
                "fallback.after" => spec.fallback = Some(fallback(&huge, "10m")),
                "fallback.returnAfter" => spec.fallback = Some(fallback("3m", &huge)),
                other => panic!("no such field {other}"),
            }
            assert_eq!(
                problems_of(&spec),
                vec![("InvalidDuration", field.to_string())],
                "{field}"
            );
        }
        // At the maximum is fine; just past it is not.
        let mut spec = worker_spec();
        spec.replenish.join_timeout = "24h".into();
        assert!(spec.validate().is_empty());
        spec.replenish.join_timeout = "24h1ms".into();
        assert_eq!(
            problems_of(&spec),
            vec![("InvalidDuration", "replenish.joinTimeout".to_string())]
        );
        let mut spec = worker_spec();
        spec.desired = MAX_DESIRED + 1;
        spec.refresh.as_mut().expect("refresh").surplus_nodes = Some(i32::MAX);
        assert_eq!(
            problems_of(&spec),
            vec![
                ("InvalidDesired", "desired".to_string()),
                ("InvalidSurplus", "refresh.surplusNodes".to_string())
            ]
        );
    }

    fn fallback(after: &str, return_after: &str) -> super::super::FallbackSpec {
        super::super::FallbackSpec {
            auto_scaling_groups: vec![AutoScalingGroupRef {
                name: "nodes-od.example.com".into(),
            }],
            after: after.into(),
            return_after: return_after.into(),
        }
    }

    #[test]
    fn a_fallback_is_for_workers_on_asgs_of_its_own() {
        let mut spec = worker_spec();
        spec.fallback = Some(fallback("3m", "10m"));
        assert_eq!(problems_of(&spec), vec![]);
        assert!(
            spec.asg_names()
                .contains(&"nodes-od.example.com".to_string())
        );
        assert!(spec.is_fallback("nodes-od.example.com"));
        assert!(!spec.is_fallback(&spec.auto_scaling_groups[0].name.clone()));
        let resolved = spec.fallback.as_ref().expect("fallback").resolve();
        assert_eq!(resolved.after, std::time::Duration::from_secs(180));
        assert_eq!(resolved.return_after, std::time::Duration::from_secs(600));
        // A spot ASG named again as a fallback one.
        let mut twice = fallback("3m", "10m");
        twice.auto_scaling_groups[0].name = spec.auto_scaling_groups[0].name.clone();
        spec.fallback = Some(twice);
        assert_eq!(
            problems_of(&spec),
            vec![(
                "DuplicateAutoScalingGroup",
                "fallback.autoScalingGroups[0].name".to_string()
            )]
        );
        // Masters never fall back.
        let mut spec = worker_spec();
        spec.role = Role::Master;
        spec.refresh.as_mut().expect("refresh").surplus_nodes = None;
        let clean = problems_of(&spec);
        spec.fallback = Some(fallback("3m", "10m"));
        let mut with = problems_of(&spec);
        with.retain(|p| !clean.contains(p));
        assert_eq!(with, vec![("FallbackOnMasters", "fallback".to_string())]);
    }

    #[test]
    fn a_duration_below_its_least_is_refused_naming_its_field() {
        // Each process has the minimums unless it talks to the emulator;
        // this test process never lifts them.
        assert!(!minima_lifted());
        for (field, least, _) in DURATION_BOUNDS {
            let Some(below) = least.checked_sub(std::time::Duration::from_millis(1)) else {
                continue; // no least (masterSettleTime)
            };
            let below = format!("{}ms", below.as_millis());
            let at = format!("{}ms", least.as_millis());
            let set = |value: &str| {
                let mut spec = worker_spec();
                let refresh = spec.refresh.as_mut().expect("refresh");
                match field {
                    "replenish.cooldown" => spec.replenish.cooldown = value.into(),
                    "replenish.joinTimeout" => spec.replenish.join_timeout = value.into(),
                    "replenish.unhealthyTimeout" => spec.replenish.unhealthy_timeout = value.into(),
                    "refresh.drainTimeout" => refresh.drain_timeout = value.into(),
                    "refresh.readyTimeout" => refresh.ready_timeout = value.into(),
                    "refresh.maxNodeAge" => refresh.max_node_age = Some(value.into()),
                    "refresh.validationTimeout" => refresh.validation_timeout = value.into(),
                    "refresh.pauseTimeout" => refresh.pause_timeout = value.into(),
                    "fallback.after" => spec.fallback = Some(fallback(value, "10m")),
                    "fallback.returnAfter" => spec.fallback = Some(fallback("3m", value)),
                    other => panic!("no such field {other}"),
                }
                problems_of(&spec)
            };
            assert_eq!(set(&at), vec![], "{field} at its least");
            assert_eq!(
                set(&below),
                vec![("InvalidDuration", field.to_string())],
                "{field} below its least"
            );
        }
        // The case: a 30 s join timeout.
        let mut spec = worker_spec();
        spec.replenish.join_timeout = "30s".into();
        let problems = spec.validate();
        assert!(
            problems[0]
                .message
                .contains("shorter than the least allowed, 2m"),
            "{problems:?}"
        );
    }

    /// Whatever a user writes that the schema's pattern lets through,
    /// validation answers without panicking, and a spec it accepts resolves
    /// to durations and counts within the documented bounds. Draws are
    /// mostly valid (each field in bounds nine times in ten), so both the
    /// accepting and the refusing branch run many times; the test fails
    /// when either runs too rarely to mean anything.
    #[test]
    fn validation_never_panics_and_what_it_accepts_is_bounded() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        use std::cell::Cell;
        use std::time::Duration;
        const CASES: u32 = 256;
        let bounds = |field: &str| {
            let (_, least, most) = DURATION_BOUNDS
                .iter()
                .find(|(f, _, _)| *f == field)
                .expect("a bounded field");
            (least.as_secs(), most.as_secs())
        };
        let duration = move |field: &str| {
            let (least, most) = bounds(field);
            prop_oneof![
                9 => (least..=most).prop_map(|s| crate::duration::format(Duration::from_secs(s))),
                1 => "([0-9]{1,20}(ms|s|m|h)){1,3}",
            ]
        };
        let strategy = (
            duration("replenish.cooldown"),
            duration("replenish.joinTimeout"),
            duration("refresh.drainTimeout"),
            proptest::option::of(duration("refresh.maxNodeAge")),
            prop_oneof![9 => 0..=MAX_DESIRED, 1 => any::<i32>()],
            proptest::option::of(prop_oneof![9 => 0..=MAX_SURPLUS, 1 => any::<i32>()]),
        );
        let (accepted, refused) = (Cell::new(0u32), Cell::new(0u32));
        let mut runner = TestRunner::new(Config::with_cases(CASES));
        let outcome = runner.run(
            &strategy,
            |(cooldown, join, drain, age, desired, surplus)| {
                let mut spec = worker_spec();
                spec.replenish.cooldown = cooldown;
                spec.replenish.join_timeout = join;
                spec.desired = desired;
                let refresh = spec.refresh.as_mut().expect("refresh");
                refresh.drain_timeout = drain;
                refresh.max_node_age = age;
                refresh.surplus_nodes = surplus;
                let problems = spec.validate();
                if !problems.is_empty() {
                    refused.set(refused.get() + 1);
                    return Ok(());
                }
                accepted.set(accepted.get() + 1);
                let r = spec.resolved_refresh().expect("resolves when valid");
                prop_assert!(r.drain_timeout <= HOURS_24);
                prop_assert!(r.drain_timeout >= Duration::from_secs(30));
                prop_assert!(r.max_node_age.is_none_or(|a| a <= DURATION_BOUNDS[6].2));
                prop_assert!((0..=MAX_DESIRED).contains(&spec.desired));
                prop_assert!((0..=MAX_SURPLUS).contains(&r.surplus_nodes));
                for d in [&spec.replenish.cooldown, &spec.replenish.join_timeout] {
                    let parsed = crate::duration::parse(d).expect("valid");
                    prop_assert!(parsed <= HOURS_24);
                    prop_assert!(parsed >= Duration::from_secs(10));
                }
                Ok(())
            },
        );
        if let Err(failure) = outcome {
            panic!("{failure}");
        }
        assert!(
            accepted.get() >= CASES / 4 && refused.get() >= CASES / 20,
            "accepted {} and refused {} of {CASES}: draws must exercise both branches",
            accepted.get(),
            refused.get()
        );
    }

    #[test]
    fn negative_counts_and_bad_durations_are_reported() {
        let mut spec = worker_spec();
        spec.desired = -1;
        spec.replenish.cooldown = "5 minutes".into();
        spec.refresh.as_mut().unwrap().surplus_nodes = Some(-2);
        spec.refresh.as_mut().unwrap().max_node_age = Some("7d".into());
        let got = problems_of(&spec);
        assert!(
            got.contains(&("InvalidDesired", "desired".into())),
            "{got:?}"
        );
        assert!(
            got.contains(&("InvalidDuration", "replenish.cooldown".into())),
            "{got:?}"
        );
        assert!(
            got.contains(&("InvalidSurplus", "refresh.surplusNodes".into())),
            "{got:?}"
        );
        assert!(
            got.contains(&("InvalidDuration", "refresh.maxNodeAge".into())),
            "{got:?}"
        );
    }

    #[test]
    fn duplicate_and_missing_asgs_are_reported() {
        let mut spec = worker_spec();
        spec.auto_scaling_groups.push(AutoScalingGroupRef {
            name: "nodes-a".into(),
        });
        assert_eq!(
            problems_of(&spec),
            vec![(
                "DuplicateAutoScalingGroup",
                "autoScalingGroups[2].name".to_string()
            )]
        );
        spec.auto_scaling_groups.clear();
        assert_eq!(
            problems_of(&spec),
            vec![("NoAutoScalingGroups", "autoScalingGroups".to_string())]
        );
    }

    #[test]
    fn defaults_apply_when_fields_are_omitted() {
        let spec: NodeGroupSpec = serde_json::from_value(serde_json::json!({
            "role": "Worker",
            "autoScalingGroups": [{"name": "nodes-a"}],
            "desired": 2,
            "refresh": {"schedule": "0 3 * * *"}
        }))
        .expect("parses");
        assert!(spec.replenish.enabled);
        assert_eq!(spec.replenish.cooldown, "5m");
        assert_eq!(spec.replenish.join_timeout, "15m");
        let refresh = spec.refresh.as_ref().expect("refresh");
        assert_eq!(refresh.time_zone, "UTC");
        assert_eq!(refresh.drain_timeout, "5m");
        assert_eq!(refresh.drain_timeout_action, DrainTimeoutAction::Abort);
        assert_eq!(refresh.ready_timeout, "15m");
        assert_eq!(refresh.effective_surplus(spec.role), 1);
    }

    #[test]
    fn the_drain_deadline_must_fit_in_a_spot_warning() {
        let mut spec = worker_spec();
        assert_eq!(spec.interruption.drain_deadline(), DEFAULT_DRAIN_DEADLINE);
        for bad in ["5s", "3m", "soon"] {
            spec.interruption.drain_deadline = bad.into();
            let problems = spec.validate();
            assert!(
                problems
                    .iter()
                    .any(|p| p.field == "interruption.drainDeadline"),
                "{bad}: {problems:?}"
            );
            assert_eq!(spec.interruption.drain_deadline(), DEFAULT_DRAIN_DEADLINE);
        }
        spec.interruption.drain_deadline = "60s".into();
        assert!(spec.validate().is_empty(), "{:?}", spec.validate());
        assert_eq!(
            spec.interruption.drain_deadline(),
            std::time::Duration::from_secs(60)
        );
    }

    #[test]
    fn the_scheduled_change_lead_leaves_a_replacement_time_and_defaults_to_an_hour() {
        use super::super::DEFAULT_SCHEDULED_CHANGE_LEAD;
        let mut spec = worker_spec();
        assert_eq!(
            spec.interruption.scheduled_change_lead(),
            DEFAULT_SCHEDULED_CHANGE_LEAD
        );
        assert_eq!(DEFAULT_SCHEDULED_CHANGE_LEAD.as_secs(), 3600);
        for bad in ["5m", "721h", "later"] {
            spec.interruption.scheduled_change_lead = bad.into();
            let problems = spec.validate();
            assert!(
                problems
                    .iter()
                    .any(|p| p.field == "interruption.scheduledChangeLead"),
                "{bad}: {problems:?}"
            );
            assert_eq!(
                spec.interruption.scheduled_change_lead(),
                DEFAULT_SCHEDULED_CHANGE_LEAD
            );
        }
        spec.interruption.scheduled_change_lead = "48h".into();
        assert!(spec.validate().is_empty(), "{:?}", spec.validate());
        assert_eq!(
            spec.interruption.scheduled_change_lead(),
            std::time::Duration::from_secs(48 * 3600)
        );
    }
}
