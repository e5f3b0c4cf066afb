//! The interruption handler against moto's SQS and the real apiserver: a
//! notice for one of our nodes marks it (cordon, taint, load-balancer
//! exclusion, record) before AWS takes the instance, and the message is
//! deleted only then; duplicates, foreign instances and bad bodies. Each
//! test builds one steady group with a queue (`SteadyGroup`, its world
//! cleaned up on drop); the scenarios are grouped by kind, a file each.

mod drains;
mod lifecycle;
mod notices;
mod pools;
mod rebalance;
mod scheduled;

use snm_testkit as support;
use spot_node_manager::crd::labels::{
    EXCLUDE_FROM_LOAD_BALANCERS, INTERRUPTED_TAINT, INTERRUPTION_ANNOTATION,
};

use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use spot_node_manager::k8s::interruption_record::record_of;
use std::time::Duration;
use support::assert_eventually;
use support::interruption::{
    interrupt, rebalance_recommendation, scheduled_event, spot_warning, state_change,
};
use support::refresh::*;
use support::steady::*;
use support::workload::{assert_web_ready, deploy_web, ready_web_pods, sample_web};

/// How many of our taints `node` carries.
fn our_taints(node: &Node) -> usize {
    node.spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .filter(|t| t.key == INTERRUPTED_TAINT)
        .count()
}

/// The group's node on `instance`, if it is marked as interrupted.
async fn marked(nodes: &Api<Node>, instance: &str) -> Option<Node> {
    let list = nodes.list(&Default::default()).await.ok()?;
    let node = list.items.into_iter().find(|n| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| p.ends_with(instance))
    })?;
    let spec = node.spec.as_ref()?;
    let cordoned = spec.unschedulable == Some(true);
    let tainted = spec
        .taints
        .iter()
        .flatten()
        .any(|t| t.key == INTERRUPTED_TAINT && t.effect == "NoSchedule");
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LOAD_BALANCERS));
    (cordoned && tainted && labelled && record_of(&node).is_some()).then_some(node)
}

/// What the manager ordered of AWS (its own counters): raises
/// (SetDesiredCapacity) and terminations through an ASG.
fn assert_orders(metrics: &str, raises: u64, terminations: u64, why: &str) {
    assert_eq!(
        (
            support::performed(metrics, "set_desired_capacity"),
            support::performed(metrics, "terminate_instance_in_auto_scaling_group"),
        ),
        (raises, terminations),
        "{why}: {metrics}"
    );
}

/// When the drain of `instance` ended, from the group's last interruption
/// (kept there after the node is gone: it is terminated soon after).
async fn drain_ended(
    groups: &Api<spot_node_manager::crd::NodeGroup>,
    instance: &str,
) -> Option<chrono::DateTime<Utc>> {
    let last = groups
        .get("workers")
        .await
        .ok()?
        .status?
        .last_interruption?;
    (last.instance_id == instance)
        .then_some(last.drained)
        .flatten()
}

/// Waits until the ASG no longer holds `instance` in a lifecycle state:
/// its terminate lifecycle action completed (or timed out) and it is gone.
async fn assert_released(world: &support::World, asg: &str, instance: &str, what: &str) {
    assert_eventually(what, WAIT, || async {
        world
            .lifecycle_state(asg, instance)
            .await
            .is_none()
            .then_some(())
    })
    .await;
}

/// Sets the group's `spec.interruption`.
/// Sets the group's `spec.interruption` and returns once the manager has
/// synced that generation (its status says so): a notice sent at once
/// could otherwise be judged by the settings before (seen under load: a
/// 48h lead judged by the default 1h, the nodes not cordoned for days).
async fn set_interruption(steady: &SteadyGroup, interruption: serde_json::Value) {
    let patched = steady
        .world
        .patch_group(
            "workers",
            serde_json::json!({ "interruption": interruption }),
        )
        .await;
    let generation = patched.metadata.generation;
    assert_eventually("the new settings synced", WAIT, || async {
        let group = steady.groups.get("workers").await.ok()?;
        let seen = group.status?.observed_generation;
        (seen >= generation).then_some(())
    })
    .await;
}

async fn instances(world: &support::World, asgs: &[String]) -> Vec<String> {
    all_instances(world, asgs).await.into_iter().collect()
}

/// The instance of a node running `n` or more web pods.
async fn node_with_web_pods(world: &support::World, n: usize) -> String {
    assert_eventually("a node with web pods", WAIT, || async {
        let pods = ready_web_pods(world).await;
        let mut per_node: std::collections::BTreeMap<String, usize> = Default::default();
        for (_, node) in pods {
            *per_node.entry(node).or_default() += 1;
        }
        per_node
            .into_iter()
            .find(|(_, c)| *c >= n)
            .map(|(node, _)| node)
    })
    .await
}

/// The group's instances launched since `before`, and whether `victim` is
/// still in its ASG.
async fn since(
    world: &support::World,
    asgs: &[String],
    before: &[String],
    victim: &str,
) -> (Vec<String>, bool) {
    let now = instances(world, asgs).await;
    let new = now
        .iter()
        .filter(|id| !before.contains(id))
        .cloned()
        .collect();
    (new, now.iter().any(|id| id == victim))
}

/// Suspends or resumes an ASG's Launch process.
async fn launch(world: &support::World, asg: &str, on: bool) {
    world.scaling_process(asg, "Launch", on).await;
    if !on {
        // A description the manager asked before the suspension may serve
        // its next decision for up to FRESH_ENOUGH (docs/operations.md):
        // the tests that count raises want the suspension seen.
        tokio::time::sleep(spot_node_manager::cloud::cache::FRESH_ENOUGH).await;
    }
}

/// The ASG holding `instance`, from a snapshot.
fn asg_of(snapshot: &[(String, i32, Vec<String>)], instance: &str) -> String {
    snapshot
        .iter()
        .find(|(_, _, ids)| ids.iter().any(|id| id == instance))
        .map(|(name, _, _)| name.clone())
        .expect("the instance's ASG")
}

/// Settled after losing `lost`: the layout as before, one instance per ASG,
/// 3 Ready, none of `lost` left, and exactly one new instance per lost one.
async fn assert_settled(
    steady: &SteadyGroup,
    before: &[(String, i32, Vec<String>)],
    original: &[String],
    lost: &[String],
) {
    let (world, kops) = (&steady.world, &steady.kops);
    assert_eventually(
        "settled: layout, 3 Ready, one new per lost",
        RUN,
        || async {
            let after = world.asg_snapshot(&kops.asgs).await;
            let layout = desired_counts(&after) == desired_counts(before);
            let one_each = after.iter().all(|(_, _, ids)| ids.len() == 1);
            let now: Vec<String> = after.iter().flat_map(|(_, _, ids)| ids.clone()).collect();
            let new = now.iter().filter(|id| !original.contains(id)).count();
            let gone = lost.iter().all(|id| !now.contains(id));
            let nodes_gone = world.nodes().await.unwrap_or_default().iter().all(|n| {
                !lost
                    .iter()
                    .any(|id| n.metadata.name.as_deref() == Some(id.as_str()))
            });
            let ready = ready_count(&steady.groups, "workers").await? == 3;
            (layout && one_each && new == lost.len() && gone && nodes_gone && ready).then_some(())
        },
    )
    .await;
}
