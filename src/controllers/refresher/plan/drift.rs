//! A drift roll (`drift.action: Replace`) follows the drift while it runs:
//! a newer template version adds nodes to it, a rollback takes them out.

use super::{Deciding, Decision, Happening, rank, surplus_of};
use crate::crd::refresher::{AsgDesired, RefreshPhase, RunTrigger, TargetPurpose};

impl Deciding<'_> {
    /// A drift roll short of `ScalingDown` takes the nodes drifted now:
    /// those that drifted since it started join (a newer version) but for
    /// as many as each ASG's surplus, planned ones no longer drifted leave (a
    /// rollback), unless already terminated.
    /// One being drained is put back in service (the step returned), and
    /// so is one drained alongside it, even once the first is terminated.
    pub(super) fn follow_drift(&mut self) -> Option<Decision> {
        if self.status.trigger != Some(RunTrigger::Drift)
            || rank(self.status.phase) >= rank(RefreshPhase::ScalingDown)
        {
            return None;
        }
        let input = self.input;
        let clean = |id: &str| input.group.node_of(id).is_some_and(|n| !n.drifted);
        // The first node of the batch being drained that is no longer
        // drifted goes back in service (the next one at the next step).
        let mut step = None;
        let back = self
            .status
            .batch()
            .find(|t| {
                t.purpose == TargetPurpose::Replace
                    && t.terminated.is_none()
                    && clean(&t.instance_id)
            })
            .cloned();
        if let Some(t) = back {
            self.leave_batch(&t.instance_id);
            let label = t.node.clone().unwrap_or(t.instance_id.clone());
            step = Some(Decision::back_in_service(
                t,
                format!("{label} is no longer drifted; back in service"),
            ));
        }
        let drifted = super::targets::drifted_targets(input);
        let st = &mut self.status;
        let in_batch: Vec<String> = st.batch().map(|t| t.instance_id.clone()).collect();
        let (kept, left): (Vec<String>, Vec<String>) = std::mem::take(&mut st.planned_instances)
            .into_iter()
            .partition(|id| {
                st.replaced_instances.contains(id) || in_batch.contains(id) || !clean(id)
            });
        st.planned_instances = kept;
        // The newest of them in an ASG with surplus stand for it, as many
        // as it has: `ScalingDown` removes drifted nodes there first, so
        // replacing them too would cost a launch and a termination each.
        // Its surplus is all above the recorded count but the replacements
        // still owed to planned nodes (a raise left by a node launched
        // ahead that left the run is surplus too).
        let mut surplus: Vec<AsgDesired> = st
            .original_desired
            .iter()
            .map(|o| {
                let name = &o.auto_scaling_group;
                let owed = st
                    .launched_ahead
                    .iter()
                    .filter(|a| a.auto_scaling_group == *name)
                    .filter(|a| {
                        st.planned_instances.contains(&a.instance_id)
                            && !st.replaced_instances.contains(&a.instance_id)
                    })
                    .count() as i32;
                let raised = input.group.asg(name).map_or(0, |a| a.desired - o.desired);
                AsgDesired {
                    auto_scaling_group: name.clone(),
                    desired: surplus_of(&st.surplus, name).max(raised - owed),
                }
            })
            .collect();
        let asg_of = |id: &str| input.group.node_of(id).and_then(|n| n.asg.clone());
        let mut joined: Vec<String> = vec![];
        for id in drifted.into_iter().rev() {
            if st.planned_instances.contains(&id) {
                continue;
            }
            let spare = asg_of(&id).and_then(|asg| {
                surplus
                    .iter_mut()
                    .find(|s| s.auto_scaling_group == asg && s.desired > 0)
            });
            match spare {
                Some(s) => s.desired -= 1,
                None => joined.insert(0, id),
            }
        }
        if !joined.is_empty() || !left.is_empty() {
            st.planned_instances.extend(joined.iter().cloned());
            st.total = st.planned_instances.len() as i32;
            st.progress = Some(format!("{}/{}", st.replaced, st.total));
            self.happenings
                .push(Happening::DriftChanged { joined, left });
        }
        step
    }
}
