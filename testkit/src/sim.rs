//! Test support: a simulated kubelet. It makes the emulator's instances look
//! like kops nodes to a real apiserver: every running instance of an ASG tagged
//! as a kops instance group registers as a Node (named after the instance id,
//! with providerID, kops/role/zone/type labels) after `register_delay`, turns
//! Ready after `ready_delay`, and is deleted when its instance terminates
//! (an instance detached from its ASG, as kops's rolling update does, keeps
//! running, and its Node with it, until then).
//! Like a kubelet it renews each Node's Lease in `kube-node-lease` (the node
//! lifecycle controller's heartbeat), reports capacity so the scheduler can
//! place pods, runs the pods bound to its Ready nodes (Running, then Ready
//! after `pod_ready_delay`) and finishes a pod being deleted once its
//! `terminationGracePeriodSeconds` (capped by `max_termination_grace`) has
//! passed.
//!
//! Markers a test sets on an ASG by tag: [`NEVER_JOIN_TAG`] (its instances
//! never register), [`NOT_READY_TAG`] (comma-separated instance ids whose
//! nodes report NotReady: a kubelet alive but not ready) and [`DEAD_TAG`]
//! (comma-separated instance ids whose kubelet is dead: no Lease renewal,
//! no status, no pod ever run or let go; the node lifecycle controller
//! marks the Node Unknown once its grace, 40 s, has passed), and
//! [`CONTROL_PLANE_DOWN_TAG`] (comma-separated instance ids, or `*` for
//! every instance of the ASG, of masters whose control-plane pods run but
//! never turn Ready: a crash-looping kube-apiserver). A test that
//! needs the Nth launch of an operation to be the first that never joins
//! sets a [`JoinBudget`] before it starts (`SimGuard::limit_joins`).
//!
//! It only touches Nodes labelled with its own [`SIM_ACCOUNT_LABEL`], so tests
//! sharing one apiserver (each with its own emulator account) stay apart.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use spot_node_manager::cloud::aws::AwsCloud;
use spot_node_manager::cloud::{AwsClients, Cloud};
use spot_node_manager::crd::labels::WORKER_LABEL;
use spot_node_manager::crd::labels::{CONTROL_PLANE_LABEL, INSTANCE_GROUP_LABEL};
use spot_node_manager::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const NEVER_JOIN_TAG: &str = "snm.test/never-join";
pub const NOT_READY_TAG: &str = "snm.test/not-ready";
pub const DEAD_TAG: &str = "snm.test/dead";
pub const CONTROL_PLANE_DOWN_TAG: &str = "snm.test/control-plane-down";
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
    /// From a pod bound to a Ready node to the pod Ready.
    pub pod_ready_delay: Duration,
    /// A deleted pod takes its grace period to go, at most this long.
    pub max_termination_grace: Duration,
    /// Masters run kops's control-plane mirror pods (false: a cluster
    /// whose control plane shows none, as one not made by kops).
    pub control_plane_pods: bool,
    /// Masters as kops runs them: each master ASG is one place of etcd,
    /// whose volume one instance holds at a time (its holder until that
    /// instance stops running, then the ASG's longest-joined master). An
    /// instance beside the holder runs its control-plane pods, never Ready
    /// (etcd-manager waits for the volume; kube-apiserver reads the etcd
    /// on its own machine). On by default, as kops runs masters; off
    /// only for a test of a control plane that is not kops's.
    pub etcd_volumes: bool,
}

/// How often a Node's Lease is renewed, and for how long it holds: a
/// kubelet's defaults (10 s; the node lifecycle controller's grace is 40 s).
const LEASE_RENEW: Duration = Duration::from_secs(10);
const LEASE_SECONDS: i32 = 40;

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            register_delay: Duration::from_secs(2),
            ready_delay: Duration::from_secs(3),
            poll: Duration::from_millis(500),
            account: "default".into(),
            control_plane_delay: Duration::from_secs(2),
            pod_ready_delay: Duration::from_secs(1),
            max_termination_grace: Duration::from_secs(2),
            control_plane_pods: true,
            etcd_volumes: true,
        }
    }
}

#[derive(Clone)]
struct Member {
    instance_group: String,
    /// Its ASG: a master's place of etcd.
    asg: String,
    master: bool,
    never_join: bool,
    not_ready: bool,
    dead: bool,
    control_plane_down: bool,
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
    leases: Api<Lease>,
    renewed_at: HashMap<String, Instant>,
    /// Pods (namespace/name) first seen bound to a Ready node of ours.
    pod_seen: HashMap<String, Instant>,
    /// The members seen last step: an instance detached from its ASG (as
    /// kops's rolling update does) keeps running, and its kubelet with it.
    former: BTreeMap<String, Member>,
    /// How many more instances may register, when a test limits it.
    joins: JoinBudget,
    /// The instances running at the first step (None before it): a cluster
    /// that has been running for a while, whose masters' control planes
    /// turned Ready an hour ago (their settle time long over), not when
    /// the test started. Each leaves the set at its first Ready turn.
    veterans: Option<BTreeSet<String>>,
    /// Per master ASG (a place of etcd): the instance holding its volume,
    /// and since when (`SimConfig::etcd_volumes`).
    holders: BTreeMap<String, (String, Instant)>,
}

/// How long before the test the veterans' control planes turned Ready.
const VETERAN_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// A test's limit on how many more instances join: set before an operation
/// starts, it decides exactly which launch is the first never to join (a
/// tag set once something is seen races the next launch's registration).
/// An instance is charged once, at its first try: a registration that
/// failed, or that the apiserver made but answered with an error (a
/// timeout on a loaded machine), is tried again at no cost, and never lets
/// one more instance join than the test allowed.
#[derive(Clone, Default)]
pub struct JoinBudget(std::sync::Arc<std::sync::Mutex<Budget>>);

#[derive(Default)]
struct Budget {
    /// How many more may join; None: no limit.
    left: Option<usize>,
    /// Instances charged already.
    admitted: BTreeSet<String>,
}

impl JoinBudget {
    fn budget(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on, at most `n` more instances register; the rest never do.
    pub fn limit(&self, n: usize) {
        self.budget().left = Some(n);
    }

    /// `n` more instances may register than the limit allows now, however
    /// many of those it allowed have registered meanwhile (no limit: none
    /// is set). A test that learns how many must join only once an
    /// operation is under way adds them without racing the joins.
    pub fn allow(&self, n: usize) {
        if let Some(left) = self.budget().left.as_mut() {
            *left += n;
        }
    }

    /// Whether `instance` may try to register, charging it the first time.
    fn admit(&self, instance: &str) -> bool {
        let mut budget = self.budget();
        if budget.admitted.contains(instance) {
            return true;
        }
        match budget.left.as_mut() {
            Some(0) => return false,
            Some(left) => *left -= 1,
            None => {}
        }
        budget.admitted.insert(instance.to_string());
        true
    }
}

impl SimKubelet {
    pub fn new(client: kube::Client, aws: AwsClients, config: SimConfig) -> Self {
        let client_for_leases = client.clone();
        Self {
            nodes: Api::all(client.clone()),
            pods: Api::all(client),
            asg: aws.autoscaling.clone(),
            cloud: AwsCloud::new(aws),
            config,
            first_seen: HashMap::new(),
            registered_at: HashMap::new(),
            ready_at: HashMap::new(),
            leases: Api::namespaced(client_for_leases, "kube-node-lease"),
            renewed_at: HashMap::new(),
            pod_seen: HashMap::new(),
            former: BTreeMap::new(),
            joins: JoinBudget::default(),
            veterans: None,
            holders: BTreeMap::new(),
        }
    }

    /// The handle a test limits joins through.
    pub fn join_budget(&self) -> JoinBudget {
        self.joins.clone()
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        info!(account = %self.config.account, "simulated kubelet started");
        loop {
            // A step of a large world registers Nodes for seconds: stopped
            // midway, so none is registered after the world deleted them.
            tokio::select! {
                _ = shutdown.cancelled() => break,
                result = self.step() => if let Err(e) = result {
                    warn!(error = %e, "simulated kubelet step failed");
                },
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.config.poll) => {}
            }
        }
        // Its Nodes go with it (the guard deletes them too, but a request in
        // flight when it did may have registered one since).
        let selector = format!("{SIM_ACCOUNT_LABEL}={}", self.config.account);
        let _ = self
            .nodes
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&selector),
            )
            .await;
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
                let listed = |tag: &str| -> BTreeSet<&str> {
                    tags.get(tag)
                        .map(|v| v.split(',').map(str::trim).collect())
                        .unwrap_or_default()
                };
                let (not_ready, dead) = (listed(NOT_READY_TAG), listed(DEAD_TAG));
                let down = listed(CONTROL_PLANE_DOWN_TAG);
                for i in g.instances() {
                    let Some(id) = i.instance_id() else { continue };
                    members.insert(
                        id.to_string(),
                        Member {
                            instance_group: instance_group.to_string(),
                            asg: g.auto_scaling_group_name().unwrap_or_default().to_string(),
                            master: tags.contains_key(MASTER_ROLE_TAG),
                            never_join: tags.contains_key(NEVER_JOIN_TAG),
                            not_ready: not_ready.contains(id),
                            dead: dead.contains(id),
                            control_plane_down: down.contains(id) || down.contains("*"),
                        },
                    );
                }
            }
        }
        Ok(members)
    }

    /// One reconciliation of Nodes with instances.
    pub async fn step(&mut self) -> Result<()> {
        let mut members = self.members().await?;
        for (id, member) in &self.former {
            members.entry(id.clone()).or_insert_with(|| member.clone());
        }
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
        if self.veterans.is_none() {
            self.veterans = Some(running.keys().map(|id| id.to_string()).collect());
        }
        self.former = members
            .iter()
            .filter(|(id, _)| running.contains_key(id.as_str()))
            .map(|(id, m)| (id.clone(), m.clone()))
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
                self.renewed_at.remove(name);
                match self.leases.delete(name, &DeleteParams::default()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(e) => return Err(Error::kube(format!("delete lease {name}"))(e)),
                }
            }
        }
        let holders = self.hold_volumes(&members, &running, &existing, now);
        let mut control_plane = BTreeMap::new();
        for (id, instance) in &running {
            let Some(member) = members.get(*id) else {
                continue;
            };
            let first_seen = *self.first_seen.entry(id.to_string()).or_insert(now);
            // Never joining stops registration only: a Node that joined
            // before its ASG was tagged keeps its kubelet (Lease, status).
            let joined = existing.contains_key(*id);
            if (member.never_join && !joined)
                || now.duration_since(first_seen) < self.config.register_delay
            {
                continue;
            }
            if member.dead && existing.contains_key(*id) {
                // A dead kubelet says nothing more: no status, no Lease.
                continue;
            }
            let zone = instance.availability_zone.clone().unwrap_or_default();
            if !existing.contains_key(*id) {
                if !self.joins.admit(id) {
                    continue;
                }
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
            self.renew_lease(id, now).await?;
            if ready && member.master {
                let mut since = *self.ready_at.entry(id.to_string()).or_insert(now);
                let holds = match self.config.etcd_volumes {
                    true => holders.get(*id).copied(),
                    false => Some(since),
                };
                if let Some(took) = holds {
                    // Up a while after it has both its Node Ready and
                    // the place's volume.
                    since = since.max(took);
                }
                control_plane.insert(
                    id.to_string(),
                    holds.is_some()
                        && now.duration_since(since) >= self.config.control_plane_delay
                        && !member.control_plane_down,
                );
            }
        }
        if !self.config.control_plane_pods {
            control_plane.clear();
        }
        self.sync_control_plane(&control_plane).await?;
        // Pods on a dead kubelet's node neither run nor go.
        let alive: BTreeMap<String, Node> = existing
            .into_iter()
            .filter(|(name, _)| members.get(name).is_none_or(|m| !m.dead))
            .collect();
        self.run_pods(&alive).await
    }

    /// The kubelet's heartbeat: the node lifecycle controller marks a Node
    /// whose Lease is not renewed within its grace (40 s) Unknown.
    async fn renew_lease(&mut self, node: &str, now: Instant) -> Result<()> {
        if self
            .renewed_at
            .get(node)
            .is_some_and(|t| now.duration_since(*t) < LEASE_RENEW)
        {
            return Ok(());
        }
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS,
                     "renewTime": micro_time_now()},
        });
        self.leases
            .patch(
                node,
                &PatchParams::apply("sim-kubelet").force(),
                &Patch::Apply(&lease),
            )
            .await
            .map_err(Error::kube(format!("renew lease of {node}")))?;
        self.renewed_at.insert(node.to_string(), now);
        Ok(())
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
        // Capacity as an m5.large reports it, so the scheduler places pods.
        let resources = serde_json::json!({"cpu": "2", "memory": "8Gi", "pods": "110"});
        let patch = serde_json::json!({"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{
                "type": "Ready", "status": status, "reason": reason,
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
        }});
        self.nodes
            .patch_status(id, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!("set node {id} ready={ready}")))?;
        debug!(node = id, ready, "node readiness set");
        Ok(())
    }

    /// Each master ASG's volume holder, kept while it runs, else passed to
    /// the ASG's running master that joined first: instance -> since when
    /// it holds. A veteran held its volume long before the test.
    fn hold_volumes(
        &mut self,
        members: &BTreeMap<String, Member>,
        running: &BTreeMap<&str, &spot_node_manager::cloud::InstanceDescription>,
        joined: &BTreeMap<String, Node>,
        now: Instant,
    ) -> HashMap<String, Instant> {
        let mut places: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (id, m) in members {
            if m.master && running.contains_key(id.as_str()) {
                places.entry(m.asg.as_str()).or_default().push(id.as_str());
            }
        }
        self.holders
            .retain(|_, (id, _)| running.contains_key(id.as_str()));
        for (asg, ids) in places {
            if self.holders.contains_key(asg) {
                continue;
            }
            let first = ids
                .iter()
                .filter(|id| joined.contains_key(**id))
                .min_by_key(|id| self.registered_at.get(**id).copied().unwrap_or(now));
            if let Some(id) = first {
                let veteran = self.veterans.as_ref().is_some_and(|v| v.contains(*id));
                let since = match veteran {
                    true => now.checked_sub(VETERAN_FOR).unwrap_or(now),
                    false => now,
                };
                self.holders
                    .insert(asg.to_string(), (id.to_string(), since));
            }
        }
        self.holders
            .values()
            .map(|(id, t)| (id.clone(), *t))
            .collect()
    }

    /// kops's static control-plane pods on Ready masters (mirror pods in
    /// kube-system), Ready after `control_plane_delay`; gone with their node.
    async fn sync_control_plane(&mut self, masters: &BTreeMap<String, bool>) -> Result<()> {
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
                            "annotations": {spot_node_manager::crd::labels::MIRROR_ANNOTATION: "sim"},
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
                    // When it turned: what a test compares a master's
                    // disruption with (etcd joined before, or after?), and
                    // what the manager's settle time counts from (a
                    // veteran's an hour ago).
                    let veteran = *up
                        && self
                            .veterans
                            .as_ref()
                            .is_some_and(|v| v.contains(node.as_str()));
                    let mut at = k8s_openapi::jiff::Timestamp::now();
                    if veteran {
                        at = at
                            .checked_sub(VETERAN_FOR)
                            .map_err(|e| Error::InvalidObject(format!("an hour ago: {e}")))?;
                    }
                    let now = at.to_string();
                    let patch = serde_json::json!({"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": status, "lastTransitionTime": now}]}});
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(Error::kube(format!("set {name} ready={up}")))?;
                }
            }
        }
        // A veteran's control plane turned Ready once, an hour ago; any
        // later turn is now.
        if let Some(veterans) = self.veterans.as_mut() {
            veterans.retain(|node| masters.get(node) != Some(&true));
        }
        Ok(())
    }

    /// Stands in for the kubelet on our nodes: pods bound to a Ready node
    /// run and turn Ready after `pod_ready_delay`; a pod being deleted goes
    /// once its grace period (at most `max_termination_grace`) has passed.
    /// The control-plane mirror pods are [`Self::sync_control_plane`]'s.
    async fn run_pods(&mut self, nodes: &BTreeMap<String, Node>) -> Result<()> {
        if nodes.is_empty() {
            return Ok(());
        }
        let pods = self
            .pods
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list pods"))?;
        let now = Instant::now();
        let mut seen = HashMap::new();
        for pod in pods.items {
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                continue;
            };
            let Some(node) = nodes.get(node) else {
                continue;
            };
            if pod.labels().contains_key(SIM_ACCOUNT_LABEL) {
                continue;
            }
            let Some(namespace) = pod.namespace() else {
                continue;
            };
            let name = pod.name_any();
            let api: Api<Pod> = Api::namespaced(self.pods.clone().into_client(), &namespace);
            if let Some(deleted) = &pod.metadata.deletion_timestamp {
                if grace_over(&pod, deleted, self.config.max_termination_grace) {
                    match api
                        .delete(&name, &DeleteParams::default().grace_period(0))
                        .await
                    {
                        Ok(_) | Err(kube::Error::Api(_)) => {}
                        Err(e) => {
                            return Err(Error::kube(format!("finish pod {namespace}/{name}"))(e));
                        }
                    }
                }
                continue;
            }
            if !spot_node_manager::k8s::node::is_ready(node) || is_pod_ready(&pod) {
                continue;
            }
            let key = format!("{namespace}/{name}");
            let first = *self.pod_seen.get(&key).unwrap_or(&now);
            seen.insert(key.clone(), first);
            let ready = now.duration_since(first) >= self.config.pod_ready_delay;
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running && !ready {
                continue;
            }
            let patch = pod_status(&pod, ready);
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => debug!(pod = %key, ready, "pod running"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("run pod {key}"))(e)),
            }
        }
        self.pod_seen = seen;
        Ok(())
    }
}

fn micro_time_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn is_pod_ready(pod: &Pod) -> bool {
    spot_node_manager::k8s::control_plane::is_pod_ready(pod)
}

/// Whether a pod being deleted has had its grace period (capped), counted
/// from when the deletion was asked for.
fn grace_over(
    pod: &Pod,
    deleted: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    cap: Duration,
) -> bool {
    let grace = pod
        .metadata
        .deletion_grace_period_seconds
        .unwrap_or(0)
        .max(0) as u64;
    let Ok(until_deadline) = std::time::Duration::try_from(
        deleted
            .0
            .duration_since(k8s_openapi::jiff::Timestamp::now()),
    ) else {
        // The deadline (asked + grace) has passed.
        return true;
    };
    // Asked at deadline - grace; done at asked + min(grace, cap).
    let waited = Duration::from_secs(grace).saturating_sub(until_deadline);
    waited >= Duration::from_secs(grace).min(cap)
}

/// A running pod's status, as a kubelet reports it.
fn pod_status(pod: &Pod, ready: bool) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let flag = if ready { "True" } else { "False" };
    let containers: Vec<serde_json::Value> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            serde_json::json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(),
                "imageID": "", "ready": ready, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    serde_json::json!({"status": {
        "phase": "Running",
        "startTime": now,
        "podIP": "10.0.0.1",
        "hostIP": "10.0.0.1",
        "containerStatuses": containers,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ],
    }})
}

#[cfg(test)]
mod tests {
    use super::JoinBudget;

    fn joins(budget: &JoinBudget, ids: &[&str]) -> usize {
        ids.iter().filter(|id| budget.admit(id)).count()
    }

    #[test]
    fn more_joins_allowed_add_to_what_is_left_not_to_what_was_set() {
        let budget = JoinBudget::default();
        budget.allow(1);
        assert_eq!(joins(&budget, &["a", "b", "c"]), 3, "no limit: all join");
        budget.limit(1);
        assert_eq!(joins(&budget, &["d"]), 1);
        // The one allowed has joined; two more may, whenever they come.
        budget.allow(2);
        assert_eq!(joins(&budget, &["e", "f", "g", "h"]), 2);
        budget.limit(1);
        budget.allow(2);
        assert_eq!(
            joins(&budget, &["i", "j", "k", "l"]),
            3,
            "one left, two more"
        );
    }

    #[test]
    fn a_registration_tried_again_is_not_charged_twice_nor_lets_another_in() {
        let budget = JoinBudget::default();
        budget.limit(1);
        assert!(budget.admit("a"));
        // Its registration failed, or was made but answered with an error:
        // tried again, it is admitted; no other instance is.
        assert!(budget.admit("a"));
        assert!(!budget.admit("b"));
    }
}
