//! Nodes drained alongside the current target (workers, `maxSurge` above
//! 1): the next nodes whose replacements were launched ahead join the
//! current target's drain once those replacements are Ready, so up to
//! `maxSurge` nodes drain at once and PodDisruptionBudgets decide how fast
//! their pods go. Each is terminated (with decrement) once drained, its
//! termination recorded first, one termination per reconcile so each is
//! judged on fresh counts. The batch is validated as one step: every
//! replacement in service, every workload the batch moved back.

use super::{Batch, Command, Deciding, Decision, Next, SOON};
use crate::controllers::group_view::{REPAIR_DRAIN_TIMEOUT, after};
use crate::crd::nodegroup::{DrainTimeoutAction, ResolvedRefresh};
use crate::crd::refresher::{RefreshPhase, RefreshTarget, TargetPurpose};
use std::time::Duration;

impl Deciding<'_> {
    pub(super) fn is_lead(&self, instance_id: &str) -> bool {
        self.status
            .current_target
            .as_ref()
            .is_some_and(|t| t.instance_id == instance_id)
    }

    /// The batch is replaced (or failed): forget it.
    pub(super) fn end_batch(&mut self) {
        self.status.current_target = None;
        self.status.alongside = vec![];
    }

    /// Takes a target out of the batch (given up, or gone).
    pub(super) fn leave_batch(&mut self, instance_id: &str) {
        if self.is_lead(instance_id) {
            self.status.current_target = None;
        }
        self.status
            .alongside
            .retain(|t| t.instance_id != instance_id);
    }

    /// Ready nodes of the group outside the batch.
    fn ready_outside_batch(&self) -> i32 {
        let in_batch = |id: &Option<String>| {
            id.as_ref()
                .is_some_and(|id| self.status.batch().any(|t| t.instance_id == *id))
        };
        self.input
            .group
            .nodes
            .iter()
            .filter(|n| n.ready && !in_batch(&n.instance_id))
            .count() as i32
    }

    /// While the current target (launched ahead) drains, or waits for its
    /// replacement: the next nodes the run takes join it, in order, up to
    /// `maxSurge` in the batch, each once its replacement was launched
    /// ahead and the group stays whole without it (its replacement's room
    /// is Ready), in an open window. A dead node is not taken alongside:
    /// it goes next, as a repair.
    pub(super) fn admit_alongside(&mut self, settings: &ResolvedRefresh) {
        // Until the batch's validation begins: a current target drained
        // sooner than its replacements come up leaves room for the rest.
        let ready_lead = self.status.current_target.as_ref().is_some_and(|t| {
            t.purpose == TargetPurpose::Replace
                && t.launched_ahead.is_some()
                && self.status.validating_since.is_none()
        });
        if !ready_lead || self.run_window().closed_reason().is_some() {
            return;
        }
        let surge = self.surge(settings);
        let (upcoming, _) = self.candidates();
        for mut t in upcoming {
            if self.is_lead(&t.instance_id) {
                continue;
            }
            if self.status.batch().count() >= surge || t.unhealthy {
                return;
            }
            let launched = self
                .status
                .launched_ahead
                .iter()
                .find(|a| a.instance_id == t.instance_id)
                .map(|a| a.since);
            if launched.is_none() || self.ready_outside_batch() - 1 < self.whole() {
                return;
            }
            t.launched_ahead = launched;
            self.status.alongside.push(t);
        }
    }

    /// The drain step of the current target, and of the nodes drained
    /// alongside it: the next nodes launched ahead join once their
    /// replacements are Ready.
    pub(super) fn drain_batch(
        &mut self,
        target: RefreshTarget,
        what: String,
        requeue: Duration,
        settings: &ResolvedRefresh,
    ) -> Decision {
        self.admit_alongside(settings);
        let alongside = match self.alongside_drains(settings) {
            Ok(more) => more,
            Err(step) => return step,
        };
        let what = match alongside.len() {
            0 => what,
            n => format!("{what}, and {n} alongside"),
        };
        let batch = Batch {
            first: target,
            alongside,
        };
        Decision::act(Command::Drain(batch), what, requeue)
    }

    /// The nodes drained alongside, this step: those gone by other means
    /// leave the batch, a termination recorded but not made is retried
    /// (the step returned), each other one is drained, held while the
    /// group cannot spare it, or given up, as the current target is.
    #[allow(clippy::result_large_err)] // One per reconcile, moved once.
    pub(super) fn alongside_drains(
        &mut self,
        settings: &ResolvedRefresh,
    ) -> Result<Vec<RefreshTarget>, Decision> {
        let now = self.input.group.now;
        let mut drains = vec![];
        for t in self.status.alongside.clone() {
            let label = t.node.clone().unwrap_or_else(|| t.instance_id.clone());
            if !self.active(&t.instance_id) {
                if t.terminated.is_none() {
                    self.leave_batch(&t.instance_id);
                }
                continue;
            }
            if t.terminated.is_some() {
                return Err(self.retry_termination(t));
            }
            let t = self.mark_unhealthy(t);
            let timeout = match t.unhealthy {
                true => settings.drain_timeout.min(REPAIR_DRAIN_TIMEOUT),
                false => settings.drain_timeout,
            };
            let drain_deadline = after(t.since, timeout);
            let removal = self.removal_safety(&t);
            if !removal.safe {
                if now >= after(drain_deadline, settings.ready_timeout) {
                    return Err(self.give_up(
                        &t,
                        format!(
                            "gave up on {label}: removing it would leave {} Ready, fewer than {}",
                            removal.ready_besides, removal.needed
                        ),
                    ));
                }
                continue;
            }
            if now >= drain_deadline {
                let took = crate::duration::format(timeout);
                return Err(
                    match (t.unhealthy, settings.drain_timeout_action) {
                        (true, _) | (false, DrainTimeoutAction::Proceed) => self.terminate_now(
                            &t.instance_id,
                            format!("drain of {label} (alongside) timed out after {took}; terminating it anyway"),
                        ),
                        (false, DrainTimeoutAction::Abort) => self.give_up(
                            &t,
                            format!(
                                "drain of {label} timed out after {took} (drainTimeoutAction Abort){}",
                                t.blocked_by
                                    .as_ref()
                                    .map(|b| format!("; blocked by: {b}"))
                                    .unwrap_or_default()
                            ),
                        ),
                    },
                );
            }
            drains.push(t);
        }
        Ok(drains)
    }

    /// The current target is terminated: the next nodes may still join,
    /// and the batch finishes before it is validated. None once every node
    /// of it is terminated.
    pub(super) fn finish_alongside(&mut self, settings: &ResolvedRefresh) -> Option<Decision> {
        self.admit_alongside(settings);
        let drains = match self.alongside_drains(settings) {
            Ok(drains) => drains,
            Err(step) => return Some(step),
        };
        let names: Vec<String> = self
            .status
            .alongside
            .iter()
            .filter(|t| t.terminated.is_none())
            .map(|t| t.node.clone().unwrap_or_else(|| t.instance_id.clone()))
            .collect();
        if names.is_empty() {
            return None;
        }
        let message = format!("draining {} alongside", names.join(", "));
        Some(match Batch::from_vec(drains) {
            None => Decision::wait(
                format!("{message}: held until the group can spare them"),
                SOON,
            ),
            Some(batch) => Decision::act(Command::Drain(batch), message, SOON),
        })
    }

    /// No current target, but nodes drained alongside it (it left its ASG
    /// by other means): the first of them leads the batch.
    pub(super) fn promote_alongside(&mut self) -> Option<Next> {
        if self.status.current_target.is_some() || self.status.alongside.is_empty() {
            return None;
        }
        let lead = self.status.alongside.remove(0);
        let terminated = lead.terminated.is_some();
        self.status.current_target = Some(lead);
        Some(match terminated {
            true if self.status.phase != RefreshPhase::WaitingForReplacement => {
                Next::Enter(RefreshPhase::WaitingForReplacement)
            }
            _ => Next::Decision(Decision::wait("the batch goes on", Duration::ZERO)),
        })
    }

    /// A run ending (`ScalingDown`): a node of the batch being replaced and
    /// not drained yet (the run failed with a batch in hand) is
    /// put back in service, one whose termination was recorded but not made
    /// is terminated if its raise is still there (its decrement restores the
    /// layout), else kept. One step at a time; None once the batch is empty.
    pub(super) fn release_alongside(&mut self) -> Option<Decision> {
        if let Some(t) = self.status.current_target.clone()
            && t.purpose == TargetPurpose::Replace
            && t.terminated.is_none()
        {
            self.leave_batch(&t.instance_id);
            if self.active(&t.instance_id)
                && let Some(node) = t.node.clone()
            {
                let message = format!("{node} kept: back in service");
                return Some(Decision::back_in_service(t, message));
            }
        }
        while let Some(t) = self.status.alongside.first().cloned() {
            let active = self.active(&t.instance_id);
            if active && t.terminated.is_some() {
                let raised = self
                    .input
                    .group
                    .asg(&t.auto_scaling_group)
                    .zip(self.base_desired(&t.auto_scaling_group))
                    .is_some_and(|(asg, base)| asg.desired > base);
                if raised {
                    return Some(self.retry_termination(t));
                }
                self.status
                    .replaced_instances
                    .retain(|id| *id != t.instance_id);
            }
            self.leave_batch(&t.instance_id);
            if active && let Some(node) = t.node.clone() {
                let message = format!("{node} (drained alongside) kept: back in service");
                return Some(Decision::back_in_service(t, message));
            }
        }
        None
    }

    /// Every node of the batch has a replacement in service: per ASG, as
    /// many Ready, schedulable nodes launched since the first of its
    /// replacements was launched (or, not launched ahead, since its
    /// termination) as the batch took from it. (AWS reports launch times
    /// to the second, cut: compared from the second begun.) Replacements
    /// launched ahead for the next nodes count too once Ready: they are
    /// new nodes of the group all the same.
    pub(super) fn replacements_in_service(&self) -> Vec<String> {
        use chrono::Timelike;
        use std::collections::BTreeMap;
        let mut per_asg: BTreeMap<&str, (usize, chrono::DateTime<chrono::Utc>)> = BTreeMap::new();
        for t in self.status.batch() {
            let launched = t.launched_ahead.or(t.terminated).unwrap_or(t.since);
            let began = launched.with_nanosecond(0).unwrap_or(launched);
            let e = per_asg
                .entry(t.auto_scaling_group.as_str())
                .or_insert((0, began));
            e.0 += 1;
            e.1 = e.1.min(began);
        }
        per_asg
            .into_iter()
            .filter(|(asg, (wanted, began))| {
                let new = self
                    .input
                    .group
                    .nodes
                    .iter()
                    .filter(|n| {
                        n.ready
                            && !n.unschedulable
                            && n.asg.as_deref() == Some(*asg)
                            && n.launch_time.is_some_and(|t| t >= *began)
                    })
                    .count();
                new < *wanted
            })
            .map(|(asg, (wanted, _))| {
                format!("fewer than {wanted} new node(s) in {asg} Ready and schedulable yet")
            })
            .collect()
    }

    /// The step's wait message for the batch.
    pub(super) fn batch_label(&self) -> String {
        let names: Vec<String> = self
            .status
            .batch()
            .map(|t| t.node.clone().unwrap_or_else(|| t.instance_id.clone()))
            .collect();
        names.join(", ")
    }
}
