//! `ScalingDown`: every ASG back to its recorded desired count. Surplus
//! nodes are chosen explicitly and drained like a replacement, then
//! terminated with decrement; the run ends and the lock is released.

use super::{
    Command, Deciding, Decision, GroupNode, Happening, Member, SOON, describe_changes, surplus_of,
};
use crate::controllers::authority::Reason;
use crate::controllers::group_view::{DesiredChange, after, until};
use crate::crd::nodegroup::ResolvedRefresh;
use crate::crd::refresher::SurplusLeft;
use crate::crd::refresher::{AsgDesired, RefreshTarget, RunResult, TargetPurpose};
use crate::crd::replenisher::AsgCount;

/// What the layout needs next, ASG by ASG.
#[derive(Default)]
struct Layout {
    /// Desired counts to set (a failed launch cancelled).
    changes: Vec<DesiredChange>,
    /// A surplus node to remove, or the ASG where none can go yet.
    victim: Option<Result<RefreshTarget, String>>,
    /// An ASG with a launch in flight to wait for.
    waiting: Option<String>,
    /// ASGs whose surplus is kept: every node that could go is protected
    /// (do-not-disrupt, a pod no controller would recreate), with why.
    kept: Vec<(String, Vec<String>)>,
}

/// Why no surplus node of an ASG can go now.
enum NoVictim {
    /// Removing any would leave fewer Ready than desired.
    TooFewReady,
    /// Each node that could go is protected: "node (why)".
    Protected(Vec<String>),
}

impl Deciding<'_> {
    /// Back to the recorded layout; then the run ends. Always a step: this
    /// is the last phase.
    pub(super) fn scaling_down(&mut self, settings: &ResolvedRefresh) -> Decision {
        let input = self.input;
        // What was launched ahead is surplus now, removed like any.
        self.status.launched_ahead.clear();
        if let Some(step) = self.release_alongside() {
            return step;
        }
        if self.drain_pending() {
            return self.draining(settings);
        }
        if let Some(target) = self.status.current_target.clone() {
            let original = original_of(&self.status.original_desired, &target.auto_scaling_group);
            let asg_desired = input
                .group
                .asgs
                .iter()
                .find(|a| a.name == target.auto_scaling_group)
                .map(|a| a.desired);
            // A termination recorded but not seen done yet, and still needed.
            if self.active(&target.instance_id) && asg_desired.is_some_and(|d| Some(d) > original) {
                return self.retry_termination(target);
            }
            self.status.current_target = None;
        }
        self.accept_lowered_layout();
        self.note_surplus_seen();
        let Layout {
            changes,
            victim,
            waiting,
            kept,
        } = self.layout();
        if !changes.is_empty() {
            let message = format!("cancelling a failed launch: {}", describe_changes(&changes));
            return Decision::act(Command::SetDesired(changes), message, SOON);
        }
        let deadline = after(self.since_phase(), settings.ready_timeout);
        if victim.is_none()
            && let Some(asg) = waiting
        {
            if input.group.now < deadline {
                return Decision::wait(
                    format!(
                        "waiting for the launch in flight in {asg} before removing the surplus"
                    ),
                    SOON.min(until(input.group.now, deadline)),
                );
            }
            return self.finish_run(
                settings,
                Some(format!(
                    "a surplus launch in {asg} never landed: its desired count is left above the recorded one"
                )),
            );
        }
        match victim {
            Some(Ok(target)) => {
                self.status.current_target = Some(target);
                self.status.phase_since = Some(input.group.now);
                self.draining(settings)
            }
            Some(Err(asg)) => {
                if input.group.now >= deadline {
                    return self.finish_run(
                        settings,
                        Some(format!(
                            "surplus left in {asg}: no node could be removed while keeping {} Ready",
                            input.group.desired
                        )),
                    );
                }
                Decision::wait(
                    format!(
                        "keeping the surplus in {asg} until removing it leaves {} Ready ({} Ready now)",
                        input.group.desired,
                        self.ready(),
                    ),
                    SOON.min(until(input.group.now, deadline)),
                )
            }
            None if !kept.is_empty() => {
                // Voluntary removal never takes a protected node: the
                // surplus stays, and the replenisher's scale-in (which
                // honours protection too) takes it back once one may go.
                let kept: Vec<String> = kept
                    .iter()
                    .map(|(asg, nodes)| format!("{asg} ({})", nodes.join(", ")))
                    .collect();
                let mut step = self.finish_run(settings, None);
                step.message = format!(
                    "{}; surplus kept on protected nodes in {}: the replenisher removes it once one may go",
                    step.message,
                    kept.join("; ")
                );
                step
            }
            None => self.finish_run(settings, None),
        }
    }

    /// An ASG whose desired count someone else lowered below the recorded
    /// one during the run (a user, kops, another tool): that count is
    /// theirs. The run ends at it instead of raising it back; our own steps
    /// never take an ASG below its recorded count.
    fn accept_lowered_layout(&mut self) {
        let input = self.input;
        for o in &mut self.status.original_desired {
            let Some(asg) = input.group.asg(&o.auto_scaling_group) else {
                continue;
            };
            if asg.desired < o.desired {
                self.happenings.push(Happening::LayoutLowered {
                    asg: asg.name.clone(),
                    recorded: o.desired,
                    now: asg.desired,
                });
                o.desired = asg.desired;
            }
        }
    }

    /// The surplus still above each described ASG's recorded count (what
    /// was launched ahead counts now), kept in the run's record: an ASG
    /// that leaves the spec before its surplus is removed is no longer
    /// described, and this is then what the run leaves there.
    fn note_surplus_seen(&mut self) {
        let input = self.input;
        let seen: Vec<AsgDesired> = self
            .status
            .original_desired
            .iter()
            .filter_map(|o| {
                let asg = input.group.asg(&o.auto_scaling_group)?;
                Some(AsgDesired {
                    auto_scaling_group: asg.name.clone(),
                    desired: (asg.desired - o.desired).max(0),
                })
            })
            .collect();
        for s in seen {
            let entry = self
                .status
                .surplus
                .iter_mut()
                .find(|e| e.auto_scaling_group == s.auto_scaling_group);
            match entry {
                Some(e) => e.desired = s.desired,
                None if s.desired > 0 => self.status.surplus.push(s),
                None => {}
            }
        }
        self.status.surplus.retain(|e| e.desired > 0);
    }

    /// Compares each ASG with its recorded count.
    fn layout(&self) -> Layout {
        let input = self.input;
        let mut layout = Layout::default();
        for o in &self.status.original_desired {
            let Some(asg) = input.group.asg(&o.auto_scaling_group) else {
                continue;
            };
            let active: Vec<&Member> = input.members.iter().filter(|m| m.asg == asg.name).collect();
            // (Lower than recorded: accepted before, see accept_lowered_layout.)
            if asg.desired > o.desired && ((active.len() as i32) < asg.desired || asg.pending > 0) {
                if asg.launching || asg.pending > 0 {
                    // A launch in flight or Pending: lowering desired now could
                    // make AWS pick a victim. Wait for it; it is then removed
                    // like any surplus, explicitly.
                    layout.waiting.get_or_insert_with(|| asg.name.clone());
                } else {
                    // The launch failed and nothing is Pending: cancel it,
                    // terminating nothing.
                    layout.changes.push(DesiredChange {
                        asg: asg.name.clone(),
                        from: asg.desired,
                        to: (active.len() as i32).max(o.desired),
                    });
                }
            } else if asg.desired > o.desired && layout.victim.is_none() {
                match self.surplus_victim(&asg.name, &active) {
                    Ok(target) => layout.victim = Some(Ok(target)),
                    Err(NoVictim::TooFewReady) => layout.victim = Some(Err(asg.name.clone())),
                    Err(NoVictim::Protected(nodes)) => layout.kept.push((asg.name.clone(), nodes)),
                }
            }
        }
        layout.changes.retain(|c| c.from != c.to);
        layout
    }

    /// Which instance of `asg` goes: one that never joined, else one that is
    /// not Ready, else the newest drifted Ready node, else the newest Ready
    /// node (it carries the fewest pods); for masters, the newest Ready one,
    /// drifted or not (the one beside its place's etcd member). A protected node never goes (this
    /// is a voluntary removal): a pod with no controller that moved onto
    /// the surplus would be lost.
    fn surplus_victim(&self, asg: &str, active: &[&Member]) -> Result<RefreshTarget, NoVictim> {
        let input = self.input;
        let node_of = |id: &str| input.group.node_of(id);
        let target = |m: &Member, node: Option<&GroupNode>| RefreshTarget {
            node: node.map(|n| n.name.clone()),
            instance_id: m.instance_id.clone(),
            auto_scaling_group: asg.to_string(),
            purpose: TargetPurpose::RemoveSurplus,
            reason: Some(Reason::RefreshSurplus.label().into()),
            since: input.group.now,
            terminated: None,
            blocked_by: None,
            unhealthy: node.is_some_and(|n| input.group.unhealthy(n)),
            workloads: vec![],
            launched_ahead: None,
        };
        if let Some(m) = active.iter().find(|m| node_of(&m.instance_id).is_none()) {
            return Ok(target(m, None));
        }
        let mut protected = vec![];
        let mut free = vec![];
        for m in active {
            let Some(n) = node_of(&m.instance_id) else {
                continue;
            };
            match input.rules.protected(Reason::RefreshSurplus).get(&n.name) {
                Some(why) => protected.push(format!("{} ({why})", n.name)),
                None => free.push((*m, n)),
            }
        }
        // A master not Ready too: it is down already, so taking it costs
        // the control plane nothing, and the masters' rule (which binds a
        // run's surplus) refuses it while another master is down.
        if let Some((m, n)) = free.iter().find(|(_, n)| !n.ready) {
            return Ok(target(m, Some(n)));
        }
        if free.is_empty() && !protected.is_empty() {
            return Err(NoVictim::Protected(protected));
        }
        // A drifted one first (launched before a rollback), so what stays
        // is on the template its ASG launches now. Masters: the newest,
        // drifted or not: the older is the place's etcd member (it holds
        // the place's volume), the newer beside it is none
        // (`authority::observe::control_plane_of`), so taking the newer
        // takes no member down.
        if self.ready() - 1 < input.group.desired {
            return Err(NoVictim::TooFewReady);
        }
        let worker = input.group.role == crate::crd::Role::Worker;
        free.iter()
            .max_by_key(|(_, n)| (worker && n.drifted, n.launch_time, &n.name))
            .map(|(m, n)| target(m, Some(n)))
            .ok_or(NoVictim::TooFewReady)
    }

    /// A Ready surplus target the Ready floor holds because another node
    /// of its ASG went down since it was chosen: given back, so the choice
    /// is made again and the one down goes first (it costs no Ready node).
    /// Held instead, the run would wait for a node only a repair brings
    /// back, and the repair waits for the run's lock.
    pub(super) fn surplus_down_first(
        &mut self,
        target: &RefreshTarget,
        label: &str,
    ) -> Option<Decision> {
        let group = &self.input.group;
        let ready = |id: &str| group.node_of(id).is_some_and(|n| n.ready);
        if target.purpose != TargetPurpose::RemoveSurplus || !ready(&target.instance_id) {
            return None;
        }
        let protected = self.input.rules.protected(Reason::RefreshSurplus);
        let down = self
            .input
            .members
            .iter()
            .filter(|m| m.asg == target.auto_scaling_group && m.instance_id != target.instance_id)
            .filter_map(|m| group.node_of(&m.instance_id))
            .find(|n| !n.ready && !protected.contains_key(&n.name))?;
        let message = format!(
            "{} went down: removing it as the surplus of {} instead of {label}",
            down.name, target.auto_scaling_group
        );
        self.status.current_target = None;
        Some(Decision::back_in_service(target.clone(), message))
    }

    fn finish_run(&mut self, settings: &ResolvedRefresh, leftover: Option<String>) -> Decision {
        if self.status.pending_run.is_some() && self.status.failure.is_none() && leftover.is_none()
        {
            return self.end_leg();
        }
        let started = self.status.run_start.unwrap_or(self.input.group.now);
        let reason = match (self.status.failure.clone(), leftover) {
            (Some(f), Some(l)) => Some(format!("{f}; {l}")),
            (f, l) => f.or(l),
        };
        let result = if reason.is_some() {
            RunResult::Failed
        } else {
            RunResult::Succeeded
        };
        let replaced = self.status.replaced;
        let total = self.status.total;
        let took = (self.input.group.now - started)
            .to_std()
            .unwrap_or_default();
        self.happenings.push(Happening::Finished {
            result,
            replaced,
            took,
        });
        self.end_run(started, result, reason.clone(), settings);
        self.status.progress = Some(format!("{replaced}/{total}"));
        let message = match reason {
            Some(r) => format!("run failed after replacing {replaced} of {total}: {r}"),
            None => format!("run succeeded: replaced {replaced} of {total}"),
        };
        Decision::wait(message, SOON)
    }

    /// Records what the ending run leaves above its recorded counts, and
    /// the surplus nodes it kept, for the replenisher to take over (nothing
    /// left: nothing recorded). An ASG that left the spec meanwhile is not
    /// described: what this run raised there by its own record (its
    /// surplus, the replacements it launched ahead) is left instead, so
    /// that, back in the spec, it is taken back there and not elsewhere.
    pub(super) fn leave_surplus(&mut self) {
        let mut asgs: Vec<AsgCount> = self
            .status
            .original_desired
            .iter()
            .filter_map(|o| {
                let asg = &o.auto_scaling_group;
                let above = match self.input.group.asgs.iter().find(|a| &a.name == asg) {
                    Some(now) => now.desired - o.desired,
                    None => surplus_of(&self.status.surplus, asg) + self.owed_ahead_in(asg),
                };
                (above > 0).then(|| AsgCount {
                    auto_scaling_group: asg.clone(),
                    count: above,
                })
            })
            .collect();
        for kept in std::mem::take(&mut self.status.surplus_kept) {
            match asgs
                .iter_mut()
                .find(|a| a.auto_scaling_group == kept.auto_scaling_group)
            {
                Some(a) => a.count += kept.count,
                None => asgs.push(kept),
            }
        }
        if !asgs.is_empty() {
            let at = self.input.group.now;
            self.status.surplus_left = Some(SurplusLeft { at, asgs });
        }
    }
}

fn original_of(original: &[AsgDesired], asg: &str) -> Option<i32> {
    original
        .iter()
        .find(|s| s.auto_scaling_group == asg)
        .map(|s| s.desired)
}
