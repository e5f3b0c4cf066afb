//! `spot-node-manager preview`: per group, the next disruption the manager
//! will make on its own, with the pods each node would move and the budget
//! that governs each. Read-only: the same observation and the same pure
//! plan as the Refresher's reconcile (`refresher::seen`,
//! `refresher::plan::preview`), through a context that never leads, so the
//! one mutation gate refuses anything (and dry-run logs it); AWS is only
//! described.

use crate::cloud::{self, aws::AwsCloudProvider};
use crate::config::Settings;
use crate::context::Context;
use crate::controllers::inventory::children::child_specs;
use crate::controllers::observe::{Observation, observe_group};
use crate::controllers::refresher::plan::Member;
use crate::controllers::refresher::seen::{Protection, Seen};
use crate::controllers::replenisher::plan::{ComingRepair, repairs_to_come};
use crate::crd::next::NextDisruption;
use crate::crd::nodegroup::OperationKind;
use crate::crd::{NodeGroup, Refresher, Replenisher};
use crate::k8s::budgets;
pub use crate::k8s::budgets::MovedPod;
use crate::k8s::disruption_slot::Slots;
use crate::leadership::Leadership;
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use std::sync::Arc;

/// One group's answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupPreview {
    pub namespace: String,
    pub group: String,
    /// None: nothing to come (no schedule and nothing drifted), or the
    /// group has no Refresher (no `refresh`, `drift.action: Report`).
    pub next: Option<NextDisruption>,
    /// Why there is no answer, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The replenisher's repairs to come: each NotReady node, when its
    /// repair starts, what would hold it.
    pub repairs: Vec<ComingRepair>,
    /// The replenisher's other next disruption (a surplus or at-risk node,
    /// an instance that never joined), as its last reconcile's plan says
    /// (`Replenisher.status.next`, at most a resync old).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replenisher: Option<NextDisruption>,
    /// Per node of `next`, in its order: the pods its drain would move.
    pub pods: Vec<NodePods>,
    /// With `--file` naming this group: what the proposed spec would do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposed: Option<Proposed>,
}

/// What a NodeGroup about to be applied would do, against what the
/// current one will.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Proposed {
    pub next: Option<NextDisruption>,
    /// In one line: what changes, or that nothing does.
    pub change: String,
}

/// The NodeGroup in `path` (YAML), as `--file` gives it.
pub fn read_proposal(path: &std::path::Path) -> std::result::Result<NodeGroup, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_yaml::from_str(&text).map_err(|e| format!("{}: not a NodeGroup: {e}", path.display()))
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePods {
    pub node: String,
    pub pods: Vec<MovedPod>,
}

/// A context that reads like the manager and can change nothing: it never
/// leads (the mutation gate refuses, Events are not sent), runs in dry-run,
/// and its AWS clients are unfenced only because they are only read through.
pub(crate) async fn read_only_context(mut settings: Settings) -> Result<Context> {
    settings.dry_run = true;
    let client = crate::manager::kube_client(&settings).await?;
    let eviction_client = crate::manager::kube_client_without_retry(&settings).await?;
    if settings.aws.emulator_account.is_some() {
        crate::crd::nodegroup::lift_duration_minima();
    }
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let sdk = cloud::load_sdk_config(&settings.aws).await;
    let cloud = Arc::new(
        AwsCloudProvider::new(sdk, settings.aws.emulator_account.clone())
            .with_pricing_region(settings.aws.pricing_region.clone())
            .with_metrics(metrics.clone()),
    );
    Ok(Context::new(
        client,
        eviction_client,
        Arc::new(settings),
        Arc::new(crate::clock::SystemClock),
        metrics,
        Leadership::elected(),
        cloud,
    ))
}

/// Every group's preview (of `settings.namespace`, or all namespaces), and
/// what `proposed` would do to its group.
pub async fn run(settings: Settings, proposed: Option<NodeGroup>) -> Result<Vec<GroupPreview>> {
    let ctx = read_only_context(settings).await?;
    let groups: Api<NodeGroup> = match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let groups = groups
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list NodeGroups"))?
        .items;
    let pods = Api::<Pod>::all(ctx.client.clone())
        .list(&ListParams::default().match_any())
        .await
        .map_err(Error::kube("list pods"))?
        .items;
    let budgets = budgets::list(&ctx).await?;
    if let Some(new) = &proposed
        && !groups.iter().any(|g| same_group(new, g))
    {
        // A new group has no inventory yet: nothing to plan on.
        return Err(Error::Config(format!(
            "--file: NodeGroup {} does not exist here: the preview plans a change to an existing group on its inventory; apply a new group with no schedule first, then preview its schedule",
            new.name_any()
        )));
    }
    let mut out = vec![];
    for group in &groups {
        let mut preview = group_preview(&ctx, group, None).await?;
        if let Some(new) = proposed.as_ref().filter(|p| same_group(p, group)) {
            let with = group_preview(&ctx, group, Some(new)).await?;
            let change = change(preview.next.as_ref(), with.next.as_ref());
            preview.proposed = Some(Proposed {
                next: with.next,
                change,
            });
        }
        // (Which nodes a budget holds, the plan's preview said: `Seen`.)
        if let Some(next) = preview.next.as_ref() {
            preview.pods = next
                .nodes
                .iter()
                .map(|n| NodePods {
                    node: n.node.clone(),
                    pods: budgets::moved_pods(&n.node, &pods, &budgets),
                })
                .collect();
        }
        out.push(preview);
    }
    Ok(out)
}

/// Whether `proposed` is `group` (its namespace, when it names one).
fn same_group(proposed: &NodeGroup, group: &NodeGroup) -> bool {
    proposed.name_any() == group.name_any()
        && proposed
            .namespace()
            .is_none_or(|ns| Some(ns) == group.namespace())
}

/// What changes between the current next disruption and the proposed one.
fn change(now: Option<&NextDisruption>, with: Option<&NextDisruption>) -> String {
    let say = |n: Option<&NextDisruption>| n.map_or("nothing".to_string(), |n| n.summary.clone());
    let key = |n: Option<&NextDisruption>| n.map(|n| (n.what.clone(), n.at, n.nodes.clone()));
    match key(now) == key(with) {
        true => format!("no change: {}", say(now)),
        false => format!("would {} instead of {}", say(with), say(now)),
    }
}

/// `group`'s preview; with `proposed`, as if its spec were that one's (the
/// Refresher the inventory would make of it, the group's spec replaced).
async fn group_preview(
    ctx: &Context,
    group: &NodeGroup,
    proposed: Option<&NodeGroup>,
) -> Result<GroupPreview> {
    let namespace = group.namespace().unwrap_or_default();
    let name = group.name_any();
    let answer = |next, note: Option<&str>, repairs| GroupPreview {
        namespace: namespace.clone(),
        group: name.clone(),
        next,
        note: note.map(str::to_string),
        repairs,
        replenisher: None,
        pods: vec![],
        proposed: None,
    };
    // Observed as the group's children observe it (read-only: the group
    // stands in for the child, whose name and namespace are the same).
    let mut observed = match observe_group(ctx, group, OperationKind::Refresh, &name).await? {
        Observation::Group(observed) => observed,
        Observation::NotYet(_) => {
            return Ok(answer(None, Some("not inventoried yet"), vec![]));
        }
    };
    if let Some(new) = proposed {
        observed.group.spec = new.spec.clone();
    }
    let described = observed.describe(ctx.clock.now()).await?;
    observed.observe_control_plane(ctx, true).await?;
    let members = Member::all_of(&described.fresh);
    let active: Vec<String> = members.iter().map(|m| m.instance_id.clone()).collect();
    let rp = match observed.group.spec.replenish.enabled {
        true => Api::<Replenisher>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("get Replenisher {namespace}/{name}")))?,
        false => None,
    };
    let repairs = match &rp {
        Some(rp) => repairs_seen_by(ctx, &observed, &described, rp, &active).await?,
        None => vec![],
    };
    let replenisher = rp
        .and_then(|r| r.status?.next)
        .filter(|n| n.what != "repair");
    let answer = |next, note: Option<&str>, repairs| GroupPreview {
        replenisher: replenisher.clone(),
        ..answer(next, note, repairs)
    };
    let refreshers: Api<Refresher> = Api::namespaced(ctx.client.clone(), &namespace);
    let current = refreshers
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("get Refresher {namespace}/{name}")))?;
    let rf = match proposed {
        None => current,
        Some(new) => child_specs(new).0.map(|spec| {
            let mut rf = current.unwrap_or_else(|| Refresher::new(&name, spec.clone()));
            rf.metadata.namespace = Some(namespace.clone());
            rf.spec = spec;
            rf
        }),
    };
    let Some(rf) = rf else {
        let note = "no refresh and no drift roll (no Refresher)";
        return Ok(answer(None, Some(note), repairs));
    };
    let slots = Slots::of(ctx, &rf, observed.group.spec.role);
    let seen = Seen::observe(
        ctx,
        &rf,
        &observed.group,
        &slots,
        Protection::AllMembers,
        ctx.clock.now(),
    )
    .await?;
    let next = seen.next(&observed, Some(&described));
    let note = next
        .is_none()
        .then_some("nothing to come: no schedule, nothing drifted");
    Ok(answer(next, note, repairs))
}

/// The repairs to come, with what holds each as the Replenisher sees it:
/// the group's lock from its side (a refresh holding it holds repairs),
/// and the disruption slot a master repair needs.
async fn repairs_seen_by(
    ctx: &Context,
    observed: &crate::controllers::observe::ObservedGroup,
    described: &crate::controllers::observe::DescribedAsgs,
    rp: &Replenisher,
    active: &[String],
) -> Result<Vec<ComingRepair>> {
    let me = crate::k8s::lock::Holder {
        kind: OperationKind::Replenish,
        name: rp.name_any(),
    };
    let lock = crate::k8s::lock::observe(
        &ctx.client,
        &observed.namespace,
        observed.group_status.operation.as_ref(),
        &me,
    )
    .await?;
    let mut facts = observed.facts(described, false, ctx.clock.now());
    facts.lock = lock;
    Ok(repairs_to_come(&facts, active))
}

/// The answer for people.
pub fn text(previews: &[GroupPreview]) -> String {
    let mut out = String::new();
    for p in previews {
        out.push_str(&format!("{}/{}: ", p.namespace, p.group));
        for r in &p.repairs {
            out.push_str(&format!(
                "repair {} ({}) at {}",
                r.node,
                r.instance_id,
                r.at.to_rfc3339()
            ));
            if let Some(why) = &r.held_by {
                out.push_str(&format!("; held: {why}"));
            }
            out.push_str("\n  ");
        }
        if let Some(other) = &p.replenisher {
            out.push_str(&format!("{}\n  why: {}\n  ", other.summary, other.why));
        }
        let Some(next) = &p.next else {
            out.push_str(p.note.as_deref().unwrap_or("nothing to come"));
            out.push('\n');
            continue;
        };
        out.push_str(&format!("{}\n  why: {}\n", next.summary, next.why));
        if let Some(why) = &next.blocked_by {
            out.push_str(&format!("  held now by: {why}\n"));
        }
        for (i, node) in next.nodes.iter().enumerate() {
            out.push_str(&node_line("  ", i, node));
            let moved = p.pods.iter().find(|m| m.node == node.node);
            for pod in moved.map(|m| m.pods.as_slice()).unwrap_or_default() {
                out.push_str(&format!(
                    "       moves {} ({})",
                    pod.pod,
                    pod.owner.as_deref().unwrap_or("no controller")
                ));
                for (budget, allowed) in &pod.budgets {
                    let now = if *allowed == 0 {
                        ": would refuse an eviction now"
                    } else {
                        ""
                    };
                    out.push_str(&format!(", pdb {budget} allows {allowed}{now}"));
                }
                out.push('\n');
            }
        }
        let listed = i32::try_from(next.nodes.len()).unwrap_or(i32::MAX);
        if next.total > listed {
            out.push_str(&format!("  ... and {} more\n", next.total - listed));
        }
        out.push_str(&proposed_text(p.proposed.as_ref()));
    }
    out
}

fn proposed_text(proposed: Option<&Proposed>) -> String {
    let Some(p) = proposed else {
        return String::new();
    };
    let mut out = format!("  with the file: {}\n", p.change);
    for (i, node) in p.next.iter().flat_map(|n| &n.nodes).enumerate() {
        out.push_str(&node_line("    ", i, node));
    }
    out
}

/// One node of a preview, numbered from 1, with what would hold it.
fn node_line(indent: &str, i: usize, node: &crate::crd::next::NextNode) -> String {
    let held = node
        .blocked_by
        .as_ref()
        .map_or(String::new(), |why| format!(": {why}"));
    format!(
        "{indent}{}. {} ({}){held}\n",
        i + 1,
        node.node,
        node.instance_id
    )
}
