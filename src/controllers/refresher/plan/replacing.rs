//! `WaitingForReplacement`: the target is terminated without decrement; wait
//! until Ready is whole again (masters: and the control plane settled), then
//! go on with the next target.

use super::{Happening, Next, Planner, SOON, Step};
use crate::controllers::group_view::{after, until};
use crate::crd::Role;
use crate::crd::nodegroup::ResolvedRefresh;
use std::time::Duration;

impl Planner<'_> {
    pub(super) fn waiting_for_replacement(&mut self, settings: &ResolvedRefresh) -> Next {
        let now = self.input.group.now;
        let Some(target) = self.status.current_target.clone() else {
            return self.next_target(settings);
        };
        if self.active(&target.instance_id) {
            return Next::Step(self.retry_termination(target));
        }
        let (ready, whole) = (self.ready(), self.whole());
        let node = target.node.clone().unwrap_or(target.instance_id.clone());
        if ready >= whole {
            match self.control_plane_settling(settings) {
                Ok(Some(waiting)) => return Next::Step(waiting),
                Ok(None) => {}
                Err(reason) => {
                    self.status.current_target = None;
                    return self.fail(reason);
                }
            }
            let took = (now - target.since).to_std().unwrap_or(Duration::ZERO);
            self.happenings.push(Happening::Replaced { node, took });
            self.status.replaced += 1;
            self.status.progress = Some(format!("{}/{}", self.status.replaced, self.status.total));
            self.status.current_target = None;
            return self.next_target(settings);
        }
        let deadline = after(self.since_phase(), settings.ready_timeout);
        if now >= deadline {
            self.status.current_target = None;
            return self.fail(format!(
                "the replacement for {node} was not Ready within {}: {ready} of {whole} nodes Ready",
                crate::duration::format(settings.ready_timeout)
            ));
        }
        Next::Step(Step::wait(
            format!("waiting for the replacement of {node}: {ready} of {whole} nodes Ready"),
            SOON.min(until(now, deadline)),
        ))
    }

    /// Masters, once the replacement is Ready: wait until every master's
    /// control-plane pods are Ready, then the settle time, before the next
    /// master is touched. Ok(None): go on; Err: not Ready in time.
    fn control_plane_settling(
        &mut self,
        settings: &ResolvedRefresh,
    ) -> Result<Option<Step>, String> {
        let input = self.input;
        if input.group.role != Role::Master {
            return Ok(None);
        }
        let mut waiting_for: Vec<&str> = input
            .group
            .nodes
            .iter()
            .filter(|n| n.ready && !input.control_plane_ready.contains(&n.name))
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
            return Ok(Some(Step::wait(
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
            return Ok(Some(Step::wait(
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
