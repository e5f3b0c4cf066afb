//! The interruption path in the walk: the receiver marks a node as it
//! would (`interruption_record::mark_patch`: a loss's cordon and taint at
//! once, or at its drain start; a recommendation recorded only), and the
//! drainer of every marked node reconciles every tick through the one
//! executor with its real guard (`drainer::check`), on the Node as the
//! walk's instance shows it. Checked at each of its effects: the guard
//! was asked first, the mark recording it was stored first, a drain step
//! only on a node whose loss's drain has begun and not ended, its end
//! only once recorded. Across paths: the replenisher's retirements and the
//! runs' drains meet marked nodes the drainer drains at once (a node
//! another path gave back while marked would be cordoned again, counted
//! apart; no walked world has had one).

use super::{World, instance_of, node_name};
use crate::controllers::command::Effect;
use crate::controllers::execute::{self as executor, Drained, Effects, Planned};
use crate::controllers::group_view::tests::block_on;
use crate::controllers::guard::Refusal;
use crate::controllers::interruption::drainer::check::{Fresh, may_mark};
use crate::controllers::interruption::drainer::plan::{
    Decision, Interrupted, Mark, decide, may_call_hook, step,
};
use crate::crd::labels::{
    CONTROL_PLANE_LABEL, EXCLUDE_FROM_LOAD_BALANCERS, INTERRUPTED_LABEL, INTERRUPTED_TAINT,
    INTERRUPTION_ANNOTATION,
};
use crate::k8s::interruption_record::{Record, mark_patch, record_of};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::time::Duration;

/// Eviction steps a drained node takes (its pods gone after the second).
const EVICTION_STEPS: u32 = 2;

impl World {
    /// `id`'s node marked for `record` (the receiver's at receipt, the
    /// drainer's cordon at its drain start): whether anything changed.
    pub(super) fn mark(&mut self, id: &str, record: &Record) -> bool {
        let Some(node) = self.node_of(id) else {
            return false;
        };
        let Some(patch) = mark_patch(&node, record, self.now) else {
            return false;
        };
        let written = patch["metadata"]["annotations"][INTERRUPTION_ANNOTATION]
            .as_str()
            .and_then(|a| serde_json::from_str::<Record>(a).ok());
        if patch.get("spec").is_some() {
            // A cordon asks the rule book first, the receiver's as the
            // drainer's (the table frees an interruption of every rule).
            let asked = may_mark(&node, id);
            assert_eq!(asked, Ok(()), "{id}: a mark's cordon the rule book refuses");
        }
        let Some(i) = self.instances.iter_mut().find(|i| i.id == id) else {
            return false;
        };
        i.mark = written;
        if patch.get("spec").is_some() {
            i.cordoned = true;
            i.tainted = true;
        }
        true
    }

    /// `id`'s Node as the drainer reads it: its mark, its cordon and the
    /// mark's taint and labels, its providerID. None once it is gone.
    fn node_of(&self, id: &str) -> Option<Node> {
        let i = self.instances.iter().find(|i| i.id == id)?;
        let mut labels = BTreeMap::new();
        if self.is_master(i) {
            labels.insert(CONTROL_PLANE_LABEL.to_string(), String::new());
        }
        let mut annotations = BTreeMap::new();
        if let Some(mark) = &i.mark {
            if mark.is_loss() {
                labels.insert(INTERRUPTED_LABEL.to_string(), mark.kind.clone());
            }
            let json = serde_json::to_string(mark).unwrap_or_default();
            annotations.insert(INTERRUPTION_ANNOTATION.to_string(), json);
        }
        let taints = match (&i.mark, i.tainted) {
            (Some(mark), true) => {
                labels.insert(EXCLUDE_FROM_LOAD_BALANCERS.to_string(), "true".into());
                vec![Taint {
                    key: INTERRUPTED_TAINT.into(),
                    value: Some(mark.kind.clone()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                }]
            }
            _ => vec![],
        };
        Some(Node {
            metadata: ObjectMeta {
                name: Some(node_name(&i.id)),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///ap-northeast-1a/{}", i.id)),
                unschedulable: Some(i.cordoned),
                taints: Some(taints),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// The drainer of every node marked with a loss, as its reconcile
    /// does: decided on the Node read afresh, carried out by the executor.
    pub(super) fn reconcile_drainers(&mut self) {
        let marked: Vec<String> = self
            .instances
            .iter()
            .filter(|i| i.mark.as_ref().is_some_and(Record::is_loss))
            .map(|i| i.id.clone())
            .collect();
        for id in marked {
            let Some(node) = self.node_of(&id) else {
                continue;
            };
            let Some(record) = record_of(&node) else {
                continue;
            };
            let now = self.now;
            let cordoned = mark_patch(&node, &record, now).is_none();
            let decision = decide(&record, cordoned, may_call_hook(&node, &record), now);
            let left = match decision {
                Decision::Deadline => self.pods_left(&id),
                _ => 0,
            };
            let stored = Mark::of(&node_name(&id), record);
            let Some(step) = step(&stored, &decision, left, now) else {
                continue;
            };
            self.last = format!("drainer of {id} {:?}: {}", step.command, step.message);
            self.guarded.borrow_mut().clear();
            let planned = Planned::of(&step.command, step.status, &step.message, step.requeue);
            let result = block_on(executor::execute(
                &mut AsDrainer(self, id.clone()),
                Some(&stored),
                planned,
                now,
            ));
            self.judge(result.err(), &format!("{:?}", step.command));
        }
    }

    fn pods_left(&self, id: &str) -> usize {
        let steps = self
            .instances
            .iter()
            .find(|i| i.id == id)
            .map_or(EVICTION_STEPS, |i| i.drain_steps);
        usize::from(steps < EVICTION_STEPS)
    }

    /// The mark as stored on `id`'s node.
    fn stored_mark(&self, id: &str) -> Option<&Record> {
        self.instances.iter().find(|i| i.id == id)?.mark.as_ref()
    }
}

/// The world as the interruption drainer's effects, for one marked node.
pub(super) struct AsDrainer<'a>(pub(super) &'a mut World, pub(super) String);

impl AsDrainer<'_> {
    fn assert_stored(&self, status: &Mark, what: &str) {
        assert_eq!(
            self.0.stored_mark(&self.1),
            Some(&status.record),
            "{what} of {} before the mark recording it was stored",
            self.1
        );
    }
}

impl Effects for AsDrainer<'_> {
    type Record = Mark;

    fn guard(&self, status: &Mark, effect: Effect<'_, Interrupted>) -> Result<(), Refusal> {
        let node = self.0.node_of(&self.1).ok_or_else(|| Refusal::NotLeaving {
            node: node_name(&self.1),
            why: "gone".into(),
        })?;
        if let Effect::Drain { target: t, .. } | Effect::Terminate(t) = effect {
            self.0.guarded.borrow_mut().insert(t.instance_id.clone());
        }
        Fresh {
            node: &node,
            namespace: None,
            now: self.0.now,
        }
        .check(status, effect)
    }

    async fn write_status(&mut self, status: &Mark) -> crate::Result<()> {
        let id = &status.on.instance_id;
        if let Some(i) = self.0.instances.iter_mut().find(|i| i.id == *id) {
            i.mark = Some(status.record.clone());
        }
        Ok(())
    }

    fn reached(&mut self, point: &str) -> crate::Result<()> {
        self.0.reached(point, point.ends_with(":persisted"))
    }

    async fn drain_step(
        &mut self,
        target: &Interrupted,
        status: &Mark,
        _: bool,
        _: &str,
    ) -> crate::Result<Drained> {
        let now = self.0.now;
        self.0.assert_guarded(&target.instance_id);
        self.assert_stored(status, "a drain step");
        let record = &status.record;
        assert!(
            record.leaving(now) && record.drained.is_none(),
            "the drainer drains {} whose drain has not begun or has ended: {record:?}",
            target.node
        );
        // Tainted and not cordoned: another path gave the node back.
        let given_back = (self.0.instances.iter())
            .any(|i| i.id == target.instance_id && i.tainted && !i.cordoned);
        let done = match self.0.mark(&target.instance_id, record) {
            // Its cordon first (deferred to the drain start, or lost to
            // another path's give-back).
            true => {
                self.0.see(match given_back {
                    true => "interruption cordon after a give-back",
                    false => "interruption cordon",
                });
                false
            }
            false => {
                let steps = self.0.cordon_step(&target.node);
                self.0.see("interruption eviction step");
                steps >= EVICTION_STEPS
            }
        };
        Ok(Drained {
            done,
            requeue: Duration::from_millis(500),
            blocked_by: None,
        })
    }

    async fn terminate(
        &mut self,
        removal: Effect<'_, Interrupted>,
        status: &Mark,
    ) -> crate::Result<bool> {
        let Effect::Terminate(target) = removal else {
            return executor::not_this_path(&format!("{removal:?}"));
        };
        self.0.assert_guarded(&target.instance_id);
        self.assert_stored(status, "the drain's end");
        assert!(
            status.record.drained.is_some(),
            "the drain of {} ended without its end recorded",
            target.node
        );
        assert_eq!(instance_of(&target.node), target.instance_id);
        self.0.see("interruption drain ended");
        // No lifecycle action holds it in the walk: AWS takes it at its
        // loss, nothing to complete.
        Ok(false)
    }
}
