//! The shared local control plane (etcd + kube-apiserver + moto): from
//! `SNM_TEST_KUBECONFIG` / `SNM_TEST_MOTO_ENDPOINT` when `scripts/test` has
//! started it, or started here once per test binary through `scripts/env-up`
//! (torn down when the binary exits); clients and CRDs for it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The repository (the test kit is one of its workspace members), as
/// `cargo test` says at run time. Not the compile-time path: cargo reuses a
/// shared build cache across checkouts, so a test binary compiled in one
/// clone can run for another and would read the first clone's files.
pub fn repo_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let is_root = |p: &Path| p.join("testkit").is_dir() && p.join("Cargo.toml").is_file();
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .into_iter()
            .flat_map(|dir| {
                [
                    dir.clone(),
                    dir.parent().map(Path::to_path_buf).unwrap_or(dir),
                ]
            })
            .find(|p| is_root(p))
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .parent()
                    .expect("the test kit sits in the repository")
                    .to_path_buf()
            })
    })
}

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
        let root = repo_root();
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
        .region(aws_config::Region::new(crate::REGION))
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

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The clients a test-support binary (sim-kubelet, timeline) needs: the
/// cluster through `kubeconfig`, AWS at `endpoint` in `region`, in the
/// emulator's `account` (its default one when None).
pub async fn binary_clients(
    kubeconfig: &Path,
    endpoint: &str,
    region: &str,
    account: Option<&str>,
) -> Result<(kube::Client, spot_node_manager::cloud::AwsClients), String> {
    let defaults = spot_node_manager::config::Settings::resolve(
        &Default::default(),
        Default::default(),
        |_| None,
    )
    .map_err(|e| e.to_string())?;
    let settings = spot_node_manager::config::Settings {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        ..defaults
    };
    let client = spot_node_manager::manager::kube_client(&settings)
        .await
        .map_err(|e| e.to_string())?;
    let sdk = spot_node_manager::cloud::load_sdk_config(&spot_node_manager::config::AwsSettings {
        region: Some(region.to_string()),
        endpoint: Some(endpoint.to_string()),
        emulator_account: None,
        pricing_region: None,
    })
    .await;
    Ok((
        client,
        spot_node_manager::cloud::AwsClients::new(&sdk, account),
    ))
}
