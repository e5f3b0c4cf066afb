//! Properties over random states and instants: the plan's invariants hold and it never panics.

use super::*;

// ---- properties over random states ----

/// The nodes `mask` marks (cycled over the nodes), protected.
pub(super) fn protected_by(
    s: &Scenario,
    mask: &[bool],
) -> std::collections::BTreeMap<String, String> {
    s.nodes
        .iter()
        .zip(mask.iter().cycle())
        .filter(|(_, p)| **p)
        .map(|(n, _)| (n.name.clone(), "annotated".to_string()))
        .collect()
}

pub(super) fn arb_state() -> impl Strategy<Value = Scenario> {
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
                            let ready = flags.next().unwrap_or(true);
                            nodes.push(GroupNode {
                                name: id.clone(),
                                instance_id: Some(id),
                                asg: Some(name.clone()),
                                ready,
                                launch_time: Some(t0() - chrono::Duration::minutes(j as i64)),
                                // Some NotReady nodes are unhealthy (past the
                                // timeout), some within it.
                                unhealthy_since: (!ready).then(|| {
                                    t0() - chrono::Duration::minutes(5 + 10 * (j as i64 % 2))
                                }),
                                fate: None,
                                fate_changes: None,
                                drifted: false,
                                unschedulable: false,
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
                        repair: false,
                        reason: None,
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
                    window: crate::controllers::window::WindowState::Always,
                    protected: Default::default(),
                    slot: None,
                    breaker: None,
                    external_update: None,
                    repair: true,
                    fallback: None,
                    control_plane: None,
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

    /// With a worker group's circuit breaker open nothing is drained,
    /// terminated or removed, whatever else the state says. (A Master
    /// group's breaker counts only its own masters; the authority counts
    /// the cluster's instead: see the next property.)
    #[test]
    fn an_open_breaker_terminates_nothing(mut s in arb_state()) {
        s.role = Role::Worker;
        s.breaker = Some("open".into());
        let p = s.plan();
        prop_assert!(
            !matches!(p.command, Command::Drain(_) | Command::Terminate(_) | Command::RemoveNotJoined(_)),
            "{:?}", p.command
        );
    }

    /// A Master group never starts taking a master away (a repair's
    /// drain, a never-joined removal) while another master of the cluster
    /// is down, whatever its breaker says.
    #[test]
    fn a_master_goes_only_while_every_other_master_is_ready(mut s in arb_state()) {
        s.role = Role::Master;
        s.breaker = Some("open".into());
        let p = s.plan();
        let started = match &p.command {
            Command::Drain(t) if s.status.scale_in.is_none() => Some(t.instance_id.clone()),
            Command::RemoveNotJoined(t) => Some(t.instance_id.clone()),
            _ => None,
        };
        if let Some(id) = started {
            let cp = s.control_plane_view();
            let ready_besides = cp.ready.iter().filter(|r| **r != id).count() as i32;
            prop_assert!(ready_besides >= cp.expected - 1, "{:?} while {:?}", p.command, cp);
        }
    }

    /// While the group's refresher holds the lock, nothing is decided.
    /// (Without it, the executor takes it before carrying out anything:
    /// `execute`'s tests.)
    #[test]
    fn never_mutates_while_the_other_controller_holds_the_lock(s in arb_state()) {
        let p = s.plan();
        if matches!(s.lock, LockState::Other(_)) {
            prop_assert!(!p.command.mutates(), "{:?}", p.command);
            prop_assert_eq!(&p.status.scale_in, &s.status.scale_in);
        }
    }

    #[test]
    fn never_exceeds_an_asgs_max_and_only_scales_up_when_short(s in arb_state()) {
        let ready = s.nodes.iter().filter(|n| n.ready).count() as i32;
        if let Command::SetDesired(changes) = s.plan().command {
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
        prop_assert!(!matches!(p.command, Command::SetDesired(_) | Command::Drain(_)), "{:?}", p.command);
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
                if target.repair {
                    // A repair removes a node that is not Ready: it costs no
                    // Ready node, whatever the count (a master, or a worker
                    // nothing can replace, is repaired below desired).
                    prop_assert!(!target_ready, "repairs Ready {}", target.node);
                } else {
                    prop_assert!(ready - i32::from(target_ready) >= s.desired, "drains {} with {} Ready of {}", target.node, ready, s.desired);
                }
            }
            Command::RemoveNotJoined(t) => {
                prop_assert!(s.nodes.iter().all(|n| n.instance_id.as_deref() != Some(&t.instance_id)), "{} has a node", t.instance_id);
            }
            _ => {}
        }
    }

    /// Whichever nodes are protected from voluntary disruption: a new
    /// scale-in never picks one (a repair, of a dead node, may).
    #[test]
    fn a_new_scale_in_never_picks_a_protected_node(
        mut s in arb_state(),
        mask in prop::collection::vec(any::<bool>(), 12),
    ) {
        s.status.scale_in = None;
        s.lock = LockState::Ours;
        s.deleting = false;
        s.protected = protected_by(&s, &mask);
        if let Command::Drain(target) = s.plan().command
            && !target.repair
        {
            prop_assert!(!s.protected.contains_key(&target.node), "picked protected {}", target.node);
        }
    }
}
