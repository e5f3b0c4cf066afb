//! The manager's memory with one group of N nodes: its resident set (VmRSS)
//! and peak (VmHWM) once the inventory lists every node and has polled AWS
//! a few times, the manager as a process against the local control plane.
//!
//! The group's instances are real emulator instances (its ASG launches N)
//! and the manager polls AWS live, as in a cluster: the group status of N
//! members, the ASG descriptions and the SDK's buffers count. Their Nodes
//! are copies of a kops worker as a real cluster serves it
//! (`src/controllers/inventory/fixtures/kops-node.json`, ~12 KB: images,
//! managed fields, capacity, other tools' annotations), created directly in
//! the apiserver (the simulated kubelet's Nodes are a fraction of that size
//! and would flatter the figure); the bench renews their Leases as kubelets
//! would, so they stay Ready and the group is at rest at its desired count.
//! `FOOTPRINT_DRY_RUN=1` measures the manager in `--dry-run` with Nodes
//! alone and no instances, as the bench did before.
//!
//! Run: `cargo bench --bench footprint` (3, 300 and 1000 nodes, each
//! measured 130 s after the listing: two resyncs), with `SNM_MANAGER_BIN`
//! to measure another build (e.g. a release one) and `FOOTPRINT_SIZES=3,1000`
//! to pick sizes. Under `cargo test` a quick run with 3 nodes. Prints a table
//! (RSS split into heap and stacks, and code paged in from files); asserts
//! that the inventory lists every node and that the manager changed nothing
//! in AWS. To look inside: `FOOTPRINT_SMAPS=<dir>` keeps the manager's
//! memory map, and `FOOTPRINT_HOLD=<seconds>` keeps it running after the
//! reading (for gdb's `malloc_stats`, or SIGTERM under heaptrack).

use snm_testkit as support;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use spot_node_manager::crd::NodeGroup;
use std::time::Duration;
use support::refresh::{RUN, group};
use support::{ZONES, assert_eventually};

const FIXTURE: &str = include_str!("../src/controllers/inventory/fixtures/kops-node.json");
const LABEL: &str = "snm.test/footprint";

/// What a process holds, in KiB: its resident set, the part of it that is
/// heap and stacks (anonymous) and the part that is the binary and libraries
/// paged in from files, and its peak resident set.
#[derive(Clone, Copy)]
struct Memory {
    rss: u64,
    anon: u64,
    file: u64,
    peak: u64,
}

fn memory_kib(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some(Memory {
        rss: field("VmRSS:")?,
        anon: field("RssAnon:")?,
        file: field("RssFile:")?,
        peak: field("VmHWM:")?,
    })
}

/// Keeps the copied Nodes Ready as their kubelets would: renews each one's
/// Lease in `kube-node-lease` every 10 s (the node lifecycle controller's
/// grace is 40 s), until the token is cancelled.
fn heartbeat(
    client: kube::Client,
    names: Vec<String>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    use futures::StreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            futures::stream::iter(names.iter())
                .for_each_concurrent(8, |name| {
                    let (leases, now) = (leases.clone(), now.clone());
                    async move {
                        let lease = serde_json::json!({
                            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": name, "namespace": "kube-node-lease"},
                            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                                     "renewTime": now},
                        });
                        let params = PatchParams::apply("footprint-bench").force();
                        if let Err(e) = leases.patch(name, &params, &Patch::Apply(&lease)).await {
                            eprintln!("renew lease of {name}: {e}");
                        }
                    }
                })
                .await;
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
    })
}

/// What one measurement saw besides memory: the manager's AWS requests
/// while it was measured, and how many of them could change something
/// (there must be none: the group is at its desired count).
struct Activity {
    aws_calls: usize,
    aws_mutations: Vec<String>,
}

async fn measure(nodes: usize, live: bool, settle: Duration) -> (Memory, Activity) {
    let world = support::World::new(&format!("bench-footprint-{nodes}")).await;
    // Live, the ASG has launched an instance for every Node, as in a real
    // cluster, and the manager polls it; in `--dry-run` the instances do
    // not exist (nothing may act on such a group).
    let launched = if live { nodes as i32 } else { 0 };
    let kops = world.kops_group("nodes", &ZONES[..1], launched, &[]).await;
    let asg = kops.asgs[0].clone();
    // kops names the ASG `<instance group>.<cluster>`.
    let instance_group = asg
        .split_once('.')
        .map(|(ig, _)| ig.to_string())
        .expect("a kops ASG name");
    let ids: Vec<String> = if live {
        assert_eventually(&format!("{nodes} instances launched"), RUN, || async {
            let ids = world.asg_instances(&asg).await;
            (ids.len() == nodes).then_some(ids)
        })
        .await
    } else {
        (0..nodes).map(|i| format!("i-{i:017x}")).collect()
    };
    let template: Node = serde_json::from_str(FIXTURE).expect("fixture");
    let nodes_api: Api<Node> = Api::all(world.client.clone());
    let run = world.account.clone();
    let names: Vec<String> = ids.iter().map(|id| format!("fp-{run}-{id}")).collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let beat = heartbeat(world.client.clone(), names.clone(), stop.clone());
    for (name, id) in names.iter().zip(&ids) {
        nodes_api
            .create(
                &PostParams::default(),
                &support::node_copy(&template, &instance_group, (LABEL, &run), name, id),
            )
            .await
            .expect("create node");
    }
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(
            &PostParams::default(),
            &group("workers", "Worker", &kops.asgs, nodes as i32),
        )
        .await
        .expect("create group");
    let flags: &[&str] = if live { &[] } else { &["--dry-run"] };
    let (manager, _config) = world.start_manager_with("resyncInterval: 1m\n", flags, &[]);
    assert_eventually(&format!("{nodes} nodes listed"), RUN, || async {
        let g = groups.get("workers").await.ok()?;
        (g.status?.nodes.len() == nodes).then_some(())
    })
    .await;
    let aws_before = world.aws_actions().await.len();
    let mutations_before = world.aws_mutations().await.len();
    // Syncs and child reconciles after the first; live, at least two of
    // the inventory's AWS polls (one with the launch template look).
    tokio::time::sleep(settle).await;
    let figures = memory_kib(manager.child.id()).expect("the manager's /proc status");
    let activity = Activity {
        aws_calls: world.aws_actions().await.len() - aws_before,
        aws_mutations: world.aws_mutations().await.split_off(mutations_before),
    };
    if let Some(secs) = std::env::var("FOOTPRINT_HOLD")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        eprintln!("holding manager pid {} for {secs}s", manager.child.id());
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    // FOOTPRINT_SMAPS=<dir> keeps the manager's memory map, to see where
    // the resident set lies.
    if let Some(dir) = std::env::var_os("FOOTPRINT_SMAPS") {
        let to = std::path::Path::new(&dir).join(format!("smaps-{nodes}"));
        let from = format!("/proc/{}/smaps", manager.child.id());
        if let Err(e) = std::fs::copy(&from, &to) {
            eprintln!("could not keep {from} in {}: {e}", to.display());
        }
    }
    drop(manager);
    stop.cancel();
    let _ = beat.await;
    // Other tests' managers watch every Node: leave none behind.
    let _ = nodes_api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{LABEL}={run}")),
        )
        .await;
    (figures, activity)
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let mut sizes: Vec<usize> = if full { vec![3, 300, 1000] } else { vec![3] };
    // FOOTPRINT_SIZES=1000 measures only those sizes.
    if let Ok(list) = std::env::var("FOOTPRINT_SIZES") {
        sizes = list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
    }
    // FOOTPRINT_DRY_RUN=1: the manager in `--dry-run` with Nodes alone (no
    // instances), as this bench measured before 2026-11-28.
    let live = std::env::var("FOOTPRINT_DRY_RUN").map_or(true, |v| v != "1");
    // Live, long enough for two resyncs (1m) after the first listing.
    let settle = match (live, full) {
        (true, true) => Duration::from_secs(130),
        (true, false) => Duration::from_secs(20),
        (false, _) => Duration::from_secs(15),
    };
    println!(
        "manager: {} ({})",
        support::manager::manager_binary().display(),
        if live {
            "polling AWS live"
        } else {
            "--dry-run"
        }
    );
    println!(
        "{:>6} {:>10} {:>11} {:>11} {:>10} {:>10}",
        "nodes", "RSS (MiB)", "anon (MiB)", "file (MiB)", "peak (MiB)", "AWS calls"
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    for n in sizes {
        let (m, activity) = measure(n, live, settle).await;
        println!(
            "{:>6} {:>10.1} {:>11.1} {:>11.1} {:>10.1} {:>10}",
            n,
            mib(m.rss),
            mib(m.anon),
            mib(m.file),
            mib(m.peak),
            activity.aws_calls
        );
        assert!(
            activity.aws_mutations.is_empty(),
            "a group at its desired count, yet the manager changed AWS: {:?}",
            activity.aws_mutations
        );
    }
}
