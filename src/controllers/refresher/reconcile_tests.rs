//! The reconcile tier, between the pure plan tests and the end-to-end runs:
//! the refresher's reconcile against a mocked apiserver (serving what a test
//! sets up and recording each request)
//! and the fake cloud. It proves the order: observe, plan, persist, act, and
//! that a status that could not be written is never acted on.

use super::controller::reconcile_inner;
use crate::cloud::fake::FakeCloud;
use crate::context::Context;
use crate::controllers::group_view::tests::status_node;
use crate::controllers::mock_api::{
    self, NS, Reconciled, Seen, calls, no_nodes_or_pods, other_refresher, path, slot_held_by,
    slots_path,
};
use crate::crd::nodegroup::{OperationKind, OperationLock};
use crate::crd::refresher::{AsgDesired, RefreshPhase};
use crate::crd::{NodeGroup, NodeGroupStatus, Refresher, RefresherStatus};
use chrono::Utc;
use std::sync::Arc;

/// Workers over ASGs a, b, c with one Ready node each, and a refresh run in
/// `ScalingUp` that holds the group's lock and wants one surplus node in `a`.
fn scaling_up() -> (FakeCloud, NodeGroup, Refresher) {
    let now = Utc::now();
    let cloud = FakeCloud::new();
    let mut nodes = vec![];
    let mut planned = vec![];
    for asg in ["a", "b", "c"] {
        let ids = cloud.add_group(asg, "zone-a", 1, 5, now - chrono::Duration::days(1));
        nodes.push(status_node(&format!("node-{asg}"), asg, &ids[0]));
        planned.extend(ids);
    }
    let mut group: NodeGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": "workers", "namespace": NS, "generation": 1, "resourceVersion": "7"},
        "spec": {"role": "Worker", "desired": 3,
                 "autoScalingGroups": [{"name": "a"}, {"name": "b"}, {"name": "c"}]},
    }))
    .expect("group");
    group.status = Some(NodeGroupStatus {
        observed_generation: Some(1),
        nodes,
        operation: Some(OperationLock {
            holder: OperationKind::Refresh,
            holder_name: "workers".into(),
            since: now,
        }),
        ..Default::default()
    });
    let mut refresher: Refresher = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "Refresher",
        "metadata": {"name": "workers", "namespace": NS, "generation": 1},
        "spec": {"nodeGroup": "workers", "role": "Worker", "schedule": "0 3 * * *",
                 "timeZone": "UTC", "surplusNodes": 1, "drainTimeout": "5m",
                 "drainTimeoutAction": "Abort", "readyTimeout": "15m"},
    }))
    .expect("refresher");
    let desired = |asg: &str, desired| AsgDesired {
        auto_scaling_group: asg.into(),
        desired,
    };
    refresher.status = Some(RefresherStatus {
        phase: RefreshPhase::ScalingUp,
        run_start: Some(now),
        phase_since: Some(now),
        original_desired: vec![desired("a", 1), desired("b", 1), desired("c", 1)],
        surplus: vec![desired("a", 1)],
        total: planned.len() as i32,
        planned_instances: planned,
        ..Default::default()
    });
    (cloud, group, refresher)
}

/// The group's Replenisher, as a lock holder that exists.
fn replenisher() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "Replenisher",
        "metadata": {"name": "workers", "namespace": NS},
        "spec": {"nodeGroup": "workers", "role": "Worker", "desired": 3,
                 "cooldown": "1m", "joinTimeout": "10m"},
    })
}

impl Reconciled for Refresher {
    const PLURAL: &'static str = "refreshers";
    async fn reconcile(
        self: Arc<Self>,
        ctx: &Context,
    ) -> crate::Result<kube::runtime::controller::Action> {
        reconcile_inner(self, ctx).await
    }
}

/// One reconcile of the Refresher, its group's Replenisher existing, the
/// run holding its disruption slot.
async fn reconcile_once(
    cloud: &FakeCloud,
    group: NodeGroup,
    refresher: Refresher,
    refuse_status_writes: bool,
) -> (crate::Result<kube::runtime::controller::Action>, Vec<Seen>) {
    let [nodes, pods] = no_nodes_or_pods();
    let also = [
        (path("replenishers", "workers"), replenisher()),
        (slots_path(), slot_held_by(&format!("{NS}/workers"))),
        nodes,
        pods,
    ];
    mock_api::reconcile_once(cloud, group, refresher, &also, refuse_status_writes).await
}

#[tokio::test]
async fn it_observes_then_persists_the_step_then_acts() {
    let (cloud, group, refresher) = scaling_up();
    let (result, seen) = reconcile_once(&cloud, group, refresher, false).await;
    result.expect("reconcile");
    assert_eq!(
        calls(&seen),
        vec![
            format!("GET {}", path("refreshers", "workers")),
            format!("GET {}", path("nodegroups", "workers")),
            format!("GET {}", slots_path()),
            "GET /api/v1/nodes".to_string(),
            "GET /api/v1/pods".to_string(),
            format!("PATCH {}/status", path("refreshers", "workers")),
        ],
        "observe (the Refresher, its group, the slot, what protects its nodes), then persist"
    );
    let write = &seen[5];
    assert_eq!(write.body["status"]["phase"], "ScalingUp");
    assert_eq!(write.body["status"]["message"], "adding surplus: a 1->2");
    assert_eq!(
        write.desired_then.get("a"),
        Some(&1),
        "the step was written before the ASG was touched"
    );
    // A describe to observe; the step calls AWS, so it was planned again
    // on a fresh describe; then the action the status recorded.
    assert_eq!(cloud.calls("describe_groups"), 2);
    assert_eq!(cloud.calls("set_desired_capacity"), 1);
    assert_eq!(cloud.group("a").map(|g| g.desired), Some(2));
    assert_eq!(cloud.group("b").map(|g| g.desired), Some(1));
}

#[tokio::test]
async fn a_step_whose_status_could_not_be_written_is_not_acted_on() {
    let (cloud, group, refresher) = scaling_up();
    let (result, seen) = reconcile_once(&cloud, group, refresher, true).await;
    let error = result.expect_err("a failed status write fails the reconcile");
    assert!(error.to_string().contains("request timed out"), "{error}");
    assert!(
        calls(&seen)
            .iter()
            .any(|c| c.ends_with("/refreshers/workers/status")),
        "{seen:?}"
    );
    assert_eq!(
        cloud.calls("set_desired_capacity"),
        0,
        "nothing done that the status does not record"
    );
    assert_eq!(cloud.group("a").map(|g| g.desired), Some(1));
}

#[tokio::test]
async fn a_run_whose_lock_is_held_by_another_operation_touches_nothing() {
    let (cloud, mut group, refresher) = scaling_up();
    if let Some(status) = group.status.as_mut() {
        status.operation = Some(OperationLock {
            holder: OperationKind::Replenish,
            holder_name: "workers".into(),
            since: Utc::now(),
        });
    }
    let (result, seen) = reconcile_once(&cloud, group, refresher, false).await;
    result.expect("reconcile");
    assert_eq!(cloud.calls("set_desired_capacity"), 0);
    assert_eq!(cloud.calls("terminate_in_group"), 0);
    let write = seen
        .iter()
        .find(|s| s.call.ends_with("/refreshers/workers/status"))
        .expect("the pause is written");
    let message = write.body["status"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("run paused:"), "{message}");
}

#[tokio::test]
async fn a_run_whose_slot_another_group_holds_touches_nothing() {
    let (cloud, group, refresher) = scaling_up();
    let [nodes, pods] = no_nodes_or_pods();
    let also = [
        (path("replenishers", "workers"), replenisher()),
        (slots_path(), slot_held_by(&format!("{NS}/other"))),
        other_refresher(),
        nodes,
        pods,
    ];
    let (result, seen) = mock_api::reconcile_once(&cloud, group, refresher, &also, false).await;
    result.expect("reconcile");
    assert_eq!(cloud.calls("set_desired_capacity"), 0);
    let write = seen
        .iter()
        .find(|s| s.call.ends_with("/refreshers/workers/status"))
        .expect("the pause is written");
    let message = write.body["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("waiting for a disruption slot"),
        "{message}"
    );
    assert!(message.contains(&format!("{NS}/other")), "{message}");
    assert!(
        !calls(&seen).iter().any(|c| c.starts_with("PUT")),
        "the slot is not taken"
    );
}

/// A clock one second later at every reading: a reconcile that read it twice
/// would decide on two instants.
struct SteppingClock {
    start: chrono::DateTime<Utc>,
    readings: std::sync::atomic::AtomicI64,
}

impl crate::clock::Clock for SteppingClock {
    fn now(&self) -> chrono::DateTime<Utc> {
        let n = self
            .readings
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.start + chrono::Duration::seconds(n)
    }
}

#[tokio::test]
async fn a_run_falling_due_during_the_reconcile_is_not_planned_on_an_empty_view() {
    let (cloud, mut group, mut refresher) = scaling_up();
    if let Some(status) = group.status.as_mut() {
        status.operation = None;
    }
    // Idle, the next run half a second after the reconcile's first reading.
    let start = Utc::now();
    refresher.status = Some(RefresherStatus {
        next_run_from: Some(refresher.spec.schedule_key()),
        next_run: Some(start + chrono::Duration::milliseconds(500)),
        ..Default::default()
    });
    let clock = Arc::new(SteppingClock {
        start,
        readings: Default::default(),
    });
    let [nodes, pods] = no_nodes_or_pods();
    let (ctx, seen) = mock_api::MockApi::new(&cloud, &["a", "b", "c"])
        .serve(path("refreshers", "workers"), &refresher)
        .serve(path("nodegroups", "workers"), &group)
        .serve(path("replenishers", "workers"), &replenisher())
        .serve(slots_path(), &slot_held_by(&format!("{NS}/other")))
        .serve(nodes.0, &nodes.1)
        .serve(pods.0, &pods.1)
        .serve(
            "/apis/policy/v1/poddisruptionbudgets".into(),
            &serde_json::json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudgetList",
                                "metadata": {}, "items": []}),
        )
        .clock(clock)
        .start()
        .await;
    Arc::new(refresher)
        .reconcile(&ctx)
        .await
        .expect("reconcile");
    let seen = seen.lock().expect("log").clone();
    // Not due at the reading that chose not to describe the ASGs, so not due
    // for the plan either: no run skipped for want of Ready nodes (the three
    // are Ready; the view was empty).
    for write in seen.iter().filter(|s| s.call.starts_with("PATCH")) {
        let status = &write.body["status"];
        assert!(status.get("lastRun").is_none(), "{status}");
        // (`next` is the preview, made on the inventory's view.)
        assert!(
            !status["message"].to_string().contains("nodes are Ready"),
            "{status}"
        );
    }
    assert_eq!(cloud.calls("describe_groups"), 0, "idle and not due");
}
