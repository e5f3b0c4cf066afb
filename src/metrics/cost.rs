//! Each NodeGroup's cost record as gauges (`status.cost`): dollars and
//! instance hours, this month and in all.

use super::Metrics;
use crate::crd::nodegroup::{CostFigures, CostRecord};
use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CostLabels {
    pub namespace: String,
    pub group: String,
    /// `month` (the current month) or `total` (since the record began).
    pub period: &'static str,
    /// Dollars: `spot`, `on_demand`, `on_demand_equivalent`, `saving`.
    /// Hours: `spot`, `on_demand`, `unpriced`, `unaccounted` (wall-clock
    /// hours no accounting covered).
    pub kind: &'static str,
}

const PERIODS: [&str; 2] = ["month", "total"];
const DOLLARS: [&str; 4] = ["spot", "on_demand", "on_demand_equivalent", "saving"];
const HOURS: [&str; 4] = ["spot", "on_demand", "unpriced", "unaccounted"];

fn dollars(f: &CostFigures) -> [f64; 4] {
    [
        f.spot_dollars,
        f.on_demand_dollars,
        f.on_demand_equivalent_dollars,
        f.saving_dollars,
    ]
}

fn hours(f: &CostFigures) -> [f64; 4] {
    [
        f.spot_instance_hours,
        f.on_demand_instance_hours,
        f.unpriced_instance_hours,
        f.unaccounted_hours,
    ]
}

impl Metrics {
    pub(super) fn register_cost(&mut self) {
        self.registry.register(
            "group_cost_dollars",
            "What a NodeGroup's instances cost in US dollars, from its status.cost: by period (month, total) and kind (spot, on_demand, on_demand_equivalent: the same hours on demand, saving)",
            self.group_cost_dollars.clone(),
        );
        self.registry.register(
            "group_instance_hours",
            "A NodeGroup's instance hours, from its status.cost: by period (month, total) and kind (spot, on_demand, unpriced: hours whose price was unknown, unaccounted: wall-clock hours no accounting covered, the manager down or its inventory not syncing)",
            self.group_instance_hours.clone(),
        );
    }

    /// Sets the group's cost gauges from its record (none without one).
    pub(super) fn cost_observed(&self, namespace: &str, group: &str, record: Option<&CostRecord>) {
        let Some(record) = record else {
            return;
        };
        for (period, figures) in PERIODS.into_iter().zip([&record.this_month, &record.total]) {
            let labels = |kind| CostLabels {
                namespace: namespace.into(),
                group: group.into(),
                period,
                kind,
            };
            for (kind, value) in DOLLARS.into_iter().zip(dollars(figures)) {
                self.group_cost_dollars
                    .get_or_create(&labels(kind))
                    .set(value);
            }
            for (kind, value) in HOURS.into_iter().zip(hours(figures)) {
                self.group_instance_hours
                    .get_or_create(&labels(kind))
                    .set(value);
            }
        }
    }

    pub(super) fn cost_forgotten(&self, namespace: &str, group: &str) {
        for period in PERIODS {
            let labels = |kind| CostLabels {
                namespace: namespace.into(),
                group: group.into(),
                period,
                kind,
            };
            for kind in DOLLARS {
                self.group_cost_dollars.remove(&labels(kind));
            }
            for kind in HOURS {
                self.group_instance_hours.remove(&labels(kind));
            }
        }
    }
}
