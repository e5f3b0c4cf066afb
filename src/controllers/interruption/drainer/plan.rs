//! What the drainer does next for a marked Node, pure: a decision on the
//! mark read afresh, and the command the one executor carries out for it
//! (`controllers::execute`). The mark on the Node is the drainer's status:
//! the executor writes it before each effect, and its guard
//! (`super::check`) asks it, and the rule book, before each.

use crate::controllers::authority::rules::Reason;
use crate::controllers::command::{Batch, Command, Effect};
use crate::controllers::execute::{self, Target};
use crate::k8s::interruption_record::Record;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use std::time::Duration;

/// What a drain step decides, pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Drained or reported already, its lifecycle action (if any)
    /// completed: nothing more.
    Done,
    /// A scheduled change days away: the node serves on until then, when
    /// it is cordoned and drained.
    NotYet { from: DateTime<Utc> },
    /// From its drain start: the cordon and taint deferred until now go
    /// on first.
    Cordon,
    /// Evict, with grace periods capped at this many seconds.
    Evict { max_grace: i64 },
    /// The deadline passed: report what is left, record it.
    Deadline,
    /// The drain ended: complete the terminate lifecycle action holding
    /// the instance (CONTINUE), so its ASG goes on.
    Complete,
}

/// `cordoned`: the node carries the mark's cordon and taint; `hook_ours`:
/// the lifecycle action recorded is the node's own instance's
/// ([`may_call_hook`]).
pub fn decide(record: &Record, cordoned: bool, hook_ours: bool, now: DateTime<Utc>) -> Decision {
    if record.drained.is_some() {
        let pending = record
            .lifecycle
            .as_ref()
            .is_some_and(|a| a.completed.is_none());
        return match pending && hook_ours {
            true => Decision::Complete,
            false => Decision::Done,
        };
    }
    if let Some(from) = record.drain_from.filter(|from| now < *from) {
        return Decision::NotYet { from };
    }
    if !cordoned {
        return Decision::Cordon;
    }
    if now >= record.deadline {
        return Decision::Deadline;
    }
    // Under a second left still evicts, with the shortest grace there is
    // short of a forced deletion.
    let left = (record.deadline - now).num_seconds();
    Decision::Evict {
        max_grace: left.max(1),
    }
}

/// Pure: the node is the one the lifecycle action holds (its providerID
/// names the record's instance). Completing an action lets its ASG
/// terminate the instance, so it is only ever done for the node we drained.
pub fn may_call_hook(node: &Node, record: &Record) -> bool {
    let provider = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    record.lifecycle.is_some()
        && !record.instance_id.is_empty()
        && provider.is_some_and(|p| p.rsplit('/').next() == Some(record.instance_id.as_str()))
}

/// The interrupted node, as the executor knows what a path takes away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interrupted {
    pub instance_id: String,
    pub node: String,
}

impl Target for Interrupted {
    fn instance_id(&self) -> &str {
        &self.instance_id
    }

    fn node(&self) -> Option<&str> {
        Some(&self.node)
    }

    /// The path's one reason: AWS takes the node.
    fn reason(&self) -> Option<Reason> {
        Some(Reason::InterruptionDrain)
    }
}

/// The mark on a Node as the drainer's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub on: Interrupted,
    pub record: Record,
}

impl Mark {
    pub fn of(node: &str, record: Record) -> Mark {
        Mark {
            on: Interrupted {
                instance_id: record.instance_id.clone(),
                node: node.to_string(),
            },
            record,
        }
    }
}

/// The drain's end is the instance's recorded termination: AWS takes it,
/// sooner when a terminate lifecycle action holding it is completed, which
/// is what the executor's termination makes here (nothing when none holds
/// it).
impl execute::Record for Mark {
    type Target = Interrupted;
    const PATH: &'static str = super::CONTROLLER;

    fn draining(&self, instance: &str) -> Option<&Interrupted> {
        (self.on.instance_id == instance && self.record.drained.is_none()).then_some(&self.on)
    }

    fn drained(&mut self, instance: &str, now: DateTime<Utc>) -> Option<Interrupted> {
        self.draining(instance)?;
        self.record.drained = Some(now);
        self.record.pods_left = Some(0);
        Some(self.on.clone())
    }

    fn made(&mut self, effect: Effect<'_, Interrupted>, now: DateTime<Utc>) {
        if let Effect::Terminate(_) = effect
            && let Some(action) = self.record.lifecycle.as_mut()
        {
            action.completed.get_or_insert(now);
        }
    }
}

/// What the executor carries out for a decision that acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub command: Command<Interrupted>,
    pub status: Mark,
    pub message: String,
    pub requeue: Duration,
}

/// The step for `decision` on `mark`; None for a decision that does
/// nothing (Done, NotYet). `pods_left`: what the deadline found still on
/// the node (counted by the caller, for `Deadline` only).
pub fn step(
    mark: &Mark,
    decision: &Decision,
    pods_left: usize,
    now: DateTime<Utc>,
) -> Option<Step> {
    let r = &mark.record;
    let what = format!("{} of {}", r.kind, r.instance_id);
    // Soon: the deadline is seconds away.
    let soon = Duration::from_millis(500);
    let (command, status, message) = match decision {
        Decision::Done | Decision::NotYet { .. } => return None,
        Decision::Cordon | Decision::Evict { .. } => (
            Command::Drain(Batch::of(mark.on.clone())),
            mark.clone(),
            format!("{what}: drained by {}", r.deadline.to_rfc3339()),
        ),
        Decision::Deadline => {
            let mut ended = mark.clone();
            ended.record.drained = Some(now);
            ended.record.pods_left = Some(pods_left as i32);
            let message = format!("{what}: its drain deadline passed");
            (Command::Terminate(mark.on.clone()), ended, message)
        }
        Decision::Complete => (
            Command::Terminate(mark.on.clone()),
            mark.clone(),
            format!("{what}: drained"),
        ),
    };
    Some(Step {
        command,
        status,
        message,
        requeue: soon,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::controllers::execute::Record as _;
    use crate::k8s::interruption_record::HookAction;
    use chrono::TimeZone;

    pub(crate) fn record(deadline_in: i64, drained: bool) -> (Record, DateTime<Utc>) {
        let now = Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap();
        (
            Record {
                kind: "spot_interruption".into(),
                instance_id: "i-1".into(),
                noticed: now - chrono::Duration::seconds(10),
                deadline: now + chrono::Duration::seconds(deadline_in),
                drained: drained.then_some(now),
                pods_left: None,
                loss_at: None,
                drain_from: None,
                late: None,
                lifecycle: None,
                scope: None,
                group: None,
            },
            now,
        )
    }

    pub(crate) fn action() -> HookAction {
        HookAction {
            auto_scaling_group: "asg-a".into(),
            hook: "h".into(),
            token: "t".into(),
            region: None,
            heartbeat: None,
            completed: None,
        }
    }

    #[test]
    fn grace_periods_are_capped_by_the_time_left_and_the_deadline_ends_the_drain() {
        let (r, now) = record(80, false);
        assert_eq!(
            decide(&r, true, true, now),
            Decision::Evict { max_grace: 80 }
        );
        let (r, now) = record(0, false);
        assert_eq!(decide(&r, true, true, now), Decision::Deadline);
        let (r, now) = record(1, false);
        let early = now + chrono::Duration::milliseconds(400);
        assert_eq!(
            decide(&r, true, true, early),
            Decision::Evict { max_grace: 1 },
            "not ended before its deadline"
        );
        let (r, now) = record(-5, false);
        assert_eq!(decide(&r, true, true, now), Decision::Deadline);
        let (r, now) = record(80, true);
        assert_eq!(
            decide(&r, true, true, now),
            Decision::Done,
            "recorded: never twice"
        );
    }

    #[test]
    fn a_scheduled_change_is_cordoned_at_its_drain_start_and_drained_after() {
        let (r, now) = record(2 * 24 * 3600, false);
        let from = now + chrono::Duration::hours(47);
        let r = Record {
            kind: "scheduled_change".into(),
            drain_from: Some(from),
            ..r
        };
        assert_eq!(decide(&r, false, true, now), Decision::NotYet { from });
        assert_eq!(decide(&r, false, true, from), Decision::Cordon);
        assert_eq!(
            decide(&r, true, true, from),
            Decision::Evict { max_grace: 3600 }
        );
        // A spot warning's mark lost its cordon: put back before evicting.
        let (spot, now) = record(80, false);
        assert_eq!(decide(&spot, false, true, now), Decision::Cordon);
    }

    #[test]
    fn a_drain_ended_completes_its_own_instances_lifecycle_action_once() {
        let (mut r, now) = record(80, true);
        r.lifecycle = Some(action());
        assert_eq!(decide(&r, true, true, now), Decision::Complete);
        assert_eq!(
            decide(&r, true, false, now),
            Decision::Done,
            "an action recorded for another instance than the node's is never completed"
        );
        if let Some(a) = r.lifecycle.as_mut() {
            a.completed = Some(now);
        }
        assert_eq!(decide(&r, true, true, now), Decision::Done, "once");
    }

    #[test]
    fn a_drain_ends_as_the_recorded_termination_written_before_its_action_is_completed() {
        let (mut r, now) = record(80, false);
        r.lifecycle = Some(action());
        let mark = Mark::of("node-1", r);
        // Evictions finished: the executor records the end (the drain's
        // termination), which the status written before the completion
        // carries, then completes the action and records that.
        let mut after = mark.clone();
        let target = after.drained("i-1", now);
        assert_eq!(target.as_ref(), Some(&mark.on));
        assert_eq!(after.record.drained, Some(now));
        assert_eq!(after.record.pods_left, Some(0));
        assert!(
            after
                .record
                .lifecycle
                .as_ref()
                .is_some_and(|a| a.completed.is_none()),
            "completed only once made"
        );
        assert_eq!(after.drained("i-1", now), None, "ended once");
        assert_eq!(after.clone().drained("i-2", now), None, "another instance");
        after.made(Effect::Terminate(&mark.on), now);
        assert_eq!(after.record.lifecycle.and_then(|a| a.completed), Some(now));

        // The deadline records what is left; the completion follows.
        let later = now + chrono::Duration::seconds(90);
        let s = step(&mark, &Decision::Deadline, 3, later).expect("acts");
        assert_eq!(s.command, Command::Terminate(mark.on.clone()));
        assert_eq!(s.status.record.drained, Some(later));
        assert_eq!(s.status.record.pods_left, Some(3));
        let s = step(&mark, &Decision::Evict { max_grace: 9 }, 0, now).expect("acts");
        assert_eq!(s.command, Command::Drain(Batch::of(mark.on.clone())));
        assert_eq!(s.status, mark, "a drain step records nothing before it");
        assert_eq!(step(&mark, &Decision::Done, 0, now), None);
    }

    #[test]
    fn a_hook_is_called_only_for_the_node_on_the_actions_instance() {
        let (mut r, _) = record(80, false);
        let node = |provider: Option<&str>| Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                provider_id: provider.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ours = node(Some("aws:///ap-northeast-1a/i-1"));
        assert!(!may_call_hook(&ours, &r), "no action recorded");
        r.lifecycle = Some(action());
        assert!(may_call_hook(&ours, &r));
        assert!(!may_call_hook(
            &node(Some("aws:///ap-northeast-1a/i-11")),
            &r
        ));
        assert!(!may_call_hook(&node(None), &r));
        r.instance_id = String::new();
        assert!(!may_call_hook(&node(Some("aws:///ap-northeast-1a/")), &r));
    }
}
