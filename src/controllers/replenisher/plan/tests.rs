use super::*;
use crate::crd::replenisher::{AsgCount, AsgSince, NotJoinedRemovals, Raise};
use chrono::TimeZone;
use proptest::prelude::*;

mod interrupted;

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
        fate: None,
    }
}

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
        }
    }

    fn plan(&self) -> Plan {
        self.plan_with(Duration::from_secs(300), Duration::from_secs(900), t0())
    }

    fn plan_with(&self, cooldown: Duration, join_timeout: Duration, now: DateTime<Utc>) -> Plan {
        plan(&Input {
            role: self.role,
            desired: self.desired,
            suspend: self.suspend,
            deleting: self.deleting,
            spec_valid: true,
            breaker: self.breaker.clone(),
            cooldown,
            join_timeout,
            asgs: &self.asgs,
            nodes: &self.nodes,
            not_joined: &self.not_joined,
            active: &self.active(),
            lock: self.lock.clone(),
            status: &self.status,
            now,
        })
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

#[test]
fn steady_releases_the_lock_and_does_nothing() {
    let p = Scenario::steady().plan();
    assert_eq!(p.command, Command::ReleaseLock);
    assert_eq!(p.status.phase, ReplenishPhase::Steady);
    let mut s = Scenario::steady();
    s.lock = LockState::Free;
    assert_eq!(s.plan().command, Command::Nothing);
}

#[test]
fn a_shortage_scales_up_only_launching_asgs_and_excludes_the_short_one() {
    let p = Scenario::steady().shortage_in_a().plan();
    assert_eq!(
        p.command,
        Command::ScaleUp(vec![DesiredChange {
            asg: "c".into(),
            from: 1,
            to: 2
        }])
    );
    assert_eq!(p.status.phase, ReplenishPhase::ScalingUp);
    let excluded = &p.status.excluded;
    assert_eq!(excluded.len(), 1);
    assert_eq!(excluded[0].auto_scaling_group, "a");
    assert_eq!(excluded[0].since, t0());
    assert_eq!(
        excluded[0].retry_after,
        Some(t0() + chrono::Duration::minutes(1))
    );
    assert!(
        excluded[0].reason.contains("InsufficientInstanceCapacity"),
        "{excluded:?}"
    );
    // Recorded before the call: the raise, the count to take back, the cooldown.
    assert_eq!(
        p.status.raising,
        vec![Raise {
            auto_scaling_group: "c".into(),
            from: 1,
            to: 2
        }]
    );
    assert_eq!(p.status.raised[0].count, 1);
    assert_eq!(p.status.last_modification, Some(t0()));
}

#[test]
fn the_increase_is_spread_over_launching_asgs() {
    let mut s = Scenario::steady();
    s.desired = 5;
    let p = s.plan();
    assert_eq!(
        p.command,
        Command::ScaleUp(vec![
            DesiredChange {
                asg: "a".into(),
                from: 1,
                to: 2
            },
            DesiredChange {
                asg: "c".into(),
                from: 1,
                to: 2
            },
        ])
    );
}

#[test]
fn exclusion_backoff_grows_while_it_keeps_failing_and_lifts_after() {
    let mut s = Scenario::steady().shortage_in_a();
    s.status = s.plan().status;
    // Still failing after the first backoff: failures 2, next retry in 2m.
    let active = s.active();
    let later = plan(&Input {
        now: t0() + chrono::Duration::minutes(2),
        ..input_of(&s, &active)
    });
    let e = &later.status.excluded[0];
    assert_eq!(e.failures, 2);
    assert_eq!(e.retry_after, Some(t0() + chrono::Duration::minutes(4)));
    assert_eq!(exclusion_backoff(10), Duration::from_secs(1800), "capped");
    // Launching again and past the backoff: no longer excluded.
    s.status = later.status;
    s.asgs[0] = asg("a", 1, 1, 3);
    let active = s.active();
    let healed = plan(&Input {
        now: t0() + chrono::Duration::minutes(5),
        ..input_of(&s, &active)
    });
    assert!(healed.status.excluded.is_empty());
}

fn input_of<'a>(s: &'a Scenario, active: &'a BTreeSet<String>) -> Input<'a> {
    Input {
        role: s.role,
        desired: s.desired,
        suspend: s.suspend,
        deleting: s.deleting,
        spec_valid: true,
        breaker: s.breaker.clone(),
        cooldown: Duration::from_secs(300),
        join_timeout: Duration::from_secs(900),
        asgs: &s.asgs,
        nodes: &s.nodes,
        not_joined: &s.not_joined,
        active,
        lock: s.lock.clone(),
        status: &s.status,
        now: t0(),
    }
}

#[test]
fn all_asgs_at_max_is_reported_and_nothing_is_done() {
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1].max = 1;
    s.asgs[2].max = 1;
    let p = s.plan();
    assert_eq!(
        p.command,
        Command::ReleaseLock,
        "nothing it can do: the lock goes back"
    );
    assert_eq!(p.status.phase, ReplenishPhase::Blocked);
    assert!(p.message.contains("no ASG can launch"), "{}", p.message);
}

#[test]
fn nodes_already_launching_are_not_ordered_twice() {
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1] = asg("c", 2, 2, 3); // raised already, its new node not Ready yet
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing);
    assert_eq!(p.status.phase, ReplenishPhase::Waiting);
}

#[test]
fn cooldown_not_over_means_wait_until_it_is() {
    let mut s = Scenario::steady().shortage_in_a();
    s.status.last_modification = Some(t0() - chrono::Duration::seconds(270));
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing);
    assert_eq!(p.status.phase, ReplenishPhase::Waiting);
    assert_eq!(
        p.requeue,
        Duration::from_secs(30),
        "requeued for the end of the cooldown"
    );
}

#[test]
fn a_refresh_holding_the_lock_pauses_the_replenisher() {
    let mut s = Scenario::steady().shortage_in_a();
    s.lock = LockState::Other("Refresh workers".into());
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing);
    assert_eq!(p.status.phase, ReplenishPhase::Paused);
    assert!(p.message.contains("Refresh workers"));
}

#[test]
fn a_suspended_group_is_left_alone() {
    let mut s = Scenario::steady().shortage_in_a();
    s.suspend = true;
    let p = s.plan();
    assert_eq!(p.command, Command::ReleaseLock);
    assert_eq!(p.status.phase, ReplenishPhase::Paused);
}

#[test]
fn without_the_lock_it_asks_for_it_first() {
    let mut s = Scenario::steady().shortage_in_a();
    s.lock = LockState::Free;
    assert_eq!(s.plan().command, Command::TakeLock);
}

#[test]
fn with_the_circuit_breaker_open_nothing_is_terminated_but_replacements_launch() {
    let open = Some("4 of 6 node(s) NotReady".to_string());
    // A surplus to take back: not while the breaker is open.
    let mut s = Scenario::steady().surplus_in_c();
    s.breaker = open.clone();
    let p = s.plan();
    assert_eq!(p.command, Command::ReleaseLock, "{}", p.message);
    assert_eq!(p.status.phase, ReplenishPhase::Blocked);
    assert!(p.message.contains("circuit breaker open"), "{}", p.message);
    // A termination recorded before it opened waits, its record kept.
    s.breaker = None;
    let drain = s.plan();
    let mut status = drain.status.clone();
    let recorded = record_termination(&mut status, t0()).expect("a target");
    s.status = status;
    assert_eq!(s.plan().command, Command::Terminate(recorded.clone()));
    s.breaker = open.clone();
    let held = s.plan();
    assert!(
        !matches!(held.command, Command::Terminate(_)),
        "{:?}",
        held.command
    );
    assert_eq!(held.status.scale_in, Some(recorded), "not forgotten");
    // A shortage is still replenished.
    let mut short = Scenario::steady().shortage_in_a();
    short.breaker = open;
    assert!(matches!(short.plan().command, Command::ScaleUp(_)));
}

#[test]
fn after_a_shortage_the_surplus_is_taken_back_from_the_raised_asg() {
    let mut s = Scenario::steady().surplus_in_c();
    let p = s.plan();
    let Command::Drain(target) = p.command else {
        panic!("expected a drain, got {:?}", p.command)
    };
    assert_eq!(
        (target.node.as_str(), target.auto_scaling_group.as_str()),
        ("nc2", "c"),
        "newest node of the raised ASG"
    );
    assert_eq!(target.since, t0());
    assert_eq!(p.status.scale_in.as_ref(), Some(&target), "persisted first");
    // The termination is recorded (and the raise taken back) before it is made ...
    let mut status = p.status.clone();
    let recorded = record_termination(&mut status, t0()).expect("a target");
    assert!(recorded.terminating.is_some());
    assert!(status.raised.is_empty());
    // ... and a restart with that record retries the same termination.
    s.status = status.clone();
    assert_eq!(s.plan().command, Command::Terminate(recorded.clone()));
    // Once the instance is gone, the record is settled.
    s.nodes.retain(|n| n.name != "nc2");
    let settled = s.plan();
    assert!(settled.status.scale_in.is_none());
    assert!(settled.status.raised.is_empty(), "not taken back twice");
    assert!(
        settled
            .status
            .last_action
            .is_some_and(|a| a.description.contains("removed nc2"))
    );
}

#[test]
fn a_scale_in_that_would_drop_below_desired_is_abandoned() {
    let mut s = Scenario::steady();
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 5));
    s.nodes[0].ready = false; // a node went NotReady meanwhile
    s.status.scale_in = Some(ScaleInTarget {
        node: "nc2".into(),
        instance_id: "i-nc2".into(),
        auto_scaling_group: "c".into(),
        since: t0(),
        terminating: None,
        decrement: true,
    });
    assert!(matches!(s.plan().command, Command::AbandonScaleIn { .. }));
}

#[test]
fn a_group_being_deleted_gives_a_scale_in_back_and_then_the_lock() {
    let mut s = Scenario::steady();
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 5));
    s.deleting = true;
    let idle = s.plan();
    assert_eq!(idle.command, Command::ReleaseLock, "{}", idle.message);
    assert!(idle.status.scale_in.is_none(), "no scale-in starts");
    let target = ScaleInTarget {
        node: "nc2".into(),
        instance_id: "i-nc2".into(),
        auto_scaling_group: "c".into(),
        since: t0(),
        terminating: None,
        decrement: true,
    };
    s.status.scale_in = Some(target.clone());
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::AbandonScaleIn { reason, .. } if reason.contains("being deleted")),
        "{:?}",
        p.command
    );
    // Drained already and its termination recorded: that termination is made.
    s.status.scale_in = Some(ScaleInTarget {
        terminating: Some(t0()),
        ..target
    });
    assert!(matches!(s.plan().command, Command::Terminate(_)));
}

#[test]
fn a_group_being_deleted_launches_nothing_when_short() {
    let mut s = Scenario::steady().shortage_in_a();
    s.deleting = true;
    let p = s.plan();
    assert_eq!(p.command, Command::ReleaseLock, "{}", p.message);
    assert!(p.message.contains("being deleted"), "{}", p.message);
}

#[test]
fn a_scale_in_drain_that_takes_too_long_is_abandoned() {
    let mut s = Scenario::steady();
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 5));
    s.status.scale_in = Some(ScaleInTarget {
        node: "nc2".into(),
        instance_id: "i-nc2".into(),
        auto_scaling_group: "c".into(),
        since: t0() - chrono::Duration::minutes(11),
        terminating: None,
        decrement: true,
    });
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::AbandonScaleIn { reason, .. } if reason.contains("timed out")),
        "{:?}",
        p.command
    );
}

#[test]
fn an_instance_not_joined_past_the_timeout_is_removed() {
    let mut s = Scenario::steady();
    s.not_joined = vec![
        NotJoinedView {
            instance_id: "i-young".into(),
            asg: "a".into(),
            launch_time: Some(t0() - chrono::Duration::minutes(5)),
        },
        NotJoinedView {
            instance_id: "i-old".into(),
            asg: "c".into(),
            launch_time: Some(t0() - chrono::Duration::minutes(16)),
        },
    ];
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::RemoveNotJoined(t) if t.instance_id == "i-old" && t.auto_scaling_group == "c"),
        "{:?}",
        p.command
    );
    assert_eq!(p.status.phase, ReplenishPhase::CleaningUp);
}

#[test]
fn it_wakes_up_when_a_not_joined_instance_becomes_overdue() {
    let mut s = Scenario::steady();
    s.not_joined = vec![NotJoinedView {
        instance_id: "i-new".into(),
        asg: "a".into(),
        launch_time: Some(t0() - chrono::Duration::minutes(14)),
    }];
    let p = s.plan();
    assert_eq!(p.command, Command::ReleaseLock);
    s.lock = LockState::Free;
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing);
    assert_eq!(p.requeue, Duration::from_secs(60), "due in one minute");
    s.not_joined[0].launch_time = Some(t0() - chrono::Duration::seconds(14 * 60 + 50));
    assert_eq!(
        s.plan().requeue,
        Duration::from_secs(10),
        "due in ten seconds, not at the next idle resync"
    );
}

#[test]
fn an_extra_master_is_removed_at_once_and_masters_are_never_launched_elsewhere() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    s.asgs[0] = asg("a", 2, 2, 2);
    s.not_joined = vec![NotJoinedView {
        instance_id: "i-extra".into(),
        asg: "a".into(),
        launch_time: Some(t0()),
    }];
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::RemoveNotJoined(t) if t.instance_id == "i-extra" && t.reason.contains("extra master")),
        "{:?}",
        p.command
    );
    // A missing master is not replaced in another ASG.
    let mut s = Scenario::steady().shortage_in_a();
    s.role = Role::Master;
    let p = s.plan();
    assert!(!matches!(p.command, Command::ScaleUp(_)));
    assert_eq!(p.status.phase, ReplenishPhase::Blocked);
}

#[test]
fn a_raise_in_flight_counts_as_launching_within_the_grace_and_is_not_ordered_twice() {
    // a is short; c was raised a moment ago and AWS has not launched yet.
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1] = asg("c", 2, 1, 3);
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    assert_eq!(p.status.phase, ReplenishPhase::Waiting);
    assert_eq!(
        p.status.behind,
        vec![
            AsgSince {
                auto_scaling_group: "a".into(),
                since: t0()
            },
            AsgSince {
                auto_scaling_group: "c".into(),
                since: t0()
            },
        ]
    );
    assert!(
        p.status
            .excluded
            .iter()
            .all(|e| e.auto_scaling_group != "c")
    );
    // The instance is Pending: still on its way.
    s.asgs[1] = AsgView {
        pending: 1,
        ..asg("c", 2, 2, 3)
    };
    assert_eq!(s.plan().command, Command::Nothing);
    // Still nothing launched past the grace: c is short too, d gets the node.
    s.asgs[1] = asg("c", 2, 1, 3);
    s.status = p.status;
    let active = s.active();
    let later = plan(&Input {
        now: t0() + crate::controllers::group_view::to_chrono(crate::cloud::LAUNCH_GRACE),
        ..input_of(&s, &active)
    });
    assert_eq!(
        later.command,
        Command::ScaleUp(vec![DesiredChange {
            asg: "d".into(),
            from: 1,
            to: 2
        }]),
        "{}",
        later.message
    );
    assert!(
        later
            .status
            .excluded
            .iter()
            .any(|e| e.auto_scaling_group == "c" && e.reason.contains("for 1m"))
    );
}

#[test]
fn a_lost_instance_its_asg_will_replace_is_on_its_way() {
    // The node is gone; its instance is still in the ASG (EC2 terminated it,
    // the ASG's health check has not noticed yet), or already dropped.
    let mut s = Scenario::steady();
    s.nodes.retain(|n| n.name != "na");
    assert_eq!(s.plan().command, Command::Nothing);
    s.asgs[0] = asg("a", 1, 0, 3);
    assert_eq!(s.plan().command, Command::Nothing);
}

#[test]
fn a_node_not_ready_past_the_join_timeout_is_not_on_its_way() {
    let mut s = Scenario::steady();
    s.nodes[0].ready = false; // na, an hour old
    assert!(matches!(s.plan().command, Command::ScaleUp(_)));
    // A young node that is not Ready yet is joining.
    s.nodes[0].launch_time = Some(t0() - chrono::Duration::minutes(2));
    assert_eq!(s.plan().command, Command::Nothing);
}

#[test]
fn an_asg_with_launch_suspended_is_not_launching() {
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1].suspended_processes = vec!["Launch".into()];
    s.asgs[1] = s.asgs[1].clone().judge(None, t0());
    let p = s.plan();
    assert_eq!(
        p.command,
        Command::ScaleUp(vec![DesiredChange {
            asg: "d".into(),
            from: 1,
            to: 2
        }])
    );
    assert!(
        p.status
            .excluded
            .iter()
            .any(|e| e.auto_scaling_group == "c" && e.reason.contains("Launch process"))
    );
}

#[test]
fn a_raise_interrupted_by_a_restart_is_settled_against_the_asg() {
    let mut s = Scenario::steady();
    let raising = |from, to| Raise {
        auto_scaling_group: "c".into(),
        from,
        to,
    };
    // Recorded, never made (killed before the call): the count is taken back.
    s.status.raising = vec![raising(1, 2)];
    s.status.raised = vec![AsgCount {
        auto_scaling_group: "c".into(),
        count: 1,
    }];
    let p = s.plan();
    assert!(p.status.raising.is_empty());
    assert!(p.status.raised.is_empty());
    // Made (killed after the call): kept, and not ordered again.
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", false, 0));
    s.nodes.retain(|n| n.name != "na");
    s.asgs[0] = failing(asg("a", 1, 0, 3));
    let p = s.plan();
    assert!(p.status.raising.is_empty());
    assert_eq!(p.status.raised[0].count, 1);
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
}

#[test]
fn a_raise_not_made_in_a_dry_run_is_not_remembered_as_done() {
    let s = Scenario::steady().shortage_in_a();
    let p = s.plan();
    let Command::ScaleUp(changes) = &p.command else {
        panic!("{:?}", p.command)
    };
    let mut status = p.status.clone();
    assert_eq!(status.raised.len(), 1, "recorded before the call");
    raise_not_made(&mut status);
    assert!(status.raising.is_empty());
    assert!(
        status.raised.is_empty(),
        "{:?} after {changes:?}",
        status.raised
    );
    assert_eq!(
        status.last_modification, p.status.last_modification,
        "the cooldown still paces the dry run's log"
    );
}

fn never_joined(id: &str, asg: &str, minutes_old: i64) -> NotJoinedView {
    NotJoinedView {
        instance_id: id.into(),
        asg: asg.into(),
        launch_time: Some(t0() - chrono::Duration::minutes(minutes_old)),
    }
}

#[test]
fn a_never_joined_instance_is_terminated_in_its_asg_decrementing_only_above_min() {
    let mut s = Scenario::steady();
    s.not_joined = vec![never_joined("i-late", "a", 20)];
    // kops: min = desired. Terminated without decrement: the ASG replaces it.
    s.asgs[0] = AsgView {
        min: 2,
        ..asg("a", 2, 2, 3)
    };
    let p = s.plan();
    let Command::RemoveNotJoined(target) = &p.command else {
        panic!("{:?}", p.command)
    };
    assert!(!target.decrement);
    assert_eq!(p.status.cleanup.as_ref(), Some(target), "recorded first");
    assert_eq!(p.status.removals[0].count, 1);
    // Above min: decremented.
    s.asgs[0].min = 1;
    s.asgs[0] = s.asgs[0].clone().judge(None, t0());
    let Command::RemoveNotJoined(target) = s.plan().command else {
        panic!()
    };
    assert!(target.decrement);
}

#[test]
fn a_replacement_that_never_joins_either_backs_off_and_never_blocks_scale_up() {
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1] = asg("c", 2, 2, 3);
    s.not_joined = vec![never_joined("i-again", "c", 20)];
    s.status.removals = vec![NotJoinedRemovals {
        auto_scaling_group: "c".into(),
        count: 1,
        last: t0() - chrono::Duration::seconds(20),
        retry_after: t0() + chrono::Duration::seconds(40),
    }];
    // Not due: the shortage is handled meanwhile.
    let p = s.plan();
    assert_eq!(
        p.command,
        Command::ScaleUp(vec![DesiredChange {
            asg: "d".into(),
            from: 1,
            to: 2
        }]),
        "{}",
        p.message
    );
    assert_eq!(
        p.requeue,
        Duration::from_secs(2),
        "next step soon, removal due in 40s"
    );
    // Its instances do not join: no raise goes there.
    s.desired = 4;
    let Command::ScaleUp(changes) = s.plan().command else {
        panic!("a raise")
    };
    assert!(changes.iter().all(|c| c.asg != "c"), "{changes:?}");
    s.desired = 3;
    // Due: removed, and the next one backs off twice as long.
    s.status.removals[0].retry_after = t0();
    let p = s.plan();
    assert!(
        matches!(p.command, Command::RemoveNotJoined(_)),
        "{:?}",
        p.command
    );
    assert_eq!(p.status.removals[0].count, 2);
    assert_eq!(
        p.status.removals[0].retry_after,
        t0() + chrono::Duration::minutes(2)
    );
    // A failed call leaves the record; the plan moves on until it is due.
    s.status = p.status;
    let p = s.plan();
    assert!(matches!(p.command, Command::ScaleUp(_)), "{:?}", p.command);
    // Once a node of c launched after the removal is Ready, the run ends:
    // the next removal there counts from one again.
    s.nodes.push(node("nc-new", "c", true, -1));
    let p = s.plan();
    assert!(
        matches!(p.command, Command::RemoveNotJoined(_)),
        "{:?}",
        p.command
    );
    assert_eq!(p.status.removals[0].count, 1);
}

#[test]
fn retrying_the_recorded_removal_after_a_restart_is_not_another_instance_that_never_joined() {
    let mut s = Scenario::steady();
    s.not_joined = vec![never_joined("i-late", "a", 20)];
    let first = s.plan();
    assert!(matches!(first.command, Command::RemoveNotJoined(_)));
    // Killed after the record, before the call: the instance is still in
    // its ASG. Once the backoff is over, the same instance is removed,
    // and it still counts as the first that never joined.
    s.status = first.status;
    s.status.removals[0].retry_after = t0();
    let p = s.plan();
    let Command::RemoveNotJoined(target) = &p.command else {
        panic!("{:?}", p.command)
    };
    assert_eq!(target.instance_id, "i-late");
    assert!(p.message.starts_with("retrying"), "{}", p.message);
    assert_eq!(p.status.removals[0].count, 1, "{:?}", p.status.removals);
}

// ---- properties over random states ----

fn arb_state() -> impl Strategy<Value = Scenario> {
    let asgs = prop::collection::vec((0i32..4, 0i32..4, 0i32..3, any::<bool>()), 1..4);
    (
        asgs,
        0i32..8,
        0u8..3,
        any::<bool>(),
        prop::collection::vec(any::<bool>(), 12),
        0u8..3,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(asgs, desired, lock, raised, readiness, role, in_scale_in, deleting)| {
                let mut views = vec![];
                let mut nodes = vec![];
                let mut not_joined = vec![];
                let mut flags = readiness.into_iter().cycle();
                for (i, (desired_in, instances, headroom, joined_all)) in
                    asgs.into_iter().enumerate()
                {
                    let name = format!("asg{i}");
                    let instances = instances.min(desired_in + 1);
                    views.push(
                        AsgView {
                            name: name.clone(),
                            desired: desired_in,
                            min: 0,
                            max: desired_in.max(instances) + headroom,
                            instances,
                            ..Default::default()
                        }
                        .judge(None, t0()),
                    );
                    for j in 0..instances {
                        let id = format!("i-{i}-{j}");
                        if joined_all || j > 0 {
                            nodes.push(GroupNode {
                                name: id.clone(),
                                instance_id: Some(id),
                                asg: Some(name.clone()),
                                ready: flags.next().unwrap_or(true),
                                launch_time: Some(t0() - chrono::Duration::minutes(j as i64)),
                                fate: None,
                            });
                        } else {
                            not_joined.push(NotJoinedView {
                                instance_id: id,
                                asg: name.clone(),
                                launch_time: Some(t0() - chrono::Duration::minutes(30)),
                            });
                        }
                    }
                }
                let mut status = ReplenisherStatus::default();
                if raised {
                    status.raised = vec![AsgCount {
                        auto_scaling_group: "asg0".into(),
                        count: 1,
                    }];
                }
                if in_scale_in && let Some(n) = nodes.first() {
                    status.scale_in = Some(ScaleInTarget {
                        node: n.name.clone(),
                        instance_id: n.instance_id.clone().unwrap_or_default(),
                        auto_scaling_group: n.asg.clone().unwrap_or_default(),
                        since: t0(),
                        terminating: None,
                        decrement: true,
                    });
                }
                Scenario {
                    role: if role == 0 {
                        Role::Master
                    } else {
                        Role::Worker
                    },
                    desired,
                    suspend: false,
                    deleting,
                    asgs: views,
                    nodes,
                    not_joined,
                    lock: match lock {
                        0 => LockState::Free,
                        1 => LockState::Ours,
                        _ => LockState::Other("Refresh x".into()),
                    },
                    status,
                    breaker: None,
                }
            },
        )
}

/// Any instant chrono can represent, the extremes included.
fn arb_instant() -> impl Strategy<Value = DateTime<Utc>> {
    prop_oneof![
        Just(DateTime::<Utc>::MIN_UTC),
        Just(DateTime::<Utc>::MAX_UTC),
        Just(t0()),
        (DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp())
            .prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)),
    ]
}

proptest! {
    /// No duration, however long, and no clock, however far off, makes a
    /// plan panic (a panic once stopped every controller). The plan's own
    /// invariants are the other properties'; here it only has to answer.
    #[test]
    fn extreme_durations_and_clocks_never_panic(
        s in arb_state(),
        cooldown in any::<u64>(),
        join in any::<u64>(),
        nanos in any::<u32>(),
        now in arb_instant(),
        since in arb_instant(),
    ) {
        let mut s = s;
        s.status.last_modification = Some(since);
        if let Some(t) = s.status.scale_in.as_mut() {
            t.since = since;
        }
        for n in s.nodes.iter_mut() {
            n.launch_time = Some(since);
        }
        let p = s.plan_with(
            Duration::new(cooldown, nanos % 1_000_000_000),
            Duration::new(join, 0),
            now,
        );
        prop_assert!(
            p.requeue <= crate::controllers::group_view::LONGEST_WAIT,
            "a requeue of {:?} would overflow the runtime's clock", p.requeue
        );
    }

    /// With the circuit breaker open nothing is drained, terminated or
    /// removed, whatever else the state says.
    #[test]
    fn an_open_breaker_terminates_nothing(mut s in arb_state()) {
        s.breaker = Some("open".into());
        let p = s.plan();
        prop_assert!(
            !matches!(p.command, Command::Drain(_) | Command::Terminate(_) | Command::RemoveNotJoined(_)),
            "{:?}", p.command
        );
    }

    #[test]
    fn never_mutates_without_the_lock(s in arb_state()) {
        let p = s.plan();
        if p.command.mutates() {
            prop_assert_eq!(&s.lock, &LockState::Ours, "{:?}", p.command);
        }
    }

    #[test]
    fn never_exceeds_an_asgs_max_and_only_scales_up_when_short(s in arb_state()) {
        let ready = s.nodes.iter().filter(|n| n.ready).count() as i32;
        if let Command::ScaleUp(changes) = s.plan().command {
            prop_assert!(ready < s.desired, "scale-up with {} Ready of {}", ready, s.desired);
            for c in changes {
                let a = s.asgs.iter().find(|a| a.name == c.asg).expect("known ASG");
                prop_assert!(c.to <= a.max && c.to > c.from, "{:?} max {}", c, a.max);
                prop_assert!(a.launching, "{} is not launching", a.name);
            }
        }
    }

    /// While the NodeGroup is being deleted nothing new starts: no launch,
    /// no drain, no new scale-in or cleanup; a scale-in under way is either
    /// abandoned or its recorded termination made.
    #[test]
    fn a_group_being_deleted_starts_nothing(mut s in arb_state()) {
        s.deleting = true;
        let p = s.plan();
        prop_assert!(!matches!(p.command, Command::ScaleUp(_) | Command::Drain(_)), "{:?}", p.command);
        if let Command::Terminate(t) = &p.command {
            prop_assert!(s.status.scale_in.as_ref().is_some_and(|r| r.instance_id == t.instance_id && r.terminating.is_some()));
        }
        if s.status.scale_in.is_none() {
            prop_assert!(p.status.scale_in.is_none(), "a scale-in started");
        }
        if s.status.cleanup.is_none() {
            prop_assert!(p.status.cleanup.is_none(), "a cleanup started");
            prop_assert!(!matches!(p.command, Command::RemoveNotJoined(_)), "{:?}", p.command);
        }
    }

    #[test]
    fn never_removes_a_ready_node_while_ready_would_drop_below_desired(s in arb_state()) {
        let ready = s.nodes.iter().filter(|n| n.ready).count() as i32;
        match s.plan().command {
            Command::Drain(target) => {
                let target_ready = s.nodes.iter().any(|n| n.instance_id.as_deref() == Some(&target.instance_id) && n.ready);
                prop_assert!(ready - i32::from(target_ready) >= s.desired, "drains {} with {} Ready of {}", target.node, ready, s.desired);
            }
            Command::RemoveNotJoined(t) => {
                prop_assert!(s.nodes.iter().all(|n| n.instance_id.as_deref() != Some(&t.instance_id)), "{} has a node", t.instance_id);
            }
            _ => {}
        }
    }
}
