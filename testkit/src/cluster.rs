//! Kubernetes objects tests put in a world: NodeGroups, PodDisruptionBudgets,
//! pods bound to a node; the Events recorded there.

use crate::world::World;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

impl World {
    /// Creates NodeGroup `group` in this world's namespace; as created.
    pub async fn create_group(
        &self,
        group: &spot_node_manager::crd::NodeGroup,
    ) -> spot_node_manager::crd::NodeGroup {
        let groups: Api<spot_node_manager::crd::NodeGroup> = self.api();
        groups
            .create(&PostParams::default(), group)
            .await
            .expect("create the NodeGroup")
    }

    /// The status of our custom resource `K` named `name` now (it must
    /// have one).
    pub async fn status_of<K>(&self, name: &str) -> K::Status
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + kube::core::object::HasStatus
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
        K::Status: Clone,
    {
        let kind = K::kind(&Default::default()).to_string();
        let found = self.api::<K>().get(name).await;
        let found = found.unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
        let status = found.status().cloned();
        status.unwrap_or_else(|| panic!("{kind} {name} has no status"))
    }

    /// NodeGroup `name`'s status now (it must have one).
    pub async fn group_status(&self, name: &str) -> spot_node_manager::crd::NodeGroupStatus {
        self.status_of::<spot_node_manager::crd::NodeGroup>(name)
            .await
    }

    /// Replenisher `name`'s status now (it must have one).
    pub async fn replenisher_status(
        &self,
        name: &str,
    ) -> spot_node_manager::crd::replenisher::ReplenisherStatus {
        self.status_of::<spot_node_manager::crd::Replenisher>(name)
            .await
    }

    /// Merges `spec` into NodeGroup `name`'s spec, as `kubectl patch
    /// --type merge` would; the group as patched.
    pub async fn patch_group(
        &self,
        name: &str,
        spec: serde_json::Value,
    ) -> spot_node_manager::crd::NodeGroup {
        let groups: Api<spot_node_manager::crd::NodeGroup> = self.api();
        let patch = serde_json::json!({ "spec": spec });
        groups
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("patch NodeGroup {name} with {patch}: {e}"))
    }

    /// Merges `patch` into Node `name` (`kubectl patch node --type merge`).
    pub async fn patch_node(&self, name: &str, patch: serde_json::Value) {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("patch Node {name} with {patch}: {e}"));
    }

    /// Merges `patch` into Pod `name` of this world's namespace.
    pub async fn patch_pod(&self, name: &str, patch: serde_json::Value) {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = self.api();
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("patch Pod {name} with {patch}: {e}"));
    }

    /// Sets annotation `key` on Node `name` to `value`, or removes it (None).
    pub async fn annotate_node(&self, name: &str, key: &str, value: Option<&str>) {
        self.patch_node(name, annotation(key, value)).await;
    }

    /// Sets annotation `key` on Pod `name` to `value`, or removes it (None).
    pub async fn annotate_pod(&self, name: &str, key: &str, value: Option<&str>) {
        self.patch_pod(name, annotation(key, value)).await;
    }

    /// Cordons Node `name` as `kubectl cordon` does (someone else's cordon).
    pub async fn cordon(&self, name: &str) {
        self.patch_node(name, serde_json::json!({"spec": {"unschedulable": true}}))
            .await;
    }
}

/// The annotation that protects a node, or a pod's node, from disruption.
pub use spot_node_manager::crd::nodegroup::DO_NOT_DISRUPT;

fn annotation(key: &str, value: Option<&str>) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": { key: value }}})
}

/// The `policy/v1beta1` PodDisruptionBudget API (the 1.20 apiserver has no v1).
pub fn pdb_api(world: &World) -> Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget"),
        "poddisruptionbudgets",
    );
    Api::namespaced_with(world.client.clone(), &world.namespace, &resource)
}

/// Creates PDB `protected` selecting `app=protected` with `min_available`.
pub async fn create_pdb(world: &World, min_available: i32) {
    let pdb: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "protected"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "protected"}}}
    }))
    .expect("pdb");
    pdb_api(world)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("create pdb");
}

/// Changes the budget's floor; the disruption controller recomputes its status.
pub async fn set_min_available(world: &World, min_available: i32) {
    let patch = serde_json::json!({"spec": {"minAvailable": min_available}});
    pdb_api(world)
        .patch("protected", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("set minAvailable");
}

/// Waits until the disruption controller has computed the budget's current
/// spec and allows `allowed` disruptions; fails the test otherwise.
pub async fn assert_pdb_allows(world: &World, allowed: i64) {
    let pdbs = pdb_api(world);
    crate::assert_eventually(
        &format!("the disruption controller allows {allowed} disruption(s)"),
        std::time::Duration::from_secs(60),
        || async {
            let pdb = pdbs.get("protected").await.ok()?;
            let status = pdb.data.get("status")?;
            let observed = status.get("observedGeneration")?.as_i64();
            (observed == pdb.metadata.generation
                && status.get("disruptionsAllowed")?.as_i64() == Some(allowed))
            .then_some(())
        },
    )
    .await;
}

/// A bare pod bound to `node` (a simulated kubelet runs it if the node is one of its own).
pub fn bound_pod(
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                image: Some("registry.invalid/app".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// Reasons of the Events recorded in this world's namespace.
pub async fn event_reasons(world: &World) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = world.api();
    events
        .list(&Default::default())
        .await
        .map(|l| l.items.into_iter().filter_map(|e| e.reason).collect())
        .unwrap_or_default()
}

/// Waits until an Event of each of `expected` reasons is in the world's
/// namespace (90 s at most, the tests' usual wait, then fails naming what is
/// missing and what is there). An Event is sent after the status write a test waits on, so
/// reading them once races it.
pub async fn assert_events(world: &World, expected: &[&str]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let reasons = event_reasons(world).await;
        let missing: Vec<&&str> = expected
            .iter()
            .filter(|e| !reasons.iter().any(|r| r == *e))
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {missing:?} Event in 90 s; there are {reasons:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The Replenisher `name`'s RepairAllowed condition: (status, reason,
/// message), once written.
pub async fn repair_allowed(
    world: &World,
    name: &str,
) -> Option<(
    spot_node_manager::crd::condition::ConditionStatus,
    String,
    String,
)> {
    replenisher_condition(
        world,
        name,
        spot_node_manager::crd::condition::REPAIR_ALLOWED,
    )
    .await
}

/// Replenisher `name`'s condition of type `kind`: status, reason, message.
pub async fn replenisher_condition(
    world: &World,
    name: &str,
    kind: &str,
) -> Option<(
    spot_node_manager::crd::condition::ConditionStatus,
    String,
    String,
)> {
    let replenishers: Api<spot_node_manager::crd::Replenisher> = world.api();
    let status = replenishers.get(name).await.ok()?.status?;
    let c = status.conditions.into_iter().find(|c| c.type_ == kind)?;
    Some((c.status, c.reason, c.message))
}

/// Since when every control-plane pod of master Node `node` (kops's static
/// kube-apiserver and etcd-manager, as the simulated kubelet runs them) has
/// been Ready: the latest of their Ready transitions. None while one is
/// missing or not Ready.
pub async fn control_plane_ready_since(
    world: &World,
    node: &str,
) -> Option<chrono::DateTime<chrono::Utc>> {
    use spot_node_manager::k8s::control_plane::{
        APP_LABEL, NAMESPACE, REQUIRED_APPS, is_pod_ready,
    };
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(world.client.clone(), NAMESPACE);
    let selector = format!("{APP_LABEL} in ({})", REQUIRED_APPS.join(","));
    let list = pods
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .ok()?;
    let on_node: Vec<_> = list
        .items
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .collect();
    if on_node.len() < REQUIRED_APPS.len() || !on_node.iter().all(|p| is_pod_ready(p)) {
        return None;
    }
    let mut since = None;
    for pod in on_node {
        let ready = pod
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready")?;
        let t = ready.last_transition_time.as_ref()?.0;
        let t =
            chrono::DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32)?;
        since = Some(since.map_or(t, |s: chrono::DateTime<chrono::Utc>| s.max(t)));
    }
    since
}

/// A Deployment `name` with `labels`, whose pods (`pods` labels, one
/// `container`) are never scheduled on the simulated nodes: only the
/// Deployment matters.
pub fn unscheduled(
    name: &str,
    labels: &serde_json::Value,
    pods: &serde_json::Value,
    container: serde_json::Value,
) -> k8s_openapi::api::apps::v1::Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": pods},
            "template": {
                "metadata": {"labels": pods},
                "spec": {"nodeSelector": {"snm.test/none": "none"}, "containers": [container]},
            },
        },
    }))
    .expect("deployment")
}
