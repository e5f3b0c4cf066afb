//! The manager's logs as a log pipeline reads them: written to a file (as a
//! container's are), text carries no colour codes; JSON is one object per
//! line, each reconcile's lines naming its controller and group (or node),
//! and each mutation naming the node, instance or ASG it touched.

use snm_testkit as support;

use chrono::Utc;
use serde_json::Value;
use support::assert_eventually;
use support::interruption::spot_warning;
use support::refresh::*;
use support::steady::*;

fn json_lines(logs: &str) -> Vec<Value> {
    logs.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {l}"))
        })
        .collect()
}

/// A line logged inside `controller`'s reconcile of group `workers`.
fn in_reconcile_of_workers(line: &Value, controller: &str) -> bool {
    line["span"]["name"] == "reconcile"
        && line["span"]["controller"] == controller
        && line["span"]["group"] == "workers"
}

#[tokio::test]
async fn json_logs_name_the_controller_group_node_and_instance_of_each_line() {
    let steady = SteadyGroup::workers("logs-json")
        .interruption_queue()
        .manager_args(&["--log-format", "json"])
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let victim = world.asg_snapshot(&kops.asgs).await[0].2[0].clone();
    queue.send(&spot_warning(&victim, Utc::now())).await;
    // The warned node is marked, a replacement launched, then the instance
    // terminated by us: a mutation naming the node, then one naming the
    // instance (the simulated kubelet names a node after its instance).
    let mutated = |lines: &[Value], field: &str| {
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "mutated" && l["fields"][field] == victim.as_str())
    };
    let lines = assert_eventually(
        "the warned instance terminated, in the log",
        WAIT,
        || async {
            let lines = json_lines(&steady.manager.logs());
            (mutated(&lines, "node") && mutated(&lines, "instance")).then_some(lines)
        },
    )
    .await;
    for controller in ["inventory", "replenisher"] {
        assert!(
            lines.iter().any(|l| in_reconcile_of_workers(l, controller)),
            "no line from the {controller}'s reconcile of workers names both"
        );
    }
    let raised = lines.iter().find(|l| {
        l["fields"]["message"] == "mutated" && l["fields"]["action"] == "set_desired_capacity"
    });
    assert!(
        raised.is_some_and(|l| l["fields"]["asg"]
            .as_str()
            .is_some_and(|a| kops.asgs.iter().any(|k| k == a))),
        "the raise for the replacement names its ASG: {raised:?}"
    );
    assert!(!steady.manager.logs().contains('\u{1b}'), "no colour codes");
    assert!(steady.manager.child_alive(), "{}", steady.manager.logs());
}

#[tokio::test]
async fn text_logs_to_a_file_carry_no_colour_codes_and_name_the_reconcile() {
    let steady = SteadyGroup::workers("logs-text")
        .zones(&support::ZONES[..1])
        .start()
        .await;
    let logs = steady.manager.logs();
    assert!(!logs.is_empty());
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes in a log written to a file:\n{logs}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains("reconcile{controller=\"inventory\" group=\"workers\"}")),
        "no line names the inventory's reconcile of workers:\n{logs}"
    );
    assert!(steady.manager.child_alive(), "{logs}");
}
