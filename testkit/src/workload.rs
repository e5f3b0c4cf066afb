//! A workload on a world's nodes: a Deployment with a PodDisruptionBudget,
//! run by the real controllers and scheduler and the simulated kubelet, and a
//! sampler of its Ready pods (what a user cares about while nodes change).

use crate::coverage::{Coverage, Sampled, wait_after_end, wait_first};
use crate::sim::SIM_ACCOUNT_LABEL;
use crate::world::World;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const APP: &str = "web";

/// Deployment `web` with `replicas` pods, placed only on this world's nodes,
/// and PDB `web` allowing `max_unavailable` of them to be disrupted.
pub async fn deploy_web(world: &World, replicas: i32, max_unavailable: i32) {
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": APP},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": APP}},
            "template": {
                "metadata": {"labels": {"app": APP}},
                "spec": {
                    // Other tests' nodes share this apiserver: stay on ours.
                    "nodeSelector": {SIM_ACCOUNT_LABEL: world.account},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": APP, "image": "registry.invalid/web"}],
                },
            },
        },
    }))
    .expect("deployment");
    let deployments: Api<Deployment> = world.api();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create deployment");
    let pdb: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": APP},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": APP}}},
    }))
    .expect("pdb");
    crate::pdb_api(world)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("create pdb");
}

/// The workload's Ready pods (not being deleted), with their nodes.
/// Waits for `n` Ready web pods; returns them as (pod, node).
pub async fn assert_web_ready(world: &World, n: usize) -> Vec<(String, String)> {
    crate::assert_eventually(&format!("{n} Ready pods"), crate::refresh::WAIT, || async {
        let ready = ready_web_pods(world).await;
        (ready.len() == n).then_some(ready)
    })
    .await
}

pub async fn ready_web_pods(world: &World) -> Vec<(String, String)> {
    ready_in(&world.api()).await
}

async fn ready_in(pods: &Api<Pod>) -> Vec<(String, String)> {
    let Ok(list) = pods
        .list(&ListParams::default().labels(&format!("app={APP}")))
        .await
    else {
        return vec![];
    };
    ready_of(&list.items)
}

/// The Ready pods among `pods`, each with its node.
fn ready_of(pods: &[Pod]) -> Vec<(String, String)> {
    pods.iter()
        .filter(|p| spot_node_manager::k8s::control_plane::is_pod_ready(p))
        .map(|p| {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            (p.name_any(), node)
        })
        .collect()
}

/// What a pod sampler saw; its minimum is read through a method that first
/// asserts the sampler looked all through the period.
#[derive(Debug, Default, Clone)]
pub struct PodSamples {
    coverage: Coverage,
    min_ready: Option<usize>,
    /// Every pod seen Ready, and every node one ran on.
    pub pods: BTreeSet<String>,
    pub nodes: BTreeSet<String>,
}

impl Sampled for PodSamples {
    fn coverage(&mut self) -> &mut Coverage {
        &mut self.coverage
    }
}

impl PodSamples {
    /// The fewest Ready pods of the workload seen at once.
    pub fn min_ready(&self) -> usize {
        self.coverage.assert_looked("Ready pods");
        self.min_ready.unwrap_or_default()
    }

    /// Samples taken.
    pub fn count(&self) -> usize {
        self.coverage.count
    }
}

pub struct PodSampler {
    stop: tokio_util::sync::CancellationToken,
    samples: Arc<Mutex<PodSamples>>,
}

impl PodSampler {
    /// Ends the period, waits for a sample after it, and stops.
    pub async fn stop(self) -> PodSamples {
        wait_after_end(&self.samples).await;
        self.stop.cancel();
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Samples the workload's Ready pods every 250 ms until stopped; returns
/// once the first sample is taken.
pub async fn sample_web(world: &World) -> PodSampler {
    let stop = tokio_util::sync::CancellationToken::new();
    let samples = Arc::new(Mutex::new(PodSamples::default()));
    let pods: Api<Pod> = world.api();
    let (token, out) = (stop.clone(), samples.clone());
    tokio::spawn(async move {
        while !token.is_cancelled() {
            let read = pods
                .list(&ListParams::default().labels(&format!("app={APP}")))
                .await;
            if let Ok(mut s) = out.lock() {
                match read {
                    Ok(list) => {
                        let ready = ready_of(&list.items);
                        s.coverage.sampled(Instant::now());
                        s.min_ready = Some(s.min_ready.map_or(ready.len(), |m| m.min(ready.len())));
                        for (pod, node) in ready {
                            s.pods.insert(pod);
                            s.nodes.insert(node);
                        }
                    }
                    Err(e) => s.coverage.failed(e),
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    wait_first(&samples).await;
    PodSampler { stop, samples }
}

/// DaemonSet `agent` on this world's nodes: the real DaemonSet controller
/// puts one pod on each, and a drain must leave them be.
pub async fn deploy_agent(world: &World) {
    let daemon_set: k8s_openapi::api::apps::v1::DaemonSet =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {
                        "nodeSelector": {SIM_ACCOUNT_LABEL: world.account},
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "agent", "image": "registry.invalid/agent"}],
                    },
                },
            },
        }))
        .expect("daemon set");
    let api: Api<k8s_openapi::api::apps::v1::DaemonSet> = world.api();
    api.create(&PostParams::default(), &daemon_set)
        .await
        .expect("create daemon set");
}

/// The nodes running a Ready `agent` pod.
pub async fn nodes_with_ready_agent(world: &World) -> BTreeSet<String> {
    let pods: Api<Pod> = world.api();
    let Ok(list) = pods.list(&ListParams::default().labels("app=agent")).await else {
        return BTreeSet::new();
    };
    list.items
        .iter()
        .filter(|p| spot_node_manager::k8s::control_plane::is_pod_ready(p))
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect()
}
