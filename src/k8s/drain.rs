//! Drain, one non-blocking step per reconcile: cordon the node, then evict
//! its pods through the Eviction API (PodDisruptionBudgets respected),
//! skipping DaemonSet-owned, mirror and finished pods, and waiting for pods
//! already terminating instead of evicting them again.
//!
//! A PDB refusal (HTTP 429) is expected contention: it is reported in the
//! progress and retried on the next step, never in a loop here. Evictions go
//! through a client without kube's built-in 429 retry, so a blocked eviction
//! cannot stall the reconcile. The timeout and what happens at it belong to
//! the caller, which knows when the drain started. The manager's own pod
//! goes last, and leadership before it (`k8s::own_pod`).

use super::own_pod;
use crate::context::Context;
use crate::crd::labels::{CORDONED_BY_US, MIRROR_ANNOTATION};
use crate::events::Reason;
use crate::mutation::{Applied, Intent};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use tracing::info;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodAction {
    /// Left alone: DaemonSet-owned, mirror (static) or finished.
    Skip(&'static str),
    /// Already terminating: wait for it.
    Wait,
    Evict,
}

/// Pure: what a drain does with a pod.
pub fn classify(pod: &Pod) -> PodAction {
    if pod.annotations().contains_key(MIRROR_ANNOTATION) {
        return PodAction::Skip("mirror pod");
    }
    if pod.owner_references().iter().any(|o| o.kind == "DaemonSet") {
        return PodAction::Skip("DaemonSet pod");
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return PodAction::Skip("finished pod");
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return PodAction::Wait;
    }
    PodAction::Evict
}

/// Where a drain stands after one step (pod names as namespace/name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// Evicted in this step.
    pub evicted: Vec<String>,
    /// Refused by a PodDisruptionBudget in this step.
    pub blocked: Vec<String>,
    /// What the refusing budgets said (each names its budget), deduplicated.
    pub budgets: Vec<String>,
    /// Refused for load (a 429 that is not a budget's: API priority and
    /// fairness); retried on the next step, not reported as blocked.
    pub throttled: Vec<String>,
    /// Terminating, waited for.
    pub waiting: Vec<String>,
    /// Dry-run: what would have been evicted.
    pub dry_run: Vec<String>,
    /// The manager's own pod, left for last (see `k8s::own_pod`).
    pub held: Vec<String>,
    /// The manager's own pod with nowhere else to run (the only
    /// control-plane node): not moved, it goes with the instance; the
    /// drain is done without it.
    pub staying: Vec<String>,
}

impl DrainProgress {
    /// Nothing left on the node that a drain must move. In dry-run, pods that
    /// would have been evicted count as moved: the drain is done as planned.
    pub fn done(&self) -> bool {
        self.evicted.is_empty()
            && self.blocked.is_empty()
            && self.waiting.is_empty()
            && self.throttled.is_empty()
            && self.held.is_empty()
    }
}

impl DrainProgress {
    /// Every pod that must move has had its deletion asked (evicted now or
    /// before, already terminating): all a drain can do on a node whose
    /// kubelet is dead, which never confirms a deletion.
    pub fn deletions_asked(&self) -> bool {
        self.blocked.is_empty() && self.throttled.is_empty() && self.held.is_empty()
    }

    /// Done for a drain of a healthy node ([`Self::done`]), or of an
    /// unhealthy one ([`Self::deletions_asked`]).
    pub fn done_for(&self, unhealthy: bool) -> bool {
        match unhealthy {
            true => self.deletions_asked(),
            false => self.done(),
        }
    }
}

/// When to take the next step of a drain that started at `started`: evicted
/// pods often go within a second or two, so soon at first, then every 2 s.
pub fn next_step_after(
    started: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> std::time::Duration {
    if now - started < chrono::Duration::seconds(10) {
        std::time::Duration::from_millis(500)
    } else {
        std::time::Duration::from_secs(2)
    }
}

/// One drain step on `node_name`: cordon (once) and evict what can be evicted.
/// A node that no longer exists has nothing left to drain.
pub async fn drain_step(ctx: &Context, node_name: &str) -> Result<DrainProgress> {
    drain_step_within(ctx, node_name, None).await
}

/// Pure: the grace period to evict `pod` with so it ends within `max_grace`
/// seconds (None: the pod's own).
pub fn grace_for(pod: &Pod, max_grace: Option<i64>) -> Option<i64> {
    let max = max_grace?.max(0);
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Some(own.min(max))
}

/// The pods a drain of `node_name` still has to move (evictable, or
/// terminating), as namespace/name.
pub async fn pods_to_move(ctx: &Context, node_name: &str) -> Result<Vec<String>> {
    Ok(pods_on(ctx, node_name)
        .await?
        .iter()
        .filter(|p| !matches!(classify(p), PodAction::Skip(_)))
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect())
}

async fn pods_on(ctx: &Context, node_name: &str) -> Result<Vec<Pod>> {
    list_pods_on(ctx, node_name, ListParams::default()).await
}

/// The pods on `node_name` as a drain step needs them: from the apiserver's
/// watch cache while some are left (a poll every half second of many drains
/// at once would otherwise read etcd for each: a burst of 150 interruptions
/// saturated the apiserver), confirmed by a consistent read once that says
/// none is, so a drain never ends on a stale answer.
async fn pods_for_step(ctx: &Context, node_name: &str) -> Result<Vec<Pod>> {
    let cached = cached_pods_on(ctx, node_name).await?;
    if cached
        .iter()
        .all(|p| matches!(classify(p), PodAction::Skip(_)))
    {
        return pods_on(ctx, node_name).await;
    }
    Ok(cached)
}

/// The pods on `node_name`, from the apiserver's watch cache.
pub async fn cached_pods_on(ctx: &Context, node_name: &str) -> Result<Vec<Pod>> {
    list_pods_on(ctx, node_name, ListParams::default().match_any()).await
}

async fn list_pods_on(ctx: &Context, node_name: &str, params: ListParams) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    Ok(pods
        .list(&params.fields(&format!("spec.nodeName={node_name}")))
        .await
        .map_err(Error::kube(format!("list pods on node {node_name}")))?
        .items)
}

/// [`drain_step`] with every eviction's grace period capped at `max_grace`
/// seconds (an interrupted node's deadline).
pub async fn drain_step_within(
    ctx: &Context,
    node_name: &str,
    max_grace: Option<i64>,
) -> Result<DrainProgress> {
    if !cordon(ctx, node_name).await? {
        return Ok(DrainProgress::default());
    }
    let mut progress = DrainProgress::default();
    let pods = pods_for_step(ctx, node_name).await?;
    let own_step = own_pod_step(ctx, node_name, &pods).await?;
    for pod in &pods {
        let namespace = pod.namespace().unwrap_or_default();
        let id = format!("{namespace}/{}", pod.name_any());
        let ours = ctx.settings.own_pod.as_ref().is_some_and(|o| o.is(pod));
        match own_step {
            OwnStep::Hold if ours => {
                progress.held.push(id);
                continue;
            }
            OwnStep::Stay if ours => {
                progress.staying.push(id);
                continue;
            }
            _ => {}
        }
        match classify(pod) {
            PodAction::Skip(_) => {}
            PodAction::Wait => progress.waiting.push(id),
            PodAction::Evict => {
                let api: Api<Pod> = Api::namespaced(ctx.eviction_client.clone(), &namespace);
                let name = pod.name_any();
                let grace = grace_for(pod, max_grace);
                let outcome = ctx
                    .mutations
                    .perform(
                        Intent::kube(
                            "evict_pod",
                            format!("pod/{id}"),
                            format!("drain of node {node_name}"),
                        ),
                        || async {
                            let evicted = crate::k8s::eviction::evict(
                                &api,
                                &namespace,
                                &name,
                                grace,
                                &ctx.eviction_legacy,
                            );
                            match evicted.await {
                                Ok(_) => Ok(Evicted::Yes),
                                Err(kube::Error::Api(s)) if s.code == 429 => {
                                    Ok(match budget_refusal(&s) {
                                        Some(budget) => Evicted::BlockedByBudget(budget),
                                        None => Evicted::Throttled,
                                    })
                                }
                                Err(kube::Error::Api(s)) if s.code == 404 => Ok(Evicted::Gone),
                                Err(e) => Err(Error::kube(format!("evict pod {id}"))(e)),
                            }
                        },
                    )
                    .await?;
                match outcome {
                    Applied::Performed(Evicted::Yes) => progress.evicted.push(id),
                    Applied::Performed(Evicted::BlockedByBudget(budget)) => {
                        ctx.metrics.drain("blocked_by_pdb");
                        progress.blocked.push(id);
                        if !progress.budgets.contains(&budget) {
                            progress.budgets.push(budget);
                        }
                    }
                    Applied::Performed(Evicted::Throttled) => {
                        ctx.metrics.drain("throttled");
                        progress.throttled.push(id)
                    }
                    Applied::Performed(Evicted::Gone) => {}
                    Applied::DryRun => progress.dry_run.push(id),
                }
            }
        }
    }
    Ok(progress)
}

/// What a drain step does with our own pod (see `k8s::own_pod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnStep {
    /// Like any other pod (not here, a dry run, or its turn to be evicted).
    Move,
    /// Left for now: other pods are still to move, or leadership is being
    /// handed to a standby (we stop leading at once; the standby evicts it).
    Hold,
    /// Left for good: no other node could run it.
    Stay,
}

/// What this drain step does with our own pod: held while other pods are
/// still to move, and, once ours is the last, while leadership is handed
/// to a standby; left on the node when no other node could run a replica
/// (evicted, it would wait Pending and nobody would finish the drain).
/// Dry runs evict nothing, and leading again on the node we handed over
/// from means no standby took over: then ours is evicted like any.
async fn own_pod_step(ctx: &Context, node: &str, pods: &[Pod]) -> Result<OwnStep> {
    let Some(own) = ctx
        .settings
        .own_pod
        .as_ref()
        .filter(|_| !ctx.settings.dry_run)
    else {
        return Ok(OwnStep::Move);
    };
    let to_move = |p: &Pod| !matches!(classify(p), PodAction::Skip(_));
    match own_pod::turn(pods, own, to_move) {
        own_pod::Turn::NotHere => return Ok(OwnStep::Move),
        own_pod::Turn::Last => return Ok(OwnStep::Hold),
        own_pod::Turn::Alone => {}
    }
    let Some(ours) = pods.iter().find(|p| own.is(p)) else {
        return Ok(OwnStep::Move);
    };
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list Nodes for the manager's own pod"))?
        .items;
    if !own_pod::room_elsewhere(&nodes, ours, node) {
        stays(ctx, node, own).await;
        return Ok(OwnStep::Stay);
    }
    let handed_over_here = ctx.handed_over_on().as_deref() == Some(node);
    if handed_over_here || !ctx.leadership.elected_by_lease() {
        return Ok(OwnStep::Move);
    }
    let Some(selector) = own_pod::replica_selector(ours) else {
        return Ok(OwnStep::Move);
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &own.namespace);
    let replicas = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(crate::Error::kube(format!(
            "list the manager's replicas in {}",
            own.namespace
        )))?
        .items;
    let Some(standby) = own_pod::standby(&replicas, own, node).map(|p| p.name_any()) else {
        return Ok(OwnStep::Move);
    };
    let note = format!(
        "the manager's own pod {}/{} is the last pod to move off {node}: leadership goes to {standby}, which evicts it",
        own.namespace, own.name
    );
    info!(node, standby = %standby, "handing leadership over before our own pod is evicted");
    ctx.event(
        &node_ref(node),
        EventType::Normal,
        Reason::LeadershipHandedOver,
        "Drain",
        note,
    )
    .await;
    ctx.set_handed_over_on(node);
    ctx.leadership.hand_over();
    Ok(OwnStep::Hold)
}

/// Says that our pod stays on `node` to go with it (the drain's last
/// step; a repeat is counted on the same Event).
async fn stays(ctx: &Context, node: &str, own: &own_pod::OwnPod) {
    let note = format!(
        "the manager's own pod {}/{} is the last pod on {node} and no other node could run it: it stays and goes with the instance; the next pod resumes from status once the replacement has joined",
        own.namespace, own.name
    );
    info!(
        node,
        "our own pod stays on the node it drains: nowhere else to run"
    );
    ctx.event(
        &node_ref(node),
        EventType::Normal,
        Reason::OwnPodStays,
        "Drain",
        note,
    )
    .await;
}

enum Evicted {
    Yes,
    /// What the budget said ("The disruption budget web needs 6 healthy pods
    /// and has 6 currently").
    BlockedByBudget(String),
    Throttled,
    Gone,
}

/// Pure: whether a 429 from the Eviction API is a PodDisruptionBudget's
/// refusal, and what it said. The apiserver names the budget in a cause of
/// reason `DisruptionBudget`; a 429 without one is load shedding.
pub fn budget_refusal(status: &kube::core::Status) -> Option<String> {
    let cause = status
        .details
        .as_ref()
        .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"));
    match cause {
        Some(c) if !c.message.is_empty() => Some(c.message.clone()),
        Some(_) => Some(status.message.clone()),
        None if status.message.contains("disruption budget") => Some(status.message.clone()),
        None => None,
    }
}

/// Pure: the patch that cordons a node and says we did.
pub fn cordon_patch(why: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"annotations": {CORDONED_BY_US: why}},
        "spec": {"unschedulable": true},
    })
}

/// Pure: the patch that lifts our cordon.
pub fn uncordon_patch() -> serde_json::Value {
    serde_json::json!({
        "metadata": {"annotations": {CORDONED_BY_US: null}},
        "spec": {"unschedulable": false},
    })
}

/// Cordons the node once; false when the node does not exist. A node
/// cordoned already (by anyone) is left as it is, unmarked.
async fn cordon(ctx: &Context, node_name: &str) -> Result<bool> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    // From the watch cache, as every step asks: a stale "not cordoned" only
    // cordons again (idempotent). A node gone has no pods left either, but
    // "gone" ends the drain, so the cache's 404 (it may lag a new Node) is
    // confirmed by a consistent read.
    let node = match nodes
        .get_with(node_name, &kube::api::GetParams::any())
        .await
    {
        Ok(node) => node,
        Err(kube::Error::Api(s)) if s.code == 404 => match nodes
            .get_opt(node_name)
            .await
            .map_err(Error::kube(format!("get node {node_name}")))?
        {
            Some(node) => node,
            None => return Ok(false),
        },
        Err(e) => return Err(Error::kube(format!("get node {node_name}"))(e)),
    };
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        return Ok(true);
    }
    let patch = cordon_patch("drain");
    ctx.mutations
        .perform(
            Intent::kube("cordon_node", format!("node/{node_name}"), "drain"),
            || async {
                nodes
                    .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(Error::kube(format!("cordon node {node_name}")))
            },
        )
        .await?;
    Ok(true)
}

/// A drain Event on the group and on the Node (the latter best effort: some
/// apiservers reject Events on cluster-scoped objects).
pub async fn drain_event(
    ctx: &Context,
    group: &ObjectReference,
    node: &str,
    type_: EventType,
    reason: Reason,
    action: &str,
    note: String,
) {
    let on_node = node_ref(node);
    ctx.event_related(group, Some(&on_node), type_, reason, action, note.clone())
        .await;
    ctx.event(&on_node, type_, reason, action, note).await;
}

/// What an Event on the Node `name` names.
pub fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// Pure: whether giving up a drain may put `node` back in service: it is
/// cordoned by us (someone else's cordon is theirs to lift), and not because
/// it is about to be lost (an interruption notice recorded on it must keep
/// it out of service).
pub fn may_uncordon(node: &Node) -> bool {
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let ours = node.annotations().contains_key(CORDONED_BY_US);
    cordoned
        && ours
        && crate::k8s::interruption_record::record_of(node).is_none_or(|r| !r.is_loss())
}

/// Puts a node back in service after a drain was given up. A node that no
/// longer exists needs nothing.
pub async fn uncordon(ctx: &Context, node: &str, why: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let Some(current) = nodes
        .get_opt(node)
        .await
        .map_err(Error::kube(format!("get node {node}")))?
    else {
        return Ok(());
    };
    if !may_uncordon(&current) {
        return Ok(());
    }
    let patch = uncordon_patch();
    ctx.mutations
        .perform(
            Intent::kube("uncordon_node", format!("node/{node}"), why.to_string()),
            || async {
                nodes
                    .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(Error::kube(format!("uncordon node {node}")))
            },
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A Node the watch cache has not seen yet is not gone: a drain that
    /// ended on the cache's 404 would report nothing left on a node whose
    /// pods still run.
    #[tokio::test]
    async fn a_node_the_watch_cache_has_not_seen_yet_is_drained_not_taken_for_gone() {
        use crate::controllers::mock_api::MockApi;
        let node = serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1"}, "spec": {"unschedulable": true}});
        let leaving = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "ns",
                         "deletionTimestamp": "2026-11-27T00:00:00Z"},
            "spec": {"nodeName": "n1", "containers": []}});
        let pods = serde_json::json!({"apiVersion": "v1", "kind": "PodList",
            "metadata": {}, "items": [leaving]});
        let (ctx, _) = MockApi::new(&crate::cloud::fake::FakeCloud::new(), &[])
            .serve("/api/v1/nodes/n1".into(), &node)
            .lagging("/api/v1/nodes/n1".into())
            .serve("/api/v1/pods".into(), &pods)
            .start()
            .await;
        let step = drain_step(&ctx, "n1").await.expect("drain step");
        assert_eq!(step.waiting, vec!["ns/web".to_string()]);
        assert!(!step.done());
    }

    #[test]
    fn ordinary_pods_are_evicted() {
        assert_eq!(classify(&pod()), PodAction::Evict);
    }

    #[test]
    fn daemonset_mirror_and_finished_pods_are_skipped() {
        let mut ds = pod();
        ds.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            name: "fluentd".into(),
            api_version: "apps/v1".into(),
            uid: "u".into(),
            ..Default::default()
        }]);
        assert_eq!(classify(&ds), PodAction::Skip("DaemonSet pod"));
        let mut mirror = pod();
        mirror.metadata.annotations =
            Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into());
        assert_eq!(classify(&mirror), PodAction::Skip("mirror pod"));
        let mut done = pod();
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert_eq!(classify(&done), PodAction::Skip("finished pod"));
    }

    #[test]
    fn terminating_pods_are_waited_for_not_evicted_again() {
        let mut p = pod();
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(classify(&p), PodAction::Wait);
    }

    #[test]
    fn progress_is_done_only_when_nothing_is_left() {
        assert!(DrainProgress::default().done());
        let blocked = DrainProgress {
            blocked: vec!["ns/p".into()],
            ..Default::default()
        };
        assert!(!blocked.done());
        // The manager's own pod, left for last, is still to move.
        let held = DrainProgress {
            held: vec!["spot-node-manager/snm-a".into()],
            ..Default::default()
        };
        assert!(!held.done() && !held.deletions_asked());
        // Staying (nowhere else to run), it goes with the instance.
        let staying = DrainProgress {
            staying: vec!["spot-node-manager/snm-a".into()],
            ..Default::default()
        };
        assert!(staying.done() && staying.deletions_asked());
    }

    #[test]
    fn a_budgets_refusal_is_told_from_load_shedding() {
        let refusal: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 429, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget web needs 6 healthy pods and has 6 currently"}]}
        }))
        .expect("status");
        assert_eq!(
            budget_refusal(&refusal).as_deref(),
            Some("The disruption budget web needs 6 healthy pods and has 6 currently")
        );
        let throttled: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 429, "reason": "TooManyRequests",
            "message": "Too many requests, please try again later.",
            "details": {"retryAfterSeconds": 1}
        }))
        .expect("status");
        assert_eq!(budget_refusal(&throttled), None);
    }

    /// A node as it is after `patch` (spec.unschedulable and annotations).
    fn patched(mut node: Node, patch: &serde_json::Value) -> Node {
        if let Some(u) = patch["spec"]["unschedulable"].as_bool() {
            node.spec.get_or_insert_with(Default::default).unschedulable = Some(u);
        }
        if let Some(a) = patch["metadata"]["annotations"].as_object() {
            let annotations = node
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            for (k, v) in a {
                match v.as_str() {
                    Some(v) => annotations.insert(k.clone(), v.to_string()),
                    None => annotations.remove(k),
                };
            }
        }
        node
    }

    #[test]
    fn only_our_own_cordon_is_lifted() {
        // Cordoned by an operator (maintenance): never ours to lift.
        let theirs = Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!may_uncordon(&theirs));
        // Cordoned by our drain: lifted, and the lift removes our mark.
        let ours = patched(Node::default(), &cordon_patch("drain"));
        assert_eq!(ours.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        assert!(may_uncordon(&ours));
        let lifted = patched(ours, &uncordon_patch());
        assert_eq!(
            lifted.spec.as_ref().and_then(|s| s.unschedulable),
            Some(false)
        );
        assert!(!lifted.annotations().contains_key(CORDONED_BY_US));
        assert!(!may_uncordon(&lifted), "nothing left to undo");
    }

    #[test]
    fn a_node_with_an_interruption_notice_is_never_uncordoned() {
        let mut node = patched(Node::default(), &cordon_patch("drain"));
        assert!(may_uncordon(&node));
        let record = crate::k8s::interruption_record::Record {
            kind: "spot_interruption".into(),
            instance_id: "i-1".into(),
            noticed: chrono::DateTime::UNIX_EPOCH,
            deadline: chrono::DateTime::UNIX_EPOCH,
            group: None,
            drained: None,
            pods_left: None,
            loss_at: None,
            drain_from: None,
            late: None,
            lifecycle: None,
            scope: None,
        };
        node.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                crate::crd::labels::INTERRUPTION_ANNOTATION.to_string(),
                serde_json::to_string(&record).expect("record"),
            );
        assert!(!may_uncordon(&node));
        node.spec = None;
        assert!(!may_uncordon(&node), "not cordoned: nothing to undo");
    }

    #[test]
    fn grace_periods_are_shortened_to_the_time_left_never_lengthened() {
        let mut p = pod();
        assert_eq!(grace_for(&p, None), None, "the pod's own");
        assert_eq!(grace_for(&p, Some(80)), Some(30), "the default 30 s fits");
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            termination_grace_period_seconds: Some(600),
            ..Default::default()
        });
        assert_eq!(grace_for(&p, Some(80)), Some(80));
        assert_eq!(grace_for(&p, Some(-3)), Some(0));
    }
}
