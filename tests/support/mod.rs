//! Test support: an isolated world per test on a shared local control plane.
//!
//! The control plane (etcd + kube-apiserver + moto) comes from
//! `SNM_TEST_KUBECONFIG` / `SNM_TEST_MOTO_ENDPOINT` when `scripts/test` has
//! started it, or is started here once per test binary through `scripts/env-up`
//! (torn down when the binary exits). Each test then gets its own namespace,
//! its own moto account (header `x-moto-account-id`), the CRDs installed, and
//! clients pointing at both.
#![allow(dead_code)]

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

/// A 12-digit moto account id not used by any other test.
pub fn fresh_account() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let base = (std::process::id() as u64 % 100_000) * 10_000 + n % 10_000;
    format!("{:012}", 100_000_000_000 + base)
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
