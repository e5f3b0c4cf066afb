//! Test support: a simulated kubelet. It makes the emulator's instances look
//! like kops nodes to a real apiserver: every running instance of an ASG tagged
//! as a kops instance group registers as a Node (named after the instance id,
//! with providerID, kops/role/zone/type labels) after `register_delay`, turns
//! Ready after `ready_delay`, and is deleted when its instance terminates. It
//! also finishes pods being deleted on its nodes, as a kubelet would.
//!
//! Markers a test sets on an ASG by tag: [`NEVER_JOIN_TAG`] (its instances
//! never register) and [`NOT_READY_TAG`] (comma-separated instance ids whose
//! nodes report NotReady).
//!
//! It only touches Nodes labelled with its own [`SIM_ACCOUNT_LABEL`], so tests
//! sharing one apiserver (each with its own emulator account) stay apart.

use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use spot_node_manager::cloud::aws::AwsCloud;
use spot_node_manager::cloud::{AwsClients, Cloud};
use spot_node_manager::k8s::node::{CONTROL_PLANE_LABEL, INSTANCE_GROUP_LABEL, WORKER_LABEL};
use spot_node_manager::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const NEVER_JOIN_TAG: &str = "snm.test/never-join";
pub const NOT_READY_TAG: &str = "snm.test/not-ready";
pub const SIM_ACCOUNT_LABEL: &str = "snm.test/sim-account";
pub const MASTER_ROLE_TAG: &str = "k8s.io/role/master";

#[derive(Debug, Clone)]
pub struct SimConfig {
    /// From first sight of a running instance to its Node registering.
    pub register_delay: Duration,
    /// From registration to Ready.
    pub ready_delay: Duration,
    pub poll: Duration,
    /// Label value separating this simulator's Nodes from others'.
    pub account: String,
    /// Masters: from Node Ready to its control-plane pods (kube-apiserver,
    /// etcd-manager) Ready.
    pub control_plane_delay: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            register_delay: Duration::from_secs(2),
            ready_delay: Duration::from_secs(3),
            poll: Duration::from_millis(500),
            account: "default".into(),
            control_plane_delay: Duration::from_secs(2),
        }
    }
}

struct Member {
    instance_group: String,
    master: bool,
    never_join: bool,
    not_ready: bool,
}

pub struct SimKubelet {
    nodes: Api<Node>,
    pods: Api<Pod>,
    asg: aws_sdk_autoscaling::Client,
    cloud: AwsCloud,
    config: SimConfig,
    first_seen: HashMap<String, Instant>,
    registered_at: HashMap<String, Instant>,
    ready_at: HashMap<String, Instant>,
}

impl SimKubelet {
    pub fn new(client: kube::Client, aws: AwsClients, config: SimConfig) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            pods: Api::all(client),
            asg: aws.autoscaling.clone(),
            cloud: AwsCloud::new(aws),
            config,
            first_seen: HashMap::new(),
            registered_at: HashMap::new(),
            ready_at: HashMap::new(),
        }
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        info!(account = %self.config.account, "simulated kubelet started");
        loop {
            if let Err(e) = self.step().await {
                warn!(error = %e, "simulated kubelet step failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.config.poll) => {}
            }
        }
        info!("simulated kubelet stopped");
    }

    async fn members(&self) -> Result<BTreeMap<String, Member>> {
        let mut members = BTreeMap::new();
        let mut pages = self
            .asg
            .describe_auto_scaling_groups()
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| Error::Aws {
                operation: "DescribeAutoScalingGroups",
                resource: "all".into(),
                code: None,
                message: aws_sdk_autoscaling::error::DisplayErrorContext(&e).to_string(),
            })?;
            for g in page.auto_scaling_groups() {
                let tags: BTreeMap<&str, &str> = g
                    .tags()
                    .iter()
                    .filter_map(|t| Some((t.key()?, t.value().unwrap_or(""))))
                    .collect();
                let Some(instance_group) = tags.get(INSTANCE_GROUP_LABEL) else {
                    continue;
                };
                let not_ready: BTreeSet<&str> = tags
                    .get(NOT_READY_TAG)
                    .map(|v| v.split(',').map(str::trim).collect())
                    .unwrap_or_default();
                for i in g.instances() {
                    let Some(id) = i.instance_id() else { continue };
                    members.insert(
                        id.to_string(),
                        Member {
                            instance_group: instance_group.to_string(),
                            master: tags.contains_key(MASTER_ROLE_TAG),
                            never_join: tags.contains_key(NEVER_JOIN_TAG),
                            not_ready: not_ready.contains(id),
                        },
                    );
                }
            }
        }
        Ok(members)
    }

    /// One reconciliation of Nodes with instances.
    pub async fn step(&mut self) -> Result<()> {
        let members = self.members().await?;
        let ids: Vec<String> = members.keys().cloned().collect();
        let instances = if ids.is_empty() {
            vec![]
        } else {
            self.cloud.describe_instances(&ids).await?
        };
        let running: BTreeMap<&str, _> = instances
            .iter()
            .filter(|i| i.state == "running" || i.state == "pending")
            .map(|i| (i.instance_id.as_str(), i))
            .collect();
        let selector = format!("{SIM_ACCOUNT_LABEL}={}", self.config.account);
        let existing = self
            .nodes
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube("list simulated nodes"))?;
        let existing: BTreeMap<String, Node> = existing
            .items
            .into_iter()
            .map(|n| (n.name_any(), n))
            .collect();
        let now = Instant::now();

        // Nodes whose instance is gone: the kubelet is gone too.
        for name in existing.keys() {
            if !running.contains_key(name.as_str()) {
                debug!(node = %name, "instance gone: deleting node");
                match self.nodes.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(Error::kube(format!("delete node {name}"))(e)),
                }
                self.registered_at.remove(name);
                self.ready_at.remove(name);
            }
        }
        let mut control_plane = BTreeMap::new();
        for (id, instance) in &running {
            let Some(member) = members.get(*id) else {
                continue;
            };
            let first_seen = *self.first_seen.entry(id.to_string()).or_insert(now);
            if member.never_join || now.duration_since(first_seen) < self.config.register_delay {
                continue;
            }
            let zone = instance.availability_zone.clone().unwrap_or_default();
            if !existing.contains_key(*id) {
                self.register(id, &zone, instance.instance_type.as_deref(), member)
                    .await?;
                self.registered_at.insert(id.to_string(), now);
            }
            let registered = *self.registered_at.entry(id.to_string()).or_insert(now);
            let ready =
                !member.not_ready && now.duration_since(registered) >= self.config.ready_delay;
            let current = existing
                .get(*id)
                .is_some_and(spot_node_manager::k8s::node::is_ready);
            if ready != current || !existing.contains_key(*id) {
                self.set_ready(id, ready).await?;
            }
            if ready && member.master {
                let since = *self.ready_at.entry(id.to_string()).or_insert(now);
                control_plane.insert(
                    id.to_string(),
                    now.duration_since(since) >= self.config.control_plane_delay,
                );
            }
        }
        self.sync_control_plane(&control_plane).await?;
        self.finish_terminating_pods(&existing).await
    }

    async fn register(
        &self,
        id: &str,
        zone: &str,
        instance_type: Option<&str>,
        member: &Member,
    ) -> Result<()> {
        let mut labels = BTreeMap::from([
            (
                INSTANCE_GROUP_LABEL.to_string(),
                member.instance_group.clone(),
            ),
            ("topology.kubernetes.io/zone".to_string(), zone.to_string()),
            ("kubernetes.io/hostname".to_string(), id.to_string()),
            (SIM_ACCOUNT_LABEL.to_string(), self.config.account.clone()),
        ]);
        if let Some(t) = instance_type {
            labels.insert("node.kubernetes.io/instance-type".into(), t.to_string());
        }
        let role = if member.master {
            CONTROL_PLANE_LABEL
        } else {
            WORKER_LABEL
        };
        labels.insert(role.to_string(), String::new());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(id.to_string()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///{zone}/{id}")),
                ..Default::default()
            }),
            status: None,
        };
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {
                info!(node = id, "node registered");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(Error::kube(format!("register node {id}"))(e)),
        }
    }

    async fn set_ready(&self, id: &str, ready: bool) -> Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let (status, reason) = if ready {
            ("True", "KubeletReady")
        } else {
            ("False", "KubeletNotReady")
        };
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "Ready", "status": status, "reason": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        self.nodes
            .patch_status(id, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!("set node {id} ready={ready}")))?;
        debug!(node = id, ready, "node readiness set");
        Ok(())
    }

    /// kops's static control-plane pods on Ready masters (mirror pods in
    /// kube-system), Ready after `control_plane_delay`; gone with their node.
    async fn sync_control_plane(&self, masters: &BTreeMap<String, bool>) -> Result<()> {
        use spot_node_manager::k8s::control_plane::{APP_LABEL, NAMESPACE, REQUIRED_APPS};
        let api: Api<Pod> = Api::namespaced(self.pods.clone().into_client(), NAMESPACE);
        let selector = format!("{SIM_ACCOUNT_LABEL}={}", self.config.account);
        let existing = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube("list control-plane pods"))?;
        let mut present = BTreeMap::new();
        for pod in existing.items {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            if !masters.contains_key(&node) {
                match api
                    .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                    .await
                {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(e) => return Err(Error::kube("delete control-plane pod")(e)),
                }
                continue;
            }
            present.insert(
                pod.name_any(),
                spot_node_manager::k8s::control_plane::is_pod_ready(&pod),
            );
        }
        for (node, up) in masters {
            for app in REQUIRED_APPS {
                let name = format!("{app}-{node}");
                if !present.contains_key(&name) {
                    let pod: Pod = serde_json::from_value(serde_json::json!({
                        "metadata": {
                            "name": name,
                            "labels": {APP_LABEL: app, SIM_ACCOUNT_LABEL: self.config.account},
                            "annotations": {spot_node_manager::k8s::drain::MIRROR_ANNOTATION: "sim"},
                        },
                        "spec": {"nodeName": node, "containers": [{"name": app, "image": "registry.invalid/static"}]},
                    }))
                    .map_err(|e| Error::InvalidObject(format!("control-plane pod: {e}")))?;
                    match api.create(&PostParams::default(), &pod).await {
                        Ok(_) | Err(kube::Error::Api(_)) => {}
                        Err(e) => return Err(Error::kube("create control-plane pod")(e)),
                    }
                }
                let is_ready = present.get(&name).copied().unwrap_or(false);
                if is_ready != *up {
                    let status = if *up { "True" } else { "False" };
                    let patch = serde_json::json!({"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": status}]}});
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(Error::kube(format!("set {name} ready={up}")))?;
                }
            }
        }
        Ok(())
    }

    /// Stands in for the kubelet: pods being deleted on our nodes go away.
    async fn finish_terminating_pods(&self, nodes: &BTreeMap<String, Node>) -> Result<()> {
        if nodes.is_empty() {
            return Ok(());
        }
        let pods = self
            .pods
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list pods"))?;
        for pod in pods.items {
            let on_our_node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| nodes.contains_key(n));
            if !on_our_node || pod.metadata.deletion_timestamp.is_none() {
                continue;
            }
            let Some(namespace) = pod.namespace() else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(self.pods.clone().into_client(), &namespace);
            match api
                .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(Error::kube(format!(
                        "finish pod {namespace}/{}",
                        pod.name_any()
                    ))(e));
                }
            }
        }
        Ok(())
    }
}
