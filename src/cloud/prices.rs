//! Prices from AWS, cheaply: spot prices per zone and instance type
//! (EC2's DescribeSpotPriceHistory, one call an hour per region for every
//! type in use there, and one for a type when it is first seen),
//! on-demand prices per instance type (the Price List API's GetProducts, at
//! most once a day per type), kept in memory. A price that cannot be read
//! leaves its figure unknown and says why; it never blocks an operation.

use super::Cloud;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long spot prices serve (one DescribeSpotPriceHistory an hour).
pub const SPOT_FRESH: Duration = Duration::from_secs(3600);
/// How long an on-demand price serves (one GetProducts a day per type).
pub const ON_DEMAND_FRESH: Duration = Duration::from_secs(24 * 3600);

/// The current spot price of an instance type in a zone.
#[derive(Debug, Clone, PartialEq)]
pub struct SpotPrice {
    pub instance_type: String,
    pub zone: String,
    /// US dollars an hour.
    pub dollars_per_hour: f64,
}

/// The product descriptions a spot read asks for: a Linux instance's price
/// is listed under one or the other, by the account's platform (EC2-Classic
/// or VPC). Karpenter asks both (aws/karpenter-provider-aws,
/// pkg/providers/pricing/pricing.go, fetchSpotPricing, at 09303f32).
pub const SPOT_PRODUCTS: [&str; 2] = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"];

/// The price in force per instance type and zone, from a spot price
/// history read across [`SPOT_PRODUCTS`]: the entry that took effect last
/// (an entry without a time is the oldest). AWS promises no order within an
/// answer or across its pages, so the first entry seen is not taken.
pub fn newest(
    history: impl IntoIterator<Item = (SpotPrice, Option<DateTime<Utc>>)>,
) -> Vec<SpotPrice> {
    type Since = Option<DateTime<Utc>>;
    let mut latest: BTreeMap<(String, String), (Since, SpotPrice)> = BTreeMap::new();
    for (price, since) in history {
        let key = (price.instance_type.clone(), price.zone.clone());
        match latest.get(&key) {
            Some((seen, _)) if *seen >= since => {}
            _ => {
                latest.insert(key, (since, price));
            }
        }
    }
    latest.into_values().map(|(_, price)| price).collect()
}

/// Where a region's on-demand prices are read, and in what currency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PriceList {
    /// The Price List API at `endpoint` (a region name) lists the region's
    /// prices in `currency`.
    At {
        endpoint: String,
        currency: &'static str,
    },
    /// No Price List API serves the region: why, and what to do.
    Absent(String),
}

impl PriceList {
    pub fn currency(&self) -> &'static str {
        match self {
            PriceList::At { currency, .. } => currency,
            PriceList::Absent(_) => "USD",
        }
    }
}

/// Where `region`'s on-demand prices are read. `setting` (`aws.pricingRegion`)
/// names the endpoint region outright. Otherwise, as Karpenter chooses
/// (aws/karpenter-provider-aws, pkg/providers/pricing/pricing.go, NewAPI
/// and UpdateOnDemandPricing, at 09303f32): China's regions read
/// cn-northwest-1, whose prices are in CNY (onDemandPage there); GovCloud
/// has no Price List API; the commercial regions read us-east-1,
/// eu-central-1 or ap-south-1, each of which lists every commercial region.
pub fn price_list(region: &str, setting: Option<&str>) -> PriceList {
    let currency = if region.starts_with("cn-") {
        "CNY"
    } else {
        "USD"
    };
    if let Some(endpoint) = setting {
        return PriceList::At {
            endpoint: endpoint.to_string(),
            currency,
        };
    }
    if region.starts_with("us-gov-") {
        return PriceList::Absent(format!(
            "AWS GovCloud (US) has no Price List API, so no on-demand price is read for {region}: \
             its hours are counted, not priced. If the manager's credentials can reach a Price \
             List endpoint that lists {region}, name that endpoint's region in aws.pricingRegion"
        ));
    }
    let endpoint = match region.split('-').next() {
        Some("cn") => "cn-northwest-1",
        Some("eu" | "me" | "af" | "il") => "eu-central-1",
        Some("ap") => "ap-south-1",
        _ => "us-east-1",
    };
    PriceList::At {
        endpoint: endpoint.to_string(),
        currency,
    }
}

/// An amount in `currency`: `$0.0416` in US dollars, `0.29 CNY` otherwise.
pub fn money(currency: &str, amount: impl std::fmt::Display) -> String {
    match currency {
        "USD" => format!("${amount}"),
        other => format!("{amount} {other}"),
    }
}

/// The on-demand price (`currency` an hour) in one GetProducts document:
/// a product and its terms, JSON in a string. None when it carries no
/// hourly on-demand price in that currency.
pub fn on_demand_in_document(document: &str, currency: &str) -> Result<Option<f64>, String> {
    let doc: serde_json::Value = serde_json::from_str(document)
        .map_err(|e| format!("a Price List document that is not JSON: {e}"))?;
    let terms = doc["terms"]["OnDemand"].as_object();
    let prices = terms
        .into_iter()
        .flat_map(|t| t.values())
        .filter_map(|term| term["priceDimensions"].as_object())
        .flat_map(|dims| dims.values())
        .filter(|dim| dim["unit"].as_str().is_some_and(|u| u.starts_with("Hr")))
        .filter_map(|dim| dim["pricePerUnit"][currency].as_str()?.parse::<f64>().ok())
        // A product with a free tier lists a 0.00 dimension beside its
        // price: the price is the highest.
        .fold(None, |max: Option<f64>, p| {
            Some(max.map_or(p, |m| m.max(p)))
        });
    Ok(prices)
}

/// The on-demand price in a GetProducts answer (its documents, each a
/// product and its terms). A product priced $0 (a capacity reservation's
/// SKU) is no price; products that disagree are refused rather than one
/// taken at random: the filters did not narrow the answer to one product.
/// Each refusal names the SKUs. None when no document carries a price.
pub fn on_demand_of(documents: &[String], currency: &str) -> Result<Option<f64>, String> {
    let mut priced: Vec<(String, f64)> = vec![];
    let mut free = vec![];
    for document in documents {
        let sku = serde_json::from_str::<serde_json::Value>(document)
            .ok()
            .and_then(|d| d["product"]["sku"].as_str().map(String::from))
            .unwrap_or_else(|| "(no SKU)".into());
        match on_demand_in_document(document, currency)? {
            Some(price) if price > 0.0 => priced.push((sku, price)),
            Some(_) => free.push(sku),
            None => {}
        }
    }
    let Some((_, first)) = priced.first() else {
        return match free.is_empty() {
            true => Ok(None),
            false => Err(format!(
                "the Price List's only on-demand price is {} (SKU {}): not taken",
                money(currency, 0),
                free.join(", ")
            )),
        };
    };
    if priced.iter().any(|(_, p)| (p - first).abs() > 1e-9) {
        let each: Vec<String> = priced
            .iter()
            .map(|(sku, p)| format!("{sku} {}", money(currency, p)))
            .collect();
        return Err(format!(
            "the Price List's products disagree ({}): none taken",
            each.join(", ")
        ));
    }
    if !free.is_empty() {
        tracing::warn!(skus = %free.join(", "), "a $0 on-demand product beside the priced one; left out");
    }
    Ok(Some(*first))
}

/// A failed read is tried again after this, doubled at each failure in a
/// row up to [`RETRY_MAX`]: minutes, not the price's whole period.
pub const RETRY_FIRST: Duration = Duration::from_secs(60);
pub const RETRY_MAX: Duration = Duration::from_secs(15 * 60);

/// Prices as last read, per region: what the inventory accounts with.
/// Spot prices are read for the union of the types the region's groups
/// run, once an hour in one call; a type seen for the first time within
/// the hour is read alone. A read that fails keeps the last good price
/// (marked stale from when it should have been read again) and is tried
/// again within minutes. Reads of one region are made one at a time, so
/// groups synced at once ask AWS once.
#[derive(Default)]
pub struct PriceBook {
    state: Mutex<Book>,
    /// Per region: held across a read, so a concurrent first read of the
    /// same price waits for it rather than making it again.
    reading: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Default)]
struct Book {
    /// Per region, per instance type in use there.
    spot: BTreeMap<String, BTreeMap<String, SpotType>>,
    /// Per (region, instance type).
    on_demand: BTreeMap<(String, String), Read<Option<f64>>>,
}

/// A spot instance type of a region: when a group last asked for it (one
/// no group has asked for in [`SPOT_FORGET`] is forgotten), and its prices
/// per zone.
#[derive(Default)]
struct SpotType {
    asked: Option<DateTime<Utc>>,
    read: Read<BTreeMap<String, f64>>,
}

/// A spot type no group has asked for in this long is read no more.
const SPOT_FORGET: Duration = Duration::from_secs(24 * 3600);

/// What is known of one price: the last good answer and when it was read,
/// and a failure since then.
struct Read<T> {
    good: Option<(T, DateTime<Utc>)>,
    failing: Option<Failing>,
}

impl<T> Default for Read<T> {
    fn default() -> Self {
        Read {
            good: None,
            failing: None,
        }
    }
}

#[derive(Clone)]
struct Failing {
    why: String,
    /// Failures in a row.
    tries: u32,
    retry_at: DateTime<Utc>,
}

impl<T> Read<T> {
    /// Whether it is to be read at `now`: never read, or read longer ago
    /// than `fresh`; a failure waits for its retry.
    fn due(&self, now: DateTime<Utc>, fresh: Duration) -> bool {
        if let Some(f) = &self.failing {
            return now >= f.retry_at;
        }
        self.good
            .as_ref()
            .is_none_or(|(_, at)| now >= after(*at, fresh))
    }

    /// Whether a read of it was made, answered or not.
    fn tried(&self) -> bool {
        self.good.is_some() || self.failing.is_some()
    }

    fn read(&mut self, answer: Result<T, String>, now: DateTime<Utc>) {
        match answer {
            Ok(value) => {
                self.good = Some((value, now));
                self.failing = None;
            }
            Err(why) => {
                let tries = self.failing.as_ref().map_or(0, |f| f.tries) + 1;
                let wait = RETRY_FIRST
                    .saturating_mul(2u32.saturating_pow(tries - 1))
                    .min(RETRY_MAX);
                self.failing = Some(Failing {
                    why,
                    tries,
                    retry_at: after(now, wait),
                });
            }
        }
    }

    /// The last good answer; with it, when it turned stale and why, if it
    /// is older than `fresh` and its read failed since; without it, why.
    fn known(&self, fresh: Duration) -> (Option<&T>, Option<String>) {
        let why = self.failing.as_ref().map(|f| f.why.clone());
        match &self.good {
            Some((value, at)) => {
                let stale = why.map(|why| {
                    let since = after(*at, fresh).to_rfc3339();
                    format!(
                        "last read at {}, stale since {since}: {why}",
                        at.to_rfc3339()
                    )
                });
                (Some(value), stale)
            }
            None => (None, why),
        }
    }
}

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// The prices known for a group's instances, and why any is not.
#[derive(Debug, Clone, PartialEq)]
pub struct KnownPrices {
    /// (instance type, zone) -> spot dollars an hour.
    pub spot: BTreeMap<(String, String), f64>,
    /// instance type -> on-demand dollars an hour.
    pub on_demand: BTreeMap<String, f64>,
    /// Why some price is unknown, one line per cause.
    pub unknown: Vec<String>,
    /// Prices kept from an earlier read because reading them again failed:
    /// which, since when, and why, one line per cause.
    pub stale: Vec<String>,
    /// The currency of every price (`USD`, `CNY` in China's regions).
    pub currency: &'static str,
}

impl Default for KnownPrices {
    /// Nothing known yet, in US dollars.
    fn default() -> Self {
        KnownPrices {
            spot: BTreeMap::new(),
            on_demand: BTreeMap::new(),
            unknown: vec![],
            stale: vec![],
            currency: "USD",
        }
    }
}

impl KnownPrices {
    fn say(lines: &mut Vec<String>, line: String) {
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
}

impl PriceBook {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn region_lock(&self, region: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut reading = self.reading.lock().unwrap_or_else(|p| p.into_inner());
        reading.entry(region.to_string()).or_default().clone()
    }

    /// The prices of `types` in `region` (`cloud`'s) at `now`, asking AWS
    /// only for what is due.
    pub async fn prices(
        &self,
        cloud: &dyn Cloud,
        region: &str,
        types: &BTreeSet<String>,
        now: DateTime<Utc>,
    ) -> KnownPrices {
        let price_list = cloud.price_list();
        let mut known = KnownPrices {
            currency: price_list.currency(),
            ..Default::default()
        };
        if types.is_empty() {
            return known;
        }
        let lock = self.region_lock(region);
        let _reading = lock.lock().await;
        self.spot_prices(cloud, region, types, now, &mut known)
            .await;
        if let PriceList::Absent(why) = price_list {
            // No call: there is nothing to read, and nothing to retry.
            known.unknown.push(why);
            return known;
        }
        for instance_type in types {
            self.on_demand_price(cloud, region, instance_type, now, &mut known)
                .await;
        }
        known
    }

    /// `types` asked for in `region` at `now`; a type no group has asked
    /// for in a day is forgotten.
    fn note_asked(&self, region: &str, types: &BTreeSet<String>, now: DateTime<Utc>) {
        let mut book = self.book();
        let in_use = book.spot.entry(region.to_string()).or_default();
        for t in types {
            in_use.entry(t.clone()).or_default().asked = Some(now);
        }
        in_use.retain(|_, s| s.asked.is_some_and(|at| now < after(at, SPOT_FORGET)));
    }

    /// What a spot read asks for now: every type of the region once one
    /// read before is due (so the region's types are read together, once
    /// an hour), else the types never read; empty when none is due.
    fn spot_to_read(&self, region: &str, now: DateTime<Utc>) -> Vec<String> {
        let book = self.book();
        let Some(in_use) = book.spot.get(region) else {
            return vec![];
        };
        let all = in_use
            .values()
            .any(|s| s.read.tried() && s.read.due(now, SPOT_FRESH));
        in_use
            .iter()
            .filter(|(_, s)| all || !s.read.tried())
            .map(|(t, _)| t.clone())
            .collect()
    }

    async fn spot_prices(
        &self,
        cloud: &dyn Cloud,
        region: &str,
        types: &BTreeSet<String>,
        now: DateTime<Utc>,
        known: &mut KnownPrices,
    ) {
        self.note_asked(region, types, now);
        let wanted = self.spot_to_read(region, now);
        if !wanted.is_empty() {
            let answer = cloud.spot_prices(&wanted).await.map_err(|e| {
                tracing::warn!(error = %e, region, "spot prices unreadable");
                format!("spot prices unreadable (ec2:DescribeSpotPriceHistory): {e}")
            });
            let mut book = self.book();
            let region_book = book.spot.entry(region.to_string()).or_default();
            for t in &wanted {
                let per_zone = answer.as_ref().map_err(Clone::clone).map(|prices| {
                    prices
                        .iter()
                        .filter(|p| &p.instance_type == t)
                        .map(|p| (p.zone.clone(), p.dollars_per_hour))
                        .collect()
                });
                region_book
                    .entry(t.clone())
                    .or_default()
                    .read
                    .read(per_zone, now);
            }
        }
        let book = self.book();
        for t in types {
            let Some(read) = book.spot.get(region).and_then(|r| r.get(t)) else {
                continue;
            };
            let read = &read.read;
            let (prices, why) = read.known(SPOT_FRESH);
            for (zone, price) in prices.into_iter().flatten() {
                known.spot.insert((t.clone(), zone.clone()), *price);
            }
            match (prices, why) {
                (Some(_), Some(stale)) => {
                    KnownPrices::say(&mut known.stale, format!("spot prices of {t}: {stale}"))
                }
                (None, Some(why)) => KnownPrices::say(&mut known.unknown, why),
                _ => {}
            }
        }
    }

    async fn on_demand_price(
        &self,
        cloud: &dyn Cloud,
        region: &str,
        instance_type: &str,
        now: DateTime<Utc>,
        known: &mut KnownPrices,
    ) {
        let key = (region.to_string(), instance_type.to_string());
        let due = self
            .book()
            .on_demand
            .get(&key)
            .is_none_or(|r| r.due(now, ON_DEMAND_FRESH));
        if due {
            let answer = cloud.on_demand_price(instance_type).await.map_err(|e| {
                tracing::warn!(error = %e, instance_type, "on-demand price unreadable");
                format!("on-demand prices unreadable (pricing:GetProducts): {e}")
            });
            let mut book = self.book();
            book.on_demand
                .entry(key.clone())
                .or_default()
                .read(answer, now);
        }
        let book = self.book();
        let Some(read) = book.on_demand.get(&key) else {
            return;
        };
        match read.known(ON_DEMAND_FRESH) {
            (Some(Some(price)), stale) => {
                known.on_demand.insert(instance_type.to_string(), *price);
                if let Some(stale) = stale {
                    let line = format!("the on-demand price of {instance_type}: {stale}");
                    KnownPrices::say(&mut known.stale, line);
                }
            }
            (Some(None), _) => {
                let place = match region {
                    "" => String::new(),
                    region => format!(" in {region}"),
                };
                known.unknown.push(format!(
                    "the Price List has no on-demand Linux price for {instance_type}{place} (a type not sold there, or a region this Price List endpoint does not list: aws.pricingRegion names another)"
                ))
            }
            (None, Some(why)) => KnownPrices::say(&mut known.unknown, why),
            (None, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GetProducts document as AWS writes it (trimmed to what we read).
    pub fn document(usd: &str) -> String {
        serde_json::json!({
            "product": {"productFamily": "Compute Instance",
                        "attributes": {"instanceType": "t3.medium", "regionCode": "us-east-1"}},
            "serviceCode": "AmazonEC2",
            "terms": {"OnDemand": {"ABC.JRTCKXETXF": {"priceDimensions": {
                "ABC.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": usd},
                                              "description": "$0.0416 per On Demand Linux t3.medium Instance Hour"}
            }}}}
        })
        .to_string()
    }

    #[test]
    fn the_hourly_usd_price_is_read_from_a_price_list_document() {
        assert_eq!(
            on_demand_in_document(&document("0.0416000000"), "USD"),
            Ok(Some(0.0416))
        );
    }

    fn product(sku: &str, usd: &str) -> String {
        let mut d: serde_json::Value = serde_json::from_str(&document(usd)).expect("JSON");
        d["product"]["sku"] = serde_json::json!(sku);
        d.to_string()
    }

    #[test]
    fn a_zero_price_or_products_that_disagree_are_refused_naming_their_skus() {
        let one = [product("A", "0.0416")];
        assert_eq!(on_demand_of(&one, "USD"), Ok(Some(0.0416)));
        let alike = [product("A", "0.0416"), product("B", "0.0416")];
        assert_eq!(on_demand_of(&alike, "USD"), Ok(Some(0.0416)));
        // A capacity reservation's $0 beside the price: the price.
        let reserved = [product("R", "0.0000000000"), product("A", "0.0416")];
        assert_eq!(on_demand_of(&reserved, "USD"), Ok(Some(0.0416)));
        let only_free = [product("R", "0.0000000000")];
        let refused = on_demand_of(&only_free, "USD").expect_err("refused");
        assert!(refused.contains("$0 (SKU R)"), "{refused}");
        let disagree = [product("A", "0.0416"), product("C", "0.0832")];
        let refused = on_demand_of(&disagree, "USD").expect_err("refused");
        assert!(refused.contains("A $0.0416, C $0.0832"), "{refused}");
        assert_eq!(on_demand_of(&[], "USD"), Ok(None));
    }

    fn quote(zone: &str, dollars: f64, minute: Option<u32>) -> (SpotPrice, Option<DateTime<Utc>>) {
        use chrono::TimeZone;
        let price = SpotPrice {
            instance_type: "m5.large".into(),
            zone: zone.into(),
            dollars_per_hour: dollars,
        };
        (
            price,
            minute.and_then(|m| Utc.with_ymd_and_hms(2026, 11, 28, 10, m, 0).single()),
        )
    }

    /// An answer in no order, over two product descriptions: the entry
    /// that took effect last is the price, wherever it came in the answer.
    #[test]
    fn the_spot_price_in_force_is_the_newest_entry_not_the_first() {
        let history = [
            quote("us-east-1a", 0.031, Some(5)),
            quote("us-east-1a", 0.035, Some(40)),
            quote("us-east-1a", 0.029, Some(20)),
            quote("us-east-1b", 0.050, None),
            quote("us-east-1b", 0.041, Some(1)),
        ];
        let prices: Vec<(String, f64)> = newest(history)
            .into_iter()
            .map(|p| (p.zone, p.dollars_per_hour))
            .collect();
        assert_eq!(
            prices,
            [("us-east-1a".into(), 0.035), ("us-east-1b".into(), 0.041)]
        );
    }

    #[test]
    fn a_document_without_an_on_demand_term_has_no_price() {
        let reserved = serde_json::json!({"product": {}, "terms": {"Reserved": {}}}).to_string();
        assert_eq!(on_demand_in_document(&reserved, "USD"), Ok(None));
        assert!(on_demand_in_document("not json", "USD").is_err());
    }

    fn types(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn t0() -> DateTime<Utc> {
        use chrono::TimeZone;
        Utc.with_ymd_and_hms(2026, 12, 3, 10, 0, 0).unwrap()
    }

    fn min(m: i64) -> DateTime<Utc> {
        t0() + chrono::Duration::minutes(m)
    }

    fn priced() -> crate::cloud::fake::FakeCloud {
        let cloud = crate::cloud::fake::FakeCloud::new();
        cloud.set_spot_price("m5.large", "us-east-1a", 0.031);
        cloud.set_spot_price("c5.large", "us-east-1a", 0.029);
        cloud.set_on_demand_price("m5.large", 0.096);
        cloud.set_on_demand_price("c5.large", 0.085);
        cloud
    }

    /// GovCloud: spot prices are read (EC2 answers there), on-demand ones
    /// are not asked at all, and the reason says so with what to do; China:
    /// read, and in yuan.
    #[tokio::test]
    async fn govcloud_is_said_without_a_call_and_china_reads_in_yuan() {
        let cloud = priced();
        cloud.set_price_list_of("us-gov-west-1");
        let book = PriceBook::default();
        let m5 = types(&["m5.large"]);
        for m in [0, 30, 120] {
            let known = book.prices(&cloud, "us-gov-west-1", &m5, min(m)).await;
            assert!(known.on_demand.is_empty(), "{known:?}");
            assert_eq!(known.unknown.len(), 1, "{known:?}");
            assert!(known.unknown[0].contains("GovCloud"), "{known:?}");
            assert_eq!(known.spot.len(), 1, "{known:?}");
        }
        assert_eq!(cloud.calls("on_demand_price"), 0);
        let china = priced();
        china.set_price_list_of("cn-north-1");
        let known = book.prices(&china, "cn-north-1", &m5, min(0)).await;
        assert_eq!(
            (known.currency, known.on_demand["m5.large"]),
            ("CNY", 0.096)
        );
        let usd = book.prices(&priced(), "us-east-1", &m5, min(0)).await;
        assert_eq!(usd.currency, "USD");
    }

    #[tokio::test]
    async fn prices_are_asked_once_and_served_from_memory_within_the_hour() {
        let cloud = priced();
        let book = PriceBook::default();
        for m in [0, 10, 59] {
            let known = book.prices(&cloud, "", &types(&["m5.large"]), min(m)).await;
            assert_eq!(known.spot[&("m5.large".into(), "us-east-1a".into())], 0.031);
            assert_eq!(known.on_demand["m5.large"], 0.096);
            assert!(
                known.unknown.is_empty() && known.stale.is_empty(),
                "{known:?}"
            );
        }
        assert_eq!(cloud.calls("spot_prices"), 1);
        assert_eq!(cloud.calls("on_demand_price"), 1);
        book.prices(&cloud, "", &types(&["m5.large"]), min(60))
            .await;
        assert_eq!(cloud.calls("spot_prices"), 2, "an hour on");
        book.prices(&cloud, "", &types(&["m5.large"]), min(24 * 60))
            .await;
        assert_eq!(cloud.calls("on_demand_price"), 2, "a day on");
    }

    /// kops's ordinary layout: masters on one type, workers on another,
    /// each group synced in turn. Before, each group's types replaced the
    /// other's, and spot prices were read at every sync.
    #[tokio::test]
    async fn two_groups_on_different_types_read_spot_prices_once_an_hour_for_both() {
        let cloud = priced();
        let book = PriceBook::default();
        let (masters, workers) = (types(&["m5.large"]), types(&["c5.large"]));
        for m in 0..180 {
            let m5 = book.prices(&cloud, "", &masters, min(m)).await;
            let c5 = book.prices(&cloud, "", &workers, min(m)).await;
            assert_eq!(m5.spot.len() + c5.spot.len(), 2, "at minute {m}");
            assert!(m5.unknown.is_empty() && c5.unknown.is_empty());
        }
        let asked = cloud.spot_asks();
        let asks: Vec<Vec<&str>> = asked
            .iter()
            .map(|a| a.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            asks,
            [
                vec!["m5.large"],
                vec!["c5.large"],
                vec!["c5.large", "m5.large"],
                vec!["c5.large", "m5.large"],
            ],
            "a type first seen alone, then both once an hour"
        );
        assert_eq!(cloud.calls("on_demand_price"), 2, "once a day per type");
    }

    #[tokio::test]
    async fn a_type_no_group_asks_for_in_a_day_is_read_no_more() {
        let cloud = priced();
        let book = PriceBook::default();
        book.prices(&cloud, "", &types(&["m5.large"]), min(0)).await;
        for h in 1..=25 {
            book.prices(&cloud, "", &types(&["c5.large"]), min(60 * h))
                .await;
        }
        let last = cloud.spot_asks().last().cloned().unwrap_or_default();
        assert_eq!(last, ["c5.large"], "m5.large last asked 25 hours ago");
    }

    #[tokio::test]
    async fn groups_synced_at_once_read_a_price_once() {
        let cloud = priced();
        let book = PriceBook::default();
        let wanted = types(&["m5.large"]);
        let (a, b) = tokio::join!(
            book.prices(&cloud, "", &wanted, min(0)),
            book.prices(&cloud, "", &wanted, min(0))
        );
        assert_eq!(a, b);
        assert_eq!(cloud.calls("spot_prices"), 1);
        assert_eq!(cloud.calls("on_demand_price"), 1);
    }

    #[tokio::test]
    async fn a_failed_read_keeps_the_last_good_price_marked_stale_and_tries_again_within_minutes() {
        let cloud = priced();
        let book = PriceBook::default();
        let m5 = types(&["m5.large"]);
        book.prices(&cloud, "", &m5, min(0)).await;
        cloud.fail_next("spot_prices", "throttled");
        cloud.fail_next("spot_prices", "throttled");
        let known = book.prices(&cloud, "", &m5, min(60)).await;
        assert_eq!(known.spot.len(), 1, "the last good price kept");
        assert!(known.unknown.is_empty(), "{known:?}");
        let stale = known.stale.join("; ");
        assert!(stale.contains("spot prices of m5.large"), "{stale}");
        assert!(
            stale.contains("stale since 2026-12-03T11:00:00+00:00"),
            "{stale}"
        );
        assert!(stale.contains("throttled"), "{stale}");
        // Tried again a minute on, then two minutes after that.
        book.prices(&cloud, "", &m5, min(60) + chrono::Duration::seconds(59))
            .await;
        assert_eq!(cloud.calls("spot_prices"), 2);
        book.prices(&cloud, "", &m5, min(61)).await;
        assert_eq!(cloud.calls("spot_prices"), 3, "failed again");
        book.prices(&cloud, "", &m5, min(62)).await;
        assert_eq!(cloud.calls("spot_prices"), 3, "waits two minutes now");
        let known = book.prices(&cloud, "", &m5, min(63)).await;
        assert_eq!(cloud.calls("spot_prices"), 4);
        assert!(known.stale.is_empty(), "read again: {known:?}");
        book.prices(&cloud, "", &m5, min(64)).await;
        assert_eq!(cloud.calls("spot_prices"), 4, "fresh for an hour again");
    }

    #[tokio::test]
    async fn a_price_that_cannot_be_read_is_unknown_says_why_and_is_tried_again_within_minutes() {
        let cloud = crate::cloud::fake::FakeCloud::new();
        cloud.fail_next("spot_prices", "not authorized");
        cloud.fail_next("on_demand_price", "AccessDeniedException");
        let book = PriceBook::default();
        let m5 = types(&["m5.large"]);
        let known = book.prices(&cloud, "", &m5, min(0)).await;
        assert!(known.spot.is_empty() && known.on_demand.is_empty());
        assert_eq!(known.unknown.len(), 2, "{:?}", known.unknown);
        assert!(known.unknown[0].contains("ec2:DescribeSpotPriceHistory"));
        assert!(known.unknown[0].contains("not authorized"));
        assert!(known.unknown[1].contains("pricing:GetProducts"));
        // Not asked again within the minute; a minute on, both are (a user
        // who grants the permission sees the price within minutes, not a
        // day).
        let again = book
            .prices(&cloud, "", &m5, min(0) + chrono::Duration::seconds(30))
            .await;
        assert_eq!(again, known);
        assert_eq!(cloud.calls("spot_prices"), 1);
        cloud.set_spot_price("m5.large", "us-east-1a", 0.031);
        cloud.set_on_demand_price("m5.large", 0.096);
        let granted = book.prices(&cloud, "", &m5, min(1)).await;
        assert_eq!(cloud.calls("on_demand_price"), 2);
        assert!(granted.unknown.is_empty(), "{granted:?}");
        assert_eq!(granted.on_demand["m5.large"], 0.096);
    }

    fn at(endpoint: &str, currency: &'static str) -> PriceList {
        PriceList::At {
            endpoint: endpoint.into(),
            currency,
        }
    }

    /// As aws/karpenter-provider-aws chooses (pricing.go at 09303f32).
    #[test]
    fn each_region_asks_the_price_list_endpoint_that_serves_it() {
        assert_eq!(price_list("ap-northeast-1", None), at("ap-south-1", "USD"));
        assert_eq!(price_list("eu-west-1", None), at("eu-central-1", "USD"));
        assert_eq!(price_list("us-west-2", None), at("us-east-1", "USD"));
        assert_eq!(price_list("sa-east-1", None), at("us-east-1", "USD"));
        // China: its own endpoint, and its prices in yuan.
        assert_eq!(price_list("cn-north-1", None), at("cn-northwest-1", "CNY"));
        assert_eq!(
            price_list("cn-northwest-1", None),
            at("cn-northwest-1", "CNY")
        );
        // GovCloud: none, said with what to do.
        let PriceList::Absent(why) = price_list("us-gov-west-1", None) else {
            panic!("GovCloud has no Price List")
        };
        assert!(
            why.contains("GovCloud") && why.contains("aws.pricingRegion"),
            "{why}"
        );
        // The setting names the endpoint outright; the currency stays the
        // region's.
        let set = Some("us-east-1");
        assert_eq!(price_list("us-gov-west-1", set), at("us-east-1", "USD"));
        assert_eq!(
            price_list("cn-north-1", Some("cn-north-1")),
            at("cn-north-1", "CNY")
        );
    }

    /// China's Price List quotes CNY (pricing.go's onDemandPage at
    /// 09303f32): the price is read in the region's currency, and a USD
    /// price is not taken for it.
    #[test]
    fn a_price_is_read_in_the_regions_currency() {
        let yuan = document("0.0416").replace("\"USD\"", "\"CNY\"");
        assert_eq!(
            on_demand_of(std::slice::from_ref(&yuan), "CNY"),
            Ok(Some(0.0416))
        );
        assert_eq!(on_demand_of(&[yuan], "USD"), Ok(None));
        assert_eq!(on_demand_of(&[document("0.0416")], "CNY"), Ok(None));
    }
}
