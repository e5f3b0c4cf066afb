//! Terminate lifecycle hooks that nothing of the manager's completes: the
//! other half of the `OtherTerminationHandler` condition. kops adds an
//! `<ig>-NTHLifecycleHook` to every ASG while its termination handler runs
//! in queue mode, and leaves it when the handler is turned off: every
//! termination then waits in `Terminating:Wait` for the hook's heartbeat
//! timeout (a drained node kept running, a repair's or a refresh's
//! replacement late). The manager completes a hook's actions only when
//! their notifications reach its own interruption queue; a hook whose
//! notifications go elsewhere, or any hook while the manager has no queue,
//! is reported. Described at most once an hour per ASG (one call each); the
//! manager changes none.

use crate::cloud::LifecycleHook;

/// `:<account>:<name>`, the tail of the ARN of the queue at `url`
/// (`https://sqs.<region>.amazonaws.com/<account>/<name>`; the emulator's
/// URLs name no region, so the region is not compared).
fn queue_arn_tail(url: &str) -> Option<String> {
    let mut parts = url.trim_end_matches('/').rsplit('/');
    let name = parts.next().filter(|n| !n.is_empty())?;
    let account = parts.next().filter(|a| !a.is_empty())?;
    Some(format!(":{account}:{name}"))
}

/// Pure: one sentence per hook whose actions nothing of the manager's
/// completes, given the manager's interruption queue (`queue_url`).
pub fn uncompleted(hooks: &[(String, LifecycleHook)], queue_url: Option<&str>) -> Vec<String> {
    let ours = queue_url.and_then(queue_arn_tail);
    hooks
        .iter()
        .filter(|(_, h)| match (&ours, &h.notification_target) {
            // No queue: nothing of ours hears of it.
            (None, _) => true,
            // Its own target: ours, or somewhere else.
            (Some(ours), Some(target)) => !target.ends_with(ours.as_str()),
            // Through EventBridge: ours when a rule routes it to our queue,
            // which the manager cannot see; assumed so (docs/kops.md).
            (Some(_), None) => false,
        })
        .map(|(asg, h)| {
            let wait = h
                .heartbeat_timeout
                .map_or("its heartbeat timeout".to_string(), |t| {
                    crate::duration::format(t)
                });
            let then = h.default_result.as_deref().unwrap_or("ABANDON");
            let goes = match &h.notification_target {
                Some(target) => format!("its notifications go to {target}, not the manager's queue"),
                None if queue_url.is_none() => "the manager has no interruption queue to hear of it".to_string(),
                None => "its notifications do not reach the manager".to_string(),
            };
            format!(
                "{asg} has the terminate lifecycle hook {name}: {goes}, so every termination in {asg} waits {wait} (then {then}) unless something else completes it; delete it (aws autoscaling delete-lifecycle-hook --auto-scaling-group-name {asg} --lifecycle-hook-name {name}; kops leaves <ig>-NTHLifecycleHook when its termination handler is turned off), or route its notifications to the manager's queue",
                name = h.name
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hook(name: &str, target: Option<&str>) -> (String, LifecycleHook) {
        (
            "nodes-a".to_string(),
            LifecycleHook {
                name: name.into(),
                heartbeat_timeout: Some(Duration::from_secs(300)),
                default_result: Some("CONTINUE".into()),
                notification_target: target.map(str::to_string),
            },
        )
    }

    const QUEUE: &str = "https://sqs.eu-west-1.amazonaws.com/123456789012/snm-interruptions";

    #[test]
    fn without_a_queue_every_terminate_hook_is_one_nothing_completes() {
        let found = uncompleted(&[hook("nodes-a-NTHLifecycleHook", None)], None);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].contains("nodes-a has the terminate lifecycle hook nodes-a-NTHLifecycleHook"),
            "{}",
            found[0]
        );
        assert!(found[0].contains("no interruption queue"), "{}", found[0]);
        assert!(
            found[0].contains("waits 5m (then CONTINUE)"),
            "{}",
            found[0]
        );
        assert!(found[0].contains("delete-lifecycle-hook --auto-scaling-group-name nodes-a --lifecycle-hook-name nodes-a-NTHLifecycleHook"), "{}", found[0]);
    }

    #[test]
    fn a_hook_aimed_at_the_managers_queue_or_at_eventbridge_with_a_queue_is_not_reported() {
        let ours = "arn:aws:sqs:eu-west-1:123456789012:snm-interruptions";
        let elsewhere = "arn:aws:sqs:eu-west-1:123456789012:cluster-nth";
        let hooks = [
            hook("ours", Some(ours)),
            hook("bridge", None),
            hook("theirs", Some(elsewhere)),
        ];
        let found = uncompleted(&hooks, Some(QUEUE));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("hook theirs: its notifications go to arn:aws:sqs:eu-west-1:123456789012:cluster-nth"), "{}", found[0]);
        // The emulator's URLs name no region: the account and name decide.
        let local = "http://127.0.0.1:5000/123456789012/snm-interruptions";
        assert_eq!(uncompleted(&hooks[..1], Some(local)), Vec::<String>::new());
    }

    #[test]
    fn a_queue_url_gives_the_tail_of_its_arn() {
        assert_eq!(
            queue_arn_tail(QUEUE).as_deref(),
            Some(":123456789012:snm-interruptions")
        );
        assert_eq!(queue_arn_tail("https://x/"), None);
    }
}
