//! The pod this replica runs in, from the downward API: a drain of its node
//! takes it last (`k8s::own_pod`).

/// The pod this replica runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnPod {
    pub namespace: String,
    pub name: String,
}

impl OwnPod {
    /// From the downward API's `POD_NAMESPACE` and `POD_NAME` (both, or
    /// none: a replica outside a pod has no pod to take last).
    pub fn from_env(env: &impl Fn(&str) -> Option<String>) -> Option<Self> {
        Some(Self {
            namespace: env("POD_NAMESPACE")?,
            name: env("POD_NAME")?,
        })
    }

    pub fn is(&self, pod: &k8s_openapi::api::core::v1::Pod) -> bool {
        use kube::ResourceExt;
        pod.namespace().as_deref() == Some(self.namespace.as_str()) && pod.name_any() == self.name
    }
}
