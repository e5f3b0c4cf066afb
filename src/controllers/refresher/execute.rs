//! The refresher's executor: the order in which a planned step is carried
//! out. The reconcile runs it against the cluster and AWS; the plan's
//! property test runs the same function against its simulated group, so the
//! order the test proves safe is the order the controller uses.
//!
//! Order: an uncordon (idempotent) before the status that forgets the node;
//! the planned status written; the step's happenings reported; the action.
//! A drain that finishes records its termination (second write) before the
//! termination is made. Every mutation is first re-checked by the guard
//! (`Effects::guard`, the real `guard::refresh` in both), with the status
//! that records it: the executor asks, so no implementation can forget to.

use super::plan::{Batch, Command, Happening, Plan, after_drain};
use crate::Result;
use crate::controllers::group_view::DesiredChange;
use crate::controllers::guard::refresh::Check;
use crate::crd::refresher::{RefreshTarget, RefresherStatus};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// Crash points (see `crate::crash_points`): the planned status is stored, the
/// action not made.
pub const PERSISTED: &str = "refresher:step:persisted";
/// A finished drain's termination is stored, the termination not made.
pub const TERMINATION_PERSISTED: &str = "refresher:terminate:persisted";

/// After a drain step: whether the node is drained, and when to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    pub done: bool,
    pub requeue: Duration,
    /// What refused an eviction in this step (a PodDisruptionBudget).
    pub blocked_by: Option<String>,
}

/// What carrying out a step needs from the world. Each mutation gets the
/// status that records it, and is checked by `guard` with it first.
#[allow(async_fn_in_trait)] // Used with static dispatch only.
pub trait Effects {
    /// The guard's answer (`guard::refresh::Guard::check`) for a
    /// mutation recorded by `status`, on this reconcile's observations.
    fn guard(
        &self,
        status: &RefresherStatus,
        check: Check<'_>,
    ) -> std::result::Result<(), crate::controllers::guard::Refusal>;
    async fn uncordon(&mut self, node: &str, status: &RefresherStatus) -> Result<()>;
    async fn write_status(&mut self, status: &RefresherStatus) -> Result<()>;
    /// A named point between a write and the action that follows it.
    fn reached(&mut self, point: &str) -> Result<()>;
    async fn report(&mut self, happenings: &[Happening]);
    /// Takes a manager-wide disruption slot, then the group's lock (not
    /// the lock without the slot). Returns when to look again.
    async fn take_lock(&mut self) -> Result<Duration>;
    /// Releases the group's lock and the disruption slot, whichever is ours.
    async fn release_lock(&mut self) -> Result<()>;
    async fn set_desired(
        &mut self,
        changes: &[DesiredChange],
        status: &RefresherStatus,
        why: &str,
    ) -> Result<()>;
    /// The controllers of the pods a drain of `target`'s node moves now
    /// (see `k8s::workloads`).
    async fn workloads_on(&mut self, target: &RefreshTarget) -> Result<Vec<String>>;
    /// One drain step; `first` when this target was not being drained before.
    async fn drain_step(
        &mut self,
        target: &RefreshTarget,
        status: &RefresherStatus,
        first: bool,
        why: &str,
    ) -> Result<Drained>;
    /// Terminates a target whose termination `status` records.
    async fn terminate(&mut self, target: &RefreshTarget, status: &RefresherStatus) -> Result<()>;
}

/// Carries out `plan`, whose status (with the reconcile's conditions) is
/// `status`; `stored` is what the Refresher's status was. Returns when to
/// reconcile again.
pub async fn execute<E: Effects>(
    effects: &mut E,
    stored: Option<&RefresherStatus>,
    plan: &Plan,
    status: &RefresherStatus,
    now: DateTime<Utc>,
) -> Result<Duration> {
    let mut requeue = plan.requeue;
    if let Command::GiveBack { target, .. } = &plan.command
        && let Some(node) = &target.node
    {
        // Checked against the status before this step: a target given back
        // is still recorded there (its ASG may have left the spec since).
        let before = stored.unwrap_or(status);
        effects.guard(before, Check::GivesBack(node))?;
        effects.uncordon(node, before).await?;
    }
    if Some(status) != stored {
        effects.write_status(status).await?;
    }
    effects.reached(PERSISTED)?;
    effects.report(&plan.happenings).await;
    match &plan.command {
        Command::Nothing | Command::GiveBack { .. } => {}
        Command::TakeLock => requeue = effects.take_lock().await?,
        Command::ReleaseLock => effects.release_lock().await?,
        Command::SetDesired(changes) => {
            effects.guard(status, Check::SetDesired(changes))?;
            effects.set_desired(changes, status, &plan.message).await?;
        }
        Command::Drain(batch) => {
            requeue = requeue.min(drain(effects, stored, status, batch, &plan.message, now).await?);
        }
        // The replenisher's alone: a refresher plan never makes them.
        Command::TakeSlot | Command::RemoveNotJoined(_) | Command::Retire(_) => {
            return Err(crate::Error::InvalidObject(format!(
                "{:?}: not a refresher command",
                plan.command
            )));
        }
        Command::Terminate(target) => {
            effects.guard(status, Check::Terminate(target))?;
            effects.terminate(target, status).await?
        }
    }
    Ok(requeue.max(Duration::from_millis(100)))
}

/// One drain step on each target; the first one drained has its
/// termination recorded, then made (the others wait for the next step,
/// judged then on fresh counts). Returns when to look again.
async fn drain<E: Effects>(
    effects: &mut E,
    stored: Option<&RefresherStatus>,
    status: &RefresherStatus,
    targets: &Batch<RefreshTarget>,
    why: &str,
    now: DateTime<Utc>,
) -> Result<Duration> {
    // The workloads this step may evict, recorded before it does: the
    // validation after the replacements waits for their pods.
    let mut recorded = status.clone();
    for target in targets.iter() {
        let moving = effects.workloads_on(target).await?;
        with_workloads(&mut recorded, &target.instance_id, &moving);
    }
    if recorded != *status {
        effects.write_status(&recorded).await?;
    }
    let mut status = recorded;
    let mut requeue = Duration::MAX;
    let mut drained: Option<String> = None;
    let mut blocked = status.clone();
    for target in targets.iter() {
        let first = !stored.is_some_and(|s| s.batch().any(|t| t.instance_id == target.instance_id));
        let target = status
            .batch()
            .find(|t| t.instance_id == target.instance_id)
            .unwrap_or(target);
        effects.guard(&status, Check::Drain(target))?;
        let step = effects.drain_step(target, &status, first, why).await?;
        requeue = requeue.min(step.requeue);
        if step.done {
            drained.get_or_insert(target.instance_id.clone());
        } else if step.blocked_by.is_some()
            && step.blocked_by != target.blocked_by
            && let Some(t) = blocked.batch_member_mut(&target.instance_id)
        {
            // What held the drain, kept for the failure reason should the
            // drain be given up (an observation, not an intent).
            t.blocked_by = step.blocked_by.clone();
        }
    }
    if blocked != status {
        effects.write_status(&blocked).await?;
        status = blocked;
    }
    if let Some(id) = drained {
        // Record the termination, then make it: a restart retries this
        // one and never picks another node for the same step.
        let mut after = status.clone();
        if let Some(target) = after_drain(&mut after, &id, now) {
            effects.write_status(&after).await?;
            effects.reached(TERMINATION_PERSISTED)?;
            effects.guard(&after, Check::Terminate(&target))?;
            effects.terminate(&target, &after).await?;
            requeue = Duration::from_millis(500);
        }
    }
    Ok(requeue)
}

/// Adds `moving` to the workloads of the batch's target `instance_id`.
fn with_workloads(status: &mut RefresherStatus, instance_id: &str, moving: &[String]) {
    let Some(target) = status.batch_member_mut(instance_id) else {
        return;
    };
    for w in moving {
        if !target.workloads.contains(w) {
            target.workloads.push(w.clone());
        }
    }
    target.workloads.sort();
}
