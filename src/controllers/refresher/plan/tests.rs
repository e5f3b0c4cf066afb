use super::*;
use crate::controllers::group_view::DesiredChange;
use crate::controllers::refresher::execute::{
    Drained, Effects, PERSISTED, TERMINATION_PERSISTED, execute,
};
use crate::crd::nodegroup::{DrainTimeoutAction, parse_schedule};
use chrono::TimeZone;
use proptest::prelude::*;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

fn settings(schedule: &str, zone: &str, surplus: i32) -> ResolvedRefresh {
    ResolvedRefresh {
        schedule: parse_schedule(schedule).expect("schedule"),
        time_zone: zone.parse().expect("zone"),
        surplus_nodes: surplus,
        max_node_age: None,
        drain_timeout: Duration::from_secs(300),
        drain_timeout_action: DrainTimeoutAction::Abort,
        ready_timeout: Duration::from_secs(900),
        master_settle_time: Duration::from_secs(10),
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
    settings: Result<ResolvedRefresh, String>,
    key: String,
    asgs: Vec<SimAsg>,
    instances: Vec<Instance>,
    next_id: u32,
    status: RefresherStatus,
    lock: LockState,
    /// Drains of these nodes never finish (a PodDisruptionBudget).
    stuck: Vec<String>,
    /// Masters whose control-plane pods are not Ready.
    control_plane_down: BTreeSet<String>,
    /// Drain steps taken per node: a drain finishes on its second step.
    drain_steps: Vec<String>,
    terminated: Vec<String>,
    happenings: Vec<Happening>,
    actions: Vec<Command>,
    /// Ready nodes right after each of our terminations of a Ready node
    /// (removing one that is not Ready costs no Ready node).
    ready_after_terminations: Vec<i32>,
    /// Each ASG's desired count when each run started.
    layouts: Vec<Vec<(String, i32)>>,
    /// Where the manager dies in the reconcile being carried out.
    crash: Option<Crash>,
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
            stuck: vec![],
            control_plane_down: BTreeSet::new(),
            drain_steps: vec![],
            terminated: vec![],
            happenings: vec![],
            actions: vec![],
            ready_after_terminations: vec![],
            layouts: vec![],
            crash: None,
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
        let members = self
            .instances
            .iter()
            .map(|i| Member {
                asg: i.asg.clone(),
                instance_id: i.id.clone(),
            })
            .collect();
        let nodes = self
            .instances
            .iter()
            .filter(|i| i.joined)
            .map(|i| GroupNode {
                name: Sim::node_name(&i.id),
                instance_id: Some(i.id.clone()),
                asg: Some(i.asg.clone()),
                ready: i.ready,
                launch_time: Some(i.launched),
                fate: None,
            })
            .collect();
        (asgs, members, nodes)
    }

    fn plan(&self) -> Plan {
        let (asgs, members, nodes) = self.views();
        let control_plane_ready: BTreeSet<String> = nodes
            .iter()
            .map(|n| n.name.clone())
            .filter(|n| !self.control_plane_down.contains(n))
            .collect();
        plan(&Input {
            role: self.role,
            desired: self.desired,
            suspended: self.suspended,
            deleting: self.deleting,
            dry_run: self.dry_run,
            breaker: self.breaker.clone(),
            settings: &self.settings,
            schedule_key: &self.key,
            asgs: &asgs,
            members: &members,
            nodes: &nodes,
            control_plane_ready: &control_plane_ready,
            lock: self.lock.clone(),
            status: &self.status,
            now: self.now,
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
        if plan.status.run_start.is_some() && self.status.run_start.is_none() {
            self.layouts.push(
                self.asgs
                    .iter()
                    .map(|a| (a.name.clone(), a.desired))
                    .collect(),
            );
        }
        self.actions.push(plan.command.clone());
        self.crash = crash;
        let stored = self.status.clone();
        let now = self.now;
        // Died at a crash point: nothing after it happened.
        let _ = block_on(execute(self, Some(&stored), &plan, &plan.status, now));
        self.crash = None;
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
        if target.purpose == TargetPurpose::RemoveSurplus {
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

    fn advance(&mut self, secs: i64) {
        self.now += chrono::Duration::seconds(secs);
    }

    /// Steps (new nodes Ready at once) until the run ends or `max` steps.
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
        }
    }

    fn result(&self) -> Option<(RunResult, Option<String>)> {
        self.status
            .last_run
            .as_ref()
            .map(|r| (r.result, r.reason.clone()))
    }
}

/// Polls a future that never waits (the simulated effects are immediate).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

impl Sim {
    /// Persist, then act: a mutation comes after the status recording it is
    /// stored, and only under the group's lock.
    fn assert_persisted_and_locked(&self, status: &RefresherStatus) {
        assert_eq!(&self.status, status, "acted before persisting its status");
        assert_eq!(self.lock, LockState::Ours, "mutation without the lock");
    }
}

/// The simulated group as the executor's effects, with the checks a real
/// cluster and the reconcile's guard would make asserted.
impl Effects for Sim {
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
        let crashes = match self.crash {
            Some(Crash::BeforeAction) => point == PERSISTED,
            Some(Crash::BeforeTermination) => point == TERMINATION_PERSISTED,
            None => false,
        };
        if crashes {
            return Err(crate::Error::InvalidObject(format!("crashed at {point}")));
        }
        Ok(())
    }

    async fn report(&mut self, happenings: &[Happening]) {
        self.happenings.extend(happenings.iter().cloned());
    }

    async fn take_lock(&mut self) -> crate::Result<Duration> {
        assert_eq!(self.lock, LockState::Free, "took a held lock");
        self.lock = LockState::Ours;
        Ok(Duration::ZERO)
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        self.lock = LockState::Free;
        Ok(())
    }

    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        status: &RefresherStatus,
        _: &str,
    ) -> crate::Result<()> {
        self.assert_persisted_and_locked(status);
        for c in changes {
            let active = self.instances.iter().filter(|i| i.asg == c.asg).count() as i32;
            let asg = self.asgs.iter_mut().find(|a| a.name == c.asg).expect("asg");
            assert_eq!(asg.desired, c.from, "planned from a stale count");
            assert!(c.to <= asg.max, "above max");
            assert!(
                c.to >= active,
                "lowering desired would make the ASG pick a victim"
            );
            asg.desired = c.to;
        }
        self.launch(self.now);
        Ok(())
    }

    /// A drain finishes on its second step unless the node is stuck.
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
        Ok(Drained {
            done: !stuck && steps >= 1,
            requeue: SOON,
            blocked_by: stuck.then(|| STUCK_BY.to_string()),
        })
    }

    async fn terminate(
        &mut self,
        target: &RefreshTarget,
        status: &RefresherStatus,
    ) -> crate::Result<()> {
        self.assert_persisted_and_locked(status);
        assert!(
            target.terminated.is_some(),
            "termination not recorded first"
        );
        assert_eq!(
            status.current_target.as_ref(),
            Some(target),
            "termination not the recorded one"
        );
        Sim::terminate(self, target);
        Ok(())
    }
}

#[test]
fn a_plan_that_needs_no_observation_does_not_depend_on_it() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.status.next_run = Some(sim.now + chrono::Duration::hours(1));
    assert!(!needs_observation(Some(&sim.status), &sim.key, sim.now));
    let with = sim.plan();
    sim.instances.clear();
    sim.asgs.clear();
    let without = sim.plan();
    assert_eq!(with, without);
    // Due, running, or a new schedule: observations are needed.
    assert!(needs_observation(
        Some(&sim.status),
        &sim.key,
        sim.now + chrono::Duration::hours(1)
    ));
    assert!(needs_observation(Some(&sim.status), "edited", sim.now));
    sim.status.run_start = Some(sim.now);
    assert!(needs_observation(Some(&sim.status), &sim.key, sim.now));
    assert!(needs_observation(None, &sim.key, sim.now));
}

#[test]
fn a_worker_refresh_replaces_every_node_and_restores_the_layout() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let original: Vec<String> = sim.instances.iter().map(|i| i.id.clone()).collect();
    let layout = sim.layout();
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    let mut terminated = sim.terminated.clone();
    terminated.sort();
    // Every original node, then one surplus node.
    assert_eq!(terminated.len(), 4, "{terminated:?}");
    assert!(original.iter().all(|o| sim.terminated.contains(o)));
    assert_eq!(sim.layout(), layout);
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 3));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(3));
    assert_eq!(sim.lock, LockState::Free);
    assert_eq!(sim.status.phase, RefreshPhase::Idle);
    // Daily at noon UTC: the next run is tomorrow.
    assert_eq!(sim.status.next_run, Some(utc(2026, 6, 2, 12, 0)));
    let replaced = sim
        .happenings
        .iter()
        .filter(|h| matches!(h, Happening::Replaced { .. }))
        .count();
    assert_eq!(replaced, 3);
}

#[test]
fn the_oldest_node_goes_first() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.instances[1].launched -= chrono::Duration::days(3);
    let oldest = sim.instances[1].id.clone();
    sim.run_to_end(200);
    assert_eq!(sim.terminated.first(), Some(&oldest));
}

#[test]
fn schedule_in_a_zone_across_spring_forward_runs_at_the_end_of_the_gap() {
    // 02:30 does not exist in New York on 2026-03-08: the run is at 03:00 EDT (07:00 UTC).
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.settings = Ok(settings("30 2 * * *", "America/New_York", 1));
    sim.key = "ny".into();
    sim.now = utc(2026, 3, 8, 5, 0);
    for i in &mut sim.instances {
        i.launched = utc(2026, 3, 1, 0, 0);
    }
    sim.status = RefresherStatus::default();
    let plan = sim.step(false);
    assert_eq!(plan.status.next_run, Some(utc(2026, 3, 8, 7, 0)));
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(plan.status.phase, RefreshPhase::Idle);
    sim.now = utc(2026, 3, 8, 6, 59);
    assert_eq!(sim.step(false).command, Command::Nothing);
    sim.now = utc(2026, 3, 8, 7, 0);
    assert_eq!(sim.step(false).command, Command::TakeLock);
    let plan = sim.step(false);
    assert_eq!(plan.status.run_start, Some(utc(2026, 3, 8, 7, 0)));
    assert!(matches!(plan.command, Command::SetDesired(_)));
    sim.run_to_end(200);
    // Next: 02:30 EDT on the 9th = 06:30 UTC.
    assert_eq!(sim.status.next_run, Some(utc(2026, 3, 9, 6, 30)));
}

#[test]
fn schedule_in_a_zone_across_fall_back_runs_once() {
    // 01:30 happens twice in New York on 2026-11-01: one run, at the first.
    let mut sim = Sim::new(Role::Worker, 1, 1, 1);
    sim.settings = Ok(settings("30 1 * * *", "America/New_York", 1));
    sim.key = "ny".into();
    sim.now = utc(2026, 11, 1, 4, 0);
    sim.status = RefresherStatus::default();
    sim.step(false);
    assert_eq!(sim.status.next_run, Some(utc(2026, 11, 1, 5, 30)));
    sim.now = utc(2026, 11, 1, 5, 30);
    sim.run_to_end(100);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.next_run, Some(utc(2026, 11, 2, 6, 30)));
}

#[test]
fn an_edited_schedule_is_re_evaluated() {
    let mut sim = Sim::new(Role::Worker, 1, 1, 1);
    sim.status.next_run = Some(utc(2026, 6, 2, 12, 0));
    sim.key = "hourly".into();
    sim.settings = Ok(settings("0 * * * *", "UTC", 1));
    sim.now = utc(2026, 6, 1, 12, 10);
    let plan = sim.step(false);
    assert_eq!(plan.status.next_run, Some(utc(2026, 6, 1, 13, 0)));
    assert_eq!(plan.status.next_run_from.as_deref(), Some("hourly"));
}

#[test]
fn a_lock_held_by_the_replenisher_is_waited_for() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.lock = LockState::Other("Replenish workers".into());
    for _ in 0..3 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing);
        assert_eq!(plan.status.phase, RefreshPhase::WaitingForLock);
        assert!(
            plan.message.contains("Replenish workers"),
            "{}",
            plan.message
        );
        assert_eq!(plan.status.run_start, None);
        sim.advance(60);
    }
    sim.lock = LockState::Free;
    assert_eq!(sim.step(false).command, Command::TakeLock);
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_suspended_group_skips_the_run_and_says_why() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.suspended = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(
        sim.result(),
        Some((RunResult::Skipped, Some("the group is suspended".into())))
    );
    assert_eq!(sim.status.next_run, Some(utc(2026, 6, 2, 12, 0)));
    assert!(sim.terminated.is_empty());
    assert!(matches!(sim.happenings[0], Happening::Skipped(_)));
}

#[test]
fn an_asg_with_launch_or_terminate_suspended_skips_the_run_naming_both() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.asgs[1].suspended = vec!["AZRebalance".into(), "Launch".into()];
    sim.asgs[2].suspended = vec!["Terminate".into()];
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert_eq!(
        sim.result(),
        Some((
            RunResult::Skipped,
            Some(
                "asg-1 has its Launch process suspended; asg-2 has its Terminate process suspended"
                    .into()
            )
        ))
    );
    assert!(sim.terminated.is_empty());
    // AZRebalance alone does not stop a run.
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.asgs[1].suspended = vec!["AZRebalance".into()];
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn too_few_ready_nodes_skip_the_run() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.instances[0].ready = false;
    sim.step(false);
    assert_eq!(
        sim.result(),
        Some((
            RunResult::Skipped,
            Some("only 2 of 3 nodes are Ready".into())
        ))
    );
    assert_eq!(sim.lock, LockState::Free);
    assert!(sim.actions.iter().all(|a| !a.mutates()));
}

#[test]
fn surplus_that_never_gets_ready_fails_the_run_and_is_removed() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let layout = sim.layout();
    sim.step(false); // lock
    sim.step(false); // start, raise
    assert!(sim.asgs.iter().map(|a| a.desired).sum::<i32>() == 4);
    // The surplus never becomes Ready.
    for _ in 0..20 {
        sim.step(false);
        sim.advance(60);
    }
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    assert!(
        reason
            .unwrap_or_default()
            .contains("surplus not Ready within 15m")
    );
    assert_eq!(sim.layout(), layout);
    // The not-Ready surplus instance was removed; no old node was touched.
    assert_eq!(sim.terminated.len(), 1);
    assert_eq!(sim.instances.iter().filter(|i| i.ready).count(), 3);
    assert!(sim.instances.iter().all(|i| !i.cordoned));
    assert_eq!(sim.lock, LockState::Free);
}

#[test]
fn surplus_that_cannot_launch_is_cancelled_without_terminating_anything() {
    let mut sim = Sim::new(Role::Worker, 2, 1, 1);
    for a in &mut sim.asgs {
        a.launching = false;
    }
    // Not launching anywhere: the run does not start.
    sim.step(false);
    let (result, reason) = sim.result().expect("skipped");
    assert_eq!(result, RunResult::Skipped);
    assert!(reason.unwrap_or_default().contains("cannot add 1 surplus"));
    // Launching per the describe, but nothing comes: timed out, desired set back.
    let mut sim = Sim::new(Role::Worker, 2, 1, 1);
    sim.step(false);
    sim.step(false);
    for a in &mut sim.asgs {
        a.launching = false;
    }
    sim.instances.retain(|i| i.ready);
    for _ in 0..20 {
        sim.step(false);
        sim.advance(60);
    }
    assert_eq!(sim.result().map(|r| r.0), Some(RunResult::Failed));
    assert_eq!(sim.layout(), vec![("asg-0".into(), 1), ("asg-1".into(), 1)]);
    assert!(sim.terminated.is_empty());
}

#[test]
fn a_replacement_that_never_gets_ready_fails_and_keeps_the_other_old_nodes() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let layout = sim.layout();
    let original: Vec<String> = sim.instances.iter().map(|i| i.id.clone()).collect();
    // Surplus Ready (in asg-0), the first old node (in asg-1) replaced;
    // its replacement never joins.
    sim.instances[1].launched -= chrono::Duration::days(1);
    sim.step(false);
    sim.step(false);
    sim.all_join_and_ready();
    while sim.terminated.is_empty() {
        sim.step(false);
    }
    for _ in 0..16 {
        sim.step(false);
        sim.advance(60);
    }
    let reason = sim.status.failure.clone().unwrap_or_default();
    assert!(reason.contains("was not Ready within 15m"), "{reason}");
    assert_eq!(sim.status.phase, RefreshPhase::ScalingDown);
    // The surplus is what keeps 3 Ready: it stays while the replacement is not Ready.
    assert_eq!(sim.terminated.len(), 1);
    assert_eq!(sim.ready_count(), 3);
    // The replacement comes up late: the surplus goes, the layout is back.
    sim.all_join_and_ready();
    sim.run_to_end(50);
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    assert!(
        reason
            .unwrap_or_default()
            .contains("was not Ready within 15m")
    );
    assert_eq!(sim.layout(), layout);
    // One old node replaced, the other two kept and schedulable.
    let kept: Vec<&Instance> = sim
        .instances
        .iter()
        .filter(|i| original.contains(&i.id))
        .collect();
    assert_eq!(kept.len(), 2);
    assert!(kept.iter().all(|i| i.ready && !i.cordoned));
    assert!(sim.ready_after_terminations.iter().all(|r| *r >= 3));
    assert!(
        sim.happenings
            .iter()
            .any(|h| matches!(h, Happening::Failed(_)))
    );
    assert_eq!(sim.lock, LockState::Free);
}

#[test]
fn a_surplus_still_needed_after_a_failure_is_kept_and_the_run_ends() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    // The first target is in asg-1; the surplus goes to asg-0.
    sim.instances[1].launched -= chrono::Duration::days(1);
    sim.step(false);
    sim.step(false);
    sim.all_join_and_ready();
    while sim.terminated.is_empty() {
        sim.step(false);
    }
    for _ in 0..40 {
        sim.step(false);
        sim.advance(60);
    }
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("surplus left in asg-0"), "{reason}");
    assert_eq!(sim.ready_count(), 3);
    assert_eq!(sim.lock, LockState::Free);
}

fn stuck_first_drain(action: DrainTimeoutAction) -> Sim {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    if let Ok(s) = &mut sim.settings {
        s.drain_timeout_action = action;
    }
    let first = Sim::node_name(&sim.instances[0].id);
    sim.stuck = vec![first];
    sim
}

#[test]
fn a_drain_timeout_with_proceed_terminates_the_node_anyway() {
    let mut sim = stuck_first_drain(DrainTimeoutAction::Proceed);
    let first = sim.instances[0].id.clone();
    for _ in 0..30 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(20);
    }
    assert!(sim.terminated.contains(&first));
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(3));
}

#[test]
fn a_drain_timeout_with_abort_ends_the_run_and_keeps_the_node() {
    let mut sim = stuck_first_drain(DrainTimeoutAction::Abort);
    let layout = sim.layout();
    let first = sim.instances[0].id.clone();
    for _ in 0..40 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(20);
    }
    let (result, reason) = sim.result().expect("ended");
    assert_eq!(result, RunResult::Failed);
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("timed out after 5m"), "{reason}");
    assert!(
        reason.contains(&format!("blocked by: {STUCK_BY}")),
        "names the budget that held it: {reason}"
    );
    assert!(!sim.terminated.contains(&first));
    let node = sim.instances.iter().find(|i| i.id == first).expect("kept");
    assert!(!node.cordoned, "the kept node is back in service");
    assert_eq!(sim.layout(), layout);
    assert_eq!(sim.terminated.len(), 1, "only the surplus went");
}

#[test]
fn max_node_age_leaves_young_nodes_alone() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    if let Ok(s) = &mut sim.settings {
        s.max_node_age = Some(Duration::from_secs(7 * 24 * 3600));
    }
    sim.instances[2].launched = sim.now - chrono::Duration::days(10);
    let old = sim.instances[2].id.clone();
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(1));
    assert_eq!(sim.terminated.len(), 2); // the old node and the surplus
    assert!(sim.terminated.contains(&old));

    let mut young = Sim::new(Role::Worker, 3, 1, 1);
    if let Ok(s) = &mut young.settings {
        s.max_node_age = Some(Duration::from_secs(7 * 24 * 3600));
    }
    young.step(false);
    assert_eq!(
        young.result(),
        Some((
            RunResult::Skipped,
            Some("no node is older than 168h".into())
        ))
    );
}

#[test]
fn masters_are_replaced_one_at_a_time_without_surplus() {
    let mut sim = Sim::new(Role::Master, 3, 1, 0);
    let layout = sim.layout();
    let mut max_not_ready = 0;
    for _ in 0..300 {
        sim.step(false);
        let desired: i32 = sim.asgs.iter().map(|a| a.desired).sum();
        assert_eq!(desired, 3, "no surplus master");
        max_not_ready = max_not_ready.max(3 - sim.ready_count());
        // New masters join and become Ready a few steps later.
        if sim.now.timestamp() % 4 == 0 {
            sim.all_join_and_ready();
        }
        sim.advance(1);
        if sim.status.last_run.is_some() {
            break;
        }
    }
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.terminated.len(), 3);
    assert_eq!(max_not_ready, 1, "one master at a time");
    // Each termination left the other two Ready.
    assert!(sim.ready_after_terminations.iter().all(|r| *r == 2));
    assert_eq!(sim.layout(), layout);
}

#[test]
fn the_next_master_waits_for_the_control_plane_and_the_settle_time() {
    let mut sim = Sim::new(Role::Master, 3, 1, 0);
    let originals: BTreeSet<String> = sim
        .instances
        .iter()
        .map(|i| Sim::node_name(&i.id))
        .collect();
    // Run until the first replacement is Ready, its control plane down.
    for _ in 0..60 {
        sim.step(false);
        let new: Vec<String> = sim
            .instances
            .iter()
            .map(|i| Sim::node_name(&i.id))
            .filter(|n| !originals.contains(n))
            .collect();
        sim.control_plane_down.extend(new);
        sim.all_join_and_ready();
        sim.advance(1);
        if sim.terminated.len() == 1 && sim.ready_count() == 3 {
            break;
        }
    }
    assert_eq!(sim.terminated.len(), 1);
    let drains_so_far = sim.drain_steps.len();
    for _ in 0..30 {
        let plan = sim.step(false);
        assert!(
            plan.message.contains("control-plane pods"),
            "{}",
            plan.message
        );
        sim.advance(1);
    }
    assert_eq!(
        sim.drain_steps.len(),
        drains_so_far,
        "no second master touched"
    );
    // Up: still the settle time (10 s here) before the next master.
    sim.control_plane_down.clear();
    for _ in 0..9 {
        let plan = sim.step(false);
        assert!(plan.message.contains("settling"), "{}", plan.message);
        sim.advance(1);
    }
    assert_eq!(sim.drain_steps.len(), drains_so_far);
    sim.advance(1);
    sim.run_to_end(300);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert_eq!(sim.terminated.len(), 3);
}

#[test]
fn a_master_is_not_terminated_while_another_master_is_not_ready() {
    let mut sim = Sim::new(Role::Master, 3, 1, 0);
    let first = Sim::node_name(&sim.instances[0].id);
    sim.stuck = vec![first.clone()];
    sim.step(false); // lock
    let plan = sim.step(false); // start, first drain step
    assert!(matches!(plan.command, Command::Drain(_)));
    // Another master goes down while the first is drained.
    sim.instances[2].ready = false;
    sim.stuck.clear();
    for _ in 0..5 {
        let plan = sim.step(false);
        assert!(!matches!(
            plan.command,
            Command::Drain(_) | Command::Terminate(_)
        ));
        assert!(plan.message.contains("holding"), "{}", plan.message);
    }
    assert!(sim.terminated.is_empty());
    sim.instances[2].ready = true;
    sim.run_to_end(100);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert!(sim.ready_after_terminations.iter().all(|r| *r == 2));
}

#[test]
fn a_dry_run_plans_and_logs_without_mutating() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.dry_run = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    let (result, reason) = sim.result().expect("recorded");
    assert_eq!(result, RunResult::Skipped);
    let reason = reason.unwrap_or_default();
    assert!(
        reason.starts_with("dry run: would add 1 on asg-0 and replace 3"),
        "{reason}"
    );
    assert!(matches!(sim.happenings[0], Happening::Planned(_)));
    assert_eq!(sim.lock, LockState::Free);
}

#[test]
fn a_run_in_progress_is_paused_under_dry_run() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.step(false);
    sim.step(false);
    let before = sim.status.clone();
    sim.dry_run = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(plan.message.contains("--dry-run"), "{}", plan.message);
    assert_eq!(plan.status.phase, before.phase);
    assert_eq!(plan.status.run_start, before.run_start);
}

#[test]
fn an_invalid_spec_blocks_runs_and_pauses_a_run_in_progress() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.settings = Err("spec.timeZone: unknown".into());
    let plan = sim.step(false);
    assert_eq!(plan.status.phase, RefreshPhase::Blocked);
    assert_eq!(plan.status.next_run, None);
    assert!(plan.message.contains("spec.timeZone"));

    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.step(false);
    sim.step(false);
    sim.settings = Err("spec.timeZone: unknown".into());
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(plan.status.run_start.is_some(), "the run is kept");
    assert!(plan.message.contains("paused"));
}

#[test]
fn an_open_circuit_breaker_skips_a_due_run_and_pauses_one_under_way() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.breaker = Some("3 of 4 node(s) NotReady".into());
    sim.step(false);
    let Some((RunResult::Skipped, Some(why))) = sim.result() else {
        panic!("{:?}", sim.result())
    };
    assert!(why.contains("circuit breaker open"), "{why}");
    // Under way: paused at once, nothing drained, terminated or launched,
    // then resumed to the end once it closes.
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    while sim.terminated.is_empty() {
        sim.step(false);
        sim.all_join_and_ready();
    }
    sim.breaker = Some("3 of 4 node(s) NotReady".into());
    let terminated = sim.terminated.len();
    for _ in 0..5 {
        let plan = sim.step(false);
        assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
        assert!(
            plan.message.contains("circuit breaker open"),
            "{}",
            plan.message
        );
        sim.advance(600);
    }
    assert_eq!(sim.terminated.len(), terminated);
    sim.breaker = None;
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_run_suspended_midway_pauses_and_resumes() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    while sim.terminated.is_empty() {
        sim.step(false);
        sim.all_join_and_ready();
    }
    sim.suspended = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing);
    assert!(plan.message.contains("suspended"));
    sim.suspended = false;
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
}

#[test]
fn a_restart_after_recording_a_termination_terminates_that_same_node() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    loop {
        let plan = sim.plan();
        if matches!(plan.command, Command::Drain(_)) {
            sim.status = plan.status;
            break;
        }
        sim.step(false);
        sim.all_join_and_ready();
    }
    // Drain completes, the termination is recorded, the manager dies.
    let target = sim.status.current_target.clone().expect("target");
    let recorded = after_drain(&mut sim.status, sim.now).expect("recorded");
    assert_eq!(recorded.instance_id, target.instance_id);
    // Restarted: the same instance, once.
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Terminate(recorded.clone()));
    assert_eq!(sim.terminated, vec![target.instance_id.clone()]);
    let next = sim.step(false);
    assert!(!matches!(next.command, Command::Terminate(_)));
}

#[test]
fn a_target_that_vanishes_is_skipped_not_counted() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.stuck = sim
        .instances
        .iter()
        .map(|i| Sim::node_name(&i.id))
        .collect();
    loop {
        let plan = sim.step(false);
        sim.all_join_and_ready();
        if matches!(plan.command, Command::Drain(_)) {
            break;
        }
    }
    let target = sim.status.current_target.clone().expect("target");
    // The drain is in progress when a spot interruption takes the node.
    sim.instances.retain(|i| i.id != target.instance_id);
    sim.launch(sim.now);
    sim.stuck.clear();
    sim.run_to_end(200);
    assert_eq!(sim.result(), Some((RunResult::Succeeded, None)));
    assert!(!sim.terminated.contains(&target.instance_id));
    assert_eq!(sim.status.last_run.as_ref().map(|r| r.replaced), Some(2));
}

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
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => Just(Event::Reconcile(None)),
        1 => Just(Event::Reconcile(Some(Crash::BeforeAction))),
        1 => Just(Event::Reconcile(Some(Crash::BeforeTermination))),
        1 => (0..8usize).prop_map(Event::NotReady),
        2 => (0..8usize).prop_map(Event::Join),
        2 => (0..8usize).prop_map(Event::Ready),
        1 => (1..40i64).prop_map(Event::Tick),
    ]
}

#[test]
fn a_group_being_deleted_starts_no_run() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    sim.deleting = true;
    let plan = sim.step(false);
    assert_eq!(plan.command, Command::Nothing, "{}", plan.message);
    assert!(sim.status.run_start.is_none());
    assert_eq!(
        sim.result(),
        Some((
            RunResult::Skipped,
            Some("the NodeGroup is being deleted".into())
        ))
    );
    assert_eq!(sim.lock, LockState::Free);
    assert!(sim.layouts.is_empty(), "no run recorded");
}

#[test]
fn deleting_the_group_mid_drain_uncordons_the_node_and_unwinds_the_run() {
    let mut sim = Sim::new(Role::Worker, 3, 1, 1);
    let start = sim.layout();
    // Run up to the first drain step of an old node.
    for _ in 0..20 {
        sim.step(false);
        sim.all_join_and_ready();
        sim.advance(1);
        if sim.original_cordoned() == 1 {
            break;
        }
    }
    assert_eq!(
        sim.original_cordoned(),
        1,
        "a drain under way: {:?}",
        sim.status
    );
    sim.deleting = true;
    let plan = sim.step(false);
    assert!(
        matches!(plan.command, Command::Uncordon(_)),
        "the drain is given up first: {:?}",
        plan.command
    );
    assert_eq!(sim.original_cordoned(), 0);
    assert_eq!(sim.status.phase, RefreshPhase::ScalingDown);
    sim.run_to_end(100);
    let (result, reason) = sim.result().expect("run ended");
    assert_eq!(result, RunResult::Failed);
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("the NodeGroup is being deleted")),
        "{reason:?}"
    );
    assert_eq!(sim.layout(), start, "every ASG back at its recorded count");
    assert!(sim.instances.iter().all(|i| !i.cordoned));
    assert_eq!(sim.lock, LockState::Free);
    assert_eq!(sim.layouts.len(), 1, "no new run after the deletion");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// No duration, however long, and no clock, however far off, makes a
    /// refresher plan panic, at any point of a run; no requeue is longer
    /// than the runtime can take.
    #[test]
    fn extreme_durations_and_clocks_never_panic(
        before in proptest::collection::vec(event(), 0..60),
        drain in any::<u64>(),
        ready in any::<u64>(),
        settle in any::<u64>(),
        age in proptest::option::of(any::<u64>()),
        now in prop_oneof![
            Just(DateTime::<Utc>::MIN_UTC),
            Just(DateTime::<Utc>::MAX_UTC),
            (DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp())
                .prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)),
        ],
        master in any::<bool>(),
    ) {
        let role = if master { Role::Master } else { Role::Worker };
        let mut sim = Sim::new(role, 3, 1, if master { 0 } else { 1 });
        for e in before {
            sim.apply(e);
        }
        if let Ok(s) = sim.settings.as_mut() {
            s.drain_timeout = Duration::from_secs(drain);
            s.ready_timeout = Duration::from_secs(ready);
            s.master_settle_time = Duration::from_secs(settle);
            s.max_node_age = age.map(Duration::from_secs);
        }
        sim.now = now;
        let plan = sim.plan();
        prop_assert!(
            plan.requeue <= crate::controllers::group_view::LONGEST_WAIT,
            "a requeue of {:?}", plan.requeue
        );
    }

    /// Deleting the NodeGroup at any point of a run: the run ends, no node
    /// is left cordoned, no new run starts, Ready never drops below
    /// desired, every ASG gets its recorded count back, the lock is free.
    #[test]
    fn deleting_the_group_at_any_point_unwinds_the_run(
        asgs in 1..4usize,
        per_asg in 1..3i32,
        surplus in 1..3i32,
        before in proptest::collection::vec(event(), 0..120),
        after in proptest::collection::vec(event(), 0..60),
    ) {
        let mut sim = Sim::new(Role::Worker, asgs, per_asg, surplus);
        let desired = sim.desired;
        for e in before {
            sim.apply(e);
        }
        sim.deleting = true;
        let runs = sim.layouts.len();
        for e in after {
            sim.apply(e);
        }
        sim.run_to_end(500);
        prop_assert!(sim.status.run_start.is_none(), "run did not end: {:?}", sim.status);
        prop_assert_eq!(sim.layouts.len(), runs, "a run started after the deletion");
        prop_assert!(sim.instances.iter().all(|i| !i.cordoned), "a node left cordoned");
        prop_assert!(sim.ready_after_terminations.iter().all(|r| *r >= desired));
        let kept = sim.result().and_then(|r| r.1).is_some_and(|r| r.contains("kept"));
        if let (Some(start), false) = (sim.layouts.last(), kept) {
            prop_assert_eq!(&sim.layout(), start, "layout not restored: {:?}", sim.result());
        }
        prop_assert_eq!(sim.lock.clone(), LockState::Free);
    }

    /// Whatever the order of nodes joining, becoming Ready, time passing
    /// and the manager dying: our terminations never leave fewer Ready
    /// than desired, at most one old node is worked on at a time, no
    /// instance is terminated twice (asserted in the sim), and the run
    /// ends with every ASG at its recorded count.
    #[test]
    fn a_worker_refresh_is_safe_under_any_event_order(
        asgs in 1..4usize,
        per_asg in 1..3i32,
        surplus in 1..3i32,
        events in proptest::collection::vec(event(), 0..300),
    ) {
        let mut sim = Sim::new(Role::Worker, asgs, per_asg, surplus);
        let desired = sim.desired;
        for e in events {
            sim.apply(e);
            prop_assert!(sim.original_cordoned() <= 1, "two old nodes worked on at once");
            prop_assert!(sim.ready_after_terminations.iter().all(|r| *r >= desired),
                "Ready fell below {desired}: {:?}", sim.ready_after_terminations);
        }
        let started = sim.layouts.len();
        let before_end: Vec<String> = sim.instances.iter().map(|i| i.id.clone()).collect();
        sim.run_to_end(500);
        prop_assert!(sim.status.run_start.is_none(), "run did not end: {:?}", sim.status);
        // A run that succeeded (and was under way) left none of the nodes it started with.
        if started > 0 && sim.result().map(|r| r.0) == Some(RunResult::Succeeded) && sim.layouts.len() == started {
            let original_left = sim.instances.iter().filter(|i| i.launched < Sim::new(Role::Worker, 1, 1, 1).now && before_end.contains(&i.id)).count();
            prop_assert_eq!(original_left, 0, "old nodes left after success: {:?}", sim.status.last_run);
        }
        prop_assert!(sim.ready_after_terminations.iter().all(|r| *r >= desired));
        let kept = sim.result().and_then(|r| r.1).is_some_and(|r| r.contains("kept"));
        if let (Some(start), false) = (sim.layouts.last(), kept) {
            prop_assert_eq!(&sim.layout(), start, "layout not restored: {:?}", sim.result());
        }
        prop_assert_eq!(sim.lock.clone(), LockState::Free);
    }
}

#[test]
fn a_recorded_termination_not_yet_made_is_taken_back_when_the_group_is_deleted() {
    let mut sim = Sim::new(Role::Worker, 3, 2, 1);
    // Run until an old node is drained and its termination recorded, and
    // the manager dies before making it.
    for _ in 0..30 {
        let drained = sim.status.current_target.as_ref().is_some_and(|t| {
            t.purpose == TargetPurpose::Replace
                && t.terminated.is_none()
                && sim.original_cordoned() == 1
        });
        sim.step_with(drained.then_some(Crash::BeforeTermination));
        sim.all_join_and_ready();
        if sim.status.current_target.as_ref().is_some_and(|t| {
            t.terminated.is_some() && sim.instances.iter().any(|i| i.id == t.instance_id)
        }) {
            break;
        }
    }
    let target = sim
        .status
        .current_target
        .clone()
        .expect("a recorded termination");
    assert!(target.terminated.is_some());
    sim.deleting = true;
    let plan = sim.step(false);
    assert_eq!(
        plan.command,
        Command::Uncordon(target.node.clone().expect("node"))
    );
    sim.run_to_end(100);
    assert!(
        !sim.terminated.contains(&target.instance_id),
        "the drained node is kept, not terminated after the deletion"
    );
    assert!(sim.instances.iter().all(|i| !i.cordoned));
    assert_eq!(sim.lock, LockState::Free);
}
