//! What the walks through time (`controllers/walk.rs`) found, one scenario each: the
//! layout the replenisher keeps through removals with decrement, and the
//! waits that could not end.

use super::*;
use crate::crd::replenisher::{CleanupTarget, Replacement};

fn count(list: &[AsgCount], asg: &str) -> i32 {
    list.iter()
        .find(|r| r.auto_scaling_group == asg)
        .map_or(0, |r| r.count)
}

/// An ASG whose never-joined instance was removed with decrement was held
/// out of raises until a node launched there joined, which only a raise
/// could bring: for good. Now only during its backoff.
#[test]
fn an_asg_is_a_raise_candidate_again_once_its_never_joined_backoff_is_over() {
    let mut s = Scenario::steady();
    // Zone a's node is gone and its last instance never joined (removed
    // with decrement); c and d are at max.
    s.asgs = vec![asg("a", 0, 0, 3), asg("c", 1, 1, 1), asg("d", 1, 1, 1)];
    s.nodes.retain(|n| n.name != "na");
    s.status.removals = vec![NotJoinedRemovals {
        auto_scaling_group: "a".into(),
        count: 1,
        last: t0() - chrono::Duration::minutes(3),
        retry_after: t0() + chrono::Duration::minutes(1),
    }];
    let p = s.plan();
    assert!(
        !matches!(p.command, Command::SetDesired(_)),
        "during the backoff: {:?}",
        p.command
    );
    s.status.removals[0].retry_after = t0() - chrono::Duration::seconds(1);
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::SetDesired(c) if c.iter().any(|c| c.asg == "a")),
        "after it: {:?}: {}",
        p.command,
        p.message
    );
}

/// A never-joined removal with decrement in an ASG we had not raised left
/// it below its count for good; it is recorded as `lowered`, and once
/// Ready is at desired with another ASG raised, raised back first (the
/// surplus then taken back from the raised ASG).
#[test]
fn an_asg_a_removal_left_below_its_count_is_raised_back_when_ready_is_at_desired() {
    let mut s = Scenario::steady();
    s.asgs[0] = asg("a", 2, 2, 3);
    s.not_joined = vec![never_joined("i-late", "a", 20)];
    s.nodes.retain(|n| n.name != "na");
    s.nodes.push(node("na2", "a", true, 60));
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::RemoveNotJoined(t) if t.decrement),
        "{:?}",
        p.command
    );
    assert_eq!(count(&p.status.lowered, "a"), 1, "{:?}", p.status);

    // Later: a at 0 (lowered by 1), c raised by 1 in its place, all Ready.
    let mut s = Scenario::steady();
    s.asgs = vec![asg("a", 0, 0, 3), asg("c", 2, 2, 3), asg("d", 1, 1, 3)];
    s.nodes = vec![
        node("nc", "c", true, 60),
        node("nc2", "c", true, 30),
        node("nd", "d", true, 60),
    ];
    s.status.raised = vec![AsgCount {
        auto_scaling_group: "c".into(),
        count: 1,
    }];
    s.status.lowered = vec![AsgCount {
        auto_scaling_group: "a".into(),
        count: 1,
    }];
    let p = s.plan();
    assert_eq!(
        p.command,
        Command::SetDesired(vec![DesiredChange {
            asg: "a".into(),
            from: 0,
            to: 1
        }]),
        "{}",
        p.message
    );
    assert!(p.status.lowered.is_empty(), "{:?}", p.status.lowered);
    assert_eq!(
        count(&p.status.raised, "c"),
        1,
        "c's raise is still to take back"
    );

    // Nothing to take back elsewhere: nothing is restored (no surplus
    // would follow, only a node more).
    s.status.raised.clear();
    assert!(!matches!(s.plan().command, Command::SetDesired(_)));
}

/// A master that never joined (not beyond the count) was removed with
/// decrement where its ASG's min allowed: masters are never raised, so
/// its place was lost for good.
#[test]
fn a_master_that_never_joined_keeps_its_place() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    s.asgs[0] = AsgView {
        min: 0,
        ..asg("a", 1, 1, 2)
    };
    s.nodes.retain(|n| n.name != "na");
    s.not_joined = vec![never_joined("i-late", "a", 20)];
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::RemoveNotJoined(t) if !t.decrement),
        "{:?}",
        p.command
    );
}

/// A master at risk replaced in its own ASG: the replacement, launched
/// while the old one runs, was taken for an extra master and removed at
/// once.
#[test]
fn a_masters_replacement_is_no_extra_master() {
    let mut s = Scenario::steady();
    s.role = Role::Master;
    s.asgs[0] = asg("a", 2, 2, 2);
    s.nodes[0].fate = Some(Fate::AtRisk);
    s.nodes[0].ready = false;
    s.not_joined = vec![never_joined("i-new", "a", 1)];
    s.status.raised = vec![AsgCount {
        auto_scaling_group: "a".into(),
        count: 1,
    }];
    s.status.replacing = vec![Replacement {
        node: "na".into(),
        instance_id: "i-na".into(),
        auto_scaling_group: "a".into(),
        since: t0() - chrono::Duration::minutes(1),
    }];
    let p = s.plan();
    assert!(
        !matches!(p.command, Command::RemoveNotJoined(_)),
        "{:?}: {}",
        p.command,
        p.message
    );
    // Without the raise on record, it is one.
    s.status.raised.clear();
    assert!(matches!(s.plan().command, Command::RemoveNotJoined(_)));
}

/// A raise that never landed (the manager died before the call) was
/// taken back, but the replacements recorded with it stayed: their nodes
/// counted as replaced, and a node at risk was removed with decrement for
/// a replacement that never came.
#[test]
fn a_raise_never_made_forgets_the_replacements_recorded_with_it() {
    let mut s = Scenario::steady();
    s.nodes[0].fate = Some(Fate::AtRisk);
    s.nodes[0].ready = false;
    let raised_at = t0() - chrono::Duration::seconds(30);
    s.status.raising = vec![Raise {
        auto_scaling_group: "a".into(),
        from: 1,
        to: 2,
    }];
    s.status.raised = vec![AsgCount {
        auto_scaling_group: "a".into(),
        count: 1,
    }];
    s.status.last_modification = Some(raised_at);
    s.status.replacing = vec![Replacement {
        node: "na".into(),
        instance_id: "i-na".into(),
        auto_scaling_group: "a".into(),
        since: raised_at,
    }];
    // a's desired is still 1: the raise did not land. na is unreplaced
    // again, and a replacement is raised for it anew.
    let p = s.plan();
    assert!(
        p.status.replacing.iter().all(|r| r.since != raised_at),
        "{:?}",
        p.status.replacing
    );
    assert!(
        matches!(&p.command, Command::SetDesired(c) if c == &[DesiredChange { asg: "a".into(), from: 1, to: 2 }]),
        "{:?}: {}",
        p.command,
        p.message
    );
    assert_eq!(count(&p.status.raised, "a"), 1, "raised once, not twice");
}

/// A removal recorded and not yet made (the manager died before the call)
/// was overwritten by another instance's removal, then started again as
/// new: its ASG's count taken from the layout twice.
#[test]
fn a_recorded_removal_is_retried_before_another_starts() {
    let mut s = Scenario::steady();
    s.asgs[0] = asg("a", 2, 2, 3);
    s.asgs[1] = asg("c", 2, 2, 3);
    // i-c sorts first among those overdue; i-a's removal is recorded.
    s.not_joined = vec![never_joined("i-c", "c", 30), never_joined("i-a", "a", 20)];
    s.status.cleanup = Some(CleanupTarget {
        instance_id: "i-a".into(),
        auto_scaling_group: "a".into(),
        reason: "not joined within 15m".into(),
        decrement: true,
        since: t0() - chrono::Duration::seconds(30),
    });
    s.status.lowered = vec![AsgCount {
        auto_scaling_group: "a".into(),
        count: 1,
    }];
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::RemoveNotJoined(t) if t.instance_id == "i-a"),
        "{:?}",
        p.command
    );
    assert_eq!(
        count(&p.status.lowered, "a"),
        1,
        "taken once: {:?}",
        p.status.lowered
    );

    // Its instance joined meanwhile: the next removal gives back what the
    // recorded one took.
    s.not_joined.retain(|n| n.instance_id != "i-a");
    s.nodes.push(GroupNode {
        instance_id: Some("i-a".into()),
        ..node("na-late", "a", true, 20)
    });
    let p = s.plan();
    assert!(matches!(&p.command, Command::RemoveNotJoined(t) if t.instance_id == "i-c"));
    assert_eq!(count(&p.status.lowered, "a"), 0, "{:?}", p.status.lowered);
    assert_eq!(count(&p.status.lowered, "c"), 1, "{:?}", p.status.lowered);
}

/// Every ASG at max, dead workers whose raised replacements died too
/// (each recorded as the other's): nothing on its way, every dead node
/// counted as replaced, none repaired, for good. Now repaired in place.
#[test]
fn a_dead_worker_whose_replacement_died_is_repaired_in_place_at_max() {
    let mut s = Scenario::steady();
    s.asgs = vec![asg("a", 2, 2, 2), asg("c", 1, 1, 1), asg("d", 1, 1, 1)];
    s.nodes = vec![
        not_ready_for("na", "a", 30),
        not_ready_for("na2", "a", 15),
        node("nc", "c", true, 60),
        node("nd", "d", true, 60),
    ];
    let replaced = |node: &str, minutes: i64| Replacement {
        node: node.into(),
        instance_id: format!("i-{node}"),
        auto_scaling_group: "a".into(),
        since: t0() - chrono::Duration::minutes(minutes),
    };
    s.status.replacing = vec![replaced("na", 29), replaced("na2", 14)];
    s.status.raised = vec![AsgCount {
        auto_scaling_group: "a".into(),
        count: 1,
    }];
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::Drain(t) if t.node == "na" && t.repair && !t.decrement),
        "{:?}: {}",
        p.command,
        p.message
    );
}

/// A node at risk with no replacement on record (a surplus was there when
/// the recommendation came) while Ready stays at desired without it: it
/// served on until its mark was six hours old. Now removed as replaced.
#[test]
fn a_node_at_risk_whose_count_is_covered_is_removed_without_a_replacement_on_record() {
    let mut s = Scenario::steady().surplus_in_c();
    s.nodes[0].fate = Some(Fate::AtRisk);
    s.nodes[0].ready = false;
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::Drain(t) if t.node == "na" && !t.decrement),
        "{:?}: {}",
        p.command,
        p.message
    );
    // In the ASG we raised, the decrement takes the raise back.
    let mut s = Scenario::steady().surplus_in_c();
    if let Some(n) = s.nodes.iter_mut().find(|n| n.name == "nc") {
        n.fate = Some(Fate::AtRisk);
        n.ready = false;
    }
    let p = s.plan();
    assert!(
        matches!(&p.command, Command::Drain(t) if t.node == "nc" && t.decrement),
        "{:?}: {}",
        p.command,
        p.message
    );
}

/// The walk over every path (`controllers::walk`): a refresh run that
/// failed left its surplus in a (no node could go while keeping the Ready
/// count: c's replacement never joined); that instance then went with
/// decrement, c lowered. Nothing of ours was raised, so c stayed below
/// its count and a above for good. The surplus a run leaves is now taken
/// over as a raise of ours, once.
#[test]
fn the_surplus_a_refresh_run_left_is_taken_over_and_the_layout_restored_against_it() {
    let mut s = Scenario::steady();
    s.asgs = vec![asg("a", 2, 2, 3), asg("c", 0, 0, 3), asg("d", 1, 1, 3)];
    s.nodes.retain(|n| n.name != "nc");
    s.nodes.push(node("na2", "a", true, 30));
    s.status.lowered = vec![AsgCount {
        auto_scaling_group: "c".into(),
        count: 1,
    }];
    s.status.last_modification = Some(t0() - chrono::Duration::hours(1));
    let left = crate::crd::refresher::SurplusLeft {
        at: t0() - chrono::Duration::minutes(20),
        asgs: vec![AsgCount {
            auto_scaling_group: "a".into(),
            count: 1,
        }],
    };
    let active = s.active();
    let mut input = input_of(&s, &active);
    input.surplus_left = Some(&left);
    let p = plan(&input);
    assert_eq!(
        p.command,
        Command::SetDesired(vec![DesiredChange {
            asg: "c".into(),
            from: 0,
            to: 1
        }]),
        "{}",
        p.message
    );
    assert_eq!(p.status.taken_over, Some(left.at));
    // Taken over once: the next reconcile, with that status, adds nothing.
    let mut status = p.status.clone();
    crate::controllers::replenisher::plan::raise_landed(&mut status);
    assert_eq!(count(&status.raised, "a"), 1, "{status:?}");
    s.status = status;
    s.status.last_modification = Some(t0() - chrono::Duration::hours(1));
    s.asgs[1] = asg("c", 1, 1, 3);
    s.nodes.push(node("nc2", "c", true, 0));
    let active = s.active();
    let mut input = input_of(&s, &active);
    input.surplus_left = Some(&left);
    let p = plan(&input);
    assert_eq!(count(&p.status.raised, "a"), 1, "{:?}", p.status);
    // Ready above desired: the surplus goes from a, where it was left.
    let Command::Drain(target) = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert_eq!(target.auto_scaling_group, "a", "{target:?}");
}
