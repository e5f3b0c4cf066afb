//! Node helpers shared by the controllers and the test kit: kops's labels,
//! the instance a Node runs on, readiness, cordon state, role membership.

use crate::crd::Role;
use crate::crd::labels::{
    CONTROL_PLANE_LABEL, LEGACY_MASTER_LABEL, SCHEDULED_FOR_UPDATE_TAINT, WORKER_LABEL,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use std::collections::BTreeMap;

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

/// Ready condition True, and not being deleted.
pub fn is_ready(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Since when the Ready condition has not been True: its
/// lastTransitionTime, or the Node's creation when it has no Ready
/// condition yet (or no transition time). None while Ready is True.
pub fn not_ready_since(node: &Node) -> Option<chrono::DateTime<chrono::Utc>> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    if ready.is_some_and(|c| c.status == "True") {
        return None;
    }
    ready
        .and_then(|c| c.last_transition_time.as_ref())
        .or(node.metadata.creation_timestamp.as_ref())
        .and_then(|t| time_of(&t.0))
}

/// A k8s-openapi timestamp as chrono's.
pub(crate) fn time_of(t: &k8s_openapi::jiff::Timestamp) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32)
}

/// Cordoned.
pub fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Does a Node with these labels have this role (kops's role labels)?
pub fn role_matches(role: Role, labels: &(impl Labels + ?Sized)) -> bool {
    match role {
        Role::Master => labels.has(CONTROL_PLANE_LABEL) || labels.has(LEGACY_MASTER_LABEL),
        Role::Worker => labels.has(WORKER_LABEL),
    }
}

/// What the inventory reads of a Node, whichever form holds it: a full
/// `Node` (tests, the other controllers) or the cache's [`SlimNode`].
pub trait NodeView {
    fn node_name(&self) -> &str;
    fn node_labels(&self) -> &dyn Labels;
    fn provider_id(&self) -> Option<&str>;
    /// Ready condition True, and not being deleted.
    fn ready(&self) -> bool;
    /// Since when the Ready condition has not been True ([`not_ready_since`]).
    fn not_ready_since(&self) -> Option<chrono::DateTime<chrono::Utc>>;
    fn being_deleted(&self) -> bool;
    fn cordoned(&self) -> bool;
    fn annotation(&self, key: &str) -> Option<&str>;
    /// Carries kops's taint `kops.k8s.io/scheduled-for-update`: a kops
    /// rolling update is about to replace it.
    fn scheduled_for_update(&self) -> bool;

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
    fn node_labels(&self) -> &dyn Labels {
        self.labels()
    }
    fn provider_id(&self) -> Option<&str> {
        self.spec.as_ref()?.provider_id.as_deref()
    }
    fn ready(&self) -> bool {
        is_ready(self)
    }
    fn not_ready_since(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        not_ready_since(self)
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
    fn scheduled_for_update(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == SCHEDULED_FOR_UPDATE_TAINT))
    }
}

/// A pointer to a view is a view: the cache's `Arc`s and plain references.
macro_rules! forward_node_view {
    ($($pointer:ty),*) => {$(
        impl<T: NodeView + ?Sized> NodeView for $pointer {
            fn node_name(&self) -> &str {
                (**self).node_name()
            }
            fn node_labels(&self) -> &dyn Labels {
                (**self).node_labels()
            }
            fn provider_id(&self) -> Option<&str> {
                (**self).provider_id()
            }
            fn ready(&self) -> bool {
                (**self).ready()
            }
            fn not_ready_since(&self) -> Option<chrono::DateTime<chrono::Utc>> {
                (**self).not_ready_since()
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
            fn scheduled_for_update(&self) -> bool {
                (**self).scheduled_for_update()
            }
        }
    )*};
}
forward_node_view!(std::sync::Arc<T>, &T);

/// Looking labels up, whatever holds them: a Node's map or the cache's
/// [`PackedLabels`].
pub trait Labels {
    fn label(&self, key: &str) -> Option<&str>;
    /// Every label, sorted by key.
    fn pairs(&self) -> Box<dyn Iterator<Item = (&str, &str)> + '_>;
    fn has(&self, key: &str) -> bool {
        self.label(key).is_some()
    }
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
    fn pairs(&self) -> Box<dyn Iterator<Item = (&str, &str)> + '_> {
        Box::new(self.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

/// A Node's labels packed into one string, with each label's byte ranges
/// sorted by key: two allocations per Node, where a map takes two per label
/// and its tree nodes besides (0.8 against 2.2 KiB for a kops Node's 14).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackedLabels {
    text: Box<str>,
    /// (key start, key end = value start, value end) in `text`.
    spans: Box<[(usize, usize, usize)]>,
}

impl PackedLabels {
    pub fn pack<'a>(sorted: impl Iterator<Item = (&'a str, &'a str)>) -> PackedLabels {
        let mut text = String::new();
        let mut spans = vec![];
        for (k, v) in sorted {
            let start = text.len();
            text.push_str(k);
            let middle = text.len();
            text.push_str(v);
            spans.push((start, middle, text.len()));
        }
        PackedLabels {
            text: text.into_boxed_str(),
            spans: spans.into_boxed_slice(),
        }
    }

    fn pair(&self, (start, middle, end): (usize, usize, usize)) -> (&str, &str) {
        (
            self.text.get(start..middle).unwrap_or_default(),
            self.text.get(middle..end).unwrap_or_default(),
        )
    }
}

impl Labels for PackedLabels {
    fn label(&self, key: &str) -> Option<&str> {
        let found = self
            .spans
            .binary_search_by(|s| self.pair(*s).0.cmp(key))
            .ok()?;
        Some(self.pair(self.spans[found]).1)
    }
    fn pairs(&self) -> Box<dyn Iterator<Item = (&str, &str)> + '_> {
        Box::new(self.spans.iter().map(|s| self.pair(*s)))
    }
}

/// A Node as the inventory caches it, for every Node of the cluster: its
/// name, labels (a `nodeSelector` may name any), providerID, cordon, Ready
/// condition and our interruption annotation, and nothing else. Decoded
/// straight from the apiserver's JSON: a Node's images, managed fields,
/// addresses and capacity are skipped by the decoder, never held, not even
/// while a page of the list is decoded. About 2.0 KiB per kops Node against
/// 56.5 KiB as a full `Node` (`benches/cache_bytes.rs`). Its labels are in
/// `labels`, not `metadata`.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(from = "WireNode")]
pub struct SlimNode {
    pub metadata: ObjectMeta,
    pub labels: PackedLabels,
    pub provider_id: Option<String>,
    pub unschedulable: bool,
    /// Carries kops's `kops.k8s.io/scheduled-for-update` taint.
    pub scheduled_for_update: bool,
    /// The Ready condition's status is True.
    pub ready_condition: bool,
    /// Since when the Ready condition has not been True
    /// ([`not_ready_since`]).
    pub not_ready_since: Option<chrono::DateTime<chrono::Utc>>,
}

/// A Node as served, reduced to the fields a [`SlimNode`] keeps: serde
/// skips every other field without building it.
#[derive(serde::Deserialize)]
struct WireNode {
    metadata: WireMeta,
    #[serde(default)]
    spec: WireSpec,
    #[serde(default)]
    status: WireStatus,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    // The watcher resumes from the last object's resourceVersion.
    resource_version: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    creation_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

#[derive(Default, serde::Deserialize)]
struct WireSpec {
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
    unschedulable: Option<bool>,
    #[serde(default)]
    taints: Vec<WireTaint>,
}

#[derive(serde::Deserialize)]
struct WireTaint {
    key: String,
}

#[derive(Default, serde::Deserialize)]
struct WireStatus {
    #[serde(default)]
    conditions: Vec<WireCondition>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    last_transition_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// The annotations the inventory reads; any other is dropped on decode.
const KEPT_ANNOTATIONS: &[&str] = &[
    crate::crd::labels::INTERRUPTION_ANNOTATION,
    crate::crd::labels::NEEDS_UPDATE_ANNOTATION,
];

impl From<WireNode> for SlimNode {
    fn from(wire: WireNode) -> SlimNode {
        let ready = wire.status.conditions.iter().find(|c| c.type_ == "Ready");
        let not_ready_since = match ready {
            Some(c) if c.status == "True" => None,
            _ => ready
                .and_then(|c| c.last_transition_time.as_ref())
                .or(wire.metadata.creation_timestamp.as_ref())
                .and_then(|t| time_of(&t.0)),
        };
        let mut annotations = wire.metadata.annotations;
        annotations.retain(|k, _| KEPT_ANNOTATIONS.contains(&k.as_str()));
        SlimNode {
            metadata: ObjectMeta {
                name: wire.metadata.name,
                resource_version: wire.metadata.resource_version,
                annotations: (!annotations.is_empty()).then_some(annotations),
                deletion_timestamp: wire.metadata.deletion_timestamp,
                ..Default::default()
            },
            labels: PackedLabels::pack(wire.metadata.labels.pairs()),
            provider_id: wire.spec.provider_id,
            unschedulable: wire.spec.unschedulable.unwrap_or(false),
            scheduled_for_update: wire
                .spec
                .taints
                .iter()
                .any(|t| t.key == SCHEDULED_FOR_UPDATE_TAINT),
            ready_condition: ready.is_some_and(|c| c.status == "True"),
            not_ready_since,
        }
    }
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
    fn node_labels(&self) -> &dyn Labels {
        &self.labels
    }
    fn provider_id(&self) -> Option<&str> {
        self.provider_id.as_deref()
    }
    fn ready(&self) -> bool {
        !self.being_deleted() && self.ready_condition
    }
    fn not_ready_since(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.not_ready_since
    }
    fn being_deleted(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    fn cordoned(&self) -> bool {
        self.unschedulable
    }
    fn scheduled_for_update(&self) -> bool {
        self.scheduled_for_update
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().get(key).map(String::as_str)
    }
}

/// Does a label selector match these labels? (matchLabels and matchExpressions
/// with In, NotIn, Exists, DoesNotExist; an unknown operator matches nothing.)
pub fn selector_matches(selector: &LabelSelector, labels: &(impl Labels + ?Sized)) -> bool {
    let labels_ok = selector
        .match_labels
        .as_ref()
        .is_none_or(|m| m.iter().all(|(k, v)| labels.label(k) == Some(v.as_str())));
    let exprs_ok = selector.match_expressions.as_ref().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let has_value = |v: &str| values.iter().any(|x| x == v);
            match e.operator.as_str() {
                "In" => labels.label(&e.key).is_some_and(has_value),
                "NotIn" => labels.label(&e.key).is_none_or(|v| !has_value(v)),
                "Exists" => labels.has(&e.key),
                "DoesNotExist" => !labels.has(&e.key),
                _ => false,
            }
        })
    });
    labels_ok && exprs_ok
}

#[cfg(test)]
mod slim_tests {
    use super::*;

    const FIXTURE: &str = include_str!("../controllers/inventory/fixtures/kops-node.json");

    /// Everything a view answers, as text: two views that read the same
    /// give the same string.
    fn views(node: &dyn NodeView) -> String {
        format!(
            "{} {:?} {:?} ready={} since={:?} deleting={} cordoned={} {:?}",
            node.node_name(),
            node.node_labels().pairs().collect::<Vec<_>>(),
            node.provider_id(),
            node.ready(),
            node.not_ready_since(),
            node.being_deleted(),
            node.cordoned(),
            node.annotation(crate::crd::labels::INTERRUPTION_ANNOTATION),
        )
    }

    #[test]
    fn a_slim_node_reads_as_the_full_node_it_was_decoded_from() {
        let mut json: serde_json::Value = serde_json::from_str(FIXTURE).expect("fixture");
        for (cordon, ready, deleting, marked) in [
            (false, "True", false, false),
            (true, "False", true, true),
            (true, "True", false, true),
            (false, "Unknown", false, false),
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
                    crate::crd::labels::INTERRUPTION_ANNOTATION.into(),
                    r#"{"kind":"spot-interruption"}"#.into(),
                );
            } else {
                annotations.remove(crate::crd::labels::INTERRUPTION_ANNOTATION);
            }
            let full: Node = serde_json::from_value(json.clone()).expect("node");
            let slim: SlimNode = serde_json::from_value(json.clone()).expect("slim node");
            assert_eq!(
                views(&slim),
                views(&full),
                "{cordon} {ready} {deleting} {marked}"
            );
            assert_eq!(
                slim.not_ready_since().is_some(),
                ready != "True",
                "unhealthy since the Ready condition's transition"
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

    proptest::proptest! {
        #[test]
        fn packed_labels_answer_as_the_map_they_were_packed_from(
            map in proptest::collection::btree_map("[a-z./-]{0,12}", "[a-zA-Z0-9-]{0,8}", 0..20),
            probes in proptest::collection::vec("[a-z./-]{0,12}", 0..10),
        ) {
            let packed = PackedLabels::pack(map.pairs());
            proptest::prop_assert!(packed.pairs().eq(map.pairs()));
            for key in map.keys().chain(probes.iter()) {
                proptest::prop_assert_eq!(packed.label(key), map.label(key), "{}", key);
            }
        }
    }

    #[test]
    fn a_node_without_spec_or_status_decodes_as_not_ready_and_not_cordoned() {
        let slim: SlimNode =
            serde_json::from_str(r#"{"metadata":{"name":"n"}}"#).expect("slim node");
        assert!(!slim.ready());
        assert!(!slim.cordoned());
        assert_eq!(slim.provider_id(), None);
        assert_eq!(slim.node_labels().pairs().count(), 0);
    }
}
