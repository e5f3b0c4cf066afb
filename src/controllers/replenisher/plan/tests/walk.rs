//! The replenisher over time, through its own executor and the real guard:
//! a simulated group whose kubelets die and come back, whose ASGs lose and
//! regain capacity and launch instances that never join, reconciled every
//! 30 s by `plan` then `execute` (the controller's), with the manager
//! killed at its crash points. Checked at every mutation: made under the
//! lock, recorded in the stored status first, never twice, never below the
//! Ready floor or min, never two masters down by our hand; and once the
//! world calms down, every wait ends: desired Ready nodes, the layout back,
//! nothing cordoned, the lock and slot given back.

use super::*;
use crate::cloud::AsgDescription;
use crate::controllers::authority::observe::loss_imminent;
use crate::controllers::authority::{ControlPlane, DownWhy, MasterDown};
use crate::controllers::group_view::group_nodes;
use crate::controllers::group_view::tests::{block_on, fresh, sim_group, status_node};
use crate::controllers::guard::Refusal;
use crate::controllers::guard::replenish::{Check, Guard};
use crate::controllers::replenisher::execute::{Counted, Effects, Taken, execute};
use crate::crd::nodegroup::{NodeInterruption, NodeStatus};
use crate::crd::{NodeGroup, NodeGroupStatus};
use crate::events::Reason as EventReason;
use crate::k8s::drain::DrainProgress;
use kube::runtime::events::EventType;
use std::collections::BTreeMap;

const TICK: chrono::Duration = chrono::Duration::seconds(30);

struct Instance {
    id: String,
    asg: String,
    launched: DateTime<Utc>,
    /// When its Node registers; None: never.
    joins: Option<DateTime<Utc>>,
    /// Its kubelet died then (NotReady since).
    dead_since: Option<DateTime<Utc>>,
    cordoned: bool,
    drain_steps: u32,
    /// A notice on its node: a spot warning (AWS takes it two minutes
    /// after) or a rebalance recommendation.
    notice: Option<NodeInterruption>,
}

impl Instance {
    fn joined(&self, now: DateTime<Utc>) -> bool {
        self.joins.is_some_and(|t| now >= t)
    }

    fn ready(&self, now: DateTime<Utc>) -> bool {
        self.joined(now) && self.dead_since.is_none()
    }

    /// Ready and staying: no notice in force (as the guard counts).
    fn serving(&self, now: DateTime<Utc>) -> bool {
        self.ready(now) && self.notice.as_ref().is_none_or(|n| !n.in_force(now))
    }
}

struct WalkAsg {
    name: String,
    desired: i32,
    min: i32,
    max: i32,
    capacity: bool,
    /// Its next launch never joins.
    next_never_joins: bool,
}

/// Where the manager dies next: at the first point of that kind reached.
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
    lock: LockState,
    slot: bool,
    status: ReplenisherStatus,
    now: DateTime<Utc>,
    launched: u32,
    crash: Option<Crash>,
    terminated: BTreeSet<String>,
    /// What the walk saw done, by kind (so a walk that does nothing fails).
    seen: BTreeMap<&'static str, u32>,
    /// The last plan's command and message, for a failure's report.
    last: String,
    /// Print each reconcile (`WALK_TRACE=<seed>`).
    trace: bool,
    /// The maintenance windows: open, or closed for now.
    window_open: bool,
    /// Nodes protected from voluntary disruption (do-not-disrupt).
    protected: BTreeMap<String, String>,
    /// Another group holds the manager's one disruption slot.
    slot_elsewhere: bool,
    /// What the guard was asked about in this reconcile (instances, and
    /// `asg:<name>` for raises): every mutation must have been.
    guarded: std::cell::RefCell<BTreeSet<String>>,
}

impl World {
    fn new(role: Role, min: i32) -> Self {
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
            lock: LockState::Free,
            slot: false,
            status: ReplenisherStatus::default(),
            now: t0(),
            launched: 0,
            crash: None,
            terminated: BTreeSet::new(),
            seen: BTreeMap::new(),
            last: String::new(),
            trace: false,
            guarded: Default::default(),
            window_open: true,
            protected: BTreeMap::new(),
            slot_elsewhere: false,
        };
        w.aws();
        w.now += chrono::Duration::minutes(5);
        w
    }

    /// AWS's side: each ASG with capacity launches up to its desired
    /// count; one above it would pick a victim (the guard's to prevent).
    fn aws(&mut self) {
        let now = self.now;
        let taken = |i: &Instance| {
            i.notice
                .as_ref()
                .and_then(|n| n.loss_at)
                .is_some_and(|t| now >= t)
        };
        if self.instances.iter().any(taken) {
            *self.seen.entry("taken by AWS").or_default() += 1;
        }
        self.instances.retain(|i| !taken(i));
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
                let joins =
                    (!std::mem::take(&mut a.next_never_joins)).then_some(self.now + TICK * 2);
                self.instances.push(Instance {
                    id: format!("i-{}", self.launched),
                    asg: a.name.clone(),
                    launched: self.now,
                    joins,
                    dead_since: None,
                    cordoned: false,
                    drain_steps: 0,
                    notice: None,
                });
            }
        }
    }

    /// The nodes that count toward desired.
    fn ready_count(&self) -> i32 {
        self.instances
            .iter()
            .filter(|i| i.serving(self.now))
            .count() as i32
    }

    /// The inventory's view: the group's Nodes and the ASGs as described.
    fn observed(&self) -> (NodeGroup, Vec<AsgDescription>) {
        let names: Vec<&str> = self.asgs.iter().map(|a| a.name.as_str()).collect();
        let mut group = sim_group(self.role, self.desired, &names);
        let now = self.now;
        let nodes: Vec<NodeStatus> = self
            .instances
            .iter()
            .filter(|i| i.joined(now))
            .map(|i| NodeStatus {
                ready: i.ready(now),
                unhealthy_since: i.dead_since,
                launch_time: Some(i.launched),
                unschedulable: i.cordoned,
                interruption: i.notice.clone(),
                ..status_node(&node_name(&i.id), &i.asg, &i.id)
            })
            .collect();
        group.status = Some(NodeGroupStatus {
            nodes,
            ..Default::default()
        });
        let described = self
            .asgs
            .iter()
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
                    d.recent_failure = Some(NO_CAPACITY.into());
                }
                d
            })
            .collect();
        (group, described)
    }

    /// The cluster's control plane as the authority observes it: a master
    /// is up while its Node is Ready and no loss is imminent for it (a
    /// rebalance recommendation is none).
    fn control_plane(&self) -> ControlPlane {
        let mut cp = ControlPlane {
            expected: self.desired,
            ..Default::default()
        };
        for i in &self.instances {
            let why = if !i.joined(self.now) {
                DownWhy::Launching
            } else if i.dead_since.is_some() {
                DownWhy::NotReady
            } else if i
                .notice
                .as_ref()
                .is_some_and(|n| loss_imminent(n, self.now))
            {
                DownWhy::Leaving
            } else {
                cp.ready.insert(i.id.clone());
                continue;
            };
            cp.down.push(MasterDown {
                group: "walk".into(),
                instance: Some(i.id.clone()),
                why,
            });
        }
        cp
    }

    fn with_guard<T>(&self, f: impl FnOnce(&Guard) -> T) -> T {
        let (group, described) = self.observed();
        let status = group.status.clone().unwrap_or_default();
        let cp = self.control_plane();
        f(&Guard {
            group: &group,
            status: &status,
            fresh: &described,
            control_plane: (self.role == Role::Master).then_some(&cp),
            now: self.now,
        })
    }

    /// One reconcile: observe, plan, execute.
    fn reconcile(&mut self) {
        let (group, described) = self.observed();
        let status = group.status.clone().unwrap_or_default();
        let nodes = group_nodes(&status.nodes, &described, self.now);
        let asgs: Vec<AsgView> = described.iter().map(AsgView::from).collect();
        let not_joined: Vec<NotJoinedView> = self
            .instances
            .iter()
            .filter(|i| !i.joined(self.now))
            .map(|i| NotJoinedView {
                instance_id: i.id.clone(),
                asg: i.asg.clone(),
                launch_time: Some(i.launched),
            })
            .collect();
        let active: BTreeSet<String> = self.instances.iter().map(|i| i.id.clone()).collect();
        let cp = self.control_plane();
        let stored = self.status.clone();
        let plan = plan(&Input {
            group: GroupFacts {
                role: self.role,
                desired: self.desired,
                suspended: false,
                deleting: false,
                invalid_spec: None,
                breaker: None,
                external_update: None,
                unhealthy_timeout: UNHEALTHY,
                repair: true,
                asgs: &asgs,
                nodes: &nodes,
                lock: self.lock.clone(),
                control_plane: (self.role == Role::Master).then_some(&cp),
                now: self.now,
            },
            spec_valid: true,
            cooldown: Duration::from_secs(300),
            join_timeout: Duration::from_secs(900),
            not_joined: &not_joined,
            active: &active,
            window: match self.window_open {
                true => crate::controllers::window::WindowState::Always,
                false => crate::controllers::window::WindowState::Closed {
                    opens: Some(self.now + chrono::Duration::hours(1)),
                },
            },
            protected: &self.protected,
            slot: match (self.slot, self.slot_elsewhere) {
                (true, _) => SlotState::Ours,
                (false, false) => SlotState::Free,
                (false, true) => SlotState::Full("Refresh other/nodes".into()),
            },
            status: &stored,
            fallback: None,
            surplus_left: None,
        });
        self.last = format!("{:?}: {}", plan.command, plan.message);
        if self.trace {
            let desired: Vec<i32> = self.asgs.iter().map(|a| a.desired).collect();
            eprintln!(
                "{} {desired:?} raised {:?} lowered {:?} | {}",
                self.now.format("%H:%M:%S"),
                stored
                    .raised
                    .iter()
                    .map(|r| (&r.auto_scaling_group, r.count))
                    .collect::<Vec<_>>(),
                stored
                    .lowered
                    .iter()
                    .map(|r| (&r.auto_scaling_group, r.count))
                    .collect::<Vec<_>>(),
                self.last
            );
        }
        self.guarded.borrow_mut().clear();
        let (spec, now) = (group.spec.clone(), self.now);
        let draining = stored.scale_in.clone();
        let result = block_on(execute(
            self,
            &spec,
            &plan,
            plan.status.clone(),
            draining.as_ref(),
            now,
        ));
        // Died at a crash point: nothing after it happened. Any other
        // error is the real guard refusing what the plan planned on the
        // same observations: a plan and its guard that disagree.
        if let Err(e) = result {
            assert!(
                e.to_string().contains("crashed at"),
                "{:?} failed: {e}\n{}",
                plan.command,
                plan.message
            );
        }
    }

    fn instance(&self, id: &str) -> &Instance {
        self.instances
            .iter()
            .find(|i| i.id == id)
            .unwrap_or_else(|| panic!("{id} is not running (terminated twice?)"))
    }

    fn assert_guarded(&self, what: &str) {
        assert!(
            self.guarded.borrow().contains(what),
            "{what} changed without asking the guard"
        );
    }

    fn assert_locked(&self, what: &str) {
        assert_eq!(self.lock, LockState::Ours, "{what} without the lock");
    }

    fn see(&mut self, what: &'static str) {
        *self.seen.entry(what).or_default() += 1;
    }

    /// One tick of the world: an event, AWS, a reconcile, time.
    fn tick(&mut self, event: Option<(u8, u8)>) {
        if let Some((op, arg)) = event {
            self.event(op, arg);
        }
        self.aws();
        self.reconcile();
        self.now += TICK;
    }

    fn event(&mut self, op: u8, arg: u8) {
        let pick = |n: usize| usize::from(arg) % n.max(1);
        let now = self.now;
        match op % 12 {
            0 => {
                let live: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| self.instances[i].ready(now))
                    .collect();
                if let Some(&i) = live.get(pick(live.len())) {
                    self.instances[i].dead_since = Some(now);
                }
            }
            1 => {
                let dead: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| self.instances[i].dead_since.is_some())
                    .collect();
                if let Some(&i) = dead.get(pick(dead.len())) {
                    self.instances[i].dead_since = None;
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
            5 | 6 => {
                let live: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| self.instances[i].ready(now) && self.instances[i].notice.is_none())
                    .collect();
                if let Some(&i) = live.get(pick(live.len())) {
                    let spot = op % 12 == 5;
                    self.instances[i].notice = Some(NodeInterruption {
                        kind: match spot {
                            true => "spot_interruption",
                            false => "rebalance_recommendation",
                        }
                        .into(),
                        noticed: now,
                        deadline: now + chrono::Duration::seconds(60),
                        loss_at: spot.then(|| now + chrono::Duration::seconds(120)),
                        drain_from: None,
                        late: None,
                        drained: None,
                    });
                }
            }
            7 => self.window_open = !self.window_open,
            8 => {
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
            9 => self.slot_elsewhere = !self.slot_elsewhere,
            4 => {
                self.crash = Some(match arg % 2 {
                    0 => Crash::Persisted,
                    _ => Crash::Acted,
                })
            }
            _ => {}
        }
    }

    /// The world calmed down: capacity back everywhere. Masters whose
    /// quorum is lost are brought back by hand (the manager never takes a
    /// master then: the authority refuses, and says so).
    fn calm(&mut self) {
        for a in &mut self.asgs {
            a.capacity = true;
            a.next_never_joins = false;
        }
        self.crash = None;
        self.window_open = true;
        self.protected.clear();
        self.slot_elsewhere = false;
        if self.role == Role::Master && self.control_plane().ready.len() < self.desired as usize - 1
        {
            let now = self.now;
            for i in &mut self.instances {
                i.dead_since = None;
                i.joins = Some(i.joins.unwrap_or(now).min(now));
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
        let s = &self.status;
        let checks = [
            (self.ready_count() == self.desired, "Ready at desired"),
            (layout == self.layout, "the original layout"),
            (cordoned.is_empty(), "nothing cordoned"),
            (self.lock == LockState::Free, "the lock given back"),
            (!self.slot, "the slot given back"),
            (s.scale_in.is_none() && s.cleanup.is_none(), "no removal"),
            (s.raised.is_empty() && s.raising.is_empty(), "no raise"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, what)) => Err(format!(
                "not settled ({what}): {} Ready of {}, layout {layout:?}, cordoned {cordoned:?}, lock {:?}, slot {}, status {s:?}",
                self.ready_count(),
                self.desired,
                self.lock,
                self.slot
            )),
            None => Ok(()),
        }
    }
}

fn node_name(instance: &str) -> String {
    format!("n-{instance}")
}

fn instance_of(node: &str) -> &str {
    node.strip_prefix("n-").unwrap_or(node)
}

/// The simulated world as the executor's effects: the executor asks the
/// real guard before each mutation; what the world itself would refuse or
/// reveal (the lock, a persisted record, AWS's min and max) is asserted.
impl Effects for World {
    fn guard(&self, check: Check<'_>) -> Result<(), Refusal> {
        let asked: Vec<String> = match check {
            Check::ScaleUp(changes) => changes.iter().map(|c| format!("asg:{}", c.asg)).collect(),
            Check::NotJoined(t) => vec![t.instance_id.clone()],
            Check::Removal(t) => vec![t.instance_id.clone()],
            Check::Retire(r) => vec![r.instance_id.clone()],
        };
        self.guarded.borrow_mut().extend(asked);
        self.with_guard(|g| g.check(check))
    }

    fn dry_run(&self) -> bool {
        false
    }

    async fn write_status(&mut self, status: &ReplenisherStatus) -> crate::Result<()> {
        self.status = status.clone();
        Ok(())
    }

    fn reached(&mut self, point: &str) -> crate::Result<()> {
        let kind = match point.ends_with(":persisted") {
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

    async fn event(&mut self, _: Option<&str>, _: EventType, _: EventReason, _: String) {}

    fn count(&mut self, _: Counted) {}

    async fn take_lock(&mut self) -> crate::Result<Taken> {
        self.lock = LockState::Ours;
        Ok(Taken::Yes)
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        self.slot = false;
        self.lock = LockState::Free;
        Ok(())
    }

    async fn take_slot(&mut self) -> crate::Result<bool> {
        self.assert_locked("a slot");
        self.slot = !self.slot_elsewhere;
        Ok(self.slot)
    }

    async fn set_desired(&mut self, change: &DesiredChange, _: &str) -> crate::Result<bool> {
        self.assert_locked("a raise");
        self.assert_guarded(&format!("asg:{}", change.asg));
        let recorded = self
            .status
            .raising
            .iter()
            .any(|r| r.auto_scaling_group == change.asg && r.to == change.to);
        assert!(recorded, "{change:?} made before its record was stored");
        let a = self
            .asgs
            .iter_mut()
            .find(|a| a.name == change.asg)
            .expect("a group's ASG");
        assert!(change.to <= a.max, "{change:?} above max {}", a.max);
        assert_eq!(change.from, a.desired, "{change:?} from a stale count");
        a.desired = change.to;
        self.see("raise");
        Ok(true)
    }

    async fn drain_step(&mut self, node: &str) -> crate::Result<DrainProgress> {
        self.assert_locked("a drain");
        let id = instance_of(node).to_string();
        let recorded = self
            .status
            .scale_in
            .as_ref()
            .is_some_and(|t| t.instance_id == id);
        assert!(recorded, "drains {node} before its scale-in is stored");
        let Some(i) = self.instances.iter_mut().find(|i| i.id == id) else {
            // A node gone has nothing left to drain.
            return Ok(DrainProgress::default());
        };
        i.cordoned = true;
        i.drain_steps += 1;
        let first = i.drain_steps == 1;
        let target = self.status.scale_in.clone().expect("recorded above");
        if first && !target.repair {
            // A voluntary removal (a surplus, a node at risk) starts only
            // inside a window, holding the slot, on a node not protected.
            assert!(self.window_open, "{node} drained outside every window");
            assert!(self.slot, "{node} drained without the disruption slot");
            assert!(
                !self.protected.contains_key(node),
                "protected {node} drained"
            );
            self.see("voluntary drain");
        }
        let i = self
            .instances
            .iter_mut()
            .find(|i| i.id == id)
            .expect("found above");
        // A pod takes a step to leave.
        Ok(DrainProgress {
            waiting: match i.drain_steps {
                1 => vec!["ns/pod".into()],
                _ => vec![],
            },
            ..Default::default()
        })
    }

    async fn terminate(&mut self, id: &str, decrement: bool, _: String) -> crate::Result<bool> {
        self.assert_locked("a termination");
        self.assert_guarded(id);
        let s = &self.status;
        let kind = if s
            .scale_in
            .as_ref()
            .is_some_and(|t| t.instance_id == id && t.terminating.is_some())
        {
            match s.scale_in.as_ref().is_some_and(|t| t.repair) {
                true => "repair",
                false => "scale-in",
            }
        } else if s.cleanup.as_ref().is_some_and(|c| c.instance_id == id) {
            "never joined"
        } else if s.retiring.iter().any(|r| r.instance_id == id) {
            "retirement"
        } else {
            panic!("{id} terminated before its termination was stored: {s:?}")
        };
        assert!(!self.terminated.contains(id), "{id} terminated twice");
        let now = self.now;
        let target = self.instance(id);
        let was_ready = target.serving(now);
        let asg = target.asg.clone();
        let ready_after = self.ready_count() - i32::from(was_ready);
        assert!(
            !was_ready || ready_after >= self.desired,
            "{kind} of Ready {id} leaves {ready_after} Ready of {}",
            self.desired
        );
        if self.role == Role::Master {
            let others = self
                .control_plane()
                .ready
                .iter()
                .filter(|m| *m != id)
                .count() as i32;
            assert!(
                others >= self.desired - 1,
                "{kind} of master {id} while {others} other masters are up"
            );
        }
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
        self.see(kind);
        Ok(true)
    }

    async fn uncordon(&mut self, node: &str, _: &str) -> crate::Result<()> {
        let id = instance_of(node);
        if let Some(i) = self.instances.iter_mut().find(|i| i.id == id) {
            i.cordoned = false;
            i.drain_steps = 0;
        }
        Ok(())
    }
}

/// A small deterministic generator (xorshift), so a failing walk names its
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

/// Walks `seed`'s world: `events` eventful ticks, then calm until settled.
fn walk(seed: u64, seen: &mut BTreeMap<&'static str, u32>) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let role = match rng.next() % 3 {
        0 => Role::Master,
        _ => Role::Worker,
    };
    let mut w = World::new(role, i32::from(rng.next() % 2));
    w.trace = std::env::var("WALK_TRACE").is_ok_and(|v| v == seed.to_string());
    let events = 40 + usize::from(rng.next() % 80);
    for _ in 0..events {
        // Half the ticks quiet: things take several reconciles.
        let event = rng
            .next()
            .is_multiple_of(2)
            .then(|| (rng.next(), rng.next()));
        w.tick(event);
    }
    w.calm();
    // Every wait ends: an unhealthy node is repaired after 10 min, a
    // never-joined one removed after 15, a surplus drained after a 5 min
    // cooldown, a rebalance recommendation no longer holds its node after
    // AT_RISK_FOR (6 h). Seven hours, a reconcile a minute.
    for _ in 0..420 {
        w.tick(None);
        w.now += TICK;
    }
    if let Err(e) = w.settled() {
        let instances: Vec<String> = w
            .instances
            .iter()
            .map(|i| {
                format!(
                    "{} in {}: joined {}, ready {}",
                    i.id,
                    i.asg,
                    i.joined(w.now),
                    i.ready(w.now)
                )
            })
            .collect();
        let last = w.last.clone();
        panic!("seed {seed} ({role:?}): {e}\ninstances {instances:?}\nlast plan: {last}");
    }
    for (k, v) in w.seen {
        *seen.entry(k).or_default() += v;
    }
}

#[test]
fn every_walk_is_safe_at_each_step_and_settles() {
    let mut seen = BTreeMap::new();
    for seed in 0..256 {
        walk(seed, &mut seen);
    }
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
    ];
    for kind in kinds {
        assert!(
            seen.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} in any walk: {seen:?}"
        );
    }
    eprintln!("replenisher walks: {seen:?}");
}
