//! Test support: an isolated world per test on a shared local control plane.
//!
//! The control plane (etcd + kube-apiserver + moto) comes from
//! `SNM_TEST_KUBECONFIG` / `SNM_TEST_MOTO_ENDPOINT` when `scripts/test` has
//! started it, or is started here once per test binary through `scripts/env-up`
//! (torn down when the binary exits). Each test then gets its own namespace,
//! its own moto account (header `x-moto-account-id`), the CRDs installed, and
//! clients pointing at both.
#![allow(dead_code)]

pub mod refresh;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use spot_node_manager::cloud::AwsClients;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct ControlPlane {
    pub kubeconfig: PathBuf,
    pub moto_endpoint: String,
}

/// The shared control plane, started at most once per test binary.
pub fn control_plane() -> &'static ControlPlane {
    static PLANE: OnceLock<ControlPlane> = OnceLock::new();
    PLANE.get_or_init(|| {
        if let (Ok(k), Ok(m)) = (
            std::env::var("SNM_TEST_KUBECONFIG"),
            std::env::var("SNM_TEST_MOTO_ENDPOINT"),
        ) {
            return ControlPlane {
                kubeconfig: k.into(),
                moto_endpoint: m,
            };
        }
        let dir = std::env::temp_dir().join(format!("snm-test-env-{}", std::process::id()));
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join("scripts/env-up"))
            .arg(&dir)
            .arg("--owner-pid")
            .arg(std::process::id().to_string())
            .output()
            .expect("run scripts/env-up");
        assert!(
            out.status.success(),
            "scripts/env-up failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env_file =
            std::fs::read_to_string(dir.join("env.sh")).expect("env.sh written by env-up");
        let var = |name: &str| {
            env_file
                .lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(|v| v.trim_matches('"').to_string())
                .unwrap_or_else(|| panic!("{name} missing from env.sh"))
        };
        ControlPlane {
            kubeconfig: var("SNM_TEST_KUBECONFIG").into(),
            moto_endpoint: var("SNM_TEST_MOTO_ENDPOINT"),
        }
    })
}

pub async fn kube_client() -> kube::Client {
    let plane = control_plane();
    let kubeconfig = Kubeconfig::read_from(&plane.kubeconfig).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    kube::Client::try_from(config).expect("client")
}

/// A unique suffix per test in this process (and across processes).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{:x}", std::process::id(), nanos % 0xffff)
}

pub struct World {
    pub client: kube::Client,
    pub namespace: String,
    /// This test's moto account.
    pub account: String,
    pub aws_sdk: aws_config::SdkConfig,
    pub aws: AwsClients,
}

impl World {
    /// A fresh namespace and moto account, with the CRDs installed.
    pub async fn new(name: &str) -> World {
        let client = kube_client().await;
        install_crds(&client).await;
        let namespace = unique(&format!("t-{name}"));
        let namespace = namespace
            .chars()
            .take(63)
            .collect::<String>()
            .trim_end_matches('-')
            .to_string();
        let ns_api: Api<Namespace> = Api::all(client.clone());
        ns_api
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(namespace.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .expect("create test namespace");
        let account = fresh_account();
        // Shown only when the test fails: where to look.
        eprintln!("world {name}: namespace {namespace}, moto account {account}");
        let aws_sdk = aws_sdk_config();
        let aws = AwsClients::new(&aws_sdk, Some(&account));
        World {
            client,
            namespace,
            account,
            aws_sdk,
            aws,
        }
    }

    pub fn kubeconfig(&self) -> &Path {
        &control_plane().kubeconfig
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Best effort: there is no namespace controller on this apiserver, so the
    /// namespace stays Terminating; its objects are ours alone anyway.
    pub async fn cleanup(&self) {
        let ns_api: Api<Namespace> = Api::all(self.client.clone());
        let _ = ns_api
            .delete(&self.namespace, &DeleteParams::default())
            .await;
    }
}

/// A 12-digit moto account id not used by any other test, in this run or an
/// earlier one on the same (long-lived) control plane: PIDs wrap, so the
/// process id alone is not enough.
pub fn fresh_account() -> String {
    use std::hash::{Hash, Hasher};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::process::id().hash(&mut h);
    N.fetch_add(1, Ordering::SeqCst).hash(&mut h);
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .hash(&mut h);
    format!("{:012}", 100_000_000_000 + h.finish() % 900_000_000_000)
}

/// SDK config for moto: static credentials, fixed region, endpoint override.
pub fn aws_sdk_config() -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("ap-northeast-1"))
        .endpoint_url(control_plane().moto_endpoint.clone())
        .credentials_provider(aws_sdk_ec2::config::SharedCredentialsProvider::new(
            aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "tests"),
        ))
        .build()
}

/// Applies the CRDs (idempotent) and waits until they are Established.
pub async fn install_crds(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in spot_node_manager::crd::all() {
        let name = crd.metadata.name.clone().expect("crd name");
        api.patch(
            &name,
            &PatchParams::apply("snm-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let current = api.get(&name).await.expect("get CRD");
            let established = current
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            assert!(Instant::now() < deadline, "CRD {name} not established");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Polls `check` until it returns Some or `timeout` passes.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A plain HTTP GET on loopback: (status code, body).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// A manager process, killed when dropped.
pub struct ManagerProcess {
    pub child: Child,
    pub admin_port: u16,
    pub log: PathBuf,
}

impl ManagerProcess {
    /// Starts `spot-node-manager run` against the test control plane.
    pub fn start(world: &World, extra_args: &[&str]) -> ManagerProcess {
        Self::start_env(world, extra_args, &[])
    }

    /// The same, with extra environment variables (e.g. `SNM_CRASH_AT`).
    pub fn start_env(world: &World, extra_args: &[&str], env: &[(&str, &str)]) -> ManagerProcess {
        let admin_port = free_port();
        let log = std::env::temp_dir().join(format!("{}.log", unique("snm-manager")));
        let log_file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_spot-node-manager"))
            .arg("run")
            .arg("--kubeconfig")
            .arg(world.kubeconfig())
            .args(["--namespace", &world.namespace])
            .args(["--admin-address", &format!("127.0.0.1:{admin_port}")])
            .args(["--aws-region", "ap-northeast-1"])
            .args(["--aws-endpoint", &control_plane().moto_endpoint])
            .args(["--aws-emulator-account", &world.account])
            .args(extra_args)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("RUST_LOG", "spot_node_manager=debug,info")
            .envs(env.iter().copied())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .expect("start manager");
        ManagerProcess {
            child,
            admin_port,
            log,
        }
    }

    /// True while the process has not exited.
    pub fn child_alive(&self) -> bool {
        std::process::Command::new("kill")
            .args(["-0", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success())
            && !std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
                .unwrap_or_default()
                .contains(") Z ")
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "manager did not exit on SIGTERM:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub async fn metrics(&self) -> Option<String> {
        match http_get(self.admin_port, "/metrics").await {
            Some((200, body)) => Some(body),
            _ => None,
        }
    }

    /// The value of the `spot_node_manager_leader` gauge.
    pub async fn is_leader(&self) -> Option<bool> {
        let metrics = self.metrics().await?;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("spot_node_manager_leader "))
            .map(|v| v.trim() == "1")
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A kops-like set of ASGs in this world's moto account.
/// See [`World::joined_and_never_joining`].
pub struct NeverJoining {
    pub joined_asg: String,
    pub late_asg: String,
    /// The late ASG's instance, which never joins.
    pub first: String,
    /// Both ASGs.
    pub asgs: Vec<String>,
}

pub struct KopsGroup {
    /// ASG names, one per zone.
    pub asgs: Vec<String>,
    /// The kops instance-group name of each ASG (unique per test).
    pub instance_groups: Vec<String>,
    pub zones: Vec<String>,
}

pub const ZONES: [&str; 3] = ["ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"];

impl World {
    /// A prefix unique to this world, for names shared cluster-wide (Nodes
    /// and kops instance-group labels live outside the test's namespace).
    pub fn prefix(&self) -> String {
        format!("w{}", self.account)
    }

    /// Creates one ASG per zone for `role` ("nodes" or "master"), each with
    /// `per_asg` instances, a launch template and a spot MixedInstancesPolicy,
    /// tagged like kops does, sitting at its min as kops groups do (min =
    /// desired, max 20). `extra_tags` go on every ASG. Returns once the
    /// emulator has launched them all (InService).
    pub async fn kops_group(
        &self,
        role: &str,
        zones: &[&str],
        per_asg: i32,
        extra_tags: &[(&str, &str)],
    ) -> KopsGroup {
        use aws_sdk_autoscaling::types::{
            InstancesDistribution, LaunchTemplate, LaunchTemplateOverrides,
            LaunchTemplateSpecification, MixedInstancesPolicy, Tag,
        };
        let prefix = self.prefix();
        let template = format!("{prefix}-{role}");
        let _ = self
            .aws
            .ec2
            .create_launch_template()
            .launch_template_name(&template)
            .launch_template_data(
                aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                    .image_id("ami-12c6146b")
                    .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
                    .build(),
            )
            .send()
            .await;
        let subnets = self
            .aws
            .ec2
            .describe_subnets()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("default-for-az")
                    .values("true")
                    .build(),
            )
            .send()
            .await
            .expect("describe subnets");
        let subnet_of = |zone: &str| {
            subnets
                .subnets()
                .iter()
                .find(|s| s.availability_zone() == Some(zone))
                .and_then(|s| s.subnet_id())
                .unwrap_or_else(|| panic!("no default subnet in {zone}"))
                .to_string()
        };
        let mut group = KopsGroup {
            asgs: vec![],
            instance_groups: vec![],
            zones: zones.iter().map(|z| z.to_string()).collect(),
        };
        for zone in zones {
            let instance_group = format!("{prefix}-{role}-{zone}");
            let name = format!("{instance_group}.example.com");
            let role_tag = if role == "master" {
                "k8s.io/role/master"
            } else {
                "k8s.io/role/node"
            };
            let mut tags = vec![
                ("KubernetesCluster", "example.com".to_string()),
                ("kops.k8s.io/instancegroup", instance_group.clone()),
                (role_tag, "1".to_string()),
            ];
            tags.extend(extra_tags.iter().map(|(k, v)| (*k, v.to_string())));
            self.aws
                .autoscaling
                .create_auto_scaling_group()
                .auto_scaling_group_name(&name)
                .min_size(per_asg)
                .max_size(20)
                .desired_capacity(per_asg)
                .vpc_zone_identifier(subnet_of(zone))
                .mixed_instances_policy(
                    MixedInstancesPolicy::builder()
                        .launch_template(
                            LaunchTemplate::builder()
                                .launch_template_specification(
                                    LaunchTemplateSpecification::builder()
                                        .launch_template_name(&template)
                                        .version("$Latest")
                                        .build(),
                                )
                                .overrides(
                                    LaunchTemplateOverrides::builder()
                                        .instance_type("m5.large")
                                        .build(),
                                )
                                .overrides(
                                    LaunchTemplateOverrides::builder()
                                        .instance_type("m5a.large")
                                        .build(),
                                )
                                .build(),
                        )
                        .instances_distribution(
                            InstancesDistribution::builder()
                                .on_demand_percentage_above_base_capacity(0)
                                .spot_allocation_strategy("price-capacity-optimized")
                                .build(),
                        )
                        .build(),
                )
                .set_tags(Some(
                    tags.iter()
                        .map(|(k, v)| {
                            Tag::builder()
                                .key(*k)
                                .value(v)
                                .resource_id(&name)
                                .resource_type("auto-scaling-group")
                                .propagate_at_launch(true)
                                .build()
                        })
                        .collect(),
                ))
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "create ASG {name}: {}",
                        aws_sdk_autoscaling::error::DisplayErrorContext(&e)
                    )
                });
            group.asgs.push(name);
            group.instance_groups.push(instance_group);
        }
        for asg in &group.asgs {
            self.wait_in_service(asg, per_asg as usize).await;
        }
        group
    }

    /// Two kops ASGs at their min (as kops groups are): `nodes`, one
    /// instance that joins, and `late`, one instance that never joins (a
    /// removal there cannot decrement, so the ASG launches a fresh instance,
    /// which never joins either).
    pub async fn joined_and_never_joining(&self) -> NeverJoining {
        let joined = self.kops_group("nodes", &ZONES[..1], 1, &[]).await;
        let late = self
            .kops_group(
                "late",
                &ZONES[1..2],
                1,
                &[(snm_testkit::sim::NEVER_JOIN_TAG, "true")],
            )
            .await;
        let late_asg = late.asgs[0].clone();
        let first = self.asg_instances(&late_asg).await.remove(0);
        let mut asgs = joined.asgs.clone();
        asgs.extend(late.asgs.clone());
        NeverJoining {
            joined_asg: joined.asgs[0].clone(),
            late_asg,
            first,
            asgs,
        }
    }

    /// Waits until `asg` has exactly `count` instances, all InService, and
    /// returns their ids (the emulator launches after a lag, Pending first).
    pub async fn wait_in_service(&self, asg: &str, count: usize) -> Vec<String> {
        eventually(
            &format!("{count} InService instance(s) in {asg}"),
            Duration::from_secs(60),
            || async {
                let out = self
                    .aws
                    .autoscaling
                    .describe_auto_scaling_groups()
                    .auto_scaling_group_names(asg)
                    .send()
                    .await
                    .ok()?;
                let g = out.auto_scaling_groups().first()?.clone();
                let states: Vec<(String, String)> = g
                    .instances()
                    .iter()
                    .map(|i| {
                        (
                            i.instance_id().unwrap_or_default().to_string(),
                            i.lifecycle_state()
                                .map(|s| s.as_str().to_string())
                                .unwrap_or_default(),
                        )
                    })
                    .collect();
                (states.len() == count && states.iter().all(|(_, s)| s == "InService"))
                    .then(|| states.into_iter().map(|(id, _)| id).collect())
            },
        )
        .await
    }

    /// Sets an ASG's min size (and nothing else).
    pub async fn set_min(&self, asg: &str, min: i32) {
        self.aws
            .autoscaling
            .update_auto_scaling_group()
            .auto_scaling_group_name(asg)
            .min_size(min)
            .send()
            .await
            .expect("set min size");
    }

    /// Sets one of the emulator's timings for an ASG, in seconds (tags
    /// `snm.test/launch-lag`, `pending-time`, `health-check-delay`,
    /// `capacity-retry`, `terminating-time`; see scripts/moto_server.py).
    pub async fn set_timing(&self, asg: &str, timing: &str, seconds: f64) {
        self.tag_asg(asg, &format!("snm.test/{timing}"), &seconds.to_string())
            .await;
    }

    /// Terminates an instance through EC2, as a spot interruption does: its
    /// ASG notices through its health check and replaces it.
    pub async fn lose_instance(&self, instance_id: &str) {
        self.aws
            .ec2
            .terminate_instances()
            .instance_ids(instance_id)
            .send()
            .await
            .expect("terminate instance through EC2");
    }

    /// The ASG's scaling activities, newest first: (status, description).
    pub async fn activities(&self, asg: &str) -> Vec<(String, String)> {
        self.aws
            .autoscaling
            .describe_scaling_activities()
            .auto_scaling_group_name(asg)
            .send()
            .await
            .expect("describe scaling activities")
            .activities()
            .iter()
            .map(|a| {
                (
                    a.status_code()
                        .map(|c| c.as_str().to_string())
                        .unwrap_or_default(),
                    a.description().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// Tags an ASG (the simulations read such tags: spot shortage, nodes
    /// that never join or are not Ready).
    pub async fn tag_asg(&self, asg: &str, key: &str, value: &str) {
        self.aws
            .autoscaling
            .create_or_update_tags()
            .tags(asg_tag(asg, key, value))
            .send()
            .await
            .expect("tag ASG");
    }

    pub async fn untag_asg(&self, asg: &str, key: &str, value: &str) {
        self.aws
            .autoscaling
            .delete_tags()
            .tags(asg_tag(asg, key, value))
            .send()
            .await
            .expect("untag ASG");
    }

    /// Instance ids in an ASG, as moto reports them.
    pub async fn asg_instances(&self, asg: &str) -> Vec<String> {
        self.aws
            .autoscaling
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(asg)
            .send()
            .await
            .expect("describe ASG")
            .auto_scaling_groups()
            .first()
            .map(|g| {
                g.instances()
                    .iter()
                    .filter_map(|i| i.instance_id().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// (desired, instance ids) of every ASG, to check nothing was mutated.
    pub async fn asg_snapshot(&self, asgs: &[String]) -> Vec<(String, i32, Vec<String>)> {
        let out = self
            .aws
            .autoscaling
            .describe_auto_scaling_groups()
            .set_auto_scaling_group_names(Some(asgs.to_vec()))
            .send()
            .await
            .expect("describe ASGs");
        let mut snapshot: Vec<_> = out
            .auto_scaling_groups()
            .iter()
            .map(|g| {
                let mut ids: Vec<String> = g
                    .instances()
                    .iter()
                    .filter_map(|i| i.instance_id().map(str::to_string))
                    .collect();
                ids.sort();
                (
                    g.auto_scaling_group_name().unwrap_or_default().to_string(),
                    g.desired_capacity().unwrap_or(0),
                    ids,
                )
            })
            .collect();
        snapshot.sort();
        snapshot
    }

    /// Starts a simulated kubelet for this world's moto account, in-process.
    pub fn start_sim(&self, register_delay: Duration, ready_delay: Duration) -> SimGuard {
        let token = tokio_util::sync::CancellationToken::new();
        let sim = snm_testkit::sim::SimKubelet::new(
            self.client.clone(),
            self.aws.clone(),
            snm_testkit::sim::SimConfig {
                register_delay,
                ready_delay,
                poll: Duration::from_millis(300),
                account: self.account.clone(),
                control_plane_delay: Duration::from_secs(2),
            },
        );
        tokio::spawn(sim.run(token.clone()));
        SimGuard(token)
    }

    /// Starts a manager for this world with leader election off and a fast resync.
    pub fn start_manager(&self, extra: &[&str]) -> (ManagerProcess, tempfile::NamedTempFile) {
        self.start_manager_with("resyncInterval: 2s\n", extra, &[])
    }

    /// Starts a manager with this config file, extra flags and environment.
    pub fn start_manager_with(
        &self,
        config_yaml: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (ManagerProcess, tempfile::NamedTempFile) {
        let config = tempfile::NamedTempFile::new().expect("config");
        std::fs::write(config.path(), config_yaml).expect("write config");
        let path = config.path().to_str().expect("utf-8").to_string();
        let mut args = vec!["--config", path.as_str(), "--leader-election", "false"];
        args.extend_from_slice(extra);
        (ManagerProcess::start_env(self, &args, env), config)
    }
}

/// Stops the simulated kubelet when dropped.
pub struct SimGuard(tokio_util::sync::CancellationToken);

impl Drop for SimGuard {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl World {
    /// A controller Context against this world (leader election off).
    pub async fn context(
        &self,
        dry_run: bool,
    ) -> std::sync::Arc<spot_node_manager::context::Context> {
        let mut settings = spot_node_manager::config::Settings::resolve(
            &Default::default(),
            Default::default(),
            |_| None,
        )
        .expect("default settings");
        settings.kubeconfig = Some(self.kubeconfig().to_path_buf());
        settings.namespace = Some(self.namespace.clone());
        settings.dry_run = dry_run;
        let eviction_client = spot_node_manager::manager::kube_client_without_retry(&settings)
            .await
            .expect("eviction client");
        std::sync::Arc::new(spot_node_manager::context::Context::new(
            self.client.clone(),
            eviction_client,
            std::sync::Arc::new(settings),
            std::sync::Arc::new(spot_node_manager::clock::SystemClock),
            std::sync::Arc::new(spot_node_manager::metrics::Metrics::default()),
            spot_node_manager::leader::Leadership::always(),
            std::sync::Arc::new(spot_node_manager::cloud::aws::AwsCloudProvider::new(
                self.aws_sdk.clone(),
                Some(self.account.clone()),
            )),
        ))
    }
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

/// Sets the budget's status, which no controller computes on this apiserver.
pub async fn set_disruptions_allowed(world: &World, healthy: i32, allowed: i32) {
    let pdbs = pdb_api(world);
    let generation = pdbs
        .get("protected")
        .await
        .expect("pdb")
        .metadata
        .generation
        .unwrap_or(1);
    let status = serde_json::json!({"status": {"observedGeneration": generation, "disruptionsAllowed": allowed,
        "currentHealthy": healthy, "desiredHealthy": healthy - allowed, "expectedPods": healthy}});
    pdbs.patch_status("protected", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("set PDB status");
}

/// A bare pod bound to `node` (no kubelet starts it).
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

/// The value of one series (name with its labels, as exposed) in a metrics text.
pub fn metric(metrics: &str, series: &str) -> Option<f64> {
    let prefix = format!("{series} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// `spot_node_manager_reconciles_total` of one controller in a metrics text.
pub fn reconciles(metrics: &str, controller: &str) -> u64 {
    metric(
        metrics,
        &format!("spot_node_manager_reconciles_total{{controller=\"{controller}\"}}"),
    )
    .unwrap_or(0.0) as u64
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

fn asg_tag(asg: &str, key: &str, value: &str) -> aws_sdk_autoscaling::types::Tag {
    aws_sdk_autoscaling::types::Tag::builder()
        .key(key)
        .value(value)
        .resource_id(asg)
        .resource_type("auto-scaling-group")
        .propagate_at_launch(false)
        .build()
}
