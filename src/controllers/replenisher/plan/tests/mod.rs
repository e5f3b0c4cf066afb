mod guards;
mod launching;
mod layout;
mod not_joined;
mod properties;
mod rule_book;
mod scale_in;
mod scale_up;

use super::*;
use crate::controllers::group_view::{DesiredChange, GroupNode};
use crate::crd::Role;
use crate::crd::replenisher::{AsgCount, AsgSince, NotJoinedRemovals, Raise};
use chrono::TimeZone;
use proptest::prelude::*;

mod fallback;
mod interrupted;
mod next;
mod repair;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 22, 12, 0, 0).unwrap()
}

fn asg(name: &str, desired: i32, instances: i32, max: i32) -> AsgView {
    AsgView {
        name: name.into(),
        desired,
        min: 0,
        max,
        instances,
        ..Default::default()
    }
    .judge(None, t0())
}

/// A plan that holds nothing: only its status is written, and it records
/// nothing the group's lock covers, so the executor gives the lock (and a
/// slot) back after writing it.
#[track_caller]
fn releases(p: &Plan) {
    use crate::controllers::execute::Record;
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    assert!(
        !p.status.keeps_lock(),
        "{:?} keeps the lock: {}",
        p.status.phase,
        p.message
    );
}

/// A plan made without the lock: the executor takes the lock before it
/// carries out anything of it (`execute`'s tests).
#[track_caller]
fn needs_the_lock(p: &Plan) {
    use crate::controllers::execute::Record;
    assert!(
        p.command.mutates() || p.status.keeps_lock(),
        "{:?}: {}",
        p.command,
        p.message
    );
}

const NO_CAPACITY: &str = "Could not launch Spot Instances. InsufficientInstanceCapacity";

/// Its newest launch activity failed.
fn failing(mut a: AsgView) -> AsgView {
    a.launch_failure = Some(NO_CAPACITY.into());
    a.judge(None, t0())
}

fn node(name: &str, asg: &str, ready: bool, minutes_old: i64) -> GroupNode {
    GroupNode {
        name: name.into(),
        instance_id: Some(format!("i-{name}")),
        asg: Some(asg.into()),
        ready,
        launch_time: Some(t0() - chrono::Duration::minutes(minutes_old)),
        unhealthy_since: None,
        fate: None,
        fate_changes: None,
        drifted: false,
        unschedulable: false,
    }
}

/// A node whose Ready condition has not been True for `minutes`.
fn not_ready_for(name: &str, asg: &str, minutes: i64) -> GroupNode {
    GroupNode {
        unhealthy_since: Some(t0() - chrono::Duration::minutes(minutes)),
        ..node(name, asg, false, 600)
    }
}

/// The unhealthy timeout the scenarios run with (the default).
const UNHEALTHY: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Scenario {
    role: Role,
    desired: i32,
    suspend: bool,
    deleting: bool,
    asgs: Vec<AsgView>,
    nodes: Vec<GroupNode>,
    not_joined: Vec<NotJoinedView>,
    lock: LockState,
    status: ReplenisherStatus,
    /// The group's circuit breaker, when open.
    breaker: Option<String>,
    /// The group's ExternalUpdate condition (a kops rolling update), when True.
    external_update: Option<String>,
    /// `replenish.repair`.
    repair: bool,
    /// The maintenance windows.
    window: crate::controllers::window::WindowState,
    /// Nodes protected from voluntary disruption, with why.
    protected: std::collections::BTreeMap<String, String>,
    /// The manager-wide disruption slot; None: held with the lock (as
    /// when a removal took it).
    slot: Option<SlotState>,
    /// Masters: the cluster's control plane; None: this group's masters
    /// alone, as its nodes are.
    control_plane: Option<crate::controllers::authority::ControlPlane>,
    /// `spec.fallback`, resolved.
    fallback: Option<crate::crd::nodegroup::ResolvedFallback>,
}

impl Scenario {
    /// Three ASGs of one node each, all Ready, desired 3, lock ours.
    fn steady() -> Self {
        Self {
            role: Role::Worker,
            desired: 3,
            suspend: false,
            deleting: false,
            asgs: vec![asg("a", 1, 1, 3), asg("c", 1, 1, 3), asg("d", 1, 1, 3)],
            nodes: vec![
                node("na", "a", true, 60),
                node("nc", "c", true, 60),
                node("nd", "d", true, 60),
            ],
            not_joined: vec![],
            lock: LockState::Ours,
            status: ReplenisherStatus::default(),
            breaker: None,
            external_update: None,
            repair: true,
            window: crate::controllers::window::WindowState::Always,
            protected: Default::default(),
            slot: None,
            control_plane: None,
            fallback: None,
        }
    }

    /// The control plane the plan is told of (masters only).
    fn control_plane_view(&self) -> crate::controllers::authority::ControlPlane {
        self.control_plane.clone().unwrap_or_else(|| {
            crate::controllers::authority::tests::of_nodes(self.desired, &self.nodes)
        })
    }

    fn plan(&self) -> Plan {
        self.plan_with(Duration::from_secs(300), Duration::from_secs(900), t0())
    }

    fn plan_with(&self, cooldown: Duration, join_timeout: Duration, now: DateTime<Utc>) -> Plan {
        let control_plane = self.control_plane_view();
        plan(&Input {
            group: GroupFacts {
                role: self.role,
                desired: self.desired,
                suspended: self.suspend,
                deleting: self.deleting,
                invalid_spec: None,
                breaker: self.breaker.clone(),
                external_update: self.external_update.clone(),
                unhealthy_timeout: UNHEALTHY,
                repair: self.repair,
                asgs: &self.asgs,
                nodes: &self.nodes,
                lock: self.lock.clone(),
                control_plane: (self.role == Role::Master).then_some(&control_plane),
                now,
            },
            spec_valid: true,
            cooldown,
            join_timeout,
            not_joined: &self.not_joined,
            active: &self.active(),
            rules: crate::controllers::book::Book::new(
                self.window.clone(),
                &self.protected,
                self.slot_state(),
            ),
            status: &self.status,
            fallback: self.fallback,
            surplus_left: None,
        })
    }

    fn slot_state(&self) -> SlotState {
        match (&self.slot, &self.lock) {
            (Some(slot), _) => slot.clone(),
            (None, LockState::Ours) => SlotState::Ours,
            (None, _) => SlotState::Free,
        }
    }

    /// Every instance with a node or not joined is active in its ASG.
    fn active(&self) -> BTreeSet<String> {
        self.nodes
            .iter()
            .filter_map(|n| n.instance_id.clone())
            .chain(self.not_joined.iter().map(|n| n.instance_id.clone()))
            .collect()
    }

    /// After a shortage: a launched again, c had been raised by one and
    /// its extra node `nc2` is Ready (a surplus to take back).
    fn surplus_in_c(mut self) -> Self {
        self.asgs[1] = asg("c", 2, 2, 3);
        self.nodes.push(node("nc2", "c", true, 5));
        self.status.raised = vec![AsgCount {
            auto_scaling_group: "c".into(),
            count: 1,
        }];
        self
    }

    /// Zone a is short: its node is gone and its launch failed.
    fn shortage_in_a(mut self) -> Self {
        self.asgs[0] = failing(asg("a", 1, 0, 3));
        self.nodes.retain(|n| n.name != "na");
        self
    }
}

fn input_of<'a>(s: &'a Scenario, active: &'a BTreeSet<String>) -> Input<'a> {
    Input {
        group: GroupFacts {
            role: s.role,
            desired: s.desired,
            suspended: s.suspend,
            deleting: s.deleting,
            invalid_spec: None,
            breaker: s.breaker.clone(),
            external_update: s.external_update.clone(),
            unhealthy_timeout: UNHEALTHY,
            repair: s.repair,
            asgs: &s.asgs,
            nodes: &s.nodes,
            lock: s.lock.clone(),
            control_plane: s.control_plane.as_ref(),
            now: t0(),
        },
        spec_valid: true,
        cooldown: Duration::from_secs(300),
        join_timeout: Duration::from_secs(900),
        not_joined: &s.not_joined,
        active,
        rules: crate::controllers::book::Book::new(s.window.clone(), &s.protected, s.slot_state()),
        status: &s.status,
        fallback: s.fallback,
        surplus_left: None,
    }
}

fn never_joined(id: &str, asg: &str, minutes_old: i64) -> NotJoinedView {
    NotJoinedView {
        instance_id: id.into(),
        asg: asg.into(),
        launch_time: Some(t0() - chrono::Duration::minutes(minutes_old)),
    }
}

/// The same input, at another time.
fn at<'a>(mut input: Input<'a>, now: DateTime<Utc>) -> Input<'a> {
    input.group.now = now;
    input
}
