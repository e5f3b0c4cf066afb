//! The config file's schema (unknown fields are errors) and its parsing,
//! which names the dotted path of a bad field.

use super::{ConfigError, LogFormat};
use schemars::JsonSchema;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The config file. Unknown fields are errors (a typo must not be ignored).
/// Its doc comments are the reference's text (docs/reference/configuration.md).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileConfig {
    /// Kubeconfig file. Default: the in-cluster service account, then
    /// `KUBECONFIG` or `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Namespace whose NodeGroups are managed. Default: all namespaces. A
    /// manager of one namespace drains and reports only the Nodes it marked
    /// itself (Nodes are the cluster's; managers of other namespaces may share them).
    pub namespace: Option<String>,
    /// Log every intended AWS and Kubernetes mutation, perform none (our own
    /// custom resources' status is still written, to show what would happen).
    /// Default false.
    pub dry_run: Option<bool>,
    /// Periodic re-sync of every group, on top of watch events. Default `1m`.
    pub resync_interval: Option<String>,
    /// How often the inventory adds the instances' hours and dollars to a
    /// group's cost record (`status.cost`). Default `5m`.
    pub cost_interval: Option<String>,
    /// This replica's name in the Lease. Default: `POD_NAME`, else `<host>-<pid>`.
    pub identity: Option<String>,
    pub aws: FileAws,
    pub admin: FileAdmin,
    pub leader_election: FileLeaderElection,
    pub log: FileLog,
    pub interruption: FileInterruption,
    pub disruption: FileDisruption,
    pub control_plane: FileControlPlane,
}

/// How the masters are found beyond the Master groups' ASGs.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileControlPlane {
    /// A label selector added to kops's control-plane labels
    /// (`node-role.kubernetes.io/control-plane`, or `.../master`) when the
    /// masters' rule cross-checks its count against the cluster's
    /// control-plane Nodes: a Node so labelled whose instance no Master
    /// group's ASGs hold (an ASG kops renamed, a group nobody wrote) counts
    /// as a master of the cluster, up or down. Set it only when the
    /// cluster's control-plane Nodes are not all this manager's, e.g.
    /// `example.com/cluster=prod`. Default: none (every
    /// control-plane Node of the cluster).
    pub node_selector: Option<String>,
}

/// Voluntary disruption, manager-wide.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileDisruption {
    /// How many groups may run a refresh or drift roll at once (at least 1).
    /// Default 1. Never two Master groups, whatever this says.
    #[schemars(range(min = 1))]
    pub max_concurrent: Option<u32>,
}

/// The interruption handler.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileInterruption {
    /// The SQS queue of interruption notices, e.g.
    /// `https://sqs.ap-northeast-1.amazonaws.com/123456789012/example-com-interruptions`.
    /// Default unset: the interruption handler is off.
    pub queue_url: Option<String>,
    /// A notice for an instance no NodeGroup lists. Default `Delete`.
    pub foreign_messages: Option<ForeignMessages>,
    /// A loss notice for a node of this cluster that no NodeGroup lists.
    /// Default `Drain`.
    pub unmanaged_nodes: Option<UnmanagedNodes>,
}

/// AWS access.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileAws {
    /// AWS region. Default: the SDK's chain (`AWS_REGION`, the profile,
    /// instance metadata); a NodeGroup's `spec.region` wins for its ASGs.
    pub region: Option<String>,
    /// Endpoint override, e.g. the moto emulator at `http://127.0.0.1:5000`.
    /// Default: AWS.
    pub endpoint: Option<String>,
    /// Test builds only: the emulator account to act in (a product build
    /// refuses it).
    pub emulator_account: Option<String>,
    /// The region of the Price List API endpoint on-demand prices are read
    /// at. Default: the one that serves the cluster's region (us-east-1,
    /// eu-central-1 or ap-south-1; cn-northwest-1 in China; none in
    /// GovCloud). docs/concepts/cost.md.
    pub pricing_region: Option<String>,
}

/// The admin port.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileAdmin {
    /// Address of `/metrics`, `/healthz`, `/readyz` and `/scrapes`. Default `0.0.0.0:8080`.
    pub address: Option<String>,
}

/// Leader election: controllers run only while this replica holds the Lease.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileLeaderElection {
    /// Run the controllers only while this replica holds the Lease (two
    /// replicas, one acting). Default true.
    pub enabled: Option<bool>,
    /// The `coordination.k8s.io/v1` Lease. Default `spot-node-manager`.
    pub lease_name: Option<String>,
    /// Where the Lease lives. Default: `POD_NAMESPACE`, then `namespace`,
    /// then `default`.
    pub lease_namespace: Option<String>,
    /// How long a lease is valid after its renewal. Default `15s`.
    pub lease_duration: Option<String>,
    /// A leader that has not renewed within this stops acting; less than
    /// `leaseDuration`. Default `10s`.
    pub renew_deadline: Option<String>,
    /// Interval between acquire and renew attempts; less than
    /// `renewDeadline`. Default `2s`.
    pub retry_period: Option<String>,
}

/// Logs.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileLog {
    /// `text` (coloured only on a terminal, never with `NO_COLOR`) or `json`:
    /// one object per line; a reconcile's lines carry `span.controller` and
    /// `span.group` (or `span.node`), a mutation's `fields.node`,
    /// `fields.instance` or `fields.asg`. Default `text`.
    pub format: Option<LogFormat>,
    /// A tracing filter, e.g. `info` or `spot_node_manager=debug,info`;
    /// `RUST_LOG` wins. Default `info`.
    pub level: Option<String>,
}

/// What to do with a message none of whose instances is ours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum ForeignMessages {
    /// Delete it (the queue is this cluster's alone).
    #[default]
    Delete,
    /// Leave it for another cluster's handler (a queue shared by clusters);
    /// it comes back after its visibility timeout.
    Leave,
}

/// What to do with a loss notice for a node of this cluster that no
/// NodeGroup lists (a kops instance group nobody named).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum UnmanagedNodes {
    /// Cordon and drain it by its deadline, as kops's own termination
    /// handler would; it is not replaced by us (its ASG replaces it).
    #[default]
    Drain,
    /// Leave it alone (another handler covers those nodes).
    Ignore,
}

/// Parses the file, reporting the dotted path of a bad field.
pub fn parse_file(text: &str) -> Result<FileConfig, ConfigError> {
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "config".to_string()
        } else {
            path
        };
        ConfigError::new(field, e.into_inner().to_string())
    })
}

pub(super) fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new("--config", format!("cannot read {}: {e}", path.display()))
    })?;
    parse_file(&text)
        .map_err(|e| ConfigError::new(e.field, format!("{} (in {})", e.problem, path.display())))
}
