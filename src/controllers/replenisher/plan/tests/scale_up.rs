//! Too few Ready nodes: raises on launching ASGs, spread, backoff, max, what is on its way, the cooldown.

use super::*;

#[test]
fn steady_releases_the_lock_and_does_nothing() {
    let p = Scenario::steady().plan();
    releases(&p);
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
        Command::SetDesired(vec![DesiredChange {
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
        Command::SetDesired(vec![
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
    let later = plan(&at(
        input_of(&s, &active),
        t0() + chrono::Duration::minutes(2),
    ));
    let e = &later.status.excluded[0];
    assert_eq!(e.failures, 2);
    assert_eq!(e.retry_after, Some(t0() + chrono::Duration::minutes(4)));
    assert_eq!(exclusion_backoff(10), Duration::from_secs(1800), "capped");
    // Launching again and past the backoff: no longer excluded.
    s.status = later.status;
    s.asgs[0] = asg("a", 1, 1, 3);
    let active = s.active();
    let healed = plan(&at(
        input_of(&s, &active),
        t0() + chrono::Duration::minutes(5),
    ));
    assert!(healed.status.excluded.is_empty());
}

#[test]
fn all_asgs_at_max_is_reported_and_nothing_is_done() {
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1].max = 1;
    s.asgs[2].max = 1;
    let p = s.plan();
    releases(&p);
    assert_eq!(p.status.phase, ReplenishPhase::Blocked);
    assert!(p.message.contains("no ASG can launch"), "{}", p.message);
}

#[test]
fn nodes_already_launching_are_not_ordered_twice() {
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1] = asg("c", 2, 2, 3); // raised already, its new node not Ready yet
    let p = s.plan();
    assert_eq!(p.command, Command::Nothing);
    assert_eq!(p.status.phase, ReplenishPhase::ScalingUp);
    // Still scaling up: the executor keeps the group's lock while what was
    // raised is on its way (no refresh starts over a raise in flight).
    assert!(crate::controllers::execute::Record::keeps_lock(&p.status));
}

#[test]
fn cooldown_not_over_means_wait_until_it_is() {
    let mut s = Scenario::steady().shortage_in_a();
    s.status.last_modification = Some(t0() - chrono::Duration::seconds(270));
    let p = s.plan();
    releases(&p);
    assert_eq!(p.status.phase, ReplenishPhase::Waiting);
    assert_eq!(
        p.requeue,
        Duration::from_secs(30),
        "requeued for the end of the cooldown"
    );
}

/// Raising `asg` from one node to two.
fn raise(asg: &str) -> Command {
    Command::SetDesired(vec![DesiredChange {
        asg: asg.into(),
        from: 1,
        to: 2,
    }])
}

#[test]
fn a_raise_elsewhere_prefers_the_pool_with_the_best_recent_record() {
    // Zone a short; c was interrupted three times today, d not: d first,
    // though c comes first by name.
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1].risk = 3;
    let p = s.plan();
    assert_eq!(p.command, raise("d"), "{}", p.message);
    // With equal records, the lowest desired count, then the name.
    s.asgs[1].risk = 0;
    assert_eq!(s.plan().command, raise("c"));
}

#[test]
fn between_pools_alike_in_record_and_size_a_raise_prefers_the_cheaper_and_says_so() {
    // Zone a short; c and d alike (record, one node each), d cheaper.
    let mut s = Scenario::steady().shortage_in_a();
    s.asgs[1].price = Some(34_000);
    s.asgs[2].price = Some(31_000);
    let p = s.plan();
    assert_eq!(p.command, raise("d"), "{}", p.message);
    assert!(
        p.message.contains("$0.0310/h against $0.0340/h"),
        "{}",
        p.message
    );
    // The record comes first: a cheaper pool interrupted today loses.
    s.asgs[2].risk = 1;
    assert_eq!(s.plan().command, raise("c"));
    // An unknown price orders nothing: by name again, and nothing said.
    s.asgs[2].risk = 0;
    s.asgs[1].price = None;
    let p = s.plan();
    assert_eq!(p.command, raise("c"), "{}", p.message);
    assert!(!p.message.contains("spot price"), "{}", p.message);
}
