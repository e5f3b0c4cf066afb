//! Node helpers shared by the controllers and the test kit: kops's labels,
//! the instance a Node runs on, readiness, cordon state, role membership.

use crate::crd::Role;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use std::collections::BTreeMap;

pub const INSTANCE_GROUP_LABEL: &str = "kops.k8s.io/instancegroup";
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
pub const LEGACY_MASTER_LABEL: &str = "node-role.kubernetes.io/master";
pub const WORKER_LABEL: &str = "node-role.kubernetes.io/node";

/// `aws:///<az>/<instance-id>` → (az, instance id).
pub fn parse_provider_id(provider_id: &str) -> Result<(String, String), String> {
    let rest = provider_id
        .strip_prefix("aws:///")
        .ok_or_else(|| format!("providerID {provider_id:?} does not start with aws:///"))?;
    let (az, id) = rest
        .split_once('/')
        .ok_or_else(|| format!("providerID {provider_id:?} is not aws:///<zone>/<instance-id>"))?;
    if az.is_empty() || !id.starts_with("i-") || id.len() < 3 || id.contains('/') {
        return Err(format!(
            "providerID {provider_id:?} is not aws:///<zone>/<instance-id>"
        ));
    }
    Ok((az.to_string(), id.to_string()))
}

/// The instance id a Node runs on, if its providerID says so.
pub fn node_instance_id(node: &Node) -> Option<String> {
    let provider_id = node.spec.as_ref()?.provider_id.as_deref()?;
    parse_provider_id(provider_id).ok().map(|(_, id)| id)
}

/// Ready condition True, and not being deleted.
pub fn is_ready(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Cordoned.
pub fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Does a Node with these labels have this role (kops's role labels)?
pub fn role_matches(role: Role, labels: &BTreeMap<String, String>) -> bool {
    match role {
        Role::Master => {
            labels.contains_key(CONTROL_PLANE_LABEL) || labels.contains_key(LEGACY_MASTER_LABEL)
        }
        Role::Worker => labels.contains_key(WORKER_LABEL),
    }
}

/// What the inventory reads of a Node, whichever form holds it: a full
/// `Node` (tests, the other controllers) or the cache's [`SlimNode`].
pub trait NodeView {
    fn node_name(&self) -> &str;
    fn node_labels(&self) -> &BTreeMap<String, String>;
    fn provider_id(&self) -> Option<&str>;
    /// Ready condition True, and not being deleted.
    fn ready(&self) -> bool;
    fn being_deleted(&self) -> bool;
    fn cordoned(&self) -> bool;
    fn annotation(&self, key: &str) -> Option<&str>;

    /// The instance the Node runs on, if its providerID says so.
    fn instance_id(&self) -> Option<String> {
        parse_provider_id(self.provider_id()?)
            .ok()
            .map(|(_, id)| id)
    }
}

impl NodeView for Node {
    fn node_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn node_labels(&self) -> &BTreeMap<String, String> {
        self.labels()
    }
    fn provider_id(&self) -> Option<&str> {
        self.spec.as_ref()?.provider_id.as_deref()
    }
    fn ready(&self) -> bool {
        is_ready(self)
    }
    fn being_deleted(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    fn cordoned(&self) -> bool {
        is_unschedulable(self)
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().get(key).map(String::as_str)
    }
}

impl<T: NodeView + ?Sized> NodeView for std::sync::Arc<T> {
    fn node_name(&self) -> &str {
        (**self).node_name()
    }
    fn node_labels(&self) -> &BTreeMap<String, String> {
        (**self).node_labels()
    }
    fn provider_id(&self) -> Option<&str> {
        (**self).provider_id()
    }
    fn ready(&self) -> bool {
        (**self).ready()
    }
    fn being_deleted(&self) -> bool {
        (**self).being_deleted()
    }
    fn cordoned(&self) -> bool {
        (**self).cordoned()
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        (**self).annotation(key)
    }
}

impl<T: NodeView + ?Sized> NodeView for &T {
    fn node_name(&self) -> &str {
        (**self).node_name()
    }
    fn node_labels(&self) -> &BTreeMap<String, String> {
        (**self).node_labels()
    }
    fn provider_id(&self) -> Option<&str> {
        (**self).provider_id()
    }
    fn ready(&self) -> bool {
        (**self).ready()
    }
    fn being_deleted(&self) -> bool {
        (**self).being_deleted()
    }
    fn cordoned(&self) -> bool {
        (**self).cordoned()
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        (**self).annotation(key)
    }
}

/// A Node as the inventory caches it, for every Node of the cluster: its
/// name, labels (a `nodeSelector` may name any), providerID, cordon, Ready
/// condition and our interruption annotation, and nothing else. Decoded
/// straight from the apiserver's JSON: a Node's images, managed fields,
/// addresses and capacity are skipped by the decoder, never held, not even
/// while a page of the list is decoded. 3.4 KiB per kops Node against 56.5
/// KiB as a full `Node` (`benches/cache_bytes.rs`).
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct SlimNode {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SlimSpec,
    #[serde(default)]
    pub status: SlimStatus,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct SlimSpec {
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    #[serde(default)]
    pub unschedulable: Option<bool>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct SlimStatus {
    /// The Ready condition's status is True (the only condition read).
    #[serde(default, rename = "conditions", deserialize_with = "ready_condition")]
    pub ready: bool,
}

/// The annotations the inventory reads; any other is dropped on decode.
const KEPT_ANNOTATIONS: &[&str] = &[crate::interruption::mark::ANNOTATION];

fn slim_meta<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde::Deserialize;
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        // The watcher resumes from the last object's resourceVersion.
        resource_version: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        annotations: Option<BTreeMap<String, String>>,
        deletion_timestamp: Option<Time>,
    }
    let m = Meta::deserialize(d)?;
    let annotations = m.annotations.map(|mut a| {
        a.retain(|k, _| KEPT_ANNOTATIONS.contains(&k.as_str()));
        a
    });
    Ok(ObjectMeta {
        name: m.name,
        resource_version: m.resource_version,
        labels: m.labels,
        annotations: annotations.filter(|a| !a.is_empty()),
        deletion_timestamp: m.deletion_timestamp,
        ..Default::default()
    })
}

fn ready_condition<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    use serde::Deserialize;
    #[derive(Deserialize)]
    struct Condition {
        #[serde(rename = "type")]
        type_: String,
        status: String,
    }
    let conditions: Option<Vec<Condition>> = Option::deserialize(d)?;
    Ok(conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl k8s_openapi::Resource for SlimNode {
    const API_VERSION: &'static str = <Node as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Node as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Node as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Node as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Node as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Node as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for SlimNode {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl NodeView for SlimNode {
    fn node_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn node_labels(&self) -> &BTreeMap<String, String> {
        self.labels()
    }
    fn provider_id(&self) -> Option<&str> {
        self.spec.provider_id.as_deref()
    }
    fn ready(&self) -> bool {
        !self.being_deleted() && self.status.ready
    }
    fn being_deleted(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    fn cordoned(&self) -> bool {
        self.spec.unschedulable.unwrap_or(false)
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().get(key).map(String::as_str)
    }
}

#[cfg(test)]
mod slim_tests {
    use super::*;

    const FIXTURE: &str = include_str!("../controllers/inventory/fixtures/kops-node.json");

    /// Everything a view answers, as text: two views that read the same
    /// give the same string.
    fn views(node: &dyn NodeView) -> String {
        format!(
            "{} {:?} {:?} ready={} deleting={} cordoned={} {:?}",
            node.node_name(),
            node.node_labels(),
            node.provider_id(),
            node.ready(),
            node.being_deleted(),
            node.cordoned(),
            node.annotation(crate::interruption::mark::ANNOTATION),
        )
    }

    #[test]
    fn a_slim_node_reads_as_the_full_node_it_was_decoded_from() {
        let mut json: serde_json::Value = serde_json::from_str(FIXTURE).expect("fixture");
        for (cordon, ready, deleting, marked) in [
            (false, "True", false, false),
            (true, "False", true, true),
            (true, "True", false, true),
        ] {
            json["spec"]["unschedulable"] = cordon.into();
            if let Some(conditions) = json["status"]["conditions"].as_array_mut() {
                for c in conditions.iter_mut().filter(|c| c["type"] == "Ready") {
                    c["status"] = ready.into();
                }
            }
            json["metadata"]["deletionTimestamp"] = if deleting {
                "2026-11-24T00:00:00Z".into()
            } else {
                serde_json::Value::Null
            };
            let annotations = json["metadata"]["annotations"]
                .as_object_mut()
                .expect("the fixture has annotations");
            if marked {
                annotations.insert(
                    crate::interruption::mark::ANNOTATION.into(),
                    r#"{"kind":"spot-interruption"}"#.into(),
                );
            } else {
                annotations.remove(crate::interruption::mark::ANNOTATION);
            }
            let full: Node = serde_json::from_value(json.clone()).expect("node");
            let slim: SlimNode = serde_json::from_value(json.clone()).expect("slim node");
            assert_eq!(
                views(&slim),
                views(&full),
                "{cordon} {ready} {deleting} {marked}"
            );
            assert!(slim.instance_id().is_some());
            assert_eq!(slim.instance_id(), full.instance_id());
            assert!(
                slim.annotations().len() <= 1,
                "only our annotation is kept: {:?}",
                slim.annotations()
            );
            assert_eq!(
                slim.resource_version(),
                full.resource_version(),
                "the watcher resumes from it"
            );
        }
    }

    #[test]
    fn a_node_without_spec_or_status_decodes_as_not_ready_and_not_cordoned() {
        let slim: SlimNode =
            serde_json::from_str(r#"{"metadata":{"name":"n"}}"#).expect("slim node");
        assert!(!slim.ready());
        assert!(!slim.cordoned());
        assert_eq!(slim.provider_id(), None);
        assert!(slim.node_labels().is_empty());
    }
}
