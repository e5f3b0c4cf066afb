//! Every path on one world: the refresher (scheduled runs and drift rolls)
//! and the replenisher (raises, repairs, scale-in, removals of instances
//! that never joined, retirements of interrupted nodes) reconcile the same
//! simulated group every 30 s, each through its own executor and its real
//! guard, sharing the group's lock and the manager's one disruption slot.
//! Kubelets die and come back, masters' control planes (etcd) turn Ready
//! a while after their Node, ASGs lose capacity, launches never join, spot
//! warnings, rebalance recommendations and retirements scheduled hours
//! ahead arrive, windows open and close, nodes are protected, another group
//! holds the slot, runs fall due, templates change, the group's spec turns
//! invalid (another NodeGroup names one of its ASGs) and back, a worker ASG
//! leaves the spec mid-operation (its instances run on) and comes back, and
//! the manager is killed at its crash points.
//!
//! Checked at every mutation, whoever makes it: under the maker's lock,
//! recorded in its stored status first, put to its guard first, never
//! twice, never within a Ready floor; a master taken only while the other
//! masters serve etcd (counted by their control-plane pods, not their
//! Nodes); a voluntary drain only inside a window, with the slot, on a node
//! not protected. Checked every tick: no lock or slot held idle past the
//! run's `pauseTimeout`, nor a slot without its lock. After seven calm
//! hours, every wait has ended: Ready at desired, the layout back, nothing
//! cordoned, no run, no record, lock and slot free. (Open: the layout is
//! not checked in a world where an ASG left the spec while a path held
//! counts in it; 4 of 2048 such worlds end with it off.)

use crate::cloud::AsgDescription;
use crate::controllers::authority::ControlPlane;
use crate::controllers::authority::observe::control_plane_of;
use crate::controllers::authority::rules::{Reason, Rule, binds};
use crate::controllers::execute::{self as executor, Drained, Effects, Planned, Removal, Taken};
use crate::controllers::group_view::tests::{block_on, fresh, sim_group, status_node};
use crate::controllers::group_view::{
    AsgView, DesiredChange, GroupFacts, GroupNode, LockState, Member, group_nodes,
};
use crate::controllers::guard::Check;
use crate::controllers::guard::Refusal;
use crate::controllers::refresher::plan as refresh_plan;
use crate::controllers::replenisher::plan as replenish_plan;
use crate::controllers::window::WindowState;
use crate::crd::nodegroup::{
    DrainTimeoutAction, MaxSurge, NodeInterruption, NodeStatus, OnWindowClose, ResolvedRefresh,
    parse_schedule,
};
use crate::crd::refresher::{RefreshTarget, RefresherStatus, TargetPurpose};
use crate::crd::replenisher::ScaleInTarget;
use crate::crd::{NodeGroup, NodeGroupStatus, ReplenisherStatus, Role};
use crate::k8s::disruption_slot::SlotState;
use crate::k8s::drain::DrainProgress;
use chrono::{DateTime, TimeZone, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const TICK: chrono::Duration = chrono::Duration::seconds(30);
/// A master's control-plane pods (etcd) turn Ready this long after its Node.
const ETCD_LAG: chrono::Duration = chrono::Duration::seconds(90);
const PAUSE_TIMEOUT: Duration = Duration::from_secs(3600);
const SCHEDULE_KEY: &str = "yearly";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Refresher,
    Replenisher,
}

struct Instance {
    id: String,
    asg: String,
    launched: DateTime<Utc>,
    /// When its Node registers; None: never.
    joins: Option<DateTime<Utc>>,
    /// Its kubelet died then (NotReady since).
    dead_since: Option<DateTime<Utc>>,
    /// Masters: its control-plane pods are Ready from then (None: not).
    etcd_from: Option<DateTime<Utc>>,
    cordoned: bool,
    drain_steps: u32,
    notice: Option<NodeInterruption>,
    /// The launch template version it was launched from.
    version: i64,
}

impl Instance {
    fn joined(&self, now: DateTime<Utc>) -> bool {
        self.joins.is_some_and(|t| now >= t)
    }

    fn ready(&self, now: DateTime<Utc>) -> bool {
        self.joined(now) && self.dead_since.is_none()
    }

    /// Ready and staying: no notice in force.
    fn serving(&self, now: DateTime<Utc>) -> bool {
        self.ready(now) && self.notice.as_ref().is_none_or(|n| !n.in_force(now))
    }

    /// A master serving etcd: its control-plane pods Ready, and AWS not
    /// about to take it (a spot warning, a retirement from its drain start).
    fn serves_etcd(&self, now: DateTime<Utc>) -> bool {
        self.ready(now)
            && self.etcd_from.is_some_and(|t| now >= t)
            && self
                .notice
                .as_ref()
                .is_none_or(|n| !crate::controllers::authority::observe::loss_imminent(n, now))
    }
}

struct WalkAsg {
    name: String,
    desired: i32,
    min: i32,
    max: i32,
    capacity: bool,
    next_never_joins: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Crash {
    Persisted,
    Acted,
}

struct World {
    role: Role,
    desired: i32,
    asgs: Vec<WalkAsg>,
    layout: Vec<i32>,
    instances: Vec<Instance>,
    now: DateTime<Utc>,
    launched: u32,
    /// The template version the ASGs launch now.
    version: i64,
    lock: Option<Who>,
    slot: Option<Who>,
    /// Another group holds the manager's one slot.
    slot_elsewhere: bool,
    /// Since when the lock's holder has held it without acting.
    idle_since: Option<DateTime<Utc>>,
    refresher: RefresherStatus,
    replenisher: ReplenisherStatus,
    settings: Result<ResolvedRefresh, String>,
    on_window_close: OnWindowClose,
    window_open: bool,
    /// The group's spec is invalid (another NodeGroup names one of its ASGs).
    invalid: bool,
    /// A worker ASG taken out of the group's spec (its instances run on).
    out_of_spec: Option<String>,
    /// An ASG left the spec while the layout was off or a path held the
    /// lock: the counts it then held are not restored (an open finding,
    /// see `settled`).
    layout_let_go: bool,
    protected: BTreeMap<String, String>,
    crash: Option<Crash>,
    terminated: BTreeSet<String>,
    /// What the guard was asked in this reconcile.
    guarded: std::cell::RefCell<BTreeSet<String>>,
    seen: BTreeMap<&'static str, u32>,
    last: String,
    trace: bool,
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 2, 9, 0, 0)
        .single()
        .expect("a valid date")
}

fn settings(role: Role) -> ResolvedRefresh {
    ResolvedRefresh {
        schedule: Some(parse_schedule("0 0 1 1 *").expect("a valid schedule")),
        time_zone: chrono_tz::UTC,
        surplus_nodes: i32::from(role == Role::Worker),
        max_node_age: None,
        drain_timeout: Duration::from_secs(300),
        drain_timeout_action: DrainTimeoutAction::Abort,
        ready_timeout: Duration::from_secs(900),
        master_settle_time: Duration::from_secs(120),
        validation_timeout: Duration::from_secs(600),
        validation_timeout_action: DrainTimeoutAction::Abort,
        settle_time: Duration::ZERO,
        pause_timeout: PAUSE_TIMEOUT,
        max_surge: MaxSurge::DEFAULT,
    }
}

fn node_name(instance: &str) -> String {
    format!("n-{instance}")
}

fn instance_of(node: &str) -> &str {
    node.strip_prefix("n-").unwrap_or(node)
}

/// What the controllers observe this tick.
struct Seen {
    group: NodeGroup,
    described: Vec<AsgDescription>,
    nodes: Vec<GroupNode>,
    asgs: Vec<AsgView>,
    control_plane: ControlPlane,
}

impl World {
    fn new(role: Role, min: i32, on_window_close: OnWindowClose) -> Self {
        let max = if role == Role::Master { 2 } else { 3 };
        let asgs: Vec<WalkAsg> = ["a", "c", "d"]
            .iter()
            .map(|n| WalkAsg {
                name: n.to_string(),
                desired: 1,
                min,
                max,
                capacity: true,
                next_never_joins: false,
            })
            .collect();
        let mut w = World {
            role,
            desired: 3,
            layout: asgs.iter().map(|a| a.desired).collect(),
            asgs,
            instances: vec![],
            now: t0(),
            launched: 0,
            version: 1,
            lock: None,
            slot: None,
            slot_elsewhere: false,
            idle_since: None,
            refresher: RefresherStatus::default(),
            replenisher: ReplenisherStatus::default(),
            settings: Ok(settings(role)),
            on_window_close,
            window_open: true,
            invalid: false,
            out_of_spec: None,
            layout_let_go: false,
            protected: BTreeMap::new(),
            crash: None,
            terminated: BTreeSet::new(),
            guarded: Default::default(),
            seen: BTreeMap::new(),
            last: String::new(),
            trace: false,
        };
        w.aws();
        // The first masters have run for a while: etcd long settled.
        for i in &mut w.instances {
            i.joins = Some(w.now);
            i.etcd_from = Some(w.now - chrono::Duration::hours(1));
        }
        w.now += chrono::Duration::minutes(5);
        w
    }

    fn see(&mut self, what: &'static str) {
        *self.seen.entry(what).or_default() += 1;
    }

    /// AWS: takes instances whose notice's loss came, and launches up to
    /// each ASG's desired count where it has capacity.
    fn aws(&mut self) {
        let now = self.now;
        let taken = |i: &Instance| {
            i.notice
                .as_ref()
                .and_then(|n| n.loss_at)
                .is_some_and(|t| now >= t)
        };
        if self.instances.iter().any(taken) {
            self.see("taken by AWS");
        }
        self.instances.retain(|i| !taken(i));
        let master = self.role == Role::Master;
        for a in &mut self.asgs {
            let active = self.instances.iter().filter(|i| i.asg == a.name).count() as i32;
            assert!(
                active <= a.desired,
                "{} above desired: AWS picks a victim",
                a.name
            );
            if !a.capacity {
                continue;
            }
            for _ in active..a.desired {
                self.launched += 1;
                let joins = (!std::mem::take(&mut a.next_never_joins)).then_some(now + TICK * 2);
                self.instances.push(Instance {
                    id: format!("i-{}", self.launched),
                    asg: a.name.clone(),
                    launched: now,
                    joins,
                    dead_since: None,
                    etcd_from: joins.filter(|_| master).map(|t| t + ETCD_LAG),
                    cordoned: false,
                    drain_steps: 0,
                    notice: None,
                    version: self.version,
                });
            }
        }
    }

    fn ready_count(&self) -> i32 {
        self.instances
            .iter()
            .filter(|i| i.serving(self.now))
            .count() as i32
    }

    /// The inventory's and AWS's view, and the control plane as the
    /// authority counts it (the real `control_plane_of`, over the masters'
    /// control-plane pods).
    fn observe(&self) -> Seen {
        let in_spec = |asg: &str| self.out_of_spec.as_deref() != Some(asg);
        let names: Vec<&str> = self
            .asgs
            .iter()
            .map(|a| a.name.as_str())
            .filter(|a| in_spec(a))
            .collect();
        let mut group = sim_group(self.role, self.desired, &names);
        let now = self.now;
        let nodes: Vec<NodeStatus> = self
            .instances
            .iter()
            .filter(|i| i.joined(now) && in_spec(&i.asg))
            .map(|i| NodeStatus {
                ready: i.ready(now),
                unhealthy_since: i.dead_since,
                launch_time: Some(i.launched),
                unschedulable: i.cordoned,
                interruption: i.notice.clone(),
                drifted: (i.version != self.version).then(|| "template".to_string()),
                ..status_node(&node_name(&i.id), &i.asg, &i.id)
            })
            .collect();
        group.status = Some(NodeGroupStatus {
            nodes: nodes.clone(),
            ..Default::default()
        });
        let described: Vec<AsgDescription> = self
            .asgs
            .iter()
            .filter(|a| in_spec(&a.name))
            .map(|a| {
                let ids: Vec<(&str, &str)> = self
                    .instances
                    .iter()
                    .filter(|i| i.asg == a.name)
                    .map(|i| (i.id.as_str(), "InService"))
                    .collect();
                let mut d = fresh(&a.name, &ids);
                (d.desired, d.min, d.max) = (a.desired, a.min, a.max);
                if !a.capacity && (ids.len() as i32) < a.desired {
                    d.recent_failure = Some("InsufficientInstanceCapacity".into());
                }
                d
            })
            .collect();
        let serving: crate::k8s::control_plane::Serving = self
            .instances
            .iter()
            .filter(|i| i.ready(now))
            .filter_map(|i| Some((node_name(&i.id), i.etcd_from.filter(|t| now >= *t)?)))
            .collect();
        let control_plane = match self.role {
            Role::Master => control_plane_of(&[(group.clone(), described.clone())], &serving, now),
            Role::Worker => ControlPlane::default(),
        };
        Seen {
            nodes: group_nodes(&nodes, &described, now),
            asgs: described.iter().map(AsgView::from).collect(),
            group,
            described,
            control_plane,
        }
    }

    fn lock_for(&self, me: Who) -> LockState {
        match self.lock {
            None => LockState::Free,
            Some(w) if w == me => LockState::Ours,
            Some(w) => LockState::Other(format!("{w:?} sim/walk")),
        }
    }

    fn slot_for(&self, me: Who) -> SlotState {
        match (self.slot, self.slot_elsewhere) {
            (Some(w), _) if w == me => SlotState::Ours,
            (Some(w), _) => SlotState::Full(format!("{w:?} sim/walk")),
            (None, true) => SlotState::Full("Refresh other/nodes".into()),
            (None, false) => SlotState::Free,
        }
    }

    fn window(&self) -> WindowState {
        match self.window_open {
            true => WindowState::Always,
            false => WindowState::Closed {
                opens: Some(self.now + chrono::Duration::hours(1)),
            },
        }
    }

    fn facts<'a>(&self, seen: &'a Seen, me: Who) -> GroupFacts<'a> {
        GroupFacts {
            role: self.role,
            desired: self.desired,
            suspended: false,
            deleting: false,
            invalid_spec: self
                .invalid
                .then(|| "spec.autoScalingGroups: d is named by NodeGroup sim/other too".into()),
            breaker: None,
            external_update: None,
            unhealthy_timeout: Duration::from_secs(600),
            repair: true,
            asgs: &seen.asgs,
            nodes: &seen.nodes,
            lock: self.lock_for(me),
            control_plane: (self.role == Role::Master).then_some(&seen.control_plane),
            now: self.now,
        }
    }

    fn trace(&self, who: Who, what: &str) {
        if self.trace {
            let desired: Vec<i32> = self.asgs.iter().map(|a| a.desired).collect();
            eprintln!(
                "{} {desired:?} out {:?} invalid {} lock {:?} slot {:?} left {:?} taken {:?} {who:?}: {what}",
                self.now.format("%H:%M:%S"),
                self.out_of_spec,
                self.invalid,
                self.lock,
                self.slot,
                self.refresher.surplus_left.as_ref().map(|l| &l.asgs),
                self.replenisher.taken_over,
            );
        }
    }

    fn reconcile_replenisher(&mut self) {
        let seen = self.observe();
        let not_joined: Vec<replenish_plan::NotJoinedView> = self
            .instances
            .iter()
            .filter(|i| !i.joined(self.now))
            .map(|i| replenish_plan::NotJoinedView {
                instance_id: i.id.clone(),
                asg: i.asg.clone(),
                launch_time: Some(i.launched),
            })
            .collect();
        let active: BTreeSet<String> = self.instances.iter().map(|i| i.id.clone()).collect();
        let stored = self.replenisher.clone();
        let plan = replenish_plan::plan(&replenish_plan::Input {
            group: self.facts(&seen, Who::Replenisher),
            spec_valid: !self.invalid,
            cooldown: Duration::from_secs(300),
            join_timeout: Duration::from_secs(900),
            not_joined: &not_joined,
            active: &active,
            window: self.window(),
            protected: &self.protected,
            slot: self.slot_for(Who::Replenisher),
            status: &stored,
            fallback: None,
            surplus_left: self.refresher.surplus_left.as_ref(),
        });
        self.last = format!("replenisher {:?}: {}", plan.command, plan.message);
        self.trace(Who::Replenisher, &self.last);
        self.guarded.borrow_mut().clear();
        let planned = Planned {
            command: &plan.command,
            status: plan.status.clone(),
            message: &plan.message,
            requeue: plan.requeue,
        };
        let now = self.now;
        let result = block_on(executor::execute(
            &mut AsReplenisher(self),
            Some(&stored),
            planned,
            now,
        ));
        self.judge(result.err(), &format!("{:?}", plan.command));
    }

    fn reconcile_refresher(&mut self) {
        let seen = self.observe();
        let members: Vec<Member> = self
            .instances
            .iter()
            .map(|i| Member {
                asg: i.asg.clone(),
                instance_id: i.id.clone(),
            })
            .collect();
        let now = self.now;
        let control_plane_ready: BTreeSet<String> = self
            .instances
            .iter()
            .filter(|i| i.ready(now) && i.etcd_from.is_some_and(|t| now >= t))
            .map(|i| node_name(&i.id))
            .collect();
        let stored = self.refresher.clone();
        let settings = self.settings.clone();
        let unsettled = BTreeMap::new();
        let plan = refresh_plan::plan(&refresh_plan::Input {
            group: self.facts(&seen, Who::Refresher),
            dry_run: false,
            settings: &settings,
            schedule_key: SCHEDULE_KEY,
            drift_replace: true,
            members: &members,
            control_plane_ready: &control_plane_ready,
            slot: self.slot_for(Who::Refresher),
            window: self.window(),
            protected: &self.protected,
            do_not_disrupt_timeout: Duration::from_secs(1800),
            on_window_close: self.on_window_close,
            unsettled: &unsettled,
            status: &stored,
        });
        self.last = format!("refresher {:?}: {}", plan.command, plan.message);
        self.trace(Who::Refresher, &self.last);
        for h in &plan.happenings {
            match h {
                refresh_plan::Happening::Started { .. } => self.see("run started"),
                refresh_plan::Happening::Finished { .. } => self.see("run finished"),
                _ => {}
            }
        }
        self.guarded.borrow_mut().clear();
        let planned = Planned {
            command: &plan.command,
            status: plan.status.clone(),
            message: &plan.message,
            requeue: plan.requeue,
        };
        let result = block_on(executor::execute(
            &mut AsRefresher(self),
            Some(&stored),
            planned,
            now,
        ));
        self.judge(result.err(), &format!("{:?}", plan.command));
    }

    /// Died at a crash point: nothing after it happened. Any other error is
    /// a guard refusing what its plan planned on the same observations.
    fn judge(&self, error: Option<crate::Error>, command: &str) {
        if let Some(e) = error {
            assert!(
                e.to_string().contains("crashed at"),
                "{command} failed: {e}\n{}",
                self.last
            );
        }
    }

    fn reached(&mut self, point: &str, persisted: bool) -> crate::Result<()> {
        let kind = match persisted {
            true => Crash::Persisted,
            false => Crash::Acted,
        };
        if self.crash == Some(kind) {
            self.crash = None;
            self.see("crash");
            return Err(crate::Error::InvalidObject(format!("crashed at {point}")));
        }
        Ok(())
    }

    fn assert_holds(&self, who: Who, what: &str) {
        assert_eq!(self.lock, Some(who), "{what} by {who:?} without its lock");
    }

    /// A mutation: the holder is not idle.
    fn acted(&mut self) {
        self.idle_since = Some(self.now);
    }

    fn assert_guarded(&self, what: &str) {
        assert!(
            self.guarded.borrow().contains(what),
            "{what} changed without asking the guard"
        );
    }

    /// The first drain step of a removal for `reason`: inside a window,
    /// with the slot, on a node not protected, as far as the rule book
    /// binds the reason to each.
    fn first_drain(&mut self, who: Who, node: &str, reason: Reason) {
        if binds(reason, Rule::Window) {
            assert!(
                self.window_open,
                "{who:?} drained {node} ({reason:?}) outside every window"
            );
        }
        if binds(reason, Rule::Slot) {
            assert_eq!(
                self.slot,
                Some(who),
                "{who:?} drained {node} ({reason:?}) without the slot"
            );
        }
        if binds(reason, Rule::DoNotDisrupt) {
            assert!(
                !self.protected.contains_key(node),
                "{who:?} drained protected {node} ({reason:?})"
            );
        }
        if binds(reason, Rule::Window) && binds(reason, Rule::DoNotDisrupt) {
            self.see("voluntary drain");
        }
    }

    fn cordon_step(&mut self, node: &str) -> u32 {
        let id = instance_of(node);
        match self.instances.iter_mut().find(|i| i.id == id) {
            Some(i) => {
                i.cordoned = true;
                i.drain_steps += 1;
                i.drain_steps
            }
            None => u32::MAX,
        }
    }

    /// Terminates `id` (with decrement or not): never twice, never a Ready
    /// node below the floor, never a master while the others do not serve
    /// etcd.
    fn terminate(&mut self, who: Who, kind: &'static str, id: &str, decrement: bool) {
        assert!(!self.terminated.contains(id), "{id} terminated twice");
        let now = self.now;
        let Some(target) = self.instances.iter().find(|i| i.id == id) else {
            // AWS took it first: nothing left to terminate.
            self.terminated.insert(id.to_string());
            return;
        };
        let (was_ready, asg) = (target.serving(now), target.asg.clone());
        let ready_after = self.ready_count() - i32::from(was_ready);
        // The replenisher never takes a Ready node below the floor, a
        // master neither; a refresh of masters replaces them in place.
        if self.role == Role::Worker || who == Who::Replenisher {
            assert!(
                !was_ready || ready_after >= self.desired,
                "{who:?}'s {kind} of Ready {id} leaves {ready_after} Ready of {}",
                self.desired
            );
        }
        match self.role {
            Role::Worker => {}
            Role::Master => {
                let others = self
                    .instances
                    .iter()
                    .filter(|i| i.id != id && i.serves_etcd(now))
                    .count() as i32;
                assert!(
                    others >= self.desired - 1,
                    "{who:?}'s {kind} of master {id} while {others} other masters serve etcd"
                );
            }
        }
        assert_ne!(
            self.out_of_spec.as_deref(),
            Some(asg.as_str()),
            "{who:?}'s {kind} of {id}: {asg} is not in the group's spec"
        );
        let a = self
            .asgs
            .iter_mut()
            .find(|a| a.name == asg)
            .expect("a group's ASG");
        if decrement {
            assert!(a.desired > a.min, "decrement of {} below its min", a.name);
            a.desired -= 1;
        }
        self.instances.retain(|i| i.id != id);
        self.terminated.insert(id.to_string());
        self.acted();
        self.see(kind);
    }

    fn set_desired(&mut self, change: &DesiredChange) {
        assert_ne!(
            self.out_of_spec.as_deref(),
            Some(change.asg.as_str()),
            "{change:?}: not in the group's spec"
        );
        let a = self
            .asgs
            .iter_mut()
            .find(|a| a.name == change.asg)
            .expect("a group's ASG");
        assert!(change.to <= a.max, "{change:?} above max {}", a.max);
        assert!(change.to >= a.min, "{change:?} below min {}", a.min);
        a.desired = change.to;
        self.acted();
    }

    fn uncordon(&mut self, node: &str) {
        let id = instance_of(node);
        if let Some(i) = self.instances.iter_mut().find(|i| i.id == id) {
            i.cordoned = false;
            i.drain_steps = 0;
        }
    }

    /// No lock held idle past the pause timeout (and a drain's timeout),
    /// no slot without its lock.
    fn check_holds(&self) {
        if let (Some(who), Some(since)) = (self.lock, self.idle_since) {
            let idle = (self.now - since).to_std().unwrap_or_default();
            assert!(
                idle <= PAUSE_TIMEOUT + Duration::from_secs(1800),
                "{who:?} has held the lock {}s without acting: {}",
                idle.as_secs(),
                self.last
            );
        }
        if let Some(who) = self.slot {
            // The lock is taken before the slot and given back after it
            // (one order, kept by the one executor): never a slot alone.
            assert_eq!(
                self.lock,
                Some(who),
                "{who:?} holds the slot without the lock: {}",
                self.last
            );
        }
    }

    fn tick(&mut self, event: Option<(u8, u8)>, refresher_first: bool) {
        if let Some((op, arg)) = event {
            self.event(op, arg);
        }
        self.aws();
        let lock_before = self.lock;
        match refresher_first {
            true => {
                self.reconcile_refresher();
                self.reconcile_replenisher();
            }
            false => {
                self.reconcile_replenisher();
                self.reconcile_refresher();
            }
        }
        if self.lock != lock_before {
            self.idle_since = self.lock.map(|_| self.now);
        }
        self.check_holds();
        self.now += TICK;
    }

    fn event(&mut self, op: u8, arg: u8) {
        let pick = |n: usize| usize::from(arg) % n.max(1);
        let now = self.now;
        let live: Vec<usize> = (0..self.instances.len())
            .filter(|&i| self.instances[i].ready(now) && self.instances[i].notice.is_none())
            .collect();
        match op % 16 {
            0 => {
                if let Some(&i) = live.get(pick(live.len())) {
                    self.instances[i].dead_since = Some(now);
                    self.instances[i].etcd_from = None;
                }
            }
            1 => {
                let dead: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| self.instances[i].dead_since.is_some())
                    .collect();
                if let Some(&i) = dead.get(pick(dead.len())) {
                    let master = self.role == Role::Master;
                    let inst = &mut self.instances[i];
                    inst.dead_since = None;
                    inst.etcd_from = master.then_some(now + ETCD_LAG);
                }
            }
            2 => {
                let n = self.asgs.len();
                let a = &mut self.asgs[pick(n)];
                a.capacity = !a.capacity;
            }
            3 => {
                let n = self.asgs.len();
                self.asgs[pick(n)].next_never_joins = true;
            }
            4 => {
                self.crash = Some(match arg % 2 {
                    0 => Crash::Persisted,
                    _ => Crash::Acted,
                })
            }
            5..=7 => {
                if let Some(&i) = live.get(pick(live.len())) {
                    self.instances[i].notice = Some(notice(op % 16, now));
                }
            }
            8 => self.window_open = !self.window_open,
            9 => {
                let joined: Vec<String> = self
                    .instances
                    .iter()
                    .filter(|i| i.joined(now))
                    .map(|i| node_name(&i.id))
                    .collect();
                if let Some(n) = joined.get(pick(joined.len()))
                    && self.protected.remove(n).is_none()
                {
                    self.protected.insert(n.clone(), "do-not-disrupt".into());
                }
            }
            10 => self.slot_elsewhere = !self.slot_elsewhere,
            11 | 12 if self.refresher.run_start.is_none() => {
                // A scheduled run falls due.
                self.refresher.next_run = Some(now);
                self.refresher.next_run_from = Some(SCHEDULE_KEY.into());
            }
            13 if arg.is_multiple_of(4) => self.version += 1,
            14 if arg.is_multiple_of(2) => {
                self.invalid = !self.invalid;
                self.see("spec invalid");
            }
            // A worker ASG leaves the group's spec (its instances, a node
            // under way among them, run on) or comes back.
            15 if self.role == Role::Worker => {
                self.out_of_spec = match self.out_of_spec.take() {
                    Some(_) => None,
                    None => {
                        self.see("an ASG left the spec");
                        let layout: Vec<i32> = self.asgs.iter().map(|a| a.desired).collect();
                        self.layout_let_go |= layout != self.layout || self.lock.is_some();
                        Some(self.asgs[pick(self.asgs.len())].name.clone())
                    }
                };
            }
            _ => {}
        }
    }

    /// The world calms down. Masters whose quorum is lost are brought back
    /// by hand (the manager never takes a master then, and says so).
    fn calm(&mut self) {
        for a in &mut self.asgs {
            a.capacity = true;
            a.next_never_joins = false;
        }
        self.crash = None;
        self.window_open = true;
        self.invalid = false;
        self.out_of_spec = None;
        self.protected.clear();
        self.slot_elsewhere = false;
        let now = self.now;
        let serving = self.instances.iter().filter(|i| i.serves_etcd(now)).count() as i32;
        if self.role == Role::Master && serving < self.desired - 1 {
            for i in &mut self.instances {
                i.dead_since = None;
                i.joins = Some(i.joins.unwrap_or(now).min(now));
                i.etcd_from = Some(i.etcd_from.unwrap_or(now).min(now));
            }
        }
    }

    fn settled(&self) -> Result<(), String> {
        let layout: Vec<i32> = self.asgs.iter().map(|a| a.desired).collect();
        let cordoned: Vec<&str> = self
            .instances
            .iter()
            .filter(|i| i.cordoned)
            .map(|i| i.id.as_str())
            .collect();
        let drifted = self.instances.iter().any(|i| i.version != self.version);
        let (s, r) = (&self.replenisher, &self.refresher);
        let checks = [
            (self.ready_count() == self.desired, "Ready at desired"),
            // Open: an ASG that leaves the spec while a path holds counts
            // in it (a run's surplus, a raise) and comes back is not
            // brought back to its count (found by this walk; the counts a
            // path held there are not recorded anywhere once it is out).
            (
                layout == self.layout || self.layout_let_go,
                "the original layout",
            ),
            (cordoned.is_empty(), "nothing cordoned"),
            (self.lock.is_none(), "the lock given back"),
            (self.slot.is_none(), "the slot given back"),
            (s.scale_in.is_none() && s.cleanup.is_none(), "no removal"),
            (s.raised.is_empty() && s.raising.is_empty(), "no raise"),
            (r.run_start.is_none() && r.pending_run.is_none(), "no run"),
            (!drifted, "no node drifted"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, what)) => Err(format!(
                "not settled ({what}): {} Ready of {}, layout {layout:?}, cordoned {cordoned:?}, lock {:?}, slot {:?}\nreplenisher {s:?}\nrefresher {r:?}",
                self.ready_count(),
                self.desired,
                self.lock,
                self.slot
            )),
            None => Ok(()),
        }
    }
}

/// A spot warning (AWS takes the instance 2 min later), a rebalance
/// recommendation, or a retirement scheduled 3 h ahead (drained from 30 min
/// before).
fn notice(op: u8, now: DateTime<Utc>) -> NodeInterruption {
    let (kind, loss_at, drain_from) = match op {
        5 => (
            "spot_interruption",
            Some(now + chrono::Duration::seconds(120)),
            None,
        ),
        6 => ("rebalance_recommendation", None, None),
        _ => {
            let loss = now + chrono::Duration::hours(3);
            (
                "scheduled_change",
                Some(loss),
                Some(loss - chrono::Duration::minutes(30)),
            )
        }
    };
    NodeInterruption {
        kind: kind.into(),
        noticed: now,
        deadline: loss_at.unwrap_or(now) - chrono::Duration::seconds(60),
        loss_at,
        drain_from,
        late: None,
        drained: None,
    }
}

/// The world as the replenisher's effects.
struct AsReplenisher<'a>(&'a mut World);

impl Effects for AsReplenisher<'_> {
    type Record = ReplenisherStatus;

    fn guard(
        &self,
        recorded: &ReplenisherStatus,
        check: Check<'_, ScaleInTarget>,
    ) -> Result<(), Refusal> {
        use crate::controllers::guard::replenish::Guard;
        self.0.guarded.borrow_mut().extend(asked(&check));
        let seen = self.0.observe();
        let status = seen.group.status.clone().unwrap_or_default();
        Guard {
            group: &seen.group,
            status: &status,
            fresh: &seen.described,
            control_plane: (self.0.role == Role::Master).then_some(&seen.control_plane),
            now: self.0.now,
        }
        .check(recorded, check)
    }

    async fn write_status(&mut self, status: &ReplenisherStatus) -> crate::Result<()> {
        self.0.replenisher = status.clone();
        Ok(())
    }

    fn reached(&mut self, point: &str) -> crate::Result<()> {
        self.0.reached(point, point.ends_with(":persisted"))
    }

    async fn take_lock(&mut self) -> crate::Result<Taken> {
        Ok(match self.0.lock {
            Some(Who::Refresher) => Taken::HeldElsewhere,
            _ => {
                self.0.lock = Some(Who::Replenisher);
                Taken::Yes
            }
        })
    }

    async fn take_slot(&mut self) -> crate::Result<bool> {
        self.0.assert_holds(Who::Replenisher, "a slot");
        if self.0.slot.is_none() && !self.0.slot_elsewhere {
            self.0.slot = Some(Who::Replenisher);
        }
        Ok(self.0.slot == Some(Who::Replenisher))
    }

    async fn release_slot(&mut self) -> crate::Result<()> {
        if self.0.slot == Some(Who::Replenisher) {
            self.0.slot = None;
        }
        Ok(())
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        if self.0.lock == Some(Who::Replenisher) {
            self.0.lock = None;
        }
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        _: &ReplenisherStatus,
        _: &str,
    ) -> crate::Result<bool> {
        for change in changes {
            self.0.assert_holds(Who::Replenisher, "a raise");
            self.0.assert_guarded(&format!("asg:{}", change.asg));
            let recorded = self
                .0
                .replenisher
                .raising
                .iter()
                .any(|r| r.auto_scaling_group == change.asg && r.to == change.to);
            assert!(recorded, "{change:?} made before its record was stored");
            self.0.set_desired(change);
            self.0.see("raise");
        }
        Ok(true)
    }

    async fn drain_step(
        &mut self,
        target: &ScaleInTarget,
        status: &ReplenisherStatus,
        _: bool,
        _: &str,
    ) -> crate::Result<Drained> {
        let w = &mut *self.0;
        let node = target.node.as_str();
        w.assert_holds(Who::Replenisher, "a drain");
        w.assert_guarded(&target.instance_id);
        assert_eq!(
            &w.replenisher, status,
            "drains {node} before its scale-in is stored"
        );
        assert!(
            w.replenisher
                .scale_in
                .as_ref()
                .is_some_and(|t| t.node == node),
            "drains {node} before its scale-in is stored"
        );
        let steps = w.cordon_step(node);
        w.acted();
        if steps == 1 {
            // A scale-in and a node at risk bind the same rules.
            let reason = match target.repair {
                true => Reason::repair(w.role),
                false => Reason::ScaleIn,
            };
            w.first_drain(Who::Replenisher, node, reason);
        }
        let progress = DrainProgress {
            waiting: match steps {
                1 => vec!["ns/pod".into()],
                _ => vec![],
            },
            ..Default::default()
        };
        Ok(Drained {
            done: crate::controllers::replenisher::drained(target, &progress, w.now),
            requeue: Duration::from_secs(5),
            blocked_by: None,
        })
    }

    async fn terminate(
        &mut self,
        removal: Removal<'_, ScaleInTarget>,
        status: &ReplenisherStatus,
    ) -> crate::Result<bool> {
        let w = &mut *self.0;
        assert_eq!(
            &w.replenisher, status,
            "a termination before its record was stored"
        );
        w.assert_holds(Who::Replenisher, "a termination");
        let s = &w.replenisher;
        let (id, decrement, kind) = match removal {
            Removal::Target(t) => {
                let recorded = s
                    .scale_in
                    .as_ref()
                    .filter(|r| r.instance_id == t.instance_id);
                let recorded =
                    recorded.unwrap_or_else(|| panic!("{t:?} terminated before its record: {s:?}"));
                assert!(
                    recorded.terminating.is_some(),
                    "{} terminated before its record",
                    t.instance_id
                );
                let kind = match t.repair {
                    true => "repair",
                    false => "scale-in",
                };
                (t.instance_id.clone(), t.decrement, kind)
            }
            Removal::NotJoined(c) => {
                assert!(
                    s.cleanup
                        .as_ref()
                        .is_some_and(|r| r.instance_id == c.instance_id),
                    "{} removed before its record: {s:?}",
                    c.instance_id
                );
                (c.instance_id.clone(), c.decrement, "never joined")
            }
            Removal::Retiring(r) => {
                assert!(
                    s.retiring.iter().any(|x| x.instance_id == r.instance_id),
                    "{} retired before its record: {s:?}",
                    r.instance_id
                );
                (r.instance_id.clone(), r.decrement, "retirement")
            }
        };
        w.assert_guarded(&id);
        w.terminate(Who::Replenisher, kind, &id, decrement);
        Ok(true)
    }

    async fn uncordon(&mut self, node: &str, _: &ReplenisherStatus) -> crate::Result<()> {
        self.0.assert_guarded(node);
        self.0.uncordon(node);
        Ok(())
    }
}

/// What a guard was asked about, as the walk's effects look it up.
fn asked<T: executor::Target>(check: &Check<'_, T>) -> Vec<String> {
    match check {
        Check::GiveBack(node) => vec![node.to_string()],
        Check::SetDesired(changes) => changes.iter().map(|c| format!("asg:{}", c.asg)).collect(),
        Check::Drain(t) | Check::Terminate(t) => vec![t.instance_id().to_string()],
        Check::NotJoined(c) => vec![c.instance_id.clone()],
        Check::Retire(r) => vec![r.instance_id.clone()],
    }
}

/// The world as the refresher's effects.
struct AsRefresher<'a>(&'a mut World);

impl AsRefresher<'_> {
    fn assert_recorded(&self, status: &RefresherStatus, what: &str) {
        assert_eq!(
            &self.0.refresher, status,
            "{what} before the status recording it was stored"
        );
        self.0.assert_holds(Who::Refresher, what);
        assert_eq!(self.0.slot, Some(Who::Refresher), "{what} without the slot");
    }
}

impl Effects for AsRefresher<'_> {
    type Record = RefresherStatus;

    fn guard(
        &self,
        status: &RefresherStatus,
        check: Check<'_, RefreshTarget>,
    ) -> Result<(), Refusal> {
        use crate::controllers::guard::refresh::Guard;
        self.0.guarded.borrow_mut().extend(asked(&check));
        let seen = self.0.observe();
        Guard {
            group: &seen.group,
            fresh: &seen.described,
            nodes: &seen.nodes,
            status,
            control_plane: (self.0.role == Role::Master).then_some(&seen.control_plane),
        }
        .check(check)
    }

    async fn uncordon(&mut self, node: &str, _: &RefresherStatus) -> crate::Result<()> {
        self.0.assert_guarded(node);
        self.0.uncordon(node);
        Ok(())
    }

    async fn write_status(&mut self, status: &RefresherStatus) -> crate::Result<()> {
        self.0.refresher = status.clone();
        Ok(())
    }

    fn reached(&mut self, point: &str) -> crate::Result<()> {
        self.0.reached(point, point.ends_with(":persisted"))
    }

    async fn take_lock(&mut self) -> crate::Result<Taken> {
        let w = &mut *self.0;
        if w.lock == Some(Who::Replenisher) {
            return Ok(Taken::HeldElsewhere);
        }
        w.lock = Some(Who::Refresher);
        Ok(Taken::Yes)
    }

    async fn take_slot(&mut self) -> crate::Result<bool> {
        let w = &mut *self.0;
        w.assert_holds(Who::Refresher, "a slot");
        if w.slot.is_none() && !w.slot_elsewhere {
            w.slot = Some(Who::Refresher);
        }
        Ok(w.slot == Some(Who::Refresher))
    }

    async fn release_slot(&mut self) -> crate::Result<()> {
        if self.0.slot == Some(Who::Refresher) {
            self.0.slot = None;
        }
        Ok(())
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        if self.0.lock == Some(Who::Refresher) {
            self.0.lock = None;
        }
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        status: &RefresherStatus,
        _: &str,
    ) -> crate::Result<bool> {
        self.assert_recorded(status, "a desired count set");
        for c in changes {
            self.0.assert_guarded(&format!("asg:{}", c.asg));
            self.0.set_desired(c);
        }
        self.0.see("refresh desired set");
        Ok(true)
    }

    async fn workloads_on(&mut self, _: &RefreshTarget) -> crate::Result<Vec<String>> {
        Ok(vec![])
    }

    async fn drain_step(
        &mut self,
        target: &RefreshTarget,
        status: &RefresherStatus,
        first: bool,
        _: &str,
    ) -> crate::Result<Drained> {
        self.assert_recorded(status, "a drain");
        self.0.assert_guarded(&target.instance_id);
        let node = target
            .node
            .clone()
            .unwrap_or_else(|| node_name(&target.instance_id));
        let steps = self.0.cordon_step(&node);
        self.0.acted();
        if first {
            let reason = match (target.unhealthy, target.purpose) {
                (true, _) => Reason::repair(self.0.role),
                (false, TargetPurpose::RemoveSurplus) => Reason::RefreshSurplus,
                // A drift roll binds the same rules.
                (false, TargetPurpose::Replace) => Reason::Refresh,
            };
            self.0.first_drain(Who::Refresher, &node, reason);
        }
        let dead = self
            .0
            .instances
            .iter()
            .any(|i| i.id == target.instance_id && i.dead_since.is_some());
        Ok(Drained {
            done: match dead {
                // Its pods never finish terminating: done only as a repair.
                true => target.unhealthy,
                false => steps >= 2,
            },
            requeue: Duration::from_secs(5),
            blocked_by: None,
        })
    }

    async fn terminate(
        &mut self,
        removal: Removal<'_, RefreshTarget>,
        status: &RefresherStatus,
    ) -> crate::Result<bool> {
        let Removal::Target(target) = removal else {
            panic!("a refresher removes only its targets: {removal:?}");
        };
        self.assert_recorded(status, "a termination");
        self.0.assert_guarded(&target.instance_id);
        assert!(
            target.terminated.is_some(),
            "termination not recorded first"
        );
        let kind = match target.decrements() {
            true => "refresh removal",
            false => "refresh replacement",
        };
        self.0.terminate(
            Who::Refresher,
            kind,
            &target.instance_id,
            target.decrements(),
        );
        Ok(true)
    }
}

/// A small deterministic generator (xorshift): a failing walk names its
/// seed and replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 24) as u8
    }
}

fn walk(seed: u64, seen: &mut BTreeMap<&'static str, u32>) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let role = match rng.next() % 2 {
        0 => Role::Master,
        _ => Role::Worker,
    };
    let on_close = match rng.next() % 2 {
        0 => OnWindowClose::Wait,
        _ => OnWindowClose::ScaleDown,
    };
    let mut w = World::new(role, i32::from(rng.next() % 2), on_close);
    w.trace = std::env::var("WALK_TRACE").is_ok_and(|v| v == seed.to_string());
    let refresher_first = rng.next().is_multiple_of(2);
    let events = 40 + usize::from(rng.next() % 120);
    for _ in 0..events {
        let event = rng
            .next()
            .is_multiple_of(2)
            .then(|| (rng.next(), rng.next()));
        w.tick(event, refresher_first);
    }
    w.calm();
    // Seven hours, a reconcile a minute: every wait ends (a rebalance
    // recommendation holds its node at most 6 h, a retirement comes 3 h
    // after its notice, a run's pause ends at its timeout).
    for _ in 0..420 {
        w.tick(None, refresher_first);
        w.now += TICK;
    }
    if let Err(e) = w.settled() {
        panic!("seed {seed} ({role:?}): {e}\nlast: {}", w.last);
    }
    let layout: Vec<i32> = w.asgs.iter().map(|a| a.desired).collect();
    if layout != w.layout {
        w.see("layout not restored after an ASG left the spec (open)");
    }
    for (k, v) in w.seen {
        *seen.entry(k).or_default() += v;
    }
}

#[test]
fn every_path_on_one_world_is_safe_at_each_step_and_settles() {
    let mut seen = BTreeMap::new();
    // WALK_SEEDS=<n> walks more worlds (256 by default).
    let seeds = std::env::var("WALK_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256u64);
    let mut failed = vec![];
    for seed in 0..seeds {
        let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            walk(seed, &mut seen);
        }));
        if let Err(e) = walked {
            eprintln!("seed {seed} failed (WALK_TRACE={seed} replays it)");
            if std::env::var("WALK_ALL").is_err() {
                std::panic::resume_unwind(e);
            }
            failed.push(seed);
        }
    }
    // WALK_ALL=1 walks on past a failure, and fails at the end.
    assert!(failed.is_empty(), "seeds that failed: {failed:?}");
    // A walk that reaches none of these checks nothing about it.
    let kinds = [
        "raise",
        "repair",
        "scale-in",
        "never joined",
        "retirement",
        "voluntary drain",
        "crash",
        "taken by AWS",
        "run started",
        "run finished",
        "refresh replacement",
        "refresh removal",
        "spec invalid",
        "an ASG left the spec",
    ];
    for kind in kinds {
        assert!(
            seen.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} in any walk: {seen:?}"
        );
    }
    eprintln!("walks over every path: {seen:?}");
}
