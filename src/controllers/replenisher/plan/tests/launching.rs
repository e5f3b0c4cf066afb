//! Whether an ASG is launching: raises in flight, lost instances, suspended Launch, raises a restart or a dry run interrupted.

use super::*;

#[test]
fn a_raise_in_flight_counts_as_launching_within_the_grace_and_is_not_ordered_twice() {
    // a is short; c was raised a moment ago and AWS has not launched yet.
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1] = asg("c", 2, 1, 3);
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    assert_eq!(p.status.phase, ReplenishPhase::ScalingUp);
    // Still scaling up: the executor keeps the group's lock while what was
    // raised is on its way (no refresh starts over a raise in flight).
    assert!(crate::controllers::execute::Record::keeps_lock(&p.status));
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
    let later = plan(&at(
        input_of(&s, &active),
        t0() + crate::controllers::group_view::to_chrono(crate::cloud::LAUNCH_GRACE),
    ));
    assert_eq!(
        later.command,
        Command::SetDesired(vec![DesiredChange {
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
    assert!(matches!(s.plan().command, Command::SetDesired(_)));
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
        Command::SetDesired(vec![DesiredChange {
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
    let Command::SetDesired(changes) = &p.command else {
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
