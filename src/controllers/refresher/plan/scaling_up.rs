//! `ScalingUp`: raise the ASGs by the run's surplus and wait until it is
//! Ready, bounded by the ready timeout.

use super::{Command, Deciding, Decision, Next, SOON, describe_changes, surplus_of};
use crate::controllers::group_view::{DesiredChange, after, until};
use crate::crd::nodegroup::ResolvedRefresh;

impl Deciding<'_> {
    pub(super) fn scaling_up(&mut self, settings: &ResolvedRefresh) -> Next {
        let now = self.input.group.now;
        let changes = self.raise_changes();
        if !changes.is_empty() {
            let message = format!("adding surplus: {}", describe_changes(&changes));
            return Next::Decision(Decision::act(Command::SetDesired(changes), message, SOON));
        }
        let (ready, whole) = (self.ready(), self.whole_but_dead());
        if ready >= whole {
            return self.next_target(settings);
        }
        // The first nodes' replacements come up with the surplus, not one
        // launch after it (workers, up to maxSurge, in an open window).
        if let Some(step) = self.launch_next_ahead(settings) {
            return Next::Decision(step);
        }
        let deadline = after(self.since_phase(), settings.ready_timeout);
        if now >= deadline {
            return self.fail(format!(
                "surplus not Ready within {}: {ready} of {whole} nodes Ready",
                crate::duration::format(settings.ready_timeout)
            ));
        }
        Next::Decision(Decision::wait(
            format!("waiting for surplus: {ready} of {whole} nodes Ready"),
            SOON.min(until(now, deadline)),
        ))
    }

    /// ASGs below their recorded desired count plus this run's surplus.
    fn raise_changes(&self) -> Vec<DesiredChange> {
        self.status
            .original_desired
            .iter()
            .filter_map(|o| {
                let asg = self
                    .input
                    .group
                    .asgs
                    .iter()
                    .find(|a| a.name == o.auto_scaling_group)?;
                let want = o.desired + surplus_of(&self.status.surplus, &asg.name);
                (asg.desired < want && want <= asg.max).then(|| DesiredChange {
                    asg: asg.name.clone(),
                    from: asg.desired,
                    to: want,
                })
            })
            .collect()
    }
}
