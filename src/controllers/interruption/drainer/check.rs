//! The drainer's guard: what the executor asks before each of its effects,
//! on the Node read afresh this reconcile. A drain step (a cordon, an
//! eviction) is made only on a node that carries a loss of ours whose
//! drain is under way and not ended; the drain's termination (completing
//! the lifecycle action that holds the instance) only once its end is
//! recorded, and only for the node's own instance. Then the rule book is
//! asked for the interruption's drain, as for every other reason: the
//! table frees it of every rule (AWS takes the node anyway), and what the
//! drainer does not look at (windows, protection, slots, the floor, the
//! breaker, a stopped group, the control plane) is assumed against it, so
//! a rule the table ever binds to it refuses rather than passes unseen.

use super::plan::{Interrupted, Mark, may_call_hook};
use crate::controllers::authority::rules::Reason;
use crate::controllers::authority::validate::{
    Disruption, Floor, Refused, Scene, Window, validate,
};
use crate::controllers::command::Effect;
use crate::controllers::guard::Refusal;
use crate::crd::Role;
use crate::k8s::disruption_slot::SlotState;
use crate::k8s::interruption_record::{is_ours, record_of};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// What a check is made on: the Node read afresh, and who we are.
pub struct Fresh<'a> {
    pub node: &'a Node,
    /// The namespace this manager manages (None: every one).
    pub namespace: Option<&'a str>,
    pub now: DateTime<Utc>,
}

/// Says "not looked at" for what the drainer does not observe.
const UNSEEN: &str = "not looked at by the interruption drainer";

impl Fresh<'_> {
    /// The guard's answer for `effect`, recorded by `status`.
    pub fn check(&self, status: &Mark, effect: Effect<'_, Interrupted>) -> Result<(), Refusal> {
        let target = match effect {
            Effect::Drain { target, .. } => {
                self.marked(status, target)?;
                self.not_ended()?;
                target
            }
            Effect::Terminate(target) => {
                self.marked(status, target)?;
                if status.record.drained.is_none() {
                    return Err(Refusal::TerminationNotRecorded {
                        instance: target.instance_id.clone(),
                    });
                }
                if status.record.lifecycle.is_some() && !may_call_hook(self.node, &status.record) {
                    return Err(self.not_leaving(format!(
                        "its lifecycle action is recorded for {}, not its own instance",
                        status.record.instance_id
                    )));
                }
                target
            }
            other => {
                return Err(Refusal::NotThisPath {
                    what: format!("{other:?}"),
                });
            }
        };
        rule_book(self.node, target).map_err(Refusal::Rule)
    }

    fn not_leaving(&self, why: String) -> Refusal {
        Refusal::NotLeaving {
            node: self.node.name_any(),
            why,
        }
    }

    /// The node carries, read afresh, the status's loss, ours, its drain
    /// begun.
    fn marked(&self, status: &Mark, target: &Interrupted) -> Result<(), Refusal> {
        let name = self.node.name_any();
        if target != &status.on || target.node != name {
            return Err(self.not_leaving(format!(
                "the drain recorded is of {} on {}",
                status.on.instance_id, status.on.node
            )));
        }
        let Some(fresh) = record_of(self.node) else {
            return Err(self.not_leaving("it carries no interruption mark".into()));
        };
        if fresh.instance_id != target.instance_id {
            return Err(self.not_leaving(format!(
                "its mark names {}, not {}",
                fresh.instance_id, target.instance_id
            )));
        }
        if !is_ours(&fresh, self.namespace) {
            return Err(self.not_leaving("marked by a manager of another namespace".into()));
        }
        if !fresh.is_loss() {
            return Err(self.not_leaving(
                "a rebalance recommendation, not a loss: the replenisher removes it".into(),
            ));
        }
        if !fresh.leaving(self.now) {
            let from = fresh.drain_from.map(|f| f.to_rfc3339()).unwrap_or_default();
            return Err(self.not_leaving(format!("its drain begins at {from}")));
        }
        Ok(())
    }

    /// The drain is not recorded as ended on the Node (a stale view would
    /// otherwise drain and report it twice).
    fn not_ended(&self) -> Result<(), Refusal> {
        match record_of(self.node).and_then(|r| r.drained) {
            Some(at) => Err(self.not_leaving(format!("its drain ended at {}", at.to_rfc3339()))),
            None => Ok(()),
        }
    }
}

/// The rule book for an interruption's drain of `target` on `node`, on a
/// scene where what the drainer does not observe is assumed against it.
fn rule_book(node: &Node, target: &Interrupted) -> Result<(), Refused> {
    let (disruption, protected, slot) = unseen(target);
    let scene = scene(node, &protected, &slot);
    validate(&disruption, &scene)
}

/// The rule book's answer for an interruption's first effect on `node`:
/// the receiver's mark, whose cordon and taint go on in the one patch that
/// records the loss (AWS's two minutes are not spent on a second round
/// trip). Asked on the Node read for that patch, as the drainer's check is
/// before each of its own effects, so the table decides there too.
pub fn may_mark(node: &Node, instance_id: &str) -> Result<(), Refused> {
    let target = Interrupted {
        instance_id: instance_id.into(),
        node: node.name_any(),
    };
    rule_book(node, &target)
}

fn unseen(target: &Interrupted) -> (Disruption<'_>, BTreeMap<String, String>, SlotState) {
    let protected = BTreeMap::from([(target.node.clone(), UNSEEN.to_string())]);
    let disruption = Disruption {
        reason: Reason::InterruptionDrain,
        instance: &target.instance_id,
        node: Some(&target.node),
        in_hand: false,
        dead: false,
        floor: Some(Floor::of(0, 1)),
    };
    (disruption, protected, SlotState::Full(UNSEEN.into()))
}

fn scene<'s>(
    node: &Node,
    protected: &'s BTreeMap<String, String>,
    slot: &'s SlotState,
) -> Scene<'s> {
    let master = crate::k8s::node::role_matches(Role::Master, node.labels());
    Scene {
        role: if master { Role::Master } else { Role::Worker },
        control_plane: None,
        window: Window::Closed { opens: None },
        protected,
        slot,
        breaker: Some(UNSEEN),
        stopped: Some(UNSEEN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::authority::rules::Rule;
    use crate::controllers::authority::validate;
    use crate::controllers::command::Batch;
    use crate::crd::labels::{CONTROL_PLANE_LABEL, INTERRUPTION_ANNOTATION};
    use crate::k8s::interruption_record::Record;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, record: Option<&Record>, instance: &str) -> Node {
        let annotations = record.map(|r| {
            BTreeMap::from([(
                INTERRUPTION_ANNOTATION.to_string(),
                serde_json::to_string(r).expect("a record serialises"),
            )])
        });
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations,
                labels: Some(BTreeMap::from([(
                    CONTROL_PLANE_LABEL.to_string(),
                    String::new(),
                )])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///ap-northeast-1a/{instance}")),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn drain(mark: &Mark) -> Effect<'_, Interrupted> {
        Effect::Drain {
            target: &mark.on,
            begins: true,
        }
    }

    #[test]
    fn a_drain_step_is_made_only_on_a_node_marked_with_our_loss_whose_drain_is_under_way() {
        let (r, now) = super::super::plan::tests::record(80, false);
        let mark = Mark::of("node-1", r.clone());
        fn fresh(n: &Node, now: DateTime<Utc>) -> Fresh<'_> {
            Fresh {
                node: n,
                namespace: None,
                now,
            }
        }
        // A master's: the table frees an interruption's drain of the
        // masters' rule too (AWS takes it anyway).
        let marked = node("node-1", Some(&r), "i-1");
        assert_eq!(fresh(&marked, now).check(&mark, drain(&mark)), Ok(()));

        let refused = |n: &Node, mark: &Mark| match fresh(n, now).check(mark, drain(mark)) {
            Err(Refusal::NotLeaving { why, .. }) => why,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(refused(&node("node-1", None, "i-1"), &mark).contains("no interruption mark"));
        let other = Record {
            instance_id: "i-2".into(),
            ..r.clone()
        };
        assert!(refused(&node("node-1", Some(&other), "i-1"), &mark).contains("names i-2"));
        let elsewhere = Record {
            scope: Some("team-b".into()),
            ..r.clone()
        };
        assert!(
            refused(&node("node-1", Some(&elsewhere), "i-1"), &mark).contains("another namespace")
        );
        let at_risk = Record {
            kind: crate::k8s::interruption_record::AT_RISK.into(),
            ..r.clone()
        };
        assert!(refused(&node("node-1", Some(&at_risk), "i-1"), &mark).contains("rebalance"));
        let later = Record {
            drain_from: Some(now + chrono::Duration::hours(3)),
            ..r.clone()
        };
        assert!(refused(&node("node-1", Some(&later), "i-1"), &mark).contains("begins at"));
        // The Node read afresh records the drain's end: a stale view's
        // decision is refused, not drained and reported twice.
        let ended = Record {
            drained: Some(now),
            ..r.clone()
        };
        assert!(refused(&node("node-1", Some(&ended), "i-1"), &mark).contains("ended at"));
        // Another node than the one recorded.
        assert!(refused(&node("node-2", Some(&r), "i-1"), &mark).contains("recorded is of i-1"));
        assert!(matches!(
            fresh(&marked, now).check(&mark, Effect::SetDesired(&[])),
            Err(Refusal::NotThisPath { .. })
        ));
        assert!(matches!(
            fresh(&marked, now).check(
                &mark,
                Effect::GiveBack {
                    target: &mark.on,
                    reason: "x"
                }
            ),
            Err(Refusal::NotThisPath { .. })
        ));
        let _ = Batch::of(mark.on.clone());
    }

    #[test]
    fn a_lifecycle_action_is_completed_only_once_the_drains_end_is_recorded_and_for_its_own_instance()
     {
        let (mut r, now) = super::super::plan::tests::record(80, false);
        r.lifecycle = Some(super::super::plan::tests::action());
        let n = node("node-1", Some(&r), "i-1");
        let fresh = Fresh {
            node: &n,
            namespace: None,
            now,
        };
        let mark = Mark::of("node-1", r.clone());
        assert_eq!(
            fresh.check(&mark, Effect::Terminate(&mark.on)),
            Err(Refusal::TerminationNotRecorded {
                instance: "i-1".into()
            })
        );
        let mut ended = mark.clone();
        ended.record.drained = Some(now);
        assert_eq!(fresh.check(&ended, Effect::Terminate(&ended.on)), Ok(()));
        // The Node's providerID names another instance than the action's.
        let moved = node("node-1", Some(&r), "i-9");
        let fresh = Fresh {
            node: &moved,
            namespace: None,
            now,
        };
        assert!(matches!(
            fresh.check(&ended, Effect::Terminate(&ended.on)),
            Err(Refusal::NotLeaving { .. })
        ));
    }

    /// The drainer's scene assumes against it what it does not look at: so
    /// were the table to bind any rule to an interruption's drain, the
    /// drainer would be refused, never let through unseen. Each rule is
    /// asked alone here (`validate` asks only what the table binds), of a
    /// worker's node and a master's.
    #[test]
    fn what_the_drainer_does_not_look_at_refuses_every_rule_the_table_might_bind() {
        let (r, now) = super::super::plan::tests::record(80, false);
        for role in [Role::Worker, Role::Master] {
            let mut n = node("node-1", Some(&r), "i-1");
            if role == Role::Worker {
                n.metadata.labels = Some(BTreeMap::from([(
                    crate::crd::labels::WORKER_LABEL.to_string(),
                    String::new(),
                )]));
            }
            let fresh = Fresh {
                node: &n,
                namespace: None,
                now,
            };
            let target = Mark::of("node-1", r.clone()).on;
            let (disruption, protected, slot) = unseen(&target);
            let scene = scene(fresh.node, &protected, &slot);
            assert_eq!(scene.role, role);
            for rule in Rule::ALL {
                let refused = match rule {
                    // A master group's breaker is the masters' rule.
                    Rule::Breaker if role == Role::Master => continue,
                    // The masters' rule asks the table itself (and binds
                    // masters only): a reason it binds, retirement, on the
                    // drainer's unobserved control plane.
                    Rule::Masters if role == Role::Worker => continue,
                    Rule::Masters => validate::check_one(
                        rule,
                        &Disruption {
                            reason: Reason::Retirement,
                            ..disruption
                        },
                        &scene,
                    ),
                    _ => validate::check_one(rule, &disruption, &scene),
                };
                assert!(refused.is_err(), "{rule:?} would pass unseen ({role:?})");
            }
            assert_eq!(
                validate::validate(&disruption, &scene),
                Ok(()),
                "the table frees an interruption's drain of every rule"
            );
            // The receiver's mark, whose cordon is the drain's first
            // effect, is asked on the same scene.
            assert_eq!(may_mark(&n, "i-1"), Ok(()));
        }
    }
}
