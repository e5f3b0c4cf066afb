//! Every path on one cluster: the refresher (scheduled runs and drift rolls)
//! and the replenisher (raises, repairs, scale-in, removals of instances
//! that never joined, retirements of interrupted nodes) of every group, and
//! the interruption drainer of every node marked with a loss (`drainer`),
//! reconcile every 30 s, each through the one executor and its real guard,
//! sharing each group's lock and the manager's one disruption slot. A
//! cluster is one Worker group over three ASGs, one Master group over
//! three, or kops's per-zone layout: three Master groups of one ASG each
//! (kops's `control-plane-<zone>` instance groups) beside a Worker group,
//! so the masters' rule is kept across groups.
//! Kubelets die and come back, a master place's etcd member is the one
//! instance holding its volume (its control plane Ready a while after it
//! takes it; an instance beside it, or beside its leaving predecessor,
//! serves nothing), ASGs lose capacity, launches never join, spot
//! warnings, rebalance recommendations and retirements scheduled hours
//! ahead arrive, windows open and close, nodes are protected, another group
//! holds the slot, runs fall due, templates change (every group at once,
//! as `kops update cluster` does), a group's spec turns invalid (another
//! NodeGroup names one of its ASGs) and back, a worker ASG leaves the spec
//! mid-operation (its instances run on) and comes back, and the manager is
//! killed at its crash points.
//!
//! Checked at every mutation, whoever makes it: under the maker's lock,
//! recorded in its stored status first, put to its guard first, never
//! twice, never within a Ready floor; a master taken only while the other
//! masters of the cluster serve etcd (counted by their control-plane pods,
//! not their Nodes), and a master that serves etcd only with the slot (so
//! two groups never take one each at once); a voluntary drain only inside
//! a window, with the slot, on a node not protected. Checked every tick: no
//! lock or slot held idle past the run's `pauseTimeout`, nor a slot without
//! its lock. After seven calm hours, every wait has ended: in every group
//! Ready at desired, the layout back, nothing cordoned, no run, no record,
//! lock and slot free. (Open: the layout is not checked in a world where an
//! ASG left the spec while a path held counts in it; 4 of 2048 such worlds
//! end with it off.)

mod drainer;
mod effects;
mod run;

use crate::cloud::AsgDescription;
use crate::controllers::authority::ControlPlane;
use crate::controllers::authority::observe::control_plane_of;
use crate::controllers::authority::rules::{Reason, Rule, binds};
use crate::controllers::authority::validate::Scene;
use crate::controllers::execute::{self as executor, Planned};
use crate::controllers::group_view::tests::{block_on, fresh, sim_group, status_node};
use crate::controllers::group_view::{
    AsgView, DesiredChange, GroupFacts, GroupNode, LockState, Member, group_nodes,
};
use crate::controllers::refresher::plan as refresh_plan;
use crate::controllers::replenisher::plan as replenish_plan;
use crate::controllers::window::WindowState;
use crate::crd::nodegroup::{
    DrainTimeoutAction, MaxSurge, NodeInterruption, NodeStatus, OnWindowClose, ResolvedRefresh,
    parse_schedule,
};
use crate::crd::refresher::RefresherStatus;
use crate::crd::{NodeGroup, NodeGroupStatus, ReplenisherStatus, Role};
use crate::k8s::disruption_slot::SlotState;
use chrono::{DateTime, TimeZone, Utc};
use effects::{AsRefresher, AsReplenisher};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const TICK: chrono::Duration = chrono::Duration::seconds(30);
/// A master's control-plane pods (etcd) turn Ready this long after it
/// takes its place's volume.
const ETCD_LAG: chrono::Duration = chrono::Duration::seconds(90);
const PAUSE_TIMEOUT: Duration = Duration::from_secs(3600);
const SCHEDULE_KEY: &str = "yearly";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Refresher,
    Replenisher,
}

/// The groups of a walked cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// One Worker group over three ASGs.
    Workers,
    /// One Master group over three ASGs (max 2 each).
    Masters,
    /// kops's per-zone masters: three Master groups of one ASG each (max 1,
    /// as kops makes them, or 2), and a Worker group over three ASGs.
    KopsZones { master_max: i32 },
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
    /// The interruption mark on its Node (the receiver's record, the
    /// drainer's status), and whether the mark's taint is on.
    mark: Option<crate::k8s::interruption_record::Record>,
    tainted: bool,
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

    /// Its notice, as the inventory shows it from the mark.
    fn notice(&self) -> Option<NodeInterruption> {
        self.mark.as_ref().map(|m| m.interruption())
    }

    /// Ready and staying: no notice in force.
    fn serving(&self, now: DateTime<Utc>) -> bool {
        self.ready(now) && self.notice().is_none_or(|n| !n.in_force(now))
    }

    /// A master serving etcd: its control-plane pods Ready, and AWS not
    /// about to take it (a spot warning, a retirement from its drain start).
    fn serves_etcd(&self, now: DateTime<Utc>) -> bool {
        self.ready(now)
            && self.etcd_from.is_some_and(|t| now >= t)
            && self
                .notice()
                .is_none_or(|n| !crate::controllers::authority::observe::loss_imminent(&n, now))
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

/// One NodeGroup: its ASGs, its two controllers' stored statuses, its lock.
struct Group {
    name: String,
    role: Role,
    desired: i32,
    asgs: Vec<WalkAsg>,
    /// The ASGs' desired counts at the start: the layout to come back to.
    layout: Vec<i32>,
    lock: Option<Who>,
    /// Since when the lock's holder has held it without acting.
    idle_since: Option<DateTime<Utc>>,
    refresher: RefresherStatus,
    replenisher: ReplenisherStatus,
    settings: Result<ResolvedRefresh, String>,
    /// The group's spec is invalid (another NodeGroup names one of its ASGs).
    invalid: bool,
    /// A worker ASG taken out of the group's spec (its instances run on).
    out_of_spec: Option<String>,
}

impl Group {
    fn new(name: &str, role: Role, asgs: &[&str], min: i32, max: i32) -> Self {
        let asgs: Vec<WalkAsg> = asgs
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
        Group {
            name: name.into(),
            role,
            desired: asgs.len() as i32,
            layout: asgs.iter().map(|a| a.desired).collect(),
            asgs,
            lock: None,
            idle_since: None,
            refresher: RefresherStatus::default(),
            replenisher: ReplenisherStatus::default(),
            settings: Ok(settings(role)),
            invalid: false,
            out_of_spec: None,
        }
    }

    fn owns(&self, asg: &str) -> bool {
        self.asgs.iter().any(|a| a.name == asg)
    }

    fn in_spec(&self, asg: &str) -> bool {
        self.owns(asg) && self.out_of_spec.as_deref() != Some(asg)
    }

    fn desired_counts(&self) -> Vec<i32> {
        self.asgs.iter().map(|a| a.desired).collect()
    }
}

struct World {
    groups: Vec<Group>,
    instances: Vec<Instance>,
    now: DateTime<Utc>,
    launched: u32,
    /// The template version the ASGs launch now.
    version: i64,
    /// The manager's one disruption slot: which group's path holds it.
    slot: Option<(usize, Who)>,
    /// A group outside the walk holds the manager's one slot.
    slot_elsewhere: bool,
    on_window_close: OnWindowClose,
    window_open: bool,
    protected: BTreeMap<String, String>,
    crash: Option<Crash>,
    terminated: BTreeSet<String>,
    /// What the guard was asked in this reconcile.
    guarded: std::cell::RefCell<BTreeSet<String>>,
    seen: BTreeMap<&'static str, u32>,
    last: String,
    trace: bool,
    /// The plans are told every window open and no node protected: the
    /// executor's check, on the world as it is, is the only gate for those
    /// rules (`blind_plans_are_held_by_the_executors_check_alone`).
    blind: bool,
}

/// What a blind plan is told is protected.
static NOTHING_PROTECTED: BTreeMap<String, String> = BTreeMap::new();

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

/// What a group's controllers observe this tick.
struct Seen {
    group: NodeGroup,
    described: Vec<AsgDescription>,
    nodes: Vec<GroupNode>,
    asgs: Vec<AsgView>,
    control_plane: ControlPlane,
}

/// The owned parts of the rule book's scene of one group and path.
struct SceneParts<'w> {
    role: Role,
    book: crate::controllers::book::Book<'w>,
    stopped: Option<String>,
}

impl SceneParts<'_> {
    fn scene<'a>(&'a self, seen: &'a Seen) -> Scene<'a> {
        self.book.scene(
            self.role,
            (self.role == Role::Master).then_some(&seen.control_plane),
            None,
            self.stopped.as_deref(),
        )
    }
}

impl World {
    fn new(layout: Layout, min: i32, on_window_close: OnWindowClose) -> Self {
        let groups = match layout {
            Layout::Workers => vec![Group::new("nodes", Role::Worker, &["a", "c", "d"], min, 3)],
            Layout::Masters => vec![Group::new(
                "masters",
                Role::Master,
                &["a", "c", "d"],
                min,
                2,
            )],
            Layout::KopsZones { master_max } => {
                let mut groups: Vec<Group> = ["a", "c", "d"]
                    .iter()
                    .map(|z| {
                        let name = format!("control-plane-{z}");
                        Group::new(&name, Role::Master, &[&name], min, master_max)
                    })
                    .collect();
                groups.push(Group::new(
                    "nodes",
                    Role::Worker,
                    &["nodes-a", "nodes-c", "nodes-d"],
                    min,
                    3,
                ));
                groups
            }
        };
        let mut w = World {
            groups,
            instances: vec![],
            now: t0(),
            launched: 0,
            version: 1,
            slot: None,
            slot_elsewhere: false,
            on_window_close,
            window_open: true,
            protected: BTreeMap::new(),
            crash: None,
            terminated: BTreeSet::new(),
            guarded: Default::default(),
            seen: BTreeMap::new(),
            last: String::new(),
            trace: false,
            blind: false,
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

    /// The group an ASG belongs to.
    fn group_of(&self, asg: &str) -> usize {
        self.groups
            .iter()
            .position(|g| g.owns(asg))
            .expect("every ASG belongs to a group")
    }

    fn is_master(&self, i: &Instance) -> bool {
        self.groups[self.group_of(&i.asg)].role == Role::Master
    }

    /// The masters the cluster is to have: every Master group's count.
    fn expected_masters(&self) -> i32 {
        self.groups
            .iter()
            .filter(|g| g.role == Role::Master)
            .map(|g| g.desired)
            .sum()
    }

    /// AWS: takes instances whose notice's loss came, and launches up to
    /// each ASG's desired count where it has capacity.
    fn aws(&mut self) {
        let now = self.now;
        let taken = |i: &Instance| {
            i.mark
                .as_ref()
                .and_then(|m| m.loss_at)
                .is_some_and(|t| now >= t)
        };
        if self.instances.iter().any(taken) {
            self.see("taken by AWS");
        }
        self.instances.retain(|i| !taken(i));
        for g in &mut self.groups {
            for a in &mut g.asgs {
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
                    let joins =
                        (!std::mem::take(&mut a.next_never_joins)).then_some(now + TICK * 2);
                    self.instances.push(Instance {
                        id: format!("i-{}", self.launched),
                        asg: a.name.clone(),
                        launched: now,
                        joins,
                        dead_since: None,
                        // Set once it holds its place's volume (`etcd`).
                        etcd_from: None,
                        cordoned: false,
                        drain_steps: 0,
                        mark: None,
                        tainted: false,
                        version: self.version,
                    });
                }
            }
        }
        self.etcd();
    }

    /// kops's etcd, a member per master place: each master ASG's etcd
    /// volume is held by one instance at a time, its holder until that one
    /// is gone (a leaving holder, terminating or its loss imminent, still
    /// holds it), then the oldest joined instance of the ASG, whose
    /// control-plane pods turn Ready `ETCD_LAG` after it takes the volume.
    /// Any other instance of the place (beside its member, or beside its
    /// leaving predecessor) serves nothing: kops points its kube-apiserver
    /// at the etcd on its own machine.
    fn etcd(&mut self) {
        let now = self.now;
        let asgs: Vec<String> = self
            .groups
            .iter()
            .filter(|g| g.role == Role::Master)
            .flat_map(|g| g.asgs.iter().map(|a| a.name.clone()))
            .collect();
        for asg in asgs {
            let place = |i: &&mut Instance| i.asg == asg;
            let holder = self
                .instances
                .iter()
                .filter(|i| i.asg == asg && i.etcd_from.is_some())
                .min_by_key(|i| (i.launched, i.id.clone()))
                .map(|i| i.id.clone());
            let holder = holder.or_else(|| {
                self.instances
                    .iter()
                    .filter(|i| i.asg == asg && i.joined(now))
                    .min_by_key(|i| (i.launched, i.id.clone()))
                    .map(|i| i.id.clone())
            });
            for i in self.instances.iter_mut().filter(place) {
                match holder.as_deref() == Some(i.id.as_str()) {
                    true => {
                        i.etcd_from.get_or_insert(now + ETCD_LAG);
                    }
                    false => i.etcd_from = None,
                }
            }
        }
    }

    /// The group's instances (in its spec or not).
    fn members(&self, g: usize) -> impl Iterator<Item = &Instance> {
        let group = &self.groups[g];
        self.instances.iter().filter(move |i| group.owns(&i.asg))
    }

    fn ready_count(&self, g: usize) -> i32 {
        self.members(g).filter(|i| i.serving(self.now)).count() as i32
    }

    /// The group as the inventory and AWS show it: the NodeGroup with its
    /// Nodes in status, and its ASGs' descriptions.
    fn sim(&self, g: usize) -> (NodeGroup, Vec<NodeStatus>, Vec<AsgDescription>) {
        let grp = &self.groups[g];
        let names: Vec<&str> = grp
            .asgs
            .iter()
            .map(|a| a.name.as_str())
            .filter(|a| grp.in_spec(a))
            .collect();
        let mut group = sim_group(grp.role, grp.desired, &names);
        group.metadata.name = Some(grp.name.clone());
        let now = self.now;
        let nodes: Vec<NodeStatus> = self
            .instances
            .iter()
            .filter(|i| i.joined(now) && grp.in_spec(&i.asg))
            .map(|i| NodeStatus {
                ready: i.ready(now),
                unhealthy_since: i.dead_since,
                launch_time: Some(i.launched),
                unschedulable: i.cordoned,
                interruption: i.notice(),
                drifted: (i.version != self.version).then(|| "template".to_string()),
                ..status_node(&node_name(&i.id), &i.asg, &i.id)
            })
            .collect();
        group.status = Some(NodeGroupStatus {
            nodes: nodes.clone(),
            ..Default::default()
        });
        let described: Vec<AsgDescription> = grp
            .asgs
            .iter()
            .filter(|a| grp.in_spec(&a.name))
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
        (group, nodes, described)
    }

    /// The inventory's and AWS's view of group `g`, and the control plane
    /// as the authority counts it (the real `control_plane_of`, over every
    /// Master group and the masters' control-plane pods).
    fn observe(&self, g: usize) -> Seen {
        let (group, nodes, described) = self.sim(g);
        let now = self.now;
        let control_plane = match self.groups[g].role {
            Role::Master => {
                let serving: crate::k8s::control_plane::Serving = self
                    .instances
                    .iter()
                    .filter(|i| i.ready(now))
                    .filter_map(|i| Some((node_name(&i.id), i.etcd_from.filter(|t| now >= *t)?)))
                    .collect();
                let masters: Vec<(NodeGroup, Vec<AsgDescription>)> = (0..self.groups.len())
                    .filter(|&m| self.groups[m].role == Role::Master)
                    .map(|m| {
                        let (group, _, described) = self.sim(m);
                        (group, described)
                    })
                    .collect();
                control_plane_of(&masters, &serving, now)
            }
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

    fn lock_for(&self, g: usize, me: Who) -> LockState {
        match self.groups[g].lock {
            None => LockState::Free,
            Some(w) if w == me => LockState::Ours,
            Some(w) => LockState::Other(format!("{w:?} sim/walk")),
        }
    }

    fn slot_for(&self, g: usize, me: Who) -> SlotState {
        match (self.slot, self.slot_elsewhere) {
            (Some(held), _) if held == (g, me) => SlotState::Ours,
            (Some((o, w)), _) => SlotState::Full(format!("{w:?} sim/{}", self.groups[o].name)),
            (None, true) => SlotState::Full("Refresh other/nodes".into()),
            (None, false) => SlotState::Free,
        }
    }

    /// What the rule book's check sees of group `g` from `me`'s side, as
    /// its plans are told it.
    fn scene_parts(&self, g: usize, me: Who) -> SceneParts<'_> {
        let grp = &self.groups[g];
        SceneParts {
            role: grp.role,
            book: crate::controllers::book::Book::new(
                self.window(),
                &self.protected,
                self.slot_for(g, me),
            ),
            stopped: grp.invalid.then(|| "the NodeGroup spec is invalid".into()),
        }
    }

    /// The rule book as `me`'s plan of group `g` is told it: as it is, or
    /// blind to windows and protection.
    fn plans_book(&self, g: usize, me: Who) -> crate::controllers::book::Book<'_> {
        let slot = self.slot_for(g, me);
        match self.blind {
            true => {
                crate::controllers::book::Book::new(WindowState::Always, &NOTHING_PROTECTED, slot)
            }
            false => crate::controllers::book::Book::new(self.window(), &self.protected, slot),
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

    fn facts<'a>(&self, g: usize, seen: &'a Seen, me: Who) -> GroupFacts<'a> {
        let grp = &self.groups[g];
        GroupFacts {
            role: grp.role,
            desired: grp.desired,
            suspended: false,
            deleting: false,
            invalid_spec: grp.invalid.then(|| {
                "spec.autoScalingGroups: an ASG is named by NodeGroup sim/other too".into()
            }),
            breaker: None,
            external_update: None,
            unhealthy_timeout: Duration::from_secs(600),
            repair: true,
            asgs: &seen.asgs,
            nodes: &seen.nodes,
            lock: self.lock_for(g, me),
            control_plane: (grp.role == Role::Master).then_some(&seen.control_plane),
            now: self.now,
        }
    }

    fn trace(&self, g: usize, who: Who, what: &str) {
        if self.trace {
            let grp = &self.groups[g];
            eprintln!(
                "{} {} {:?} out {:?} invalid {} lock {:?} slot {:?} left {:?} taken {:?} raised {:?} {who:?}: {what}",
                self.now.format("%H:%M:%S"),
                grp.name,
                grp.desired_counts(),
                grp.out_of_spec,
                grp.invalid,
                grp.lock,
                self.slot,
                grp.refresher.surplus_left.as_ref().map(|l| &l.asgs),
                grp.replenisher.taken_over,
                grp.replenisher
                    .raised
                    .iter()
                    .map(|r| (&r.auto_scaling_group, r.count))
                    .collect::<Vec<_>>(),
            );
        }
    }

    fn reconcile_replenisher(&mut self, g: usize) {
        let seen = self.observe(g);
        let not_joined: Vec<replenish_plan::NotJoinedView> = self
            .members(g)
            .filter(|i| !i.joined(self.now))
            .map(|i| replenish_plan::NotJoinedView {
                instance_id: i.id.clone(),
                asg: i.asg.clone(),
                launch_time: Some(i.launched),
            })
            .collect();
        let active: BTreeSet<String> = self.instances.iter().map(|i| i.id.clone()).collect();
        let stored = self.groups[g].replenisher.clone();
        let plan = replenish_plan::plan(&replenish_plan::Input {
            group: self.facts(g, &seen, Who::Replenisher),
            spec_valid: !self.groups[g].invalid,
            cooldown: Duration::from_secs(300),
            join_timeout: Duration::from_secs(900),
            not_joined: &not_joined,
            active: &active,
            rules: self.plans_book(g, Who::Replenisher),
            status: &stored,
            fallback: None,
            surplus_left: self.groups[g].refresher.surplus_left.as_ref(),
        });
        self.last = format!(
            "{} replenisher {:?}: {}",
            self.groups[g].name, plan.command, plan.message
        );
        self.trace(g, Who::Replenisher, &self.last);
        self.guarded.borrow_mut().clear();
        let planned = Planned::of(
            &plan.command,
            plan.status.clone(),
            &plan.message,
            plan.requeue,
        );
        let now = self.now;
        let result = block_on(executor::execute(
            &mut AsReplenisher(self, g),
            Some(&stored),
            planned,
            now,
        ));
        self.judge(result.err(), &format!("{:?}", plan.command));
    }

    fn reconcile_refresher(&mut self, g: usize) {
        let seen = self.observe(g);
        let members: Vec<Member> = self
            .members(g)
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
        let stored = self.groups[g].refresher.clone();
        let settings = self.groups[g].settings.clone();
        let unsettled = BTreeMap::new();
        let plan = refresh_plan::plan(&refresh_plan::Input {
            group: self.facts(g, &seen, Who::Refresher),
            dry_run: false,
            settings: &settings,
            invalid_pause: crate::crd::nodegroup::DEFAULT_PAUSE_TIMEOUT,
            schedule_key: SCHEDULE_KEY,
            drift_replace: true,
            members: &members,
            control_plane_ready: &control_plane_ready,
            rules: self.plans_book(g, Who::Refresher),
            do_not_disrupt_timeout: Duration::from_secs(1800),
            on_window_close: self.on_window_close,
            unsettled: &unsettled,
            status: &stored,
        });
        self.last = format!(
            "{} refresher {:?}: {}",
            self.groups[g].name, plan.command, plan.message
        );
        self.trace(g, Who::Refresher, &self.last);
        for h in &plan.happenings {
            match h {
                refresh_plan::Happening::Started { .. } => self.see("run started"),
                refresh_plan::Happening::Finished { .. } => self.see("run finished"),
                _ => {}
            }
        }
        self.guarded.borrow_mut().clear();
        let planned = Planned::of(
            &plan.command,
            plan.status.clone(),
            &plan.message,
            plan.requeue,
        );
        let result = block_on(executor::execute(
            &mut AsRefresher(self, g),
            Some(&stored),
            planned,
            now,
        ));
        self.judge(result.err(), &format!("{:?}", plan.command));
    }

    /// Died at a crash point: nothing after it happened. Any other error is
    /// a guard refusing what its plan planned on the same observations,
    /// but for a blind plan's window or protection, which the guard alone
    /// keeps.
    fn judge(&mut self, error: Option<crate::Error>, command: &str) {
        if let Some(crate::Error::Refused { check, .. }) = &error
            && self.blind
            && ["refused_window_closed", "refused_protected"].contains(check)
        {
            self.see(check);
            return;
        }
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

    fn assert_holds(&self, g: usize, who: Who, what: &str) {
        assert_eq!(
            self.groups[g].lock,
            Some(who),
            "{what} by {who:?} of {} without its lock",
            self.groups[g].name
        );
    }

    /// A mutation: the holder is not idle.
    fn acted(&mut self, g: usize) {
        self.groups[g].idle_since = Some(self.now);
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
    fn first_drain(&mut self, g: usize, who: Who, node: &str, reason: Reason) {
        if binds(reason, Rule::Window) {
            assert!(
                self.window_open,
                "{who:?} drained {node} ({reason:?}) outside every window"
            );
        }
        if binds(reason, Rule::Slot) {
            assert_eq!(
                self.slot,
                Some((g, who)),
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
    /// etcd, never a master serving etcd without the slot.
    fn terminate(&mut self, g: usize, who: Who, kind: &'static str, id: &str, decrement: bool) {
        assert!(!self.terminated.contains(id), "{id} terminated twice");
        let now = self.now;
        let Some(target) = self.instances.iter().find(|i| i.id == id) else {
            // AWS took it first: nothing left to terminate.
            self.terminated.insert(id.to_string());
            return;
        };
        let (was_ready, asg) = (target.serving(now), target.asg.clone());
        let was_serving_etcd = target.serves_etcd(now);
        let grp = &self.groups[g];
        assert!(grp.owns(&asg), "{} took {id} of {asg}", grp.name);
        let ready_after = self.ready_count(g) - i32::from(was_ready);
        let mut across_zones = false;
        // The replenisher never takes a Ready node below the floor, a
        // master neither; a refresh of masters replaces them in place.
        if grp.role == Role::Worker || who == Who::Replenisher {
            assert!(
                !was_ready || ready_after >= grp.desired,
                "{who:?}'s {kind} of Ready {id} leaves {ready_after} Ready of {} in {}",
                grp.desired,
                grp.name
            );
        }
        if grp.role == Role::Master {
            let masters: Vec<&Instance> = self
                .instances
                .iter()
                .filter(|i| i.id != id && self.is_master(i))
                .collect();
            let others = masters.iter().filter(|i| i.serves_etcd(now)).count() as i32;
            let expected = self.expected_masters();
            assert!(
                others >= expected - 1,
                "{who:?}'s {kind} of master {id} of {} while {others} other masters serve etcd",
                grp.name
            );
            // Checked one at a time here, two groups' decisions are made
            // at once in the manager: the slot keeps them apart.
            if was_serving_etcd {
                assert_eq!(
                    self.slot,
                    Some((g, who)),
                    "{who:?}'s {kind} of master {id} serving etcd without the slot"
                );
            }
            let elsewhere_down = masters
                .iter()
                .any(|i| !grp.owns(&i.asg) && !i.serves_etcd(now));
            across_zones = expected > grp.desired && elsewhere_down;
        }
        assert_ne!(
            grp.out_of_spec.as_deref(),
            Some(asg.as_str()),
            "{who:?}'s {kind} of {id}: {asg} is not in the group's spec"
        );
        let a = self.groups[g]
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
        self.acted(g);
        self.see(kind);
        if across_zones {
            self.see("a zone's master taken, another zone's down");
        }
    }

    fn set_desired(&mut self, g: usize, change: &DesiredChange) {
        let grp = &mut self.groups[g];
        assert!(
            grp.in_spec(&change.asg),
            "{change:?}: not in the spec of {}",
            grp.name
        );
        let a = grp
            .asgs
            .iter_mut()
            .find(|a| a.name == change.asg)
            .expect("a group's ASG");
        assert!(change.to <= a.max, "{change:?} above max {}", a.max);
        assert!(change.to >= a.min, "{change:?} below min {}", a.min);
        a.desired = change.to;
        self.acted(g);
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
        for grp in &self.groups {
            if let (Some(who), Some(since)) = (grp.lock, grp.idle_since) {
                let idle = (self.now - since).to_std().unwrap_or_default();
                assert!(
                    idle <= PAUSE_TIMEOUT + Duration::from_secs(1800),
                    "{who:?} of {} has held the lock {}s without acting: {}",
                    grp.name,
                    idle.as_secs(),
                    self.last
                );
            }
        }
        if let Some((g, who)) = self.slot {
            // The lock is taken before the slot and given back after it
            // (one order, kept by the one executor): never a slot alone.
            assert_eq!(
                self.groups[g].lock,
                Some(who),
                "{who:?} of {} holds the slot without the lock: {}",
                self.groups[g].name,
                self.last
            );
        }
    }

    /// One tick: the event, AWS, then every group's two controllers.
    fn tick(&mut self, event: Option<(u8, u8)>, refresher_first: bool) {
        if let Some((op, arg)) = event {
            self.event(op, arg);
        }
        self.aws();
        for g in 0..self.groups.len() {
            let lock_before = self.groups[g].lock;
            match refresher_first {
                true => {
                    self.reconcile_refresher(g);
                    self.reconcile_replenisher(g);
                }
                false => {
                    self.reconcile_replenisher(g);
                    self.reconcile_refresher(g);
                }
            }
            let grp = &mut self.groups[g];
            if grp.lock != lock_before {
                grp.idle_since = grp.lock.map(|_| self.now);
            }
        }
        self.reconcile_drainers();
        self.check_holds();
        self.now += TICK;
    }
}
