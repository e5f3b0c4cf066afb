//! The reconcile tier for the replenisher (see `mock_api`): its reconcile
//! against a mocked apiserver and the fake cloud. A raise is recorded in the
//! status before it is ordered, a raise whose record could not be written is
//! never ordered, and a suspended group is left alone.

use super::controller::reconcile_inner;
use crate::cloud::fake::FakeCloud;
use crate::context::Context;
use crate::controllers::group_view::tests::status_node;
use crate::controllers::mock_api::{self, NS, Reconciled, Seen, calls, path};
use crate::crd::nodegroup::{OperationKind, OperationLock};
use crate::crd::{NodeGroup, NodeGroupStatus, Replenisher};
use chrono::Utc;
use std::sync::Arc;

/// Workers wanting 4 nodes over ASGs a, b, c with one Ready node each: one
/// short. The Replenisher holds the group's lock.
fn one_short() -> (FakeCloud, NodeGroup, Replenisher) {
    let now = Utc::now();
    let cloud = FakeCloud::new();
    let nodes = ["a", "b", "c"]
        .iter()
        .map(|asg| {
            let ids = cloud.add_group(asg, "zone-a", 1, 5, now - chrono::Duration::days(1));
            status_node(&format!("node-{asg}"), asg, &ids[0])
        })
        .collect();
    let mut group: NodeGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": "workers", "namespace": NS, "generation": 1, "resourceVersion": "7"},
        "spec": {"role": "Worker", "desired": 4,
                 "autoScalingGroups": [{"name": "a"}, {"name": "b"}, {"name": "c"}]},
    }))
    .expect("group");
    group.status = Some(NodeGroupStatus {
        observed_generation: Some(1),
        nodes,
        operation: Some(OperationLock {
            holder: OperationKind::Replenish,
            holder_name: "workers".into(),
            since: now,
        }),
        ..Default::default()
    });
    let replenisher: Replenisher = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "Replenisher",
        "metadata": {"name": "workers", "namespace": NS, "generation": 1},
        "spec": {"nodeGroup": "workers", "role": "Worker", "desired": 4,
                 "cooldown": "1m", "joinTimeout": "10m"},
    }))
    .expect("replenisher");
    (cloud, group, replenisher)
}

impl Reconciled for Replenisher {
    const PLURAL: &'static str = "replenishers";
    async fn reconcile(
        self: Arc<Self>,
        ctx: &Context,
    ) -> crate::Result<kube::runtime::controller::Action> {
        reconcile_inner(self, ctx).await
    }
}

async fn reconcile_once(
    cloud: &FakeCloud,
    group: NodeGroup,
    replenisher: Replenisher,
    refuse_status_writes: bool,
) -> (crate::Result<kube::runtime::controller::Action>, Vec<Seen>) {
    mock_api::reconcile_once(cloud, group, replenisher, &[], refuse_status_writes).await
}

#[tokio::test]
async fn a_raise_is_recorded_then_ordered_then_marked_landed() {
    let (cloud, group, replenisher) = one_short();
    let (result, seen) = reconcile_once(&cloud, group, replenisher, false).await;
    result.expect("reconcile");
    let status_path = format!("PATCH {}/status", path("replenishers", "workers"));
    assert_eq!(
        calls(&seen),
        vec![
            format!("GET {}", path("replenishers", "workers")),
            format!("GET {}", path("nodegroups", "workers")),
            format!("GET {}", path("refreshers", "workers")),
            status_path.clone(),
            status_path,
        ],
        "observe (the surplus a refresh left too), record the raise, (order it), record that it landed"
    );
    let writes: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.call.ends_with("/status"))
        .collect();
    let raising = &writes[0].body["status"]["raising"];
    assert_eq!(raising[0]["autoScalingGroup"], "a", "{raising}");
    assert_eq!(raising[0]["from"], 1);
    assert_eq!(raising[0]["to"], 2);
    assert_eq!(
        writes[0].desired_then.get("a"),
        Some(&1),
        "recorded before it was ordered"
    );
    assert_eq!(writes[1].desired_then.get("a"), Some(&2));
    assert!(
        writes[1].body["status"]["raising"].is_null(),
        "{}",
        writes[1].body
    );
    assert_eq!(
        cloud.calls("set_desired_capacity"),
        1,
        "one order for one node"
    );
    assert_eq!(cloud.group("a").map(|g| g.desired), Some(2));
}

#[tokio::test]
async fn a_raise_whose_record_could_not_be_written_is_not_ordered() {
    let (cloud, group, replenisher) = one_short();
    let (result, seen) = reconcile_once(&cloud, group, replenisher, true).await;
    let error = result.expect_err("a failed status write fails the reconcile");
    assert!(error.to_string().contains("request timed out"), "{error}");
    assert!(
        calls(&seen)
            .iter()
            .any(|c| c.ends_with("/replenishers/workers/status")),
        "{seen:?}"
    );
    assert_eq!(cloud.calls("set_desired_capacity"), 0);
    assert_eq!(cloud.group("a").map(|g| g.desired), Some(1));
}

#[tokio::test]
async fn a_suspended_group_one_short_is_left_alone() {
    let (cloud, mut group, replenisher) = one_short();
    group.spec.suspend = true;
    let (result, seen) = reconcile_once(&cloud, group, replenisher, false).await;
    result.expect("reconcile");
    // It only gives the group's lock back.
    let lock_writes: Vec<String> = calls(&seen)
        .into_iter()
        .filter(|c| c.starts_with("PATCH") && c.contains("/nodegroups/"))
        .collect();
    assert_eq!(
        lock_writes,
        vec![format!("PATCH {}/status", path("nodegroups", "workers"))],
        "{seen:?}"
    );
    assert_eq!(cloud.calls("set_desired_capacity"), 0);
    assert_eq!(cloud.calls("terminate_in_group"), 0);
    assert_eq!(cloud.group("a").map(|g| g.desired), Some(1));
}

/// The slots' Lease with a slot held by Refresher `team/other`, which
/// exists; no node or pod protected.
fn slot_held_by_other() -> [(String, serde_json::Value); 4] {
    let [nodes, pods] = mock_api::no_nodes_or_pods();
    [
        (
            mock_api::slots_path(),
            mock_api::slot_held_by(&format!("{NS}/other")),
        ),
        mock_api::other_refresher(),
        nodes,
        pods,
    ]
}

#[tokio::test]
async fn a_surplus_whose_slot_another_group_holds_is_kept_and_nothing_is_touched() {
    let (cloud, mut group, replenisher) = one_short();
    // Desired 2 with 3 Ready: one surplus node to take back.
    group.spec.desired = 2;
    let (result, seen) =
        mock_api::reconcile_once(&cloud, group, replenisher, &slot_held_by_other(), false).await;
    result.expect("reconcile");
    let calls = calls(&seen);
    assert!(
        calls
            .iter()
            .any(|c| c.contains("/leases/spot-node-manager-disruptions")),
        "the slot looked at: {calls:?}"
    );
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("PUT") || c.starts_with("POST /api/v1/namespaces")),
        "no slot taken, no eviction: {calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.starts_with("PATCH /api/v1/nodes")),
        "no node cordoned: {calls:?}"
    );
    let write = seen
        .iter()
        .rfind(|s| s.call.ends_with("/replenishers/workers/status"))
        .expect("a status write");
    let message = write.body["status"]["conditions"].to_string();
    assert!(
        message.contains("waiting for a disruption slot"),
        "{message}"
    );
    assert!(write.body["status"]["scaleIn"].is_null(), "{}", write.body);
    assert_eq!(cloud.calls("terminate_in_group"), 0);
}
