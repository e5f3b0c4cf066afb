//! The interruption record on a Node, written and parsed only through this
//! module (the receiver marks; the interruption planner, the drainer, the
//! inventory and its watch read; a drain given up checks it before
//! uncordoning). Marking is the first, persisted action on
//! a node about to be lost: one patch that cordons it, taints it `nodemanager.dev/interrupted:NoSchedule`, labels it
//! out of external load balancers and records the notice (kind, AWS time,
//! drain deadline) in an annotation. The Node is the durable record: once
//! the patch is stored the SQS message can be deleted, and a restart or a
//! redelivered message finds the node marked and does nothing twice.

use crate::Result;
use crate::context::Context;
use crate::crd::labels::{
    EXCLUDE_FROM_LOAD_BALANCERS, INTERRUPTED_LABEL, INTERRUPTED_TAINT, INTERRUPTION_ANNOTATION,
};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What the annotation records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The notice's kind (metric label, e.g. `spot_interruption`).
    pub kind: String,
    pub instance_id: String,
    /// When AWS emitted the notice.
    pub noticed: DateTime<Utc>,
    /// The drain must be finished by then.
    pub deadline: DateTime<Utc>,
    /// When AWS says the instance goes, if the notice says (a scheduled
    /// retirement or stop: its `startTime`, often days away).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_at: Option<DateTime<Utc>>,
    /// From when the node is cordoned, replaced and drained, when that is
    /// not at once (a scheduled change days away: the group's
    /// `scheduledChangeLead` before AWS takes it). Until then only this
    /// record and the label are on the node; it serves on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_from: Option<DateTime<Utc>>,
    /// The notice reached us after its drain deadline: the node was still
    /// drained, within a short window of its own ([`LATE_DRAIN`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<bool>,
    /// The node's NodeGroup, `namespace/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// When the drain ended (drained, or its deadline passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<DateTime<Utc>>,
    /// Pods still on the node when the drain ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_left: Option<i32>,
    /// The ASG terminate lifecycle action holding the instance, which we
    /// complete once the drain ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<HookAction>,
    /// The namespace of the manager that marked the node, when that manager
    /// manages one namespace only (`--namespace`): only it drains the node
    /// and completes its lifecycle action (see [`is_ours`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// A terminate lifecycle action in progress: what completing or extending
/// it needs, and how far we are with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookAction {
    pub auto_scaling_group: String,
    pub hook: String,
    pub token: String,
    /// The group's region, when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The last heartbeat we sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<DateTime<Utc>>,
    /// When we completed it (CONTINUE), or found it no longer waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<DateTime<Utc>>,
}

impl HookAction {
    /// The call that extends or completes this action for `instance_id`.
    pub fn call<'a>(&'a self, instance_id: &'a str) -> crate::cloud::HookCall<'a> {
        crate::cloud::HookCall {
            asg: &self.auto_scaling_group,
            hook: &self.hook,
            token: &self.token,
            instance_id,
        }
    }
}

/// What a terminate lifecycle action needs from us now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookStep {
    /// Still draining and half the hook's heartbeat timeout is gone since
    /// the notice or the last heartbeat: extend it.
    Heartbeat,
    /// The drain ended (drained, or its deadline passed): let the ASG go on.
    Complete,
}

/// Pure: the lifecycle step due for `record` at `now`, given the hook's
/// heartbeat timeout. Heartbeats at half the timeout leave a margin for a
/// slow call or a requeue.
pub fn hook_step(
    record: &Record,
    now: DateTime<Utc>,
    heartbeat_timeout: chrono::Duration,
) -> Option<HookStep> {
    let action = record.lifecycle.as_ref()?;
    if action.completed.is_some() {
        return None;
    }
    if record.drained.is_some() {
        return Some(HookStep::Complete);
    }
    let last = action.heartbeat.unwrap_or(record.noticed);
    let due = last.checked_add_signed(heartbeat_timeout / 2)?;
    (now >= due).then_some(HookStep::Heartbeat)
}

/// How long a notice that arrived after its deadline still drains: its
/// pods are evicted anyway (if the instance is gone already, they simply
/// go), with grace periods cut to this.
pub const LATE_DRAIN: chrono::Duration = chrono::Duration::seconds(10);

/// The kind of a rebalance recommendation's record: the node is at risk,
/// not lost; only the annotation is written (the replenisher replaces it,
/// then drains and removes it).
pub const AT_RISK: &str = "rebalance_recommendation";

impl Record {
    /// The notice as a NodeGroup's status shows it (the inventory's view).
    pub fn interruption(&self) -> crate::crd::nodegroup::NodeInterruption {
        crate::crd::nodegroup::NodeInterruption {
            kind: self.kind.clone(),
            noticed: self.noticed,
            deadline: self.deadline,
            loss_at: self.loss_at,
            drain_from: self.drain_from,
            late: self.late,
            drained: self.drained,
        }
    }

    /// The node will be lost (anything but a rebalance recommendation).
    pub fn is_loss(&self) -> bool {
        self.kind != AT_RISK
    }

    /// The node is to be out of service by `now`: a loss whose drain has
    /// begun (at once, unless deferred to `drain_from`).
    pub fn leaving(&self, now: DateTime<Utc>) -> bool {
        self.is_loss() && self.drain_from.is_none_or(|from| now >= from)
    }
}

/// Pure: the mark is this manager's to act on, `namespace` being the one
/// it manages (None: every namespace). Managers scoped to different
/// namespaces can share a cluster, and Nodes are the cluster's: without
/// this each would drain every marked Node, report it, and complete the
/// other's lifecycle actions. A mark without a scope was made by a manager
/// of every namespace (or by a version before marks said): a scoped
/// manager takes it only for a group of its own namespace.
pub fn is_ours(record: &Record, namespace: Option<&str>) -> bool {
    match (record.scope.as_deref(), namespace) {
        (Some(marked_in), Some(ours)) => marked_in == ours,
        (Some(_), None) => false,
        (None, None) => true,
        (None, Some(ours)) => record
            .group
            .as_deref()
            .and_then(|g| g.split_once('/'))
            .is_some_and(|(ns, _)| ns == ours),
    }
}

/// The node's record, if it carries a readable one.
pub fn record_of(node: &(impl crate::k8s::node::NodeView + ?Sized)) -> Option<Record> {
    node.annotation(INTERRUPTION_ANNOTATION)
        .and_then(|v| serde_json::from_str(v).ok())
}

/// Pure: the merge patch that marks `node` for `record` at `now`, or None
/// when it is already marked as far as is due for this loss or an earlier
/// one. A loss whose drain is deferred (`drain_from` after `now`) is only
/// recorded and labelled (the drainer watches the label, and cordons it
/// then). The patch carries the node's resourceVersion: the taint list is
/// replaced whole, so a concurrent change to it makes the patch fail (409)
/// rather than be lost.
pub fn mark_patch(node: &Node, record: &Record, now: DateTime<Utc>) -> Option<Value> {
    let existing = record_of(node);
    if !record.is_loss() {
        // At risk: recorded once; a loss recorded already supersedes it. A
        // recommendation past its hold is replaced by a newer one.
        let renewed = existing.as_ref().is_some_and(|e| {
            !e.is_loss()
                && !crate::crd::nodegroup::at_risk_at(e.noticed, now)
                && record.noticed > e.noticed
        });
        if existing.is_some() && !renewed {
            return None;
        }
        return Some(json!({
            "metadata": {
                "resourceVersion": node.resource_version(),
                "annotations": {INTERRUPTION_ANNOTATION: serde_json::to_string(record).unwrap_or_default()},
            },
        }));
    }
    // A loss replaces an at-risk record; of two losses the earlier deadline wins.
    let keep = existing.as_ref().filter(|e| {
        e.is_loss() && e.instance_id == record.instance_id && e.deadline <= record.deadline
    });
    // A lifecycle action on a node marked already (say, after its spot
    // warning) joins the kept record, so that it is completed too.
    let joined = keep.and_then(|k| {
        let new = record.lifecycle.as_ref()?;
        let known = k.lifecycle.as_ref().is_some_and(|a| a.token == new.token);
        (!known).then(|| Record {
            lifecycle: Some(new.clone()),
            ..k.clone()
        })
    });
    let record = joined.as_ref().or(keep).unwrap_or(record);
    let annotation = serde_json::to_string(record).unwrap_or_default();
    if !record.leaving(now) {
        if keep.is_some() && joined.is_none() && node.labels().contains_key(INTERRUPTED_LABEL) {
            return None;
        }
        return Some(json!({
            "metadata": {
                "resourceVersion": node.resource_version(),
                "labels": {INTERRUPTED_LABEL: record.kind},
                "annotations": {INTERRUPTION_ANNOTATION: annotation},
            },
        }));
    }
    let spec = node.spec.as_ref();
    let taints: Vec<Taint> = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
    let tainted = taints
        .iter()
        .any(|t| t.key == INTERRUPTED_TAINT && t.effect == "NoSchedule");
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let labelled = node.labels().contains_key(EXCLUDE_FROM_LOAD_BALANCERS)
        && node.labels().contains_key(INTERRUPTED_LABEL);
    if keep.is_some() && joined.is_none() && tainted && cordoned && labelled {
        return None;
    }
    let mut taints: Vec<Taint> = taints
        .into_iter()
        .filter(|t| t.key != INTERRUPTED_TAINT)
        .collect();
    taints.push(Taint {
        key: INTERRUPTED_TAINT.into(),
        value: Some(record.kind.clone()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    Some(json!({
        "metadata": {
            "resourceVersion": node.resource_version(),
            "labels": {EXCLUDE_FROM_LOAD_BALANCERS: "true", INTERRUPTED_LABEL: record.kind},
            "annotations": {INTERRUPTION_ANNOTATION: annotation},
        },
        "spec": {"unschedulable": true, "taints": taints},
    }))
}

/// Marks the node (one patch); false when it was already marked, or is gone.
/// The patch is conditional on the node's resourceVersion (it replaces the
/// taint list): a node changed meanwhile (a kubelet's status update) is read
/// again and the mark re-planned, a few times, rather than leaving the
/// message to come back after its visibility timeout. A patch that cordons
/// is made only once `allowed` says so of the Node it is planned on (the
/// rule book's check, asked by the caller's path).
pub async fn mark(
    ctx: &Context,
    name: &str,
    record: &Record,
    allowed: impl Fn(&Node) -> Result<()>,
) -> Result<bool> {
    const ATTEMPTS: usize = 5;
    // Stamped where every mark is written (the plans do not know the
    // manager's namespace).
    let record = &Record {
        scope: ctx.settings.namespace.clone(),
        ..record.clone()
    };
    let nodes: kube::Api<Node> = kube::Api::all(ctx.client.clone());
    let mut attempt = 0;
    loop {
        attempt += 1;
        // The first read from the apiserver's watch cache (no etcd read per
        // notice in a burst); a stale answer fails the conditional patch
        // (409) and the retry reads consistently. The node is at least as
        // fresh there as in the inventory that named it.
        let read = match attempt {
            1 => nodes.get_with(name, &kube::api::GetParams::any()).await,
            _ => nodes.get(name).await,
        };
        let node = match read {
            Ok(node) => node,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
            Err(e) => return Err(crate::Error::kube(format!("get node {name}"))(e)),
        };
        let now = ctx.clock.now();
        let Some(patch) = mark_patch(&node, record, now) else {
            return Ok(false);
        };
        if record.leaving(now) {
            allowed(&node)?;
        }
        let patched = ctx
            .mutations
            .perform(
                crate::mutation::Intent::kube(
                    "mark_interrupted",
                    format!("node/{name}"),
                    format!("{} of {}", record.kind, record.instance_id),
                ),
                || async {
                    nodes
                        .patch(
                            name,
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(&patch),
                        )
                        .await
                        .map_err(crate::Error::kube(format!("mark node {name} interrupted")))
                },
            )
            .await;
        match patched {
            Ok(_) => return Ok(true),
            Err(e) if e.category() == "kube_conflict" && attempt < ATTEMPTS => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap() + chrono::Duration::seconds(s)
    }

    fn record(deadline: i64) -> Record {
        Record {
            kind: "spot_interruption".into(),
            instance_id: "i-1".into(),
            noticed: t(0),
            deadline: t(deadline),
            loss_at: None,
            drain_from: None,
            late: None,
            group: Some("ns/workers".into()),
            drained: None,
            pods_left: None,
            lifecycle: None,
            scope: None,
        }
    }

    fn node() -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.resource_version = Some("7".into());
        n.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "dedicated".into(),
                value: Some("web".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        });
        n
    }

    /// Applies a merge patch the way the apiserver would, for these fields.
    fn apply(node: &mut Node, patch: &Value) {
        fn merge(target: &mut Value, patch: &Value) {
            let Value::Object(fields) = patch else {
                *target = patch.clone();
                return;
            };
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(map) = target {
                for (k, v) in fields {
                    if v.is_null() {
                        map.remove(k);
                    } else {
                        merge(map.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        let mut value = serde_json::to_value(&*node).expect("node");
        merge(&mut value, patch);
        *node = serde_json::from_value(value).expect("patched node");
    }

    #[test]
    fn one_patch_cordons_taints_labels_and_records_keeping_other_taints() {
        let mut n = node();
        let patch = mark_patch(&n, &record(90), t(0)).expect("a patch");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        apply(&mut n, &patch);
        let spec = n.spec.clone().expect("spec");
        assert_eq!(spec.unschedulable, Some(true));
        let keys: Vec<&str> = spec
            .taints
            .iter()
            .flatten()
            .map(|t| t.key.as_str())
            .collect();
        assert_eq!(keys, vec!["dedicated", INTERRUPTED_TAINT]);
        assert_eq!(
            n.labels()
                .get(EXCLUDE_FROM_LOAD_BALANCERS)
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(record_of(&n), Some(record(90)));
        // Marked: the same notice again, or a later one, changes nothing.
        assert_eq!(mark_patch(&n, &record(90), t(0)), None);
        assert_eq!(mark_patch(&n, &record(120), t(0)), None);
    }

    #[test]
    fn an_earlier_deadline_wins_and_a_lost_cordon_is_put_back() {
        let mut n = node();
        let first = mark_patch(&n, &record(90), t(0)).expect("patch");
        apply(&mut n, &first);
        let earlier = mark_patch(&n, &record(30), t(0)).expect("an earlier deadline");
        apply(&mut n, &earlier);
        assert_eq!(record_of(&n).map(|r| r.deadline), Some(t(30)));
        // Someone uncordons it: marking again restores the cordon only.
        n.spec.as_mut().expect("spec").unschedulable = Some(false);
        let again = mark_patch(&n, &record(90), t(0)).expect("cordon restored");
        apply(&mut n, &again);
        assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        assert_eq!(record_of(&n).map(|r| r.deadline), Some(t(30)));
        let ours = n
            .spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .filter(|t| t.key == INTERRUPTED_TAINT)
            .count();
        assert_eq!(ours, 1, "never two of our taints");
    }

    #[test]
    fn a_rebalance_recommendation_records_only_and_a_later_loss_marks_in_full() {
        let mut n = node();
        let at_risk = Record {
            kind: AT_RISK.into(),
            ..record(90)
        };
        let patch = mark_patch(&n, &at_risk, t(0)).expect("a patch");
        apply(&mut n, &patch);
        assert_eq!(record_of(&n), Some(at_risk.clone()));
        assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), None);
        assert!(
            !n.labels().contains_key(INTERRUPTED_LABEL),
            "not drained by the handler"
        );
        assert_eq!(mark_patch(&n, &at_risk, t(0)), None, "recorded once");
        // The interruption follows: cordon, taint, label, and its record.
        let loss = mark_patch(&n, &record(120), t(0)).expect("the loss marks");
        apply(&mut n, &loss);
        assert_eq!(record_of(&n), Some(record(120)));
        assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        assert!(n.labels().contains_key(INTERRUPTED_LABEL));
        // And a later recommendation does not undo it.
        assert_eq!(mark_patch(&n, &at_risk, t(0)), None);
    }

    #[test]
    fn a_rebalance_recommendation_past_its_hold_gives_way_to_a_newer_one() {
        let mut n = node();
        let first = Record {
            kind: AT_RISK.into(),
            ..record(90)
        };
        let patch = mark_patch(&n, &first, t(0)).expect("a patch");
        apply(&mut n, &patch);
        let hold = chrono::Duration::from_std(crate::crd::nodegroup::AT_RISK_FOR).expect("hold");
        let later = Record {
            noticed: t(0) + hold + chrono::Duration::minutes(5),
            ..first.clone()
        };
        // Within the hold: the first stands.
        assert_eq!(mark_patch(&n, &later, t(60)), None);
        // Past it: the newer recommendation is recorded in its place.
        let at = later.noticed;
        let patch = mark_patch(&n, &later, at).expect("renewed");
        apply(&mut n, &patch);
        assert_eq!(record_of(&n), Some(later.clone()));
        // A stale one never replaces a newer one.
        assert_eq!(mark_patch(&n, &first, at), None);
    }

    /// A retirement two days after `t(0)`, drained from an hour before.
    fn retirement_in_two_days() -> Record {
        let days = 2 * 24 * 3600;
        Record {
            kind: "scheduled_change".into(),
            loss_at: Some(t(days)),
            drain_from: Some(t(days - 3600)),
            ..record(days - 90)
        }
    }

    #[test]
    fn a_scheduled_change_days_away_is_recorded_and_labelled_then_cordoned_from_its_drain_start() {
        let mut n = node();
        let (scheduled, days) = (retirement_in_two_days(), 2 * 24 * 3600);
        let patch = mark_patch(&n, &scheduled, t(0)).expect("recorded");
        apply(&mut n, &patch);
        assert_eq!(record_of(&n), Some(scheduled.clone()));
        assert_eq!(
            n.spec.as_ref().and_then(|s| s.unschedulable),
            None,
            "serves on"
        );
        assert!(
            n.labels().contains_key(INTERRUPTED_LABEL),
            "watched by the drainer"
        );
        assert!(!n.labels().contains_key(EXCLUDE_FROM_LOAD_BALANCERS));
        // Redelivered before its drain: nothing more.
        assert_eq!(mark_patch(&n, &scheduled, t(60)), None);
        // From its drain start the same record marks in full.
        let full = mark_patch(&n, &scheduled, t(days - 3600)).expect("cordoned now");
        apply(&mut n, &full);
        assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        assert!(n.labels().contains_key(EXCLUDE_FROM_LOAD_BALANCERS));
        assert_eq!(record_of(&n), Some(scheduled.clone()));
        assert_eq!(mark_patch(&n, &scheduled, t(days - 3000)), None);
    }

    #[test]
    fn a_spot_warning_on_a_node_with_a_deferred_retirement_marks_in_full_at_once() {
        let mut n = node();
        let scheduled = retirement_in_two_days();
        let recorded = mark_patch(&n, &scheduled, t(0)).expect("recorded");
        apply(&mut n, &recorded);
        let warning = mark_patch(&n, &record(90), t(0)).expect("the warning wins");
        apply(&mut n, &warning);
        assert_eq!(record_of(&n), Some(record(90)));
        assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        // The retirement again, later: the earlier deadline stays.
        assert_eq!(mark_patch(&n, &scheduled, t(10)), None);
    }

    fn action(token: &str) -> HookAction {
        HookAction {
            auto_scaling_group: "asg-a".into(),
            hook: "drain-hook".into(),
            token: token.into(),
            region: None,
            heartbeat: None,
            completed: None,
        }
    }

    #[test]
    fn heartbeats_at_half_the_timeout_while_draining_then_one_completion() {
        let timeout = chrono::Duration::seconds(30);
        let mut r = Record {
            kind: "terminate_lifecycle_action".into(),
            lifecycle: Some(action("tok")),
            ..record(90)
        };
        assert_eq!(hook_step(&r, t(14), timeout), None);
        assert_eq!(hook_step(&r, t(15), timeout), Some(HookStep::Heartbeat));
        r.lifecycle.as_mut().expect("action").heartbeat = Some(t(15));
        assert_eq!(hook_step(&r, t(29), timeout), None, "from the last one");
        assert_eq!(hook_step(&r, t(30), timeout), Some(HookStep::Heartbeat));
        // A drain well inside the timeout needs no heartbeat at all.
        assert_eq!(hook_step(&r, t(40), chrono::Duration::seconds(3600)), None);
        r.drained = Some(t(40));
        assert_eq!(hook_step(&r, t(40), timeout), Some(HookStep::Complete));
        r.lifecycle.as_mut().expect("action").completed = Some(t(41));
        assert_eq!(hook_step(&r, t(500), timeout), None, "completed once");
        assert_eq!(hook_step(&record(90), t(500), timeout), None, "no action");
        // An absurd timeout never overflows.
        r.lifecycle.as_mut().expect("action").completed = None;
        r.drained = None;
        assert_eq!(hook_step(&r, t(500), chrono::Duration::MAX), None);
    }

    #[test]
    fn a_mark_is_acted_on_only_by_a_manager_of_the_namespace_that_made_it() {
        let scoped = |scope: Option<&str>, group: Option<&str>| Record {
            scope: scope.map(str::to_string),
            group: group.map(str::to_string),
            ..record(30)
        };
        // Marked by a manager of one namespace: that manager only.
        let a = scoped(Some("team-a"), Some("team-a/workers"));
        assert!(is_ours(&a, Some("team-a")));
        assert!(!is_ours(&a, Some("team-b")), "another namespace's manager");
        assert!(!is_ours(&a, None), "a manager of every namespace");
        // A node of no group, marked by a scoped manager.
        let unmanaged = scoped(Some("team-a"), None);
        assert!(is_ours(&unmanaged, Some("team-a")));
        assert!(!is_ours(&unmanaged, Some("team-b")));
        // Marked by a manager of every namespace (or an older version).
        let wide = scoped(None, Some("team-a/workers"));
        assert!(is_ours(&wide, None));
        assert!(is_ours(&wide, Some("team-a")), "the group's own namespace");
        assert!(!is_ours(&wide, Some("team-b")));
        assert!(is_ours(&scoped(None, None), None));
        assert!(!is_ours(&scoped(None, None), Some("team-a")));
        assert!(!is_ours(&scoped(None, Some("no-slash")), Some("no-slash")));
    }

    #[test]
    fn the_scope_is_kept_in_the_annotation_and_absent_in_an_older_one() {
        let r = Record {
            scope: Some("team-a".into()),
            ..record(30)
        };
        let text = serde_json::to_string(&r).expect("json");
        assert!(text.contains(r#""scope":"team-a""#), "{text}");
        let back: Record = serde_json::from_str(&text).expect("read back");
        assert_eq!(back, r);
        let older = serde_json::to_string(&record(30)).expect("json");
        assert!(!older.contains("scope"), "{older}");
        let read: Record = serde_json::from_str(&older).expect("an older mark");
        assert_eq!(read.scope, None);
    }

    #[test]
    fn a_lifecycle_action_for_a_node_marked_already_joins_its_record_once() {
        let mut n = node();
        let first = mark_patch(&n, &record(30), t(0)).expect("marked");
        apply(&mut n, &first);
        let drained = Record {
            drained: Some(t(20)),
            ..record(30)
        };
        apply(
            &mut n,
            &json!({"metadata": {"annotations": {INTERRUPTION_ANNOTATION: serde_json::to_string(&drained).expect("json")}}}),
        );
        let hook = Record {
            kind: "terminate_lifecycle_action".into(),
            lifecycle: Some(action("tok")),
            ..record(90)
        };
        let patch = mark_patch(&n, &hook, t(0)).expect("the action joins");
        apply(&mut n, &patch);
        let joined = record_of(&n).expect("record");
        assert_eq!(joined.kind, "spot_interruption", "the first notice stays");
        assert_eq!(joined.deadline, t(30));
        assert_eq!(joined.drained, Some(t(20)), "the drain's progress stays");
        assert_eq!(joined.lifecycle, Some(action("tok")));
        // Redelivered: nothing.
        assert_eq!(mark_patch(&n, &hook, t(0)), None);
    }
}
