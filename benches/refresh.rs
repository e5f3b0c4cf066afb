//! How long a refresh of N worker nodes takes against its lower bound, the
//! surplus capacity it pays for, and what a workload on the nodes sees, end
//! to end: the local control plane (apiserver, controller-manager,
//! scheduler) + moto + simulated kubelet, the manager as a process.
//!
//! Lower bound: N x (drain + node-ready), where node-ready is the emulator's
//! launch lag, then the longer of its Pending time and the simulated
//! kubelet's register + ready delay (plus its poll): a node counts once its
//! instance is InService and the Node Ready. Drains are left out of the
//! bound: the workload (Deployment `web`, 2 pods per node, PDB
//! maxUnavailable 1 by default) makes each drain wait for an evicted pod to be Ready
//! elsewhere before the next eviction. Surplus instance-minutes: instances
//! above N, integrated over the run (sampled every 250 ms). Workload: the
//! fewest Ready pods seen (every 250 ms) against the budget's floor.
//!
//! Each size runs twice, side by side: `maxSurge: 1` and `maxSurge: 25%`
//! (replacements launched ahead of their old node's termination).
//!
//! Run: `cargo bench --bench refresh` (3, 12 and 48 nodes; `REFRESH_SIZES=3,12`
//! for others; `REFRESH_BUDGET=24` for a budget allowing 24 pods
//! unavailable instead of 1: drains at once are paced by it;
//! `REFRESH_WORKLOAD=0` for no workload at all, so drains are instant;
//! `REFRESH_THROTTLE=0.3` for a run during which the emulator refuses a
//! random 30% of the manager's AWS requests with Throttling). Under `cargo
//! test` a quick run with 3 nodes and maxSurge 1.
//! Prints a table, and for `maxSurge: 1` where the run's time went: each
//! launch to its Node Ready (AWS and the kubelet, from the manager's log and
//! a watch on the Nodes) and each Node Ready to the launch that waited for
//! it (the manager's own time). Asserts only that runs succeed and the
//! workload stays within its budget.

use snm_testkit as support;

use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use support::ZONES;
use support::refresh::*;
use support::steady::*;
use support::workload::{assert_web_ready, deploy_web, sample_web};

const REGISTER: Duration = Duration::from_secs(1);
const READY: Duration = Duration::from_secs(2);
/// The simulated kubelet's poll (see `World::start_sim`).
const SIM_POLL: Duration = Duration::from_millis(300);
/// The emulator's defaults (scripts/moto_server.py).
const LAUNCH_LAG: Duration = Duration::from_secs(1);
const PENDING: Duration = Duration::from_secs(2);

fn node_ready() -> Duration {
    LAUNCH_LAG + PENDING.max(REGISTER + READY + SIM_POLL)
}

/// Where a run's time went, from the manager's log (when each launch was
/// asked for) and a watch on the Nodes (when each new one turned Ready).
#[derive(Default)]
struct Timeline {
    /// Run start to its first launch.
    start: f64,
    /// Each launch to its Node Ready: the emulator and the simulated
    /// kubelet (the bound's node-ready is their model).
    node_ready: Vec<f64>,
    /// Each Node Ready to the next launch that waited for it: the
    /// manager's own time (observe, decide, act) on the critical path.
    reaction: Vec<f64>,
    /// The last Node Ready to the run's end (the surplus removed).
    end: f64,
}

/// When each new Node of this world was first seen Ready, through a watch
/// (milliseconds after the simulated kubelet's write).
struct ReadyWatch {
    seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, DateTime<Utc>>>>,
    task: tokio::task::JoinHandle<()>,
}

fn watch_ready(world: &support::World, before: BTreeSet<String>) -> ReadyWatch {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, DateTime<Utc>>>> =
        Default::default();
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(world.client.clone());
    let config = watcher::Config::default().labels(&format!(
        "{}={}",
        support::sim::SIM_ACCOUNT_LABEL,
        world.account
    ));
    let into = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config));
        while let Some(event) = events.next().await {
            let (Ok(watcher::Event::Apply(node)) | Ok(watcher::Event::InitApply(node))) = event
            else {
                continue;
            };
            let name = kube::ResourceExt::name_any(&node);
            if spot_node_manager::k8s::node::is_ready(&node) && !before.contains(&name) {
                let mut seen = into.lock().expect("ready map");
                seen.entry(name).or_insert_with(Utc::now);
            }
        }
    });
    ReadyWatch { seen, task }
}

impl ReadyWatch {
    fn stop(self) -> Vec<DateTime<Utc>> {
        self.task.abort();
        let seen = self.seen.lock().expect("ready map");
        let mut times: Vec<DateTime<Utc>> = seen.values().copied().collect();
        times.sort();
        times
    }
}

/// The launches the run asked for (the surplus and each replacement
/// launched ahead), from the manager's log.
fn launches(log: &str) -> Vec<DateTime<Utc>> {
    let mut times: Vec<DateTime<Utc>> = log
        .lines()
        .filter(|l| l.contains("mutated action=\"set_desired_capacity\""))
        .filter(|l| l.contains("adding surplus") || l.contains("launching the replacement"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    times.sort();
    times
}

fn timeline(
    started: DateTime<Utc>,
    finished: DateTime<Utc>,
    launched: &[DateTime<Utc>],
    ready: &[DateTime<Utc>],
) -> Timeline {
    let secs =
        |from: DateTime<Utc>, to: DateTime<Utc>| (to - from).num_milliseconds() as f64 / 1000.0;
    // One launch, one new node: in order, they pair up.
    let pairs: Vec<(DateTime<Utc>, DateTime<Utc>)> = launched
        .iter()
        .copied()
        .zip(ready.iter().copied())
        .collect();
    let reaction = pairs
        .windows(2)
        .filter_map(|w| {
            let (previous_ready, next_launch) = (w[0].1, w[1].0);
            (next_launch > previous_ready).then(|| secs(previous_ready, next_launch))
        })
        .collect();
    Timeline {
        start: launched.first().map_or(0.0, |l| secs(started, *l)),
        node_ready: pairs.iter().map(|(l, r)| secs(*l, *r)).collect(),
        reaction,
        end: ready.last().map_or(0.0, |r| secs(*r, finished)),
    }
}

struct Figures {
    timeline: Timeline,
    nodes: usize,
    surge: &'static str,
    run: f64,
    bound: f64,
    mean_replacement: f64,
    surplus_minutes: f64,
    min_ready_pods: usize,
    pods: usize,
    /// The budget's maxUnavailable.
    budget: usize,
}

/// The workload budget's maxUnavailable (`REFRESH_BUDGET`, default 1).
fn budget() -> usize {
    std::env::var("REFRESH_BUDGET")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(1)
}

/// Whether the nodes carry the workload (`REFRESH_WORKLOAD=0`: none).
fn with_workload() -> bool {
    std::env::var("REFRESH_WORKLOAD").map_or(true, |w| w != "0")
}

/// The share of AWS requests refused with Throttling during the run
/// (`REFRESH_THROTTLE`, default none).
fn throttle() -> f64 {
    std::env::var("REFRESH_THROTTLE")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0.0)
}

async fn measure(nodes: usize, surge: &'static str) -> Figures {
    let per_asg = (nodes / ZONES.len()) as i32;
    let SteadyGroup {
        world,
        kops,
        manager,
        config: _config,
        sim: _sim,
        ..
    } = SteadyGroup::workers(&format!(
        "bench-refresh-{nodes}-{}",
        surge.trim_end_matches('%')
    ))
    .per_asg(per_asg)
    .delays(REGISTER, READY)
    .start()
    .await;
    let pods = if with_workload() { 2 * nodes } else { 0 };
    // The scheduler spreads the pods over the nodes it may use: until the
    // controller-manager lifts a new node's not-ready taint, a few nodes
    // can get most of them (one run had 10 of 24 on one node, a chain of
    // 10 evictions in one drain).
    support::assert_eventually("untainted nodes", Duration::from_secs(60), || async {
        let all = world.nodes().await?;
        let untainted = all.iter().all(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(|t| t.is_empty())
        });
        (all.len() == nodes && untainted).then_some(())
    })
    .await;
    if pods > 0 {
        deploy_web(&world, pods as i32, budget() as i32).await;
    }
    let placed = assert_web_ready(&world, pods).await;
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for (_, node) in &placed {
        *per_node.entry(node.clone()).or_default() += 1;
    }
    println!(
        "{nodes} nodes, maxSurge {surge}: the workload's pods per node from {} to {} ({} nodes with none)",
        per_node.values().min().copied().unwrap_or(0),
        per_node.values().max().copied().unwrap_or(0),
        nodes.saturating_sub(per_node.len())
    );
    let workload = sample_web(&world).await;
    let sampler = sample(&world, &kops.asgs, nodes as i32).await;
    let before: BTreeSet<String> = world
        .nodes()
        .await
        .unwrap_or_default()
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect();
    let ready_watch = watch_ready(&world, before);
    let max_surge = match surge.parse::<i64>() {
        Ok(n) => serde_json::json!(n),
        Err(_) => serde_json::json!(surge),
    };
    if throttle() > 0.0 {
        world.refuse_aws_share("Throttling", throttle()).await;
    }
    schedule_refresh(
        &world,
        "workers",
        // A slow eviction is measured, not failed on (the tests' 30 s is
        // tight for 48 nodes on two shared cores).
        serde_json::json!({"surplusNodes": 1, "maxSurge": max_surge, "drainTimeout": "5m"}),
    )
    .await;
    // A generous bound (tens of seconds a node): a figure, not a limit.
    let within = Duration::from_secs(120 + 30 * nodes as u64);
    let rf = run_finished_within(&world, "workers", within).await;
    if throttle() > 0.0 {
        world.refuse_aws_share("Throttling", 0.0).await;
    }
    let samples = sampler.stop().await;
    let workload = workload.stop().await;
    let ready = ready_watch.stop();
    let last = assert_run_succeeded(rf, &manager)
        .last_run
        .expect("last run");
    let run = last
        .finished
        .map(|f| (f - last.started).num_milliseconds() as f64 / 1000.0)
        .unwrap_or_default();
    let metrics = manager.assert_metrics().await;
    let metric = |name: &str| support::metric(&metrics, name).unwrap_or(f64::NAN);
    let mean_replacement = metric("spot_node_manager_node_replacement_duration_seconds_sum")
        / metric("spot_node_manager_node_replacement_duration_seconds_count");
    let surplus_minutes = samples.extra_instance_secs() / 60.0;
    let timeline = timeline(
        last.started,
        last.finished.unwrap_or(last.started),
        &launches(&manager.logs()),
        &ready,
    );
    Figures {
        timeline,
        nodes,
        surge,
        run,
        bound: nodes as f64 * node_ready().as_secs_f64(),
        mean_replacement,
        surplus_minutes,
        min_ready_pods: workload.min_ready(),
        pods,
        budget: budget(),
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes: Vec<usize> = match std::env::var("REFRESH_SIZES") {
        Ok(list) => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        Err(_) if full => vec![3, 12, 48],
        Err(_) => vec![3],
    };
    let surges: &[&'static str] = if full { &["1", "25%"] } else { &["1"] };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "workload: {}; AWS requests throttled during the run: {:.0}%",
        if with_workload() {
            "2 pods a node"
        } else {
            "none (instant drains)"
        },
        throttle() * 100.0
    );
    println!(
        "node ready = launch lag {}s + max(pending {}s, register {}s + ready {}s + poll {}s) = {}s; drains not in the bound; surplus 1, settleTime 1s; budget maxUnavailable {}",
        LAUNCH_LAG.as_secs_f64(),
        PENDING.as_secs_f64(),
        REGISTER.as_secs_f64(),
        READY.as_secs_f64(),
        SIM_POLL.as_secs_f64(),
        node_ready().as_secs_f64(),
        budget()
    );
    println!(
        "{:>5} {:>9} {:>9} {:>16} {:>7} {:>22} {:>24} {:>28}",
        "nodes",
        "maxSurge",
        "run (s)",
        "bound N*r (s)",
        "ratio",
        "mean replacement (s)",
        "surplus instance-minutes",
        "min Ready pods (floor)"
    );
    for (n, surge) in sizes
        .iter()
        .flat_map(|n| surges.iter().map(move |s| (*n, *s)))
    {
        let f = runtime.block_on(measure(n, surge));
        println!(
            "{:>5} {:>9} {:>9.1} {:>16.1} {:>7.2} {:>22.1} {:>24.2} {:>28}",
            f.nodes,
            f.surge,
            f.run,
            f.bound,
            f.run / f.bound,
            f.mean_replacement,
            f.surplus_minutes,
            format!(
                "{} of {} ({})",
                f.min_ready_pods,
                f.pods,
                f.pods.saturating_sub(f.budget)
            )
        );
        let t = &f.timeline;
        let one_at_a_time = f.surge == "1";
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        if one_at_a_time {
            println!(
                "      against N x the measured node-ready ({:.1} s): {:.2}; where it went: start to the first launch {:.2} s; {} launches to their Node Ready, mean {:.2} s (max {:.2}: AWS and the kubelet); {} Node Ready to a launch that waited for it, mean {:.2} s (max {:.2}), {:.1} s in all (the manager; with a workload, the drains too); the last Ready to the run's end {:.2} s",
                f.nodes as f64 * mean(&t.node_ready),
                f.run / (f.nodes as f64 * mean(&t.node_ready)),
                t.start,
                t.node_ready.len(),
                mean(&t.node_ready),
                max(&t.node_ready),
                t.reaction.len(),
                mean(&t.reaction),
                max(&t.reaction),
                t.reaction.iter().sum::<f64>(),
                t.end
            );
        }
        assert!(
            f.min_ready_pods + f.budget >= f.pods,
            "the workload fell below its budget's floor"
        );
    }
}
