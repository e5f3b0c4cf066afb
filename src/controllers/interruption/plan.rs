//! What to do with one message, pure: from the parsed body, who owns its
//! instances and `now`, the node marks to persist, the Events to write and
//! whether the message may then be deleted.

use super::message::{Notice, NoticeKind, Parsed};
use super::ownership::{Disposition, ForeignMessages, Owner, Ownership, Unmanaged, dispose};
use crate::events::Reason;
use crate::k8s::interruption_record::{HookAction, LATE_DRAIN, Record};
use chrono::{DateTime, Utc};

/// One instance of ours a notice names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Persist the loss on the node (cordon, taint, label, record).
    Mark {
        owner: Owner,
        node: String,
        record: Record,
    },
    /// An instance that never joined, held by a terminate lifecycle action:
    /// nothing to drain, so let its ASG go on at once.
    Complete {
        owner: Owner,
        instance_id: String,
        action: HookAction,
    },
    /// A node of this cluster that no NodeGroup lists, about to be lost:
    /// cordoned and drained like ours (the group's `drainDeadline` default),
    /// never replaced or terminated by us (its ASG replaces it).
    MarkUnmanaged { node: String, record: Record },
    /// A loss for an instance of ours whose Node has not joined yet (it was
    /// launched moments ago): nothing to mark now, and the message stays on
    /// the queue, so its next delivery marks the Node once it has joined,
    /// until the drain deadline.
    AwaitNode { owner: Owner, instance_id: String },
    /// Nothing to persist (a rebalance recommendation the group ignores, an
    /// instance that never joined): only say so.
    Note {
        owner: Owner,
        instance_id: String,
        /// The Event's reason.
        reason: Reason,
        note: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessagePlan {
    /// The notice's kind, or why it was not one (metric label).
    pub kind: &'static str,
    /// What was decided (metric label): acted, ignored, rejected,
    /// foreign_deleted, foreign_left, unknown_left, unjoined_left.
    pub outcome: &'static str,
    pub steps: Vec<Response>,
    /// Delete the message once every step is carried out.
    pub delete: bool,
    /// For the log.
    pub summary: String,
    /// When AWS emitted it, for the age-at-action histogram.
    pub noticed: Option<DateTime<Utc>>,
}

/// A notice none of whose instances is ours.
fn foreign_plan(notice: &Notice, foreign: ForeignMessages, now: DateTime<Utc>) -> MessagePlan {
    let ids = notice.instance_ids.join(", ");
    let (outcome, delete, summary) = match foreign {
        // Our own queue names an instance the inventory has not recorded
        // yet (launched, or joined, since its last look): deleted now, a
        // warning for our newest node would be lost. Left until the
        // inventory has had its time, then deleted as foreign.
        ForeignMessages::Delete if now - notice.time < UNKNOWN_GRACE => (
            "unknown_left",
            false,
            format!(
                "{ids} not in any group's status yet; left on the queue until {} in case the inventory has not recorded it",
                (notice.time + UNKNOWN_GRACE).to_rfc3339()
            ),
        ),
        ForeignMessages::Delete => ("foreign_deleted", true, format!("{ids} not managed here")),
        ForeignMessages::Leave => (
            "foreign_left",
            false,
            format!("{ids} not managed here; left on the queue"),
        ),
    };
    MessagePlan {
        kind: notice.kind.label(),
        outcome,
        steps: vec![],
        delete,
        summary,
        noticed: None,
    }
}

/// How long a notice naming no instance of ours stays on our own queue
/// before it is deleted as foreign: the inventory records a new instance
/// within a few seconds (its ASG looks, a new Node's watch event), so a
/// notice for it is acted on at its next delivery.
pub const UNKNOWN_GRACE: chrono::Duration = chrono::Duration::seconds(60);

/// What the owning group's spec says.
pub trait GroupSpecs {
    fn drain_deadline(&self, owner: &Owner) -> chrono::Duration;
    /// `interruption.scheduledChangeLead`.
    fn scheduled_change_lead(&self, owner: &Owner) -> chrono::Duration;
    /// `onRebalanceRecommendation: Replace`.
    fn replace_on_rebalance(&self, owner: &Owner) -> bool;
    /// The group's region, when it names one.
    fn region(&self, owner: &Owner) -> Option<String>;
}

/// `now` tells a notice that arrived after its deadline (drained anyway,
/// and recorded as late).
pub fn plan(
    parsed: &Parsed,
    ownership: &Ownership,
    unmanaged: &Unmanaged,
    specs: &dyn GroupSpecs,
    foreign: ForeignMessages,
    now: DateTime<Utc>,
) -> MessagePlan {
    let base = |kind, outcome, summary: String| MessagePlan {
        kind,
        outcome,
        steps: vec![],
        delete: true,
        summary,
        noticed: None,
    };
    // On a queue shared with other handlers, what we cannot read or do not
    // handle may be theirs: left too.
    let shared = foreign == ForeignMessages::Leave;
    let notice = match parsed {
        Parsed::Rejected(r) => {
            return MessagePlan {
                delete: !shared,
                ..base(r.label(), "rejected", r.to_string())
            };
        }
        Parsed::Ignored { kind, why } => {
            return MessagePlan {
                delete: !shared,
                ..base(kind, "ignored", why.clone())
            };
        }
        Parsed::Notice(n) => n,
    };
    let kind = notice.kind.label();
    match dispose(notice, ownership, unmanaged, foreign) {
        Disposition::Foreign(foreign) => foreign_plan(notice, foreign, now),
        Disposition::Act { ours, unmanaged } => {
            // A notice naming instances no group of ours has may be another
            // handler's too (another cluster's, or a manager's of another
            // namespace): on a shared queue it stays once ours are persisted
            // (a redelivery finds the nodes marked and does nothing twice).
            let partly_foreign = ours.len() < notice.instance_ids.len();
            let only_unmanaged = ours.is_empty();
            let mut steps: Vec<Response> = ours
                .into_iter()
                .map(|(instance_id, owner)| step(notice, instance_id, owner, specs, now))
                .collect();
            steps.extend(
                unmanaged.into_iter().filter_map(|(instance_id, node)| {
                    unmanaged_step(notice, instance_id, node, now)
                }),
            );
            let awaiting = steps
                .iter()
                .any(|s| matches!(s, Response::AwaitNode { .. }));
            let outcome = match (only_unmanaged, awaiting) {
                (true, _) => "unmanaged",
                (false, true)
                    if steps
                        .iter()
                        .all(|s| matches!(s, Response::AwaitNode { .. })) =>
                {
                    "unjoined_left"
                }
                _ => "acted",
            };
            MessagePlan {
                summary: format!(
                    "{kind} for {}",
                    steps
                        .iter()
                        .map(|s| match s {
                            Response::Mark { node, .. } | Response::MarkUnmanaged { node, .. } => {
                                node.clone()
                            }
                            Response::Note { instance_id, .. }
                            | Response::Complete { instance_id, .. }
                            | Response::AwaitNode { instance_id, .. } => instance_id.clone(),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                steps,
                noticed: Some(notice.time),
                // A Node still to join keeps the message: its next delivery
                // marks it (the marks already made are found and not redone).
                delete: !(awaiting || (shared && partly_foreign)),
                ..base(kind, outcome, String::new())
            }
        }
    }
}

/// The drain deadline of a loss, and when the instance goes if the notice
/// says. A scheduled retirement or stop ends the instance at its `start`:
/// the drain must be done `drainDeadline` before it (the replacement is
/// launched at once, well ahead). A start nearer than twice that leaves the
/// drain the same time as a spot warning, and never past the start.
pub fn deadlines(
    notice: &Notice,
    drain_deadline: chrono::Duration,
) -> (DateTime<Utc>, Option<DateTime<Utc>>) {
    let after = |d| notice.time.checked_add_signed(d).unwrap_or(notice.time);
    let from_notice = after(drain_deadline);
    match &notice.kind {
        NoticeKind::ScheduledChange {
            start: Some(start), ..
        } => {
            let ahead = start.checked_sub_signed(drain_deadline).unwrap_or(*start);
            (ahead.max(from_notice.min(*start)), Some(*start))
        }
        _ => (from_notice, None),
    }
}

/// From when a scheduled change's node is cordoned, replaced and drained:
/// `lead` before AWS takes it (days of service kept, rather than drained on
/// the notice), never after its drain deadline. None (at once) for any
/// other notice.
pub fn drain_from(
    notice: &Notice,
    deadline: DateTime<Utc>,
    lead: chrono::Duration,
) -> Option<DateTime<Utc>> {
    match &notice.kind {
        NoticeKind::ScheduledChange {
            start: Some(start), ..
        } => Some(
            start
                .checked_sub_signed(lead)
                .unwrap_or(*start)
                .min(deadline),
        ),
        _ => None,
    }
}

/// A record's times: drain deadline, loss, drain start and lateness.
struct Timing {
    deadline: DateTime<Utc>,
    loss_at: Option<DateTime<Utc>>,
    drain_from: Option<DateTime<Utc>>,
    late: Option<bool>,
}

/// A loss whose notice arrives after its deadline is drained anyway, at
/// once, for [`LATE_DRAIN`].
fn timing(
    notice: &Notice,
    drain_deadline: chrono::Duration,
    lead: chrono::Duration,
    now: DateTime<Utc>,
) -> Timing {
    let (deadline, loss_at) = deadlines(notice, drain_deadline);
    if notice.kind.is_loss() && now >= deadline {
        let window = now.checked_add_signed(LATE_DRAIN).unwrap_or(now);
        return Timing {
            deadline: window,
            loss_at,
            drain_from: None,
            late: Some(true),
        };
    }
    Timing {
        deadline,
        loss_at,
        drain_from: drain_from(notice, deadline, lead),
        late: None,
    }
}

/// A loss for a node no group lists: marked with the default drain
/// deadline. A lifecycle action is not ours to complete (its ASG is no
/// group's), and a node only at risk or up for maintenance is left alone.
fn unmanaged_step(
    notice: &Notice,
    instance_id: String,
    node: String,
    now: DateTime<Utc>,
) -> Option<Response> {
    if !notice.kind.is_loss() || matches!(notice.kind, NoticeKind::TerminateLifecycleAction(_)) {
        return None;
    }
    use crate::controllers::group_view::to_chrono;
    use crate::crd::nodegroup::{DEFAULT_DRAIN_DEADLINE, DEFAULT_SCHEDULED_CHANGE_LEAD};
    let t = timing(
        notice,
        to_chrono(DEFAULT_DRAIN_DEADLINE),
        to_chrono(DEFAULT_SCHEDULED_CHANGE_LEAD),
        now,
    );
    Some(Response::MarkUnmanaged {
        record: record_of(notice, instance_id, None, t, None),
        node,
    })
}

/// The record a notice makes on a node (of `group`, `namespace/name`, when
/// a group of ours has it).
fn record_of(
    notice: &Notice,
    instance_id: String,
    group: Option<String>,
    t: Timing,
    lifecycle: Option<HookAction>,
) -> Record {
    Record {
        kind: notice.kind.label().to_string(),
        instance_id,
        noticed: notice.time,
        deadline: t.deadline,
        loss_at: t.loss_at,
        drain_from: t.drain_from,
        late: t.late,
        group,
        drained: None,
        pods_left: None,
        lifecycle,
        scope: None,
    }
}

fn step(
    notice: &Notice,
    instance_id: String,
    owner: Owner,
    specs: &dyn GroupSpecs,
    now: DateTime<Utc>,
) -> Response {
    let kind = notice.kind.label();
    if let NoticeKind::ScheduledMaintenance { event_type, start } = &notice.kind {
        let when = start.map_or("at a time AWS did not give".to_string(), |s| {
            format!("starting {}", s.to_rfc3339())
        });
        return Response::Note {
            note: format!(
                "scheduled {event_type} for {instance_id} {when}: the instance stays (not a loss), nothing is replaced"
            ),
            reason: Reason::ScheduledMaintenance,
            owner,
            instance_id,
        };
    }
    let replace = specs.replace_on_rebalance(&owner);
    if notice.kind == NoticeKind::RebalanceRecommendation && !(replace && owner.node.is_some()) {
        return Response::Note {
            note: format!(
                "rebalance recommendation for {instance_id}: at elevated risk of interruption (onRebalanceRecommendation Ignore)"
            ),
            reason: Reason::RebalanceRecommendation,
            owner,
            instance_id,
        };
    }
    let lifecycle = match &notice.kind {
        // Only the instance's own ASG (per the inventory) holds its action.
        NoticeKind::TerminateLifecycleAction(a)
            if owner.auto_scaling_group.as_deref() != Some(a.auto_scaling_group.as_str()) =>
        {
            return Response::Note {
                note: format!(
                    "lifecycle action of {} names {instance_id}, which is in {}: not touched",
                    a.auto_scaling_group,
                    owner.auto_scaling_group.as_deref().unwrap_or("no ASG")
                ),
                reason: Reason::InterruptionNotice,
                owner,
                instance_id,
            };
        }
        NoticeKind::TerminateLifecycleAction(a) => Some(HookAction {
            auto_scaling_group: a.auto_scaling_group.clone(),
            hook: a.hook.clone(),
            token: a.token.clone(),
            region: specs.region(&owner),
            heartbeat: None,
            completed: None,
        }),
        _ => None,
    };
    match (owner.node.clone(), lifecycle) {
        (None, Some(action)) => Response::Complete {
            action,
            owner,
            instance_id,
        },
        (Some(node), lifecycle) => {
            let t = timing(
                notice,
                specs.drain_deadline(&owner),
                specs.scheduled_change_lead(&owner),
                now,
            );
            Response::Mark {
                record: record_of(
                    notice,
                    instance_id,
                    Some(format!("{}/{}", owner.namespace, owner.group)),
                    t,
                    lifecycle,
                ),
                node,
                owner,
            }
        }
        // Launched moments ago, its Node may join any second: the message
        // waits for it until the drain deadline.
        (None, None)
            if notice.kind.is_loss() && now < deadlines(notice, specs.drain_deadline(&owner)).0 =>
        {
            Response::AwaitNode { owner, instance_id }
        }
        (None, None) => Response::Note {
            note: format!("{kind} for {instance_id}, which never joined: no node to drain"),
            reason: Reason::InterruptionNotice,
            owner,
            instance_id,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::interruption::message::{Rejection, parse};
    use chrono::TimeZone;

    /// The test notices' AWS time: each arrives the moment it is sent.
    fn at_notice() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap()
    }

    struct Fixed(i64);
    impl GroupSpecs for Fixed {
        fn drain_deadline(&self, _: &Owner) -> chrono::Duration {
            chrono::Duration::seconds(self.0)
        }
        fn scheduled_change_lead(&self, _: &Owner) -> chrono::Duration {
            chrono::Duration::hours(1)
        }
        fn replace_on_rebalance(&self, _: &Owner) -> bool {
            false
        }
        fn region(&self, _: &Owner) -> Option<String> {
            Some("eu-west-1".into())
        }
    }

    /// `onRebalanceRecommendation: Replace`.
    struct Replacing;
    impl GroupSpecs for Replacing {
        fn drain_deadline(&self, _: &Owner) -> chrono::Duration {
            chrono::Duration::seconds(90)
        }
        fn scheduled_change_lead(&self, _: &Owner) -> chrono::Duration {
            chrono::Duration::hours(1)
        }
        fn replace_on_rebalance(&self, _: &Owner) -> bool {
            true
        }
        fn region(&self, _: &Owner) -> Option<String> {
            None
        }
    }

    fn recommendation(id: &str) -> Parsed {
        parse(
            &serde_json::json!({
                "version": "0", "source": "aws.ec2", "time": "2026-11-23T12:00:00Z",
                "detail-type": "EC2 Instance Rebalance Recommendation",
                "detail": {"instance-id": id}
            })
            .to_string(),
        )
    }

    #[test]
    fn a_rebalance_recommendation_is_recorded_only_when_the_group_replaces() {
        let ignored = plan(
            &recommendation("i-1"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice(),
        );
        assert!(
            matches!(
                ignored.steps.as_slice(),
                [Response::Note {
                    reason: Reason::RebalanceRecommendation,
                    ..
                }]
            ),
            "{ignored:?}"
        );
        let replaced = plan(
            &recommendation("i-1"),
            &ownership(),
            &Unmanaged::default(),
            &Replacing,
            ForeignMessages::Delete,
            at_notice(),
        );
        let [Response::Mark { record, .. }] = replaced.steps.as_slice() else {
            panic!("{replaced:?}")
        };
        assert_eq!(record.kind, "rebalance_recommendation");
        assert!(!record.is_loss());
        assert!(replaced.delete);
    }

    fn owner(node: Option<&str>) -> Owner {
        Owner {
            namespace: "ns".into(),
            group: "workers".into(),
            node: node.map(str::to_string),
            auto_scaling_group: Some("asg-a".into()),
        }
    }

    fn ownership() -> Ownership {
        Ownership::from_entries([
            ("i-1".to_string(), owner(Some("n1"))),
            ("i-9".to_string(), owner(None)),
        ])
    }

    fn warning(id: &str) -> Parsed {
        parse(
            &serde_json::json!({
                "version": "0", "source": "aws.ec2", "time": "2026-11-23T12:00:00Z",
                "detail-type": "EC2 Spot Instance Interruption Warning",
                "detail": {"instance-id": id, "instance-action": "terminate"}
            })
            .to_string(),
        )
    }

    #[test]
    fn a_warning_for_our_node_marks_it_with_the_deadline_from_aws_time() {
        let p = plan(
            &warning("i-1"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice(),
        );
        assert_eq!(
            (p.kind, p.outcome, p.delete),
            ("spot_interruption", "acted", true)
        );
        let noticed = Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap();
        assert_eq!(
            p.steps,
            vec![Response::Mark {
                owner: owner(Some("n1")),
                node: "n1".into(),
                record: Record {
                    kind: "spot_interruption".into(),
                    instance_id: "i-1".into(),
                    noticed,
                    deadline: noticed + chrono::Duration::seconds(90),
                    loss_at: None,
                    drain_from: None,
                    late: None,
                    group: Some("ns/workers".into()),
                    drained: None,
                    pods_left: None,
                    lifecycle: None,
                    scope: None,
                },
            }]
        );
        assert_eq!(p.noticed, Some(noticed));
    }

    #[test]
    fn a_loss_for_an_instance_whose_node_has_not_joined_waits_for_it_until_the_deadline() {
        // Launched moments ago: its Node may join any second, so the message
        // stays and its next delivery marks the Node (seen in CI: a warning
        // for the newest replacement, a second before its Node registered,
        // was deleted with a note and the Node ran unmarked).
        let young = plan(
            &warning("i-9"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice() + chrono::Duration::seconds(89),
        );
        assert!(
            matches!(young.steps.as_slice(), [Response::AwaitNode { instance_id, .. }] if instance_id == "i-9"),
            "{young:?}"
        );
        assert_eq!((young.outcome, young.delete), ("unjoined_left", false));
        // At its drain deadline it never joined: said once, and deleted.
        let p = plan(
            &warning("i-9"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice() + chrono::Duration::seconds(90),
        );
        assert!(
            matches!(p.steps.as_slice(), [Response::Note { .. }]),
            "{p:?}"
        );
        assert_eq!((p.outcome, p.delete), ("acted", true));
    }

    #[test]
    fn foreign_rejected_and_ignored_messages() {
        let left = plan(
            &warning("i-x"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Leave,
            at_notice(),
        );
        assert_eq!((left.outcome, left.delete), ("foreign_left", false));
        assert!(left.steps.is_empty());
        // On our own queue, a notice for an instance the inventory may not
        // have recorded yet stays for the grace, then goes.
        let young = plan(
            &warning("i-x"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice() + UNKNOWN_GRACE - chrono::Duration::seconds(1),
        );
        assert_eq!((young.outcome, young.delete), ("unknown_left", false));
        assert!(young.steps.is_empty());
        let deleted = plan(
            &warning("i-x"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice() + UNKNOWN_GRACE,
        );
        assert_eq!((deleted.outcome, deleted.delete), ("foreign_deleted", true));
        let rejected = plan(
            &Parsed::Rejected(Rejection::Malformed("x".into())),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Leave,
            at_notice(),
        );
        assert_eq!(
            (rejected.kind, rejected.outcome, rejected.delete),
            ("malformed", "rejected", false),
            "on a shared queue what we cannot read may be another handler's"
        );
        let test_notification = Parsed::Ignored {
            kind: "test_notification",
            why: "x".into(),
        };
        for (foreign, delete) in [
            (ForeignMessages::Leave, false),
            (ForeignMessages::Delete, true),
        ] {
            let p = plan(
                &test_notification,
                &ownership(),
                &Unmanaged::default(),
                &Fixed(90),
                foreign,
                at_notice(),
            );
            assert_eq!((p.outcome, p.delete), ("ignored", delete));
            let p = plan(
                &Parsed::Rejected(Rejection::Malformed("x".into())),
                &ownership(),
                &Unmanaged::default(),
                &Fixed(90),
                foreign,
                at_notice(),
            );
            assert_eq!((p.outcome, p.delete), ("rejected", delete));
        }
    }

    fn health(code: &str, ids: &[&str], start: &str) -> Parsed {
        parse(
            &serde_json::json!({
                "version": "0", "source": "aws.health", "time": "2026-11-23T12:00:00Z",
                "detail-type": "AWS Health Event",
                "detail": {"service": "EC2", "eventTypeCategory": "scheduledChange",
                    "eventTypeCode": code, "startTime": start,
                    "affectedEntities": ids.iter().map(|i| serde_json::json!({"entityValue": i})).collect::<Vec<_>>()}
            })
            .to_string(),
        )
    }

    #[test]
    fn a_notice_naming_another_clusters_instance_too_stays_on_a_shared_queue() {
        let both = health(
            "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            &["i-1", "i-theirs"],
            "Sat, 28 Nov 2026 00:00:00 GMT",
        );
        let left = plan(
            &both,
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Leave,
            at_notice(),
        );
        assert!(
            matches!(left.steps.as_slice(), [Response::Mark { .. }]),
            "{left:?}"
        );
        assert_eq!((left.outcome, left.delete), ("acted", false));
        let deleted = plan(
            &both,
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice(),
        );
        assert!(deleted.delete);
        let ours = health(
            "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            &["i-1"],
            "Sat, 28 Nov 2026 00:00:00 GMT",
        );
        assert!(
            plan(
                &ours,
                &ownership(),
                &Unmanaged::default(),
                &Fixed(90),
                ForeignMessages::Leave,
                at_notice()
            )
            .delete
        );
    }

    /// The record of an AWS Health retirement of i-1 starting 2026-11-28,
    /// noticed at `at_notice()`.
    fn retirement_record() -> Record {
        let p = plan(
            &health(
                "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
                &["i-1"],
                "Sat, 28 Nov 2026 00:00:00 GMT",
            ),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice(),
        );
        match p.steps.as_slice() {
            [Response::Mark { record, .. }] => record.clone(),
            _ => panic!("{p:?}"),
        }
    }

    /// A scheduled change of i-1 noticed at `at_notice()`, starting `secs`
    /// later.
    fn scheduled_in(
        event_type: &str,
        secs: i64,
    ) -> crate::controllers::interruption::message::Notice {
        crate::controllers::interruption::message::Notice {
            kind: NoticeKind::ScheduledChange {
                event_type: event_type.into(),
                start: Some(at_notice() + chrono::Duration::seconds(secs)),
            },
            instance_ids: vec!["i-1".into()],
            time: at_notice(),
            id: None,
        }
    }

    #[test]
    fn a_scheduled_retirement_drains_by_its_start_less_the_drain_deadline() {
        let start = Utc.with_ymd_and_hms(2026, 11, 28, 0, 0, 0).unwrap();
        let record = retirement_record();
        assert_eq!(record.kind, "scheduled_change");
        assert_eq!(record.loss_at, Some(start));
        assert_eq!(record.deadline, start - chrono::Duration::seconds(90));
        assert_eq!(record.late, None);
        // A start nearer than twice the drain deadline: the drain gets what
        // a spot warning gets, and never past the start.
        let soon = |secs: i64| {
            let n = scheduled_in("AWS_EC2_INSTANCE_STOP_SCHEDULED", secs);
            deadlines(&n, chrono::Duration::seconds(90)).0 - at_notice()
        };
        assert_eq!(soon(150), chrono::Duration::seconds(90));
        assert_eq!(soon(60), chrono::Duration::seconds(60));
        assert_eq!(soon(-30), chrono::Duration::seconds(-30));
        assert_eq!(soon(3600), chrono::Duration::seconds(3510));
    }

    #[test]
    fn a_scheduled_retirement_days_away_is_drained_from_the_lead_before_its_start() {
        let start = Utc.with_ymd_and_hms(2026, 11, 28, 0, 0, 0).unwrap();
        let record = retirement_record();
        // Fixed's lead is an hour: days of service kept.
        assert_eq!(record.drain_from, Some(start - chrono::Duration::hours(1)));
        assert!(!record.leaving(at_notice()), "serves on after the notice");
        assert!(record.leaving(start - chrono::Duration::hours(1)));
        // Nearer than the lead: at once (never after its drain deadline).
        let n = scheduled_in("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", 20 * 60);
        let deadline = deadlines(&n, chrono::Duration::seconds(90)).0;
        let from = drain_from(&n, deadline, chrono::Duration::hours(1)).expect("scheduled");
        assert!(from <= at_notice(), "{from}");
        // A lead shorter than the drain deadline still starts by the deadline.
        let from = drain_from(&n, deadline, chrono::Duration::seconds(10)).expect("scheduled");
        assert_eq!(from, deadline);
        // A spot warning is at once.
        let warning = crate::controllers::interruption::message::Notice {
            kind: NoticeKind::SpotInterruption,
            ..n
        };
        assert_eq!(
            drain_from(&warning, deadline, chrono::Duration::hours(1)),
            None
        );
    }

    #[test]
    fn a_reboot_is_reported_and_nothing_is_marked() {
        let p = plan(
            &health(
                "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
                &["i-1"],
                "Sat, 28 Nov 2026 00:00:00 GMT",
            ),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice(),
        );
        let [Response::Note { reason, note, .. }] = p.steps.as_slice() else {
            panic!("{p:?}")
        };
        assert_eq!(*reason, Reason::ScheduledMaintenance);
        assert!(note.contains("2026-11-28T00:00:00"), "{note}");
        assert_eq!(
            (p.kind, p.outcome, p.delete),
            ("scheduled_maintenance", "acted", true)
        );
    }

    #[test]
    fn a_notice_past_its_deadline_is_still_drained_briefly_and_says_it_came_late() {
        let arrived = at_notice() + chrono::Duration::seconds(100);
        let p = plan(
            &warning("i-1"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            arrived,
        );
        let [Response::Mark { record, .. }] = p.steps.as_slice() else {
            panic!("{p:?}")
        };
        assert_eq!(record.late, Some(true));
        assert_eq!(record.deadline, arrived + LATE_DRAIN);
        assert_eq!(record.noticed, at_notice(), "the AWS time is kept");
        // In time: not late.
        let p = plan(
            &warning("i-1"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice() + chrono::Duration::seconds(89),
        );
        let [Response::Mark { record, .. }] = p.steps.as_slice() else {
            panic!("{p:?}")
        };
        assert_eq!(record.late, None);
        assert_eq!(record.deadline, at_notice() + chrono::Duration::seconds(90));
    }

    fn lifecycle_action(id: &str) -> Parsed {
        parse(
            &serde_json::json!({
                "version": "0", "source": "aws.autoscaling", "time": "2026-11-23T12:00:00Z",
                "detail-type": "EC2 Instance-terminate Lifecycle Action",
                "detail": {
                    "LifecycleActionToken": "token-1", "AutoScalingGroupName": "asg-a",
                    "LifecycleHookName": "drain-hook", "EC2InstanceId": id,
                    "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING"
                }
            })
            .to_string(),
        )
    }

    #[test]
    fn a_lifecycle_action_is_recorded_with_the_node_and_completed_at_once_without_one() {
        let expected = HookAction {
            auto_scaling_group: "asg-a".into(),
            hook: "drain-hook".into(),
            token: "token-1".into(),
            region: Some("eu-west-1".into()),
            heartbeat: None,
            completed: None,
        };
        let p = plan(
            &lifecycle_action("i-1"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice(),
        );
        let [Response::Mark { record, .. }] = p.steps.as_slice() else {
            panic!("{p:?}")
        };
        assert_eq!(record.kind, "terminate_lifecycle_action");
        assert_eq!(record.lifecycle.as_ref(), Some(&expected));
        // Never joined: nothing to drain, the ASG need not wait for it.
        let p = plan(
            &lifecycle_action("i-9"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice(),
        );
        assert!(
            matches!(p.steps.as_slice(), [Response::Complete { action, instance_id, .. }]
                if *action == expected && instance_id == "i-9"),
            "{p:?}"
        );
        // Another ASG's action naming our instance: never completed by us.
        let mut other = lifecycle_action("i-1");
        if let Parsed::Notice(n) = &mut other
            && let NoticeKind::TerminateLifecycleAction(a) = &mut n.kind
        {
            a.auto_scaling_group = "asg-b".into();
        }
        let p = plan(
            &other,
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Delete,
            at_notice(),
        );
        assert!(
            matches!(p.steps.as_slice(), [Response::Note { .. }]),
            "{p:?}"
        );
        // Not ours: never completed by us.
        let p = plan(
            &lifecycle_action("i-x"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(90),
            ForeignMessages::Leave,
            at_notice(),
        );
        assert!(p.steps.is_empty() && !p.delete, "{p:?}");
    }

    /// Any drain deadline (seconds, saturating into chrono's range) and
    /// either rebalance policy.
    struct Any {
        deadline: i64,
        replace: bool,
    }
    impl GroupSpecs for Any {
        fn drain_deadline(&self, _: &Owner) -> chrono::Duration {
            chrono::Duration::try_seconds(self.deadline).unwrap_or(chrono::Duration::MAX)
        }
        fn scheduled_change_lead(&self, _: &Owner) -> chrono::Duration {
            chrono::Duration::hours(1)
        }
        fn replace_on_rebalance(&self, _: &Owner) -> bool {
            self.replace
        }
        fn region(&self, _: &Owner) -> Option<String> {
            None
        }
    }

    /// A message as the queue could carry it: every kind we know and some
    /// we do not, times from year 1 to 9999 or not times at all, ids ours,
    /// another group's or malformed, sometimes in an SNS envelope.
    fn any_body() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let kinds = prop_oneof![
            Just(("aws.ec2", "EC2 Spot Instance Interruption Warning")),
            Just(("aws.ec2", "EC2 Instance Rebalance Recommendation")),
            Just(("aws.ec2", "EC2 Instance State-change Notification")),
            Just(("aws.health", "AWS Health Event")),
            Just(("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action")),
            Just(("aws.ec2", "Something New")),
        ];
        let time = prop_oneof![
            (1i32..=9999, 1u32..=12, 1u32..=28, 0u32..24, 0u32..60)
                .prop_map(|(y, mo, d, h, mi)| format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:59Z")),
            "\\PC{0,12}",
        ];
        let id = prop_oneof![
            Just("i-1".to_string()),
            Just("i-9".to_string()),
            Just("i-other".to_string()),
            "[a-z0-9-]{0,8}",
        ];
        let state = prop_oneof![
            Just("stopping"),
            Just("terminated"),
            Just("running"),
            Just("")
        ];
        let asg = prop_oneof![Just("asg-a"), Just("asg-b")];
        (
            kinds,
            time,
            proptest::collection::vec(id, 0..4),
            state,
            asg,
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|((source, kind), time, ids, state, asg, sns, asg_direct)| {
                let first = ids.first().cloned().unwrap_or_default();
                let detail = serde_json::json!({
                    "instance-id": first, "instance-action": "terminate", "state": state,
                    "service": "EC2", "eventTypeCategory": "scheduledChange",
                    "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
                    "affectedEntities": ids.iter().map(|i| serde_json::json!({"entityValue": i})).collect::<Vec<_>>(),
                    "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
                    "AutoScalingGroupName": asg, "LifecycleHookName": "hook",
                    "LifecycleActionToken": "token", "EC2InstanceId": first,
                });
                let body = if asg_direct {
                    let mut direct = detail.clone();
                    direct["Time"] = serde_json::Value::String(time);
                    direct
                } else {
                    serde_json::json!({"version": "0", "source": source, "detail-type": kind,
                        "time": time, "id": "e-1", "detail": detail})
                };
                if sns {
                    serde_json::json!({"Type": "Notification", "Message": body.to_string()})
                        .to_string()
                } else {
                    body.to_string()
                }
            })
    }

    /// "i-other" runs a node of this cluster that no group lists.
    fn bastion() -> Unmanaged {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bastion"}, "spec": {"providerID": "aws:///az-a/i-other"}
        }))
        .expect("node");
        Unmanaged::of_nodes(&[node], &ownership())
    }

    #[test]
    fn a_node_no_group_lists_is_cordoned_and_drained_but_never_replaced_or_its_hook_completed() {
        let p = plan(
            &warning("i-other"),
            &ownership(),
            &bastion(),
            &Fixed(30),
            ForeignMessages::Delete,
            at_notice(),
        );
        let [Response::MarkUnmanaged { node, record }] = p.steps.as_slice() else {
            panic!("{p:?}")
        };
        assert_eq!(node, "bastion");
        assert_eq!(record.group, None);
        assert_eq!(
            record.deadline,
            at_notice() + chrono::Duration::seconds(90),
            "the default drainDeadline"
        );
        assert_eq!((p.outcome, p.delete), ("unmanaged", true));
        // On a shared queue it may be another manager's (one of another
        // namespace): marked, and left for it.
        let p = plan(
            &warning("i-other"),
            &ownership(),
            &bastion(),
            &Fixed(30),
            ForeignMessages::Leave,
            at_notice(),
        );
        assert!(matches!(
            p.steps.as_slice(),
            [Response::MarkUnmanaged { .. }]
        ));
        assert!(!p.delete);
        // Not a loss, or a lifecycle action of an ASG no group names: untouched.
        for parsed in [recommendation("i-other"), lifecycle_action("i-other")] {
            let p = plan(
                &parsed,
                &ownership(),
                &bastion(),
                &Replacing,
                ForeignMessages::Delete,
                at_notice(),
            );
            assert!(p.steps.is_empty(), "{p:?}");
        }
        // Told to ignore such nodes (no lookup): foreign, once past the
        // grace for instances the inventory may not have recorded yet.
        let p = plan(
            &warning("i-other"),
            &ownership(),
            &Unmanaged::default(),
            &Fixed(30),
            ForeignMessages::Delete,
            at_notice() + UNKNOWN_GRACE,
        );
        assert_eq!(p.outcome, "foreign_deleted");
    }

    proptest::proptest! {
        /// Whatever arrives, the plan is made without panicking, acts only
        /// on instances the inventory gives a group, completes an action
        /// only for an instance that never joined, and keeps a message only
        /// when told to leave others' messages.
        #[test]
        fn any_message_plans_without_panicking_and_touches_only_ours(
            body in any_body(),
            deadline in proptest::num::i64::ANY,
            replace in proptest::bool::ANY,
            leave in proptest::bool::ANY,
        ) {
            let foreign = if leave { ForeignMessages::Leave } else { ForeignMessages::Delete };
            let parsed = parse(&body);
            let p = plan(&parsed, &ownership(), &bastion(), &Any { deadline, replace }, foreign, at_notice());
            let ours = ownership();
            for step in &p.steps {
                match step {
                    Response::MarkUnmanaged { node, record } => {
                        proptest::prop_assert_eq!(node.as_str(), "bastion");
                        proptest::prop_assert_eq!(record.instance_id.as_str(), "i-other");
                        proptest::prop_assert!(record.kind != "terminate_lifecycle_action");
                    }
                    Response::Mark { node, record, .. } => {
                        let owner = ours.owner(&record.instance_id).expect("owned");
                        proptest::prop_assert_eq!(owner.node.as_deref(), Some(node.as_str()));
                        if deadline >= 0 {
                            proptest::prop_assert!(record.deadline >= record.noticed);
                        }
                    }
                    Response::Complete { instance_id, .. } => {
                        let owner = ours.owner(instance_id).expect("owned");
                        proptest::prop_assert!(owner.node.is_none());
                    }
                    Response::Note { instance_id, .. } => {
                        proptest::prop_assert!(ours.owner(instance_id).is_some());
                    }
                    Response::AwaitNode { instance_id, .. } => {
                        let owner = ours.owner(instance_id).expect("owned");
                        proptest::prop_assert!(owner.node.is_none());
                    }
                }
            }
            let awaiting = p.steps.iter().any(|s| matches!(s, Response::AwaitNode { .. }));
            // Kept only on a shared queue: foreign, unreadable, unhandled,
            // or naming other clusters' instances too.
            // or, on our own queue, naming only instances the inventory may
            // not have recorded yet, for the grace.
            // Or a Node of ours still to join.
            if !p.delete {
                proptest::prop_assert!(leave || p.outcome == "unknown_left" || awaiting);
            }
            if !leave && p.outcome != "unknown_left" && !awaiting {
                proptest::prop_assert!(p.delete);
            }
            if p.outcome == "unknown_left" {
                proptest::prop_assert!(!leave && !p.delete);
            }
            if p.outcome == "foreign_left" {
                proptest::prop_assert!(!p.delete);
            }
            if p.outcome != "acted" && p.outcome != "unmanaged" && p.outcome != "unjoined_left" {
                proptest::prop_assert!(p.steps.is_empty());
            }
        }

        /// Any text at all parses to a notice, an ignored kind or a rejection.
        #[test]
        fn any_text_parses_without_panicking(body in "\\PC{0,200}") {
            let p = plan(&parse(&body), &ownership(), &Unmanaged::default(), &Fixed(90), ForeignMessages::Delete, at_notice());
            proptest::prop_assert!(
                p.delete || p.outcome == "unknown_left" || p.outcome == "unjoined_left"
            );
        }
    }
}
