//! An isolated world per test: its own namespace and moto account, clients
//! for both, and what runs in it (the simulated kubelet, a manager).

use crate::plane::{
    aws_sdk_config, control_plane, fresh_account, install_crds, kube_client, unique,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use spot_node_manager::cloud::AwsClients;
use std::path::Path;
use std::time::Duration;

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
}

impl World {
    /// This world's Nodes (other tests share the apiserver); None when the
    /// list fails.
    pub async fn nodes(&self) -> Option<Vec<k8s_openapi::api::core::v1::Node>> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let selector = format!("{}={}", crate::sim::SIM_ACCOUNT_LABEL, self.account);
        nodes
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .ok()
            .map(|l| l.items)
    }

    /// The names of this world's cordoned Nodes.
    pub async fn cordoned_nodes(&self) -> Option<Vec<String>> {
        Some(
            self.nodes()
                .await?
                .into_iter()
                .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
                .filter_map(|n| n.metadata.name)
                .collect(),
        )
    }

    /// Starts a simulated kubelet for this world's moto account, in-process.
    pub fn start_sim(&self, register_delay: Duration, ready_delay: Duration) -> SimGuard {
        self.start_sim_with(register_delay, ready_delay, Duration::from_secs(2))
    }

    /// The same, a master's control-plane pods (etcd joining) Ready
    /// `control_plane_delay` after its Node.
    pub fn start_sim_with(
        &self,
        register_delay: Duration,
        ready_delay: Duration,
        control_plane_delay: Duration,
    ) -> SimGuard {
        self.start_sim_configured(crate::sim::SimConfig {
            register_delay,
            ready_delay,
            control_plane_delay,
            ..Default::default()
        })
    }

    /// A simulated kubelet as `config` says, for this world's account.
    pub fn start_sim_configured(&self, config: crate::sim::SimConfig) -> SimGuard {
        let token = tokio_util::sync::CancellationToken::new();
        let sim = crate::sim::SimKubelet::new(
            self.client.clone(),
            self.aws.clone(),
            crate::sim::SimConfig {
                poll: Duration::from_millis(300),
                account: self.account.clone(),
                ..config
            },
        );
        let joins = sim.join_budget();
        tokio::spawn(sim.run(token.clone()));
        SimGuard {
            token,
            account: self.account.clone(),
            joins,
        }
    }
}

/// A world is cleaned up when dropped, passing or failing: its namespace is
/// deleted by kubectl, which needs no async runtime in a destructor. Best
/// effort: there is no namespace controller on the test apiserver, so the
/// namespace stays Terminating; its objects are ours alone anyway.
impl Drop for World {
    fn drop(&mut self) {
        kubectl(&["delete", "namespace", &self.namespace, "--wait=false"]);
        delete_nodes_of(&self.account);
    }
}

/// Best effort, without an async runtime (it runs in destructors).
fn kubectl(args: &[&str]) {
    let _ = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&control_plane().kubeconfig)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Deletes the Nodes of a world's account. Nodes are cluster-scoped, so the
/// namespace takes none of them: left behind, a bench's 150 NotReady Nodes a
/// run piled up in the shared apiserver (6,500 after a dozen runs), and
/// every later list of Nodes or pods, and the controller-manager's node
/// lifecycle, paid for them.
fn delete_nodes_of(account: &str) {
    let selector = format!("{}={account}", crate::sim::SIM_ACCOUNT_LABEL);
    kubectl(&["delete", "nodes", "-l", &selector, "--wait=false"]);
}

/// Stops the simulated kubelet when dropped, then deletes its Nodes (the
/// world's own cleanup may run first, while the kubelet still registers).
pub struct SimGuard {
    token: tokio_util::sync::CancellationToken,
    account: String,
    joins: crate::sim::JoinBudget,
}

impl SimGuard {
    /// From now on, at most `n` more instances join; the rest never do.
    pub fn limit_joins(&self, n: usize) {
        self.joins.limit(n);
    }

    /// `n` more instances join than the limit allows now
    /// (`JoinBudget::allow`).
    pub fn allow_joins(&self, n: usize) {
        self.joins.allow(n);
    }
}

impl Drop for SimGuard {
    fn drop(&mut self) {
        self.token.cancel();
        delete_nodes_of(&self.account);
    }
}

impl World {
    /// The control-plane Nodes of this world alone: Nodes are the shared
    /// apiserver's, and another test's masters are none of this world's
    /// (the manager's `controlPlane.nodeSelector`).
    pub fn master_node_selector(&self) -> String {
        format!("{}={}", crate::sim::SIM_ACCOUNT_LABEL, self.account)
    }

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
        settings.control_plane_node_selector = Some(self.master_node_selector());
        let eviction_client = spot_node_manager::manager::kube_client_without_retry(&settings)
            .await
            .expect("eviction client");
        std::sync::Arc::new(spot_node_manager::context::Context::new(
            self.client.clone(),
            eviction_client,
            std::sync::Arc::new(settings),
            std::sync::Arc::new(spot_node_manager::clock::SystemClock),
            std::sync::Arc::new(spot_node_manager::metrics::Metrics::default()),
            spot_node_manager::leadership::Leadership::always(),
            std::sync::Arc::new(spot_node_manager::cloud::aws::AwsCloudProvider::new(
                self.aws_sdk.clone(),
                Some(self.account.clone()),
            )),
        ))
    }
}
