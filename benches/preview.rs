//! The preview's cost with one group of N nodes: the wall time of
//! `spot-node-manager preview -o json` (a process: its start, the clients,
//! the reads and the plan), the apiserver requests it makes (from the
//! apiserver's own `apiserver_request_total` and `apiserver_response_sizes`,
//! read before and after), and its AWS calls (the emulator's record).
//!
//! The group's instances are real emulator instances (its ASG launches N),
//! so the plan orders N members; their Nodes are copies of a kops worker as
//! a real cluster serves it (~12 KB each, as `footprint` uses), created
//! directly. The group has a weekly refresh (its preview: N nodes). The
//! manager runs in `--dry-run` until the inventory lists every node, then is
//! stopped, so the requests counted are the preview's alone.
//!
//! Run: `cargo bench --bench preview` (3 and 1000 nodes; `PREVIEW_SIZES=1000`
//! to pick). Under `cargo test` a quick run with 3 nodes. Prints a table;
//! asserts only that the preview says the refresh of every node.

use snm_testkit as support;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use spot_node_manager::crd::NodeGroup;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::refresh::{RUN, group};
use support::{ZONES, assert_eventually};

const FIXTURE: &str = include_str!("../src/controllers/inventory/fixtures/kops-node.json");
const LABEL: &str = "snm.test/preview-bench";
/// The kinds the preview reads.
const READ: &[&str] = &[
    "nodegroups",
    "refreshers",
    "replenishers",
    "nodes",
    "pods",
    "poddisruptionbudgets",
    "leases",
];

/// The apiserver's counters of reads: per "VERB resource", requests and
/// bytes sent.
async fn apiserver_counts(client: &kube::Client) -> BTreeMap<String, (f64, f64)> {
    let text = support::apiserver_metrics(client)
        .await
        .expect("apiserver metrics");
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let which = if line.starts_with("apiserver_request_total{") {
            0
        } else if line.starts_with("apiserver_response_sizes_sum{") {
            1
        } else {
            continue;
        };
        let (Some(verb), Some(resource), Some(scope)) = (
            support::series_label(line, "verb"),
            support::series_label(line, "resource"),
            support::series_label(line, "scope"),
        ) else {
            continue;
        };
        // Reads only, and a namespace's lists of the kinds the preview reads
        // cluster-wide are the namespace controller's (emptying an earlier
        // world's namespace), not the preview's.
        let ours = match (verb, scope) {
            ("GET", _) => true,
            ("LIST", "namespace") => resource == "nodegroups",
            ("LIST", _) => true,
            _ => false,
        };
        if !ours {
            continue;
        }
        let value = support::series_value(line);
        let entry = out.entry(format!("{verb} {resource}")).or_default();
        match which {
            0 => entry.0 += value,
            _ => entry.1 += value,
        }
    }
    out
}

type Counts = BTreeMap<String, (f64, f64)>;

/// Of the kinds the preview reads, the requests (and bytes) made between
/// two readings of the counters.
fn read_between(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .filter_map(|(k, (n, bytes))| {
            let (n0, b0) = before.get(k).copied().unwrap_or_default();
            let read = READ.iter().any(|r| k.ends_with(&format!(" {r}")));
            (*n > n0 && read).then(|| (k.clone(), (n - n0, bytes - b0)))
        })
        .collect()
}

struct Figures {
    wall: Duration,
    /// "VERB resource" -> (requests, bytes), the preview's alone.
    requests: BTreeMap<String, (f64, f64)>,
    aws_calls: usize,
    listed: i64,
}

async fn measure(nodes: usize) -> Figures {
    let world = support::World::new(&format!("bench-preview-{nodes}")).await;
    let kops = world
        .kops_group("nodes", &ZONES[..1], nodes as i32, &[])
        .await;
    let asg = kops.asgs[0].clone();
    let instance_group = asg
        .split_once('.')
        .map(|(ig, _)| ig.to_string())
        .expect("a kops ASG name");
    let ids = assert_eventually(&format!("{nodes} instances launched"), RUN, || async {
        let ids = world.asg_instances(&asg).await;
        (ids.len() == nodes).then_some(ids)
    })
    .await;
    let template: Node = serde_json::from_str(FIXTURE).expect("fixture");
    let nodes_api: Api<Node> = Api::all(world.client.clone());
    let run = world.account.clone();
    for id in &ids {
        nodes_api
            .create(
                &PostParams::default(),
                &support::node_copy(
                    &template,
                    &instance_group,
                    (LABEL, &run),
                    &format!("pv-{id}"),
                    id,
                ),
            )
            .await
            .expect("create node");
    }
    let mut ng = group("workers", "Worker", &kops.asgs, nodes as i32);
    ng.spec.refresh = Some(
        serde_json::from_value(serde_json::json!({"schedule": "0 0 4 * * Sun"})).expect("refresh"),
    );
    let groups: Api<NodeGroup> = world.api();
    groups
        .create(&PostParams::default(), &ng)
        .await
        .expect("create group");
    let (manager, _config) = world.start_manager_with("resyncInterval: 1m\n", &["--dry-run"], &[]);
    // Listed, and the Refresher the preview reads created: the inventory
    // writes the status before it creates the children.
    let refreshers: Api<spot_node_manager::crd::Refresher> = world.api();
    assert_eventually(&format!("{nodes} nodes listed"), RUN, || async {
        let g = groups.get("workers").await.ok()?;
        refreshers.get_opt("workers").await.ok()??;
        (g.status?.nodes.len() == nodes).then_some(())
    })
    .await;
    drop(manager);
    // Other controllers (the namespace controller retrying earlier worlds'
    // namespaces) read some of the same kinds now and then: measure in a
    // second in which nothing else read them.
    for _ in 0..30 {
        let a = apiserver_counts(&world.client).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let b = apiserver_counts(&world.client).await;
        if read_between(&a, &b).is_empty() {
            break;
        }
    }
    let aws_before = world.aws_actions().await.len();
    let before = apiserver_counts(&world.client).await;
    let started = Instant::now();
    let output = world.preview_output(&[]).await;
    let wall = started.elapsed();
    let after = apiserver_counts(&world.client).await;
    let aws_calls = world.aws_actions().await.len() - aws_before;
    assert!(
        output.status.success(),
        "preview failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let listed = answer
        .as_array()
        .and_then(|a| a.iter().find(|g| g["group"] == "workers"))
        .and_then(|g| g["next"]["total"].as_i64())
        .unwrap_or(0);
    assert_eq!(
        listed, nodes as i64,
        "the preview says every node: {answer}"
    );
    let requests = read_between(&before, &after);
    let _ = nodes_api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{LABEL}={run}")),
        )
        .await;
    Figures {
        wall,
        requests,
        aws_calls,
        listed,
    }
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let mut sizes: Vec<usize> = if full { vec![3, 1000] } else { vec![3] };
    if let Ok(list) = std::env::var("PREVIEW_SIZES") {
        sizes = list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
    }
    println!("manager: {}", support::manager::manager_binary().display());
    for n in sizes {
        let f = measure(n).await;
        let total: f64 = f.requests.values().map(|(r, _)| r).sum();
        let bytes: f64 = f.requests.values().map(|(_, b)| b).sum();
        println!(
            "{n} nodes: preview of {} node(s) in {:.2} s (a process, start to exit); {total} apiserver requests, {:.1} MiB read; {} AWS calls",
            f.listed,
            f.wall.as_secs_f64(),
            bytes / 1048576.0,
            f.aws_calls
        );
        for (what, (count, bytes)) in &f.requests {
            println!("  {what:<40} {count:>4} {:>10.1} KiB", bytes / 1024.0);
        }
    }
}
