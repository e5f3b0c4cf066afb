//! The reconcile tier, between the pure plan tests and the end-to-end runs:
//! the refresher's reconcile against a mocked apiserver (kube's tower-test
//! mock service, serving what a test sets up and recording each request)
//! and the fake cloud. It proves the order: observe, plan, persist, act, and
//! that a status that could not be written is never acted on.

use super::controller::reconcile_inner;
use crate::cloud::fake::FakeCloud;
use crate::context::Context;
use crate::controllers::vocabulary::tests::status_node;
use crate::crd::nodegroup::{OperationKind, OperationLock};
use crate::crd::refresher::{AsgDesired, RefreshPhase};
use crate::crd::{NodeGroup, NodeGroupStatus, Refresher, RefresherStatus};
use chrono::Utc;
use http::{Request, Response, StatusCode};
use kube::client::Body;
use std::sync::{Arc, Mutex};

const NS: &str = "team";

/// One request the mocked apiserver answered, and what the fake cloud's ASG
/// `a` wanted at that moment.
#[derive(Debug, Clone)]
struct Seen {
    call: String,
    body: serde_json::Value,
    a_desired_then: i32,
}

/// What the mocked apiserver serves.
struct ApiServer {
    refresher: Refresher,
    group: NodeGroup,
    cloud: FakeCloud,
    /// Answer status writes with a 500.
    refuse_status_writes: bool,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl ApiServer {
    fn answer(&self, method: &http::Method, path: &str) -> (StatusCode, serde_json::Value) {
        let base = format!("/apis/nodemanager.dev/v1alpha1/namespaces/{NS}");
        let at = |resource: &str| path == format!("{base}/{resource}");
        match method.as_str() {
            "GET" if at("refreshers/workers") => (StatusCode::OK, json(&self.refresher)),
            "GET" if at("nodegroups/workers") => (StatusCode::OK, json(&self.group)),
            "GET" if at("replenishers/workers") => (StatusCode::OK, replenisher()),
            "PATCH" if at("refreshers/workers/status") && self.refuse_status_writes => (
                StatusCode::INTERNAL_SERVER_ERROR,
                status_json(500, "etcdserver: request timed out"),
            ),
            "PATCH" if at("refreshers/workers/status") => (StatusCode::OK, json(&self.refresher)),
            "POST" if path.ends_with("/events") => (StatusCode::CREATED, serde_json::json!({})),
            _ => (StatusCode::NOT_FOUND, status_json(404, "not found")),
        }
    }
}

fn json<T: serde::Serialize>(object: &T) -> serde_json::Value {
    serde_json::to_value(object).unwrap_or_default()
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

fn status_json(code: u16, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "code": code,
    })
}

/// Serves requests until every client is gone.
async fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    server: ApiServer,
) {
    while let Some((request, respond)) = handle.next_request().await {
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let bytes = request
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_default();
        let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        let a_desired_then = server.cloud.group("a").map_or(-1, |g| g.desired);
        server.seen.lock().expect("log").push(Seen {
            call: format!("{method} {path}"),
            body,
            a_desired_then,
        });
        let (code, answer) = server.answer(&method, &path);
        let response = Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(&answer).unwrap_or_default()))
            .expect("response");
        respond.send_response(response);
    }
}

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
        "metadata": {"name": "workers", "namespace": NS, "generation": 1},
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

async fn context(client: kube::Client, cloud: &FakeCloud) -> Arc<Context> {
    let settings =
        crate::config::Settings::resolve(&Default::default(), Default::default(), |_| None)
            .expect("default settings");
    Arc::new(Context::new(
        client.clone(),
        client,
        Arc::new(settings),
        Arc::new(crate::clock::SystemClock),
        Arc::new(crate::metrics::Metrics::default()),
        crate::leader::Leadership::always(),
        Arc::new(cloud.clone()),
    ))
}

/// Runs one reconcile of the Refresher against the mocked apiserver.
async fn reconcile_once(
    cloud: &FakeCloud,
    group: NodeGroup,
    refresher: Refresher,
    refuse_status_writes: bool,
) -> (crate::Result<kube::runtime::controller::Action>, Vec<Seen>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(vec![]));
    let server = tokio::spawn(serve(
        handle,
        ApiServer {
            refresher: refresher.clone(),
            group,
            cloud: cloud.clone(),
            refuse_status_writes,
            seen: seen.clone(),
        },
    ));
    let ctx = context(kube::Client::new(service, NS), cloud).await;
    let result = reconcile_inner(Arc::new(refresher), &ctx).await;
    drop(ctx);
    server.abort();
    let seen = seen.lock().expect("log").clone();
    (result, seen)
}

fn calls(seen: &[Seen]) -> Vec<&str> {
    seen.iter()
        .map(|s| s.call.as_str())
        .filter(|c| !c.ends_with("/events"))
        .collect()
}

#[tokio::test]
async fn it_observes_then_persists_the_step_then_acts() {
    let (cloud, group, refresher) = scaling_up();
    let (result, seen) = reconcile_once(&cloud, group, refresher, false).await;
    result.expect("reconcile");
    let base = format!("/apis/nodemanager.dev/v1alpha1/namespaces/{NS}");
    assert_eq!(
        calls(&seen),
        vec![
            format!("GET {base}/refreshers/workers"),
            format!("GET {base}/nodegroups/workers"),
            format!("PATCH {base}/refreshers/workers/status"),
        ],
        "observe (the Refresher, its group), then persist"
    );
    let write = &seen[2];
    assert_eq!(write.body["status"]["phase"], "ScalingUp");
    assert_eq!(write.body["status"]["message"], "adding surplus: a 1->2");
    assert_eq!(
        write.a_desired_then, 1,
        "the step was written before the ASG was touched"
    );
    // One describe to observe, then the action the status recorded.
    assert_eq!(cloud.calls("describe_groups"), 1);
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
