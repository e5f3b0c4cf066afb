//! The demo's live timeline (see `snm_testkit::timeline`): polls a group's
//! ASGs, Nodes, Refresher and Replenisher and an application's pods, and
//! prints one line per thing that happened, plus a summary per operation.

use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use snm_testkit::timeline::{NodeState, PodState, Snapshot, Timeline};
use spot_node_manager::cloud::AwsClients;
use spot_node_manager::crd::replenisher::ReplenishPhase;
use spot_node_manager::crd::{NodeGroup, Refresher, Replenisher};
use spot_node_manager::k8s::node::{NodeView, is_ready, is_unschedulable};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Live timeline of a NodeGroup and an application while nodes change")]
struct Args {
    #[arg(long)]
    kubeconfig: PathBuf,
    #[arg(long)]
    aws_endpoint: String,
    #[arg(long, default_value = "ap-northeast-1")]
    aws_region: String,
    /// The NodeGroup's namespace and name.
    #[arg(long, default_value = "spot-node-manager")]
    namespace: String,
    #[arg(long, default_value = "nodes")]
    group: String,
    /// The application's namespace and `app` label.
    #[arg(long, default_value = "default")]
    app_namespace: String,
    #[arg(long, default_value = "web")]
    app: String,
    /// Floors an operation must not go below: Ready nodes, Ready pods.
    #[arg(long, default_value_t = 3)]
    desired: usize,
    #[arg(long, default_value_t = 5)]
    pod_floor: usize,
    /// Appends each operation's summary line here too.
    #[arg(long)]
    summary_file: Option<PathBuf>,
}

struct Sources {
    groups: Api<NodeGroup>,
    refreshers: Api<Refresher>,
    replenishers: Api<Replenisher>,
    nodes: Api<Node>,
    pods: Api<Pod>,
    aws: AwsClients,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let (client, aws) = match snm_testkit::binary_clients(
        &args.kubeconfig,
        &args.aws_endpoint,
        &args.aws_region,
        None,
    )
    .await
    {
        Ok(clients) => clients,
        Err(e) => {
            eprintln!("timeline: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sources = Sources {
        groups: Api::namespaced(client.clone(), &args.namespace),
        refreshers: Api::namespaced(client.clone(), &args.namespace),
        replenishers: Api::namespaced(client.clone(), &args.namespace),
        nodes: Api::all(client.clone()),
        pods: Api::namespaced(client.clone(), &args.app_namespace),
        aws,
    };
    let mut timeline = Timeline::new(args.desired, args.pod_floor);
    let started = Instant::now();
    let mut known_nodes: BTreeSet<String> = BTreeSet::new();
    loop {
        match snapshot(&sources, &args, started, &mut known_nodes).await {
            Ok(s) => {
                let before = timeline.summaries.len();
                let mut out = std::io::stdout().lock();
                for line in timeline.observe(s) {
                    let _ = writeln!(out, "timeline {line}");
                }
                let _ = out.flush();
                if let Some(path) = &args.summary_file {
                    for summary in &timeline.summaries[before..] {
                        let line = summary.line(args.desired, args.pod_floor);
                        let appended = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                            .and_then(|mut f| writeln!(f, "{line}"));
                        if let Err(e) = appended {
                            eprintln!("timeline: writing {}: {e}", path.display());
                        }
                    }
                }
            }
            // The cluster coming up or going down: look again.
            Err(e) => tracing::debug!(error = %e, "snapshot failed"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn snapshot(
    sources: &Sources,
    args: &Args,
    started: Instant,
    known_nodes: &mut BTreeSet<String>,
) -> Result<Snapshot, String> {
    let group = sources
        .groups
        .get(&args.group)
        .await
        .map_err(|e| format!("get NodeGroup: {e}"))?;
    let names = group.spec.asg_names();
    let asgs = sources
        .aws
        .autoscaling
        .describe_auto_scaling_groups()
        .set_auto_scaling_group_names(Some(names))
        .send()
        .await
        .map_err(|e| format!("describe ASGs: {e}"))?;
    let mut snapshot = Snapshot {
        at: started.elapsed().as_secs_f64(),
        ..Default::default()
    };
    for asg in asgs.auto_scaling_groups() {
        for i in asg.instances() {
            let leaving = i
                .lifecycle_state()
                .is_some_and(|s| s.as_str().starts_with("Terminat"));
            if let (Some(id), false) = (i.instance_id(), leaving) {
                snapshot.instances.insert(
                    id.to_string(),
                    asg.auto_scaling_group_name().unwrap_or("-").to_string(),
                );
            }
        }
    }
    let listed: BTreeSet<String> = group
        .status
        .as_ref()
        .map(|s| s.nodes.iter().map(|n| n.name.clone()).collect())
        .unwrap_or_default();
    let nodes = sources
        .nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list nodes: {e}"))?;
    for node in &nodes.items {
        let name = node.name_any();
        // The group's nodes: listed by the inventory, on one of its
        // instances, or seen as such before (until they go).
        let ours = listed.contains(&name)
            || known_nodes.contains(&name)
            || node
                .instance_id()
                .is_some_and(|id| snapshot.instances.contains_key(&id));
        if ours {
            known_nodes.insert(name.clone());
            snapshot.nodes.insert(
                name,
                NodeState {
                    ready: is_ready(node),
                    cordoned: is_unschedulable(node),
                },
            );
        }
    }
    known_nodes.retain(|n| snapshot.nodes.contains_key(n));
    let pods = sources
        .pods
        .list(&ListParams::default().labels(&format!("app={}", args.app)))
        .await
        .map_err(|e| format!("list pods: {e}"))?;
    for pod in &pods.items {
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        snapshot.pods.insert(
            pod.name_any(),
            PodState {
                node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                ready,
                terminating: pod.metadata.deletion_timestamp.is_some(),
            },
        );
    }
    if let Ok(Some(rf)) = sources.refreshers.get_opt(&args.group).await {
        snapshot.refresh_phase = rf
            .status
            .filter(|s| s.run_start.is_some())
            .map(|s| format!("{:?}", s.phase));
    }
    if let Ok(Some(rp)) = sources.replenishers.get_opt(&args.group).await {
        snapshot.replenish_phase = rp
            .status
            .map(|s| s.phase)
            .filter(|p| {
                matches!(
                    p,
                    ReplenishPhase::ScalingUp
                        | ReplenishPhase::ScalingDown
                        | ReplenishPhase::CleaningUp
                        | ReplenishPhase::Waiting
                )
            })
            .map(|p| format!("{p:?}"));
    }
    Ok(snapshot)
}
