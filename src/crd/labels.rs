//! Well-known keys: the labels, annotations, taints and finalizer that kops,
//! Kubernetes and this manager put on objects. Plans and controllers both
//! read them from here, below either.

/// kops: the instance group a Node belongs to.
pub const INSTANCE_GROUP_LABEL: &str = "kops.k8s.io/instancegroup";
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
pub const LEGACY_MASTER_LABEL: &str = "node-role.kubernetes.io/master";
pub const WORKER_LABEL: &str = "node-role.kubernetes.io/node";

/// A static pod's mirror in the apiserver.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Set by us with the cordon we place, so that we only ever lift our own:
/// a node someone else cordoned (an operator's maintenance) stays cordoned
/// when we give up a drain of it.
pub const CORDONED_BY_US: &str = "nodemanager.dev/cordoned";

/// Holds a NodeGroup until its children have unwound.
pub const FINALIZER: &str = "nodemanager.dev/unwind";

/// The taint on a node marked for an interruption.
pub const INTERRUPTED_TAINT: &str = "nodemanager.dev/interrupted";
/// Set with the taint (value: the notice's kind), so the drain watches
/// marked nodes only.
pub const INTERRUPTED_LABEL: &str = "nodemanager.dev/interrupted";
/// The interruption record (JSON) on a marked or at-risk node.
pub const INTERRUPTION_ANNOTATION: &str = "nodemanager.dev/interruption";
/// kops's mark of a node to be replaced by the next rolling update (any
/// value; its presence counts, as for kops): the node is drifted.
pub const NEEDS_UPDATE_ANNOTATION: &str = "kops.k8s.io/needs-update";
/// The taint `kops rolling-update` puts on every node it is about to
/// replace, for as long as the update runs.
pub const SCHEDULED_FOR_UPDATE_TAINT: &str = "kops.k8s.io/scheduled-for-update";
/// Service controllers stop sending this node traffic before its pods go.
pub const EXCLUDE_FROM_LOAD_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";
