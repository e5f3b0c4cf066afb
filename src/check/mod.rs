//! `spot-node-manager check`: a read-only preflight that names each thing
//! the manager needs and lacks, with what to do. Run in the manager's pod
//! (`kubectl exec`), it asks with the manager's own IAM role and
//! ServiceAccount. It observes (AWS reads, Kubernetes lists), then judges
//! each observation in `judge` (pure); it changes nothing: AWS is only
//! described, and its context never leads.

pub mod judge;

use crate::cloud::{Cloud, TemplateKey};
use crate::config::Settings;
use crate::context::Context;
use crate::controllers::inventory::competing::Others;
use crate::controllers::inventory::{autoscalers, handlers, karpenter};
use crate::crd::NodeGroup;
use crate::k8s::control_plane;
use judge::{Finding, Level};
use kube::api::{Api, ListParams};
use std::collections::BTreeSet;
use std::sync::Arc;

pub use judge::{passes, text};

/// An instance id, a launch template and an ASG name no one has: the
/// reads that need nothing to exist ask about them (nothing found, no
/// error).
const NO_INSTANCE: &str = "i-00000000000000000";
const NO_TEMPLATE: &str = "spot-node-manager-check";
const NO_ASG: &str = "spot-node-manager-check";
/// An instance type every region prices (the price reads ask about it).
const SOME_TYPE: &str = "m5.large";

/// Every check's finding, in order: Kubernetes, other controllers, each
/// group's ASGs, the IAM reads, the interruption queue, the control plane.
pub async fn run(settings: Settings) -> crate::Result<Vec<Finding>> {
    let ctx = crate::preview::read_only_context(settings).await?;
    let mut out = vec![];
    let groups = match list_groups(&ctx).await {
        Ok(groups) => {
            out.push(Finding::new(
                Level::Ok,
                "kubernetes",
                format!("the apiserver answers; {} NodeGroup(s)", groups.len()),
            ));
            groups
        }
        Err(said) => {
            // Nothing else can be read without it.
            out.push(Finding::new(Level::Fail, "kubernetes", said));
            return Ok(out);
        }
    };
    let others = other_controllers(&ctx, &mut out).await;
    // The IAM reads are asked in the manager's region, about an ASG there.
    let mut here = vec![];
    for group in &groups {
        let cloud = ctx.cloud.cloud(group.spec.region.as_deref());
        let found = match cloud.describe_groups(&group.spec.asg_names()).await {
            Ok(found) => found,
            Err(e) => {
                out.push(judge::undescribed(group, &e));
                continue;
            }
        };
        let others = Others {
            autoscalers: &others.0,
            node_pools: &others.1,
        };
        out.extend(judge::group(group, &found, others));
        if group.spec.region.is_none() {
            here.extend(found);
        }
    }
    out.extend(judge::masters(&groups));
    let names: Vec<String> = groups.iter().flat_map(|g| g.spec.asg_names()).collect();
    out.extend(probe_iam(ctx.cloud.cloud(None).as_ref(), &names, &here).await);
    out.push(check_queue(&ctx).await);
    out.push(check_control_plane(&ctx).await);
    out.push(check_scrape(&ctx).await);
    Ok(out)
}

async fn list_groups(ctx: &Context) -> std::result::Result<Vec<NodeGroup>, String> {
    let api: Api<NodeGroup> = match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(e)) if e.code == 404 => Err(
            "the NodeGroup CRD is not installed: apply the manifests (kubectl apply -k manifests/overlays/<yours>)".into(),
        ),
        Err(kube::Error::Api(e)) if e.code == 403 => Err(format!(
            "NodeGroups cannot be listed ({}): the ServiceAccount lacks the manager's ClusterRole (manifests/base)",
            e.message
        )),
        Err(e) => Err(format!(
            "the apiserver cannot be reached: {e}; check the kubeconfig, or run check in the manager's pod"
        )),
    }
}

/// The other termination handlers, cluster-autoscalers and Karpenter
/// NodePools running, with a finding for the handlers (or for what could
/// not be listed).
async fn other_controllers(
    ctx: &Context,
    out: &mut Vec<Finding>,
) -> (Vec<autoscalers::Autoscaler>, Vec<String>) {
    let scope = crate::controllers::inventory::controller::listing_scope(ctx);
    match handlers::list(&ctx.client, scope).await {
        Ok(found) => out.push(judge::handlers(&found)),
        Err(e) => out.push(cannot_list(
            "termination handler",
            "deployments, daemonsets",
            &e,
        )),
    }
    let autoscalers = autoscalers::list(&ctx.client, scope)
        .await
        .unwrap_or_else(|e| {
            out.push(cannot_list("cluster-autoscaler", "deployments", &e));
            vec![]
        });
    let pools = karpenter::list(&ctx.client).await.unwrap_or_else(|e| {
        out.push(cannot_list("Karpenter", "karpenter.sh nodepools", &e));
        vec![]
    });
    (autoscalers, pools)
}

fn cannot_list(what: &str, resources: &str, e: &kube::Error) -> Finding {
    Finding::new(
        Level::Warn,
        format!("cluster {what}"),
        format!(
            "cannot be looked for ({e}): the manager needs list on {resources} (manifests/base ClusterRole) to say when one competes"
        ),
    )
}

/// Each IAM read the manager makes, asked once (in the manager's region),
/// about an ASG that exists where the call needs one.
async fn probe_iam(
    cloud: &dyn Cloud,
    names: &[String],
    asgs: &[crate::cloud::AsgDescription],
) -> Vec<Finding> {
    let [
        groups,
        hooks,
        activities,
        warm_pool,
        instances,
        templates,
        spot,
        on_demand,
        _queue,
    ] = judge::PROBED;
    let mut out = vec![];
    // No name asks nothing: an ASG no one has is asked about instead.
    let asked = match names.is_empty() {
        true => vec![NO_ASG.to_string()],
        false => names.to_vec(),
    };
    out.push(judge::probe(groups, &cloud.describe_groups(&asked).await));
    match asgs.first().map(|a| a.name.as_str()) {
        Some(asg) => {
            out.push(judge::probe(hooks, &cloud.terminate_hooks(asg).await));
            out.push(judge::probe(activities, &cloud.launch_failure(asg).await));
            out.push(judge::probe(warm_pool, &cloud.warm_pool(asg).await));
        }
        None => {
            for action in [hooks, activities, warm_pool] {
                out.push(judge::not_asked(
                    action,
                    "no ASG of a group found to ask about",
                ));
            }
        }
    }
    let answer = cloud.describe_instances(&[NO_INSTANCE.into()]).await;
    out.push(judge::probe(instances, &answer));
    let template = [TemplateKey::Name(NO_TEMPLATE.into())];
    out.push(judge::probe(
        templates,
        &cloud.template_versions(&template).await,
    ));
    out.push(judge::probe(
        spot,
        &cloud.spot_prices(&[SOME_TYPE.into()]).await,
    ));
    out.push(judge::probe(
        on_demand,
        &cloud.on_demand_price(SOME_TYPE).await,
    ));
    out.push(judge::not_probed());
    out
}

/// The interruption queue, read (its policy) when one is set.
async fn check_queue(ctx: &Context) -> Finding {
    let Some(url) = ctx.settings.interruption.queue_url.as_deref() else {
        return judge::queue(None, None);
    };
    let sdk = crate::cloud::load_sdk_config(&ctx.settings.aws).await;
    let queue = crate::cloud::sqs::Queue::new(
        &sdk,
        url,
        ctx.settings.aws.emulator_account.as_deref(),
        Arc::clone(&ctx.metrics),
    );
    let policy = queue.policy().await;
    judge::queue(Some(url), Some(&policy))
}

/// Whether Prometheus scrapes the manager, as the manager in this pod
/// saw it (`/scrapes` on its admin port; none answers when check runs
/// elsewhere).
async fn check_scrape(ctx: &Context) -> Finding {
    let mut address = ctx.settings.admin_address;
    if address.ip().is_unspecified() {
        let loopback: std::net::IpAddr = match address {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        address.set_ip(loopback);
    }
    let asked = tokio::time::timeout(std::time::Duration::from_secs(3), scrapes(address)).await;
    let answer = asked.unwrap_or_else(|_| Err("no answer within 3s".into()));
    judge::scrape(&address.to_string(), answer, chrono::Utc::now())
}

/// `GET /scrapes` of the manager at `address`: HTTP/1.0, one answer, no
/// client to build for one local read.
async fn scrapes(
    address: std::net::SocketAddr,
) -> std::result::Result<crate::admin::Scrapes, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /scrapes HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| "not an HTTP answer".to_string())?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(format!("answered {status}: a manager older than check?"));
    }
    serde_json::from_str(body).map_err(|e| format!("an answer that does not read: {e}"))
}

/// The masters' control-plane pods.
async fn check_control_plane(ctx: &Context) -> Finding {
    let check = "cluster control plane";
    let masters = match control_plane::master_nodes(ctx).await {
        Ok(m) => m.into_iter().map(|m| m.name).collect::<BTreeSet<String>>(),
        Err(e) => return Finding::new(Level::Warn, check, format!("cannot be looked at: {e}")),
    };
    match control_plane::list_pods(ctx).await {
        Ok(pods) => {
            let with_pods: BTreeSet<String> = pods
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            judge::control_plane(&masters, &with_pods)
        }
        Err(e) => Finding::new(Level::Warn, check, format!("cannot be looked at: {e}")),
    }
}
