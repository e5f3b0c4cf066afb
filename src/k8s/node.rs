//! Node helpers shared by the controllers and the test kit: kops's labels,
//! the instance a Node runs on, readiness, cordon state, role membership.

use crate::crd::Role;
use k8s_openapi::api::core::v1::Node;
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
