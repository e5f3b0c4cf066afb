//! The one executor: a planned [`Command`] carried out, persist then act,
//! for every path that changes AWS or a Node (the refresher's runs and
//! drift rolls, the replenisher's raises, removals, repairs and
//! retirements). Each controller plans a command with the status that
//! records it; this function writes that status, asks the controller's
//! guard, then acts through the controller's [`Effects`]. The reconciles
//! run it against the cluster and AWS; the plans' property tests and the
//! walk over every path run the same function against their simulated
//! worlds, with the real guards, so the order they prove safe is the order
//! the controllers use.
//!
//! The order, for every path:
//! - a node given back is uncordoned (idempotent) before the status that
//!   forgets it is written;
//! - the status that records an action is written, then the action made,
//!   with named crash points between: `<path>:<command>:persisted` and
//!   `<path>:<command>:acted` (see `crate::crash_points`);
//! - a drain that finishes records its termination (a second write), then
//!   makes it (`<path>:terminate:persisted`); the others drained alongside
//!   wait for the next step, judged then on fresh counts;
//! - every mutation is re-checked by the guard first, with the status that
//!   records it: the executor asks, so no effects can forget to;
//! - the group's lock is the executor's own protocol, not a plan's step: a
//!   mutation, or a status that records something the lock covers
//!   (`Record::keeps_lock`: a run under way, a removal in hand), is carried
//!   out only with the lock; without it, the executor takes the lock and
//!   carries out nothing of that plan (nothing written), so the path plans
//!   again, with the lock, on what it observes then (the group's other
//!   controller may have acted meanwhile); once the status records nothing
//!   the lock covers, a lock held is given back, with its slot first;
//! - so is the manager-wide disruption slot: an effect the guard refuses
//!   only for want of a slot takes a free one (the group's lock held) and
//!   is asked again; once the status records nothing in hand
//!   (`Record::in_hand`), a slot held is given back, so a path waiting on
//!   time holds none; the slot is given back before the lock: it is only
//!   ever held with its lock.

use crate::Result;
use crate::controllers::authority::rules::Reason;
use crate::controllers::authority::validate::Refused;
use crate::controllers::command::{Batch, Command, Effect};
use crate::controllers::group_view::DesiredChange;
use crate::controllers::guard::Refusal;
use crate::crd::replenisher::{CleanupTarget, Retirement};
use crate::k8s::lock::LockState;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// The outcome of asking for the group's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Yes,
    /// A race lost: look again soon.
    Retry,
    /// Held by the group's other controller.
    HeldElsewhere,
}

/// After a drain step: whether the node is drained, and when to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    pub done: bool,
    pub requeue: Duration,
    /// What refused an eviction in this step (a PodDisruptionBudget).
    pub blocked_by: Option<String>,
}

/// A node a path takes away, as the executor needs to know it.
pub trait Target: Clone + std::fmt::Debug {
    fn instance_id(&self) -> &str;
    /// Its Node, when it has one.
    fn node(&self) -> Option<&str>;
    /// Why the path takes it away, in the rule book's terms: decided once,
    /// when it was chosen, and carried in the record (None: the record
    /// carries none, and no step of it is made).
    fn reason(&self) -> Option<Reason>;
}

/// A path's status, and what each outcome of a command writes in it (pure;
/// a path whose plan already recorded it leaves the default).
pub trait Record: Clone + PartialEq {
    type Target: Target;
    /// The crash points' prefix: `refresher`, `replenisher`.
    const PATH: &'static str;
    /// The target `instance` as this status holds it in a drain.
    fn draining(&self, instance: &str) -> Option<&Self::Target>;
    /// A drained target's termination recorded; the target to terminate.
    fn drained(&mut self, instance: &str, now: DateTime<Utc>) -> Option<Self::Target>;
    /// The workloads a drain of `instance` moves, recorded before it does.
    fn moving(&mut self, _instance: &str, _workloads: &[String]) {}
    /// What refused an eviction from `instance`'s node in this step.
    fn blocked(&mut self, _instance: &str, _by: &str) {}
    /// What a mutation made writes (a raise landed, a termination done, a
    /// node given back, a never-joined instance removed, instances
    /// retired), at `now`: the effect as the guard checked it and as it is
    /// told, one description for the three.
    fn made(&mut self, _effect: Effect<'_, Self::Target>, _now: DateTime<Utc>) {}
    /// A raise not made (dry-run, or AWS made none): nothing recorded as
    /// done, not even between a write and the next.
    fn not_made(&mut self, _effect: Effect<'_, Self::Target>) {}
    /// Whether a disruption the slot bounds is under way (a node being
    /// drained, or terminated and not yet replaced): the slot it took is
    /// kept. Otherwise a slot held is given back after the command.
    fn in_hand(&self) -> bool {
        false
    }
    /// Whether it records something the group's lock covers (a run under
    /// way, a removal or a raise in hand): written only with the lock, and
    /// the lock kept while it does. Otherwise a lock held is given back
    /// after the command.
    fn keeps_lock(&self) -> bool {
        self.in_hand()
    }
}

type TargetOf<E> = <<E as Effects>::Record as Record>::Target;

/// What carrying out a command needs from the world. Each mutation gets the
/// status that records it, and is checked by `guard` with it first.
#[allow(async_fn_in_trait)] // Used with static dispatch only.
pub trait Effects {
    type Record: Record;
    /// The guard's answer for a mutation recorded by `status`, on this
    /// reconcile's observations.
    fn guard(
        &self,
        status: &Self::Record,
        effect: Effect<'_, TargetOf<Self>>,
    ) -> Result<(), Refusal>;
    /// Whether mutations are only logged (nothing is made).
    fn dry_run(&self) -> bool {
        false
    }
    async fn write_status(&mut self, status: &Self::Record) -> crate::Result<()>;
    /// A named point between a write and the action that follows it.
    fn reached(&mut self, point: &str) -> crate::Result<()>;
    /// The plan's status is stored: what it starts is told.
    async fn announce(&mut self) {}
    /// The group's lock as this path sees it (as observed, or taken by
    /// this command); None for a path that takes none (the interruption
    /// drainer: AWS takes its node whoever holds the group).
    fn lock(&self) -> Option<LockState> {
        None
    }
    /// Takes the group's lock; once taken, `lock` says it is ours. (The
    /// defaults below refuse what a path does not make.)
    async fn take_lock(&mut self) -> crate::Result<Taken> {
        not_this_path("take a group's lock")
    }
    /// Takes a manager-wide disruption slot, the lock held; false when
    /// none is free. Once taken, the guard sees it this path's.
    async fn take_slot(&mut self) -> crate::Result<bool> {
        not_this_path("take a disruption slot")
    }
    /// Whether this path holds a disruption slot (as observed, or taken by
    /// this command).
    fn holds_slot(&self) -> bool {
        false
    }
    /// Gives back the disruption slot if ours.
    async fn release_slot(&mut self) -> crate::Result<()> {
        Ok(())
    }
    /// Gives back the group's lock if ours.
    async fn release_lock(&mut self) -> crate::Result<()> {
        Ok(())
    }
    /// Whether the changes were made (not in dry-run).
    async fn set_desired(
        &mut self,
        _changes: &[DesiredChange],
        _status: &Self::Record,
        _why: &str,
    ) -> crate::Result<bool> {
        not_this_path("set a desired count")
    }
    /// The controllers of the pods a drain of `target`'s node moves now.
    async fn workloads_on(&mut self, _target: &TargetOf<Self>) -> crate::Result<Vec<String>> {
        Ok(vec![])
    }
    /// One drain step; `first` when this target was not being drained before.
    async fn drain_step(
        &mut self,
        target: &TargetOf<Self>,
        status: &Self::Record,
        first: bool,
        why: &str,
    ) -> crate::Result<Drained>;
    /// Terminates the instance of a removal (`Terminate`, `NotJoined`, one
    /// `Retire`) whose termination `status` records; whether it was made.
    async fn terminate(
        &mut self,
        removal: Effect<'_, TargetOf<Self>>,
        status: &Self::Record,
    ) -> crate::Result<bool>;
    async fn uncordon(&mut self, _node: &str, _status: &Self::Record) -> crate::Result<()> {
        not_this_path("uncordon")
    }
    /// What a command made (Events, metrics); `why` is the plan's message.
    async fn done(
        &mut self,
        _done: Effect<'_, TargetOf<Self>>,
        _status: &Self::Record,
        _why: &str,
    ) {
    }
}

/// A step a path never plans, refused rather than made.
pub(crate) fn not_this_path<T>(what: &str) -> crate::Result<T> {
    Err(Refusal::NotThisPath {
        what: what.to_string(),
    }
    .into())
}

/// One planned command with the status that records it.
pub struct Planned<'a, S: Record> {
    pub command: &'a Command<S::Target>,
    pub status: S,
    /// What it is doing or waiting for.
    pub message: &'a str,
    pub requeue: Duration,
}

impl<'a, S: Record> Planned<'a, S> {
    pub fn of(
        command: &'a Command<S::Target>,
        status: S,
        message: &'a str,
        requeue: Duration,
    ) -> Self {
        Planned {
            command,
            status,
            message,
            requeue,
        }
    }
}

/// Carries out `planned`; `stored` is the path's status as it was stored.
/// Returns when to reconcile again.
pub async fn execute<E: Effects>(
    effects: &mut E,
    stored: Option<&E::Record>,
    planned: Planned<'_, E::Record>,
    now: DateTime<Utc>,
) -> crate::Result<Duration> {
    if let Some(requeue) = lock_first(effects, &planned).await? {
        return Ok(requeue);
    }
    let mut run = Run {
        effects,
        stored,
        written: stored.cloned(),
        announced: false,
        status: planned.status,
        message: planned.message,
        requeue: planned.requeue,
        now,
    };
    let carried = run.carry_out(planned.command).await;
    match &carried {
        Ok(()) => {
            // The status the command leaves, written before a slot goes.
            run.write().await?;
            run.give_back_idle().await?;
        }
        // A refusal made nothing: what is in hand is what was recorded.
        Err(crate::Error::Refused { .. }) => run.give_back_idle().await?,
        // A crash point, an API failure: the next pass finds the slot held
        // and decides again.
        Err(_) => {}
    }
    carried?;
    Ok(run.requeue.max(Duration::from_millis(100)))
}

/// The group's lock first: a mutation, or a status that records something
/// the lock covers, without the lock takes it and carries out nothing of
/// the plan (it was made without the lock: the next pass plans again with
/// it). Some(when to look again) when the lock was asked for. Held by the
/// group's other controller, a status that only waits is still written
/// (a run paused by it, say); a mutation is not made.
async fn lock_first<E: Effects>(
    effects: &mut E,
    planned: &Planned<'_, E::Record>,
) -> crate::Result<Option<Duration>> {
    let mutates = planned.command.mutates();
    let needs = mutates || planned.status.keeps_lock();
    match effects.lock() {
        None | Some(LockState::Ours) => return Ok(None),
        Some(_) if !needs => return Ok(None),
        Some(LockState::Other(_)) if !mutates => return Ok(None),
        Some(_) => {}
    }
    Ok(Some(match effects.take_lock().await? {
        Taken::Yes => Duration::from_millis(100),
        Taken::Retry => Duration::from_secs(1),
        Taken::HeldElsewhere => planned
            .requeue
            .clamp(Duration::from_millis(100), Duration::from_secs(5)),
    }))
}

/// The guard's answer for `effect`, recorded by `status`, with the slot as
/// the executor's protocol: a refusal only for want of a slot while one is
/// free takes it (the lock held: every disruption is planned under it) and
/// asks again; a slot the others hold is refused as the guard said.
async fn check<E: Effects>(
    effects: &mut E,
    status: &E::Record,
    effect: Effect<'_, TargetOf<E>>,
) -> crate::Result<()> {
    let mut answer = effects.guard(status, effect);
    let wants_slot = matches!(answer, Err(Refusal::Rule(Refused::NoSlot { .. })));
    if wants_slot && !effects.holds_slot() && effects.take_slot().await? {
        answer = effects.guard(status, effect);
    }
    // (A slot another path took since this pass looked is refused as the
    // guard saw it.) A refusal says the reason its target carries.
    answer.map_err(|refusal| refused(refusal, effect.target().and_then(Target::reason)))
}

/// A guard's refusal as the error the path reports, with the reason the
/// disruption carries.
fn refused(refusal: Refusal, reason: Option<Reason>) -> crate::Error {
    let check = refusal.check();
    let message = match reason {
        Some(reason) => format!("{refusal} (for {})", reason.label()),
        None => refusal.to_string(),
    };
    tracing::warn!(%refusal, check, reason = reason.map(Reason::label), "safety check");
    crate::Error::Refused { check, message }
}

struct Run<'a, E: Effects> {
    effects: &'a mut E,
    stored: Option<&'a E::Record>,
    written: Option<E::Record>,
    announced: bool,
    status: E::Record,
    message: &'a str,
    requeue: Duration,
    now: DateTime<Utc>,
}

impl<E: Effects> Run<'_, E> {
    async fn carry_out(&mut self, command: &Command<TargetOf<E>>) -> crate::Result<()> {
        match command {
            Command::Nothing => self.persist("nothing").await?,
            Command::SetDesired(changes) => self.set_desired(changes).await?,
            Command::Drain(batch) => self.drain(batch).await?,
            Command::Terminate(target) => {
                self.guard(Effect::Terminate(target)).await?;
                self.terminate(target).await?;
            }
            Command::RemoveNotJoined(target) => self.remove_not_joined(target).await?,
            Command::Retire(retiring) => self.retire(retiring).await?,
            Command::GiveBack { target, reason } => self.give_back(target, reason).await?,
        }
        Ok(())
    }

    async fn guard(&mut self, effect: Effect<'_, TargetOf<E>>) -> crate::Result<()> {
        check(self.effects, &self.status, effect).await
    }

    /// What the status written after the command no longer records is
    /// given back: nothing the lock covers (a path idle, or done), the
    /// slot and then the lock; nothing in hand (a path waiting on time,
    /// between disruptions), the slot, so no wait holds one another path
    /// needs. The next effect that needs either takes it again.
    async fn give_back_idle(&mut self) -> crate::Result<()> {
        let written = self.written.as_ref();
        let ours = matches!(self.effects.lock(), Some(LockState::Ours));
        if ours && !written.is_some_and(Record::keeps_lock) {
            // The slot first: it is only ever held with the lock, so a
            // restart between the two finds the lock still ours and gives
            // it back then. (A slot not observed as ours is given back too:
            // a path observes it only when a removal could happen.)
            self.effects.release_slot().await?;
            return self.effects.release_lock().await;
        }
        if self.effects.holds_slot() && !written.is_some_and(Record::in_hand) {
            self.effects.release_slot().await?;
        }
        Ok(())
    }

    /// Writes the status when it differs from what was written last.
    async fn write(&mut self) -> crate::Result<()> {
        if self.written.as_ref() != Some(&self.status) {
            self.effects.write_status(&self.status).await?;
            self.written = Some(self.status.clone());
        }
        Ok(())
    }

    /// Writes the status that records the command's action, then reaches
    /// `<path>:<command>:persisted`: persist, then act.
    async fn persist(&mut self, command: &str) -> crate::Result<()> {
        self.write().await?;
        let path = <E::Record as Record>::PATH;
        self.effects
            .reached(&format!("{path}:{command}:persisted"))?;
        if !self.announced {
            self.announced = true;
            self.effects.announce().await;
        }
        Ok(())
    }

    fn acted(&mut self, command: &str) -> crate::Result<()> {
        let path = <E::Record as Record>::PATH;
        self.effects.reached(&format!("{path}:{command}:acted"))
    }

    async fn done(&mut self, done: Effect<'_, TargetOf<E>>) -> crate::Result<()> {
        self.write().await?;
        self.effects.done(done, &self.status, self.message).await;
        Ok(())
    }

    /// A mutation made: recorded in the status, written, then told.
    async fn made(&mut self, effect: Effect<'_, TargetOf<E>>) -> crate::Result<()> {
        self.status.made(effect, self.now);
        self.done(effect).await
    }

    async fn set_desired(&mut self, changes: &[DesiredChange]) -> crate::Result<()> {
        self.guard(Effect::SetDesired(changes)).await?;
        if self.effects.dry_run() {
            // Nothing will be made: record nothing as done, not even
            // between this write and the next.
            self.status.not_made(Effect::SetDesired(changes));
        }
        self.persist("set_desired").await?;
        let made = (self.effects)
            .set_desired(changes, &self.status, self.message)
            .await?;
        self.acted("set_desired")?;
        match made {
            true => self.made(Effect::SetDesired(changes)).await?,
            false => self.status.not_made(Effect::SetDesired(changes)),
        }
        Ok(())
    }

    /// One drain step on each target; the first one drained has its
    /// termination recorded, then made.
    async fn drain(&mut self, batch: &Batch<TargetOf<E>>) -> crate::Result<()> {
        // The targets are in the status: written before the first eviction,
        // with the workloads this step may evict (a refresh's validation
        // waits for their pods).
        //
        // Each step is put to the guard before that write, as well as
        // before it is made: a first step refused (outside a window, a
        // protected node) must leave no record, or the next pass would take
        // the recorded target for a drain in hand, which a window no longer
        // gates.
        let first =
            |stored: Option<&E::Record>, id: &str| stored.is_none_or(|s| s.draining(id).is_none());
        for target in batch.iter() {
            let id = target.instance_id();
            let effect = Effect::Drain {
                target: self.status.draining(id).unwrap_or(target),
                begins: first(self.stored, id),
            };
            check(self.effects, &self.status, effect).await?;
        }
        // The guard is pure on this reconcile's observations: its answer
        // stands for the steps below, made on the same ones.
        for target in batch.iter() {
            let moving = self.effects.workloads_on(target).await?;
            self.status.moving(target.instance_id(), &moving);
        }
        self.persist("drain").await?;
        let mut requeue = Duration::MAX;
        let mut drained: Option<String> = None;
        for target in batch.iter() {
            let id = target.instance_id();
            let first = first(self.stored, id);
            let target = self.status.draining(id).unwrap_or(target).clone();
            let step = (self.effects)
                .drain_step(&target, &self.status, first, self.message)
                .await?;
            requeue = requeue.min(step.requeue);
            if step.done {
                drained.get_or_insert(id.to_string());
            } else if let Some(by) = &step.blocked_by {
                // Kept for the failure reason should the drain be given up
                // (an observation, not an intent).
                self.status.blocked(id, by);
            }
        }
        self.write().await?;
        self.requeue = self.requeue.min(requeue);
        let Some(id) = drained else {
            return Ok(());
        };
        // Record the termination, then make it: a restart retries this one
        // and never picks another node for the same step.
        let mut after = self.status.clone();
        if let Some(target) = after.drained(&id, self.now) {
            check(self.effects, &after, Effect::Terminate(&target)).await?;
            self.status = after;
            self.terminate(&target).await?;
            self.requeue = Duration::from_millis(500);
        }
        Ok(())
    }

    /// A recorded termination: written, then made, then marked done.
    async fn terminate(&mut self, target: &TargetOf<E>) -> crate::Result<()> {
        if self.remove("terminate", Effect::Terminate(target)).await? {
            self.made(Effect::Terminate(target)).await?;
        }
        Ok(())
    }

    async fn remove_not_joined(&mut self, target: &CleanupTarget) -> crate::Result<()> {
        self.guard(Effect::NotJoined(target)).await?;
        if self
            .remove("remove_not_joined", Effect::NotJoined(target))
            .await?
        {
            self.made(Effect::NotJoined(target)).await?;
        }
        Ok(())
    }

    /// One removal, persisted first: whether it was made.
    async fn remove(
        &mut self,
        command: &str,
        removal: Effect<'_, TargetOf<E>>,
    ) -> crate::Result<bool> {
        self.persist(command).await?;
        let made = self.effects.terminate(removal, &self.status).await?;
        self.acted(command)?;
        Ok(made)
    }

    async fn retire(&mut self, retiring: &[Retirement]) -> crate::Result<()> {
        self.guard(Effect::Retire(retiring)).await?;
        self.persist("retire").await?;
        let mut retired = vec![];
        for r in retiring {
            let one = std::slice::from_ref(r);
            if self
                .effects
                .terminate(Effect::Retire(one), &self.status)
                .await?
            {
                retired.push(r.clone());
            }
        }
        self.acted("retire")?;
        if !retired.is_empty() {
            self.made(Effect::Retire(&retired)).await?;
        }
        Ok(())
    }

    /// Uncordons the target's node (idempotent) before the status that
    /// forgets it is written.
    async fn give_back(&mut self, target: &TargetOf<E>, reason: &str) -> crate::Result<()> {
        if let Some(node) = target.node() {
            // Checked against the status before this step: a target given
            // back is still recorded there (its ASG may have left the spec).
            let before = self.stored.unwrap_or(&self.status);
            check(self.effects, before, Effect::GiveBack { target, reason }).await?;
            self.effects.uncordon(node, before).await?;
        }
        (self.status).made(Effect::GiveBack { target, reason }, self.now);
        self.persist("give_back").await?;
        self.done(Effect::GiveBack { target, reason }).await
    }
}

#[cfg(test)]
mod tests;
