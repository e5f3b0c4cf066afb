//! The NodeGroup controller. Today it validates each group's spec and reports
//! the outcome in status (the `SpecValid` condition, `observedGeneration`);
//! the node inventory builds on it.

use crate::context::{Context, FIELD_MANAGER};
use crate::controllers::instrumented;
use crate::crd::condition::{ConditionStatus, set_condition};
use crate::crd::{NodeGroup, NodeGroupStatus};
use crate::mutation::Intent;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub const CONTROLLER: &str = "nodegroup";
pub const SPEC_VALID: &str = "SpecValid";

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let api: Api<NodeGroup> = match &ctx.settings.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    info!(controller = CONTROLLER, "controller started");
    Controller::new(api, watcher::Config::default().any_semantic())
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(controller = CONTROLLER, object = %obj, "reconciled"),
                Err(e) => debug!(controller = CONTROLLER, error = %e, "reconcile failed"),
            }
        })
        .await;
    info!(controller = CONTROLLER, "controller stopped");
}

async fn reconcile(group: Arc<NodeGroup>, ctx: Arc<Context>) -> Result<Action> {
    instrumented(&ctx, CONTROLLER, reconcile_inner(group, &ctx)).await
}

fn error_policy(group: Arc<NodeGroup>, error: &Error, _ctx: Arc<Context>) -> Action {
    // Conflicts and throttling are expected contention: retry soon, quietly.
    match error.category() {
        "kube_conflict" | "kube_throttled" | "not_leader" => {
            debug!(group = %group.name_any(), error = %error, "retrying");
            Action::requeue(Duration::from_secs(2))
        }
        _ => {
            warn!(group = %group.name_any(), error = %error, "reconcile failed");
            Action::requeue(Duration::from_secs(15))
        }
    }
}

async fn reconcile_inner(group: Arc<NodeGroup>, ctx: &Context) -> Result<Action> {
    let namespace = group.namespace().ok_or_else(|| {
        Error::InvalidObject(format!("NodeGroup {} has no namespace", group.name_any()))
    })?;
    let name = group.name_any();
    let current = group.status.clone().unwrap_or_default();
    let next = validated_status(&group, &current, ctx.clock.now());
    if next != current {
        let becomes_invalid = is_invalid(&next) && !is_invalid(&current);
        write_status(ctx, &namespace, &name, &next).await?;
        if becomes_invalid
            && let Some(c) = crate::crd::condition::find(&next.conditions, SPEC_VALID)
        {
            ctx.event(
                &group.object_ref(&()),
                EventType::Warning,
                &c.reason,
                "Validate",
                c.message.clone(),
            )
            .await;
        }
    }
    Ok(Action::requeue(ctx.settings.resync_interval))
}

fn is_invalid(status: &NodeGroupStatus) -> bool {
    crate::crd::condition::find(&status.conditions, SPEC_VALID)
        .is_some_and(|c| c.status == ConditionStatus::False)
}

/// Pure: the status after validating the spec. Keeps every other field as is.
pub fn validated_status(
    group: &NodeGroup,
    current: &NodeGroupStatus,
    now: DateTime<Utc>,
) -> NodeGroupStatus {
    let generation = group.metadata.generation;
    let mut next = current.clone();
    let problems = group.spec.validate();
    match problems.first() {
        None => set_condition(
            &mut next.conditions,
            SPEC_VALID,
            ConditionStatus::True,
            "Valid",
            "spec is valid",
            generation,
            now,
        ),
        Some(first) => {
            let message = problems
                .iter()
                .map(|p| format!("spec.{}: {}", p.field, p.message))
                .collect::<Vec<_>>()
                .join("; ");
            set_condition(
                &mut next.conditions,
                SPEC_VALID,
                ConditionStatus::False,
                first.reason,
                message,
                generation,
                now,
            );
        }
    }
    next.observed_generation = generation;
    next.desired_nodes = Some(group.spec.desired);
    next
}

/// Server-side apply of the status with our single field manager. The
/// operation lock is never part of it (its holders write it with a
/// compare-and-swap of their own).
async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &NodeGroupStatus,
) -> Result<()> {
    let api: Api<NodeGroup> = Api::namespaced(ctx.client.clone(), namespace);
    let mut status = status.clone();
    status.operation = None;
    let patch = serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1",
        "kind": "NodeGroup",
        "status": status,
    });
    ctx.mutations
        .perform(
            Intent::own_status("patch_status", format!("nodegroup/{namespace}/{name}")),
            || async {
                api.patch_status(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
                .map_err(Error::kube(format!(
                    "patch status of NodeGroup {namespace}/{name}"
                )))
            },
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::NodeGroupSpec;
    use chrono::TimeZone;

    fn group(spec: serde_json::Value, generation: i64) -> NodeGroup {
        let spec: NodeGroupSpec = serde_json::from_value(spec).expect("spec");
        let mut g = NodeGroup::new("workers", spec);
        g.metadata.namespace = Some("ns".into());
        g.metadata.generation = Some(generation);
        g
    }

    #[test]
    fn invalid_schedule_gives_a_false_condition_naming_the_field() {
        let now = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let g = group(
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "a"}], "desired": 3,
                               "refresh": {"schedule": "whenever", "timeZone": "Nowhere/City"}}),
            4,
        );
        let status = validated_status(&g, &NodeGroupStatus::default(), now);
        let c = crate::crd::condition::find(&status.conditions, SPEC_VALID).expect("condition");
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason, "InvalidSchedule");
        assert!(c.message.contains("spec.refresh.schedule"), "{}", c.message);
        assert!(c.message.contains("spec.refresh.timeZone"), "{}", c.message);
        assert_eq!(status.observed_generation, Some(4));
    }

    #[test]
    fn a_valid_spec_is_stable_so_nothing_is_rewritten() {
        let t0 = Utc.with_ymd_and_hms(2026, 11, 22, 0, 0, 0).unwrap();
        let g = group(
            serde_json::json!({"role": "Worker", "autoScalingGroups": [{"name": "a"}], "desired": 3}),
            1,
        );
        let first = validated_status(&g, &NodeGroupStatus::default(), t0);
        let second = validated_status(&g, &first, t0 + chrono::Duration::minutes(1));
        assert_eq!(
            first, second,
            "an unchanged group must produce an identical status"
        );
    }
}
