//! Prices from AWS, cheaply: spot prices per zone and instance type
//! (EC2's DescribeSpotPriceHistory, at most one call an hour per region),
//! on-demand prices per instance type (the Price List API's GetProducts, at
//! most once a day per type), kept in memory. A price that cannot be read
//! leaves its figure unknown and says why; it never blocks an operation.

use super::Cloud;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// The Price List API's endpoint region for `region`: it answers in
/// us-east-1, eu-central-1 and ap-south-1 only, each for every region.
pub fn price_list_region(region: &str) -> &'static str {
    match region.split('-').next() {
        Some("eu" | "me" | "af" | "il") => "eu-central-1",
        Some("ap") => "ap-south-1",
        _ => "us-east-1",
    }
}

/// The on-demand price (US dollars an hour) in one GetProducts document:
/// a product and its terms, JSON in a string. None when it carries no
/// hourly on-demand price in USD.
pub fn on_demand_in_document(document: &str) -> Result<Option<f64>, String> {
    let doc: serde_json::Value = serde_json::from_str(document)
        .map_err(|e| format!("a Price List document that is not JSON: {e}"))?;
    let terms = doc["terms"]["OnDemand"].as_object();
    let prices = terms
        .into_iter()
        .flat_map(|t| t.values())
        .filter_map(|term| term["priceDimensions"].as_object())
        .flat_map(|dims| dims.values())
        .filter(|dim| dim["unit"].as_str().is_some_and(|u| u.starts_with("Hr")))
        .filter_map(|dim| dim["pricePerUnit"]["USD"].as_str()?.parse::<f64>().ok())
        // A product with a free tier lists a 0.00 dimension beside its
        // price: the price is the highest.
        .fold(None, |max: Option<f64>, p| {
            Some(max.map_or(p, |m| m.max(p)))
        });
    Ok(prices)
}

/// Prices as last read, per region: what the inventory accounts with.
#[derive(Default)]
pub struct PriceBook {
    state: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    /// Per region: when asked, the types asked for, and the answer.
    spot: BTreeMap<String, Asked<Vec<SpotPrice>>>,
    /// Per (region, instance type).
    on_demand: BTreeMap<(String, String), Asked<Option<f64>>>,
}

struct Asked<T> {
    at: Instant,
    types: BTreeSet<String>,
    answer: Result<T, String>,
}

/// The prices known for a group's instances, and why any is not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KnownPrices {
    /// (instance type, zone) -> spot dollars an hour.
    pub spot: BTreeMap<(String, String), f64>,
    /// instance type -> on-demand dollars an hour.
    pub on_demand: BTreeMap<String, f64>,
    /// Why some price is unknown, one line per cause.
    pub unknown: Vec<String>,
}

impl PriceBook {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The prices of `types` in `region` (`cloud`'s), asking AWS only for
    /// what is older than its freshness or never asked.
    pub async fn prices(
        &self,
        cloud: &dyn Cloud,
        region: &str,
        types: &BTreeSet<String>,
    ) -> KnownPrices {
        let mut known = KnownPrices::default();
        if types.is_empty() {
            return known;
        }
        self.spot_prices(cloud, region, types, &mut known).await;
        for instance_type in types {
            self.on_demand_price(cloud, region, instance_type, &mut known)
                .await;
        }
        known
    }

    async fn spot_prices(
        &self,
        cloud: &dyn Cloud,
        region: &str,
        types: &BTreeSet<String>,
        known: &mut KnownPrices,
    ) {
        let stale =
            self.book().spot.get(region).is_none_or(|asked| {
                asked.at.elapsed() >= SPOT_FRESH || !types.is_subset(&asked.types)
            });
        if stale {
            let wanted: Vec<String> = types.iter().cloned().collect();
            // The lock is not held across the call.
            let answer = cloud.spot_prices(&wanted).await.map_err(|e| {
                tracing::warn!(error = %e, "spot prices unreadable: costs unknown");
                format!("spot prices unreadable (ec2:DescribeSpotPriceHistory): {e}")
            });
            let asked = Asked {
                at: Instant::now(),
                types: types.clone(),
                answer,
            };
            self.book().spot.insert(region.to_string(), asked);
        }
        let book = self.book();
        match book.spot.get(region).map(|a| &a.answer) {
            Some(Ok(prices)) => {
                for p in prices.iter().filter(|p| types.contains(&p.instance_type)) {
                    let key = (p.instance_type.clone(), p.zone.clone());
                    known.spot.insert(key, p.dollars_per_hour);
                }
            }
            Some(Err(why)) => known.unknown.push(why.clone()),
            None => {}
        }
    }

    async fn on_demand_price(
        &self,
        cloud: &dyn Cloud,
        region: &str,
        instance_type: &str,
        known: &mut KnownPrices,
    ) {
        let key = (region.to_string(), instance_type.to_string());
        let stale = self
            .book()
            .on_demand
            .get(&key)
            .is_none_or(|asked| asked.at.elapsed() >= ON_DEMAND_FRESH);
        if stale {
            let answer = cloud.on_demand_price(instance_type).await.map_err(|e| {
                tracing::warn!(error = %e, instance_type, "on-demand price unreadable");
                format!("on-demand prices unreadable (pricing:GetProducts): {e}")
            });
            let asked = Asked {
                at: Instant::now(),
                types: BTreeSet::new(),
                answer,
            };
            self.book().on_demand.insert(key.clone(), asked);
        }
        let book = self.book();
        match book.on_demand.get(&key).map(|a| &a.answer) {
            Some(Ok(Some(price))) => {
                known.on_demand.insert(instance_type.to_string(), *price);
            }
            Some(Ok(None)) => {
                let place = match region {
                    "" => String::new(),
                    region => format!(" in {region}"),
                };
                known.unknown.push(format!(
                    "the Price List has no on-demand Linux price for {instance_type}{place}"
                ))
            }
            Some(Err(why)) if !known.unknown.contains(why) => known.unknown.push(why.clone()),
            _ => {}
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
            on_demand_in_document(&document("0.0416000000")),
            Ok(Some(0.0416))
        );
    }

    #[test]
    fn a_document_without_an_on_demand_term_has_no_price() {
        let reserved = serde_json::json!({"product": {}, "terms": {"Reserved": {}}}).to_string();
        assert_eq!(on_demand_in_document(&reserved), Ok(None));
        assert!(on_demand_in_document("not json").is_err());
    }

    fn types(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[tokio::test]
    async fn prices_are_asked_once_and_served_from_memory_within_the_hour() {
        let cloud = crate::cloud::fake::FakeCloud::new();
        cloud.set_spot_price("m5.large", "us-east-1a", 0.031);
        cloud.set_on_demand_price("m5.large", 0.096);
        let book = PriceBook::default();
        for _ in 0..3 {
            let known = book.prices(&cloud, "", &types(&["m5.large"])).await;
            assert_eq!(known.spot[&("m5.large".into(), "us-east-1a".into())], 0.031);
            assert_eq!(known.on_demand["m5.large"], 0.096);
            assert!(known.unknown.is_empty(), "{:?}", known.unknown);
        }
        assert_eq!(cloud.calls("spot_prices"), 1);
        assert_eq!(cloud.calls("on_demand_price"), 1);
        // A type not asked before: spot asked again, for both.
        cloud.set_on_demand_price("m5a.large", 0.086);
        let known = book
            .prices(&cloud, "", &types(&["m5.large", "m5a.large"]))
            .await;
        assert_eq!(cloud.calls("spot_prices"), 2);
        assert_eq!(known.on_demand.len(), 2);
    }

    #[tokio::test]
    async fn a_price_that_cannot_be_read_is_unknown_and_says_why() {
        let cloud = crate::cloud::fake::FakeCloud::new();
        cloud.fail_next("spot_prices", "not authorized");
        let book = PriceBook::default();
        let known = book.prices(&cloud, "", &types(&["m5.large"])).await;
        assert!(known.spot.is_empty());
        assert_eq!(known.unknown.len(), 2, "{:?}", known.unknown);
        assert!(known.unknown[0].contains("ec2:DescribeSpotPriceHistory"));
        assert!(known.unknown[0].contains("not authorized"));
        assert!(known.unknown[1].contains("no on-demand Linux price for m5.large"));
        // Remembered, not asked again within the hour.
        let again = book.prices(&cloud, "", &types(&["m5.large"])).await;
        assert_eq!(again, known);
        assert_eq!(cloud.calls("spot_prices"), 1);
    }

    #[test]
    fn each_region_asks_the_price_list_endpoint_that_serves_it() {
        assert_eq!(price_list_region("ap-northeast-1"), "ap-south-1");
        assert_eq!(price_list_region("eu-west-1"), "eu-central-1");
        assert_eq!(price_list_region("us-west-2"), "us-east-1");
        assert_eq!(price_list_region("sa-east-1"), "us-east-1");
    }
}
