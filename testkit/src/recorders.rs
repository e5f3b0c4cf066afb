//! What runs beside a test while the manager acts, and records what it saw
//! for the test to judge afterwards: when old masters were cordoned and new
//! control planes came up, the launch template version of every instance,
//! the pods a user starts by hand on new nodes.

use crate::World;
use crate::refresh::{instance_of, is_ready};
use crate::sim::SIM_ACCOUNT_LABEL;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use spot_node_manager::cloud::{Cloud, LaunchSource, aws::AwsCloud};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type FirstSeen = (BTreeMap<String, Instant>, BTreeMap<String, Instant>);

/// When each original master was first seen cordoned (from a watch on the
/// Nodes: every update arrives, even for a Node deleted right after its
/// cordon, which polling can miss) and when each new master's control-plane
/// pods were first all Ready (polled every 250 ms; the settle time between
/// the two is seconds).
pub struct ControlPlaneSampler {
    times: Arc<Mutex<FirstSeen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ControlPlaneSampler {
    pub fn start(world: &World, original: &BTreeSet<String>) -> ControlPlaneSampler {
        let times: Arc<Mutex<FirstSeen>> = Default::default();
        let nodes: Api<Node> = Api::all(world.client.clone());
        let pods: Api<Pod> = Api::namespaced(world.client.clone(), "kube-system");
        let selector = format!("{SIM_ACCOUNT_LABEL}={}", world.account);
        let cordons = {
            let (original, out) = (original.clone(), times.clone());
            let config = watcher::Config::default().labels(&selector);
            tokio::spawn(async move {
                let mut events = watcher(nodes, config)
                    .default_backoff()
                    .touched_objects()
                    .boxed();
                while let Some(event) = events.next().await {
                    let Ok(node) = event else { continue };
                    let name = node.metadata.name.clone().unwrap_or_default();
                    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
                    if original.contains(&name) && cordoned {
                        let now = Instant::now();
                        out.lock().expect("times").0.entry(name).or_insert(now);
                    }
                }
            })
        };
        let control_plane = {
            let (original, out) = (original.clone(), times.clone());
            tokio::spawn(async move {
                loop {
                    if let Ok(cp) = pods.list(&ListParams::default().labels(&selector)).await {
                        let up =
                            spot_node_manager::k8s::control_plane::nodes_with_ready_control_plane(
                                &cp.items,
                            );
                        let now = Instant::now();
                        let mut t = out.lock().expect("times");
                        for name in up.into_iter().filter(|n| !original.contains(n)) {
                            t.1.entry(name).or_insert(now);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        };
        ControlPlaneSampler {
            times,
            tasks: vec![cordons, control_plane],
        }
    }

    /// (cordon times of the old masters, control-plane Ready times of the
    /// new ones), each sorted.
    pub fn stop(self) -> (Vec<Instant>, Vec<Instant>) {
        for task in &self.tasks {
            task.abort();
        }
        let t = self.times.lock().expect("times");
        let mut cordoned: Vec<Instant> = t.0.values().copied().collect();
        let mut ready: Vec<Instant> = t.1.values().copied().collect();
        cordoned.sort();
        ready.sort();
        (cordoned, ready)
    }
}

/// The template version each instance of the ASGs was launched from, as
/// seen every 250 ms while it was in an ASG (so terminated ones are known).
pub struct TemplateVersions {
    seen: Arc<Mutex<BTreeMap<String, String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TemplateVersions {
    pub fn watch(world: &World, asgs: &[String]) -> TemplateVersions {
        let seen: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let cloud = AwsCloud::new(world.aws.clone());
        let (asgs, out) = (asgs.to_vec(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                if let Ok(described) = cloud.describe_groups(&asgs).await {
                    let mut seen = out.lock().expect("versions");
                    for i in described.iter().flat_map(|a| a.instances.iter()) {
                        if let Some(LaunchSource::Template {
                            version: Some(v), ..
                        }) = &i.launched_from
                        {
                            seen.insert(i.instance_id.clone(), v.clone());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        TemplateVersions { seen, task }
    }

    /// Instances seen launched from `version`.
    pub fn of(&self, version: &str) -> BTreeSet<String> {
        let seen = self.seen.lock().expect("versions");
        seen.iter()
            .filter(|(_, v)| *v == version)
            .map(|(i, _)| i.clone())
            .collect()
    }
}

impl Drop for TemplateVersions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whatever a user starts by hand (`kubectl run`): a bare pod (no
/// controller recreates it) on each new node once Ready, every node not in
/// `original`; named `bare-<node>`.
pub struct BarePods {
    placed: Arc<Mutex<BTreeSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl BarePods {
    pub fn on_new_nodes(world: &World, original: &BTreeSet<String>) -> BarePods {
        let placed: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let nodes: Api<Node> = Api::all(world.client.clone());
        let pods: Api<Pod> = world.api();
        let ours = ListParams::default().labels(&format!("{SIM_ACCOUNT_LABEL}={}", world.account));
        let (original, out) = (original.clone(), placed.clone());
        let task = tokio::spawn(async move {
            loop {
                let listed = nodes.list(&ours).await.map(|l| l.items).unwrap_or_default();
                for node in listed {
                    let Some(name) = node.metadata.name.clone() else {
                        continue;
                    };
                    let instance = instance_of(&node).unwrap_or_default();
                    let pod = format!("bare-{name}");
                    if original.contains(&instance)
                        || !is_ready(&node)
                        || out.lock().expect("placed").contains(&pod)
                    {
                        continue;
                    }
                    let bare = crate::bound_pod(&pod, &name, &[]);
                    if pods.create(&Default::default(), &bare).await.is_ok() {
                        out.lock().expect("placed").insert(pod);
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        BarePods { placed, task }
    }

    /// Stops placing; the pods placed.
    pub fn stop(self) -> BTreeSet<String> {
        self.task.abort();
        self.placed.lock().expect("placed").clone()
    }
}

/// What [`Cordons`] saw: every new cordon of a Node of the ASGs, and the
/// most Nodes out at once at any of them.
#[derive(Debug, Default, Clone)]
pub struct CordonsSeen {
    /// New cordons seen (a Node turning unschedulable).
    pub cordons: usize,
    /// The most Nodes cordoned at once whose instance was still in service
    /// (InService or Pending in one of the ASGs) when one more was cordoned.
    pub most_out: usize,
    /// The Nodes out at that moment.
    pub out_at_most: Vec<String>,
}

/// Nodes out at once, measured at each cordon: a watch on the Nodes (every
/// update arrives, so no cordon is missed however short its drain, which
/// polling can miss), and at each new cordon a describe of the ASGs, so a
/// Node whose instance is already terminating (its Node not yet deleted)
/// is not counted as out. A drain overlapping another is seen unless the
/// other's termination falls between the cordon and the describe (ms).
pub struct Cordons {
    seen: Arc<Mutex<CordonsSeen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Cordons {
    pub fn watch(world: &World, asgs: &[String]) -> Cordons {
        let seen: Arc<Mutex<CordonsSeen>> = Arc::default();
        let nodes: Api<Node> = Api::all(world.client.clone());
        let cloud = AwsCloud::new(world.aws.clone());
        let config =
            watcher::Config::default().labels(&format!("{SIM_ACCOUNT_LABEL}={}", world.account));
        let (asgs, out) = (asgs.to_vec(), seen.clone());
        let task = tokio::spawn(async move {
            // Node name -> its instance, for the Nodes cordoned now.
            let mut cordoned: BTreeMap<String, String> = BTreeMap::new();
            let mut events = watcher(nodes, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                let touched = match event {
                    Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => node,
                    Ok(watcher::Event::Delete(node)) => {
                        cordoned.remove(&node.metadata.name.unwrap_or_default());
                        continue;
                    }
                    _ => continue,
                };
                let name = touched.metadata.name.clone().unwrap_or_default();
                let now_cordoned =
                    touched.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
                if !now_cordoned {
                    cordoned.remove(&name);
                    continue;
                }
                let fresh = !cordoned.contains_key(&name);
                cordoned.insert(name, instance_of(&touched).unwrap_or_default());
                if !fresh {
                    continue;
                }
                let Ok(described) = cloud.describe_groups(&asgs).await else {
                    continue;
                };
                let in_service: BTreeSet<&str> = described
                    .iter()
                    .flat_map(|a| a.instances.iter())
                    .filter(|i| {
                        i.lifecycle_state == "InService" || i.lifecycle_state.starts_with("Pending")
                    })
                    .map(|i| i.instance_id.as_str())
                    .collect();
                let out_now: Vec<String> = cordoned
                    .iter()
                    .filter(|(_, instance)| in_service.contains(instance.as_str()))
                    .map(|(node, _)| node.clone())
                    .collect();
                let mut seen = out.lock().expect("cordons");
                seen.cordons += 1;
                if out_now.len() > seen.most_out {
                    seen.most_out = out_now.len();
                    seen.out_at_most = out_now;
                }
            }
        });
        Cordons { seen, task }
    }

    /// Stops watching; what was seen.
    pub fn stop(self) -> CordonsSeen {
        self.task.abort();
        self.seen.lock().expect("cordons").clone()
    }
}
