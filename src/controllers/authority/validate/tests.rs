use super::*;
use crate::controllers::authority::{DownWhy, MasterDown};

/// A scene with every rule open but the ones the caller's maps and slot
/// hold (for the guards' tests).
pub(crate) fn open_scene<'a>(
    role: Role,
    protected: &'a BTreeMap<String, String>,
    slot: &'a SlotState,
) -> Scene<'a> {
    Scene {
        role,
        control_plane: None,
        window: Window::Open,
        protected,
        slot,
        breaker: None,
        stopped: None,
    }
}

/// Everything open: a worker group, the slot ours, no window, nothing
/// protected, the breaker closed, the group going.
struct World {
    role: Role,
    control_plane: Option<ControlPlane>,
    window: Window,
    protected: BTreeMap<String, String>,
    slot: SlotState,
    breaker: Option<String>,
    stopped: Option<String>,
}

impl World {
    fn open() -> World {
        World {
            role: Role::Worker,
            control_plane: None,
            window: Window::Open,
            protected: BTreeMap::new(),
            slot: SlotState::Ours,
            breaker: None,
            stopped: None,
        }
    }

    fn scene(&self) -> Scene<'_> {
        Scene {
            role: self.role,
            control_plane: self.control_plane.as_ref(),
            window: self.window,
            protected: &self.protected,
            slot: &self.slot,
            breaker: self.breaker.as_deref(),
            stopped: self.stopped.as_deref(),
        }
    }

    fn check(&self, reason: Reason) -> Result<(), Refused> {
        validate(&disruption(reason), &self.scene())
    }
}

fn disruption(reason: Reason) -> Disruption<'static> {
    Disruption {
        reason,
        instance: "i-1",
        node: Some("n1"),
        in_hand: false,
        dead: false,
        floor: Some(Floor::of(3, 3)),
    }
}

/// For each rule, the world where it (and only it) refuses.
fn refusing(rule: Rule) -> World {
    let mut w = World::open();
    match rule {
        Rule::Stopped => w.stopped = Some("the group is suspended".into()),
        Rule::Breaker => w.breaker = Some("2 of 3 NotReady".into()),
        Rule::Masters => {
            w.role = Role::Master;
            w.control_plane = Some(ControlPlane {
                expected: 3,
                ready: ["i-2".to_string()].into(),
                down: vec![MasterDown {
                    group: "masters".into(),
                    instance: Some("i-3".into()),
                    why: DownWhy::NotReady,
                }],
                ..Default::default()
            });
        }
        Rule::Window => w.window = Window::Closed { opens: None },
        Rule::DoNotDisrupt => {
            w.protected
                .insert("n1".into(), "do-not-disrupt pod web-1".into());
        }
        Rule::Slot => w.slot = SlotState::Full("Refresh ns/other".into()),
        Rule::ReadyFloor => {}
    }
    w
}

/// The floor refuses through the disruption, not the world.
fn check_in(world: &World, rule: Rule, reason: Reason) -> Result<(), Refused> {
    let mut d = disruption(reason);
    if rule == Rule::ReadyFloor {
        d.floor = Some(Floor::of(2, 3));
    }
    validate(&d, &world.scene())
}

#[test]
fn every_rule_refuses_exactly_the_reasons_the_table_binds_it_to() {
    let mut checked = 0;
    for rule in Rule::ALL {
        let world = refusing(rule);
        for reason in Reason::ALL {
            let answer = check_in(&world, rule, reason);
            match binds(reason, rule) {
                true => {
                    let refused = answer.expect_err(&format!("{rule:?} binds {reason:?}"));
                    assert_eq!(refused.rule(), rule, "{reason:?}: {refused}");
                }
                false => assert_eq!(answer, Ok(()), "{rule:?} frees {reason:?}"),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, Rule::ALL.len() * Reason::ALL.len());
    for reason in Reason::ALL {
        assert_eq!(World::open().check(reason), Ok(()), "{reason:?}");
    }
}

#[test]
fn a_refusal_names_its_rule_and_what_ends_it() {
    let w = refusing(Rule::Window);
    let mut closed = w;
    let opens = chrono::DateTime::<Utc>::from_timestamp(1_800_000_000, 0).expect("time");
    closed.window = Window::Closed { opens: Some(opens) };
    let refused = closed.check(Reason::ScaleIn).expect_err("closed");
    assert_eq!(refused.check(), "refused_window_closed");
    assert_eq!(
        refused.to_string(),
        format!(
            "disrupt i-1: outside the maintenance windows; until the next window opening at {}",
            opens.to_rfc3339()
        )
    );
    let refused = refusing(Rule::Slot)
        .check(Reason::Refresh)
        .expect_err("full");
    assert!(
        refused.to_string().contains("Refresh ns/other"),
        "{refused}"
    );
    let refused = refusing(Rule::Stopped)
        .check(Reason::NeverJoined)
        .expect_err("stopped");
    assert_eq!(
        refused.to_string(),
        "disrupt i-1: the group is suspended; until the group resumed"
    );
}

#[test]
fn a_window_gates_a_nodes_first_step_not_a_drain_in_hand() {
    let w = refusing(Rule::Window);
    let mut d = disruption(Reason::Refresh);
    assert!(validate(&d, &w.scene()).is_err());
    d.in_hand = true;
    assert_eq!(validate(&d, &w.scene()), Ok(()));
}

#[test]
fn no_protection_holds_a_dead_node() {
    let w = refusing(Rule::DoNotDisrupt);
    let mut d = disruption(Reason::Refresh);
    assert!(matches!(
        validate(&d, &w.scene()),
        Err(Refused::Protected { .. })
    ));
    d.dead = true;
    assert_eq!(validate(&d, &w.scene()), Ok(()));
}

#[test]
fn a_slot_not_taken_refuses_as_one_held_elsewhere() {
    let mut w = World::open();
    w.slot = SlotState::Free;
    let refused = w.check(Reason::ScaleIn).expect_err("free, not ours");
    assert_eq!(refused.rule(), Rule::Slot);
    // A dead master needs none: another group's wait cannot hold it.
    assert_eq!(w.check(Reason::MasterRepair), Ok(()));
}

#[test]
fn a_master_groups_breaker_is_the_masters_rule() {
    let mut w = refusing(Rule::Breaker);
    assert!(w.check(Reason::Refresh).is_err());
    w.role = Role::Master;
    w.control_plane = Some(ControlPlane {
        expected: 1,
        ready: BTreeSet::new(),
        down: vec![],
        // Its only master going stops the API: allowed here, as the
        // breaker is what this looks at.
        outage_allowed: true,
        ..Default::default()
    });
    assert_eq!(w.check(Reason::Refresh), Ok(()));
}

use std::collections::BTreeSet;
