//! What the inventory watches, and what wakes a group: NodeGroups, their
//! child resources, and Nodes (only when something the inventory reads of
//! them changed, so kubelet heartbeats cost no AWS call).

use super::controller::{CONTROLLER, InventoryContext, error_policy, reconcile};
use super::instance_facts::InstanceFacts;
use super::plan;
use super::validation::asg_conflicts;
use crate::context::Context;
use crate::crd::NodeGroup;
use crate::crd::condition::SPEC_VALID;
use crate::crd::nodegroup::ASG_CONFLICT as CONFLICT;
use crate::k8s::node::{NodeView, SlimNode, role_matches};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// Nodes per page of the initial list (and of every relist).
const NODE_PAGE: u32 = 50;

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let ctx_resync = ctx.settings.resync_interval;
    let groups: Api<NodeGroup> = match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let (nodes, node_writer) = reflector::store::<SlimNode>();
    let (ready_tx, nodes_ready) = tokio::sync::watch::channel(false);
    let node_changes = relevant_node_changes(
        watcher(
            // Decoded slim: only what the inventory reads is ever held.
            Api::<SlimNode>::all(ctx.client.clone()),
            // Small pages: a page's JSON is held whole while it is decoded;
            // at 500 (the default) that is megabytes.
            watcher::Config::default()
                .any_semantic()
                .page_size(NODE_PAGE),
        )
        .default_backoff()
        .reflect(node_writer),
        ready_tx,
    );
    let controller = Controller::new(groups, watcher::Config::default().any_semantic());
    let group_store = controller.store();
    let all_groups = group_store.clone();
    let conflict_store = group_store.clone();
    info!(controller = CONTROLLER, "controller started");
    controller
        .watches_stream(node_changes, move |node| {
            groups_of_node(&group_store, &node)
        })
        // A group's ASGs changed: the others sharing one (or reporting a
        // conflict that may be gone now) are validated again.
        .watches(
            groups_api_of(&ctx),
            watcher::Config::default().any_semantic(),
            move |changed: NodeGroup| related_groups(&conflict_store, &changed),
        )
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(
            reconcile,
            error_policy,
            Arc::new(InventoryContext {
                ctx,
                nodes,
                groups: all_groups,
                nodes_ready,
                facts: InstanceFacts::for_resync(ctx_resync),
                handlers: Default::default(),
                autoscalers: Default::default(),
                node_pools: Default::default(),
                hooks: Default::default(),
                warm_pools: Default::default(),
                prices: Default::default(),
            }),
        )
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(controller = CONTROLLER, object = %obj, "reconciled"),
                Err(e) => debug!(controller = CONTROLLER, error = %e, "reconcile failed"),
            }
        })
        .await;
    info!(controller = CONTROLLER, "controller stopped");
}

/// What about a Node matters to the inventory. Kubelet heartbeats change
/// none of it, so they never trigger a sync (and its AWS calls).
fn node_fingerprint(node: &(impl NodeView + ?Sized)) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (k, v) in node.node_labels().pairs() {
        (k, v).hash(&mut h);
    }
    node.provider_id().hash(&mut h);
    node.cordoned().hash(&mut h);
    node.ready().hash(&mut h);
    node.being_deleted().hash(&mut h);
    // kops's mark of a node to update: the node is drifted.
    node.annotation(crate::crd::labels::NEEDS_UPDATE_ANNOTATION)
        .is_some()
        .hash(&mut h);
    // An interruption notice and its drain's end drive the replenisher
    // through the group's status: the fields the status copies, and no more
    // (a lifecycle action's heartbeat is no reason to describe AWS again).
    crate::k8s::interruption_record::record_of(node)
        .map(|r| {
            let (kind, id, noticed, deadline) = (r.kind, r.instance_id, r.noticed, r.deadline);
            (kind, id, noticed, deadline, r.loss_at, r.late, r.drained)
        })
        .hash(&mut h);
    h.finish()
}

/// Passes a Node on only when its fingerprint changed, and always on delete.
/// Signals `ready` once the initial list is in the (already reflected) store.
fn relevant_node_changes(
    events: impl futures::Stream<Item = Result<watcher::Event<SlimNode>, watcher::Error>>
    + Send
    + 'static,
    ready: tokio::sync::watch::Sender<bool>,
) -> impl futures::Stream<Item = Result<SlimNode, watcher::Error>> + Send + 'static {
    let seen: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let ready = Arc::new(ready);
    events.filter_map(move |event| {
        let seen = seen.clone();
        let ready = ready.clone();
        async move {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                ready.send_replace(true);
                // The list's pages and the cache it replaced are free now.
                crate::heap_trim::release_freed();
            }
            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            match event {
                Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                    let fingerprint = node_fingerprint(&node);
                    (seen.insert(node.name_any(), fingerprint) != Some(fingerprint))
                        .then_some(Ok(node))
                }
                Ok(watcher::Event::Delete(node)) => {
                    seen.remove(&node.name_any());
                    Some(Ok(node))
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                Err(e) => Some(Err(e)),
            }
        }
    })
}

/// The groups a Node change wakes: see [`groups_to_wake`].
fn groups_of_node(groups: &Store<NodeGroup>, node: &SlimNode) -> Vec<ObjectRef<NodeGroup>> {
    groups_to_wake(&groups.state(), node)
}

/// The groups that list the Node (by name and instance: kops names Nodes
/// after their private IP, which a later instance may get); while none
/// does, those whose selector (or role, for the default selector) matches
/// it: it may be a new member. A Node another group lists is that group's,
/// and its changes (a refresh cordoning, draining, replacing) do not wake
/// every other group, whose looks would each cost an ASG description.
fn groups_to_wake(groups: &[Arc<NodeGroup>], node: &impl NodeView) -> Vec<ObjectRef<NodeGroup>> {
    let name = node.node_name();
    let instance = node.instance_id();
    let lists = |g: &NodeGroup| {
        g.status.as_ref().is_some_and(|s| {
            s.nodes
                .iter()
                .any(|n| n.name == name && (n.instance_id.is_none() || n.instance_id == instance))
        })
    };
    let matches = |g: &NodeGroup| match &g.spec.node_selector {
        Some(selector) => plan::selector_matches(selector, node.node_labels()),
        None => role_matches(g.spec.role, node.node_labels()),
    };
    let listing: Vec<&Arc<NodeGroup>> = groups.iter().filter(|g| lists(g)).collect();
    let woken = match listing.is_empty() {
        true => groups.iter().filter(|g| matches(g)).collect(),
        false => listing,
    };
    woken
        .into_iter()
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

/// The NodeGroups this manager watches.
fn groups_api_of(ctx: &Context) -> Api<NodeGroup> {
    match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    }
}

/// The other groups to validate again when `changed` changes: those naming
/// one of its ASGs, and those reporting a conflict (it may be resolved).
fn related_groups(store: &Store<NodeGroup>, changed: &NodeGroup) -> Vec<ObjectRef<NodeGroup>> {
    let key = |g: &NodeGroup| (g.namespace(), g.name_any());
    store
        .state()
        .iter()
        .filter(|g| key(g) != key(changed))
        .filter(|g| {
            !asg_conflicts(g, [changed]).is_empty()
                || g.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == SPEC_VALID && c.reason == CONFLICT)
                })
        })
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::inventory::plan::AwsView;
    use crate::controllers::inventory::plan::tests::{group, node, t0};
    use crate::crd::NodeGroupStatus;
    use crate::crd::labels::INTERRUPTION_ANNOTATION;
    use chrono::Utc;
    use k8s_openapi::api::core::v1::Node;

    #[test]
    fn a_slim_node_reads_the_same_to_the_inventory_at_a_fraction_of_the_size() {
        let json = include_str!("fixtures/kops-node.json");
        let full: Node = serde_json::from_str(json).expect("fixture");
        let slim: SlimNode = serde_json::from_str(json).expect("fixture, slim");
        assert_eq!(node_fingerprint(&slim), node_fingerprint(&full));
        assert!(
            slim.node_labels().pairs().eq(full.node_labels().pairs()),
            "the same labels"
        );
        assert_eq!(slim.instance_id(), full.instance_id());
        assert!(slim.ready() && slim.cordoned());
        assert!(crate::k8s::interruption_record::record_of(&slim).is_some());
        // What the group's status says of it is the same.
        let ig = "nodes-ap-northeast-1a";
        let g = group(&[ig], 1);
        let view = AwsView {
            asgs: vec![crate::controllers::inventory::plan::tests::asg(
                ig,
                ig,
                "ap-northeast-1a",
                &["i-0a1b2c3d4e5f60718"],
                1,
            )],
            instances: vec![],
            templates: vec![],
            drift_unknown: None,
        };
        let status = |n: &dyn Fn() -> NodeGroupStatus| n();
        let of_full = status(&|| {
            plan::inventory_status(
                &g,
                std::slice::from_ref(&full),
                &view,
                &Default::default(),
                t0(),
            )
        });
        let of_slim = status(&|| {
            plan::inventory_status(
                &g,
                std::slice::from_ref(&slim),
                &view,
                &Default::default(),
                t0(),
            )
        });
        assert_eq!(of_slim, of_full);
        assert_eq!(of_full.nodes.len(), 1, "the fixture is a member");
    }

    #[test]
    fn a_node_another_group_lists_wakes_that_group_only_and_a_new_one_every_match() {
        let named = |name: &str, ig: &str| {
            let mut g = group(&[ig], 1);
            g.metadata.name = Some(name.into());
            g.metadata.namespace = Some("ns".into());
            g
        };
        let listing = |mut g: NodeGroup, node: &str, instance: &str| {
            g.status = Some(NodeGroupStatus {
                nodes: vec![
                    serde_json::from_value(serde_json::json!({
                        "name": node, "instanceId": instance, "ready": true, "unschedulable": false
                    }))
                    .expect("a node entry"),
                ],
                ..Default::default()
            });
            Arc::new(g)
        };
        let n1 = node("n1", "nodes-a", "zone-a", "i-1", true);
        let names = |woken: Vec<ObjectRef<NodeGroup>>| {
            let mut names: Vec<String> = woken.into_iter().map(|r| r.name).collect();
            names.sort();
            names
        };
        // Both worker groups match every worker Node by role.
        let a = listing(named("a", "nodes-a"), "n1", "i-1");
        let b = listing(named("b", "nodes-b"), "n2", "i-2");
        assert_eq!(names(groups_to_wake(&[a.clone(), b.clone()], &n1)), ["a"]);
        // Listed by nobody: it may be anyone's new member.
        let n3 = node("n3", "nodes-b", "zone-b", "i-3", true);
        assert_eq!(
            names(groups_to_wake(&[a.clone(), b.clone()], &n3)),
            ["a", "b"]
        );
        // The name reused by a later instance: not a's any more.
        let reused = node("n1", "nodes-b", "zone-b", "i-9", true);
        assert_eq!(names(groups_to_wake(&[a, b], &reused)), ["a", "b"]);
    }

    #[test]
    fn heartbeats_do_not_change_the_fingerprint_but_readiness_and_cordons_do() {
        let n = node("n1", "nodes-a", "zone-a", "i-1", true);
        let mut heartbeat = n.clone();
        heartbeat
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        heartbeat.metadata.resource_version = Some("999".into());
        assert_eq!(node_fingerprint(&n), node_fingerprint(&heartbeat));
        let not_ready = node("n1", "nodes-a", "zone-a", "i-1", false);
        assert_ne!(node_fingerprint(&n), node_fingerprint(&not_ready));
        let mut cordoned = n.clone();
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_ne!(node_fingerprint(&n), node_fingerprint(&cordoned));
        let mut marked = n.clone();
        marked.metadata.annotations = Some(
            [(
                crate::crd::labels::NEEDS_UPDATE_ANNOTATION.to_string(),
                String::new(),
            )]
            .into(),
        );
        assert_ne!(node_fingerprint(&n), node_fingerprint(&marked));
    }

    #[test]
    fn a_drains_end_changes_the_fingerprint_a_lifecycle_heartbeat_does_not() {
        use crate::k8s::interruption_record::{HookAction, Record};
        use chrono::TimeZone;
        let t0 = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let with = |r: &Record| {
            let mut n = node("n1", "nodes-a", "zone-a", "i-1", true);
            n.metadata.annotations = Some(
                [(
                    INTERRUPTION_ANNOTATION.to_string(),
                    serde_json::to_string(r).expect("json"),
                )]
                .into(),
            );
            n
        };
        let record = Record {
            kind: "terminate_lifecycle_action".into(),
            instance_id: "i-1".into(),
            noticed: t0,
            deadline: t0 + chrono::Duration::seconds(90),
            group: None,
            drained: None,
            pods_left: None,
            loss_at: None,
            drain_from: None,
            late: None,
            scope: None,
            lifecycle: Some(HookAction {
                auto_scaling_group: "nodes-a".into(),
                hook: "h".into(),
                token: "t".into(),
                region: None,
                heartbeat: None,
                completed: None,
            }),
        };
        let plain = node("n1", "nodes-a", "zone-a", "i-1", true);
        assert_ne!(node_fingerprint(&plain), node_fingerprint(&with(&record)));
        let mut beat = record.clone();
        if let Some(a) = beat.lifecycle.as_mut() {
            a.heartbeat = Some(t0 + chrono::Duration::seconds(15));
        }
        assert_eq!(
            node_fingerprint(&with(&record)),
            node_fingerprint(&with(&beat))
        );
        let drained = Record {
            drained: Some(t0 + chrono::Duration::seconds(30)),
            ..record.clone()
        };
        assert_ne!(
            node_fingerprint(&with(&record)),
            node_fingerprint(&with(&drained))
        );
    }
}
