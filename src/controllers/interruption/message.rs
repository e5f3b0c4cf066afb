//! The messages the interruption handler reads from SQS, parsed into typed
//! notices. Pure: a message body in, a [`Parsed`] out; never panics.
//!
//! Accepted shapes:
//! - EventBridge envelopes (`version` "0") from `aws.ec2` (spot interruption
//!   warning, rebalance recommendation, instance state change), `aws.health`
//!   (EC2 scheduled changes, several instances per event) and
//!   `aws.autoscaling` (terminate lifecycle action);
//! - the ASG's own SQS notification of a lifecycle action (no `detail-type`),
//!   also wrapped in an SNS envelope (`Message` holding the JSON as a string),
//!   and its `autoscaling:TEST_NOTIFICATION`.

use crate::crd::nodegroup::NoticeClass;
use chrono::{DateTime, Utc};
use serde_json::Value;

/// What a notice says will happen to an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeKind {
    /// "EC2 Spot Instance Interruption Warning": about two minutes left.
    SpotInterruption,
    /// "EC2 Instance Rebalance Recommendation": at elevated risk.
    RebalanceRecommendation,
    /// "EC2 Instance State-change Notification" to stopping, stopped,
    /// shutting-down or terminated.
    StateChange(String),
    /// An AWS Health scheduled change for EC2 that ends the instance (a
    /// retirement or a stop), at `start` when the event gives it.
    ScheduledChange {
        event_type: String,
        start: Option<DateTime<Utc>>,
    },
    /// An AWS Health scheduled change for EC2 that the instance survives (a
    /// reboot, system maintenance) or one we do not know: reported only.
    ScheduledMaintenance {
        event_type: String,
        start: Option<DateTime<Utc>>,
    },
    /// An ASG terminate lifecycle action waiting for us to complete it.
    TerminateLifecycleAction(LifecycleAction),
}

impl NoticeKind {
    /// What it is, without its details (recorded on the node as its label).
    pub fn class(&self) -> NoticeClass {
        match self {
            NoticeKind::SpotInterruption => NoticeClass::SpotInterruption,
            NoticeKind::RebalanceRecommendation => NoticeClass::RebalanceRecommendation,
            NoticeKind::StateChange(_) => NoticeClass::StateChange,
            NoticeKind::ScheduledChange { .. } => NoticeClass::ScheduledChange,
            NoticeKind::ScheduledMaintenance { .. } => NoticeClass::ScheduledMaintenance,
            NoticeKind::TerminateLifecycleAction(_) => NoticeClass::TerminateLifecycleAction,
        }
    }

    /// Metric label.
    pub fn label(&self) -> &'static str {
        self.class().label()
    }

    /// The node will be lost: cordon and drain it now. (A rebalance
    /// recommendation only says it is at risk; a reboot or maintenance
    /// leaves the instance in place.)
    pub fn is_loss(&self) -> bool {
        !matches!(
            self,
            NoticeKind::RebalanceRecommendation | NoticeKind::ScheduledMaintenance { .. }
        )
    }
}

/// What completing (or extending) a lifecycle action needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleAction {
    pub auto_scaling_group: String,
    pub hook: String,
    pub token: String,
}

/// A notice about one or more instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub kind: NoticeKind,
    pub instance_ids: Vec<String>,
    /// When AWS emitted it (EventBridge `time`, or the notification's
    /// `Time`): deadlines count from here, not from receipt.
    pub time: DateTime<Utc>,
    /// The envelope's id, for logs.
    pub id: Option<String>,
}

/// Why a message is not a notice; each is logged, counted and deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Not JSON, or missing or mistyped fields we need.
    Malformed(String),
    /// A source/detail-type we do not handle.
    UnknownKind(String),
    /// An envelope version other than "0".
    UnknownVersion(String),
}

impl Rejection {
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::Malformed(_) => "malformed",
            Rejection::UnknownKind(_) => "unknown_kind",
            Rejection::UnknownVersion(_) => "unknown_version",
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Malformed(why) => write!(f, "malformed message: {why}"),
            Rejection::UnknownKind(kind) => write!(f, "unknown message kind: {kind}"),
            Rejection::UnknownVersion(v) => write!(f, "unknown envelope version: {v}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Notice(Notice),
    /// Understood, nothing to do (a test notification, a state change to
    /// running, a health event for another service): deleted.
    Ignored {
        kind: &'static str,
        why: String,
    },
    Rejected(Rejection),
}

/// Parses one SQS message body.
pub fn parse(body: &str) -> Parsed {
    let value: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => return Parsed::Rejected(Rejection::Malformed(format!("not JSON: {e}"))),
    };
    parse_value(&value, 0)
}

fn parse_value(value: &Value, depth: u8) -> Parsed {
    let Some(object) = value.as_object() else {
        return malformed("the body is not a JSON object");
    };
    // An SNS envelope: the notification is a JSON string in `Message`.
    if let Some(inner) = object.get("Message").and_then(Value::as_str)
        && !object.contains_key("detail-type")
        && depth == 0
    {
        return match serde_json::from_str::<Value>(inner) {
            Ok(v) => parse_value(&v, depth + 1),
            Err(e) => malformed(&format!("Message is not JSON: {e}")),
        };
    }
    if object.contains_key("detail-type") {
        return eventbridge(value);
    }
    if object.contains_key("LifecycleTransition") || object.contains_key("Event") {
        return asg_notification(value);
    }
    Parsed::Rejected(Rejection::UnknownKind(
        "neither an EventBridge event nor an Auto Scaling notification".into(),
    ))
}

fn malformed(why: &str) -> Parsed {
    Parsed::Rejected(Rejection::Malformed(why.to_string()))
}

fn string<'a>(value: &'a Value, field: &str) -> Result<&'a str, Rejection> {
    match value.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(_) => Err(Rejection::Malformed(format!("{field} is not a string"))),
        None => Err(Rejection::Malformed(format!("{field} is missing"))),
    }
}

fn timestamp(value: &Value, field: &str) -> Result<DateTime<Utc>, Rejection> {
    let text = string(value, field)?;
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| Rejection::Malformed(format!("{field} {text:?} is not a time: {e}")))
}

fn instance_id(value: &Value, field: &str) -> Result<String, Rejection> {
    let id = string(value, field)?;
    if !id.starts_with("i-") {
        return Err(Rejection::Malformed(format!(
            "{field} {id:?} is not an instance id"
        )));
    }
    Ok(id.to_string())
}

fn eventbridge(value: &Value) -> Parsed {
    match eventbridge_inner(value) {
        Ok(parsed) => parsed,
        Err(rejection) => Parsed::Rejected(rejection),
    }
}

fn eventbridge_inner(value: &Value) -> Result<Parsed, Rejection> {
    let version = string(value, "version")?;
    if version != "0" {
        return Err(Rejection::UnknownVersion(version.to_string()));
    }
    let source = string(value, "source")?;
    let detail_type = string(value, "detail-type")?;
    let time = timestamp(value, "time")?;
    let id = value.get("id").and_then(Value::as_str).map(str::to_string);
    let detail = value
        .get("detail")
        .filter(|d| d.is_object())
        .ok_or_else(|| Rejection::Malformed("detail is missing or not an object".into()))?;
    let notice = |kind, instance_ids| {
        Ok(Parsed::Notice(Notice {
            kind,
            instance_ids,
            time,
            id: id.clone(),
        }))
    };
    match (source, detail_type) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => notice(
            NoticeKind::SpotInterruption,
            vec![instance_id(detail, "instance-id")?],
        ),
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => notice(
            NoticeKind::RebalanceRecommendation,
            vec![instance_id(detail, "instance-id")?],
        ),
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let state = string(detail, "state")?;
            let instance = instance_id(detail, "instance-id")?;
            if matches!(
                state,
                "stopping" | "stopped" | "shutting-down" | "terminated"
            ) {
                notice(NoticeKind::StateChange(state.to_string()), vec![instance])
            } else {
                Ok(Parsed::Ignored {
                    kind: "state_change",
                    why: format!("{instance} is {state}"),
                })
            }
        }
        ("aws.health", "AWS Health Event") => {
            let service = string(detail, "service")?;
            let category = string(detail, "eventTypeCategory")?;
            if service != "EC2" || category != "scheduledChange" {
                return Ok(Parsed::Ignored {
                    kind: "scheduled_change",
                    why: format!("a {service} {category} event"),
                });
            }
            let event_type = detail
                .get("eventTypeCode")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string();
            // A start we cannot read is not a reason to drop the notice: it
            // is then treated as imminent (deadline from `time`).
            let start = detail
                .get("startTime")
                .and_then(Value::as_str)
                .and_then(health_time);
            let entities = detail
                .get("affectedEntities")
                .and_then(Value::as_array)
                .ok_or_else(|| Rejection::Malformed("affectedEntities is not a list".into()))?;
            let mut ids = vec![];
            for entity in entities {
                let id = instance_id(entity, "entityValue")?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            if ids.is_empty() {
                return Err(Rejection::Malformed("affectedEntities is empty".into()));
            }
            let kind = if ends_the_instance(&event_type) {
                NoticeKind::ScheduledChange { event_type, start }
            } else {
                NoticeKind::ScheduledMaintenance { event_type, start }
            };
            notice(kind, ids)
        }
        ("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action") => {
            let (action, instance) = lifecycle(detail)?;
            notice(NoticeKind::TerminateLifecycleAction(action), vec![instance])
        }
        (source, detail_type) => Err(Rejection::UnknownKind(format!(
            "{source} \"{detail_type}\""
        ))),
    }
}

/// A scheduled change that stops or ends the instance (its ASG then
/// replaces it), as opposed to a reboot or maintenance it survives. Codes:
/// `AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED`,
/// `AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED`,
/// `AWS_EC2_INSTANCE_STOP_SCHEDULED`, against e.g.
/// `AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED` or
/// `AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED`. A code we do not know is
/// reported, never acted on: no surprise termination.
pub fn ends_the_instance(event_type: &str) -> bool {
    let code = event_type.to_ascii_uppercase();
    !code.contains("REBOOT")
        && !code.contains("MAINTENANCE")
        && (code.contains("RETIREMENT") || code.contains("_STOP_") || code.contains("TERMINATION"))
}

/// AWS Health writes times as RFC 2822 (`Sat, 05 Jun 2016 15:10:09 GMT`,
/// its weekday not always true to the date, so it is not checked); RFC 3339
/// is read too.
fn health_time(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    let without_weekday = text.split_once(',').map_or(text, |(_, rest)| rest).trim();
    chrono::NaiveDateTime::parse_from_str(
        without_weekday
            .trim_end_matches("GMT")
            .trim_end_matches("UTC")
            .trim(),
        "%d %b %Y %H:%M:%S",
    )
    .ok()
    .map(|t| t.and_utc())
    .or_else(|| {
        DateTime::parse_from_str(without_weekday, "%d %b %Y %H:%M:%S %z")
            .ok()
            .map(|t| t.with_timezone(&Utc))
    })
}

fn lifecycle(value: &Value) -> Result<(LifecycleAction, String), Rejection> {
    let transition = string(value, "LifecycleTransition")?;
    if transition != "autoscaling:EC2_INSTANCE_TERMINATING" {
        return Err(Rejection::UnknownKind(format!(
            "lifecycle transition {transition}"
        )));
    }
    Ok((
        LifecycleAction {
            auto_scaling_group: string(value, "AutoScalingGroupName")?.to_string(),
            hook: string(value, "LifecycleHookName")?.to_string(),
            token: string(value, "LifecycleActionToken")?.to_string(),
        },
        instance_id(value, "EC2InstanceId")?,
    ))
}

/// The ASG's own notification (no EventBridge envelope).
fn asg_notification(value: &Value) -> Parsed {
    if value.get("Event").and_then(Value::as_str) == Some("autoscaling:TEST_NOTIFICATION") {
        return Parsed::Ignored {
            kind: "test_notification",
            why: "autoscaling:TEST_NOTIFICATION".into(),
        };
    }
    let parsed = (|| {
        let (action, instance) = lifecycle(value)?;
        let time = timestamp(value, "Time")?;
        Ok(Parsed::Notice(Notice {
            kind: NoticeKind::TerminateLifecycleAction(action),
            instance_ids: vec![instance],
            time,
            id: value
                .get("RequestId")
                .and_then(Value::as_str)
                .map(str::to_string),
        }))
    })();
    parsed.unwrap_or_else(Parsed::Rejected)
}

#[cfg(test)]
mod tests;
