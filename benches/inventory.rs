//! How one inventory sync scales with the node count: wall time of the pure
//! status computation and of the whole observe+compute against the in-memory
//! fake cloud, and the number of AWS calls (which must not grow).
//!
//! Run: `cargo bench --bench inventory`. Prints a table; asserts nothing.

use chrono::{TimeZone, Utc};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use spot_node_manager::cloud::fake::FakeCloud;
use spot_node_manager::controllers::inventory::controller::observe_aws;
use spot_node_manager::controllers::inventory::instance_facts::InstanceFacts;
use spot_node_manager::controllers::inventory::plan;
use spot_node_manager::crd::NodeGroup;
use spot_node_manager::crd::labels::WORKER_LABEL;
use std::time::Instant;

fn node(name: &str, zone: &str, instance: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(WORKER_LABEL.to_string(), String::new())].into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("aws:///{zone}/{instance}")),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// Mean wall time of `round`, in microseconds.
fn micros_per_round(rounds: usize, mut round: impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..rounds {
        round();
    }
    started.elapsed().as_secs_f64() * 1e6 / rounds as f64
}

fn main() {
    // `cargo bench` passes --bench; under `cargo test` this is a quick smoke run.
    let full = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if full { &[2, 17, 167, 1667] } else { &[2] };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let t0 = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
    println!(
        "{:>7} {:>14} {:>18} {:>10}",
        "nodes", "compute (us)", "observe+compute (us)", "aws calls"
    );
    for &per_asg in sizes {
        let cloud = FakeCloud::new();
        let mut nodes = vec![];
        let mut asgs = vec![];
        for zone in ["a", "c", "d"] {
            let asg = format!("nodes-{zone}");
            for (i, id) in cloud
                .add_group(&asg, zone, per_asg, 10_000, t0)
                .iter()
                .enumerate()
            {
                nodes.push(node(&format!("n-{zone}-{i}"), zone, id));
            }
            asgs.push(serde_json::json!({"name": asg}));
        }
        let group: NodeGroup = serde_json::from_value(serde_json::json!({
            "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup", "metadata": {"name": "g"},
            "spec": {"role": "Worker", "autoScalingGroups": asgs, "desired": nodes.len()}
        }))
        .expect("group");
        let rounds = (20_000 / nodes.len()).clamp(5, 2000);
        cloud.reset_calls();
        // A first sync, as after a restart: every instance described.
        let view = runtime
            .block_on(observe_aws(
                &cloud,
                &InstanceFacts::default(),
                &group,
                &nodes,
            ))
            .expect("observe");
        let calls = cloud.total_calls();
        let status = |view: &plan::AwsView| {
            plan::inventory_status(&group, &nodes, view, &Default::default(), t0)
        };
        let compute = micros_per_round(rounds, || {
            std::hint::black_box(status(&view));
        });
        // Steady syncs: the instances' facts are known.
        let facts = InstanceFacts::default();
        let whole = micros_per_round(rounds, || {
            let view = runtime
                .block_on(observe_aws(&cloud, &facts, &group, &nodes))
                .expect("observe");
            std::hint::black_box(status(&view));
        });
        println!(
            "{:>7} {:>14.1} {:>18.1} {:>10}",
            nodes.len(),
            compute,
            whole,
            calls
        );
    }
}
