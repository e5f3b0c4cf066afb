//! For the reconcile tests: a mocked apiserver (a tower service that hands
//! each request to a task of the test's) serving the objects a test sets up,
//! recording every request with the fake cloud's desired counts at that
//! moment, and a controller Context over it, the fake cloud and a clock.

use crate::cloud::fake::FakeCloud;
use crate::context::Context;
use crate::crd::NodeGroup;
use http::{Request, Response, StatusCode};
use kube::client::Body;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

pub const NS: &str = "team";

/// One request the mocked apiserver answered.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method and path, e.g. `PATCH /apis/.../refreshers/workers/status`.
    pub call: String,
    pub body: serde_json::Value,
    /// Each watched ASG's desired count when the request arrived.
    pub desired_then: BTreeMap<String, i32>,
}

/// Serves `objects` (by API path) to GETs and to status writes on them.
pub struct MockApi {
    objects: BTreeMap<String, serde_json::Value>,
    /// Status writes to these paths are answered with a 500.
    refused: Vec<String>,
    /// Reads of these paths from the watch cache (`resourceVersion=0`)
    /// answer 404, as a cache that has not seen a new object yet.
    lagging: Vec<String>,
    cloud: FakeCloud,
    watched: Vec<String>,
    seen: Arc<Mutex<Vec<Seen>>>,
    clock: Arc<dyn crate::clock::Clock>,
}

/// The path of one of our custom resources in [`NS`].
pub fn path(plural: &str, name: &str) -> String {
    format!("/apis/nodemanager.dev/v1alpha1/namespaces/{NS}/{plural}/{name}")
}

/// Where the manager-wide disruption slots are kept (default settings).
pub fn slots_path() -> String {
    "/apis/coordination.k8s.io/v1/namespaces/default/leases/spot-node-manager-disruptions".into()
}

/// The slots' Lease with one slot, held by `holder` (`<ns>/<Refresher>`).
pub fn slot_held_by(holder: &str) -> serde_json::Value {
    let holders = serde_json::json!([{"holder": holder, "role": "Worker",
                                       "since": "2026-01-01T00:00:00Z"}]);
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "spot-node-manager-disruptions", "namespace": "default",
                     "resourceVersion": "3",
                     "annotations": {crate::k8s::disruption_slot::ANNOTATION: holders.to_string()}},
        "spec": {},
    })
}

/// Refresher `other` (a slot's holder that exists).
pub fn other_refresher() -> (String, serde_json::Value) {
    let other = serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "Refresher",
        "metadata": {"name": "other", "namespace": NS},
        "spec": {"nodeGroup": "other", "role": "Worker", "surplusNodes": 1,
                 "drainTimeout": "5m", "drainTimeoutAction": "Abort", "readyTimeout": "15m"},
    });
    (path("refreshers", "other"), other)
}

/// Empty Node and Pod lists (nothing protects any node).
pub fn no_nodes_or_pods() -> [(String, serde_json::Value); 2] {
    let empty = |kind: &str| serde_json::json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": []});
    [
        ("/api/v1/nodes".into(), empty("NodeList")),
        ("/api/v1/pods".into(), empty("PodList")),
    ]
}

/// A group's child resource whose reconcile the tests drive.
#[allow(async_fn_in_trait)] // Used with static dispatch only.
pub trait Reconciled: serde::Serialize + Sized {
    const PLURAL: &'static str;
    async fn reconcile(
        self: Arc<Self>,
        ctx: &Context,
    ) -> crate::Result<kube::runtime::controller::Action>;
}

/// Runs one reconcile of `child` (named `workers`) against the mocked
/// apiserver serving it, its group and `also`; with `refuse_status_writes`
/// the child's status writes fail. Returns the result and every request.
pub async fn reconcile_once<K: Reconciled>(
    cloud: &FakeCloud,
    group: NodeGroup,
    child: K,
    also: &[(String, serde_json::Value)],
    refuse_status_writes: bool,
) -> (crate::Result<kube::runtime::controller::Action>, Vec<Seen>) {
    let mut api = MockApi::new(cloud, &["a", "b", "c"])
        .serve(path(K::PLURAL, "workers"), &child)
        .serve(path("nodegroups", "workers"), &group);
    for (at, object) in also {
        api = api.serve(at.clone(), object);
    }
    if refuse_status_writes {
        api = api.refuse_status_writes(path(K::PLURAL, "workers"));
    }
    let (ctx, seen) = api.start().await;
    let result = Arc::new(child).reconcile(&ctx).await;
    let seen = seen.lock().expect("log").clone();
    (result, seen)
}

impl MockApi {
    /// `watched`: the fake cloud's ASGs whose desired count each request records.
    pub fn new(cloud: &FakeCloud, watched: &[&str]) -> MockApi {
        MockApi {
            objects: BTreeMap::new(),
            refused: vec![],
            lagging: vec![],
            cloud: cloud.clone(),
            watched: watched.iter().map(|w| w.to_string()).collect(),
            seen: Arc::default(),
            clock: Arc::new(crate::clock::SystemClock),
        }
    }

    /// The Context's clock (the system's by default).
    pub fn clock(mut self, clock: Arc<dyn crate::clock::Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn serve(mut self, path: String, object: &impl serde::Serialize) -> Self {
        let object = serde_json::to_value(object).unwrap_or_default();
        self.objects.insert(path, object);
        self
    }

    /// Status writes to the object at `path` fail, as when etcd times out.
    pub fn refuse_status_writes(mut self, path: String) -> Self {
        self.refused.push(path);
        self
    }

    /// The watch cache has not seen the object at `path` yet.
    pub fn lagging(mut self, path: String) -> Self {
        self.lagging.push(path);
        self
    }

    fn answer(&self, method: &str, path: &str, query: &str) -> (StatusCode, serde_json::Value) {
        let object = |p: &str| self.objects.get(p).cloned();
        let from_cache = query.split('&').any(|q| q == "resourceVersion=0");
        if method == "GET" && from_cache && self.lagging.iter().any(|l| l == path) {
            return not_found();
        }
        match (method, path.strip_suffix("/status")) {
            ("GET", None) => match object(path) {
                Some(o) => (StatusCode::OK, o),
                None => not_found(),
            },
            ("PATCH", Some(base)) if self.refused.iter().any(|r| r == base) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                status(500, "etcdserver: request timed out"),
            ),
            ("PATCH", Some(base)) => match object(base) {
                Some(o) => (StatusCode::OK, o),
                None => not_found(),
            },
            // A replace of a served object (the slots' Lease given back)
            // succeeds; its answer is the object as served.
            ("PUT", None) => match object(path) {
                Some(o) => (StatusCode::OK, o),
                None => not_found(),
            },
            ("POST", None) if path.ends_with("/events") => {
                (StatusCode::CREATED, serde_json::json!({}))
            }
            _ => not_found(),
        }
    }

    /// A Context whose client talks to this apiserver, and the log of what
    /// it was asked. The server runs until the Context is dropped.
    pub async fn start(self) -> (Arc<Context>, Arc<Mutex<Vec<Seen>>>) {
        // Our own channel, not tower-test: that crate turns on tokio's
        // `test-util` for the whole test build, so every crate above tokio
        // (the AWS SDK included) was compiled twice from cold, once with it
        // and once without (clippy of the product, the image).
        type Exchange = (Request<Body>, oneshot::Sender<Response<Body>>);
        let (sender, mut requests) = mpsc::unbounded_channel::<Exchange>();
        let service = tower::service_fn(move |request: Request<Body>| {
            let sender = sender.clone();
            async move {
                let (respond, response) = oneshot::channel();
                sender
                    .send((request, respond))
                    .map_err(|_| "mock apiserver stopped")?;
                response
                    .await
                    .map_err(|_| "mock apiserver dropped the request")
            }
        });
        let seen = self.seen.clone();
        let cloud = self.cloud.clone();
        let clock = self.clock.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = requests.recv().await {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let query = request.uri().query().unwrap_or_default().to_string();
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .unwrap_or_default();
                let desired_then = self
                    .watched
                    .iter()
                    .filter_map(|w| Some((w.clone(), self.cloud.group(w)?.desired)))
                    .collect();
                self.seen.lock().expect("log").push(Seen {
                    call: format!("{method} {path}"),
                    body: serde_json::from_slice(&bytes).unwrap_or_default(),
                    desired_then,
                });
                let (code, answer) = self.answer(&method, &path, &query);
                let response = Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&answer).unwrap_or_default()))
                    .expect("response");
                // The client may have given up on it (a test's timeout).
                let _ = respond.send(response);
            }
        });
        let client = kube::Client::new(service, NS);
        let settings =
            crate::config::Settings::resolve(&Default::default(), Default::default(), |_| None)
                .expect("default settings");
        let ctx = Arc::new(Context::new(
            client.clone(),
            client,
            Arc::new(settings),
            clock,
            Arc::new(crate::metrics::Metrics::default()),
            crate::leadership::Leadership::always(),
            Arc::new(cloud),
        ));
        (ctx, seen)
    }
}

/// The calls made, Events left out.
pub fn calls(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .map(|s| s.call.clone())
        .filter(|c| !c.ends_with("/events"))
        .collect()
}

fn not_found() -> (StatusCode, serde_json::Value) {
    (StatusCode::NOT_FOUND, status(404, "not found"))
}

fn status(code: u16, message: &str) -> serde_json::Value {
    // The reason as the apiserver gives it (kube's `get_opt` reads it).
    let reason = match code {
        404 => "NotFound",
        _ => "InternalError",
    };
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "code": code, "reason": reason,
    })
}
