//! What one group costs in AWS calls per minute, at steady state and during
//! operations, as the node count grows: the manager as a process against the
//! local control plane, the emulator and the simulated kubelet, with the
//! default resync interval (1m).
//!
//! For each size, one group of N workers over three ASGs:
//! - **steady**: nothing happens for a window;
//! - **shortage**: one ASG runs out of capacity and loses a node; counted
//!   over a window from the loss (the replacement elsewhere, then waiting
//!   for the short ASG);
//! - **refresh**: a refresh run starts; counted from the schedule until the
//!   run ends or the window closes.
//! - **drift**: once the refresh has ended (up to 30 nodes), the group's
//!   `drift.action` set to `Replace` and `kops update cluster` run; counted
//!   from the update until the drift roll ends or the window (the refresh's)
//!   closes. Template versions are asked under the lock for such a group.
//!
//! The simulated kubelet registers a node 20 s after its instance runs and
//! makes it Ready 10 s later (a kops node takes minutes; compressed, but
//! not instant): operations run at a pace where calls per minute mean
//! something.
//!
//! The calls are the manager's own counter (`spot_node_manager_aws_calls_total`),
//! per operation. Goals (issue 13): ≤ 2 per minute steady, whatever N;
//! ≤ 20 per minute during an operation. A refresh or drift roll also gets
//! its calls per node replaced: a faster run makes more calls a minute, not
//! more per node.
//!
//! Run: `cargo test --bench api_budget -- --bench` (3, 30 and 300 nodes,
//! ~25 min; `BUDGET_SIZES=30` for one size, `BUDGET_SETTLE=60` to let a
//! large group settle longer before the steady window). `BUDGET_MASTERS=1`
//! adds kops's other group before the steady window: three masters on
//! their own instance types (a second region-wide set of spot prices to
//! read); `BUDGET_STEADY_ONLY=1` stops after the steady window.
//! Under `cargo test` a quick run with 3 nodes, short windows and a fast
//! simulated kubelet. Prints
//! tables; asserts nothing about the figures.

use snm_testkit as support;

use kube::api::Api;
use spot_node_manager::crd::{Refresher, Replenisher};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::refresh::*;
use support::steady::*;
use support::{ZONES, assert_eventually};

const NO_CAPACITY: &str = "snm.test/no-capacity";
const CALLS: &str = "spot_node_manager_aws_calls_total{";

/// Calls per operation, from the manager's metrics.
fn calls(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with(CALLS)) {
        let Some(op) = line
            .split("operation=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *out.entry(op.to_string()).or_default() += v;
        }
    }
    out
}

/// Calls per minute over a window, per operation and in total.
struct Rate {
    minutes: f64,
    per_op: BTreeMap<String, f64>,
}

impl Rate {
    fn between(
        before: &BTreeMap<String, f64>,
        after: &BTreeMap<String, f64>,
        took: Duration,
    ) -> Rate {
        let minutes = took.as_secs_f64() / 60.0;
        let per_op = after
            .iter()
            .map(|(op, v)| {
                (
                    op.clone(),
                    (v - before.get(op).copied().unwrap_or(0.0)) / minutes,
                )
            })
            .filter(|(_, v)| *v > 0.0)
            .collect();
        Rate { minutes, per_op }
    }

    fn total(&self) -> f64 {
        self.per_op.values().fold(0.0, |a, b| a + b)
    }

    fn breakdown(&self) -> String {
        // Operations not called in the window (exported at 0) are left out.
        self.per_op
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(op, v)| format!("{op} {v:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

struct Windows {
    /// The simulated kubelet's register and Ready delays.
    join: (Duration, Duration),
    steady: Duration,
    shortage: Duration,
    refresh: Duration,
}

async fn snapshot(steady: &SteadyGroup) -> (Instant, BTreeMap<String, f64>) {
    (
        Instant::now(),
        calls(&steady.manager.assert_metrics().await),
    )
}

async fn measure(nodes: usize, windows: &Windows) {
    let per_asg = (nodes / ZONES.len()) as i32;
    let steady = SteadyGroup::workers(&format!("bench-budget-{nodes}"))
        .per_asg(per_asg)
        .delays(windows.join.0, windows.join.1)
        .resync("1m")
        .start()
        .await;
    let world = &steady.world;
    let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
    let masters = flag("BUDGET_MASTERS");
    if masters {
        let kops = world.kops_group("master", &ZONES, 1, &[]).await;
        world
            .create_group(&group("masters", "Master", &kops.asgs, 3))
            .await;
        assert_eventually("the masters priced", RUN, || async {
            let groups: Api<spot_node_manager::crd::NodeGroup> = world.api();
            let status = groups.get("masters").await.ok()?.status?;
            let priced = status
                .auto_scaling_groups
                .iter()
                .filter(|a| a.spot_price.is_some());
            (priced.count() == 3).then_some(())
        })
        .await;
    }

    // Steady: settled first (the start's own sync; at 1,000 nodes the last
    // Nodes' own updates go on for a minute after all are Ready, and each
    // sync they cause describes the ASGs). BUDGET_SETTLE=60 waits longer.
    let settle = std::env::var("BUDGET_SETTLE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let (t0, before) = snapshot(&steady).await;
    tokio::time::sleep(windows.steady).await;
    let (t1, after) = snapshot(&steady).await;
    let phase = if masters { "steady+masters" } else { "steady" };
    report(nodes, phase, &Rate::between(&before, &after, t1 - t0));
    if flag("BUDGET_STEADY_ONLY") {
        return;
    }

    // Shortage: zone a has no capacity and loses a node.
    let short = steady.kops.asgs[0].clone();
    world.tag_asg(&short, NO_CAPACITY, "true").await;
    let lost = world.asg_instances(&short).await.remove(0);
    let (t0, before) = snapshot(&steady).await;
    world.lose_instance(&lost).await;
    tokio::time::sleep(windows.shortage).await;
    let (t1, after) = snapshot(&steady).await;
    report(nodes, "shortage", &Rate::between(&before, &after, t1 - t0));
    // Capacity comes back; the layout returns before the refresh.
    world.untag_asg(&short, NO_CAPACITY, "true").await;
    let replenishers: Api<Replenisher> = world.api();
    assert_eventually("the layout back, replenisher steady", RUN, || async {
        let rp = replenishers.get("workers").await.ok()?;
        let status = rp.status?;
        (status.raised.is_empty()
            && status.phase == spot_node_manager::crd::replenisher::ReplenishPhase::Steady
            && ready_count(&steady.groups, "workers").await? == nodes as i32)
            .then_some(())
    })
    .await;

    // Refresh: from the schedule until the run ends or the window closes.
    let refreshers: Api<Refresher> = world.api();
    let last_run = || async {
        refreshers
            .get_opt("workers")
            .await
            .ok()
            .flatten()
            .and_then(|rf| rf.status?.last_run)
    };
    let before_run = last_run().await;
    let (t0, before) = snapshot(&steady).await;
    schedule_refresh(world, "workers", serde_json::json!({})).await;
    let closes = t0 + windows.refresh;
    let mut outcome = "under way".to_string();
    while Instant::now() < closes {
        if let Some(run) = last_run().await
            && Some(&run) != before_run.as_ref()
        {
            outcome = format!("{:?}, {} replaced", run.result, run.replaced);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (t1, after) = snapshot(&steady).await;
    let rate = Rate::between(&before, &after, t1 - t0);
    let replaced = replaced_in_window(&refreshers, before_run.as_ref()).await;
    report_run(nodes, "refresh", &rate, &outcome, replaced);
    if outcome == "under way" {
        // A small group's run ends in a few minutes more; a large one's
        // takes hours, and the drift phase is skipped for it.
        if nodes > 30 {
            return;
        }
        // About 40 s a node with this kubelet's 30 s to Ready: 12 nodes
        // outlast the tests' usual bound.
        let within = RUN.max(Duration::from_secs(60 * nodes as u64));
        assert_eventually("the refresh run to end", within, || async {
            let run = last_run().await?;
            (Some(&run) != before_run.as_ref()).then_some(())
        })
        .await;
    }

    // Drift: rolled by the manager after `kops update cluster`.
    let groups: Api<spot_node_manager::crd::NodeGroup> = world.api();
    groups
        .patch(
            "workers",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"drift": {"action": "Replace"}}})),
        )
        .await
        .expect("drift Replace");
    let before_run = last_run().await;
    let (t0, before) = snapshot(&steady).await;
    world.kops_update_cluster(&steady.kops).await;
    let closes = t0 + windows.refresh;
    let mut outcome = "under way".to_string();
    while Instant::now() < closes {
        if let Some(run) = last_run().await
            && Some(&run) != before_run.as_ref()
        {
            outcome = format!(
                "{:?} {:?}, {} replaced",
                run.trigger, run.result, run.replaced
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (t1, after) = snapshot(&steady).await;
    let rate = Rate::between(&before, &after, t1 - t0);
    let replaced = replaced_in_window(&refreshers, before_run.as_ref()).await;
    report_run(nodes, "drift", &rate, &outcome, replaced);
}

/// Nodes replaced in the window: by the run that ended in it, or so far by
/// the run still under way.
async fn replaced_in_window(
    refreshers: &Api<Refresher>,
    before_run: Option<&spot_node_manager::crd::refresher::RunOutcome>,
) -> i32 {
    let Some(status) = refreshers
        .get_opt("workers")
        .await
        .ok()
        .flatten()
        .and_then(|rf| rf.status)
    else {
        return 0;
    };
    match &status.last_run {
        Some(run) if Some(run) != before_run && status.run_start.is_none() => run.replaced,
        // No run under way: `replaced` is the last run's, before the window.
        _ if status.run_start.is_none() => 0,
        _ => status.replaced,
    }
}

/// A run's window: its rate, then how the run went and its calls per node.
fn report_run(nodes: usize, phase: &str, rate: &Rate, outcome: &str, replaced: i32) {
    report(nodes, phase, rate);
    println!(
        "{nodes:>5} {:>9} run: {outcome}; {}",
        "",
        per_node(rate, replaced)
    );
}

/// A run's calls per node it replaced: the measure that does not grow
/// when the run goes faster (calls per minute do).
fn per_node(rate: &Rate, replaced: i32) -> String {
    let calls = rate.total() * rate.minutes;
    if replaced > 0 {
        format!(
            "{calls:.0} calls, {replaced} node(s) replaced, {:.1} calls per node replaced",
            calls / f64::from(replaced)
        )
    } else {
        format!("{calls:.0} calls, no node replaced yet")
    }
}

fn report(nodes: usize, phase: &str, rate: &Rate) {
    println!(
        "{:>5} {:>9} {:>8.2} {:>10.1}  {}",
        nodes,
        phase,
        rate.minutes,
        rate.total(),
        rate.breakdown()
    );
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (mut sizes, windows): (Vec<usize>, Windows) = if full {
        (
            vec![3, 30, 300],
            Windows {
                join: (Duration::from_secs(20), Duration::from_secs(10)),
                steady: Duration::from_secs(180),
                shortage: Duration::from_secs(90),
                refresh: Duration::from_secs(120),
            },
        )
    } else {
        (
            vec![3],
            Windows {
                join: (Duration::from_secs(1), Duration::from_secs(1)),
                steady: Duration::from_secs(10),
                shortage: Duration::from_secs(15),
                refresh: Duration::from_secs(20),
            },
        )
    };
    // BUDGET_SIZES=30,300 measures only those sizes.
    if let Ok(list) = std::env::var("BUDGET_SIZES") {
        sizes = list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
    }
    println!(
        "{:>5} {:>9} {:>8} {:>10}  per operation (calls/min)",
        "nodes", "phase", "minutes", "calls/min"
    );
    for n in sizes {
        measure(n, &windows).await;
    }
}
