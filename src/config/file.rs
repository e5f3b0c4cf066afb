//! The config file's schema (unknown fields are errors) and its parsing,
//! which names the dotted path of a bad field.

use super::{ConfigError, LogFormat};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The config file. Unknown fields are errors (a typo must not be ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileConfig {
    pub kubeconfig: Option<PathBuf>,
    pub namespace: Option<String>,
    pub dry_run: Option<bool>,
    pub resync_interval: Option<String>,
    pub identity: Option<String>,
    pub aws: FileAws,
    pub admin: FileAdmin,
    pub leader_election: FileLeaderElection,
    pub log: FileLog,
    pub interruption: FileInterruption,
    pub disruption: FileDisruption,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileDisruption {
    /// How many groups may run a voluntary disruption at once.
    pub max_concurrent: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileInterruption {
    pub queue_url: Option<String>,
    pub foreign_messages: Option<ForeignMessages>,
    pub unmanaged_nodes: Option<UnmanagedNodes>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileAws {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub emulator_account: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileAdmin {
    pub address: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileLeaderElection {
    pub enabled: Option<bool>,
    pub lease_name: Option<String>,
    pub lease_namespace: Option<String>,
    pub lease_duration: Option<String>,
    pub renew_deadline: Option<String>,
    pub retry_period: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FileLog {
    pub format: Option<LogFormat>,
    /// tracing filter directive, e.g. `info` or `spot_node_manager=debug`.
    pub level: Option<String>,
}

/// What to do with a message none of whose instances is ours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
