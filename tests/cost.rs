//! What spot saves, end to end: prices set in the emulator (its
//! DescribeSpotPriceHistory and Price List GetProducts), the group's cost
//! record computed by hand from them, prices that cannot be read, and a
//! raise that goes to the cheaper of two pools alike.

use snm_testkit as support;

use spot_node_manager::crd::NodeGroup;
use spot_node_manager::crd::condition::{COST_KNOWN, ConditionStatus, find};
use spot_node_manager::crd::nodegroup::CostRecord;
use std::collections::BTreeMap;
use std::time::Duration;
use support::refresh::events_with_reason;
use support::steady::SteadyGroup;
use support::{ZONES, assert_eventually};

const WAIT: Duration = Duration::from_secs(90);
const TYPES: [&str; 2] = ["m5.large", "m5a.large"];

/// Relative difference, for sums of binary fractions.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1e-9)
}

/// The emulator's GetProducts serves decoys beside the Linux on-demand
/// product (a capacity reservation's SKU at $0, capacitystatus values from
/// awsdocs/aws-cur-user-guide doc_source/product-columns.md at b6ae7626; a
/// product not bought on demand): the record holds only with the manager's
/// filters (marketoption OnDemand, as aws/karpenter-provider-aws asks in
/// pkg/providers/pricing/pricing.go at 09303f32); without it, the products
/// disagree and the hours go unpriced.
#[tokio::test]
async fn the_record_is_the_hours_run_at_the_prices_set_to_the_cent() {
    // Each zone and type its own spot price; on demand per type.
    let mut builder = SteadyGroup::workers("cost-record")
        .manager_config("costInterval: 2s\n")
        .on_demand_price("m5.large", 0.124)
        .on_demand_price("m5a.large", 0.112);
    for (z, zone) in ZONES.iter().enumerate() {
        for (t, instance_type) in TYPES.iter().enumerate() {
            let price = 0.030 + 0.002 * z as f64 + 0.001 * t as f64;
            builder = builder.spot_price(instance_type, zone, price);
        }
    }
    let g = builder.start().await;
    let world = &g.world;
    let record: CostRecord = assert_eventually("a few accountings", WAIT, || async {
        let cost = world.group_status("workers").await.cost?;
        let span = (cost.accounted_until - cost.since).num_milliseconds();
        (span >= 6_000).then_some(cost)
    })
    .await;
    // By hand: every node ran from the record's start to its last
    // accounting, at its type's price in its zone.
    let span = (record.accounted_until - record.since)
        .to_std()
        .expect("a span");
    let hours = span.as_secs_f64() / 3600.0;
    let spot: BTreeMap<(&str, &str), f64> = ZONES
        .iter()
        .enumerate()
        .flat_map(|(z, zone)| {
            TYPES.iter().enumerate().map(move |(t, instance_type)| {
                (
                    (*instance_type, *zone),
                    0.030 + 0.002 * z as f64 + 0.001 * t as f64,
                )
            })
        })
        .collect();
    let on_demand = BTreeMap::from([("m5.large", 0.124), ("m5a.large", 0.112)]);
    let nodes = world.group_status("workers").await.nodes;
    assert_eq!(nodes.len(), 3);
    let (mut spot_per_hour, mut on_demand_per_hour) = (0.0, 0.0);
    for node in &nodes {
        let instance_type = node.instance_type.as_deref().expect("a type");
        let zone = node.availability_zone.as_deref().expect("a zone");
        spot_per_hour += spot[&(instance_type, zone)];
        on_demand_per_hour += on_demand[instance_type];
    }
    let f = &record.this_month;
    assert!(
        close(f.spot_instance_hours, 3.0 * hours),
        "{f:?} over {hours} h"
    );
    assert!(close(f.spot_dollars, spot_per_hour * hours), "{f:?}");
    assert!(
        close(f.on_demand_equivalent_dollars, on_demand_per_hour * hours),
        "{f:?}"
    );
    let saving = (on_demand_per_hour - spot_per_hour) * hours;
    assert!(close(f.saving_dollars, saving), "{f:?}");
    assert_eq!(
        (f.on_demand_instance_hours, f.unpriced_instance_hours),
        (0.0, 0.0)
    );
    assert_eq!(record.total, record.this_month);
    let share = 100.0 * saving / (on_demand_per_hour * hours);
    let column = record.savings.clone().unwrap_or_default();
    assert!(column.ends_with(&format!("({share:.0}%)")), "{column}");
    // The prices as the pools' own, for the raise to weigh.
    let asgs = world.group_status("workers").await.auto_scaling_groups;
    // Each of the three, not a check that passes on an empty list.
    assert_eq!(
        asgs.iter().filter(|a| a.spot_price.is_some()).count(),
        3,
        "{asgs:?}"
    );
    let status = world.group_status("workers").await;
    let known = find(&status.conditions, COST_KNOWN).expect("CostKnown");
    assert_eq!(known.status, ConditionStatus::True, "{known:?}");
    // The metrics say what the status says (as of the same accounting).
    let metrics = g.manager.assert_metrics().await;
    let series = |kind: &str| {
        let name = format!(
            "spot_node_manager_group_cost_dollars{{namespace=\"{}\",group=\"workers\",period=\"month\",kind=\"{kind}\"}}",
            world.namespace
        );
        support::metric(&metrics, &name)
    };
    assert!(series("spot").is_some_and(|v| v > 0.0), "{metrics}");
    assert!(series("saving").is_some_and(|v| v > 0.0), "{metrics}");
}

#[tokio::test]
async fn with_prices_unreadable_operations_go_on_and_the_condition_says_why() {
    let g = SteadyGroup::workers("cost-denied")
        .manager_config("costInterval: 2s\n")
        .deny("DescribeSpotPriceHistory")
        .deny("GetProducts")
        .start()
        .await;
    // Started, all three Ready: nothing waited on a price.
    let world = &g.world;
    let status = assert_eventually("hours counted, unpriced", WAIT, || async {
        let status = world.group_status("workers").await;
        let cost = status.cost.as_ref()?;
        (cost.this_month.unpriced_instance_hours > 0.0).then_some(status)
    })
    .await;
    let known = find(&status.conditions, COST_KNOWN).expect("CostKnown");
    assert_eq!(
        (known.status.clone(), known.reason.as_str()),
        (ConditionStatus::False, "PricesUnknown")
    );
    for action in ["ec2:DescribeSpotPriceHistory", "pricing:GetProducts"] {
        assert!(known.message.contains(action), "{}", known.message);
    }
    let f = status.cost.expect("cost").this_month;
    assert_eq!(f.spot_instance_hours, f.unpriced_instance_hours);
    assert_eq!((f.spot_dollars, f.saving_dollars), (0.0, 0.0));
    assert_eq!(status.ready_nodes, Some(3));
}

/// A user who grants `pricing:GetProducts` because `CostKnown` asked for it
/// sees the prices within minutes: a failed read is tried again a minute
/// on (then two, four, up to fifteen), not a day later (before: the
/// failure was kept for the on-demand price's whole day).
#[tokio::test]
async fn on_demand_prices_denied_then_granted_are_read_within_minutes() {
    let g = SteadyGroup::workers("cost-granted")
        .manager_config("costInterval: 2s\n")
        .deny("GetProducts")
        .start()
        .await;
    let world = &g.world;
    assert_eventually("CostKnown False for GetProducts", WAIT, || async {
        let status = world.group_status("workers").await;
        let known = find(&status.conditions, COST_KNOWN)?;
        (known.status == ConditionStatus::False && known.message.contains("pricing:GetProducts"))
            .then_some(())
    })
    .await;
    world.allow_aws_action("GetProducts").await;
    let granted = std::time::Instant::now();
    let status = assert_eventually("priced once granted", Duration::from_secs(240), || async {
        let status = world.group_status("workers").await;
        let known = find(&status.conditions, COST_KNOWN)?;
        (known.status == ConditionStatus::True).then_some(status)
    })
    .await;
    let known = find(&status.conditions, COST_KNOWN).expect("CostKnown");
    assert_eq!(known.reason, "PricesKnown", "{known:?}");
    let ups = status.auto_scaling_groups.iter();
    assert_eq!(ups.filter(|a| a.on_demand_price.is_some()).count(), 3);
    eprintln!(
        "priced {:.0} s after the grant",
        granted.elapsed().as_secs_f64()
    );
}

/// kops's ordinary layout, masters on one instance type and workers on
/// another, in one region: after each group's first read, a steady stretch
/// of syncs (each group accounting every 2 s) asks DescribeSpotPriceHistory
/// nothing more; the next read is the hour's, for both types at once.
/// Before, one type set per region, replaced by each caller's, re-read at
/// every sync of each group.
#[tokio::test]
async fn two_groups_on_different_types_read_spot_prices_once_not_at_every_sync() {
    let g = SteadyGroup::workers("cost-two-types")
        .manager_config("costInterval: 2s\n")
        .start()
        .await;
    let world = &g.world;
    let masters = world.kops_group("master", &ZONES, 1, &[]).await;
    world
        .create_group(&support::refresh::group(
            "masters",
            "Master",
            &masters.asgs,
            3,
        ))
        .await;
    // Both groups priced: each one's own types, in every zone it runs.
    for (name, types) in [
        ("workers", ["m5.large", "m5a.large"]),
        ("masters", ["t3.medium", "t3a.medium"]),
    ] {
        assert_eventually(&format!("{name} priced"), WAIT, || async {
            let groups: kube::Api<NodeGroup> = world.api();
            let status = groups.get(name).await.ok()?.status?;
            let known = find(&status.conditions, COST_KNOWN)?;
            let priced = status
                .auto_scaling_groups
                .iter()
                .filter(|a| a.spot_price.is_some())
                .count();
            let own = status
                .nodes
                .iter()
                .filter(|n| {
                    n.instance_type
                        .as_deref()
                        .is_some_and(|t| types.contains(&t))
                })
                .count();
            (known.status == ConditionStatus::True && priced == 3 && own == 3).then_some(())
        })
        .await;
    }
    let reads = || async {
        let actions = world.aws_actions().await;
        actions
            .iter()
            .filter(|(_, a)| a == "DescribeSpotPriceHistory")
            .count()
    };
    let first = reads().await;
    // Each type set read once, in pages (the emulator's are of 5 entries:
    // two types, three zones, the entry in force under each of two product
    // descriptions is 12, so 3 pages): two reads at most.
    assert!(
        (1..=6).contains(&first),
        "{first} requests for the first reads"
    );
    let accounted = |name: &'static str| async move {
        world
            .group_status(name)
            .await
            .cost
            .map(|c| c.accounted_until)
    };
    let (workers_then, masters_then) = (accounted("workers").await, accounted("masters").await);
    tokio::time::sleep(Duration::from_secs(30)).await;
    // Both groups accounted again meanwhile (so their prices were asked).
    assert!(accounted("workers").await > workers_then);
    assert!(accounted("masters").await > masters_then);
    let steady = reads().await - first;
    eprintln!("spot price requests: {first} for the first reads, {steady} in 30 s after");
    assert_eq!(steady, 0, "no read until the hour's");
}

/// Two products match every filter at different prices, the second on a
/// later page (the emulator answers one document a page): the price is
/// refused, not the first page's taken, and `CostKnown` names both SKUs.
#[tokio::test]
async fn products_that_disagree_across_pages_are_refused_naming_their_skus() {
    let mut builder = SteadyGroup::workers("cost-twins").manager_config("costInterval: 2s\n");
    for instance_type in TYPES {
        builder = builder
            .on_demand_price(instance_type, 0.124)
            .on_demand_twin(instance_type, 0.131);
    }
    let g = builder.start().await;
    let world = &g.world;
    let known = assert_eventually("CostKnown False for the twins", WAIT, || async {
        let status = world.group_status("workers").await;
        let known = find(&status.conditions, COST_KNOWN)?;
        (known.status == ConditionStatus::False && known.message.contains("disagree"))
            .then_some(known.clone())
    })
    .await;
    assert_eq!(known.reason, "PricesUnknown", "{known:?}");
    assert!(
        known.message.contains("$0.124") && known.message.contains("$0.131"),
        "both products, each with its SKU: {}",
        known.message
    );
    let cost = world.group_status("workers").await.cost.expect("a record");
    assert_eq!(
        cost.this_month.on_demand_equivalent_dollars, 0.0,
        "{cost:?}"
    );
}

/// Hours the record cannot cover are said, not lost: a manager down for
/// longer than the gap bound (twice costInterval plus resyncInterval, at
/// least a minute: 60 s here) records the span as unaccounted. Before, an
/// accounting covered at most 15 minutes and the rest vanished unsaid.
#[tokio::test]
async fn a_manager_down_past_the_gap_bound_leaves_its_span_unaccounted_not_lost() {
    let config = "costInterval: 2s\n";
    let mut g = SteadyGroup::workers("cost-gap")
        .manager_config(config)
        .start()
        .await;
    assert_eventually("accounted", WAIT, || async {
        let cost = g.world.group_status("workers").await.cost?;
        (cost.this_month.spot_instance_hours > 0.0).then_some(())
    })
    .await;
    g.manager.kill();
    let down = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let last = g
        .world
        .group_status("workers")
        .await
        .cost
        .expect("a record");
    tokio::time::sleep(Duration::from_secs(72)).await;
    let (manager, file) =
        g.world
            .start_manager_with(&format!("resyncInterval: 2s\n{config}"), &[], &[]);
    (g.manager, g.config) = (manager, file);
    let world = &g.world;
    let status = assert_eventually("the gap recorded", WAIT, || async {
        let status = world.group_status("workers").await;
        let found = !status.cost.as_ref()?.unaccounted.is_empty();
        found.then_some(status)
    })
    .await;
    let record = status.cost.clone().expect("a record");
    let [gap] = record.unaccounted.as_slice() else {
        panic!("one gap: {:?}", record.unaccounted);
    };
    assert_eq!(gap.from, last.accounted_until, "from the last accounting");
    let span = (gap.to - gap.from).num_seconds();
    let down_for = down.elapsed().as_secs() as i64;
    assert!(
        (75..=down_for + 5).contains(&span),
        "{span} s, down {down_for} s"
    );
    let unaccounted = record.this_month.unaccounted_hours * 3600.0;
    assert!((unaccounted - span as f64).abs() < 1.0, "{unaccounted} s");
    // No instance hours for the gap: its 3 nodes' only since its end.
    let after_gap = (record.accounted_until - gap.to).num_milliseconds() as f64 / 1000.0;
    let added = record.this_month.spot_instance_hours - last.this_month.spot_instance_hours;
    let added = added * 3600.0;
    assert!(
        added <= 3.0 * after_gap + 1.0,
        "{added} instance-seconds, {after_gap} s on"
    );
    let known = find(&status.conditions, COST_KNOWN).expect("CostKnown");
    assert_eq!(
        (known.status.clone(), known.reason.as_str()),
        (ConditionStatus::False, "HoursUnaccounted"),
        "{known:?}"
    );
    let metrics = g.manager.assert_metrics().await;
    let series = format!(
        "spot_node_manager_group_instance_hours{{namespace=\"{}\",group=\"workers\",period=\"month\",kind=\"unaccounted\"}}",
        world.namespace
    );
    assert!(
        support::metric(&metrics, &series).is_some_and(|v| v > 0.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn of_two_pools_alike_a_raise_goes_to_the_cheaper_and_says_so() {
    const NO_CAPACITY: &str = "snm.test/no-capacity";
    // Zone a dear, c dearer than d: the pools c and d alike otherwise.
    let mut builder = SteadyGroup::workers("cost-raise");
    for instance_type in TYPES {
        for (zone, price) in ZONES.iter().zip([0.050, 0.040, 0.030]) {
            builder = builder.spot_price(instance_type, zone, price);
        }
    }
    let g = builder.start().await;
    let (world, kops) = (&g.world, &g.kops);
    let (c, d) = (kops.asgs[1].clone(), kops.asgs[2].clone());
    assert_eventually("the pools priced", WAIT, || async {
        let asgs = world.group_status("workers").await.auto_scaling_groups;
        let priced = |name: &str| {
            asgs.iter()
                .any(|a| a.name == name && a.spot_price.is_some())
        };
        (priced(&c) && priced(&d)).then_some(())
    })
    .await;
    // Zone a out of capacity and its node reclaimed: the replacement goes
    // elsewhere once a's own launch fails.
    world.tag_asg(&kops.asgs[0], NO_CAPACITY, "true").await;
    let lost = world.asg_instances(&kops.asgs[0]).await.remove(0);
    world.lose_instance_and_its_node(&lost).await;
    let said = assert_eventually("a raise in d, said", WAIT, || async {
        let events = events_with_reason(world, "ScaledUp").await;
        events
            .iter()
            .filter_map(|e| e.note.clone())
            .find(|n| n.contains(&format!("{d} 1->2")))
    })
    .await;
    assert!(
        said.contains("lowest spot price") && said.contains("$0.0300/h against $0.0400/h"),
        "{said}"
    );
    let c_desired = world.asg_snapshot(std::slice::from_ref(&c)).await[0].1;
    assert_eq!(c_desired, 1, "the dearer pool not raised");
}
