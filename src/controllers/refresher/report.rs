//! What a refresher run did, told as Events on the group and as metrics.

use crate::context::Context;
use crate::controllers::refresher::plan::Happening;
use crate::crd::refresher::{RunResult, RunTrigger};
use crate::events::Reason;
use crate::metrics::RunLabels;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use std::time::Duration;
use tracing::info;

const EVENT_ACTION: &str = "Refresh";

/// Events and metrics for what the plan did.
pub(super) async fn report(ctx: &Context, group: &ObjectReference, happenings: &[Happening]) {
    for h in happenings {
        let (type_, reason, note) = match h {
            Happening::Started {
                total,
                surplus,
                trigger,
            } => {
                ctx.metrics.refresh_runs_started.inc();
                let what = match trigger {
                    RunTrigger::Schedule => "scheduled refresh",
                    RunTrigger::Drift => "drift roll",
                };
                (
                    EventType::Normal,
                    Reason::RefreshStarted,
                    format!("{what}: replacing {total} node(s), {surplus} surplus"),
                )
            }
            Happening::DriftChanged { joined, left } => (
                EventType::Normal,
                Reason::DriftRollChanged,
                drift_changed(joined, left),
            ),
            Happening::Skipped(why) => {
                ctx.metrics.refresh_run(RunResult::Skipped);
                (EventType::Normal, Reason::RefreshSkipped, why.clone())
            }
            Happening::SetAside {
                remaining,
                opens,
                why,
            } => set_aside(*remaining, *opens, why.as_deref()),
            Happening::Resumed { remaining } => (
                EventType::Normal,
                Reason::RefreshResumed,
                format!("a maintenance window opened: resuming the run, {remaining} node(s) left"),
            ),
            Happening::NodesSkipped(nodes) => (
                EventType::Warning,
                Reason::NodesSkipped,
                nodes_skipped(nodes),
            ),
            Happening::Planned(what) => {
                ctx.metrics.refresh_run(RunResult::Skipped);
                (EventType::Normal, Reason::RefreshPlanned, what.clone())
            }
            Happening::Replaced { node, took } => {
                ctx.metrics
                    .node_replacement_duration
                    .observe(took.as_secs_f64());
                (
                    EventType::Normal,
                    Reason::NodeReplaced,
                    format!(
                        "{node} replaced in {}",
                        crate::duration::format(Duration::from_secs(took.as_secs()))
                    ),
                )
            }
            Happening::Failed(why) => (EventType::Warning, Reason::RefreshFailed, why.clone()),
            Happening::ValidationTimedOut(why) => {
                (EventType::Warning, Reason::ValidationTimedOut, why.clone())
            }
            Happening::LayoutLowered { asg, recorded, now } => (
                EventType::Normal,
                Reason::LayoutLowered,
                format!(
                    "{asg}'s desired count was lowered from {recorded} to {now} by someone else during the run; the run ends at {now} and does not raise it back"
                ),
            ),
            Happening::Finished {
                result,
                replaced,
                took,
            } => {
                let label = result.label();
                let type_ = match result {
                    RunResult::Failed => EventType::Warning,
                    RunResult::Succeeded | RunResult::Skipped => EventType::Normal,
                };
                ctx.metrics.refresh_run(*result);
                ctx.metrics
                    .refresh_run_duration
                    .get_or_create(&RunLabels { result: label })
                    .observe(took.as_secs_f64());
                (
                    type_,
                    Reason::RefreshFinished,
                    format!("{label}: replaced {replaced} node(s)"),
                )
            }
        };
        info!(reason = reason.as_str(), %note, "refresh");
        ctx.event(group, type_, reason, EVENT_ACTION, note).await;
    }
}

fn drift_changed(joined: &[String], left: &[String]) -> String {
    let mut parts = vec![];
    if !joined.is_empty() {
        parts.push(format!(
            "{} drifted since it started and joined it ({})",
            joined.len(),
            joined.join(", ")
        ));
    }
    if !left.is_empty() {
        parts.push(format!(
            "{} no longer drifted (its launch template version is current again) and left it ({})",
            left.len(),
            left.join(", ")
        ));
    }
    format!("drift roll: {}", parts.join("; "))
}

fn nodes_skipped(nodes: &[(String, String)]) -> String {
    let list: Vec<String> = nodes
        .iter()
        .map(|(node, why)| format!("{node}: {why}"))
        .collect();
    format!(
        "left {} protected node(s) alone: {}",
        nodes.len(),
        list.join("; ")
    )
}

/// A run set aside (`why`: the authority stopped it, or it was paused too
/// long), or its window closed.
fn set_aside(
    remaining: usize,
    opens: Option<chrono::DateTime<chrono::Utc>>,
    why: Option<&str>,
) -> (EventType, Reason, String) {
    match why {
        Some(why) => (
            EventType::Warning,
            Reason::RefreshSetAside,
            format!("run set aside: {why}; {remaining} node(s) left, resumed later"),
        ),
        None => (
            EventType::Normal,
            Reason::RefreshSetAside,
            format!(
                "the maintenance window closed: surplus removed, {remaining} node(s) left for the next window{}",
                opens.map_or(String::new(), |t| format!(" (opens at {})", t.to_rfc3339()))
            ),
        ),
    }
}
