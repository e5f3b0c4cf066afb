//! The manager's memory with one group of N nodes: its resident set (VmRSS)
//! and peak (VmHWM) once the inventory lists every node, the manager as a
//! process against the local control plane.
//!
//! The Nodes are copies of a kops worker as a real cluster serves it
//! (`src/controllers/inventory/fixtures/kops-node.json`, ~12 KB: images,
//! managed fields, capacity, other tools' annotations), created directly
//! in the apiserver; the simulated kubelet's Nodes are a fraction of that
//! size and would flatter the figure. Their instances do not exist, so the
//! manager runs with `--dry-run` (nothing may act on such a group).
//!
//! Run: `cargo bench --bench footprint` (3, 300 and 1000 nodes), with
//! `SNM_MANAGER_BIN` to measure another build (e.g. a release one) and
//! `FOOTPRINT_SIZES=3,1000` to pick sizes. Under `cargo test` a quick run with
//! 3 nodes. Prints a table (RSS split into heap and stacks, and code paged
//! in from files); asserts only that the inventory lists every node. To look
//! inside: `FOOTPRINT_SMAPS=<dir>` keeps the manager's memory map, and
//! `FOOTPRINT_HOLD=<seconds>` keeps it running after the reading (for gdb's
//! `malloc_stats`, or SIGTERM under heaptrack).

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

async fn measure(nodes: usize) -> Memory {
    let world = support::World::new(&format!("bench-footprint-{nodes}")).await;
    let kops = world.kops_group("nodes", &ZONES[..1], 0, &[]).await;
    // kops names the ASG `<instance group>.<cluster>`.
    let instance_group = kops.asgs[0]
        .split_once('.')
        .map(|(ig, _)| ig.to_string())
        .expect("a kops ASG name");
    let template: Node = serde_json::from_str(FIXTURE).expect("fixture");
    let nodes_api: Api<Node> = Api::all(world.client.clone());
    let run = world.account.clone();
    for i in 0..nodes {
        nodes_api
            .create(
                &PostParams::default(),
                &support::node_copy(
                    &template,
                    &instance_group,
                    (LABEL, &run),
                    &format!("fp-{run}-{i}"),
                    &format!("i-{i:017x}"),
                ),
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
    let (manager, _config) = world.start_manager_with("resyncInterval: 1m\n", &["--dry-run"], &[]);
    assert_eventually(&format!("{nodes} nodes listed"), RUN, || async {
        let g = groups.get("workers").await.ok()?;
        (g.status?.nodes.len() == nodes).then_some(())
    })
    .await;
    // A few syncs and child reconciles after the first.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let figures = memory_kib(manager.child.id()).expect("the manager's /proc status");
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
    // Other tests' managers watch every Node: leave none behind.
    let _ = nodes_api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{LABEL}={run}")),
        )
        .await;
    figures
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
    println!("manager: {}", support::manager::manager_binary().display());
    println!(
        "{:>6} {:>10} {:>11} {:>11} {:>10}",
        "nodes", "RSS (MiB)", "anon (MiB)", "file (MiB)", "peak (MiB)"
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    for n in sizes {
        let m = measure(n).await;
        println!(
            "{:>6} {:>10.1} {:>11.1} {:>11.1} {:>10.1}",
            n,
            mib(m.rss),
            mib(m.anon),
            mib(m.file),
            mib(m.peak)
        );
    }
}
