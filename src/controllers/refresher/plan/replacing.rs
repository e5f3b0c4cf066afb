//! `WaitingForReplacement`: the target is terminated without decrement; wait
//! until Ready is whole again (masters: and the control plane settled), the
//! group validated (the replacement itself Ready and schedulable, the pods
//! the drain moved back) and settled, then go on with the next target.

use super::{Deciding, Decision, Happening, Next, SOON};
use crate::controllers::group_view::{after, until};
use crate::crd::Role;
use crate::crd::nodegroup::{DrainTimeoutAction, ResolvedRefresh};
use std::time::Duration;

/// What the validation after a replacement decides.
enum Validation {
    Passed,
    Wait(Box<Decision>),
    Failed(String),
}

impl Deciding<'_> {
    pub(super) fn waiting_for_replacement(&mut self, settings: &ResolvedRefresh) -> Next {
        let now = self.input.group.now;
        if let Some(next) = self.promote_alongside() {
            return next;
        }
        let Some(target) = self.status.current_target.clone() else {
            return self.next_target(settings);
        };
        if self.active(&target.instance_id) {
            return Next::Decision(self.retry_termination(target));
        }
        // The nodes drained alongside it go before the batch is validated.
        if let Some(step) = self.finish_alongside(settings) {
            return Next::Decision(step);
        }
        let (ready, whole) = (self.ready(), self.whole_but_dead());
        let node = self.batch_label();
        if ready >= whole {
            match self.control_plane_settling(settings) {
                Ok(Some(waiting)) => return Next::Decision(waiting),
                Ok(None) => {}
                Err(reason) => {
                    self.end_batch();
                    return self.fail(reason);
                }
            }
            if let Some(step) = self.launch_next_ahead(settings) {
                return Next::Decision(step);
            }
            match self.validate(&node, settings) {
                Validation::Passed => {}
                Validation::Wait(step) => return Next::Decision(*step),
                Validation::Failed(reason) => {
                    self.end_batch();
                    return self.fail(reason);
                }
            }
            for t in self.status.batch() {
                let took = (now - t.since).to_std().unwrap_or(Duration::ZERO);
                let node = t.node.clone().unwrap_or(t.instance_id.clone());
                self.happenings.push(Happening::Replaced { node, took });
            }
            self.status.replaced += self.status.batch().count() as i32;
            self.status.progress = Some(format!("{}/{}", self.status.replaced, self.status.total));
            self.end_batch();
            return self.next_target(settings);
        }
        // Whole again later: what was validated before counts no more.
        self.status.validated_since = None;
        let deadline = after(self.since_phase(), settings.ready_timeout);
        if now >= deadline {
            self.end_batch();
            return self.fail(format!(
                "the replacement for {node} was not Ready within {}: {ready} of {whole} nodes Ready",
                crate::duration::format(settings.ready_timeout)
            ));
        }
        Next::Decision(Decision::wait(
            format!("waiting for the replacement of {node}: {ready} of {whole} nodes Ready"),
            SOON.min(until(now, deadline)),
        ))
    }

    /// Ready nodes to wait for before the next node: the whole count, less
    /// planned nodes whose kubelet died (they are never Ready again; the
    /// run replaces them next, as repairs).
    pub(super) fn whole_but_dead(&self) -> i32 {
        self.whole() - self.dead_planned().count() as i32
    }

    /// Ready is whole again: the group is validated before the next node
    /// (scoped to the group, not the cluster): the replacement itself Ready
    /// and schedulable, no pod of a workload the drain moved Pending or not
    /// Ready; then that holds for the settle time. Bounded by
    /// `validationTimeout`, whose action decides what a timeout does.
    fn validate(&mut self, node: &str, settings: &ResolvedRefresh) -> Validation {
        let now = self.input.group.now;
        let started = *self.status.validating_since.get_or_insert(now);
        let mut waiting = self.replacements_in_service();
        let moved = |w: &String| self.status.batch().any(|t| t.workloads.contains(w));
        waiting.extend(
            self.input
                .unsettled
                .iter()
                .filter(|(w, _)| moved(w))
                .map(|(w, why)| format!("{w}: {why}")),
        );
        if waiting.is_empty() {
            let since = *self.status.validated_since.get_or_insert(now);
            let settled = after(since, settings.settle_time);
            if now < settled {
                return Validation::Wait(Box::new(Decision::wait(
                    format!(
                        "the replacement of {node} is validated; settling until {}",
                        settled.to_rfc3339()
                    ),
                    until(now, settled),
                )));
            }
            self.end_validation();
            return Validation::Passed;
        }
        self.status.validated_since = None;
        let deadline = after(started, settings.validation_timeout);
        if now < deadline {
            // No watch tells of pods coming back, and evicted pods mostly
            // do within seconds: looked at as often as a drain's steps.
            let again = crate::k8s::drain::next_step_after(started, now);
            return Validation::Wait(Box::new(Decision::wait(
                format!(
                    "validating the replacement of {node}: {}",
                    waiting.join("; ")
                ),
                again.min(until(now, deadline)),
            )));
        }
        let reason = format!(
            "the group was not whole within {} of replacing {node}: {}",
            crate::duration::format(settings.validation_timeout),
            waiting.join("; ")
        );
        self.end_validation();
        match settings.validation_timeout_action {
            DrainTimeoutAction::Abort => Validation::Failed(reason),
            DrainTimeoutAction::Proceed => {
                self.happenings
                    .push(Happening::ValidationTimedOut(format!("{reason}; going on")));
                Validation::Passed
            }
        }
    }

    fn end_validation(&mut self) {
        self.status.validating_since = None;
        self.status.validated_since = None;
    }

    /// Masters, once the replacement is Ready: wait until every master's
    /// control-plane pods are Ready, then the settle time, before the next
    /// master is touched. Ok(None): go on; Err: not Ready in time.
    fn control_plane_settling(
        &mut self,
        settings: &ResolvedRefresh,
    ) -> Result<Option<Decision>, String> {
        let input = self.input;
        if input.group.role != Role::Master {
            return Ok(None);
        }
        // A master beside its place's etcd member (an ASG its user raised,
        // a replacement waiting for its predecessor to go) shows no Ready
        // control-plane pods until it takes the place's volume, which may
        // be never: it is not waited for.
        let beside = |n: &&crate::controllers::group_view::GroupNode| {
            let cp = input.group.control_plane;
            n.instance_id
                .as_deref()
                .is_some_and(|id| cp.is_some_and(|cp| cp.beside(id)))
        };
        let mut waiting_for: Vec<&str> = input
            .group
            .nodes
            .iter()
            .filter(|n| n.ready && !input.control_plane_ready.contains(&n.name))
            .filter(|n| !beside(n))
            .map(|n| n.name.as_str())
            .collect();
        waiting_for.sort();
        let deadline = after(self.since_phase(), settings.ready_timeout);
        if !waiting_for.is_empty() {
            self.status.control_plane_ready_since = None;
            if input.group.now >= deadline {
                return Err(format!(
                    "control-plane pods not Ready within {} on {}",
                    crate::duration::format(settings.ready_timeout),
                    waiting_for.join(", ")
                ));
            }
            return Ok(Some(Decision::wait(
                format!(
                    "waiting for control-plane pods (kube-apiserver, etcd-manager) on {}",
                    waiting_for.join(", ")
                ),
                SOON.min(until(input.group.now, deadline)),
            )));
        }
        let since = *self
            .status
            .control_plane_ready_since
            .get_or_insert(input.group.now);
        let settled = after(since, settings.master_settle_time);
        if input.group.now < settled {
            return Ok(Some(Decision::wait(
                format!(
                    "control plane Ready; settling until {}",
                    settled.to_rfc3339()
                ),
                until(input.group.now, settled),
            )));
        }
        self.status.control_plane_ready_since = None;
        Ok(None)
    }
}
