//! The monitoring kit against the manager's own metrics: every series the
//! Grafana dashboard queries is one the manager exports (every metric is in
//! docs/reference/metrics.md, generated), and the ServiceMonitor reaches the
//! admin port.

use serde_json::Value;
use std::collections::BTreeSet;

fn repo_file(path: &str) -> String {
    let full = snm_testkit::repo_root().join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Every sample name the manager exports: a counter `x` as `x_total`, a
/// histogram as `x_bucket`, `x_sum` and `x_count`, a gauge as `x`. Read from
/// the exposition's `# TYPE` lines, so a family with no series yet counts.
fn exported() -> BTreeSet<String> {
    // A family with no series is not in the exposition: every family gets
    // one (the reference's own test checks that none is left out).
    let text = spot_node_manager::reference::metrics::with_every_series().encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The metric names a PromQL expression mentions.
fn queried(expr: &str) -> Vec<String> {
    let mut names = vec![];
    let mut rest = expr;
    while let Some(at) = rest.find("spot_node_manager_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn every_series_the_dashboard_queries_is_exported() {
    let exported = exported();
    assert!(
        exported.contains("spot_node_manager_group_ready_nodes")
            && exported.contains("spot_node_manager_aws_call_errors_total"),
        "{exported:?}"
    );
    let dashboard: Value =
        serde_json::from_str(&repo_file("manifests/monitoring/dashboard.json")).expect("JSON");
    let mut exprs = vec![];
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push(target["expr"].as_str().expect("expr").to_string());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["query"].as_str() {
            exprs.push(query.to_string());
        }
    }
    let mut checked = 0;
    for expr in &exprs {
        for name in queried(expr) {
            assert!(
                exported.contains(&name),
                "the dashboard queries {name}, which the manager does not export ({expr})"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} names found in {exprs:?}");
    // What the issue asks the dashboard to show.
    let all = exprs.join("\n");
    for needed in [
        "group_ready_nodes",
        "group_desired_nodes",
        "group_operation",
        "refresh_run_duration_seconds",
        "drains_total",
        "interruption_messages_total",
        "interruption_age_at_action_seconds",
        "aws_calls_total",
        "aws_call_errors_total",
        // Issue 55: state and troubles, drift, repairs, the fallback's cost.
        "group_state",
        "group_condition",
        "group_drifted_nodes",
        "node_repairs_total",
        "group_fallback_nodes",
        "on_demand_instance_seconds_total",
        // Issue 57: what spot saves.
        "group_cost_dollars",
        "group_instance_hours",
    ] {
        assert!(all.contains(needed), "no panel shows {needed}");
    }
}

#[test]
fn the_service_monitor_reaches_the_managers_admin_port() {
    let load = |path: &str| -> Vec<serde_yaml::Value> {
        let text = repo_file(path);
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
            .collect()
    };
    let of_kind = |docs: &[serde_yaml::Value], kind: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .cloned()
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let service = of_kind(&load("manifests/monitoring/service.yaml"), "Service");
    let monitor = of_kind(
        &load("manifests/monitoring/servicemonitor.yaml"),
        "ServiceMonitor",
    );
    let deployment = of_kind(&load("manifests/deployment.yaml"), "Deployment");
    let subset = |wanted: &serde_yaml::Value, have: &serde_yaml::Value| {
        wanted
            .as_mapping()
            .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| have.get(k) == Some(v)))
    };
    assert!(
        subset(
            &monitor["spec"]["selector"]["matchLabels"],
            &service["metadata"]["labels"]
        ),
        "the ServiceMonitor selects the Service"
    );
    assert!(
        subset(
            &service["spec"]["selector"],
            &deployment["spec"]["template"]["metadata"]["labels"]
        ),
        "the Service selects the manager's pods"
    );
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    assert_eq!(
        monitor["spec"]["endpoints"][0]["path"].as_str(),
        Some("/metrics")
    );
    let target = &service["spec"]["ports"][0]["targetPort"];
    let container_ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_sequence()
        .expect("container ports");
    assert!(
        container_ports.iter().any(|p| &p["name"] == target),
        "the Service's targetPort {target:?} is a container port of the manager"
    );
    assert_eq!(
        service["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
}

/// The PrometheusRule's groups, as a rules file for promtool; without
/// annotations when `annotations` is false.
fn rule_groups(annotations: bool) -> serde_yaml::Value {
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&repo_file("manifests/monitoring/prometheusrule.yaml")).expect("YAML");
    let mut groups = rule["spec"]["groups"].clone();
    if !annotations {
        for group in groups.as_sequence_mut().expect("groups") {
            for r in group["rules"].as_sequence_mut().expect("rules") {
                r.as_mapping_mut().expect("rule").remove("annotations");
            }
        }
    }
    let mut file = serde_yaml::Mapping::new();
    file.insert("groups".into(), groups);
    serde_yaml::Value::Mapping(file)
}

/// The alerts are valid rules (promtool check rules), each fires when its
/// cases say and only then (promtool test rules, tests/fixtures/
/// alerts_test.yaml), each has a case where it fires, each queries only
/// series the manager exports and points at a section of operations.md.
#[test]
fn the_alerts_are_valid_tested_and_point_at_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = dir.path().join("full.yaml");
    std::fs::write(
        &full,
        serde_yaml::to_string(&rule_groups(true)).expect("YAML"),
    )
    .expect("write");
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml::to_string(&rule_groups(false)).expect("YAML"),
    )
    .expect("write");
    let cases = dir.path().join("alerts_test.yaml");
    std::fs::write(&cases, repo_file("tests/fixtures/alerts_test.yaml")).expect("write");
    let run = |args: &[&str]| {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap_or_else(|e| {
                panic!("promtool: {e} (scripts/test installs it: Debian's prometheus package)")
            });
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["check", "rules", "full.yaml"]);
    run(&["test", "rules", "alerts_test.yaml"]);

    let exported = exported();
    let operations = repo_file("docs/operations.md");
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let tested = repo_file("tests/fixtures/alerts_test.yaml");
    let groups = rule_groups(true);
    let mut alerts = 0;
    for group in groups["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("alert name");
            alerts += 1;
            let expr = rule["expr"].as_str().expect("expr");
            let names = queried(expr);
            assert!(!names.is_empty(), "{name} queries nothing of ours");
            for metric in names {
                assert!(
                    exported.contains(&metric),
                    "{name} queries {metric}, not exported"
                );
            }
            // The key Alertmanager's templates and Grafana link by; the
            // example overlay makes it absolute (tests/manifests.rs).
            let runbook = rule["annotations"]["runbook_url"]
                .as_str()
                .expect("runbook_url");
            let anchor = runbook
                .strip_prefix("docs/operations.md#")
                .unwrap_or_else(|| panic!("{name}: {runbook}"));
            assert!(
                anchors.contains(anchor),
                "{name}: no section #{anchor} in {anchors:?}"
            );
            // A case where it fires: its name followed by expected alerts.
            let fires = tested
                .split(&format!("alertname: {name}\n"))
                .skip(1)
                .any(|rest| rest.trim_start().starts_with("exp_alerts:\n"));
            assert!(fires, "{name}: no case in alerts_test.yaml where it fires");
        }
    }
    assert!(alerts >= 7, "{alerts} alerts");
}
