//! docs/reference/metrics.md, from the registry itself: each family's name,
//! type and help as `/metrics` serves them, and its labels as a series of
//! it carries them.

use crate::metrics::{Metrics, MutationLabels, RunLabels};
use std::collections::BTreeMap;

/// A registry with one series in every family, so each family's labels show
/// in the exposition (a family with no series has only its `# TYPE`).
pub fn with_every_series() -> Metrics {
    let m = Metrics::default();
    m.reconciled(
        "inventory",
        std::time::Duration::from_millis(5),
        Some("aws"),
    );
    m.aws_call("DescribeAutoScalingGroups");
    m.aws_call_failed("DescribeAutoScalingGroups", Some("Throttling"));
    m.drain("started");
    m.node_repair("repaired");
    m.refresh_run(crate::crd::refresher::RunResult::Succeeded);
    m.refresh_runs_started.inc();
    m.node_replacement_duration.observe(60.0);
    m.refresh_run_duration
        .get_or_create(&RunLabels {
            result: "Succeeded",
        })
        .observe(60.0);
    m.interruption_message("spot_interruption", "acted");
    m.interruption_age(std::time::Duration::from_secs(1));
    m.mutations
        .get_or_create(&MutationLabels {
            target: "aws",
            action: "set_desired_capacity",
            outcome: "performed",
        })
        .inc();
    // With a troubled condition: its series exists only then.
    let mut status = crate::crd::NodeGroupStatus::default();
    crate::crd::condition::set_condition(
        &mut status.conditions,
        crate::crd::condition::DEGRADED,
        crate::crd::ConditionStatus::True,
        "NotLaunching",
        "",
        None,
        chrono::DateTime::UNIX_EPOCH,
    );
    status.cost = Some(Default::default());
    m.group_observed("ns", "workers", &status);
    m.leader.set(1);
    m.controller_restarts.inc();
    m
}

/// One family of the exposition.
#[derive(Debug, Default)]
pub struct Family {
    pub kind: String,
    pub help: String,
    pub labels: Vec<String>,
    /// Whether a series of it was seen (its labels are known).
    pub sampled: bool,
}

/// The families of an exposition, by the name a query uses (a counter's
/// with `_total`).
pub fn families(exposition: &str) -> BTreeMap<String, Family> {
    let mut by_base: BTreeMap<String, Family> = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            by_base.entry(name.into()).or_default().help = help.trim_end_matches('.').into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            by_base.entry(name.into()).or_default().kind = kind.into();
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, _) = line.split_once(' ').unwrap_or((line, ""));
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let base = by_base
                .keys()
                .filter(|b| name.starts_with(b.as_str()))
                .max_by_key(|b| b.len())
                .cloned();
            let Some(family) = base.and_then(|b| by_base.get_mut(&b)) else {
                continue;
            };
            family.sampled = true;
            for pair in labels.trim_end_matches('}').split(',') {
                if let Some((key, _)) = pair.split_once('=')
                    && key != "le"
                    && !family.labels.iter().any(|l| l == key)
                {
                    family.labels.push(key.into());
                }
            }
        }
    }
    by_base
        .into_iter()
        .map(|(base, f)| {
            let name = if f.kind == "counter" {
                format!("{base}_total")
            } else {
                base
            };
            (name, f)
        })
        .collect()
}

pub fn page() -> String {
    let text = with_every_series().encode();
    let mut out = format!(
        "{}# Metrics\n\nServed at `/metrics` on the admin port (OpenMetrics). Labels are static strings, never node, instance or pod names; the per-group gauges carry the NodeGroup's namespace and name. The per-group and operation series move on the leader only (`spot_node_manager_leader` says which replica that is). A histogram is listed once, for its `_bucket`, `_sum` and `_count` series.\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n",
        super::HEADER
    );
    for (name, f) in families(&text) {
        let labels: Vec<String> = f.labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!(
            "| `{name}` | {} | {} | {} |\n",
            f.kind,
            labels.join(", "),
            super::schema::cell(&f.help)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_a_series_so_its_labels_are_listed() {
        let families = families(&with_every_series().encode());
        assert!(families.len() >= 20, "{families:?}");
        for (name, f) in &families {
            assert!(f.sampled, "{name} has no series in with_every_series()");
            assert!(f.help.len() > 15, "{name} says too little");
        }
        let drains = &families["spot_node_manager_drains_total"];
        assert_eq!(drains.labels, vec!["outcome"]);
        assert_eq!(drains.kind, "counter");
        let duration = &families["spot_node_manager_reconcile_duration_seconds"];
        assert_eq!(duration.labels, vec!["controller"]);
    }
}
