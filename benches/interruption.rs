//! How fast a burst of spot interruption warnings gets the doomed nodes
//! cordoned, and what it costs: N warnings (one per node of an N-node
//! group) put on the queue back to back, against the local control plane,
//! moto's SQS and the simulated kubelet, the manager as a process.
//!
//! Latency: from each warning's send (its batch of 10 stored) to its Node
//! seen marked through a watch; its two legs from the manager's log (send
//! to handled: the queue; handled to the mark stored: the apiserver); and
//! from the first send until no pod of the workload (two per node, a budget
//! that allows it) is left on any warned node, deleted and gone. Cost:
//! AWS calls and Kubernetes mutations the manager made during the burst,
//! per message (its own counters).
//!
//! Run: `cargo test --features fault-injection --bench interruption --
//! --bench` in an `env-up` environment (12, 48 and 150 nodes, SQS shared
//! with the main emulator and on one of its own); `INTERRUPTION_SIZES=48`,
//! `INTERRUPTION_SQS=shared|separate`, `INTERRUPTION_MANAGER=<binary>` (a
//! release build with `--features test-support`) narrow it. Without
//! `--bench`, a quick run with 3 nodes. Prints a table; asserts only that
//! every node gets marked and every pod evicted.

use snm_testkit as support;

use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use spot_node_manager::k8s::interruption_record::record_of;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::interruption::spot_warning;
use support::refresh::*;
use support::steady::*;
use support::{ZONES, assert_eventually};

struct Figures {
    nodes: usize,
    /// SQS on an emulator of its own, or sharing the main one's lock.
    separate: bool,
    p50: f64,
    p99: f64,
    max: f64,
    /// p50 / p99 of each leg, from the manager's log: send to the message
    /// handled (the queue: the send, the long poll, the NodeGroups' listing),
    /// handled to the mark stored (the Node's read and patch).
    queue_leg: (f64, f64),
    mark_leg: (f64, f64),
    /// Send to the mark stored (the two legs together).
    stored: (f64, f64),
    all_evicted: f64,
    /// Nodes whose drain ended at its deadline with pods left.
    incomplete: usize,
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

/// The apiserver's own counters of Node requests, per verb: how many, and
/// their summed duration as it timed them (`apiserver_request_duration_seconds`:
/// from its receipt of a request to its answer, etcd included).
async fn apiserver_node_requests(client: &kube::Client) -> BTreeMap<String, (f64, f64)> {
    let Ok(text) = support::apiserver_metrics(client).await else {
        return BTreeMap::new();
    };
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let which = if line.starts_with("apiserver_request_duration_seconds_count{") {
            0
        } else if line.starts_with("apiserver_request_duration_seconds_sum{") {
            1
        } else {
            continue;
        };
        let plain_nodes = support::series_label(line, "resource") == Some("nodes")
            && support::series_label(line, "subresource") == Some("");
        let Some(verb) = support::series_label(line, "verb").filter(|_| plain_nodes) else {
            continue;
        };
        let entry = out.entry(format!("{verb} nodes")).or_default();
        match which {
            0 => entry.0 += support::series_value(line),
            _ => entry.1 += support::series_value(line),
        }
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

async fn measure(nodes: usize, separate: bool) -> Figures {
    let per_asg = (nodes / ZONES.len()) as i32;
    let sqs = match separate {
        true => Some(support::interruption::SeparateSqs::start().await),
        false => None,
    };
    let mut builder = SteadyGroup::workers(&format!("bench-int-{nodes}")).per_asg(per_asg);
    // A release build of the manager, as users run it (built with the
    // test-support feature, for the emulator's accounts); else this tree's
    // debug build.
    if let Ok(binary) = std::env::var("INTERRUPTION_MANAGER") {
        builder = builder.manager_binary(std::path::Path::new(&binary));
    }
    let steady = match &sqs {
        Some(sqs) => builder.interruption_queue_on(&sqs.endpoint),
        None => builder.interruption_queue(),
    }
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
    // Watching before the first send (its initial list in well before).
    let (all_marked, when_all_marked) = tokio::sync::oneshot::channel();
    let seen = watch_marks(world, nodes, all_marked);
    // The apiserver's own timing of the Node reads and writes, from just
    // before the first send until the last mark is seen.
    let apiserver_before = apiserver_node_requests(&world.client).await;
    let apiserver_client = world.client.clone();
    let apiserver = tokio::spawn(async move {
        let _ = when_all_marked.await;
        apiserver_node_requests(&apiserver_client).await
    });
    let evicted = all_gone_from(pods_api.clone(), instances.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first_sent = Instant::now();
    eprintln!("first send at {}", Utc::now().to_rfc3339());
    let mut sent: BTreeMap<String, Instant> = BTreeMap::new();
    let mut sent_at: BTreeMap<String, chrono::DateTime<Utc>> = BTreeMap::new();
    // Ten at a time (SendMessageBatch), each noted as sent once its batch is
    // stored: the emulator is spared 150 requests of the harness's own.
    for ids in instances.chunks(10) {
        let bodies: Vec<String> = ids.iter().map(|id| spot_warning(id, Utc::now())).collect();
        queue.send_batch(&bodies).await;
        for id in ids {
            sent.insert(id.clone(), Instant::now());
            sent_at.insert(id.clone(), Utc::now());
        }
    }
    eprintln!(
        "{nodes} sent in {:.2} s, last at {}",
        first_sent.elapsed().as_secs_f64(),
        Utc::now().to_rfc3339()
    );
    let Seen { marked, drained } = tokio::time::timeout(Duration::from_secs(180), seen)
        .await
        .expect("every node marked and its drain ended within 3 minutes")
        .expect("the watch of the marks");
    assert_eq!(marked.len(), nodes, "every node marked within 3 minutes");
    let all_evicted = tokio::time::timeout(Duration::from_secs(180), evicted)
        .await
        .expect("every pod evicted within 3 minutes")
        .expect("the watch of the pods")
        .duration_since(first_sent)
        .as_secs_f64();
    let incomplete = drained.values().filter(|left| **left > 0).count();
    let apiserver_after = apiserver.await.expect("the apiserver's counters");
    for (what, (count, secs)) in &apiserver_after {
        let (count0, secs0) = apiserver_before.get(what).copied().unwrap_or_default();
        let n = count - count0;
        if n > 0.0 {
            eprintln!(
                "apiserver until the last mark: {what} {n}, mean {:.3} s each as the apiserver timed it",
                (secs - secs0) / n
            );
        }
    }
    assert_eventually("every message deleted", WAIT, || async {
        (queue.remaining().await == 0).then_some(())
    })
    .await;
    let after = steady.manager.assert_metrics().await;
    // The calls by operation, for where a burst's cost goes.
    let by_operation = |m: &str| -> BTreeMap<String, f64> {
        m.lines()
            .filter(|l| l.starts_with("spot_node_manager_aws_calls_total{"))
            .filter_map(|l| {
                let op = l.split("operation=\"").nth(1)?.split('"').next()?;
                Some((op.to_string(), l.rsplit(' ').next()?.parse::<f64>().ok()?))
            })
            .collect()
    };
    let (calls_before, calls_after) = (by_operation(&before), by_operation(&after));
    let calls: Vec<String> = calls_after
        .iter()
        .map(|(op, n)| (op, n - calls_before.get(op).copied().unwrap_or_default()))
        .filter(|(_, n)| *n > 0.0)
        .map(|(op, n)| format!("{op} {n}"))
        .collect();
    eprintln!("AWS calls during the burst: {}", calls.join(", "));
    let mut latencies: Vec<f64> = marked
        .iter()
        .filter_map(|(id, at)| Some(at.duration_since(*sent.get(id)?).as_secs_f64()))
        .collect();
    latencies.sort_by(f64::total_cmp);
    let log = steady.manager.logs();
    let kept = std::env::temp_dir().join(format!(
        "snm-bench-interruption-{nodes}-{}.log",
        if separate { "separate" } else { "shared" }
    ));
    if std::fs::write(&kept, &log).is_ok() {
        eprintln!("the manager's log: {}", kept.display());
    }
    let (handled, stored) = legs(&log);
    let leg = |from: &BTreeMap<String, chrono::DateTime<Utc>>,
               to: &BTreeMap<String, chrono::DateTime<Utc>>| {
        let mut d: Vec<f64> = instances
            .iter()
            .filter_map(|id| Some((*to.get(id)? - *from.get(id)?).as_seconds_f64()))
            .collect();
        d.sort_by(f64::total_cmp);
        if d.is_empty() {
            return (f64::NAN, f64::NAN);
        }
        (percentile(&d, 0.50), percentile(&d, 0.99))
    };
    let queue_leg = leg(&sent_at, &handled);
    let mark_leg = leg(&handled, &stored);
    let stored = leg(&sent_at, &stored);
    let delta = |name: &str, filter: &str| {
        (counter(&after, name, filter) - counter(&before, name, filter)) / nodes as f64
    };
    Figures {
        nodes,
        separate,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        max: latencies.last().copied().unwrap_or_default(),
        queue_leg,
        mark_leg,
        stored,
        all_evicted,
        incomplete,
        aws_per_message: delta("spot_node_manager_aws_calls_total", ""),
        describes_per_message: delta("spot_node_manager_aws_calls_total", "Describe"),
        kube_mutations_per_message: delta(
            "spot_node_manager_mutations_total",
            "target=\"kubernetes\"",
        ),
    }
}

/// What one watch of the world's Nodes saw of the warned nodes: when each
/// was first seen with an interruption record (each change as the apiserver
/// commits it, no polling lag), and what each drain left when it ended
/// (`podsLeft`: 0 when every pod was evicted by the deadline).
#[derive(Default)]
struct Seen {
    marked: BTreeMap<String, Instant>,
    drained: BTreeMap<String, i32>,
}

/// Watches until `nodes` drains have ended.
fn watch_marks(
    world: &support::World,
    nodes: usize,
    all_marked: tokio::sync::oneshot::Sender<()>,
) -> tokio::task::JoinHandle<Seen> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api: Api<Node> = Api::all(world.client.clone());
    let selector = format!("{}={}", support::sim::SIM_ACCOUNT_LABEL, world.account);
    tokio::spawn(async move {
        let mut all_marked = Some(all_marked);
        let mut seen = Seen::default();
        let stream = watcher::watcher(api, watcher::Config::default().labels(&selector));
        let mut stream = std::pin::pin!(stream);
        while seen.drained.len() < nodes {
            let Some(event) = stream.next().await else {
                break;
            };
            let now = Instant::now();
            if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = event
                && let Some(r) = record_of(&n)
            {
                if r.drained.is_some() {
                    let left = r.pods_left.unwrap_or_default();
                    seen.drained.entry(r.instance_id.clone()).or_insert(left);
                }
                seen.marked.entry(r.instance_id).or_insert(now);
                if seen.marked.len() == nodes
                    && let Some(tell) = all_marked.take()
                {
                    let _ = tell.send(());
                }
            }
        }
        seen
    })
}

/// When no pod of the workload is left on any of `instances` (deleted and
/// gone), through a watch of the pods: the bench adds no polling load of its
/// own to the apiserver it measures.
fn all_gone_from(
    api: Api<k8s_openapi::api::core::v1::Pod>,
    instances: Vec<String>,
) -> tokio::task::JoinHandle<Instant> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    tokio::spawn(async move {
        let mut on: BTreeMap<String, String> = BTreeMap::new();
        let stream = watcher::watcher(api, watcher::Config::default().labels("app=web"));
        let mut stream = std::pin::pin!(stream);
        let mut listed = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    match node {
                        Some(n) if instances.contains(&n) => on.insert(p.name_any(), n),
                        _ => on.remove(&p.name_any()),
                    };
                }
                Ok(watcher::Event::Delete(p)) => {
                    on.remove(&p.name_any());
                }
                Ok(watcher::Event::InitDone) => listed = true,
                _ => {}
            }
            // Before the warnings every pod is on a warned node; done once
            // the watch has seen them all go.
            if listed && on.is_empty() {
                return Instant::now();
            }
        }
        Instant::now()
    })
}

/// From the manager's log, per instance (its node is named after it): when
/// its message was handled (the plan's line, `spot_interruption for <node>`)
/// and when its mark was stored (`mutated action="mark_interrupted"`).
#[allow(clippy::type_complexity)]
fn legs(
    log: &str,
) -> (
    BTreeMap<String, chrono::DateTime<Utc>>,
    BTreeMap<String, chrono::DateTime<Utc>>,
) {
    let (mut handled, mut stored) = (BTreeMap::new(), BTreeMap::new());
    for line in log.lines() {
        let Some((stamp, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(at) = chrono::DateTime::parse_from_rfc3339(stamp) else {
            continue;
        };
        let at = at.with_timezone(&Utc);
        if let Some(after) = rest.split("spot_interruption for ").nth(1) {
            let node = after.split([' ', ',']).next().unwrap_or_default();
            handled.entry(node.to_string()).or_insert(at);
        } else if rest.contains("action=\"mark_interrupted\"")
            && let Some(after) = rest.split("object=node/").nth(1)
        {
            let node = after.split(' ').next().unwrap_or_default();
            stored.entry(node.to_string()).or_insert(at);
        }
    }
    (handled, stored)
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes: Vec<usize> = match std::env::var("INTERRUPTION_SIZES") {
        Ok(list) => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        Err(_) if full => vec![12, 48, 150],
        Err(_) => vec![3],
    };
    // SQS sharing the main emulator's one lock (with Auto Scaling, EC2, the
    // simulated kubelet and the bench's own sends), or on one of its own.
    let modes: Vec<bool> = match std::env::var("INTERRUPTION_SQS").as_deref() {
        Ok("shared") => vec![false],
        Ok("separate") => vec![true],
        _ if full => vec![false, true],
        _ => vec![false],
    };
    println!(
        "{:>8} {:>5} {:>9} {:>9} {:>9} {:>15} {:>15} {:>15} {:>16} {:>10} {:>12} {:>16} {:>18}",
        "SQS",
        "nodes",
        "p50 (s)",
        "p99 (s)",
        "max (s)",
        "queue p50/p99",
        "mark p50/p99",
        "stored p50/p99",
        "all evicted (s)",
        "incomplete",
        "AWS/message",
        "describes/msg",
        "kube mutations/msg"
    );
    for n in sizes {
        for &separate in &modes {
            let f = measure(n, separate).await;
            println!(
                "{:>8} {:>5} {:>9.3} {:>9.3} {:>9.3} {:>15} {:>15} {:>15} {:>16.3} {:>10} {:>12.2} {:>16.2} {:>18.2}",
                if f.separate { "separate" } else { "shared" },
                f.nodes,
                f.p50,
                f.p99,
                f.max,
                format!("{:.2}/{:.2}", f.queue_leg.0, f.queue_leg.1),
                format!("{:.2}/{:.2}", f.mark_leg.0, f.mark_leg.1),
                format!("{:.2}/{:.2}", f.stored.0, f.stored.1),
                f.all_evicted,
                f.incomplete,
                f.aws_per_message,
                f.describes_per_message,
                f.kube_mutations_per_message
            );
        }
    }
}
