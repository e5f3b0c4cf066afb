//! Configuration: a YAML file (example in `config/`) overridden by flags.
//! Every error names the field and the problem, and `run` exits non-zero.

use crate::duration;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

mod checks;
pub mod file;
pub mod pod;
use checks::{check_dns_label, check_dns_subdomain, interval_field, parse_duration_field};
use file::read_file;
pub use file::{
    FileAdmin, FileAws, FileConfig, FileInterruption, FileLeaderElection, FileLog, ForeignMessages,
    UnmanagedNodes, parse_file,
};
pub use pod::OwnPod;
use std::time::Duration;

/// The release and the git commit the binary was built from (`build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SNM_GIT_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "spot-node-manager",
    version = VERSION,
    about = "Keeps a kops cluster of spot instances at its node count and regularly refreshed"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller-manager.
    Run(Box<RunArgs>),
    /// Print every CRD as YAML (or write one file per CRD with --out-dir).
    Crd {
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Write the reference pages (custom resources, configuration, metrics,
    /// Events) generated from the code's own descriptions into --out-dir.
    Reference {
        #[arg(long)]
        out_dir: PathBuf,
    },
    /// Say, per group, the next disruption the manager will make on its own:
    /// what, when, why, the nodes in order with what would hold each, and
    /// the pods each would move. Read-only: takes the same config and flags
    /// as `run`, never mutates anything.
    Preview {
        #[command(flatten)]
        run: Box<RunArgs>,
        /// `text` for people, `json` for scripts.
        #[arg(long, short = 'o', value_enum, default_value = "text")]
        output: PreviewOutput,
        /// A NodeGroup you are about to apply (YAML): also say what it would
        /// do that the current one does not.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Check, read-only, what the manager needs: each group's ASGs, the
    /// IAM reads, the interruption queue, the control plane's pods, other
    /// controllers competing. One line each, ok or what to do; exits 1
    /// when something blocks operation. Run it in the manager's pod to ask
    /// with its role and ServiceAccount: kubectl -n spot-node-manager exec
    /// deploy/spot-node-manager -- /usr/local/bin/spot-node-manager check
    /// --config /etc/spot-node-manager/config.yaml --in-cluster
    Check {
        #[command(flatten)]
        run: Box<RunArgs>,
        /// `text` for people, `json` for scripts.
        #[arg(long, short = 'o', value_enum, default_value = "text")]
        output: PreviewOutput,
    },
    /// Print the IAM policy the manager's role needs (manifests/iam-policy.json)
    /// with this cluster's tag and interruption queue filled in.
    IamPolicy {
        /// The kops cluster name (the `KubernetesCluster` tag kops puts on its ASGs).
        #[arg(long)]
        cluster: String,
        /// The 12-digit AWS account id.
        #[arg(long)]
        account: String,
        /// The region of the cluster and its interruption queue.
        #[arg(long)]
        region: String,
        /// The interruption queue's name (default: the stack's,
        /// `<cluster, dots as dashes>-interruptions`).
        #[arg(long)]
        queue_name: Option<String>,
        /// The AWS partition: `aws`, `aws-cn`, `aws-us-gov`.
        #[arg(long, default_value = "aws")]
        partition: String,
        /// Only the statements, as a JSON list: what kops's
        /// `serviceAccountExternalPermissions[].aws.inlinePolicy` and
        /// `additionalPolicies` take.
        #[arg(long)]
        statements: bool,
    },
}

/// How `preview` and `check` print their answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PreviewOutput {
    Text,
    Json,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `run`. Each overrides the config file's field of the same meaning.
#[derive(Debug, Default, Args)]
pub struct RunArgs {
    /// YAML config file.
    #[arg(long, short = 'c', env = "SNM_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kubeconfig file (default: in-cluster, then KUBECONFIG / ~/.kube/config). File: `kubeconfig`.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Use the in-cluster service account even if a kubeconfig exists.
    #[arg(long, conflicts_with = "kubeconfig")]
    pub in_cluster: bool,
    /// AWS region (default: the SDK's chain, e.g. AWS_REGION). File: `aws.region`.
    #[arg(long)]
    pub aws_region: Option<String>,
    /// AWS endpoint override, e.g. http://127.0.0.1:5000 for the moto emulator. File: `aws.endpoint`.
    #[arg(long)]
    pub aws_endpoint: Option<String>,
    /// Emulator only: the moto account to act in (sent as x-moto-account-id).
    #[arg(long, hide = true)]
    pub aws_emulator_account: Option<String>,
    /// Namespace whose NodeGroups to manage (default: all namespaces). File: `namespace`.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Address of /metrics, /healthz, /readyz and /scrapes (default 0.0.0.0:8080). File: `admin.address`.
    #[arg(long)]
    pub admin_address: Option<String>,
    /// Enable or disable leader election (default true). File: `leaderElection.enabled`.
    #[arg(long)]
    pub leader_election: Option<bool>,
    /// Name of the Lease used for leader election (default spot-node-manager). File: `leaderElection.leaseName`.
    #[arg(long)]
    pub lease_name: Option<String>,
    /// Namespace of the Lease (default: POD_NAMESPACE, then the watched namespace, then "default"). File: `leaderElection.leaseNamespace`.
    #[arg(long)]
    pub lease_namespace: Option<String>,
    /// This replica's identity in the Lease (default: POD_NAME, else host-pid). File: `identity`.
    #[arg(long)]
    pub identity: Option<String>,
    /// Log format, text or json (default text). File: `log.format`.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log every intended AWS and Kubernetes mutation without performing it. File: `dryRun`.
    #[arg(long)]
    pub dry_run: bool,
    /// SQS queue of interruption notices (EventBridge rules or ASG
    /// notifications); the interruption handler is off when unset. File:
    /// `interruption.queueUrl`.
    #[arg(long)]
    pub interruption_queue_url: Option<String>,
    /// How many groups may run a voluntary disruption (a refresh or a drift
    /// roll) at once, manager-wide (default 1). Master groups: one at a time
    /// whatever this says. File: `disruption.maxConcurrent`.
    #[arg(long)]
    pub max_concurrent_disruptions: Option<u32>,
    /// A label selector narrowing the control-plane Nodes the masters'
    /// rule counts beyond the Master groups' ASGs (default: every
    /// control-plane Node). File: `controlPlane.nodeSelector`.
    #[arg(long, env = "SNM_CONTROL_PLANE_NODE_SELECTOR")]
    pub control_plane_node_selector: Option<String>,
}

/// A configuration error naming the field and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// The resolved settings the manager runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub kubeconfig: Option<PathBuf>,
    pub in_cluster: bool,
    pub namespace: Option<String>,
    pub dry_run: bool,
    pub resync_interval: Duration,
    /// How often a group's cost record is accounted (status written).
    pub cost_interval: Duration,
    pub identity: String,
    pub aws: AwsSettings,
    pub admin_address: SocketAddr,
    pub leader_election: LeaderElectionSettings,
    pub log_format: LogFormat,
    pub log_level: String,
    pub interruption: InterruptionSettings,
    /// How many groups may run a voluntary disruption at once (at least 1).
    pub max_concurrent_disruptions: u32,
    /// The pod this replica runs in (`POD_NAMESPACE`/`POD_NAME`, from the
    /// downward API): a drain of its node takes it last.
    pub own_pod: Option<OwnPod>,
    /// Narrows the control-plane Nodes the masters' rule cross-checks.
    pub control_plane_node_selector: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct InterruptionSettings {
    /// The handler is off when unset.
    pub queue_url: Option<String>,
    pub foreign_messages: ForeignMessages,
    pub unmanaged_nodes: UnmanagedNodes,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AwsSettings {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub emulator_account: Option<String>,
    /// The Price List endpoint region, when the user names one.
    pub pricing_region: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LeaderElectionSettings {
    pub enabled: bool,
    pub lease_name: String,
    pub lease_namespace: String,
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// A leader that has not renewed within this long stops acting.
    pub renew_deadline: Duration,
    /// Interval between acquire/renew attempts.
    pub retry_period: Duration,
}

pub const DEFAULT_ADMIN_ADDRESS: &str = "0.0.0.0:8080";
pub const DEFAULT_LEASE_NAME: &str = "spot-node-manager";

impl Settings {
    /// Reads the config file (if any) and applies the flags over it.
    pub fn load(args: &RunArgs) -> Result<Settings, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Settings::resolve(args, file, env)
    }

    /// Pure: flags over file over defaults. `env` reads POD_NAME / POD_NAMESPACE.
    pub fn resolve(
        args: &RunArgs,
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let namespace = args.namespace.clone().or(file.namespace);
        if let Some(ns) = &namespace {
            check_dns_label("namespace", ns)?;
        }
        let admin_raw = args
            .admin_address
            .clone()
            .or(file.admin.address)
            .unwrap_or_else(|| DEFAULT_ADMIN_ADDRESS.to_string());
        let admin_address: SocketAddr = admin_raw.parse().map_err(|e| {
            ConfigError::new(
                "admin.address",
                format!("{admin_raw:?} is not a host:port socket address ({e})"),
            )
        })?;
        let leader_election = LeaderElectionSettings::resolve(
            args,
            file.leader_election,
            &env,
            namespace.as_deref(),
        )?;
        let resync_interval = interval_field("resyncInterval", file.resync_interval, "1m")?;
        let cost_interval = interval_field("costInterval", file.cost_interval, "5m")?;
        let aws = AwsSettings::resolve(args, file.aws)?;
        let identity = args
            .identity
            .clone()
            .or(file.identity)
            .or_else(|| env("POD_NAME"))
            .unwrap_or_else(default_identity);
        if identity.is_empty() || identity.len() > 128 {
            return Err(ConfigError::new("identity", "must be 1 to 128 characters"));
        }
        let log_level = file.log.level.unwrap_or_else(|| "info".to_string());
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log_level) {
            return Err(ConfigError::new(
                "log.level",
                format!("{log_level:?} is not a valid filter: {e}"),
            ));
        }
        let interruption = InterruptionSettings {
            queue_url: args
                .interruption_queue_url
                .clone()
                .or(file.interruption.queue_url),
            foreign_messages: file.interruption.foreign_messages.unwrap_or_default(),
            unmanaged_nodes: file.interruption.unmanaged_nodes.unwrap_or_default(),
        };
        if let Some(url) = &interruption.queue_url {
            check_queue_url(url).map_err(|e| ConfigError::new("interruption.queueUrl", e))?;
        }
        let max_concurrent_disruptions = args
            .max_concurrent_disruptions
            .or(file.disruption.max_concurrent)
            .unwrap_or(1);
        if max_concurrent_disruptions == 0 {
            return Err(ConfigError::new(
                "disruption.maxConcurrent",
                "must be at least 1 (suspend groups to stop their disruptions)",
            ));
        }
        let own_pod = OwnPod::from_env(&env);
        let control_plane_node_selector = args
            .control_plane_node_selector
            .clone()
            .or(file.control_plane.node_selector);
        if let Some(selector) = &control_plane_node_selector {
            checks::check_label_selector(selector)
                .map_err(|e| ConfigError::new("controlPlane.nodeSelector", e))?;
        }
        Ok(Settings {
            max_concurrent_disruptions,
            own_pod,
            control_plane_node_selector,
            kubeconfig: args.kubeconfig.clone().or(file.kubeconfig),
            in_cluster: args.in_cluster,
            namespace,
            dry_run: args.dry_run || file.dry_run.unwrap_or(false),
            resync_interval,
            cost_interval,
            identity,
            aws,
            admin_address,
            leader_election,
            log_format: args
                .log_format
                .or(file.log.format)
                .unwrap_or(LogFormat::Text),
            log_level,
            interruption,
        })
    }
}

impl LeaderElectionSettings {
    /// Flags over file over defaults; the lease's namespace defaults to the
    /// pod's, then the watched one. The three durations must nest.
    fn resolve(
        args: &RunArgs,
        le: FileLeaderElection,
        env: impl Fn(&str) -> Option<String>,
        namespace: Option<&str>,
    ) -> Result<LeaderElectionSettings, ConfigError> {
        let lease_name = args
            .lease_name
            .clone()
            .or(le.lease_name)
            .unwrap_or_else(|| DEFAULT_LEASE_NAME.to_string());
        check_dns_subdomain("leaderElection.leaseName", &lease_name)?;
        let lease_namespace = args
            .lease_namespace
            .clone()
            .or(le.lease_namespace)
            .or_else(|| env("POD_NAMESPACE"))
            .or_else(|| namespace.map(str::to_string))
            .unwrap_or_else(|| "default".to_string());
        check_dns_label("leaderElection.leaseNamespace", &lease_namespace)?;
        let lease_duration =
            parse_duration_field("leaderElection.leaseDuration", le.lease_duration, "15s")?;
        let renew_deadline =
            parse_duration_field("leaderElection.renewDeadline", le.renew_deadline, "10s")?;
        let retry_period =
            parse_duration_field("leaderElection.retryPeriod", le.retry_period, "2s")?;
        if lease_duration < Duration::from_secs(1) {
            return Err(ConfigError::new(
                "leaderElection.leaseDuration",
                "must be at least 1s",
            ));
        }
        if renew_deadline >= lease_duration {
            return Err(ConfigError::new(
                "leaderElection.renewDeadline",
                format!(
                    "must be shorter than leaseDuration ({} >= {})",
                    duration::format(renew_deadline),
                    duration::format(lease_duration)
                ),
            ));
        }
        if retry_period.is_zero() || retry_period >= renew_deadline {
            return Err(ConfigError::new(
                "leaderElection.retryPeriod",
                format!(
                    "must be above 0 and shorter than renewDeadline ({} vs {})",
                    duration::format(retry_period),
                    duration::format(renew_deadline)
                ),
            ));
        }
        Ok(LeaderElectionSettings {
            enabled: args.leader_election.or(le.enabled).unwrap_or(true),
            lease_name,
            lease_namespace,
            lease_duration,
            renew_deadline,
            retry_period,
        })
    }
}

impl AwsSettings {
    /// Flags over file; a region name, an http(s) endpoint, and an emulator
    /// account only in a test build.
    fn resolve(args: &RunArgs, file: FileAws) -> Result<AwsSettings, ConfigError> {
        let aws = AwsSettings {
            region: args.aws_region.clone().or(file.region),
            endpoint: args.aws_endpoint.clone().or(file.endpoint),
            emulator_account: args.aws_emulator_account.clone().or(file.emulator_account),
            pricing_region: file.pricing_region,
        };
        for (key, region) in [
            ("aws.region", &aws.region),
            ("aws.pricingRegion", &aws.pricing_region),
        ] {
            if let Some(region) = region
                && (region.is_empty()
                    || !region
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            {
                return Err(ConfigError::new(
                    key,
                    format!("{region:?} is not a region name like ap-northeast-1"),
                ));
            }
        }
        if let Some(endpoint) = &aws.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(ConfigError::new(
                "aws.endpoint",
                format!("{endpoint:?} must start with http:// or https://"),
            ));
        }
        #[cfg(not(feature = "test-support"))]
        if aws.emulator_account.is_some() {
            return Err(ConfigError::new(
                "aws.emulatorAccount",
                "is for tests against the moto emulator; this build does not include it",
            ));
        }
        if let Some(account) = &aws.emulator_account
            && (account.len() != 12 || !account.chars().all(|c| c.is_ascii_digit()))
        {
            return Err(ConfigError::new(
                "aws.emulatorAccount",
                format!("{account:?} must be 12 digits"),
            ));
        }
        Ok(aws)
    }
}

/// Unique per process, so two replicas on one host never share a Lease identity.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "spot-node-manager".to_string());
    format!("{host}-{}", std::process::id())
}

/// Checks a queue URL's shape: http(s), a host, then /<account>/<name>.
pub fn check_queue_url(url: &str) -> std::result::Result<(), String> {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return Err(format!("{url:?} must start with https://"));
    };
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        [host, account, name] if !host.is_empty() && !account.is_empty() && !name.is_empty() => {
            Ok(())
        }
        _ => Err(format!(
            "{url:?} is not a queue URL like https://sqs.ap-northeast-1.amazonaws.com/123456789012/name"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(args: &RunArgs, yaml: &str) -> Result<Settings, ConfigError> {
        let file = parse_file(yaml)?;
        Settings::resolve(args, file, |_| None)
    }

    fn field_of(yaml: &str) -> String {
        resolve(&RunArgs::default(), yaml).expect_err(yaml).field
    }

    #[test]
    fn defaults_are_sensible() {
        let s = resolve(&RunArgs::default(), "").expect("defaults");
        assert_eq!(s.admin_address, "0.0.0.0:8080".parse().unwrap());
        assert!(s.leader_election.enabled);
        assert_eq!(s.leader_election.lease_name, "spot-node-manager");
        assert_eq!(s.leader_election.lease_namespace, "default");
        assert_eq!(s.leader_election.lease_duration, Duration::from_secs(15));
        assert_eq!(s.resync_interval, Duration::from_secs(60));
        assert!(!s.dry_run);
        assert_eq!(s.log_format, LogFormat::Text);
    }

    #[test]
    fn the_interruption_handler_is_off_by_default_and_its_queue_url_is_checked() {
        let off = resolve(&RunArgs::default(), "").expect("defaults");
        assert_eq!(off.interruption.queue_url, None);
        assert_eq!(off.interruption.foreign_messages, ForeignMessages::Delete);
        assert_eq!(off.interruption.unmanaged_nodes, UnmanagedNodes::Drain);
        let file = "interruption:\n  queueUrl: https://sqs.ap-northeast-1.amazonaws.com/123456789012/file\n  foreignMessages: Leave\n  unmanagedNodes: Ignore\n";
        let from_file = resolve(&RunArgs::default(), file).expect("file");
        assert_eq!(
            from_file.interruption.foreign_messages,
            ForeignMessages::Leave
        );
        assert_eq!(
            from_file.interruption.unmanaged_nodes,
            UnmanagedNodes::Ignore
        );
        let flag = RunArgs {
            interruption_queue_url: Some("http://127.0.0.1:5000/123456789012/flag".into()),
            ..Default::default()
        };
        let s = resolve(&flag, file).expect("flag");
        assert_eq!(
            s.interruption.queue_url.as_deref(),
            Some("http://127.0.0.1:5000/123456789012/flag"),
            "the flag wins"
        );
        assert_eq!(
            field_of("interruption:\n  queueUrl: my-queue\n"),
            "interruption.queueUrl"
        );
        assert!(
            resolve(
                &RunArgs::default(),
                "interruption:\n  foreignMessages: Keep\n"
            )
            .is_err()
        );
    }

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../config/spot-node-manager.yaml");
        let s = resolve(&RunArgs::default(), text).expect("example config is valid");
        assert_eq!(s.namespace.as_deref(), Some("spot-node-manager"));
        // It pins no region: AWS_REGION (or a group's spec.region) decides.
        assert_eq!(s.aws.region, None);
    }

    #[test]
    fn flags_override_the_file() {
        let args = RunArgs {
            namespace: Some("flag-ns".into()),
            dry_run: true,
            leader_election: Some(false),
            log_format: Some(LogFormat::Json),
            admin_address: Some("127.0.0.1:9999".into()),
            ..Default::default()
        };
        let s = resolve(
            &args,
            "namespace: file-ns\nleaderElection:\n  enabled: true\nlog:\n  format: text\n",
        )
        .unwrap();
        assert_eq!(s.namespace.as_deref(), Some("flag-ns"));
        assert!(s.dry_run);
        assert!(!s.leader_election.enabled);
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(s.admin_address.port(), 9999);
    }

    #[test]
    fn a_control_plane_node_selector_is_checked_at_start() {
        let s = resolve(&RunArgs::default(), "").expect("defaults");
        assert_eq!(s.control_plane_node_selector, None);
        for good in [
            "kops.k8s.io/cluster=example.com",
            "a=b,!c,d!=e, f in (g, h),i notin (j)",
            "snm.test/account",
        ] {
            let file = format!("controlPlane:\n  nodeSelector: {good:?}\n");
            let s = resolve(&RunArgs::default(), &file).expect(good);
            assert_eq!(s.control_plane_node_selector.as_deref(), Some(good));
        }
        for bad in ["", "a=b,,c", "a b", "a in b", "a=(b"] {
            let file = format!("controlPlane:\n  nodeSelector: {bad:?}\n");
            let err = resolve(&RunArgs::default(), &file).expect_err(bad);
            assert_eq!(err.field, "controlPlane.nodeSelector", "{bad}");
        }
        let args = RunArgs {
            control_plane_node_selector: Some("x=y".into()),
            ..Default::default()
        };
        let s = resolve(&args, "controlPlane:\n  nodeSelector: a=b\n").expect("flag");
        assert_eq!(s.control_plane_node_selector.as_deref(), Some("x=y"));
    }

    #[test]
    fn one_disruption_at_a_time_unless_told_and_never_none() {
        let s = resolve(&RunArgs::default(), "").expect("defaults");
        assert_eq!(s.max_concurrent_disruptions, 1);
        let s = resolve(&RunArgs::default(), "disruption:\n  maxConcurrent: 3\n").expect("file");
        assert_eq!(s.max_concurrent_disruptions, 3);
        let args = RunArgs {
            max_concurrent_disruptions: Some(2),
            ..Default::default()
        };
        let s = resolve(&args, "disruption:\n  maxConcurrent: 3\n").expect("flag");
        assert_eq!(s.max_concurrent_disruptions, 2);
        let err = resolve(&RunArgs::default(), "disruption:\n  maxConcurrent: 0\n")
            .expect_err("zero refused");
        assert_eq!(err.field, "disruption.maxConcurrent");
    }

    #[test]
    fn every_bad_field_is_named() {
        let cases = [
            ("admin:\n  address: nowhere\n", "admin.address"),
            (
                "leaderElection:\n  leaseDuration: 15 seconds\n",
                "leaderElection.leaseDuration",
            ),
            (
                "leaderElection:\n  leaseDuration: 5s\n  renewDeadline: 10s\n",
                "leaderElection.renewDeadline",
            ),
            (
                "leaderElection:\n  retryPeriod: 12s\n",
                "leaderElection.retryPeriod",
            ),
            (
                "leaderElection:\n  leaseName: Not_Valid\n",
                "leaderElection.leaseName",
            ),
            (
                "leaderElection:\n  enabled: maybe\n",
                "leaderElection.enabled",
            ),
            ("namespace: UPPER\n", "namespace"),
            ("resyncInterval: 0s\n", "resyncInterval"),
            ("aws:\n  region: Tokyo!\n", "aws.region"),
            ("aws:\n  pricingRegion: us east\n", "aws.pricingRegion"),
            ("aws:\n  endpoint: 127.0.0.1:5000\n", "aws.endpoint"),
            ("aws:\n  emulatorAccount: '123'\n", "aws.emulatorAccount"),
            ("log:\n  format: xml\n", "log.format"),
            ("log:\n  level: '[[['\n", "log.level"),
            ("dryRun: 3\n", "dryRun"),
        ];
        for (yaml, field) in cases {
            assert_eq!(field_of(yaml), field, "for {yaml:?}");
        }
    }

    #[test]
    fn unknown_fields_are_rejected_with_their_path() {
        let e = resolve(
            &RunArgs::default(),
            "leaderElection:\n  leaseDurration: 5s\n",
        )
        .unwrap_err();
        assert_eq!(e.field, "leaderElection.leaseDurration");
        assert!(e.problem.contains("leaseDurration"), "{}", e.problem);
        let e = resolve(&RunArgs::default(), "dryrun: true\n").unwrap_err();
        assert!(e.problem.contains("dryrun"), "{}", e.problem);
    }

    #[test]
    fn pod_environment_provides_identity_and_lease_namespace() {
        let s = Settings::resolve(&RunArgs::default(), FileConfig::default(), |k| match k {
            "POD_NAME" => Some("snm-abc".into()),
            "POD_NAMESPACE" => Some("kube-system".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(s.identity, "snm-abc");
        assert_eq!(s.leader_election.lease_namespace, "kube-system");
        let own = s.own_pod.expect("its own pod");
        assert_eq!(
            (own.namespace.as_str(), own.name.as_str()),
            ("kube-system", "snm-abc")
        );
        let s = Settings::resolve(&RunArgs::default(), FileConfig::default(), |k| match k {
            "POD_NAME" => Some("snm-abc".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(s.own_pod, None, "a pod name alone names no pod");
    }

    #[test]
    fn a_missing_file_names_the_flag() {
        let args = RunArgs {
            config: Some("/nonexistent/snm.yaml".into()),
            ..Default::default()
        };
        let e = Settings::load(&args).unwrap_err();
        assert_eq!(e.field, "--config");
        assert!(e.problem.contains("/nonexistent/snm.yaml"));
    }

    #[test]
    fn queue_urls_are_checked() {
        assert!(check_queue_url("https://sqs.ap-northeast-1.amazonaws.com/123456789012/q").is_ok());
        assert!(check_queue_url("http://127.0.0.1:5000/123456789012/q").is_ok());
        for bad in [
            "sqs.amazonaws.com/1/q",
            "https://host/q",
            "https://host/1/q/x",
            "https:///1/q",
        ] {
            assert!(check_queue_url(bad).is_err(), "{bad}");
        }
    }
}
