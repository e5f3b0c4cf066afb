//! `Draining` (and a surplus node's drain in `ScalingDown`): the current
//! target is drained, held while the group cannot spare it, or given up;
//! once drained, its termination is recorded before it is made.

use super::run_reason;
use super::{Deciding, Decision, GroupNode, Happening, Input, Next, OnWindowClose, Removal, SOON};
use crate::controllers::authority::Reason;
use crate::controllers::group_view::{REPAIR_DRAIN_TIMEOUT, after, until};
use crate::crd::nodegroup::{DrainTimeoutAction, ResolvedRefresh};
use crate::crd::refresher::{RefreshPhase, RefreshTarget, TargetPurpose};
use crate::crd::replenisher::AsgCount;
use std::time::Duration;

impl Deciding<'_> {
    pub(super) fn draining_phase(&mut self, settings: &ResolvedRefresh) -> Next {
        // Raises recorded for replacements launched ahead come before any
        // drain (the manager may have died between the two).
        self.prune_ahead();
        if let Some(step) = self.raise_ahead(vec![]) {
            return Next::Decision(step);
        }
        if let Some(next) = self.promote_alongside() {
            return next;
        }
        if self.drain_pending() {
            return Next::Decision(self.draining(settings));
        }
        // No target yet (or it finished): pick the next one.
        self.next_target(settings)
    }

    /// Planned nodes not yet replaced and still in service.
    pub(super) fn remaining(&self) -> usize {
        self.outstanding().filter(|id| !self.skipped(id)).count()
    }

    /// Planned instances not yet replaced (their termination not recorded)
    /// and still in service, skipped ones included.
    pub(super) fn outstanding(&self) -> impl Iterator<Item = &String> + '_ {
        self.status
            .planned_instances
            .iter()
            .filter(|id| !self.status.replaced_instances.contains(id) && self.active(id))
    }

    /// Outstanding planned nodes whose kubelet died during the run.
    pub(super) fn dead_planned(&self) -> impl Iterator<Item = &GroupNode> + '_ {
        let group = &self.input.group;
        self.outstanding()
            .filter_map(|id| group.node_of(id))
            .filter(|n| group.unhealthy(n))
    }

    /// A planned instance the run left alone (protected).
    pub(super) fn skipped(&self, instance_id: &str) -> bool {
        self.status
            .skipped
            .iter()
            .any(|s| s.instance_id == instance_id)
    }

    /// A target is chosen and its termination not yet recorded.
    pub(super) fn drain_pending(&self) -> bool {
        self.status
            .current_target
            .as_ref()
            .is_some_and(|t| t.terminated.is_none())
    }

    /// The oldest planned instance still in service (an unhealthy one
    /// first) becomes the target (phase `Draining`) and its drain starts; with none left, `ScalingDown`.
    pub(super) fn next_target(&mut self, settings: &ResolvedRefresh) -> Next {
        // Inside a maintenance window only. Outside, the run waits with its
        // surplus, or removes it and resumes in the next window; a node in
        // hand was finished above.
        let window = self.run_window();
        if let Some(why) = window.closed_reason()
            && self.remaining() > 0
        {
            if self.input.on_window_close == OnWindowClose::ScaleDown {
                self.set_aside();
                return Next::Enter(RefreshPhase::ScalingDown);
            }
            let requeue = window.recheck_in(self.input.group.now);
            let why = format!(
                "{} node(s) left; the run waits, keeping its surplus: {why}",
                self.remaining()
            );
            return Next::Decision(self.pause(why, requeue, settings.pause_timeout));
        }
        let (upcoming, protected) = self.candidates();
        let next = upcoming.first().cloned();
        if next.is_none()
            && !protected.is_empty()
            && let Some(step) = self.wait_for_protected(protected)
        {
            return Next::Decision(step);
        }
        match next {
            Some(target) => {
                self.status.protected_since = None;
                self.status.current_target = Some(target);
                self.enter(RefreshPhase::Draining);
                // Its replacement (and the next ones', up to maxSurge)
                // comes up while it drains.
                if let Some(step) = self.launch_ahead(&upcoming, settings) {
                    return Next::Decision(step);
                }
                Next::Decision(self.draining(settings))
            }
            None => {
                self.status.current_target = None;
                Next::Enter(RefreshPhase::ScalingDown)
            }
        }
    }

    /// The planned nodes still to replace, in the order the run takes them
    /// (a node that died during the run first: it holds no pods that can
    /// still move, and until it is replaced no Ready node can be spared),
    /// and the protected ones left out (node, instance, why).
    pub(super) fn candidates(&self) -> (Vec<RefreshTarget>, Vec<(String, String, String)>) {
        let input = self.input;
        let left: Vec<&String> = self
            .status
            .planned_instances
            .iter()
            .filter(|id| {
                !(self.status.replaced_instances.contains(id)
                    || !self.active(id)
                    || self.skipped(id)
                    || self.status.alongside.iter().any(|t| t.instance_id == **id))
            })
            .collect();
        let reason = run_reason(self.status.trigger);
        let (ordered, protected) = take_order(input, reason, left);
        let upcoming = ordered
            .into_iter()
            .filter_map(|(node, id)| {
                Some(RefreshTarget {
                    node: Some(node.name.clone()),
                    instance_id: id.clone(),
                    auto_scaling_group: node.asg.clone()?,
                    purpose: TargetPurpose::Replace,
                    reason: Some(reason.label().into()),
                    since: input.group.now,
                    terminated: None,
                    blocked_by: None,
                    unhealthy: input.group.unhealthy(node),
                    workloads: vec![],
                    launched_ahead: None,
                })
            })
            .collect();
        (upcoming, protected)
    }

    /// Only protected nodes are left: wait for them up to the timeout
    /// (from when that began), then skip them, reported; the run goes on
    /// to its end. None once skipped.
    fn wait_for_protected(&mut self, protected: Vec<(String, String, String)>) -> Option<Decision> {
        let now = self.input.group.now;
        let since = *self.status.protected_since.get_or_insert(now);
        let until_t = after(since, self.protected_wait());
        if now < until_t {
            let list: Vec<String> = protected
                .iter()
                .map(|(node, _, why)| format!("{node} ({why})"))
                .collect();
            return Some(Decision::wait(
                format!(
                    "waiting for protected node(s) until {}: {}",
                    until_t.to_rfc3339(),
                    list.join("; ")
                ),
                SOON.min(until(now, until_t)),
            ));
        }
        self.status.protected_since = None;
        let mut reported = vec![];
        for (node, instance_id, reason) in protected {
            reported.push((node.clone(), reason.clone()));
            self.status
                .skipped
                .push(crate::crd::refresher::SkippedNode {
                    node,
                    instance_id,
                    reason,
                });
        }
        self.happenings.push(Happening::NodesSkipped(reported));
        None
    }

    /// A node in hand (the current target, or one drained alongside) that
    /// turned protected before its termination was recorded (a
    /// do-not-disrupt mark, someone else's cordon): the rule book's check
    /// would refuse its next step, so it is given back and left alone, as
    /// one protected when the run chose would be: a node to replace is
    /// skipped (reported), a surplus node kept. A dead node is held by no
    /// protection.
    fn turned_protected(&mut self) -> Option<Decision> {
        let group = &self.input.group;
        let dead = |t: &RefreshTarget| {
            t.unhealthy
                || group
                    .node_of(&t.instance_id)
                    .is_some_and(|n| group.unhealthy(n))
        };
        let (target, why) = self.status.batch().find_map(|t| {
            let reason = self.reason_of(t);
            let protected = self.input.rules.protected(reason);
            let why = protected.get(t.node.as_deref()?)?.clone();
            (t.terminated.is_none() && !dead(t)).then(|| (t.clone(), why))
        })?;
        let label = target.node.clone().unwrap_or(target.instance_id.clone());
        if target.purpose == TargetPurpose::RemoveSurplus {
            return Some(self.give_up(&target, format!("{label} turned protected ({why})")));
        }
        self.leave_batch(&target.instance_id);
        self.status
            .skipped
            .push(crate::crd::refresher::SkippedNode {
                node: label.clone(),
                instance_id: target.instance_id.clone(),
                reason: why.clone(),
            });
        self.happenings
            .push(Happening::NodesSkipped(vec![(label.clone(), why.clone())]));
        Some(Decision::back_in_service(
            target,
            format!("{label} turned protected ({why}): given back and skipped"),
        ))
    }

    /// A target that is no longer the run's to terminate: its ASG left the
    /// group's spec mid-drain (its node, cordoned by us, still runs: it is
    /// given back), or it left its ASG by other means (a spot interruption).
    /// None: it still is.
    fn no_longer_ours(&mut self, target: &RefreshTarget, label: &str) -> Option<Decision> {
        let asg = &target.auto_scaling_group;
        let step = if self.input.group.asg(asg).is_none() {
            self.leave_batch(&target.instance_id);
            Decision::back_in_service(
                target.clone(),
                format!("{label} given back: {asg} is no longer one of the group's ASGs"),
            )
        } else if !self.active(&target.instance_id) {
            self.status.current_target = None;
            Decision::wait(
                format!("{label} left its ASG by other means"),
                Duration::ZERO,
            )
        } else {
            return None;
        };
        if target.purpose == TargetPurpose::Replace {
            self.status.phase = RefreshPhase::Draining;
        }
        Some(step)
    }

    /// A target chosen, not yet terminated: drain it, or give up on it.
    pub(super) fn draining(&mut self, settings: &ResolvedRefresh) -> Decision {
        let now = self.input.group.now;
        let Some(target) = self.status.current_target.clone() else {
            return Decision::wait("no target", SOON);
        };
        let label = target
            .node
            .clone()
            .unwrap_or_else(|| target.instance_id.clone());
        if let Some(step) = self.no_longer_ours(&target, &label) {
            return step;
        }
        if let Some(step) = self.turned_protected() {
            return step;
        }
        if let Some(blocked) = self.refused(&target) {
            return self.yield_to_authority(&target, blocked);
        }
        let Removal {
            safe,
            ready_besides,
            needed,
        } = self.removal_safety(&target);
        let target = self.mark_unhealthy(target);
        let drain_deadline = match target.unhealthy {
            true => after(
                target.since,
                settings.drain_timeout.min(REPAIR_DRAIN_TIMEOUT),
            ),
            false => after(target.since, settings.drain_timeout),
        };
        if !safe && let Some(step) = self.unhealthy_first(&target, &label) {
            return step;
        }
        if !safe && let Some(step) = self.surplus_down_first(&target, &label) {
            return step;
        }
        if !safe {
            // Waiting for Ready nodes elsewhere, bounded like a replacement.
            let deadline = after(drain_deadline, settings.ready_timeout);
            if now >= deadline {
                return self.give_up(
                    &target,
                    format!(
                        "gave up on {label}: removing it would leave {ready_besides} Ready, fewer than {needed}"
                    ),
                );
            }
            return Decision::wait(
                format!(
                    "holding {label}: removing it now would leave {ready_besides} Ready, fewer than {needed}"
                ),
                SOON.min(until(now, deadline)),
            );
        }
        if target.node.is_none() {
            // An instance that never joined: nothing to drain.
            let id = target.instance_id.clone();
            return self.terminate_now(&id, format!("terminating {label} (never joined)"));
        }
        if now >= drain_deadline && target.unhealthy {
            // Its kubelet is dead: what its pods wait for never comes.
            return self.terminate_now(&target.instance_id, format!(
                "{label} is NotReady past the unhealthy timeout; evictions tried, terminating it as a repair"
            ));
        }
        if now >= drain_deadline {
            let after = crate::duration::format(settings.drain_timeout);
            return match settings.drain_timeout_action {
                DrainTimeoutAction::Proceed => self.terminate_now(&target.instance_id, format!(
                    "drain of {label} timed out after {after}; terminating it anyway (drainTimeoutAction Proceed)"
                )),
                DrainTimeoutAction::Abort => self.give_up(
                    &target,
                    format!(
                        "drain of {label} timed out after {after} (drainTimeoutAction Abort){}",
                        target
                            .blocked_by
                            .as_ref()
                            .map(|b| format!("; blocked by: {b}"))
                            .unwrap_or_default()
                    ),
                ),
            };
        }
        let what = match target.purpose {
            TargetPurpose::Replace => format!(
                "draining {label} ({} of {})",
                self.status.replaced + 1,
                self.status.total
            ),
            TargetPurpose::RemoveSurplus => format!("draining surplus node {label}"),
        };
        let requeue = SOON.min(until(now, drain_deadline));
        self.drain_batch(target, what, requeue, settings)
    }

    /// The target, marked unhealthy (in the status too) once its node is
    /// NotReady past the unhealthy timeout: its drain is then best effort.
    /// A node Ready again loses the mark: it is drained as a healthy node
    /// again, with its budgets, the full drain timeout from now and
    /// `drainTimeoutAction`.
    pub(super) fn mark_unhealthy(&mut self, mut target: RefreshTarget) -> RefreshTarget {
        let group = &self.input.group;
        let node = target
            .node
            .as_ref()
            .and_then(|name| group.nodes.iter().find(|n| n.name == *name));
        let unhealthy = node.is_some_and(|n| group.unhealthy(n));
        let recovered = node.is_some_and(|n| n.ready);
        let now = group.now;
        let changed = match (target.unhealthy, unhealthy, recovered) {
            (false, true, _) => {
                target.unhealthy = true;
                true
            }
            (true, _, true) => {
                target.unhealthy = false;
                target.since = now;
                true
            }
            _ => false,
        };
        if changed && let Some(t) = self.status.batch_member_mut(&target.instance_id) {
            t.unhealthy = target.unhealthy;
            t.since = target.since;
        }
        target
    }

    /// A planned node died while a healthy target waits to be spared: the
    /// group cannot spare it until the dead one is replaced, so the dead one
    /// goes first; the target is put back in service and taken again later.
    fn unhealthy_first(&mut self, target: &RefreshTarget, label: &str) -> Option<Decision> {
        if target.unhealthy {
            return None;
        }
        let dead = self.unhealthy_planned()?;
        self.status.current_target = None;
        let message = format!("{dead} died during the run: replacing it before {label}");
        Some(Decision::back_in_service(target.clone(), message))
    }

    /// A planned node, not yet replaced and still in service, that is
    /// unhealthy (its kubelet died during the run), by name.
    fn unhealthy_planned(&self) -> Option<String> {
        self.dead_planned().next().map(|n| n.name.clone())
    }

    /// Leaves the target in service (uncordoned) and fails the run.
    pub(super) fn give_up(&mut self, target: &RefreshTarget, reason: String) -> Decision {
        self.leave_batch(&target.instance_id);
        if target.purpose == TargetPurpose::RemoveSurplus {
            // Keep this surplus node rather than loop on it: its ASG's
            // current count becomes the layout to end at, and the failure
            // says so. The replenisher removes extra Ready nodes later.
            let current = self
                .input
                .group
                .asgs
                .iter()
                .find(|a| a.name == target.auto_scaling_group)
                .map(|a| a.desired);
            if let (Some(o), Some(current)) = (
                self.status
                    .original_desired
                    .iter_mut()
                    .find(|o| o.auto_scaling_group == target.auto_scaling_group),
                current,
            ) {
                let kept = current - o.desired;
                o.desired = current;
                // Still left to the replenisher when the run ends.
                if kept > 0 {
                    self.status.surplus_kept.push(AsgCount {
                        auto_scaling_group: target.auto_scaling_group.clone(),
                        count: kept,
                    });
                }
            }
            let label = target.node.as_deref().unwrap_or(&target.instance_id);
            self.record_failure(format!(
                "{reason}; surplus node {label} kept in {}",
                target.auto_scaling_group
            ));
        } else {
            self.record_failure(reason.clone());
        }
        self.enter(RefreshPhase::ScalingDown);
        Decision::back_in_service(target.clone(), reason)
    }
}

/// Nodes a run takes (node, instance) in order, and those it leaves out as
/// protected (node, instance, why).
pub(super) type Order<'a> = (
    Vec<(&'a GroupNode, &'a String)>,
    Vec<(String, String, String)>,
);

/// The order a run takes `planned` (oldest first, as recorded at its start):
/// a node that died first (it holds no pods that can still move, and until
/// it is replaced no Ready node can be spared); the protected ones left out
/// (node, instance, why), a dead node excepted: no protection holds a
/// repair. Shared by the run and its preview, so the preview says the order
/// the run takes.
pub(super) fn take_order<'a>(
    input: &'a Input,
    reason: Reason,
    mut planned: Vec<&'a String>,
) -> Order<'a> {
    let protection = input.rules.protected(reason);
    let node_of = |id: &str| input.group.node_of(id);
    planned.sort_by_key(|id| !node_of(id).is_some_and(|n| input.group.unhealthy(n)));
    let mut protected = vec![];
    let mut upcoming = vec![];
    for id in planned {
        let Some(node) = node_of(id) else { continue };
        match protection.get(&node.name) {
            Some(why) if !input.group.unhealthy(node) => {
                protected.push((node.name.clone(), id.clone(), why.clone()));
            }
            _ => upcoming.push((node, id)),
        }
    }
    (upcoming, protected)
}
