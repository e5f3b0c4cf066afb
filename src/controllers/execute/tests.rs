//! The executor's own protocol around the group's lock and the slot, on a
//! path reduced to what the protocol touches: a guard that refuses a node
//! taken away without a slot (as the rule book's slot rule does) and, when
//! asked, for another rule; a record that holds a drain in hand or
//! nothing. Every effect is logged in order, so each test reads what
//! happened and when.

use super::*;
use crate::controllers::authority::validate::Refused;
use crate::controllers::group_view::tests::block_on;
use crate::k8s::disruption_slot::SlotState;
use crate::k8s::lock::LockState;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node(String);

impl Target for Node {
    fn instance_id(&self) -> &str {
        &self.0
    }

    fn node(&self) -> Option<&str> {
        Some(&self.0)
    }

    fn reason(&self) -> Option<crate::controllers::authority::rules::Reason> {
        Some(crate::controllers::authority::rules::Reason::Refresh)
    }
}

/// A path's status: the node it drains, if any.
#[derive(Debug, Clone, PartialEq, Default)]
struct Held {
    draining: Option<Node>,
}

impl Record for Held {
    type Target = Node;
    const PATH: &'static str = "test";

    fn draining(&self, instance: &str) -> Option<&Node> {
        self.draining.as_ref().filter(|n| n.0 == instance)
    }

    fn drained(&mut self, _: &str, _: DateTime<Utc>) -> Option<Node> {
        None
    }

    fn in_hand(&self) -> bool {
        self.draining.is_some()
    }
}

struct Path {
    /// The group's lock; None: a path that takes none.
    lock: Option<LockState>,
    slot: SlotState,
    /// Another rule refuses too (the Ready floor, say).
    floor_refuses: bool,
    log: Vec<String>,
    stored: Held,
}

impl Path {
    fn new(slot: SlotState) -> Path {
        Path {
            lock: Some(LockState::Ours),
            slot,
            floor_refuses: false,
            log: vec![],
            stored: Held::default(),
        }
    }
}

impl Effects for Path {
    type Record = Held;

    fn guard(&self, _: &Held, effect: Effect<'_, Node>) -> Result<(), Refusal> {
        let Effect::Drain { target, .. } = effect else {
            return Ok(());
        };
        let no_slot = |why: &str| {
            Refusal::Rule(Refused::NoSlot {
                instance: target.0.clone(),
                why: why.into(),
            })
        };
        match &self.slot {
            SlotState::Free => return Err(no_slot("none taken")),
            SlotState::Full(holders) => return Err(no_slot(holders)),
            SlotState::Ours => {}
        }
        match self.floor_refuses {
            true => Err(Refusal::Rule(Refused::Floor {
                instance: target.0.clone(),
                ready_besides: 2,
                needed: 3,
            })),
            false => Ok(()),
        }
    }

    async fn write_status(&mut self, status: &Held) -> crate::Result<()> {
        let what = match &status.draining {
            Some(n) => format!("write draining {}", n.0),
            None => "write nothing in hand".into(),
        };
        self.log.push(what);
        self.stored = status.clone();
        Ok(())
    }

    fn reached(&mut self, _: &str) -> crate::Result<()> {
        Ok(())
    }

    fn lock(&self) -> Option<LockState> {
        self.lock.clone()
    }

    async fn take_lock(&mut self) -> crate::Result<Taken> {
        match &self.lock {
            Some(LockState::Other(_)) => {
                self.log.push("lock held elsewhere".into());
                Ok(Taken::HeldElsewhere)
            }
            _ => {
                self.log.push("take lock".into());
                self.lock = Some(LockState::Ours);
                Ok(Taken::Yes)
            }
        }
    }

    async fn release_lock(&mut self) -> crate::Result<()> {
        if self.lock == Some(LockState::Ours) {
            self.log.push("give lock back".into());
            self.lock = Some(LockState::Free);
        }
        Ok(())
    }

    async fn take_slot(&mut self) -> crate::Result<bool> {
        let unlocked = matches!(self.lock, Some(LockState::Free | LockState::Other(_)));
        assert!(!unlocked, "a slot without the lock");
        if matches!(self.slot, SlotState::Full(_)) {
            self.log.push("take refused".into());
            return Ok(false);
        }
        self.log.push("take".into());
        self.slot = SlotState::Ours;
        Ok(true)
    }

    fn holds_slot(&self) -> bool {
        self.slot == SlotState::Ours
    }

    async fn release_slot(&mut self) -> crate::Result<()> {
        if self.slot == SlotState::Ours {
            self.log.push("release".into());
            self.slot = SlotState::Free;
        }
        Ok(())
    }

    async fn drain_step(
        &mut self,
        target: &Node,
        _: &Held,
        _: bool,
        _: &str,
    ) -> crate::Result<Drained> {
        assert_eq!(self.slot, SlotState::Ours, "drained without a slot");
        assert_ne!(self.lock, Some(LockState::Free), "drained without the lock");
        self.log.push(format!("drain {}", target.0));
        Ok(Drained {
            done: false,
            requeue: Duration::from_secs(5),
            blocked_by: None,
        })
    }

    async fn terminate(&mut self, _: Effect<'_, Node>, _: &Held) -> crate::Result<bool> {
        Ok(true)
    }
}

fn run(path: &mut Path, command: Command<Node>, status: Held) -> crate::Result<Duration> {
    let stored = path.stored.clone();
    let planned = Planned::of(&command, status, "test", Duration::from_secs(1));
    block_on(execute(path, Some(&stored), planned, Utc::now()))
}

fn drain_of(node: &str) -> (Command<Node>, Held) {
    let n = Node(node.into());
    let status = Held {
        draining: Some(n.clone()),
    };
    (Command::Drain(Batch::of(n)), status)
}

#[test]
fn a_drain_refused_only_for_want_of_a_slot_takes_a_free_one_then_records_then_drains() {
    let mut path = Path::new(SlotState::Free);
    let (command, status) = drain_of("n1");
    run(&mut path, command, status).expect("drained");
    assert_eq!(path.log, ["take", "write draining n1", "drain n1"]);
    // In hand: the slot is kept for the next step.
    assert_eq!(path.slot, SlotState::Ours);
}

#[test]
fn a_slot_held_by_others_refuses_the_drain_before_anything_is_recorded() {
    let mut path = Path::new(SlotState::Full("Refresh ns/other".into()));
    let (command, status) = drain_of("n1");
    let refused = run(&mut path, command, status).expect_err("refused");
    assert_eq!(refused.category(), "refused_no_slot", "{refused}");
    assert!(
        refused.to_string().contains("Refresh ns/other"),
        "{refused}"
    );
    // It says why the node was to go: the reason its target carries.
    assert!(refused.to_string().ends_with("(for refresh)"), "{refused}");
    // Nothing recorded in hand: the lock goes back too.
    assert_eq!(path.log, ["take refused", "give lock back"]);
    assert_eq!(
        path.stored,
        Held::default(),
        "a refused drain left a record"
    );
}

#[test]
fn a_slot_taken_for_a_drain_another_rule_refuses_is_given_back_at_once() {
    let mut path = Path::new(SlotState::Free);
    path.floor_refuses = true;
    let (command, status) = drain_of("n1");
    let refused = run(&mut path, command, status).expect_err("refused");
    assert_eq!(refused.category(), "refused_too_few_ready", "{refused}");
    assert_eq!(path.log, ["take", "release", "give lock back"]);
    assert_eq!(path.slot, SlotState::Free);
    assert_eq!(path.stored, Held::default());
}

#[test]
fn nothing_in_hand_after_a_command_gives_the_slot_back_once_the_status_says_so() {
    let mut path = Path::new(SlotState::Ours);
    let (_, status) = drain_of("n1");
    path.stored = status.clone();
    // The drain given up, say: the status that forgets it comes first.
    run(&mut path, Command::Nothing, Held::default()).expect("waited");
    // The slot first: it is only ever held with its lock.
    assert_eq!(
        path.log,
        ["write nothing in hand", "release", "give lock back"]
    );
    assert_eq!(path.slot, SlotState::Free);
    // Held while the status still records a node in hand, whatever the
    // command.
    let mut path = Path::new(SlotState::Ours);
    path.stored = status.clone();
    run(&mut path, Command::Nothing, status).expect("waited");
    assert!(path.log.is_empty(), "{:?}", path.log);
    assert_eq!(path.slot, SlotState::Ours);
    assert_eq!(path.lock, Some(LockState::Ours));
}

#[test]
fn a_mutation_planned_without_the_lock_takes_it_and_carries_out_nothing_of_the_plan() {
    let mut path = Path::new(SlotState::Free);
    path.lock = Some(LockState::Free);
    let (command, status) = drain_of("n1");
    let requeue = run(&mut path, command, status).expect("the lock taken");
    // Planned again at once, with the lock, on what is observed then: the
    // group's other controller may have acted since this plan looked.
    assert_eq!(requeue, Duration::from_millis(100));
    assert_eq!(path.log, ["take lock"]);
    assert_eq!(path.stored, Held::default(), "recorded before the lock");
    assert_eq!(path.slot, SlotState::Free, "a slot before the lock");
}

#[test]
fn a_status_recording_a_node_in_hand_is_written_only_with_the_lock() {
    // A run resumed after its lock was lost: only a wait, but its record
    // is the lock's to cover.
    let mut path = Path::new(SlotState::Free);
    path.lock = Some(LockState::Free);
    let (_, status) = drain_of("n1");
    run(&mut path, Command::Nothing, status.clone()).expect("the lock taken");
    assert_eq!(path.log, ["take lock"]);
    assert_eq!(path.stored, Held::default());
    // Nothing recorded, nothing made: the lock is not needed to wait.
    let mut path = Path::new(SlotState::Free);
    path.lock = Some(LockState::Free);
    run(&mut path, Command::Nothing, Held::default()).expect("waited");
    assert!(path.log.is_empty(), "{:?}", path.log);
    assert_eq!(path.lock, Some(LockState::Free));
}

#[test]
fn with_the_lock_held_elsewhere_a_wait_is_written_and_a_mutation_is_not_made() {
    let other = Some(LockState::Other("Replenish ns/workers".into()));
    let (command, status) = drain_of("n1");
    // A run paused while the group's other controller holds the lock: its
    // record (and why it waits) is written; the lock stays theirs.
    let mut path = Path::new(SlotState::Free);
    path.lock = other.clone();
    run(&mut path, Command::Nothing, status.clone()).expect("waited");
    assert_eq!(path.log, ["write draining n1"]);
    assert_eq!(path.lock, other);
    // A mutation planned in a race lost: asked for, refused, nothing made.
    let mut path = Path::new(SlotState::Free);
    path.lock = other.clone();
    run(&mut path, command, status).expect("looked again soon");
    assert_eq!(path.log, ["lock held elsewhere"]);
    assert_eq!(path.stored, Held::default());
}

#[test]
fn a_path_that_takes_no_lock_acts_without_one() {
    // The interruption drainer: AWS takes its node whoever holds the group.
    let mut path = Path::new(SlotState::Free);
    path.lock = None;
    let (command, status) = drain_of("n1");
    run(&mut path, command, status).expect("drained");
    assert_eq!(path.log, ["take", "write draining n1", "drain n1"]);
    assert_eq!(path.lock, None);
}

#[test]
fn a_path_that_takes_no_slot_is_refused_one_rather_than_given_one() {
    // A path whose effects make no slot (the interruption drainer) asking
    // for a disruption the rule book binds to it: refused, not made.
    struct NoSlots(Path);
    impl Effects for NoSlots {
        type Record = Held;
        fn guard(&self, status: &Held, effect: Effect<'_, Node>) -> Result<(), Refusal> {
            self.0.guard(status, effect)
        }
        async fn write_status(&mut self, status: &Held) -> crate::Result<()> {
            self.0.write_status(status).await
        }
        fn reached(&mut self, _: &str) -> crate::Result<()> {
            Ok(())
        }
        async fn drain_step(
            &mut self,
            target: &Node,
            status: &Held,
            first: bool,
            why: &str,
        ) -> crate::Result<Drained> {
            self.0.drain_step(target, status, first, why).await
        }
        async fn terminate(&mut self, e: Effect<'_, Node>, s: &Held) -> crate::Result<bool> {
            self.0.terminate(e, s).await
        }
    }
    let mut path = NoSlots(Path::new(SlotState::Free));
    let (command, status) = drain_of("n1");
    let planned = Planned::of(&command, status, "test", Duration::from_secs(1));
    let refused = block_on(execute(&mut path, None, planned, Utc::now())).expect_err("refused");
    assert_eq!(refused.category(), "refused_not_this_path", "{refused}");
    assert!(path.0.log.is_empty(), "{:?}", path.0.log);
}
