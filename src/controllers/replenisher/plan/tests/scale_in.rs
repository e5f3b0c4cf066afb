//! Going back to the original layout: the surplus taken back, abandoned scale-ins, a group being deleted.

use super::*;

#[test]
fn after_a_shortage_the_surplus_is_taken_back_from_the_raised_asg() {
    let mut s = Scenario::steady().surplus_in_c();
    let p = s.plan();
    let Command::Drain(Batch { first: target, .. }) = p.command else {
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

/// A scale-in of `nc2` (in `c`) recorded since `since`, its reason not
/// carried yet.
fn nc2_removal(since: chrono::DateTime<chrono::Utc>) -> ScaleInTarget {
    ScaleInTarget {
        node: "nc2".into(),
        instance_id: "i-nc2".into(),
        auto_scaling_group: "c".into(),
        since,
        terminating: None,
        decrement: true,
        repair: false,
        reason: None,
    }
}

#[test]
fn a_scale_in_that_would_drop_below_desired_is_abandoned() {
    let mut s = Scenario::steady();
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 5));
    s.nodes[0].ready = false; // a node went NotReady meanwhile
    s.status.scale_in = Some(nc2_removal(t0()));
    assert!(matches!(s.plan().command, Command::GiveBack { .. }));
}

/// Issue 68, items 2 and 3: a stop keeps the removal recorded, but not
/// the group's lock or the disruption slot (a suspend may last, and
/// another group's disruption needs the slot meanwhile); the executor
/// gives both back, and takes them again when the removal resumes.
#[test]
fn a_removal_held_by_a_stop_keeps_its_record_but_not_the_lock_or_the_slot() {
    use crate::controllers::execute::Record;
    let mut s = Scenario::steady();
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 5));
    s.status.scale_in = Some(nc2_removal(t0()));
    s.suspend = true;
    let p = s.plan();
    releases(&p);
    assert!(!p.status.in_hand(), "a suspended removal keeps the slot");
    assert!(p.status.scale_in.is_some(), "the removal forgotten");
    // Resumed: in hand again, lock and slot with it.
    s.suspend = false;
    s.status = p.status;
    let p = s.plan();
    assert!(p.command.mutates(), "{:?}: {}", p.command, p.message);
    assert!(p.status.in_hand() && p.status.keeps_lock(), "{}", p.message);
}

#[test]
fn a_group_being_deleted_gives_a_scale_in_back_and_then_the_lock() {
    let mut s = Scenario::steady();
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 5));
    s.deleting = true;
    let idle = s.plan();
    releases(&idle);
    assert!(idle.status.scale_in.is_none(), "no scale-in starts");
    let target = nc2_removal(t0());
    s.status.scale_in = Some(target.clone());
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::GiveBack { reason, .. } if reason.contains("being deleted")),
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
    releases(&p);
    assert!(p.message.contains("being deleted"), "{}", p.message);
}

#[test]
fn a_scale_in_drain_that_takes_too_long_is_abandoned() {
    let mut s = Scenario::steady();
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 5));
    s.status.scale_in = Some(nc2_removal(t0() - chrono::Duration::minutes(11)));
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::GiveBack { reason, .. } if reason.contains("timed out")),
        "{:?}",
        p.command
    );
}

#[test]
fn outside_the_maintenance_windows_the_surplus_is_kept_until_one_opens() {
    let mut s = Scenario::steady().surplus_in_c();
    let opens = t0() + chrono::Duration::hours(3);
    s.window = crate::controllers::window::WindowState::Closed { opens: Some(opens) };
    let p = s.plan();
    releases(&p);
    assert!(
        p.message.contains("1 surplus node(s) kept"),
        "{}",
        p.message
    );
    assert!(p.message.contains("maintenance windows"), "{}", p.message);
    assert!(p.status.scale_in.is_none());
    assert!(p.requeue <= Duration::from_secs(3 * 3600));
    assert!(
        p.requeue > Duration::from_secs(60),
        "given back, it looks again at the window's time: {:?}",
        p.requeue
    );
    // The lock and the slot were given back (another group's master may be
    // dead meanwhile): waiting on, it holds nothing and does nothing.
    s.lock = LockState::Free;
    s.slot = Some(SlotState::Free);
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    assert!(
        p.message.contains("1 surplus node(s) kept"),
        "{}",
        p.message
    );
    // Open: it takes the lock again, then drains (the executor takes the
    // slot before the first step).
    s.window = crate::controllers::window::WindowState::Open {
        closes: opens + chrono::Duration::hours(1),
    };
    needs_the_lock(&s.plan());
    s.lock = LockState::Ours;
    assert!(matches!(s.plan().command, Command::Drain(_)));
}

#[test]
fn the_surplus_taken_back_is_never_a_protected_node() {
    let mut s = Scenario::steady().surplus_in_c();
    s.protected = [("nc2".to_string(), "pod web/db-0 is annotated".to_string())].into();
    // The raised ASG's other node goes: the layout still comes back.
    let p = s.plan();
    let Command::Drain(Batch { first: target, .. }) = p.command else {
        panic!("expected a drain, got {:?}: {}", p.command, p.message)
    };
    assert_eq!(
        (target.node.as_str(), target.auto_scaling_group.as_str()),
        ("nc", "c")
    );
    // Every Ready node protected: the surplus is kept, and the message says why.
    s.protected = s
        .nodes
        .iter()
        .map(|n| (n.name.clone(), "cordoned by someone else".to_string()))
        .collect();
    let p = s.plan();
    releases(&p);
    assert!(
        p.message.contains("1 surplus node(s) kept"),
        "{}",
        p.message
    );
    assert!(
        p.message.contains("nc2 (cordoned by someone else)"),
        "{}",
        p.message
    );
    assert!(p.status.scale_in.is_none());
}

#[test]
fn taking_the_surplus_back_holds_a_disruption_slot_and_waits_for_one() {
    let mut s = Scenario::steady().surplus_in_c();
    // Another group is disrupting: the surplus waits, nothing recorded.
    s.slot = Some(SlotState::Full(
        "1 of 1 disruption slot(s) held, by team/other".into(),
    ));
    // The lock is given back meanwhile: the slot's holder may be this
    // group's refresher, waiting for it.
    let p = s.plan();
    releases(&p);
    assert!(
        p.message.contains("waiting for a disruption slot"),
        "{}",
        p.message
    );
    assert!(p.message.contains("team/other"), "{}", p.message);
    assert!(p.status.scale_in.is_none());
    s.lock = LockState::Free;
    assert_eq!(s.plan().command, Command::Nothing, "not taken while full");
    s.lock = LockState::Ours;
    // Free: the drain is planned (the lock held); the executor takes the
    // slot before its first step (`execute`'s tests).
    s.slot = Some(SlotState::Free);
    let p = s.plan();
    assert!(matches!(p.command, Command::Drain(_)), "{}", p.message);
    // Without the lock, the lock comes first.
    s.lock = LockState::Free;
    needs_the_lock(&s.plan());
    // Held: the drain starts.
    s.lock = LockState::Ours;
    s.slot = Some(SlotState::Ours);
    assert!(matches!(s.plan().command, Command::Drain(_)));
    // Nothing left to do: the slot goes back with the lock, or alone.
    let mut steady = Scenario::steady();
    steady.lock = LockState::Free;
    steady.slot = Some(SlotState::Ours);
    releases(&steady.plan());
}

#[test]
fn a_scale_in_whose_asg_left_the_spec_gives_its_node_back() {
    let mut s = Scenario::steady().surplus_in_c();
    let p = s.plan();
    let Command::Drain(Batch { first: target, .. }) = p.command else {
        panic!("expected a drain, got {:?}: {}", p.command, p.message)
    };
    s.status = p.status;
    // The user drops c from the NodeGroup mid-drain: c is no longer
    // described, its instances no longer the group's. The drained node
    // still runs, cordoned by us.
    s.asgs.retain(|a| a.name != "c");
    s.nodes.retain(|n| n.asg.as_deref() != Some("c"));
    let p = s.plan();
    let Command::GiveBack {
        target: kept,
        reason,
    } = &p.command
    else {
        panic!(
            "expected the node given back, got {:?}: {}",
            p.command, p.message
        )
    };
    assert_eq!(kept, &target);
    assert!(
        reason.contains("c is no longer one of the group's ASGs"),
        "{reason}"
    );
}

/// Issue 68, hole 2: a scale-in under way when its group was stopped (the
/// lock and slot given back, the record kept) resumes asking the rule book
/// as a new one would: a slot first, and given back when the window has
/// closed or its node turned protected meanwhile. In hand (the slot still
/// ours), a window closing does not leave it half-drained.
#[test]
fn a_scale_in_resumed_without_its_slot_asks_the_rules_again() {
    let target = nc2_removal(t0());
    let resumed = |slot: SlotState| {
        let mut s = Scenario::steady().surplus_in_c();
        s.status.scale_in = Some(target.clone());
        s.slot = Some(slot);
        s
    };
    // Resumed with a slot free: its drain goes on (the executor takes the
    // slot before the step).
    let p = resumed(SlotState::Free).plan();
    assert!(matches!(p.command, Command::Drain(_)), "{}", p.message);
    let kept = p.status.scale_in.as_ref().map(|t| &t.instance_id);
    assert_eq!(kept, Some(&target.instance_id), "kept meanwhile");
    // Another group holds the slots: given back, not drained.
    let p = resumed(SlotState::Full("Refresh ns/other".into())).plan();
    assert!(
        matches!(&p.command, Command::GiveBack { target: t, .. } if t.node == "nc2"),
        "{:?}",
        p.command
    );
    assert!(p.message.contains("Refresh ns/other"), "{}", p.message);
    // Its node turned protected while stopped: given back, saying why.
    let mut s = resumed(SlotState::Free);
    s.protected
        .insert("nc2".into(), "do-not-disrupt (the Node)".into());
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::GiveBack { reason, .. } if reason.contains("protected")),
        "{:?}",
        p.command
    );
    // Every window closed meanwhile: given back too.
    let mut s = resumed(SlotState::Free);
    s.window = crate::controllers::window::WindowState::Closed { opens: None };
    assert!(matches!(s.plan().command, Command::GiveBack { .. }));
    // In hand, the slot ours: the window closing does not stop its drain.
    let mut s = resumed(SlotState::Ours);
    s.window = crate::controllers::window::WindowState::Closed { opens: None };
    assert!(
        matches!(s.plan().command, Command::Drain(_)),
        "{:?}",
        s.plan().command
    );
    // In hand and protected meanwhile: given back.
    let mut s = resumed(SlotState::Ours);
    s.protected
        .insert("nc2".into(), "cordoned by someone else".into());
    assert!(matches!(s.plan().command, Command::GiveBack { .. }));
}

/// A removal's reason is decided once, when it is chosen, and carried; a
/// record written before reasons were carried gets one on its next step,
/// kept in the status the step is recorded with.
#[test]
fn a_scale_in_recorded_without_a_reason_gets_one_on_its_next_step() {
    let mut s = Scenario::steady().surplus_in_c();
    s.status.scale_in = Some(nc2_removal(t0()));
    s.slot = Some(SlotState::Ours);
    let p = s.plan();
    let Command::Drain(Batch { first, .. }) = &p.command else {
        panic!("expected a drain step: {:?} {}", p.command, p.message);
    };
    assert_eq!(first.reason.as_deref(), Some("scale_in"));
    let recorded = p.status.scale_in.as_ref().and_then(|t| t.reason.as_deref());
    assert_eq!(recorded, Some("scale_in"));
}
