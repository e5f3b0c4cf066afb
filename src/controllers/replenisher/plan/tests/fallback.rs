//! The on-demand fallback: raised by the missing count only once every spot
//! ASG has been short for `after`; replaced by spot, replacement first, once
//! a spot ASG has launched for `returnAfter`; a spot ASG that fails again
//! restarts its clock.

use super::*;
use crate::crd::nodegroup::ResolvedFallback;

fn seconds(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

const AFTER: i64 = 180;
const RETURN_AFTER: i64 = 600;

fn od(desired: i32, instances: i32) -> AsgView {
    AsgView {
        fallback: true,
        ..asg("od", desired, instances, 5)
    }
}

fn with_fallback(mut s: Scenario) -> Scenario {
    s.fallback = Some(ResolvedFallback {
        after: Duration::from_secs(AFTER as u64),
        return_after: Duration::from_secs(RETURN_AFTER as u64),
    });
    s.asgs.push(od(0, 0));
    s
}

/// Zone a lost its node; every spot ASG fails its launches (c and d were
/// raised for it and failed too).
fn every_spot_short() -> Scenario {
    let mut s = with_fallback(Scenario::steady());
    s.asgs[0] = failing(asg("a", 1, 0, 3));
    s.asgs[1] = failing(asg("c", 2, 1, 3));
    s.asgs[2] = failing(asg("d", 2, 1, 3));
    s.nodes.retain(|n| n.name != "na");
    s
}

fn at(s: &Scenario, now: DateTime<Utc>) -> Plan {
    s.plan_with(Duration::from_secs(300), Duration::from_secs(900), now)
}

#[test]
fn every_spot_asg_short_for_after_raises_the_fallback_by_the_missing_count_only() {
    let mut s = every_spot_short();
    let p = at(&s, t0());
    releases(&p);
    assert!(
        p.message.contains("falling back to on-demand at"),
        "{}",
        p.message
    );
    assert_eq!(p.status.short_since, Some(t0()));
    s.status = p.status;
    // The lock given back while it waits on time.
    s.lock = LockState::Free;
    // A second before `after`: still waiting, holding nothing.
    let p = at(&s, t0() + seconds(AFTER - 1));
    assert_eq!(p.command, Command::Nothing, "{}", p.message);
    // At `after`: the lock again, then exactly the one missing, on the
    // fallback.
    let p = at(&s, t0() + seconds(AFTER));
    needs_the_lock(&p);
    s.lock = LockState::Ours;
    let p = at(&s, t0() + seconds(AFTER));
    assert_eq!(
        p.command,
        Command::SetDesired(vec![DesiredChange {
            asg: "od".into(),
            from: 0,
            to: 1
        }]),
        "{}",
        p.message
    );
    // Launched, joining: nothing more while the shortage lasts.
    s.status = p.status;
    raise_landed(&mut s.status);
    s.asgs[3] = od(1, 1);
    let p = at(&s, t0() + seconds(AFTER + 30));
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    // Ready: the group is whole, the fallback stays while spot is short.
    s.nodes.push(node("nod", "od", true, 0));
    let p = at(&s, t0() + seconds(AFTER + 60));
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    assert_eq!(p.status.short_since, None);
}

#[test]
fn a_spot_asg_that_can_launch_is_raised_and_the_fallback_never() {
    let mut s = every_spot_short();
    s.asgs[2] = asg("d", 1, 1, 3);
    for minutes in [0, 5, 60] {
        let p = at(&s, t0() + seconds(minutes * 60));
        match &p.command {
            Command::SetDesired(changes) => {
                assert!(changes.iter().all(|c| c.asg == "d"), "{changes:?}")
            }
            other => panic!("{other:?}: {}", p.message),
        }
        assert_eq!(p.status.short_since, None);
        s.status.short_since = None;
    }
}

/// Issue 54, hole 6: a spot ASG whose launches work again while its raises
/// still back off could launch, so the fallback is not raised beside it
/// (the guard refused it too, and once it launched one node was too many).
#[test]
fn no_fallback_while_a_spot_asg_launches_again_but_its_raises_still_back_off() {
    let mut s = every_spot_short();
    s.status.short_since = Some(t0());
    // d launched what it was asked for after all; its raises back off for
    // another ten minutes.
    s.asgs[2] = asg("d", 1, 1, 3);
    s.status.excluded = vec![crate::crd::replenisher::ExcludedAsg {
        auto_scaling_group: "d".into(),
        reason: NO_CAPACITY.into(),
        since: t0(),
        retry_after: Some(t0() + seconds(AFTER + 600)),
        failures: 3,
    }];
    let p = at(&s, t0() + seconds(AFTER + 60));
    assert!(
        !matches!(&p.command, Command::SetDesired(changes) if changes.iter().any(|c| c.asg == "od")),
        "{:?}: {}",
        p.command,
        p.message
    );
    assert_eq!(p.status.short_since, None, "{}", p.message);
}

#[test]
fn without_a_fallback_nothing_is_raised_and_it_says_so() {
    let mut s = every_spot_short();
    s.fallback = None;
    s.asgs.pop();
    let p = at(&s, t0() + seconds(3600));
    assert!(!p.command.mutates(), "{:?}", p.command);
    assert!(p.message.contains("no ASG can launch"), "{}", p.message);
}

/// The shortage is over in zone c: its raised node came; the fallback node
/// is still there (a surplus of one).
fn spot_back_in_c() -> Scenario {
    let mut s = with_fallback(Scenario::steady());
    s.asgs[0] = failing(asg("a", 1, 0, 3));
    s.nodes.retain(|n| n.name != "na");
    s.asgs[1] = asg("c", 2, 2, 3);
    s.nodes.push(node("nc2", "c", true, 1));
    s.asgs[3] = od(1, 1);
    s.nodes.push(node("nod", "od", true, 30));
    s
}

#[test]
fn the_fallback_node_returns_once_spot_has_launched_for_return_after_and_not_before() {
    let mut s = spot_back_in_c();
    let p = at(&s, t0());
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    assert!(
        p.message.contains("on the on-demand fallback"),
        "{}",
        p.message
    );
    // The spot surplus is kept for it: no scale-in of nc2 meanwhile.
    s.status = p.status;
    let p = at(&s, t0() + seconds(RETURN_AFTER - 1));
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    // Then: the fallback node is drained, to go with decrement.
    let p = at(&s, t0() + seconds(RETURN_AFTER));
    let Command::Drain(target) = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert_eq!(
        (target.node.as_str(), target.auto_scaling_group.as_str()),
        ("nod", "od")
    );
    assert!(target.decrement);
}

#[test]
fn with_spot_asgs_at_max_their_own_relaunch_is_the_return() {
    // kops's instance groups: min = max. Zone a's spot node was lost and
    // could not come back; the fallback holds its place. Then a's ASG
    // launches its missing node by itself (nothing to raise: at its max).
    let mut s = with_fallback(Scenario::steady());
    for (i, name) in ["a", "c", "d"].iter().enumerate() {
        s.asgs[i] = asg(name, 1, 1, 1);
    }
    s.asgs[3] = od(1, 1);
    s.nodes.push(node("nod", "od", true, 30));
    let p = at(&s, t0());
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    s.status = p.status;
    s.lock = LockState::Free;
    // Once a has launched for `returnAfter`, the fallback node goes.
    let p = at(&s, t0() + seconds(RETURN_AFTER));
    needs_the_lock(&p);
    s.lock = LockState::Ours;
    let p = at(&s, t0() + seconds(RETURN_AFTER));
    let Command::Drain(target) = &p.command else {
        panic!("{:?}: {}", p.command, p.message)
    };
    assert_eq!(
        (target.node.as_str(), target.auto_scaling_group.as_str()),
        ("nod", "od")
    );
}

#[test]
fn a_spot_asg_that_fails_again_restarts_its_clock() {
    let mut s = spot_back_in_c();
    s.status = at(&s, t0()).status;
    // c fails again within returnAfter: its clock is gone.
    s.asgs[1] = failing(asg("c", 3, 2, 3));
    s.asgs[2] = failing(asg("d", 2, 1, 3));
    let p = at(&s, t0() + seconds(300));
    assert!(
        p.status
            .spot_launching
            .iter()
            .all(|l| l.auto_scaling_group != "c"),
        "{:?}",
        p.status.spot_launching
    );
    // It launches again: returnAfter from now, not from before.
    s.status = p.status;
    s.asgs[1] = asg("c", 2, 2, 3);
    s.asgs[2] = asg("d", 1, 1, 3);
    let back = t0() + seconds(400);
    s.status = at(&s, back).status;
    let p = at(&s, t0() + seconds(RETURN_AFTER + 30));
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    let p = at(&s, back + seconds(RETURN_AFTER));
    assert!(
        matches!(p.command, Command::Drain(_)),
        "{:?}: {}",
        p.command,
        p.message
    );
}

#[test]
fn at_desired_the_spot_replacement_comes_first_one_at_a_time() {
    let mut s = with_fallback(Scenario::steady());
    s.asgs[0] = failing(asg("a", 1, 0, 3));
    s.nodes.retain(|n| n.name != "na");
    s.asgs[3] = od(1, 1);
    s.nodes.push(node("nod", "od", true, 30));
    s.status.spot_launching = vec![crate::crd::replenisher::AsgSince {
        auto_scaling_group: "c".into(),
        since: t0() - seconds(RETURN_AFTER + 60),
    }];
    let p = at(&s, t0());
    assert_eq!(
        p.command,
        Command::SetDesired(vec![DesiredChange {
            asg: "c".into(),
            from: 1,
            to: 2
        }]),
        "{}",
        p.message
    );
    // On its way: nothing more, and the fallback node stays.
    s.status = p.status;
    raise_landed(&mut s.status);
    s.asgs[1] = asg("c", 2, 2, 3);
    let p = at(&s, t0() + seconds(5));
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    // Ready: the fallback node goes.
    s.nodes.push(node("nc2", "c", true, 0));
    let p = at(&s, t0() + seconds(10));
    assert!(
        matches!(&p.command, Command::Drain(t) if t.node == "nod"),
        "{:?}: {}",
        p.command,
        p.message
    );
}

#[test]
fn a_protected_fallback_node_stays_and_a_closed_window_holds_the_return() {
    let mut s = spot_back_in_c();
    s.status.spot_launching = vec![crate::crd::replenisher::AsgSince {
        auto_scaling_group: "c".into(),
        since: t0() - seconds(RETURN_AFTER + 60),
    }];
    s.protected.insert("nod".into(), "do-not-disrupt".into());
    let p = at(&s, t0());
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    assert!(p.message.contains("nod (do-not-disrupt)"), "{}", p.message);
    s.protected.clear();
    s.window = crate::controllers::window::WindowState::Closed {
        opens: Some(t0() + seconds(3600)),
    };
    let p = at(&s, t0());
    assert!(!p.command.mutates(), "{:?}: {}", p.command, p.message);
    assert!(p.message.contains("maintenance windows"), "{}", p.message);
}

proptest! {
    /// Whatever the state: the fallback is raised only for a worker group
    /// short of Ready nodes with no spot ASG able to launch, by no more than
    /// is missing; and a surplus removal never takes a fallback node.
    #[test]
    fn the_fallback_is_raised_only_while_every_spot_asg_is_short(
        s in super::properties::arb_state(),
        short_for in 0i64..600,
    ) {
        let mut s = with_fallback(s);
        s.status.short_since = Some(t0() - seconds(short_for));
        let p = s.plan();
        let spot_can = s.asgs.iter().any(|a| {
            !a.fallback
                && a.launching
                && !p.status.excluded.iter().any(|e| e.auto_scaling_group == a.name)
        });
        let ready = s.nodes.iter().filter(|n| n.ready).count() as i32;
        if let Command::SetDesired(changes) = &p.command {
            let added: i32 = changes.iter().filter(|c| c.asg == "od").map(|c| c.to - c.from).sum();
            if added > 0 {
                prop_assert_eq!(s.role, Role::Worker);
                prop_assert!(!spot_can, "{}", p.message);
                prop_assert!(ready < s.desired);
                prop_assert!(added <= s.desired - ready);
                prop_assert!(short_for >= AFTER);
                prop_assert!(changes.iter().all(|c| c.asg == "od"), "{:?}", changes);
            }
        }
        if let Command::Drain(t) = &p.command
            && t.auto_scaling_group == "od"
        {
            prop_assert!(!t.repair || s.nodes.iter().any(|n| n.name == t.node && !n.ready));
        }
    }
}

#[test]
fn a_spot_asg_launching_again_counts_for_the_return_while_raises_still_back_off_from_it() {
    let mut s = spot_back_in_c();
    s.status.excluded = vec![crate::crd::replenisher::ExcludedAsg {
        auto_scaling_group: "c".into(),
        reason: NO_CAPACITY.into(),
        since: t0() - seconds(300),
        retry_after: Some(t0() + seconds(3600)),
        failures: 5,
    }];
    s.status = at(&s, t0()).status;
    assert!(
        s.status
            .spot_launching
            .iter()
            .any(|l| l.auto_scaling_group == "c"),
        "{:?}",
        s.status.spot_launching
    );
    let p = at(&s, t0() + seconds(RETURN_AFTER));
    assert!(
        matches!(&p.command, Command::Drain(t) if t.node == "nod"),
        "{:?}: {}",
        p.command,
        p.message
    );
}

#[test]
fn the_return_is_said_in_status_next_for_when_it_comes() {
    let mut s = spot_back_in_c();
    s.status = at(&s, t0()).status;
    let next = at(&s, t0() + seconds(60)).status.next.expect("next");
    assert_eq!(next.what, "return to spot");
    assert_eq!(next.at, Some(t0() + seconds(RETURN_AFTER)));
    assert_eq!(next.nodes[0].node, "nod");
    // And it happens then, not a second before.
    let p = at(&s, t0() + seconds(RETURN_AFTER - 1));
    assert!(!p.command.mutates(), "{:?}", p.command);
    let p = at(&s, t0() + seconds(RETURN_AFTER));
    assert!(matches!(p.command, Command::Drain(_)), "{:?}", p.command);
    // Every spot pool short: said, and what holds it.
    let mut short = every_spot_short();
    short.asgs[3] = od(1, 1);
    short.nodes.push(node("nod", "od", true, 0));
    let next = at(&short, t0()).status.next.expect("next");
    assert_eq!(next.what, "return to spot");
    assert!(
        next.blocked_by
            .as_deref()
            .is_some_and(|b| b.contains("no spot ASG")),
        "{next:?}"
    );
}

#[test]
fn the_return_says_what_an_hour_of_the_fallback_costs_when_its_price_is_known() {
    let mut s = spot_back_in_c();
    s.status = at(&s, t0()).status;
    let next = at(&s, t0() + seconds(60)).status.next.expect("next");
    assert!(!next.why.contains("on demand meanwhile"), "{}", next.why);
    s.asgs[3].on_demand_price = Some(96_000);
    let next = at(&s, t0() + seconds(60)).status.next.expect("next");
    assert!(
        next.why.ends_with("; on demand meanwhile: $0.0960/h"),
        "{}",
        next.why
    );
}
