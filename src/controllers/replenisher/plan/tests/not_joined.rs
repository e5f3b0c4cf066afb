//! Instances that never joined, and extra masters: removed in their ASG, with a backoff.

use super::*;

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
    releases(&p);
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
    assert!(!matches!(p.command, Command::SetDesired(_)));
    assert_eq!(p.status.phase, ReplenishPhase::Blocked);
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
        Command::SetDesired(vec![DesiredChange {
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
    let Command::SetDesired(changes) = s.plan().command else {
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
    assert!(
        matches!(p.command, Command::SetDesired(_)),
        "{:?}",
        p.command
    );
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
