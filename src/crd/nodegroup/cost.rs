//! What a group's instances cost, as the inventory accounts it: instance
//! hours on spot and on demand, their dollars at the prices AWS quotes, what
//! the same hours would have cost on demand, and the saving, for the
//! current month and since the group began.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The cost record of a group (docs/concepts/cost.md says how it is made
/// and what it leaves out).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostRecord {
    /// The month `thisMonth` covers, as `YYYY-MM` in UTC.
    pub month: String,
    /// The current month's figures.
    pub this_month: CostFigures,
    /// Every month's figures, since `since`.
    pub total: CostFigures,
    /// The months before `month`, each with its figures as they stood when
    /// it ended: the oldest first, the latest 13 kept (so the same month a
    /// year before is there to compare).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub months: Vec<MonthCost>,
    /// The currency of every amount (the fields named `...Dollars`): `USD`,
    /// or `CNY` in China's regions, as AWS quotes their prices.
    #[serde(default = "usd")]
    pub currency: String,
    /// When the record began.
    pub since: DateTime<Utc>,
    /// Up to when the instances have been accounted for.
    pub accounted_until: DateTime<Utc>,
    /// This month's saving in one line (the `SAVINGS` column of
    /// `kubectl get ng -o wide`), e.g. `$12.34 (68%)`; `partial` while some
    /// of the month's hours are unpriced or unaccounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub savings: Option<String>,
    /// The latest spans no accounting covered (the manager down, or its
    /// inventory not syncing for longer than the gap bound): what ran
    /// then is not known, so their hours are in `unaccountedHours`, not in
    /// the figures. The newest last; at most 12 kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unaccounted: Vec<Unaccounted>,
}

fn usd() -> String {
    "USD".into()
}

/// A span no accounting covered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unaccounted {
    /// The last accounting before the gap.
    pub from: DateTime<Utc>,
    /// The first accounting after it.
    pub to: DateTime<Utc>,
}

/// A month that has ended, and its figures.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonthCost {
    /// The month, as `YYYY-MM` in UTC.
    pub month: String,
    /// Its figures: the hours within it, from its first midnight UTC to
    /// the next month's.
    #[serde(flatten)]
    pub figures: CostFigures,
}

/// Months kept in `CostRecord::months`.
pub const MONTHS_KEPT: usize = 13;

/// Spans kept in `CostRecord::unaccounted`.
pub const UNACCOUNTED_KEPT: usize = 12;

/// Instance hours and what they cost, in US dollars.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostFigures {
    /// Hours of spot instances.
    pub spot_instance_hours: f64,
    /// Hours of on-demand instances (the fallback's).
    pub on_demand_instance_hours: f64,
    /// What the spot hours cost at the spot prices of their zone and type.
    pub spot_dollars: f64,
    /// What the on-demand hours cost at the on-demand price of their type.
    pub on_demand_dollars: f64,
    /// What every priced hour would have cost on demand.
    pub on_demand_equivalent_dollars: f64,
    /// `onDemandEquivalentDollars` less what the hours cost.
    pub saving_dollars: f64,
    /// Hours of instances whose price (spot or on demand) was unknown: in
    /// the hours above, in none of the dollars.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpriced_instance_hours: f64,
    /// Wall-clock hours no accounting covered (`CostRecord::unaccounted`):
    /// the instances that ran then are in none of the figures above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unaccounted_hours: f64,
}

fn is_zero(hours: &f64) -> bool {
    *hours == 0.0
}
