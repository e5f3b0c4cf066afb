//! What a controller's plan asks to be done, in one vocabulary for every
//! path that changes AWS or a Node: the refresher's runs and drift rolls,
//! the replenisher's raises, removals, repairs and retirements. The plan
//! decides one command (with the status that records it); the one
//! executor (`controllers::execute`) writes that status, asks the guard,
//! then acts.
//! `T` is the controller's record of a node it takes away (a refresh
//! target, a scale-in target): what it drains, terminates or gives back.
//! Each mutation a command makes is one [`Effect`]: what the guard checks
//! before it, what the path's effects make (a removal), and what is told
//! after it, in one description.

use crate::controllers::group_view::DesiredChange;
use crate::crd::replenisher::{CleanupTarget, Retirement};

/// One mutation a command makes, described once for every stage: the
/// guard checks it before it is made, the path's effects make it (a
/// removal: `Terminate`, `NotJoined`, `Retire`), the path's status records
/// it made (`execute::Record::made`), and it is told (Events, metrics)
/// with the status after it.
#[derive(Debug)]
pub enum Effect<'a, T> {
    /// A node put back in service (a drain given up, a run set aside), and
    /// why.
    GiveBack { target: &'a T, reason: &'a str },
    /// ASGs' desired counts set (a raise, a surplus, a layout back).
    SetDesired(&'a [DesiredChange]),
    /// A drain step on the target's node; `begins`: its first (the path did
    /// not hold the node before).
    Drain { target: &'a T, begins: bool },
    /// The target's recorded termination (a repair, a scale-in, a refresh's
    /// replacement or surplus).
    Terminate(&'a T),
    /// The recorded removal of an instance that never joined.
    NotJoined(&'a CleanupTarget),
    /// Interrupted instances terminated once replaced.
    Retire(&'a [Retirement]),
}

impl<'a, T> Effect<'a, T> {
    /// The node it takes away or gives back, for an effect on one.
    pub fn target(&self) -> Option<&'a T> {
        match *self {
            Effect::GiveBack { target, .. } | Effect::Drain { target, .. } => Some(target),
            Effect::Terminate(target) => Some(target),
            Effect::SetDesired(_) | Effect::NotJoined(_) | Effect::Retire(_) => None,
        }
    }
}

// By hand: a derive would ask `T: Copy` of what is only borrowed.
impl<T> Clone for Effect<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Effect<'_, T> {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<T> {
    /// Only the status written (a wait, a record kept): the executor
    /// takes or gives back the group's lock and a slot by what it records.
    Nothing,
    /// Set ASGs' desired counts (a raise, a surplus, a layout back),
    /// recorded in status first.
    SetDesired(Vec<DesiredChange>),
    /// One drain step on each target's node (recorded first); once one is
    /// drained, its termination is recorded, then made.
    Drain(Batch<T>),
    /// Make a termination already recorded in status.
    Terminate(T),
    /// Terminate an instance that never joined through its ASG (recorded
    /// first), decrementing only while desired is above min.
    RemoveNotJoined(CleanupTarget),
    /// Terminate interrupted instances that were replaced (recorded first),
    /// each with its own decrement.
    Retire(Vec<Retirement>),
    /// Put a target's node back in service (a drain given up, a run set
    /// aside) and forget it: the uncordon is idempotent, so it comes before
    /// the status that forgets the node.
    GiveBack { target: T, reason: String },
}

impl<T> Command<T> {
    /// Whether carrying it out changes AWS or a Node (and so needs the lock).
    pub fn mutates(&self) -> bool {
        !matches!(self, Command::Nothing)
    }

    /// Whether carrying it out calls AWS (planned then on a fresh describe).
    /// A drain's termination is recorded first and made by `Terminate`.
    pub fn changes_aws(&self) -> bool {
        matches!(
            self,
            Command::SetDesired(_)
                | Command::Terminate(_)
                | Command::RemoveNotJoined(_)
                | Command::Retire(_)
        )
    }
}

/// The targets drained in one step: the current one, and those drained
/// alongside it (a refresh with `maxSurge` above 1). A path that drains one
/// node at a time has a batch of one; the batch reads as its first target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch<T> {
    pub first: T,
    pub alongside: Vec<T>,
}

impl<T> Batch<T> {
    pub fn of(first: T) -> Self {
        Batch {
            first,
            alongside: vec![],
        }
    }

    /// A batch of `targets`; None when there is none.
    pub fn from_vec(mut targets: Vec<T>) -> Option<Self> {
        if targets.is_empty() {
            return None;
        }
        let first = targets.remove(0);
        Some(Batch {
            first,
            alongside: targets,
        })
    }

    /// Every target, the first first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.first).chain(&self.alongside)
    }
}

impl<T> std::ops::Deref for Batch<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.first
    }
}
