//! Where the manager's memory per node goes: the heap bytes held by each
//! per-node structure it keeps, for N nodes, counted by a counting global
//! allocator (no process, no cluster). Complements `footprint`, which
//! measures the whole process.
//!
//! - full Nodes: N copies of a kops worker as served (what the cache held
//!   before trimming);
//! - slim Nodes: the same decoded as `SlimNode` (what the inventory's cache
//!   holds now);
//! - a NodeGroup status listing N nodes (each controller that watches
//!   NodeGroups keeps one copy per group);
//! - its JSON (what each status write and each watch event carries).
//!
//! Run: `cargo bench --bench cache_bytes`. Prints a table; asserts nothing.

use k8s_openapi::api::core::v1::Node;
use spot_node_manager::crd::nodegroup::{NodeGroupStatus, NodeStatus};
use spot_node_manager::k8s::node::SlimNode;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const FIXTURE: &str = include_str!("../src/controllers/inventory/fixtures/kops-node.json");

/// Heap bytes `make` leaves held (what it returns, kept until measured).
fn held_by<T>(make: impl FnOnce() -> T) -> (isize, T) {
    let before = HELD.load(Ordering::Relaxed);
    let value = make();
    (HELD.load(Ordering::Relaxed) - before, value)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if full { &[300, 1000] } else { &[3] };
    let template: Node = serde_json::from_str(FIXTURE).expect("fixture");
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>14}",
        "nodes", "full Nodes", "slim Nodes", "group status", "status JSON"
    );
    for &n in sizes {
        let node = |i: usize| {
            let mut node = template.clone();
            node.metadata.name = Some(format!("i-{i:017x}"));
            node
        };
        let (full_bytes, full_nodes) = held_by(|| {
            (0..n)
                .map(|i| std::sync::Arc::new(node(i)))
                .collect::<Vec<_>>()
        });
        drop(full_nodes);
        let served: Vec<String> = (0..n)
            .map(|i| serde_json::to_string(&node(i)).expect("json"))
            .collect();
        let (slim_bytes, slim) = held_by(|| {
            served
                .iter()
                .map(|json| std::sync::Arc::new(serde_json::from_str::<SlimNode>(json)))
                .collect::<Vec<_>>()
        });
        assert!(slim.iter().all(|n| n.is_ok()), "every Node decodes slim");
        drop(slim);
        drop(served);
        let (status_bytes, status) = held_by(|| NodeGroupStatus {
            nodes: (0..n)
                .map(|i| NodeStatus {
                    name: format!("i-{i:017x}"),
                    instance_id: Some(format!("i-{i:017x}")),
                    auto_scaling_group: Some("nodes-ap-northeast-1a.example.com".into()),
                    availability_zone: Some("ap-northeast-1a".into()),
                    instance_type: Some("m5.large".into()),
                    lifecycle: Some("spot".into()),
                    launch_time: Some(chrono::Utc::now()),
                    ready: true,
                    unhealthy_since: None,
                    unschedulable: false,
                    problem: None,
                    drifted: None,
                    interruption: None,
                })
                .collect(),
            ..Default::default()
        });
        let json = serde_json::to_vec(&status).map(|v| v.len()).unwrap_or(0);
        let kib = |b: isize| format!("{:.1} KiB/node", b as f64 / 1024.0 / n as f64);
        println!(
            "{:>6} {:>14} {:>14} {:>14} {:>14}",
            n,
            kib(full_bytes),
            kib(slim_bytes),
            kib(status_bytes),
            kib(json as isize)
        );
    }
}
