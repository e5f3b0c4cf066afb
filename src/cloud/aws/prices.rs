//! Prices: spot prices from EC2's DescribeSpotPriceHistory, on-demand
//! prices from the Price List API's GetProducts.

use super::AwsCloud;
use crate::Result;
use crate::cloud::prices::{SPOT_PRODUCTS, SpotPrice, newest, on_demand_of};
use aws_sdk_ec2::types::InstanceType;
use aws_sdk_pricing::types::{Filter, FilterType};

/// The Price List attributes of the instances a kops node runs as: Linux,
/// shared tenancy, no pre-installed software, a price for a used instance,
/// bought on demand (not a capacity block's SKU). Karpenter asks the same
/// (aws/karpenter-provider-aws, pkg/providers/pricing/pricing.go,
/// fetchOnDemandPricing, at 09303f32). And Linux/UNIX's own usage
/// operation, `RunInstances`, not another billing code under the same
/// operating system (awsdocs/amazon-ec2-user-guide,
/// doc_source/billing-info-fields.md, at 0f17a814: e.g. Red Hat BYOL Linux
/// is `RunInstances:00g0`).
const LINUX_SHARED: [(&str, &str); 6] = [
    ("operatingSystem", "Linux"),
    ("tenancy", "Shared"),
    ("preInstalledSw", "NA"),
    ("capacitystatus", "Used"),
    ("marketoption", "OnDemand"),
    ("operation", "RunInstances"),
];

impl AwsCloud {
    pub(super) async fn describe_spot_prices(&self, types: &[String]) -> Result<Vec<SpotPrice>> {
        let mut history = vec![];
        // Asked as of now: the entry in force in each zone, and any since.
        let now = aws_sdk_ec2::primitives::DateTime::from(std::time::SystemTime::now());
        let mut pages = self
            .clients
            .ec2
            .describe_spot_price_history()
            .set_instance_types(Some(
                types
                    .iter()
                    .map(|t| InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .set_product_descriptions(Some(SPOT_PRODUCTS.map(String::from).to_vec()))
            .start_time(now)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            self.count("DescribeSpotPriceHistory");
            let page = page.map_err(self.failed("DescribeSpotPriceHistory", types.join(",")))?;
            for p in page.spot_price_history() {
                let (Some(instance_type), Some(zone), Some(price)) =
                    (p.instance_type(), p.availability_zone(), p.spot_price())
                else {
                    continue;
                };
                let Ok(dollars_per_hour) = price.parse::<f64>() else {
                    continue;
                };
                let since = p
                    .timestamp()
                    .and_then(|t| chrono::DateTime::from_timestamp(t.secs(), t.subsec_nanos()));
                let price = SpotPrice {
                    instance_type: instance_type.as_str().to_string(),
                    zone: zone.to_string(),
                    dollars_per_hour,
                };
                history.push((price, since));
            }
        }
        Ok(newest(history))
    }

    pub(super) async fn get_on_demand_price(&self, instance_type: &str) -> Result<Option<f64>> {
        let region = self.region.clone().unwrap_or_default();
        let term = |field: &str, value: &str| {
            Filter::builder()
                .r#type(FilterType::TermMatch)
                .field(field)
                .value(value)
                .build()
        };
        let mut filters = vec![
            term("instanceType", instance_type),
            term("regionCode", &region),
        ];
        filters.extend(LINUX_SHARED.iter().map(|(f, v)| term(f, v)));
        let filters = filters
            .into_iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| crate::Error::Config(format!("a Price List filter: {e}")))?;
        let mut documents = vec![];
        // Every page: products that disagree may be on different ones.
        let mut pages = self
            .clients
            .pricing
            .get_products()
            .service_code("AmazonEC2")
            .format_version("aws_v1")
            .set_filters(Some(filters))
            .max_results(10)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            self.count("GetProducts");
            let page =
                page.map_err(self.failed("GetProducts", format!("{instance_type} in {region}")))?;
            documents.extend(page.price_list().iter().cloned());
        }
        on_demand_of(&documents, self.clients.price_list.currency()).map_err(|e| {
            crate::Error::Aws {
                operation: "GetProducts",
                resource: format!("{instance_type} in {region}"),
                code: None,
                message: e,
            }
        })
    }
}
