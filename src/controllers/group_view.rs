//! The vocabulary both child controllers (replenisher, refresher) plan in:
//! the group's nodes and ASGs as a plan sees them, a desired-count change,
//! the lock from a controller's side, and time helpers. Neither controller
//! imports from the other; both import from here.

use crate::cloud::AsgDescription;
use crate::crd::nodegroup::AutoScalingGroupStatus;
use chrono::{DateTime, Utc};
use std::time::Duration;

pub use crate::k8s::lock::LockState;

/// An ASG as a plan sees it: the figures of a fresh describe, judged
/// (whether it can be counted on to launch). The inventory reports the same
/// figures in the group's status ([`AutoScalingGroupStatus`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AsgView {
    pub name: String,
    pub desired: i32,
    pub min: i32,
    pub max: i32,
    /// Capacity as AWS counts it: InService and Pending instances.
    pub instances: i32,
    /// Of which Pending (launched, not yet InService).
    pub pending: i32,
    /// False when the ASG cannot be counted on to launch: Launch suspended,
    /// its newest launch failed, or below desired for longer than the launch
    /// grace. A launch in flight (lag, Pending) within the grace is launching.
    pub launching: bool,
    /// Why it is not launching.
    pub reason: Option<String>,
    /// Since when it has been seen below its desired count.
    pub behind_since: Option<DateTime<Utc>>,
    /// The newest launch activity's failure, while below desired.
    pub launch_failure: Option<String>,
    pub suspended_processes: Vec<String>,
    /// An on-demand fallback ASG (`spec.fallback`): its nodes count, it is
    /// raised only while every spot ASG is short, never otherwise.
    pub fallback: bool,
    /// Its recent record's events in the last 24 hours (the NodeGroup's
    /// `autoScalingGroups[].recent`): a raise elsewhere prefers the lowest.
    pub risk: u32,
    /// Its spot price in millionths of a dollar an hour, when known (the
    /// NodeGroup's `autoScalingGroups[].spotPrice`).
    pub price: Option<u64>,
    /// Its instance type's on-demand price, in millionths of a dollar an
    /// hour, when known (`autoScalingGroups[].onDemandPrice`).
    pub on_demand_price: Option<u64>,
}

impl AsgView {
    /// Below its desired count: a launch is due, in flight, or failing.
    pub fn is_behind(&self) -> bool {
        self.instances < self.desired
    }

    pub fn is_suspended(&self, process: &str) -> bool {
        self.suspended_processes.iter().any(|p| p == process)
    }

    /// Why the ASG cannot be counted on to launch, if it cannot, having been
    /// behind for `behind_for` (None: not seen behind before).
    pub fn launch_problem(&self, behind_for: Option<std::time::Duration>) -> Option<String> {
        if self.is_suspended(crate::cloud::LAUNCH) {
            return Some("its Launch process is suspended".into());
        }
        if !self.is_behind() {
            return None;
        }
        if let Some(failure) = &self.launch_failure {
            return Some(format!("latest launch failed: {failure}"));
        }
        let behind_for = behind_for.unwrap_or_default();
        (behind_for >= crate::cloud::LAUNCH_GRACE).then(|| {
            format!(
                "desired {} but {} instance(s) for {}",
                self.desired,
                self.instances,
                crate::duration::format(behind_for)
            )
        })
    }

    /// Judged with what the caller remembers of since when it is behind:
    /// sets `behind_since`, `launching` and `reason`.
    pub fn judge(mut self, remembered: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Self {
        self.behind_since = self.is_behind().then(|| remembered.unwrap_or(now).min(now));
        let behind_for = self
            .behind_since
            .and_then(|since| (now - since).to_std().ok());
        self.reason = self.launch_problem(behind_for);
        self.launching = self.reason.is_none();
        self
    }
}

impl From<&AsgDescription> for AsgView {
    /// The figures, judged as if first seen behind just now (callers that
    /// remember longer judge again: [`AsgView::judge`]).
    fn from(asg: &AsgDescription) -> Self {
        let view = AsgView {
            name: asg.name.clone(),
            desired: asg.desired,
            min: asg.min,
            max: asg.max,
            instances: asg.active_instances() as i32,
            pending: asg.pending_instances() as i32,
            launching: true,
            reason: None,
            behind_since: None,
            launch_failure: asg.recent_failure.clone(),
            suspended_processes: asg.suspended_processes.clone(),
            fallback: false,
            risk: 0,
            price: None,
            on_demand_price: None,
        };
        let reason = view.launch_problem(None);
        AsgView {
            launching: reason.is_none(),
            reason,
            ..view
        }
    }
}

impl From<AsgView> for AutoScalingGroupStatus {
    fn from(v: AsgView) -> Self {
        AutoScalingGroupStatus {
            name: v.name,
            desired: v.desired,
            min: v.min,
            max: v.max,
            instances: v.instances,
            pending: v.pending,
            launching: v.launching,
            reason: v.reason,
            behind_since: v.behind_since,
            launch_failure: v.launch_failure,
            suspended_processes: v.suspended_processes,
            fallback: v.fallback,
            spot_price: v.price.map(|p| format!("{:.6}", p as f64 / 1e6)),
            on_demand_price: v.on_demand_price.map(|p| format!("{:.6}", p as f64 / 1e6)),
            recent: vec![],
        }
    }
}

/// What every child plan is told of its group, whatever it decides: the
/// spec's role and count, whether it may act at all, its ASGs and nodes as
/// observed, the lock, and the time. Each plan's `Input` adds its own.
#[derive(Debug, Clone)]
pub struct GroupFacts<'a> {
    pub role: crate::crd::Role,
    pub desired: i32,
    /// The group (or the child resource) is suspended.
    pub suspended: bool,
    /// The NodeGroup is being deleted: start nothing, unwind what is under way.
    pub deleting: bool,
    /// Why the group makes no AWS mutation of its own now (a kops rolling
    /// update is replacing its nodes), if so.
    pub external_update: Option<String>,
    /// Why the group's spec is invalid (the inventory's SpecValid False,
    /// or the spec's own validation), if so: nothing starts, a run pauses.
    pub invalid_spec: Option<String>,
    /// Why nothing may be terminated now (the group's circuit breaker is
    /// open), if so.
    pub breaker: Option<String>,
    /// How long a node may stay NotReady before it is unhealthy
    /// (`replenish.unhealthyTimeout`).
    pub unhealthy_timeout: Duration,
    /// Whether unhealthy nodes are repaired (`replenish.repair`).
    pub repair: bool,
    pub asgs: &'a [AsgView],
    pub nodes: &'a [GroupNode],
    pub lock: LockState,
    /// Masters: the cluster's control plane, counted by instance across
    /// every Master group (`authority::observe`), when it was looked at.
    pub control_plane: Option<&'a crate::controllers::authority::ControlPlane>,
    pub now: DateTime<Utc>,
}

impl GroupFacts<'_> {
    /// Why nothing of ours happens to the group now (the rule book's
    /// `Stopped`): suspended, its spec invalid, or a kops rolling update
    /// replacing its nodes.
    pub fn stopped(&self) -> Option<&str> {
        if self.suspended {
            Some("the group is suspended")
        } else if self.invalid_spec.is_some() {
            Some("the NodeGroup spec is invalid")
        } else {
            self.external_update.as_deref()
        }
    }

    /// The group's ASG named `name`, as observed.
    pub fn asg(&self, name: &str) -> Option<&AsgView> {
        self.asgs.iter().find(|a| a.name == name)
    }

    /// The group's node on instance `id`, as observed.
    pub fn node_of(&self, id: &str) -> Option<&GroupNode> {
        self.nodes
            .iter()
            .find(|n| n.instance_id.as_deref() == Some(id))
    }

    /// When `node` becomes (or became) unhealthy: its Ready condition not
    /// True since `unhealthy_since`, plus the timeout. None while Ready, or
    /// while leaving on an interruption notice.
    pub fn unhealthy_at(&self, node: &GroupNode) -> Option<DateTime<Utc>> {
        if node.ready || node.fate.is_some() {
            return None;
        }
        Some(after(node.unhealthy_since?, self.unhealthy_timeout))
    }

    /// On one of the group's on-demand fallback ASGs.
    pub fn on_fallback(&self, node: &GroupNode) -> bool {
        self.asgs
            .iter()
            .any(|a| a.fallback && node.asg.as_deref() == Some(a.name.as_str()))
    }

    /// NotReady for longer than the unhealthy timeout: a dead kubelet, not
    /// a blip.
    pub fn unhealthy(&self, node: &GroupNode) -> bool {
        self.unhealthy_at(node).is_some_and(|at| self.now >= at)
    }

    /// Not Ready and no longer expected to become Ready: unhealthy, or,
    /// with no record of since when it is NotReady, launched longer than
    /// the unhealthy timeout ago. Such a node is not on its way.
    pub fn stuck(&self, node: &GroupNode) -> bool {
        if node.ready || node.fate.is_some() {
            return false;
        }
        node.unhealthy_since
            .or(node.launch_time)
            .is_some_and(|t| self.now >= after(t, self.unhealthy_timeout))
    }
}

/// A node of the group, as a plan sees it (`ready` only while its instance
/// is in service in its ASG: see [`group_nodes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupNode {
    pub name: String,
    pub instance_id: Option<String>,
    pub asg: Option<String>,
    /// Ready, in service, and not leaving (no interruption recorded).
    pub ready: bool,
    pub launch_time: Option<DateTime<Utc>>,
    /// Since when its Ready condition has not been True (the inventory's
    /// `unhealthySince`).
    pub unhealthy_since: Option<DateTime<Utc>>,
    /// Leaving, per an interruption notice recorded on the node.
    pub fate: Option<Fate>,
    /// When its notice comes into force or leaves it (a scheduled change
    /// at its drain start, a rebalance recommendation at the end of its
    /// hold): a plan that judged the node before then looks again.
    pub fate_changes: Option<DateTime<Utc>>,
    /// Launched from another template version than its ASG launches now, or
    /// marked by kops (the inventory's `drifted`).
    pub drifted: bool,
    /// Cordoned (by anyone): no new pod is scheduled on it.
    pub unschedulable: bool,
}

/// How a node with an interruption notice leaves, and who replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// AWS takes the instance at its own time (spot interruption, scheduled
    /// change): the replenisher replaces it now, and terminates it itself
    /// once drained (and its replacement launched) or at its deadline,
    /// before AWS does.
    Reclaimed {
        deadline: DateTime<Utc>,
        drained: bool,
    },
    /// At elevated risk (rebalance recommendation, `Replace`): replaced
    /// first, then drained and removed like a surplus node.
    AtRisk,
    /// Already going by itself (stopping, terminated, an ASG lifecycle
    /// termination): its ASG replaces it.
    Lost,
}

impl Fate {
    /// From the notice's kind.
    pub fn of(interruption: &crate::crd::nodegroup::NodeInterruption) -> Fate {
        use crate::crd::nodegroup::NoticeClass;
        match interruption.class() {
            NoticeClass::SpotInterruption | NoticeClass::ScheduledChange => Fate::Reclaimed {
                deadline: interruption.deadline,
                drained: interruption.drained.is_some(),
            },
            NoticeClass::RebalanceRecommendation => Fate::AtRisk,
            NoticeClass::StateChange
            | NoticeClass::ScheduledMaintenance
            | NoticeClass::TerminateLifecycleAction
            | NoticeClass::Unknown => Fate::Lost,
        }
    }
}

/// One ASG's desired count, from what it was to what it is to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredChange {
    pub asg: String,
    pub from: i32,
    pub to: i32,
}

/// A std duration as a chrono one (saturating).
pub fn to_chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// `t` plus `d`, saturating at the end of representable time: a deadline
/// from a huge duration is never, not a panic (`DateTime + TimeDelta`
/// panics on overflow).
pub fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t.checked_add_signed(to_chrono(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The drain of an unhealthy node (a repair, or a refresh target whose node
/// died) tries evictions for at most this long, then the node is terminated
/// anyway: its pods are not running, and a budget that already counts them
/// unhealthy may refuse their eviction for good. A pod whose deletion was
/// asked counts as gone: a dead kubelet never confirms it.
pub const REPAIR_DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// A plan waiting on something about to change looks again this soon.
pub const SOON: Duration = Duration::from_secs(2);
/// Idle, a plan looks again this often (a clock jump, an edit missed); the
/// inventory's status writes wake it sooner.
pub const IDLE: Duration = Duration::from_secs(300);

/// The longest a reconcile waits to look again, whatever it waits for: a
/// requeue of years would overflow the runtime's clock arithmetic, and
/// looking again is cheap (every plan is recomputed from what is observed).
pub const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// How long from `now` until `then`, at least half a second and at most
/// [`LONGEST_WAIT`] (a requeue).
pub fn until(now: DateTime<Utc>, then: DateTime<Utc>) -> Duration {
    (then - now)
        .to_std()
        .unwrap_or(Duration::ZERO)
        .clamp(Duration::from_millis(500), LONGEST_WAIT)
}

/// An instance that is active (not terminating or detaching) in one of the
/// group's ASGs, per a fresh describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub asg: String,
    pub instance_id: String,
}

impl Member {
    /// Active instances of the group's ASGs, per the fresh describe.
    pub fn all_of(fresh: &[crate::cloud::AsgDescription]) -> Vec<Member> {
        fresh
            .iter()
            .flat_map(|a| {
                a.instances
                    .iter()
                    .filter(|i| i.is_active())
                    .map(|i| Member {
                        asg: a.name.clone(),
                        instance_id: i.instance_id.clone(),
                    })
            })
            .collect()
    }
}

/// The group's nodes as the plan sees them. A node counts as Ready only while
/// no interruption notice in force at `now` is recorded on it and its instance is InService in
/// its ASG per the fresh describe: after a
/// termination, the inventory (and a real kubelet) can report the node Ready
/// for a while, and counting it could remove a second node; before AWS has
/// finished launching it (Pending), it may still be abandoned.
pub fn group_nodes(
    nodes: &[crate::crd::nodegroup::NodeStatus],
    fresh: &[AsgDescription],
    now: DateTime<Utc>,
) -> Vec<GroupNode> {
    nodes
        .iter()
        .map(|n| {
            // Once its instance leaves the ASG, the inventory no longer
            // names an ASG for the node either: judge by the instance alone.
            let active = match &n.instance_id {
                Some(id) => described(fresh, id).is_some_and(|i| i.is_in_service()),
                // No instance known (e.g. a bad providerID): nothing says it is leaving.
                None => true,
            };
            // A scheduled change days away is no fate yet: the node serves
            // on, counts as Ready and is replaced from its drain start.
            let fate = n
                .interruption
                .as_ref()
                .filter(|i| i.in_force(now))
                .map(Fate::of);
            GroupNode {
                name: n.name.clone(),
                instance_id: n.instance_id.clone(),
                asg: n.auto_scaling_group.clone(),
                ready: n.ready && active && fate.is_none(),
                launch_time: n.launch_time,
                unhealthy_since: n.unhealthy_since,
                fate,
                fate_changes: n.interruption.as_ref().and_then(|i| i.changes_after(now)),
                drifted: n.drifted.is_some(),
                unschedulable: n.unschedulable,
            }
        })
        .collect()
}

/// Pure: the instances the inventory reports Ready whose ASG, per `fresh`,
/// still has them Pending (a description taken before AWS put them in
/// service, or a launch lifecycle hook holding them), or does not list
/// yet though the inventory saw them in it (a description taken before
/// the launch, as of a replacement the ASG launched for kops).
pub fn ready_while_pending(
    nodes: &[crate::crd::nodegroup::NodeStatus],
    fresh: &[AsgDescription],
) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| n.ready)
        .filter(|n| {
            let Some(id) = &n.instance_id else {
                return false;
            };
            match described(fresh, id) {
                Some(i) => i.is_pending(),
                None => n
                    .auto_scaling_group
                    .as_ref()
                    .is_some_and(|asg| fresh.iter().any(|a| &a.name == asg)),
            }
        })
        .filter_map(|n| n.instance_id.clone())
        .collect()
}

/// The instance as `fresh` lists it in its ASG, if it does.
fn described<'a>(fresh: &'a [AsgDescription], id: &str) -> Option<&'a crate::cloud::AsgInstance> {
    fresh
        .iter()
        .flat_map(|a| &a.instances)
        .find(|i| i.instance_id == id)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cloud::AsgInstance;
    use crate::crd::nodegroup::NodeStatus;

    /// A NodeGroup of `role` over the ASGs `asgs`, as the simulations build
    /// it for the real guards (its status is theirs to fill).
    pub(crate) fn sim_group(
        role: crate::crd::Role,
        desired: i32,
        asgs: &[&str],
    ) -> crate::crd::NodeGroup {
        let role = match role {
            crate::crd::Role::Master => "Master",
            crate::crd::Role::Worker => "Worker",
        };
        let names: Vec<serde_json::Value> = asgs
            .iter()
            .map(|a| serde_json::json!({ "name": a }))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
            "metadata": {"name": "sim", "namespace": "ns"},
            "spec": {"role": role, "desired": desired, "autoScalingGroups": names}
        }))
        .expect("the simulated NodeGroup")
    }

    /// Polls a future that never waits (simulated effects are immediate).
    pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }

    pub(crate) fn status_node(name: &str, asg: &str, id: &str) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            instance_id: Some(id.into()),
            auto_scaling_group: Some(asg.into()),
            availability_zone: None,
            instance_type: None,
            lifecycle: None,
            launch_time: None,
            ready: true,
            unhealthy_since: None,
            unschedulable: false,
            problem: None,
            drifted: None,
            interruption: None,
        }
    }

    pub(crate) fn fresh(asg: &str, instances: &[(&str, &str)]) -> AsgDescription {
        AsgDescription {
            name: asg.into(),
            desired: instances.len() as i32,
            min: 0,
            max: 5,
            instances: instances
                .iter()
                .map(|(id, state)| AsgInstance {
                    instance_id: id.to_string(),
                    availability_zone: None,
                    instance_type: None,
                    lifecycle_state: state.to_string(),
                    health_status: "Healthy".into(),
                    launched_from: None,
                })
                .collect(),
            launches_from: None,
            tags: Default::default(),
            recent_failure: None,
            suspended_processes: vec![],
            capacity_rebalance: false,
            max_instance_lifetime: None,
            zones: vec![],
        }
    }

    #[test]
    fn a_node_counts_ready_only_while_its_instance_is_in_service() {
        let mut left = status_node("left", "a", "i-4");
        // The inventory's view once the instance has left its ASG.
        left.auto_scaling_group = None;
        let nodes = [
            status_node("kept", "a", "i-1"),
            status_node("terminated", "a", "i-2"),
            status_node("terminating", "a", "i-3"),
            left,
            status_node("pending", "a", "i-5"),
            status_node("standby", "a", "i-6"),
        ];
        let asgs = [fresh(
            "a",
            &[
                ("i-1", "InService"),
                ("i-3", "Terminating"),
                ("i-5", "Pending"),
                ("i-6", "Standby"),
            ],
        )];
        let views = group_nodes(&nodes, &asgs, chrono::Utc::now());
        let ready: Vec<_> = views
            .iter()
            .filter(|n| n.ready)
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(ready, ["kept"]);
    }

    #[test]
    fn a_scheduled_change_days_away_is_no_fate_until_its_drain_start() {
        use crate::crd::nodegroup::NodeInterruption;
        let now = chrono::Utc::now();
        let from = now + chrono::Duration::days(2);
        let mut retiring = status_node("retiring", "a", "i-1");
        retiring.interruption = Some(NodeInterruption {
            kind: "scheduled_change".into(),
            noticed: now,
            deadline: from + chrono::Duration::minutes(58),
            loss_at: Some(from + chrono::Duration::hours(1)),
            drain_from: Some(from),
            late: None,
            drained: None,
        });
        let asgs = [fresh("a", &[("i-1", "InService")])];
        let nodes = [retiring];
        let before = group_nodes(&nodes, &asgs, now);
        assert!(before[0].ready, "serves on: counts as Ready");
        assert_eq!(before[0].fate, None);
        assert_eq!(before[0].fate_changes, Some(from), "looked at again then");
        let at = group_nodes(&nodes, &asgs, from);
        assert!(!at[0].ready);
        assert!(matches!(at[0].fate, Some(Fate::Reclaimed { .. })));
        assert_eq!(at[0].fate_changes, None);
    }

    #[test]
    fn a_rebalance_recommendation_holds_its_node_at_risk_for_a_while_only() {
        use crate::crd::nodegroup::{AT_RISK_FOR, NodeInterruption};
        let now = chrono::Utc::now();
        let mut at_risk = status_node("at-risk", "a", "i-1");
        at_risk.interruption = Some(NodeInterruption {
            kind: "rebalance_recommendation".into(),
            noticed: now,
            deadline: now + chrono::Duration::seconds(90),
            loss_at: None,
            drain_from: None,
            late: None,
            drained: None,
        });
        let asgs = [fresh("a", &[("i-1", "InService")])];
        let nodes = [at_risk];
        let held = group_nodes(&nodes, &asgs, now);
        assert_eq!(held[0].fate, Some(Fate::AtRisk));
        assert!(!held[0].ready);
        // Past the hold (never replaced, or kept): Ready again, no fate.
        let later = after(now, AT_RISK_FOR);
        assert_eq!(held[0].fate_changes, Some(later), "looked at again then");
        let past = group_nodes(&nodes, &asgs, later);
        assert_eq!(past[0].fate, None);
        assert!(past[0].ready);
        assert_eq!(past[0].fate_changes, None);
    }

    #[test]
    fn a_ready_node_on_an_instance_described_pending_is_named() {
        let mut joining = status_node("joining", "a", "i-2");
        joining.ready = false;
        let nodes = [
            status_node("kept", "a", "i-1"),
            joining,
            status_node("joined", "a", "i-3"),
            status_node("held", "a", "i-4"),
        ];
        let asgs = [fresh(
            "a",
            &[
                ("i-1", "InService"),
                ("i-2", "Pending"),
                ("i-3", "Pending"),
                ("i-4", "Pending:Wait"),
            ],
        )];
        assert_eq!(ready_while_pending(&nodes, &asgs), ["i-3", "i-4"]);
        assert!(ready_while_pending(&nodes[..2], &asgs).is_empty());
        // Described before its launch: named too; one the inventory places
        // in no described ASG (it left its ASG) is not.
        let mut left = status_node("left", "a", "i-6");
        left.auto_scaling_group = None;
        let nodes = [status_node("launched", "a", "i-5"), left];
        assert_eq!(ready_while_pending(&nodes, &asgs), ["i-5"]);
    }
}
