//! Drift detection end to end (issue 26, part 1): the rude emulator records
//! the launch template version each instance was launched from, as AWS
//! does; `kops update cluster` (a new version of every instance group's
//! template) makes the running nodes drifted. Here the groups only report
//! it (`drift.action` `Report`, the default), and a `kops rolling-update`
//! runs beside the manager; drift rolls (`Replace`) are in drift_roll.rs.

use snm_testkit as support;

use kube::api::Api;
use spot_node_manager::crd::NodeGroup;
use spot_node_manager::crd::nodegroup::NodeGroupStatus;
use std::collections::BTreeSet;
use std::time::Duration;
use support::kops_rolling::{KopsSurge, RollingUpdate};
use support::{World, ZONES, assert_eventually};

const WAIT: Duration = Duration::from_secs(120);
const FAST: Duration = Duration::from_millis(300);

fn workers(asgs: &[String]) -> NodeGroup {
    support::refresh::workers_joining_within(asgs, asgs.len() as i32, "15m")
}

/// (ASG, desired, instances) of each ASG: the layout.
async fn layout_of(world: &World, asgs: &[String]) -> Vec<(String, i32, usize)> {
    world
        .asg_snapshot(asgs)
        .await
        .into_iter()
        .map(|(asg, desired, ids)| (asg, desired, ids.len()))
        .collect()
}

struct Started {
    world: World,
    kops: support::KopsGroup,
    groups: Api<NodeGroup>,
    manager: support::ManagerProcess,
    _config: tempfile::NamedTempFile,
    _sim: support::SimGuard,
}

/// One worker per zone, the simulated kubelet and the manager running,
/// 3 Ready and none drifted.
async fn started(test: &str) -> Started {
    let world = World::new(test).await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let sim = world.start_sim(FAST, FAST);
    let groups: Api<NodeGroup> = world.api();
    world.create_group(&workers(&kops.asgs)).await;
    let (manager, config) = world.start_manager(&[]);
    let started = Started {
        world,
        kops,
        groups,
        manager,
        _config: config,
        _sim: sim,
    };
    started
        .status_where("3 Ready, none drifted", |s| {
            s.ready_nodes == Some(3) && s.drifted_nodes == Some(0)
        })
        .await;
    started
}

/// What a test compares with after kops's update.
struct Before {
    instances: BTreeSet<String>,
    layout: Vec<(String, i32, usize)>,
    performed: f64,
}

type Sampled = std::sync::Arc<std::sync::Mutex<BTreeSet<String>>>;

impl Started {
    async fn status_where(
        &self,
        what: &str,
        holds: impl Fn(&NodeGroupStatus) -> bool,
    ) -> NodeGroupStatus {
        assert_eventually(what, WAIT, || async {
            let status = self.groups.get("workers").await.ok()?.status?;
            holds(&status).then_some(status)
        })
        .await
    }

    /// The group before `kops update cluster`, then the update: every node
    /// drifted.
    async fn kops_updated(&self) -> Before {
        let before = Before {
            instances: self.instances().await,
            layout: layout_of(&self.world, &self.kops.asgs).await,
            performed: aws_mutations(&self.manager.assert_metrics().await),
        };
        self.world.kops_update_cluster(&self.kops).await;
        self.status_where("3 drifted", |st| st.drifted_nodes == Some(3))
            .await;
        before
    }

    /// Samples the group's status every 250 ms until aborted: what `seen`
    /// picks out of each, gathered.
    fn sample(
        &self,
        seen: impl Fn(&NodeGroupStatus) -> Vec<String> + Send + 'static,
    ) -> (tokio::task::JoinHandle<()>, Sampled) {
        let gathered = Sampled::default();
        let (groups, into) = (self.groups.clone(), gathered.clone());
        let task = tokio::spawn(async move {
            loop {
                if let Some(st) = groups.get("workers").await.ok().and_then(|g| g.status)
                    && let Ok(mut all) = into.lock()
                {
                    all.extend(seen(&st));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        (task, gathered)
    }

    /// Some resyncs after kops's update: the manager made no AWS mutation,
    /// the only new instances are kops's replacements, the layout is back.
    async fn only_kops_replaced(&self, before: &Before, update: &RollingUpdate) {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let metrics = self.manager.assert_metrics().await;
        assert_eq!(aws_mutations(&metrics), before.performed, "{metrics}");
        let now = self.instances().await;
        let new: BTreeSet<&String> = now.difference(&before.instances).collect();
        let replacements: BTreeSet<&String> = update.replaced.iter().map(|(_, n)| n).collect();
        assert_eq!(new, replacements, "no instance but kops's replacements");
        assert!(
            now.is_disjoint(&before.instances),
            "every old instance gone"
        );
        assert_eq!(layout_of(&self.world, &self.kops.asgs).await, before.layout);
    }

    async fn instances(&self) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        for asg in &self.kops.asgs {
            seen.extend(self.world.asg_instances(asg).await);
        }
        seen
    }

    async fn terminations(&self) -> usize {
        self.world.terminations_in(&self.kops.asgs).await
    }

    /// The DriftDetected Events: (message, published more than once).
    async fn drift_events(&self) -> Vec<(String, bool)> {
        let events: Api<k8s_openapi::api::events::v1::Event> = self.world.api();
        events
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("DriftDetected"))
            .map(|e| {
                let repeated = e.series.is_some() || e.deprecated_count.unwrap_or(1) > 1;
                (e.note.unwrap_or_default(), repeated)
            })
            .collect()
    }
}

#[tokio::test]
async fn after_kops_update_cluster_the_old_nodes_are_reported_drifted_and_nothing_is_replaced() {
    let s = started("drift-report").await;
    let before = s.instances().await;

    let versions = s.world.kops_update_cluster(&s.kops).await;
    assert_eq!(versions, [2, 2, 2]);
    let status = s
        .status_where("3 drifted", |s| s.drifted_nodes == Some(3))
        .await;
    for node in &status.nodes {
        let why = node.drifted.as_deref().unwrap_or_default();
        assert!(
            why.ends_with("version 1, its ASG launches version 2"),
            "{}: {why}",
            node.name
        );
    }
    let metrics = s.manager.assert_metrics().await;
    let series = format!(
        "spot_node_manager_group_drifted_nodes{{namespace=\"{}\",group=\"workers\"}}",
        s.world.namespace
    );
    assert_eq!(
        support::manager::metric(&metrics, &series),
        Some(3.0),
        "{metrics}"
    );

    // Told once, however many syncs see it (the test resyncs every 2 s).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let events = s.drift_events().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(!events[0].1, "published once: {events:?}");
    assert!(events[0].0.starts_with("3 nodes are drifted"), "{events:?}");
    // Reported, not replaced.
    assert_eq!(s.instances().await, before);
    assert_eq!(s.terminations().await, 0);

    // A node launched from now on is on the new version: a spot loss in
    // zone a, replaced by its ASG, leaves two drifted.
    let lost = s.world.asg_instances(&s.kops.asgs[0]).await.remove(0);
    s.world.lose_instance(&lost).await;
    let status = s
        .status_where("the replacement Ready, 2 drifted", |st| {
            st.ready_nodes == Some(3)
                && st.drifted_nodes == Some(2)
                && !st.nodes.iter().any(|n| n.name == lost)
        })
        .await;
    let fresh: Vec<_> = status
        .nodes
        .iter()
        .filter(|n| !before.contains(&n.name))
        .collect();
    assert_eq!(fresh.len(), 1, "{status:?}");
    assert_eq!(fresh[0].drifted, None, "launched from version 2");
}

#[tokio::test]
async fn a_node_marked_needs_update_by_kops_is_drifted_until_the_mark_goes() {
    let s = started("drift-needs-update").await;
    let before = s.instances().await;
    let marked = s.world.asg_instances(&s.kops.asgs[1]).await.remove(0);
    let annotate = |value| {
        s.world
            .annotate_node(&marked, "kops.k8s.io/needs-update", value)
    };
    annotate(Some("")).await;
    let status = s
        .status_where("the marked node drifted", |st| st.drifted_nodes == Some(1))
        .await;
    let node = status
        .nodes
        .iter()
        .find(|n| n.drifted.is_some())
        .expect("one");
    assert_eq!(node.name, marked);
    assert_eq!(
        node.drifted.as_deref(),
        Some("annotation kops.k8s.io/needs-update")
    );
    annotate(None).await;
    s.status_where("no node drifted", |st| st.drifted_nodes == Some(0))
        .await;
    assert_eq!(s.instances().await, before);
    assert_eq!(s.terminations().await, 0);
}

/// The test kit's `kops rolling-update` on its own (no manager): every old
/// instance detached once and terminated, the ASG's replacements on the new
/// template version, the layout as before. The scenario the manager must
/// not fight (issue 26, point 3).
#[tokio::test]
async fn the_kits_kops_rolling_update_replaces_every_node_as_kops_does() {
    use spot_node_manager::cloud::{Cloud, LaunchSource, aws::AwsCloud};
    let world = World::new("drift-kops-rolling").await;
    let kops = world.kops_group("nodes", &ZONES, 1, &[]).await;
    let _sim = world.start_sim(FAST, FAST);
    let ready = || async {
        let nodes = world.nodes().await?;
        let ready = nodes
            .iter()
            .filter(|n| spot_node_manager::k8s::node::is_ready(n))
            .count();
        (ready == 3).then_some(())
    };
    assert_eventually("3 Nodes Ready", WAIT, ready).await;
    let layout = layout_of(&world, &kops.asgs).await;
    world.kops_update_cluster(&kops).await;

    let update = world.kops_rolling_update(&kops, KopsSurge::Detach).await;
    assert_eq!(update.replaced.len(), 3, "{update:?}");
    let cloud = AwsCloud::new(world.aws.clone());
    let asgs = cloud.describe_groups(&kops.asgs).await.expect("describe");
    for (old, new) in &update.replaced {
        let asg = asgs
            .iter()
            .find(|a| a.instances.iter().any(|i| &i.instance_id == new))
            .expect("the replacement is in its ASG");
        assert!(!asg.instances.iter().any(|i| &i.instance_id == old));
        let detached = world
            .activities(&asg.name)
            .await
            .iter()
            .filter(|(_, d)| d == &format!("Detaching EC2 instance: {old}"))
            .count();
        assert_eq!(detached, 1, "{old} detached once from {}", asg.name);
        let launched = asg
            .instances
            .iter()
            .find(|i| &i.instance_id == new)
            .and_then(|i| i.launched_from.clone());
        assert!(
            matches!(&launched, Some(LaunchSource::Template { version: Some(v), .. }) if v == "2"),
            "{new}: {launched:?}"
        );
        let gone = cloud
            .describe_instances(std::slice::from_ref(old))
            .await
            .expect("describe");
        // Its one description: all() over none would pass.
        let [gone] = gone.as_slice() else {
            panic!("{old} described once: {gone:?}")
        };
        assert!(
            gone.state == "terminated" || gone.state == "shutting-down",
            "{old}: {gone:?}"
        );
    }
    let after = layout_of(&world, &kops.asgs).await;
    assert_eq!(after, layout, "the layout as before");
    assert_eventually("3 Nodes Ready again", WAIT, ready).await;
}

/// AWS mutations the manager performed, from its metrics.
fn aws_mutations(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("spot_node_manager_mutations_total{")
                && l.contains("target=\"aws\"")
                && l.contains("outcome=\"performed\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A worker group rolled by `kops rolling-update` while the manager runs:
/// the old node stays Ready until kops drains it, after its replacement
/// (maxSurge 1), so the group is never short and nothing is extra in any
/// ASG. The manager must make no AWS mutation, and the layout comes back
/// with exactly one new instance per old one.
#[tokio::test]
async fn a_kops_rolling_update_beside_the_manager_gets_no_aws_mutation_from_it() {
    let s = started("drift-kops-beside").await;
    let before = s.kops_updated().await;
    // While kops runs, no old node out of its ASG as the inventory itself
    // saw it (`autoScalingGroup` unset): a node kops detached (or
    // terminated) is not a member. (The inventory's description can be a
    // few seconds older than the Nodes, so a count alone may briefly
    // include one.)
    let (watch, outside) = s.sample(|st| {
        let out = st.nodes.iter().filter(|n| n.auto_scaling_group.is_none());
        out.map(|n| n.name.clone()).collect()
    });
    let update = s
        .world
        .kops_rolling_update(&s.kops, KopsSurge::Detach)
        .await;
    watch.abort();
    let outside = outside.lock().map(|o| o.clone()).unwrap_or_default();
    // (A replacement's Node can join before the description lists it.)
    let detached: BTreeSet<&String> = outside.intersection(&before.instances).collect();
    assert!(
        detached.is_empty(),
        "detached nodes reported as members: {detached:?}"
    );
    let status = s
        .status_where("3 Ready, none drifted", |st| {
            st.ready_nodes == Some(3) && st.drifted_nodes == Some(0)
        })
        .await;
    s.only_kops_replaced(&before, &update).await;
    assert_eq!(status.nodes.len(), 3);
}

/// kops rolling-update with maxSurge 0 (as for masters): each old node
/// drained and terminated first, its ASG replacing it. Zone a's
/// replacement takes longer than the launch grace (60 s), so a manager
/// answering the missing node would raise another ASG. While kops's taint is
/// on the group's nodes, the group says ExternalUpdate and the manager
/// makes no AWS mutation of its own; afterwards the layout is as before.
#[tokio::test]
async fn a_kops_rolling_update_that_terminates_first_is_not_answered_by_the_manager() {
    use spot_node_manager::crd::nodegroup::GroupState;
    let s = started("drift-kops-first").await;
    let before = s.instances().await;
    let layout = layout_of(&s.world, &s.kops.asgs).await;
    let performed = aws_mutations(&s.manager.assert_metrics().await);
    s.world
        .set_timing(&s.kops.asgs[0], "launch-lag", 70.0)
        .await;

    let watch = async {
        s.status_where("the group says ExternalUpdate", |st| {
            st.state == Some(GroupState::ExternalUpdate)
        })
        .await
    };
    let (update, seen) = tokio::join!(
        s.world
            .kops_rolling_update(&s.kops, KopsSurge::TerminateFirst),
        watch
    );
    assert!(
        seen.conditions
            .iter()
            .any(|c| c.type_ == "ExternalUpdate" && c.reason == "KopsRollingUpdate"),
        "{seen:?}"
    );
    support::cluster::assert_events(&s.world, &["KopsRollingUpdate"]).await;
    s.status_where("3 Ready, no external update", |st| {
        st.ready_nodes == Some(3) && st.state == Some(GroupState::Ready)
    })
    .await;
    let metrics = s.manager.assert_metrics().await;
    assert_eq!(aws_mutations(&metrics), performed, "{metrics}");
    let now = s.instances().await;
    let new: BTreeSet<&String> = now.difference(&before).collect();
    let replacements: BTreeSet<&String> = update.replaced.iter().map(|(_, n)| n).collect();
    assert_eq!(new, replacements, "no instance but the ASGs' replacements");
    let after = layout_of(&s.world, &s.kops.asgs).await;
    assert_eq!(after, layout);
}

/// Masters rolled by `kops rolling-update` (maxSurge 0, as kops does for
/// masters: each drained and terminated first, its ASG replacing it) beside
/// the manager: the group says ExternalUpdate, the manager makes no AWS
/// mutation of its own, and the layout comes back with one new master per
/// old one.
#[tokio::test]
async fn a_kops_rolling_update_of_the_masters_gets_no_aws_mutation_from_the_manager() {
    use spot_node_manager::crd::nodegroup::GroupState;
    use support::refresh::all_instances;
    use support::steady::SteadyGroup;
    let g = SteadyGroup::masters("drift-kops-masters").start().await;
    let before = all_instances(&g.world, &g.kops.asgs).await;
    let layout = layout_of(&g.world, &g.kops.asgs).await;
    let performed = aws_mutations(&g.manager.assert_metrics().await);
    g.world.kops_update_cluster(&g.kops).await;
    let masters = |what: &'static str, holds: fn(&NodeGroupStatus) -> bool| {
        let groups = g.groups.clone();
        async move {
            assert_eventually(what, WAIT, || async {
                let status = groups.get("masters").await.ok()?.status?;
                holds(&status).then_some(status)
            })
            .await
        }
    };
    masters("3 masters drifted", |s| s.drifted_nodes == Some(3)).await;
    let (update, seen) = tokio::join!(
        g.world
            .kops_rolling_update(&g.kops, KopsSurge::TerminateFirst),
        masters("the masters say ExternalUpdate", |s| {
            s.state == Some(GroupState::ExternalUpdate)
        })
    );
    assert!(
        seen.conditions.iter().any(|c| c.type_ == "ExternalUpdate"
            && c.status == spot_node_manager::crd::ConditionStatus::True),
        "{seen:?}"
    );
    masters("3 masters Ready, none drifted, no external update", |s| {
        s.ready_nodes == Some(3) && s.drifted_nodes == Some(0) && s.state == Some(GroupState::Ready)
    })
    .await;
    let metrics = g.manager.assert_metrics().await;
    assert_eq!(aws_mutations(&metrics), performed, "{metrics}");
    let now = all_instances(&g.world, &g.kops.asgs).await;
    let new: BTreeSet<&String> = now.difference(&before).collect();
    let replacements: BTreeSet<&String> = update.replaced.iter().map(|(_, n)| n).collect();
    assert_eq!(new, replacements, "no instance but the ASGs' replacements");
    assert!(now.is_disjoint(&before), "every old master gone");
    assert_eq!(layout_of(&g.world, &g.kops.asgs).await, layout);
}

#[tokio::test]
async fn without_describe_launch_templates_the_inventory_still_syncs_and_says_drift_is_unknown() {
    use spot_node_manager::crd::condition::{ConditionStatus, DRIFT_KNOWN, find};
    let s = started("drift-unknown").await;
    // The manager's IAM policy lacks ec2:DescribeLaunchTemplates; then
    // `kops update cluster` gives every template a new version.
    s.world.deny_aws_action("DescribeLaunchTemplates").await;
    s.world.kops_update_cluster(&s.kops).await;
    let status = s
        .status_where("DriftKnown False", |st| {
            find(&st.conditions, DRIFT_KNOWN).is_some_and(|c| c.status == ConditionStatus::False)
        })
        .await;
    let known = find(&status.conditions, DRIFT_KNOWN).expect("DriftKnown");
    assert_eq!(known.reason, "LaunchTemplatesUnreadable");
    assert!(
        known.message.contains("UnauthorizedOperation")
            && known.message.contains("ec2:DescribeLaunchTemplates"),
        "{}",
        known.message
    );
    assert_eq!(status.drifted_nodes, Some(0), "as last seen: none");
    // Everything else still syncs: a lost node leaves the status and its
    // replacement joins it.
    let lost = s.world.asg_instances(&s.kops.asgs[0]).await.remove(0);
    s.world.lose_instance(&lost).await;
    let status = s
        .status_where("the replacement Ready in the status", |st| {
            st.ready_nodes == Some(3) && !st.nodes.iter().any(|n| n.name == lost)
        })
        .await;
    assert!(
        find(&status.conditions, DRIFT_KNOWN).is_some_and(|c| c.status == ConditionStatus::False),
        "still unknown"
    );
    let synced = find(
        &status.conditions,
        spot_node_manager::crd::condition::INVENTORY_SYNCED,
    )
    .expect("InventorySynced");
    assert_eq!(synced.status, ConditionStatus::True, "{}", synced.message);
}

/// One NodeGroup over three kops instance groups, rolled by `kops
/// rolling-update` as kops rolls them: one instance group after another,
/// the cluster validated between two, when no node carries kops's taint.
/// The group is switched to `drift.action: Replace` once kops has begun.
/// The manager takes kops's update as running across those gaps (its
/// drifted nodes are kops's next instance groups, `kopsUpdateSeen`): no
/// drift roll of its own, no AWS mutation; afterwards nothing is drifted,
/// the hold is gone and the layout is as before. (With the taint alone,
/// the group started a drift roll of the next instance group in the gap.)
#[tokio::test]
async fn a_kops_rolling_update_one_instance_group_after_another_is_not_joined_by_a_drift_roll() {
    use spot_node_manager::crd::nodegroup::GroupState;
    let s = started("drift-kops-groups").await;
    let before = s.kops_updated().await;
    // Every ExternalUpdate message the group shows while kops runs.
    let (watch, messages) = s.sample(|st| {
        let held = st.conditions.iter().find(|c| {
            c.type_ == "ExternalUpdate" && c.status == spot_node_manager::crd::ConditionStatus::True
        });
        held.map(|c| c.message.clone()).into_iter().collect()
    });
    let replace = async {
        s.status_where("the group says ExternalUpdate", |st| {
            st.state == Some(GroupState::ExternalUpdate)
        })
        .await;
        let drift = serde_json::json!({"drift": {"action": "Replace"}});
        s.world.patch_group("workers", drift).await;
    };
    let (update, ()) = tokio::join!(
        s.world.kops_rolling_update(&s.kops, KopsSurge::Detach),
        replace
    );
    s.status_where("3 Ready, none drifted, no external update", |st| {
        st.ready_nodes == Some(3)
            && st.drifted_nodes == Some(0)
            && st.state == Some(GroupState::Ready)
            && st.kops_update_seen.is_none()
    })
    .await;
    watch.abort();
    s.only_kops_replaced(&before, &update).await;
    let messages = messages.lock().map(|m| m.clone()).unwrap_or_default();
    assert!(
        messages.iter().any(|m| m.contains("may still be running")),
        "the gap between two instance groups was never seen: {messages:?}"
    );
}
