//! How fast a burst of spot interruption warnings gets the doomed nodes
//! cordoned, and what it costs: N warnings (one per node of an N-node
//! group) put on the queue back to back, against the local control plane,
//! moto's SQS and the simulated kubelet, the manager as a process.
//!
//! Latency: from each warning's send to its Node seen cordoned and tainted
//! (polled every 50 ms, so figures carry up to ~50 ms of polling); and from
//! the first send until no pod of the workload (two per node, a budget that
//! allows it) is left on any warned node, deleted and gone. Cost:
//! AWS calls and Kubernetes mutations the manager made during the burst,
//! per message (its own counters).
//!
//! Run: `cargo bench --bench interruption` (12 and 48 nodes). Under `cargo
//! test` a quick run with 3 nodes. Prints a table; asserts only that every
//! node gets marked.

use snm_testkit as support;

use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use spot_node_manager::k8s::interruption_record::record_of;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::interruption::spot_warning;
use support::refresh::*;
use support::{ZONES, assert_eventually};

struct Figures {
    nodes: usize,
    p50: f64,
    p99: f64,
    max: f64,
    all_evicted: f64,
    aws_per_message: f64,
    describes_per_message: f64,
    kube_mutations_per_message: f64,
}

/// The manager's counter `name` summed over the series whose labels contain `filter`.
fn counter(metrics: &str, name: &str, filter: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

async fn measure(nodes: usize) -> Figures {
    let per_asg = (nodes / ZONES.len()) as i32;
    let steady = SteadyGroup::workers(&format!("bench-int-{nodes}"))
        .per_asg(per_asg)
        .interruption_queue()
        .start()
        .await;
    let (world, queue) = (&steady.world, steady.queue());
    let instances: Vec<String> = all_instances(world, &steady.kops.asgs)
        .await
        .into_iter()
        .collect();
    assert_eq!(instances.len(), nodes);
    let replicas = 2 * nodes as i32;
    support::workload::deploy_web(world, replicas, replicas).await;
    support::workload::assert_web_ready(world, replicas as usize).await;
    let pods_api: Api<k8s_openapi::api::core::v1::Pod> = world.api();
    let before = steady.manager.assert_metrics().await;
    let first_sent = Instant::now();
    let mut sent: BTreeMap<String, Instant> = BTreeMap::new();
    for id in &instances {
        queue.send(&spot_warning(id, Utc::now())).await;
        sent.insert(id.clone(), Instant::now());
    }
    let nodes_api: Api<Node> = Api::all(world.client.clone());
    let selector = format!("{}={}", support::sim::SIM_ACCOUNT_LABEL, world.account);
    let mut marked: BTreeMap<String, Instant> = BTreeMap::new();
    let mut all_evicted: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(180);
    while (marked.len() < nodes || all_evicted.is_none()) && Instant::now() < deadline {
        if all_evicted.is_none()
            && let Ok(pods) = pods_api
                .list(&ListParams::default().labels("app=web"))
                .await
        {
            let now = Instant::now();
            let left = pods.items.iter().any(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some_and(|n| instances.contains(n))
            });
            if !left {
                all_evicted = Some(now);
            }
        }
        if let Ok(list) = nodes_api
            .list(&ListParams::default().labels(&selector))
            .await
        {
            let now = Instant::now();
            for n in &list.items {
                if let Some(r) = record_of(n) {
                    marked.entry(r.instance_id).or_insert(now);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(marked.len(), nodes, "every node marked within 3 minutes");
    let all_evicted = all_evicted
        .expect("every pod evicted within 3 minutes")
        .duration_since(first_sent)
        .as_secs_f64();
    assert_eventually("every message deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    let after = steady.manager.assert_metrics().await;
    let mut latencies: Vec<f64> = marked
        .iter()
        .filter_map(|(id, at)| Some(at.duration_since(*sent.get(id)?).as_secs_f64()))
        .collect();
    latencies.sort_by(f64::total_cmp);
    let delta = |name: &str, filter: &str| {
        (counter(&after, name, filter) - counter(&before, name, filter)) / nodes as f64
    };
    Figures {
        nodes,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        max: latencies.last().copied().unwrap_or_default(),
        all_evicted,
        aws_per_message: delta("spot_node_manager_aws_calls_total", ""),
        describes_per_message: delta("spot_node_manager_aws_calls_total", "Describe"),
        kube_mutations_per_message: delta(
            "spot_node_manager_mutations_total",
            "target=\"kubernetes\"",
        ),
    }
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if full { &[12, 48] } else { &[3] };
    println!(
        "{:>5} {:>9} {:>9} {:>9} {:>16} {:>12} {:>16} {:>18}",
        "nodes",
        "p50 (s)",
        "p99 (s)",
        "max (s)",
        "all evicted (s)",
        "AWS/message",
        "describes/msg",
        "kube mutations/msg"
    );
    for &n in sizes {
        let f = measure(n).await;
        println!(
            "{:>5} {:>9.3} {:>9.3} {:>9.3} {:>16.3} {:>12.2} {:>16.2} {:>18.2}",
            f.nodes,
            f.p50,
            f.p99,
            f.max,
            f.all_evicted,
            f.aws_per_message,
            f.describes_per_message,
            f.kube_mutations_per_message
        );
    }
}
