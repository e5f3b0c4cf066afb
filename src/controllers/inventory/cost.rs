//! The group's cost record (`status.cost`), accounted at a sync once
//! `costInterval` has passed since the last accounting (so a settled group's
//! status is not rewritten at every resync): the instances seen running, the
//! hours since then, at the prices AWS quotes now.

use super::plan::AwsView;
use crate::cloud::prices::{KnownPrices, PriceBook};
use crate::cloud::{Cloud, Lifecycle};
use crate::crd::NodeGroup;
use crate::crd::condition::{COST_KNOWN, ConditionStatus, set_condition};
use crate::crd::nodegroup::{
    CostFigures, CostRecord, MONTHS_KEPT, MonthCost, NodeGroupStatus, UNACCOUNTED_KEPT, Unaccounted,
};
use chrono::{DateTime, Datelike, Utc};
use std::collections::BTreeSet;
use std::time::Duration;

/// When an accounting is due, and the longest gap it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// `costInterval`: an accounting once this has passed since the last.
    pub every: Duration,
    /// A gap longer than this (the manager down, its inventory not
    /// syncing) is not covered: which instances ran then is not known, so
    /// it is recorded as unaccounted rather than guessed.
    pub bound: Duration,
}

impl Cadence {
    /// The bound for `costInterval` and `resyncInterval`: twice the longest
    /// a running manager's accountings are apart (an accounting falls due,
    /// then the next sync makes it), at least a minute, so no setting drops
    /// hours while the manager runs.
    pub fn of(every: Duration, resync: Duration) -> Cadence {
        let bound = (every + resync)
            .saturating_mul(2)
            .max(Duration::from_secs(60));
        Cadence { every, bound }
    }
}

/// How long a gap is said in `CostKnown` after it ended.
pub const GAP_SAID: Duration = Duration::from_secs(3600);

/// An instance billed now: its type, zone, and whether it is spot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub instance_type: String,
    pub zone: String,
    pub spot: bool,
}

/// Whether AWS bills an ASG instance in this lifecycle state: from its
/// launch ("You are billed for instances as soon as they are launched,
/// including the time that they are not yet in service": the EC2 Auto
/// Scaling user guide, ec2-auto-scaling-lifecycle) until it is terminated,
/// on standby and while it detaches included. Not once `Terminated` or
/// `Detached` (no longer the group's), nor in a warm pool unless running.
/// The ASG's state, read at every sync, not EC2's, which the inventory
/// remembers between reads; an instance a user stopped on standby is
/// counted as running.
pub fn billed(lifecycle_state: &str) -> bool {
    match lifecycle_state {
        "InService" | "EnteringStandby" | "Standby" | "Detaching" | "Warmed:Running" => true,
        s => s.starts_with("Pending") || s.starts_with("Terminating"),
    }
}

/// The instances of the group's ASGs that AWS bills ([`billed`]). Spot or on demand as EC2 described
/// the instance; an instance not described is taken as its ASG launches
/// (the fallback ASGs on demand, the others spot).
pub fn running(view: &AwsView, fallback_asgs: &BTreeSet<String>) -> Vec<Running> {
    // Looked up once per instance: a scan each would be quadratic in the
    // group's size at every sync.
    let lifecycles: std::collections::HashMap<&str, Lifecycle> = view
        .instances
        .iter()
        .map(|d| (d.instance_id.as_str(), d.lifecycle))
        .collect();
    let mut out = vec![];
    for asg in &view.asgs {
        for i in &asg.instances {
            let (Some(instance_type), Some(zone)) = (&i.instance_type, &i.availability_zone) else {
                continue;
            };
            if !billed(&i.lifecycle_state) {
                continue;
            }
            let spot = match lifecycles.get(i.instance_id.as_str()) {
                Some(lifecycle) => *lifecycle == Lifecycle::Spot,
                None => !fallback_asgs.contains(&asg.name),
            };
            out.push(Running {
                instance_type: instance_type.clone(),
                zone: zone.clone(),
                spot,
            });
        }
    }
    out
}

/// The instance types the running instances have: the prices to know.
pub fn types_of(running: &[Running]) -> BTreeSet<String> {
    running.iter().map(|r| r.instance_type.clone()).collect()
}

/// Pure: the record after accounting `running` at `prices` up to `now`.
/// The first sync starts an empty record; a sync before `every` has
/// passed leaves it as it is. An interval that crosses midnight UTC on a
/// month's first day is split there: each month gets its own hours.
pub fn account(
    previous: Option<&CostRecord>,
    running: &[Running],
    prices: &KnownPrices,
    now: DateTime<Utc>,
    cadence: Cadence,
) -> CostRecord {
    let Some(previous) = previous else {
        return CostRecord {
            month: month_of(now),
            currency: prices.currency.into(),
            since: now,
            accounted_until: now,
            ..Default::default()
        };
    };
    let elapsed = (now - previous.accounted_until)
        .to_std()
        .unwrap_or_default();
    if elapsed < cadence.every {
        return previous.clone();
    }
    // Past the bound nobody looked: what ran then is not known.
    let unaccounted = elapsed > cadence.bound;
    let mut next = previous.clone();
    for (month, hours) in by_month(previous.accounted_until, now) {
        enter(&mut next, month);
        if unaccounted {
            next.this_month.unaccounted_hours += hours;
            next.total.unaccounted_hours += hours;
            continue;
        }
        for instance in running {
            add(&mut next.this_month, instance, hours, prices);
            add(&mut next.total, instance, hours, prices);
        }
    }
    if unaccounted {
        next.unaccounted.push(Unaccounted {
            from: previous.accounted_until,
            to: now,
        });
        let over = next.unaccounted.len().saturating_sub(UNACCOUNTED_KEPT);
        next.unaccounted.drain(..over);
    }
    next.accounted_until = now;
    next.currency = prices.currency.into();
    next.savings = savings_text(&next.this_month, &next.currency);
    next
}

/// `YYYY-MM`, in UTC.
fn month_of(t: DateTime<Utc>) -> String {
    t.format("%Y-%m").to_string()
}

/// Midnight UTC on the first day of the month after `t`'s (None past the
/// calendar's end).
fn next_month(t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let (year, month) = match t.month() {
        12 => (t.year().checked_add(1)?, 1),
        m => (t.year(), m + 1),
    };
    let day = chrono::NaiveDate::from_ymd_opt(year, month, 1)?;
    Some(day.and_hms_opt(0, 0, 0)?.and_utc())
}

/// The hours from `from` to `to` in each month they cross, in order.
fn by_month(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<(String, f64)> {
    let mut out = vec![];
    let mut start = from;
    while start < to {
        let end = next_month(start).map_or(to, |n| n.min(to));
        let hours = (end - start).to_std().unwrap_or_default().as_secs_f64() / 3600.0;
        out.push((month_of(start), hours));
        start = end;
    }
    out
}

/// Makes `month` the record's current month: the month it had is closed
/// into `months` (the latest [`MONTHS_KEPT`] kept) and a new one begins.
fn enter(record: &mut CostRecord, month: String) {
    if record.month == month {
        return;
    }
    let ended = MonthCost {
        month: std::mem::replace(&mut record.month, month),
        figures: std::mem::take(&mut record.this_month),
    };
    record.months.push(ended);
    let over = record.months.len().saturating_sub(MONTHS_KEPT);
    record.months.drain(..over);
}

/// Adds one instance's `hours` to `figures`. Its dollars only when both
/// its own price and its type's on-demand price are known: a saving made
/// of half-priced hours would mislead.
fn add(figures: &mut CostFigures, instance: &Running, hours: f64, prices: &KnownPrices) {
    let on_demand = prices.on_demand.get(&instance.instance_type).copied();
    let own = match instance.spot {
        true => {
            figures.spot_instance_hours += hours;
            let key = (instance.instance_type.clone(), instance.zone.clone());
            prices.spot.get(&key).copied()
        }
        false => {
            figures.on_demand_instance_hours += hours;
            on_demand
        }
    };
    let (Some(own), Some(on_demand)) = (own, on_demand) else {
        figures.unpriced_instance_hours += hours;
        return;
    };
    match instance.spot {
        true => figures.spot_dollars += hours * own,
        false => figures.on_demand_dollars += hours * own,
    }
    figures.on_demand_equivalent_dollars += hours * on_demand;
    figures.saving_dollars += hours * (on_demand - own);
}

/// `$12.34 (68%)` (`12.34 CNY (68%)` in yuan): the saving and its share of
/// the on-demand equivalent. Marked partial while some of the month's hours
/// are unpriced or unaccounted: the saving is then of part of them only.
fn savings_text(f: &CostFigures, currency: &str) -> Option<String> {
    (f.on_demand_equivalent_dollars > 0.0).then(|| {
        let share = 100.0 * f.saving_dollars / f.on_demand_equivalent_dollars;
        let partial = f.unpriced_instance_hours > 0.0 || f.unaccounted_hours > 0.0;
        let partial = if partial { ", partial" } else { "" };
        let saving = crate::cloud::prices::money(currency, format!("{:.2}", f.saving_dollars));
        format!("{saving} ({share:.0}%{partial})")
    })
}

/// What the running instances lack a price for, as the accounting will
/// find it: a zone the spot answer lists no price in, a type without an
/// on-demand price (one line each).
fn unpriced(running: &[Running], prices: &KnownPrices) -> Vec<String> {
    let mut lines = BTreeSet::new();
    for r in running {
        let key = (r.instance_type.clone(), r.zone.clone());
        if r.spot && !prices.spot.contains_key(&key) {
            lines.insert(format!(
                "no spot price for {} in {}",
                r.instance_type, r.zone
            ));
        }
        if !prices.on_demand.contains_key(&r.instance_type) {
            lines.insert(format!("no on-demand price for {}", r.instance_type));
        }
    }
    lines.into_iter().collect()
}

/// Each ASG's spot price on `next` (`autoScalingGroups[].spotPrice`): the
/// price of the instance type most of its instances run, in their zone. An
/// ASG with no instance keeps the price it had.
pub fn set_pool_prices(next: &mut NodeGroupStatus, view: &AwsView, prices: &KnownPrices) {
    for status in &mut next.auto_scaling_groups {
        let Some(asg) = view.asgs.iter().find(|a| a.name == status.name) else {
            continue;
        };
        let mut seen: std::collections::BTreeMap<(String, String), usize> = Default::default();
        for i in asg.instances.iter().filter(|i| i.is_active()) {
            if let (Some(t), Some(z)) = (&i.instance_type, &i.availability_zone) {
                *seen.entry((t.clone(), z.clone())).or_default() += 1;
            }
        }
        let Some(most) = seen.into_iter().max_by_key(|(_, n)| *n).map(|(key, _)| key) else {
            continue;
        };
        if let Some(price) = prices.spot.get(&most) {
            status.spot_price = Some(format!("{price:.6}"));
        }
        if let Some(price) = prices.on_demand.get(&most.0) {
            status.on_demand_price = Some(format!("{price:.6}"));
        }
    }
}

/// The group's cost record and pool prices on `next`: its running
/// instances' hours at the prices known (`prices` reads them at most
/// hourly, spot, and daily, on demand).
pub async fn account_group(
    prices: &PriceBook,
    cloud: &dyn Cloud,
    group: &NodeGroup,
    view: &AwsView,
    next: &mut NodeGroupStatus,
    cadence: Cadence,
    now: DateTime<Utc>,
) {
    let fallback: BTreeSet<String> = group
        .spec
        .fallback
        .iter()
        .flat_map(|f| f.auto_scaling_groups.iter().map(|a| a.name.clone()))
        .collect();
    let running = running(view, &fallback);
    let region = group.spec.region.clone().unwrap_or_default();
    let known = prices
        .prices(cloud, &region, &types_of(&running), now)
        .await;
    let generation = group.metadata.generation;
    set_cost(next, &running, &known, cadence, generation, now);
    set_pool_prices(next, view, &known);
}

/// A gap said in `CostKnown`: its span, and the month's unaccounted hours.
fn gap_text(gap: &Unaccounted, record: &CostRecord) -> String {
    let hours = (gap.to - gap.from).num_seconds() as f64 / 3600.0;
    format!(
        "no accounting from {} to {} ({hours:.2} h: the manager down, or its inventory not syncing): what ran then is not known, so those hours are in unaccountedHours ({:.2} h this month), not in the figures",
        gap.from.to_rfc3339(),
        gap.to.to_rfc3339(),
        record.this_month.unaccounted_hours
    )
}

/// Sets the group's cost record and its `CostKnown` condition on `next`.
pub fn set_cost(
    next: &mut NodeGroupStatus,
    running: &[Running],
    prices: &KnownPrices,
    cadence: Cadence,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    let record = account(next.cost.as_ref(), running, prices, now, cadence);
    let gap = record
        .unaccounted
        .last()
        .filter(|g| now < crate::controllers::group_view::after(g.to, GAP_SAID))
        .map(|g| gap_text(g, &record));
    next.cost = Some(record);
    // From the accounting itself: the reads' failures, or else what the
    // running instances lack a price for (a zone the answer left out).
    let missing = match prices.unknown.is_empty() {
        true => unpriced(running, prices),
        false => prices.unknown.clone(),
    };
    let (status, reason, message) = match missing.is_empty() {
        _ if let Some(gap) = gap => (ConditionStatus::False, "HoursUnaccounted", gap),
        true if prices.stale.is_empty() => (
            ConditionStatus::True,
            "PricesKnown",
            "every running instance's spot and on-demand price is known".to_string(),
        ),
        true => (
            ConditionStatus::True,
            "PricesStale",
            format!(
                "every running instance's price is known, some from an earlier read: {}; read again within minutes",
                prices.stale.join("; ")
            ),
        ),
        false => (
            ConditionStatus::False,
            "PricesUnknown",
            format!(
                "{}; their hours are counted, not priced",
                missing.join("; ")
            ),
        ),
    };
    let conditions = &mut next.conditions;
    set_condition(
        conditions, COST_KNOWN, status, reason, message, generation, now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const EVERY: Cadence = Cadence {
        every: Duration::from_secs(300),
        bound: Duration::from_secs(720),
    };

    /// Equal to a billionth (sums of binary fractions are not exact).
    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn at(day: u32, h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, day, h, m, 0)
            .single()
            .expect("a time")
    }

    fn spot(zone: &str) -> Running {
        Running {
            instance_type: "t3.medium".into(),
            zone: zone.into(),
            spot: true,
        }
    }

    /// A record started at `start`, then accounted with `running` at `then`.
    fn after(start: DateTime<Utc>, running: &[Running], then: DateTime<Utc>) -> CostRecord {
        let started = account(None, &[], &prices(), start, EVERY);
        account(Some(&started), running, &prices(), then, EVERY)
    }

    fn prices() -> KnownPrices {
        let mut p = KnownPrices::default();
        p.spot
            .insert(("t3.medium".into(), "us-east-1a".into()), 0.0125);
        p.spot
            .insert(("t3.medium".into(), "us-east-1b".into()), 0.0150);
        p.on_demand.insert("t3.medium".into(), 0.0416);
        p
    }

    /// A sync at `t` with `running` at the usual prices.
    fn synced(status: &mut NodeGroupStatus, running: &[Running], t: DateTime<Utc>) {
        set_cost(status, running, &prices(), EVERY, Some(1), t);
    }

    /// Asserts `CostKnown` on `status`: its status and reason, and that its
    /// message says `says`.
    fn assert_known(status: &NodeGroupStatus, state: ConditionStatus, reason: &str, says: &str) {
        let c = crate::crd::condition::find(&status.conditions, COST_KNOWN).expect("condition");
        assert_eq!((&c.status, c.reason.as_str()), (&state, reason), "{c:?}");
        assert!(c.message.contains(says), "{}", c.message);
    }

    #[test]
    fn hours_and_dollars_add_up_as_computed_by_hand() {
        let start = account(None, &[], &prices(), at(28, 10, 0), EVERY);
        assert_eq!(start.accounted_until, at(28, 10, 0));
        let running = [spot("us-east-1a"), spot("us-east-1b")];
        let mut record = start;
        // Three accountings of 5 minutes each: a quarter of an hour.
        for m in [5, 10, 15] {
            record = account(Some(&record), &running, &prices(), at(28, 10, m), EVERY);
        }
        let f = &record.this_month;
        assert!(near(f.spot_instance_hours, 0.5), "{f:?}");
        // 0.25 h at 0.0125 + 0.25 h at 0.0150.
        assert!(near(f.spot_dollars, 0.006875), "{f:?}");
        assert!(near(f.on_demand_equivalent_dollars, 0.0208), "{f:?}");
        assert!(near(f.saving_dollars, 0.013925), "{f:?}");
        assert_eq!(record.total, record.this_month);
        assert_eq!(record.savings.as_deref(), Some("$0.01 (67%)"));
    }

    /// China's prices are in yuan: the record says so, and its saving is
    /// written in it.
    #[test]
    fn a_record_in_yuan_says_its_currency() {
        let yuan = KnownPrices {
            currency: "CNY",
            ..prices()
        };
        let start = account(None, &[], &yuan, at(28, 10, 0), EVERY);
        assert_eq!(start.currency, "CNY");
        let record = account(
            Some(&start),
            &[spot("us-east-1a")],
            &yuan,
            at(28, 10, 12),
            EVERY,
        );
        let savings = record.savings.expect("a saving");
        assert!(savings.starts_with("0.01 CNY ("), "{savings}");
        assert_eq!(after(at(28, 10, 0), &[], at(28, 10, 5)).currency, "USD");
    }

    #[test]
    fn a_fallback_hour_is_priced_on_demand_and_saves_nothing() {
        let fallback = Running {
            spot: false,
            ..spot("us-east-1a")
        };
        let record = after(at(28, 10, 0), &[fallback], at(28, 10, 12));
        let f = &record.this_month;
        assert!(near(f.on_demand_instance_hours, 0.2) && near(f.on_demand_dollars, 0.00832));
        assert!(near(f.saving_dollars, 0.0), "{f:?}");
    }

    #[test]
    fn nothing_is_accounted_before_the_interval_and_a_gap_past_the_bound_is_said() {
        let start = after(at(28, 10, 0), &[], at(28, 10, 0));
        let soon = after(at(28, 10, 0), &[spot("us-east-1a")], at(28, 10, 4));
        assert_eq!(soon, start, "unchanged: nothing rewritten");
        // Up to the bound (twice 5 + 1 minutes), every minute is covered.
        let slow = after(at(28, 10, 0), &[spot("us-east-1a")], at(28, 10, 12));
        assert!(near(slow.this_month.spot_instance_hours, 0.2), "{slow:?}");
        assert!(slow.unaccounted.is_empty());
        // Past it, what ran is not known: no instance hours, the span said.
        let later = after(at(28, 10, 0), &[spot("us-east-1a")], at(28, 13, 0));
        assert_eq!(later.this_month.spot_instance_hours, 0.0);
        assert!(near(later.this_month.unaccounted_hours, 3.0), "{later:?}");
        assert!(near(later.total.unaccounted_hours, 3.0), "{later:?}");
        let span = Unaccounted {
            from: at(28, 10, 0),
            to: at(28, 13, 0),
        };
        assert_eq!(later.unaccounted, [span]);
        assert_eq!(later.accounted_until, at(28, 13, 0));
    }

    /// Before, one accounting covered at most 15 minutes: `costInterval:
    /// 1h` recorded a quarter of the hours.
    #[test]
    fn a_long_cost_interval_accounts_every_hour() {
        let hourly = Cadence::of(Duration::from_secs(3600), Duration::from_secs(60));
        let start = account(None, &[], &prices(), at(28, 10, 0), hourly);
        let mut record = start;
        for h in [11, 12, 13] {
            record = account(
                Some(&record),
                &[spot("us-east-1a")],
                &prices(),
                at(28, h, 0),
                hourly,
            );
        }
        assert!(
            near(record.this_month.spot_instance_hours, 3.0),
            "{record:?}"
        );
        assert!(record.unaccounted.is_empty());
    }

    #[test]
    fn the_latest_gaps_are_kept_and_the_condition_says_one_for_an_hour() {
        let mut status = NodeGroupStatus::default();
        let running = [spot("us-east-1a")];
        for day in 1..=15 {
            synced(&mut status, &running, at(day, 0, 0));
        }
        let record = status.cost.clone().expect("a record");
        assert_eq!(
            record.unaccounted.len(),
            UNACCOUNTED_KEPT,
            "the latest 12 of 14"
        );
        assert_eq!(record.unaccounted[0].from, at(3, 0, 0));
        assert!(near(record.total.unaccounted_hours, 14.0 * 24.0));
        let span = "from 2026-11-14T00:00:00+00:00 to 2026-11-15T00:00:00+00:00";
        assert_known(&status, ConditionStatus::False, "HoursUnaccounted", span);
        // Accounted again every 5 minutes: said for the hour after the gap.
        for m in (5..=55).step_by(5) {
            synced(&mut status, &running, at(15, 0, m));
        }
        assert_known(&status, ConditionStatus::False, "HoursUnaccounted", span);
        synced(&mut status, &running, at(15, 1, 0));
        assert_known(&status, ConditionStatus::True, "PricesKnown", "");
    }

    #[test]
    fn an_unknown_price_counts_the_hours_and_no_dollars() {
        let record = after(at(28, 10, 0), &[spot("us-east-1c")], at(28, 10, 12));
        let f = &record.this_month;
        assert!(near(f.spot_instance_hours, 0.2) && near(f.unpriced_instance_hours, 0.2));
        assert_eq!((f.spot_dollars, f.saving_dollars), (0.0, 0.0));
        assert_eq!(record.savings, None);
    }

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .single()
            .expect("a time")
    }

    /// Before, the interval across midnight went wholly to the new month.
    #[test]
    fn an_interval_across_a_month_boundary_is_split_there() {
        let record = after(at(30, 23, 50), &[spot("us-east-1a")], at(30, 23, 59));
        let next = account(
            Some(&record),
            &[spot("us-east-1a")],
            &prices(),
            utc(2026, 12, 1, 0, 10),
            EVERY,
        );
        assert_eq!(next.month, "2026-12");
        // 00:00 to 00:10 in December; 23:50 to midnight in November.
        assert!(near(next.this_month.spot_instance_hours, 10.0 / 60.0));
        assert!(near(next.this_month.spot_dollars, 10.0 / 60.0 * 0.0125));
        let [november] = next.months.as_slice() else {
            panic!("one closed month: {:?}", next.months)
        };
        assert_eq!(november.month, "2026-11");
        assert!(near(november.figures.spot_instance_hours, 10.0 / 60.0));
        assert!(near(
            november.figures.saving_dollars,
            10.0 / 60.0 * (0.0416 - 0.0125)
        ));
        assert!(near(next.total.spot_instance_hours, 20.0 / 60.0));
    }

    /// A gap over two month boundaries: each month gets its own unaccounted
    /// hours, and the span is one.
    #[test]
    fn an_unaccounted_gap_is_split_by_month_too() {
        let start = account(None, &[], &prices(), at(30, 12, 0), EVERY);
        let next = account(
            Some(&start),
            &[spot("us-east-1a")],
            &prices(),
            utc(2027, 1, 1, 6, 0),
            EVERY,
        );
        let hours: Vec<(&str, f64)> = next
            .months
            .iter()
            .map(|m| (m.month.as_str(), m.figures.unaccounted_hours))
            .collect();
        assert_eq!(hours, [("2026-11", 12.0), ("2026-12", 31.0 * 24.0)]);
        assert_eq!(
            (next.month.as_str(), next.this_month.unaccounted_hours),
            ("2027-01", 6.0)
        );
        assert!(near(next.total.unaccounted_hours, 12.0 + 744.0 + 6.0));
        assert_eq!(next.unaccounted.len(), 1);
        assert_eq!(next.total.spot_instance_hours, 0.0);
    }

    /// Accounted mid-month for 16 months, every hour covered: the 13
    /// latest closed months are kept, each with its own hours.
    #[test]
    fn the_latest_thirteen_months_are_kept() {
        let lenient = Cadence {
            every: Duration::from_secs(300),
            bound: Duration::from_secs(40 * 24 * 3600),
        };
        let running = [spot("us-east-1a")];
        let mut record = account(None, &[], &prices(), utc(2026, 1, 1, 0, 0), lenient);
        for month in 1..=16u32 {
            let (y, m) = (2026 + (month as i32 - 1) / 12, (month - 1) % 12 + 1);
            let mid = utc(y, m, 15, 12, 0);
            record = account(Some(&record), &running, &prices(), mid, lenient);
        }
        assert_eq!(record.month, "2027-04");
        let kept: Vec<&str> = record.months.iter().map(|m| m.month.as_str()).collect();
        assert_eq!(kept.len(), MONTHS_KEPT, "{kept:?}");
        assert_eq!(
            (kept.first(), kept.last()),
            (Some(&"2026-03"), Some(&"2027-03"))
        );
        // Neither year is a leap year: March 2026 to March 2027.
        let days = [31, 30, 31, 30, 31, 31, 30, 31, 30, 31, 31, 28, 31];
        for (closed, days) in record.months.iter().zip(days) {
            let hours = closed.figures.spot_instance_hours;
            assert!(
                near(hours, days as f64 * 24.0),
                "{}: {hours} h",
                closed.month
            );
        }
        // April: from its first midnight to the 15th, 12:00.
        assert!(near(record.this_month.spot_instance_hours, 14.5 * 24.0));
        let all: f64 = (utc(2027, 4, 15, 12, 0) - utc(2026, 1, 1, 0, 0)).num_hours() as f64;
        assert!(near(record.total.spot_instance_hours, all));
    }

    #[test]
    fn standby_and_detaching_instances_are_billed_and_counted() {
        use crate::controllers::inventory::plan::tests::asg;
        let mut view = AwsView::default();
        let mut a = asg(
            "nodes-a",
            "nodes",
            "us-east-1a",
            &["i-1", "i-2", "i-3", "i-4", "i-5", "i-6"],
            2,
        );
        let states = [
            "InService",
            "Standby",
            "Detaching",
            "Detached",
            "Terminated",
            "Warmed:Stopped",
        ];
        for (i, state) in a.instances.iter_mut().zip(states) {
            i.lifecycle_state = state.into();
        }
        view.asgs.push(a);
        let running = running(&view, &BTreeSet::new());
        assert_eq!(
            running.len(),
            3,
            "InService, Standby, Detaching: {running:?}"
        );
        for state in [
            "Pending",
            "Pending:Wait",
            "EnteringStandby",
            "Terminating:Wait",
            "Warmed:Running",
        ] {
            assert!(billed(state), "{state}");
        }
        for state in [
            "Detached",
            "Terminated",
            "Warmed:Stopped",
            "Warmed:Hibernated",
            "Warmed:Pending",
        ] {
            assert!(!billed(state), "{state}");
        }
    }

    /// A zone the spot answer leaves out: its hours go unpriced, so the
    /// condition is False though every read succeeded, and the saving is
    /// marked partial.
    #[test]
    fn costknown_comes_from_the_accounting_and_a_partial_saving_says_so() {
        let mut status = NodeGroupStatus::default();
        let running = [spot("us-east-1a"), spot("us-east-1c")];
        synced(&mut status, &running, at(28, 10, 0));
        synced(&mut status, &running, at(28, 10, 6));
        let zone = "no spot price for t3.medium in us-east-1c";
        assert_known(&status, ConditionStatus::False, "PricesUnknown", zone);
        let record = status.cost.expect("a record");
        assert!(near(record.this_month.unpriced_instance_hours, 0.1));
        let savings = record.savings.expect("a saving");
        assert!(savings.ends_with("%, partial)"), "{savings}");
    }

    #[test]
    fn the_condition_says_which_price_is_unknown_and_why() {
        let mut status = NodeGroupStatus::default();
        let mut p = prices();
        p.unknown
            .push("spot prices unreadable (ec2:DescribeSpotPriceHistory): denied".into());
        set_cost(&mut status, &[], &p, EVERY, Some(1), at(28, 10, 0));
        let read = "DescribeSpotPriceHistory";
        assert_known(&status, ConditionStatus::False, "PricesUnknown", read);
        set_cost(&mut status, &[], &prices(), EVERY, Some(1), at(28, 10, 5));
        assert_known(&status, ConditionStatus::True, "PricesKnown", "");
        // A price kept from an earlier read, its read again failing: known,
        // and said so.
        let mut p = prices();
        p.stale
            .push("spot prices of t3.medium: last read at ..., stale since ...: throttled".into());
        set_cost(&mut status, &[], &p, EVERY, Some(1), at(28, 10, 10));
        assert_known(&status, ConditionStatus::True, "PricesStale", "throttled");
    }
}
