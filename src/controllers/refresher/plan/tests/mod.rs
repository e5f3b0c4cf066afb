mod batches;
mod disruption;
mod drift;
mod failures;
mod liveness;
mod masters;
mod observed;
mod pauses;
mod previews;
mod restarts;
mod runs;
mod schedule;
mod skips;
mod surge;
mod validation;

use super::*;
use crate::controllers::execute::{Drained, Effects, Planned, Taken, execute};
use crate::controllers::group_view::AsgView;
use crate::controllers::group_view::DesiredChange;
use crate::crd::Role;
use crate::crd::nodegroup::{DrainTimeoutAction, parse_schedule};
use chrono::TimeZone;
use proptest::prelude::*;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

fn settings(schedule: &str, zone: &str, surplus: i32) -> ResolvedRefresh {
    ResolvedRefresh {
        schedule: Some(parse_schedule(schedule).expect("schedule")),
        time_zone: zone.parse().expect("zone"),
        surplus_nodes: surplus,
        max_node_age: None,
        drain_timeout: Duration::from_secs(300),
        drain_timeout_action: DrainTimeoutAction::Abort,
        ready_timeout: Duration::from_secs(900),
        master_settle_time: Duration::from_secs(10),
        validation_timeout: Duration::from_secs(600),
        validation_timeout_action: DrainTimeoutAction::Abort,
        settle_time: Duration::ZERO,
        pause_timeout: Duration::from_secs(3600),
        max_surge: crate::crd::nodegroup::MaxSurge::DEFAULT,
    }
}

/// What the simulated budget says when it refuses an eviction.
const STUCK_BY: &str = "The disruption budget web needs 3 healthy pods and has 3 currently";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    /// After persisting the planned status, before acting.
    BeforeAction,
    /// After a finished drain's termination is recorded, before the call.
    BeforeTermination,
}

#[derive(Debug, Clone)]
struct Instance {
    id: String,
    asg: String,
    launched: DateTime<Utc>,
    joined: bool,
    ready: bool,
    cordoned: bool,
    /// The launch template version it was launched from.
    version: i64,
}

#[derive(Debug, Clone)]
struct SimAsg {
    name: String,
    desired: i32,
    max: i32,
    launching: bool,
    suspended: Vec<String>,
}

/// A group and its ASGs as the plan would observe them, driven the way the
/// reconcile drives the plan: persist the status, then act (or crash).
#[derive(Debug, Clone)]
struct Sim {
    now: DateTime<Utc>,
    role: Role,
    desired: i32,
    suspended: bool,
    /// The NodeGroup has a deletionTimestamp.
    deleting: bool,
    dry_run: bool,
    /// The group's circuit breaker, when open.
    breaker: Option<String>,
    /// The group's ExternalUpdate condition (a kops rolling update), when True.
    external_update: Option<String>,
    settings: Result<ResolvedRefresh, String>,
    key: String,
    asgs: Vec<SimAsg>,
    instances: Vec<Instance>,
    next_id: u32,
    status: RefresherStatus,
    lock: LockState,
    /// The manager-wide disruption slot.
    slot: SlotState,
    /// Slots the executor took and gave back (with the lock or alone).
    slot_takes: usize,
    slot_gives: usize,
    /// The last step's plan was made without the lock: the executor took
    /// it and carried out nothing of the plan.
    took_lock: bool,
    /// The maintenance windows.
    window: WindowState,
    /// Protected nodes (by node name), and how long a run waits for them.
    protected: std::collections::BTreeMap<String, String>,
    do_not_disrupt_timeout: Duration,
    on_window_close: OnWindowClose,
    /// The controllers of the pods on every node (what a drain moves).
    workloads: Vec<String>,
    /// Workloads whose pods are not all back, with why.
    unsettled: std::collections::BTreeMap<String, String>,
    /// Nodes cordoned by someone else.
    unschedulable: BTreeSet<String>,
    /// Drains of these nodes never finish (a PodDisruptionBudget).
    stuck: Vec<String>,
    /// Nodes whose kubelet died a day ago: NotReady, and their pods never
    /// finish terminating (a drain of such a node finishes only as a
    /// best-effort one, once every deletion is asked).
    dead: Vec<String>,
    /// Masters whose control-plane pods are not Ready.
    control_plane_down: BTreeSet<String>,
    /// Every Master group sets `disruption.allowControlPlaneOutage`.
    outage_allowed: bool,
    /// Masters as kops runs them: each ASG's first instance still there
    /// holds its place's etcd volume; one beside it is no member, shows no
    /// Ready control-plane pods and is counted `Beside`.
    etcd_places: bool,
    /// Why the NodeGroup's spec is invalid, when it is.
    invalid_spec: Option<String>,
    invalid_pause: std::time::Duration,
    /// Masters of other Master groups: their places, and those down.
    masters_elsewhere: crate::controllers::authority::ControlPlane,
    /// Drain steps taken per node: a drain finishes on step
    /// `drain_length + 1` (its second, by default).
    drain_steps: Vec<String>,
    drain_length: usize,
    terminated: Vec<String>,
    happenings: Vec<Happening>,
    /// The plan's happenings, told once its status is stored.
    announcing: Vec<Happening>,
    actions: Vec<Command>,
    /// Ready nodes right after each of our terminations of a Ready node
    /// (removing one that is not Ready costs no Ready node).
    ready_after_terminations: Vec<i32>,
    /// Each ASG's desired count when each run started.
    layouts: Vec<Vec<(String, i32)>>,
    /// Where the manager dies in the reconcile being carried out.
    crash: Option<Crash>,
    /// `drift.action: Replace`.
    drift_replace: bool,
    /// The template version the ASGs launch now; an instance launched from
    /// another is drifted.
    version: i64,
}

impl Sim {
    /// `per_asg` Ready nodes in each of `asgs` ASGs, launched a day ago.
    fn new(role: Role, asgs: usize, per_asg: i32, surplus: i32) -> Sim {
        let now = utc(2026, 6, 1, 12, 0);
        let mut sim = Sim {
            now,
            role,
            desired: asgs as i32 * per_asg,
            suspended: false,
            deleting: false,
            dry_run: false,
            breaker: None,
            external_update: None,
            settings: Ok(settings("0 12 * * *", "UTC", surplus)),
            key: "daily".into(),
            asgs: (0..asgs)
                .map(|i| SimAsg {
                    name: format!("asg-{i}"),
                    desired: per_asg,
                    max: per_asg + 3,
                    launching: true,
                    suspended: vec![],
                })
                .collect(),
            instances: vec![],
            next_id: 0,
            status: RefresherStatus {
                next_run: Some(now),
                next_run_from: Some("daily".into()),
                ..Default::default()
            },
            lock: LockState::Free,
            slot: SlotState::Free,
            slot_takes: 0,
            slot_gives: 0,
            took_lock: false,
            window: WindowState::Always,
            protected: Default::default(),
            do_not_disrupt_timeout: Duration::ZERO,
            on_window_close: OnWindowClose::Wait,
            workloads: vec![],
            unsettled: Default::default(),
            unschedulable: BTreeSet::new(),
            stuck: vec![],
            dead: vec![],
            control_plane_down: BTreeSet::new(),
            outage_allowed: false,
            etcd_places: false,
            invalid_spec: None,
            invalid_pause: crate::crd::nodegroup::DEFAULT_PAUSE_TIMEOUT,
            masters_elsewhere: Default::default(),
            drain_steps: vec![],
            drain_length: 1,
            terminated: vec![],
            happenings: vec![],
            announcing: vec![],
            actions: vec![],
            ready_after_terminations: vec![],
            layouts: vec![],
            crash: None,
            drift_replace: false,
            version: 1,
        };
        sim.launch(now - chrono::Duration::days(1));
        for i in &mut sim.instances {
            i.joined = true;
            i.ready = true;
        }
        sim
    }

    fn node_name(id: &str) -> String {
        format!("node-{id}")
    }

    /// The ASGs launch up to their desired count (when they can).
    fn launch(&mut self, at: DateTime<Utc>) {
        for asg in self.asgs.clone() {
            let have = self.instances.iter().filter(|i| i.asg == asg.name).count() as i32;
            if !asg.launching {
                continue;
            }
            for _ in have..asg.desired {
                self.next_id += 1;
                self.instances.push(Instance {
                    id: format!("i-{:03}", self.next_id),
                    asg: asg.name.clone(),
                    launched: at,
                    joined: false,
                    ready: false,
                    cordoned: false,
                    version: self.version,
                });
            }
        }
    }

    fn ready_count(&self) -> i32 {
        self.instances.iter().filter(|i| i.ready).count() as i32
    }

    fn views(&self) -> (Vec<AsgView>, Vec<Member>, Vec<GroupNode>) {
        let asgs = self
            .asgs
            .iter()
            .map(|a| AsgView {
                name: a.name.clone(),
                desired: a.desired,
                min: 0,
                max: a.max,
                instances: self.instances.iter().filter(|i| i.asg == a.name).count() as i32,
                launching: a.launching,
                suspended_processes: a.suspended.clone(),
                ..Default::default()
            })
            .collect();
        // As observed: only the ASGs the group names are described.
        let listed = |i: &&Instance| self.asgs.iter().any(|a| a.name == i.asg);
        let members = self
            .instances
            .iter()
            .filter(listed)
            .map(|i| Member {
                asg: i.asg.clone(),
                instance_id: i.id.clone(),
            })
            .collect();
        let nodes = self
            .instances
            .iter()
            .filter(listed)
            .filter(|i| i.joined)
            .map(|i| {
                let dead = self.dead.contains(&Sim::node_name(&i.id));
                GroupNode {
                    name: Sim::node_name(&i.id),
                    instance_id: Some(i.id.clone()),
                    asg: Some(i.asg.clone()),
                    ready: i.ready && !dead,
                    launch_time: Some(i.launched),
                    unhealthy_since: dead.then(|| self.now - chrono::Duration::days(1)),
                    fate: None,
                    fate_changes: None,
                    drifted: i.version != self.version,
                    unschedulable: self.unschedulable.contains(&Sim::node_name(&i.id)),
                }
            })
            .collect();
        (asgs, members, nodes)
    }

    fn plan(&self) -> Plan {
        self.with_input(plan)
    }

    /// The cluster's masters: this group's, and those elsewhere.
    fn control_plane(&self, nodes: &[GroupNode]) -> crate::controllers::authority::ControlPlane {
        let mut control_plane = crate::controllers::authority::tests::of_nodes(self.desired, nodes);
        for id in self.beside() {
            if control_plane.ready.remove(&id) {
                control_plane
                    .down
                    .push(crate::controllers::authority::MasterDown {
                        group: "masters".into(),
                        instance: Some(id),
                        why: crate::controllers::authority::DownWhy::Beside,
                    });
            }
        }
        let elsewhere = &self.masters_elsewhere;
        control_plane.expected += elsewhere.expected;
        control_plane.ready.extend(elsewhere.ready.iter().cloned());
        control_plane.down.extend(elsewhere.down.iter().cloned());
        control_plane.outage_allowed = self.outage_allowed;
        control_plane
    }

    /// What the preview says now, the windows at each instant per `window_at`.
    fn preview(
        &self,
        window_at: &dyn Fn(DateTime<Utc>) -> WindowState,
    ) -> Option<crate::crd::next::NextDisruption> {
        self.with_input(|input| preview(input, window_at))
    }

    /// With `etcd_places`: the instances beside their place's member.
    fn beside(&self) -> Vec<String> {
        if !self.etcd_places {
            return vec![];
        }
        let mut first_of = BTreeSet::new();
        self.instances
            .iter()
            .filter(|i| !first_of.insert(i.asg.clone()))
            .map(|i| i.id.clone())
            .collect()
    }

    /// `f` on the plan's input as the reconcile would observe this group.
    fn with_input<R>(&self, f: impl FnOnce(&Input) -> R) -> R {
        let (asgs, members, nodes) = self.views();
        let beside: Vec<String> = self.beside().iter().map(|id| Sim::node_name(id)).collect();
        let control_plane_ready: BTreeSet<String> = nodes
            .iter()
            .map(|n| n.name.clone())
            .filter(|n| !self.control_plane_down.contains(n) && !beside.contains(n))
            .collect();
        let control_plane = self.control_plane(&nodes);
        f(&Input {
            group: GroupFacts {
                role: self.role,
                desired: self.desired,
                suspended: self.suspended,
                deleting: self.deleting,
                invalid_spec: self.invalid_spec.clone(),
                breaker: self.breaker.clone(),
                external_update: self.external_update.clone(),
                unhealthy_timeout: Duration::from_secs(600),
                repair: true,
                asgs: &asgs,
                nodes: &nodes,
                lock: self.lock.clone(),
                control_plane: (self.role == Role::Master).then_some(&control_plane),
                now: self.now,
            },
            dry_run: self.dry_run,
            settings: &self.settings,
            invalid_pause: self.invalid_pause,
            schedule_key: &self.key,
            drift_replace: self.drift_replace,
            members: &members,
            control_plane_ready: &control_plane_ready,
            rules: crate::controllers::book::Book::new(
                self.window.clone(),
                &self.protected,
                self.slot.clone(),
            ),
            do_not_disrupt_timeout: self.do_not_disrupt_timeout,
            on_window_close: self.on_window_close,
            unsettled: &self.unsettled,
            status: &self.status,
        })
    }

    /// One reconcile. `crash`: the manager dies right after persisting
    /// the status, before the action (or, for a finished drain, after
    /// recording the termination and before making it).
    fn step(&mut self, crash: bool) -> Plan {
        self.step_with(if crash {
            Some(Crash::BeforeAction)
        } else {
            None
        })
    }

    /// One reconcile through the controller's own executor, with this
    /// simulated group as its effects; `crash` makes it die at that point.
    fn step_with(&mut self, crash: Option<Crash>) -> Plan {
        let plan = self.plan();
        // Whatever the test: a plan that changes AWS never says it waits on
        // the cluster (the describe cache would share an old description
        // longer), and only a run does.
        assert!(
            !plan.waits_on_cluster
                || (!plan.command.changes_aws() && plan.status.run_start.is_some()),
            "{:?}: {}",
            plan.command,
            plan.message
        );
        let layout = self.layout();
        self.took_lock = false;
        self.actions.push(plan.command.clone());
        self.crash = crash;
        let stored = self.status.clone();
        let now = self.now;
        // Died at a crash point: nothing after it happened. Any other
        // error is the real guard refusing what the plan planned on the
        // same observations: a plan and its guard that disagree.
        self.announcing = plan.happenings.clone();
        let planned = Planned {
            command: &plan.command,
            status: plan.status.clone(),
            message: &plan.message,
            requeue: plan.requeue,
        };
        if let Err(e) = block_on(execute(self, Some(&stored), planned, now)) {
            assert!(
                e.to_string().contains("crashed at"),
                "{:?} failed: {e}\n{}",
                plan.command,
                plan.message
            );
        }
        self.crash = None;
        // A plan the executor only took the lock for was not carried out
        // (the next step plans again, with the lock).
        if self.took_lock {
            self.actions.pop();
        } else if self.status.run_start.is_some() && stored.run_start.is_none() {
            self.layouts.push(layout);
        }
        plan
    }

    /// One step whose plan the executor only takes the group's lock for:
    /// nothing of it written or made.
    fn takes_the_lock(&mut self) -> Plan {
        let (status, layout) = (self.status.clone(), self.layout());
        let plan = self.step(false);
        assert!(self.took_lock, "{:?}: {}", plan.command, plan.message);
        assert_eq!(self.lock, LockState::Ours);
        assert_eq!(self.status, status, "written before the lock was taken");
        assert_eq!(self.layout(), layout, "made before the lock was taken");
        plan
    }

    fn terminate(&mut self, target: &RefreshTarget) {
        assert!(
            !self.terminated.contains(&target.instance_id),
            "{} terminated twice",
            target.instance_id
        );
        let Some(pos) = self
            .instances
            .iter()
            .position(|i| i.id == target.instance_id)
        else {
            return;
        };
        let was_ready = self.instances.remove(pos).ready;
        self.terminated.push(target.instance_id.clone());
        if target.decrements() {
            let asg = self
                .asgs
                .iter_mut()
                .find(|a| a.name == target.auto_scaling_group)
                .expect("asg");
            asg.desired -= 1;
        }
        if was_ready {
            self.ready_after_terminations.push(self.ready_count());
        }
        self.launch(self.now);
    }

    fn all_join_and_ready(&mut self) {
        for i in &mut self.instances {
            i.joined = true;
            i.ready = true;
        }
    }

    /// One master of another group, down (NotReady) or Ready.
    fn master_elsewhere(&mut self, down: bool) {
        use crate::controllers::authority::{ControlPlane, DownWhy, MasterDown};
        let id = "i-elsewhere".to_string();
        self.masters_elsewhere = ControlPlane {
            expected: 1,
            ready: match down {
                true => Default::default(),
                false => [id.clone()].into(),
            },
            down: match down {
                true => vec![MasterDown {
                    group: "masters-elsewhere".into(),
                    instance: Some(id),
                    why: DownWhy::NotReady,
                }],
                false => vec![],
            },
            ..Default::default()
        };
    }

    /// `n` reconciles, `secs` apart.
    fn steps(&mut self, n: usize, secs: i64) {
        for _ in 0..n {
            self.step(false);
            self.advance(secs);
        }
    }

    /// The instances' ids, as they are now.
    fn ids(&self) -> Vec<String> {
        self.instances.iter().map(|i| i.id.clone()).collect()
    }

    fn advance(&mut self, secs: i64) {
        self.now += chrono::Duration::seconds(secs);
    }

    /// Steps a master run whose new masters join and turn Ready every
    /// fourth second (a master lags), until `done`, at most `max` steps.
    fn run_masters_until(&mut self, max: usize, done: impl Fn(&Sim) -> bool) {
        for _ in 0..max {
            self.step(false);
            if self.now.timestamp() % 4 == 0 {
                self.all_join_and_ready();
            }
            self.advance(1);
            if done(self) {
                return;
            }
        }
    }

    /// Steps as `run_to_end` does (new nodes Ready at once) until `done`.
    fn run_until(&mut self, done: impl Fn(&Sim) -> bool) {
        for _ in 0..200 {
            if done(self) {
                return;
            }
            self.step(false);
            self.all_join_and_ready();
            self.advance(1);
        }
        panic!("not reached in 200 steps: {:?}", self.status);
    }

    /// Steps (new nodes Ready at once) until the run ends or `max` steps.
    /// Steps until a run has started (the lock, then a slot, taken first).
    fn start_run(&mut self) {
        for _ in 0..5 {
            self.step(false);
            if self.status.run_start.is_some() {
                return;
            }
        }
        panic!("no run started: {:?}", self.status.message);
    }

    fn run_to_end(&mut self, max: usize) {
        for _ in 0..max {
            self.step(false);
            self.all_join_and_ready();
            self.advance(1);
            if self.status.run_start.is_none() && self.status.last_run.is_some() {
                return;
            }
        }
    }

    /// Steps (its replacements launched ahead, joined) until one drains.
    fn steps_until_a_drain(&mut self) {
        for _ in 0..10 {
            let plan = self.step(false);
            if matches!(plan.command, Command::Drain(_)) {
                return;
            }
            self.all_join_and_ready();
            self.advance(1);
        }
        panic!("no drain: {:?}", self.status.message);
    }

    fn original_cordoned(&self) -> usize {
        self.instances
            .iter()
            .filter(|i| i.cordoned && self.status.planned_instances.contains(&i.id))
            .count()
    }

    fn layout(&self) -> Vec<(String, i32)> {
        self.asgs
            .iter()
            .map(|a| (a.name.clone(), a.desired))
            .collect()
    }

    /// One event of the property tests.
    fn apply(&mut self, e: Event) {
        match e {
            Event::Reconcile(crash) => {
                self.step_with(crash);
            }
            Event::NotReady(k) => {
                let ready: Vec<usize> = (0..self.instances.len())
                    .filter(|i| self.instances[*i].ready)
                    .collect();
                if let Some(i) = ready.get(k % ready.len().max(1)) {
                    self.instances[*i].ready = false;
                }
            }
            Event::Join(k) => {
                let waiting: Vec<usize> = (0..self.instances.len())
                    .filter(|i| !self.instances[*i].joined)
                    .collect();
                if let Some(i) = waiting.get(k % waiting.len().max(1)) {
                    self.instances[*i].joined = true;
                }
            }
            Event::Ready(k) => {
                let waiting: Vec<usize> = (0..self.instances.len())
                    .filter(|i| self.instances[*i].joined && !self.instances[*i].ready)
                    .collect();
                if let Some(i) = waiting.get(k % waiting.len().max(1)) {
                    self.instances[*i].ready = true;
                }
            }
            Event::Tick(s) => self.advance(s),
            Event::Breaker(open) => {
                self.breaker = open.then(|| "2 of 3 node(s) NotReady".to_string());
            }
            Event::Dies(k) => {
                let alive: Vec<String> = self
                    .instances
                    .iter()
                    .map(|i| Sim::node_name(&i.id))
                    .filter(|n| !self.dead.contains(n))
                    .collect();
                if let Some(n) = alive.get(k % alive.len().max(1)) {
                    self.dead.push(n.clone());
                }
            }
            Event::Recover => self.dead.clear(),
            Event::MasterElsewhere(down) => self.master_elsewhere(down),
            Event::Window(open) => {
                let then = self.now + chrono::Duration::hours(1);
                self.window = match open {
                    true => WindowState::Open { closes: then },
                    false => WindowState::Closed { opens: Some(then) },
                };
            }
        }
    }

    fn result(&self) -> Option<(RunResult, Option<String>)> {
        self.status
            .last_run
            .as_ref()
            .map(|r| (r.result, r.reason.clone()))
    }
}

use crate::controllers::group_view::tests::block_on;

impl Sim {
    /// Persist, then act: a mutation comes after the status recording it is
    /// stored, and only under the group's lock and a slot (which the
    /// executor takes itself).
    fn assert_persisted_and_locked(&self, status: &RefresherStatus) {
        assert_eq!(&self.status, status, "acted before persisting its status");
        assert_eq!(self.lock, LockState::Ours, "mutation without the lock");
        assert_eq!(
            self.slot,
            SlotState::Ours,
            "mutation without a disruption slot"
        );
    }
}

/// The simulated group as the executor's effects: the executor asks the
/// real guard (`observed.rs`) before each mutation; what the cluster itself
/// would refuse or reveal (the lock, a persisted status) is asserted here.
impl Effects for Sim {
    type Record = RefresherStatus;

    fn guard(
        &self,
        status: &RefresherStatus,
        check: crate::controllers::guard::refresh::Effect<'_>,
    ) -> Result<(), crate::controllers::guard::Refusal> {
        self.real_guard(status, check)
    }

    async fn uncordon(&mut self, node: &str, _: &RefresherStatus) -> crate::Result<()> {
        if let Some(i) = self
            .instances
            .iter_mut()
            .find(|i| Sim::node_name(&i.id) == node)
        {
            i.cordoned = false;
        }
        Ok(())
    }

    async fn write_status(&mut self, status: &RefresherStatus) -> crate::Result<()> {
        self.status = status.clone();
        Ok(())
    }

    fn reached(&mut self, point: &str) -> crate::Result<()> {
        // A drain's termination, recorded in the same step (a Terminate
        // command's is its step's first point).
        let termination = point == "refresher:terminate:persisted"
            && matches!(self.actions.last(), Some(Command::Drain(_)));
        let crashes = match self.crash {
            Some(Crash::BeforeAction) => point.ends_with(":persisted") && !termination,
            Some(Crash::BeforeTermination) => termination,
            None => false,
        };
        if crashes {
            return Err(crate::Error::InvalidObject(format!("crashed at {point}")));
        }
        Ok(())
    }

    async fn announce(&mut self) {
        let told = std::mem::take(&mut self.announcing);
        self.happenings.extend(told);
    }

    fn lock(&self) -> Option<LockState> {
        Some(self.lock.clone())
    }

    async fn take_lock(&mut self) -> crate::Result<Taken> {
        assert!(
            !matches!(self.lock, LockState::Other(_)),
            "took a held lock"
        );
        self.lock = LockState::Ours;
        self.took_lock = true;
        Ok(Taken::Yes)
    }

    async fn take_slot(&mut self) -> crate::Result<bool> {
        assert_eq!(self.lock, LockState::Ours, "took a slot without the lock");
        if matches!(self.slot, SlotState::Full(_)) {
            return Ok(false);
        }
        self.slot = SlotState::Ours;
        self.slot_takes += 1;
        Ok(true)
    }

    fn holds_slot(&self) -> bool {
        self.slot == SlotState::Ours
    }

    async fn release_slot(&mut self) -> crate::Result<()> {
        if self.slot == SlotState::Ours {
            self.slot = SlotState::Free;
            self.slot_gives += 1;
        }
        Ok(())
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        // As `k8s::lock::release`: another holder's lock stays theirs.
        if self.lock == LockState::Ours {
            self.lock = LockState::Free;
        }
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        status: &RefresherStatus,
        _: &str,
    ) -> crate::Result<bool> {
        // Within max, from the count now, never below the active
        // instances: the executor's real guard checked it just before.
        self.assert_persisted_and_locked(status);
        for c in changes {
            let asg = self.asgs.iter_mut().find(|a| a.name == c.asg).expect("asg");
            asg.desired = c.to;
        }
        self.launch(self.now);
        Ok(true)
    }

    /// A drain finishes on its second step unless the node is stuck.
    async fn workloads_on(&mut self, _: &RefreshTarget) -> crate::Result<Vec<String>> {
        Ok(self.workloads.clone())
    }

    async fn drain_step(
        &mut self,
        target: &RefreshTarget,
        status: &RefresherStatus,
        _: bool,
        _: &str,
    ) -> crate::Result<Drained> {
        self.assert_persisted_and_locked(status);
        let node = target.node.clone().expect("drain of a node");
        let inst = self
            .instances
            .iter_mut()
            .find(|i| Sim::node_name(&i.id) == node)
            .expect("draining a node that exists");
        inst.cordoned = true;
        let steps = self.drain_steps.iter().filter(|n| **n == node).count();
        self.drain_steps.push(node.clone());
        let stuck = self.stuck.contains(&node);
        if self.dead.contains(&node) {
            // Every pod's deletion asked on the first step; none ever ends.
            return Ok(Drained {
                done: target.unhealthy,
                requeue: SOON,
                blocked_by: None,
            });
        }
        Ok(Drained {
            done: !stuck && steps >= self.drain_length,
            requeue: SOON,
            blocked_by: stuck.then(|| STUCK_BY.to_string()),
        })
    }

    async fn terminate(
        &mut self,
        removal: crate::controllers::guard::refresh::Effect<'_>,
        status: &RefresherStatus,
    ) -> crate::Result<bool> {
        let crate::controllers::command::Effect::Terminate(target) = removal else {
            panic!("a refresher removes only its targets: {removal:?}");
        };
        self.assert_persisted_and_locked(status);
        assert!(
            target.terminated.is_some(),
            "termination not recorded first"
        );
        assert!(
            status.batch().any(|t| t == target),
            "termination not the recorded one"
        );
        Sim::terminate(self, target);
        Ok(true)
    }
}

/// What happens to the simulated group between plans.
#[derive(Debug, Clone)]
enum Event {
    /// One reconcile, perhaps with the manager dying in it.
    Reconcile(Option<Crash>),
    /// A node that is not being replaced goes NotReady (and recovers on a later Ready).
    NotReady(usize),
    /// A node joins (not Ready yet).
    Join(usize),
    /// A node becomes Ready.
    Ready(usize),
    /// Time passes (seconds).
    Tick(i64),
    /// The maintenance windows open (true) or close, for an hour.
    Window(bool),
    /// The group's circuit breaker opens (true) or closes: a run pauses.
    Breaker(bool),
    /// A node's kubelet dies for good (NotReady a day already).
    Dies(usize),
    /// Every dead kubelet comes back.
    Recover,
    /// A master of another group goes down (true) or is Ready again.
    MasterElsewhere(bool),
}
