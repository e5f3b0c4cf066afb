use super::*;
use chrono::TimeZone;
use proptest::prelude::*;
use serde_json::json;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("time")
        .with_timezone(&Utc)
}

fn envelope(source: &str, detail_type: &str, detail: Value) -> Value {
    json!({
        "version": "0",
        "id": "7bf73129-1428-4cd3-a780-95db273d1602",
        "detail-type": detail_type,
        "source": source,
        "account": "123456789012",
        "time": "2026-11-23T12:00:00Z",
        "region": "ap-northeast-1",
        "resources": ["arn:aws:ec2:ap-northeast-1a:instance/i-1234567890abcdef0"],
        "detail": detail,
    })
}

fn notice(body: &Value) -> Notice {
    match parse(&body.to_string()) {
        Parsed::Notice(n) => n,
        other => panic!("not a notice: {other:?}"),
    }
}

#[test]
fn a_spot_interruption_warning() {
    let n = notice(&envelope(
        "aws.ec2",
        "EC2 Spot Instance Interruption Warning",
        json!({"instance-id": "i-1234567890abcdef0", "instance-action": "terminate"}),
    ));
    assert_eq!(n.kind, NoticeKind::SpotInterruption);
    assert_eq!(n.instance_ids, vec!["i-1234567890abcdef0"]);
    assert_eq!(n.time, t("2026-11-23T12:00:00Z"), "EventBridge time");
    assert_eq!(
        n.id.as_deref(),
        Some("7bf73129-1428-4cd3-a780-95db273d1602")
    );
    assert!(n.kind.is_loss());
}

#[test]
fn a_rebalance_recommendation_is_not_a_loss() {
    let n = notice(&envelope(
        "aws.ec2",
        "EC2 Instance Rebalance Recommendation",
        json!({"instance-id": "i-0b662ef9931388ba0"}),
    ));
    assert_eq!(n.kind, NoticeKind::RebalanceRecommendation);
    assert!(!n.kind.is_loss());
}

#[test]
fn state_changes_to_stopping_or_terminated_are_losses_and_running_is_ignored() {
    for state in ["stopping", "stopped", "shutting-down", "terminated"] {
        let n = notice(&envelope(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            json!({"instance-id": "i-0b662ef9931388ba0", "state": state}),
        ));
        assert_eq!(n.kind, NoticeKind::StateChange(state.into()));
    }
    let running = envelope(
        "aws.ec2",
        "EC2 Instance State-change Notification",
        json!({"instance-id": "i-0b662ef9931388ba0", "state": "running"}),
    );
    assert!(matches!(
        parse(&running.to_string()),
        Parsed::Ignored {
            kind: "state_change",
            ..
        }
    ));
}

#[test]
fn a_scheduled_change_names_every_affected_instance_once() {
    let n = notice(&envelope(
        "aws.health",
        "AWS Health Event",
        json!({
            "eventArn": "arn:aws:health:ap-northeast-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/x",
            "service": "EC2",
            "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange",
            "startTime": "Sat, 28 Nov 2026 00:00:00 GMT",
            "affectedEntities": [
                {"entityValue": "i-0aaa"}, {"entityValue": "i-0bbb"}, {"entityValue": "i-0aaa"}
            ],
        }),
    ));
    assert_eq!(
        n.kind,
        NoticeKind::ScheduledChange {
            event_type: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".into(),
            // AWS's own example dates carry a weekday false to the date
            // (28 Nov 2026 is a Saturday; "Sat, 05 Jun 2016" was a Sunday).
            start: Some(Utc.with_ymd_and_hms(2026, 11, 28, 0, 0, 0).unwrap()),
        }
    );
    assert_eq!(n.instance_ids, vec!["i-0aaa", "i-0bbb"]);
    let other = envelope(
        "aws.health",
        "AWS Health Event",
        json!({"service": "RDS", "eventTypeCategory": "scheduledChange", "affectedEntities": []}),
    );
    assert!(matches!(parse(&other.to_string()), Parsed::Ignored { .. }));
}

#[test]
fn a_reboot_or_maintenance_is_not_a_loss_and_its_start_is_read_in_either_format() {
    let health = |code: &str, start: &str| {
        notice(&envelope(
            "aws.health",
            "AWS Health Event",
            json!({
                "service": "EC2", "eventTypeCode": code, "eventTypeCategory": "scheduledChange",
                "startTime": start, "affectedEntities": [{"entityValue": "i-0aaa"}],
            }),
        ))
    };
    let start = Utc.with_ymd_and_hms(2016, 6, 5, 15, 10, 9).unwrap();
    for code in [
        "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
        "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
        "AWS_EC2_INSTANCE_REBOOT_FLEXIBLE_MAINTENANCE_SCHEDULED",
        "AWS_EC2_DEDICATED_HOST_NETWORK_MAINTENANCE_SCHEDULED",
        "AWS_EC2_SOMETHING_NEW_SCHEDULED",
    ] {
        let n = health(code, "Sat, 05 Jun 2016 15:10:09 GMT");
        assert_eq!(
            n.kind,
            NoticeKind::ScheduledMaintenance {
                event_type: code.into(),
                start: Some(start)
            }
        );
        assert!(!n.kind.is_loss(), "{code}");
    }
    for code in [
        "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED",
        "AWS_EC2_INSTANCE_STOP_SCHEDULED",
    ] {
        let n = health(code, "2016-06-05T15:10:09Z");
        assert_eq!(
            n.kind,
            NoticeKind::ScheduledChange {
                event_type: code.into(),
                start: Some(start)
            }
        );
        assert!(n.kind.is_loss(), "{code}");
    }
    // An unreadable start keeps the notice (treated as imminent).
    let n = health("AWS_EC2_INSTANCE_STOP_SCHEDULED", "soon");
    assert!(matches!(
        n.kind,
        NoticeKind::ScheduledChange { start: None, .. }
    ));
}

fn lifecycle_detail() -> Value {
    json!({
        "LifecycleActionToken": "87654321-4321-4321-4321-210987654321",
        "AutoScalingGroupName": "nodes-ap-northeast-1a.example.com",
        "LifecycleHookName": "kops-terminate",
        "EC2InstanceId": "i-1234567890abcdef0",
        "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
        "NotificationMetadata": "",
        "Origin": "AutoScalingGroup",
        "Destination": "EC2",
    })
}

#[test]
fn a_terminate_lifecycle_action_in_all_three_shapes() {
    let expected = LifecycleAction {
        auto_scaling_group: "nodes-ap-northeast-1a.example.com".into(),
        hook: "kops-terminate".into(),
        token: "87654321-4321-4321-4321-210987654321".into(),
    };
    let bridged = notice(&envelope(
        "aws.autoscaling",
        "EC2 Instance-terminate Lifecycle Action",
        lifecycle_detail(),
    ));
    assert_eq!(
        bridged.kind,
        NoticeKind::TerminateLifecycleAction(expected.clone())
    );
    assert_eq!(bridged.time, t("2026-11-23T12:00:00Z"));
    // The ASG's own notification: no envelope, its own Time.
    let mut direct = lifecycle_detail();
    direct["Service"] = json!("AWS Auto Scaling");
    direct["Time"] = json!("2026-11-23T12:00:05.123Z");
    direct["RequestId"] = json!("req-1");
    let n = notice(&direct);
    assert_eq!(
        n.kind,
        NoticeKind::TerminateLifecycleAction(expected.clone())
    );
    assert_eq!(
        n.time,
        Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 5).unwrap() + chrono::Duration::milliseconds(123)
    );
    // The same, wrapped by SNS.
    let wrapped = json!({"Type": "Notification", "MessageId": "m", "Message": direct.to_string()});
    assert_eq!(
        notice(&wrapped).kind,
        NoticeKind::TerminateLifecycleAction(expected)
    );
}

#[test]
fn the_asg_test_notification_is_ignored() {
    let body = json!({
        "AccountId": "123456789012", "RequestId": "r", "AutoScalingGroupARN": "arn",
        "AutoScalingGroupName": "nodes", "Service": "AWS Auto Scaling",
        "Event": "autoscaling:TEST_NOTIFICATION", "Time": "2026-11-23T12:00:00Z",
    });
    assert!(matches!(
        parse(&body.to_string()),
        Parsed::Ignored {
            kind: "test_notification",
            ..
        }
    ));
}

#[test]
fn bad_messages_are_rejected_with_their_reason() {
    let cases = [
        ("{not json".to_string(), "malformed"),
        ("[1, 2]".to_string(), "malformed"),
        (json!({"hello": "world"}).to_string(), "unknown_kind"),
        (
            envelope(
                "aws.ec2",
                "EC2 Fleet Spot Instance Request Error",
                json!({}),
            )
            .to_string(),
            "unknown_kind",
        ),
        (
            {
                let mut e = envelope(
                    "aws.ec2",
                    "EC2 Spot Instance Interruption Warning",
                    json!({"instance-id": "i-1"}),
                );
                e["version"] = json!("1");
                e.to_string()
            },
            "unknown_version",
        ),
        (
            envelope(
                "aws.ec2",
                "EC2 Spot Instance Interruption Warning",
                json!({"instance-id": "not-an-instance"}),
            )
            .to_string(),
            "malformed",
        ),
        (
            {
                let mut e = envelope(
                    "aws.ec2",
                    "EC2 Spot Instance Interruption Warning",
                    json!({"instance-id": "i-1"}),
                );
                e["time"] = json!("yesterday");
                e.to_string()
            },
            "malformed",
        ),
        (
            json!({"Type": "Notification", "Message": "{oops"}).to_string(),
            "malformed",
        ),
    ];
    for (body, label) in cases {
        match parse(&body) {
            Parsed::Rejected(r) => assert_eq!(r.label(), label, "{body}: {r}"),
            other => panic!("{body}: {other:?}"),
        }
    }
}

fn instance() -> impl Strategy<Value = String> {
    "i-[0-9a-f]{8,17}"
}

fn time() -> impl Strategy<Value = DateTime<Utc>> {
    (0i64..4_000_000_000).prop_map(|s| Utc.timestamp_opt(s, 0).single().expect("time"))
}

proptest! {
    /// Any bytes: a result, never a panic.
    #[test]
    fn any_text_parses_without_panicking(body in ".{0,400}") {
        let _ = parse(&body);
    }

    /// Any JSON shaped like our messages, with fields of any type.
    #[test]
    fn any_json_parses_without_panicking(
        detail_type in prop::sample::select(vec![
            "EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation",
            "EC2 Instance State-change Notification", "AWS Health Event",
            "EC2 Instance-terminate Lifecycle Action", "other",
        ]),
        source in prop::sample::select(vec!["aws.ec2", "aws.health", "aws.autoscaling", "x"]),
        detail in any_json(),
        time in any_json(),
        wrap in any::<bool>(),
    ) {
        let body = json!({"version": "0", "detail-type": detail_type, "source": source,
                          "time": time, "detail": detail});
        let body = if wrap { json!({"Message": body.to_string()}) } else { body };
        let _ = parse(&body.to_string());
    }

    /// The fields we use come back as they went in.
    #[test]
    fn the_fields_we_use_round_trip(
        id in instance(),
        others in prop::collection::vec(instance(), 0..4),
        at in time(),
        kind in 0u8..5,
        hook in "[a-z-]{1,20}",
        token in "[0-9a-f-]{8,36}",
    ) {
        let stamp = at.to_rfc3339();
        let action = LifecycleAction { auto_scaling_group: "asg-x".into(), hook: hook.clone(), token: token.clone() };
        let (body, expected_kind, expected_ids) = match kind {
            0 => (json!({"version": "0", "source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning",
                         "time": stamp, "detail": {"instance-id": id, "instance-action": "terminate"}}),
                  NoticeKind::SpotInterruption, vec![id.clone()]),
            1 => (json!({"version": "0", "source": "aws.ec2", "detail-type": "EC2 Instance Rebalance Recommendation",
                         "time": stamp, "detail": {"instance-id": id}}),
                  NoticeKind::RebalanceRecommendation, vec![id.clone()]),
            2 => (json!({"version": "0", "source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification",
                         "time": stamp, "detail": {"instance-id": id, "state": "stopping"}}),
                  NoticeKind::StateChange("stopping".into()), vec![id.clone()]),
            3 => {
                let mut ids = vec![id.clone()];
                for o in &others { if !ids.contains(o) { ids.push(o.clone()); } }
                let entities: Vec<Value> = ids.iter().map(|i| json!({"entityValue": i})).collect();
                (json!({"version": "0", "source": "aws.health", "detail-type": "AWS Health Event", "time": stamp,
                        "detail": {"service": "EC2", "eventTypeCategory": "scheduledChange",
                                   "eventTypeCode": "AWS_EC2_INSTANCE_STOP_SCHEDULED", "affectedEntities": entities}}),
                 NoticeKind::ScheduledChange { event_type: "AWS_EC2_INSTANCE_STOP_SCHEDULED".into(), start: None }, ids)
            }
            _ => (json!({"Message": json!({"AutoScalingGroupName": "asg-x", "LifecycleHookName": hook,
                    "LifecycleActionToken": token, "EC2InstanceId": id, "Time": stamp,
                    "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING"}).to_string()}),
                  NoticeKind::TerminateLifecycleAction(action), vec![id.clone()]),
        };
        let n = match parse(&body.to_string()) {
            Parsed::Notice(n) => n,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        prop_assert_eq!(n.kind, expected_kind);
        prop_assert_eq!(n.instance_ids, expected_ids);
        prop_assert_eq!(n.time, at);
    }
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        ".{0,12}".prop_map(Value::String),
        instance().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "instance-id",
                    "state",
                    "service",
                    "eventTypeCategory",
                    "affectedEntities",
                    "entityValue",
                    "EC2InstanceId",
                    "LifecycleTransition",
                    "x",
                ])
                .prop_map(str::to_string),
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
