//! Launch before terminate (workers, `maxSurge`): when the run takes a
//! node, its replacement is launched at once (its ASG raised by one,
//! recorded in `status.launchedAhead` before the raise) so it comes up
//! while the node drains; the node is then terminated with decrement. A
//! node costs the longer of its drain and its replacement's launch, not
//! both. Up to `maxSurge` replacements are launched ahead at a time: the
//! next nodes the run takes, in its order, once the previous replacements
//! are Ready. Masters never: a second control-plane node in an ASG cannot
//! take the first one's etcd volume, so a master goes before its
//! replacement comes.

use super::{Command, Deciding, Decision, describe_changes, surplus_of};
use crate::controllers::group_view::DesiredChange;
use crate::crd::Role;
use crate::crd::nodegroup::ResolvedRefresh;
use crate::crd::refresher::{LaunchedAhead, RefreshTarget};
use std::time::Duration;

impl Deciding<'_> {
    /// How many replacements may be launched ahead at once.
    pub(super) fn surge(&self, settings: &ResolvedRefresh) -> usize {
        match self.input.group.role {
            Role::Master => 0,
            Role::Worker => settings.max_surge.of(self.input.group.desired).max(0) as usize,
        }
    }

    /// An ASG's recorded count plus this run's surplus in it: what it is
    /// at with nothing launched ahead.
    pub(super) fn base_desired(&self, asg: &str) -> Option<i32> {
        let original = self
            .status
            .original_desired
            .iter()
            .find(|o| o.auto_scaling_group == asg)?
            .desired;
        Some(original + surplus_of(&self.status.surplus, asg))
    }

    fn ahead_in(&self, asg: &str) -> i32 {
        self.status
            .launched_ahead
            .iter()
            .filter(|a| a.auto_scaling_group == asg)
            .count() as i32
    }

    /// Launches ahead in an ASG whose node this run has not terminated
    /// (with decrement): raises still standing, read from the run's own
    /// record where the ASG is not described.
    pub(super) fn owed_ahead_in(&self, asg: &str) -> i32 {
        let st = &self.status;
        st.launched_ahead
            .iter()
            .filter(|a| a.auto_scaling_group == asg)
            .filter(|a| !st.replaced_instances.contains(&a.instance_id))
            .count() as i32
    }

    /// A node launched ahead still owed its raise: planned, in service,
    /// its termination not recorded (its decrement then takes the raise
    /// back), and not skipped.
    fn still_ahead(&self, instance_id: &str) -> bool {
        self.outstanding().any(|id| id == instance_id) && !self.skipped(instance_id)
    }

    /// Keeps `launchedAhead` to what is owed: entries whose node was
    /// terminated, left the ASG or the plan, or was skipped go (a raise
    /// they leave behind is surplus, removed at the end like any), and so
    /// do entries an ASG's max no longer has room for. Each target of the
    /// batch follows its entry until its termination is recorded: without one it
    /// is terminated without decrement and its ASG replaces it.
    pub(super) fn prune_ahead(&mut self) {
        let mut kept: Vec<LaunchedAhead> = vec![];
        for a in &self.status.launched_ahead {
            if !self.still_ahead(&a.instance_id) {
                continue;
            }
            let in_asg = kept
                .iter()
                .filter(|k| k.auto_scaling_group == a.auto_scaling_group)
                .count() as i32;
            let fits = self
                .input
                .group
                .asg(&a.auto_scaling_group)
                .zip(self.base_desired(&a.auto_scaling_group))
                .is_some_and(|(asg, base)| base + in_asg < asg.max);
            if fits {
                kept.push(a.clone());
            }
        }
        self.status.launched_ahead = kept;
        let launched = |id: &str| {
            self.status
                .launched_ahead
                .iter()
                .find(|a| a.instance_id == id)
                .map(|a| a.since)
        };
        let marks: Vec<(String, Option<chrono::DateTime<chrono::Utc>>)> = self
            .status
            .batch()
            .filter(|t| t.terminated.is_none())
            .map(|t| (t.instance_id.clone(), launched(&t.instance_id)))
            .collect();
        for (id, mark) in marks {
            if let Some(t) = self.status.batch_member_mut(&id) {
                t.launched_ahead = mark;
            }
        }
    }

    /// Records the replacements of the next nodes the run takes
    /// (`upcoming`, in its order) as launched ahead, up to `maxSurge` at a
    /// time and where their ASG has room below its max; returns the step
    /// that raises the ASGs, if one is owed.
    pub(super) fn launch_ahead(
        &mut self,
        upcoming: &[RefreshTarget],
        settings: &ResolvedRefresh,
    ) -> Option<Decision> {
        self.prune_ahead();
        let surge = self.surge(settings);
        let now = self.input.group.now;
        let mut names = vec![];
        for t in upcoming.iter().take(surge) {
            if self.status.launched_ahead.len() >= surge
                || self
                    .status
                    .launched_ahead
                    .iter()
                    .any(|a| a.instance_id == t.instance_id)
            {
                continue;
            }
            // Room below max, and no extra count there already (a raise
            // left by a node that left the run): a replacement launched
            // ahead is one launched now, which its validation looks for;
            // the extra goes at the end, like the surplus.
            let asg = &t.auto_scaling_group;
            let room = self
                .input
                .group
                .asg(asg)
                .zip(self.base_desired(asg))
                .is_some_and(|(a, base)| {
                    let owed = base + self.ahead_in(asg);
                    owed < a.max && a.desired <= owed
                });
            if !room {
                continue;
            }
            self.status.launched_ahead.push(LaunchedAhead {
                instance_id: t.instance_id.clone(),
                auto_scaling_group: asg.clone(),
                since: now,
            });
            names.push(t.node.clone().unwrap_or_else(|| t.instance_id.clone()));
        }
        self.prune_ahead();
        self.raise_ahead(names)
    }

    /// The current replacement is Ready: the next nodes' replacements are
    /// launched now, while it is validated and settles (in an open window).
    pub(super) fn launch_next_ahead(&mut self, settings: &ResolvedRefresh) -> Option<Decision> {
        if self.run_window().closed_reason().is_some() {
            return None;
        }
        let (upcoming, _) = self.candidates();
        self.launch_ahead(&upcoming, settings)
    }

    /// The step raising each ASG to its recorded count, surplus and
    /// replacements launched ahead, when one is below it.
    pub(super) fn raise_ahead(&self, names: Vec<String>) -> Option<Decision> {
        let changes: Vec<DesiredChange> = self
            .input
            .group
            .asgs
            .iter()
            .filter_map(|asg| {
                let want = self.base_desired(&asg.name)? + self.ahead_in(&asg.name);
                (asg.desired < want && want <= asg.max).then(|| DesiredChange {
                    asg: asg.name.clone(),
                    from: asg.desired,
                    to: want,
                })
            })
            .collect();
        if changes.is_empty() {
            return None;
        }
        let whose = match names.is_empty() {
            true => String::new(),
            false => format!(" of {}", names.join(", ")),
        };
        Some(Decision::act(
            Command::SetDesired(changes.clone()),
            format!(
                "launching the replacement(s){whose} ahead: {}",
                describe_changes(&changes)
            ),
            Duration::ZERO,
        ))
    }
}
