//! Prometheus metrics. Labels are static strings (controller names, error
//! categories, mutation kinds), never node, instance or pod names, so
//! cardinality is bounded; the per-group gauges carry the NodeGroup's
//! namespace and name (a handful per cluster).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

mod cost;
mod groups;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: &'static str,
    pub category: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrainLabels {
    /// started | blocked_by_pdb | finished | timed_out
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    /// Succeeded | Failed | Skipped
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MutationLabels {
    /// `aws` or `kubernetes`.
    pub target: &'static str,
    pub action: &'static str,
    /// performed | dry_run | failed | refused_not_leader
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterruptionLabels {
    /// The notice's kind, or why it was not one (malformed, unknown_kind, ...).
    pub kind: &'static str,
    /// acted | ignored | rejected | foreign_deleted | foreign_left | unknown_left | unjoined_left | failed
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AwsCallLabels {
    /// The API operation, e.g. DescribeAutoScalingGroups.
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AwsErrorLabels {
    pub operation: &'static str,
    /// throttled | refused (any other AWS error code) | no_response (a
    /// timeout, a connection failure, a request fenced off)
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    pub namespace: String,
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub namespace: String,
    pub group: String,
    /// refresh | replenish
    pub operation: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub aws_calls: Family<AwsCallLabels, Counter>,
    pub aws_call_errors: Family<AwsErrorLabels, Counter>,
    pub group_ready_nodes: Family<GroupLabels, Gauge>,
    pub group_desired_nodes: Family<GroupLabels, Gauge>,
    pub group_drifted_nodes: Family<GroupLabels, Gauge>,
    pub group_operation: Family<OperationLabels, Gauge>,
    pub group_fallback_nodes: Family<GroupLabels, Gauge>,
    pub on_demand_seconds: Family<GroupLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    pub group_state: Family<groups::StateLabels, Gauge>,
    pub group_condition: Family<groups::ConditionLabels, Gauge>,
    pub group_cost_dollars: Family<cost::CostLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub group_instance_hours: Family<cost::CostLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The reason each troubled condition's series carries now.
    troubles_set:
        std::sync::Mutex<std::collections::HashMap<(String, String, &'static str), String>>,
    /// When each group's fallback instances were last counted (the
    /// on-demand seconds run from there).
    fallback_counted: std::sync::Mutex<std::collections::HashMap<GroupLabels, std::time::Instant>>,
    pub refresh_run_duration: Family<RunLabels, Histogram>,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    pub mutations: Family<MutationLabels, Counter>,
    pub drains: Family<DrainLabels, Counter>,
    pub node_repairs: Family<RepairLabels, Counter>,
    pub refresh_runs: Family<RunLabels, Counter>,
    pub refresh_runs_started: Counter,
    pub node_replacement_duration: Histogram,
    pub interruption_messages: Family<InterruptionLabels, Counter>,
    pub interruption_age: Histogram,
    pub leader: Gauge,
    pub controller_restarts: Counter,
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~40 s
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Self {
            registry: Registry::with_prefix("spot_node_manager"),
            aws_calls: Family::default(),
            aws_call_errors: Family::default(),
            group_ready_nodes: Family::default(),
            group_desired_nodes: Family::default(),
            group_drifted_nodes: Family::default(),
            group_operation: Family::default(),
            group_state: Family::default(),
            group_condition: Family::default(),
            group_cost_dollars: Family::default(),
            group_instance_hours: Family::default(),
            troubles_set: Default::default(),
            group_fallback_nodes: Family::default(),
            on_demand_seconds: Family::default(),
            fallback_counted: Default::default(),
            // 1 min .. ~17 h: a run replaces nodes one at a time.
            refresh_run_duration: Family::new_with_constructor(
                (|| Histogram::new(exponential_buckets(60.0, 2.0, 11))) as fn() -> Histogram,
            ),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(
                duration_histogram as fn() -> Histogram,
            ),
            mutations: Family::default(),
            drains: Family::default(),
            node_repairs: Family::default(),
            refresh_runs: Family::default(),
            refresh_runs_started: Counter::default(),
            // 10 s .. ~3 h: a drain plus a new node becoming Ready.
            node_replacement_duration: Histogram::new(exponential_buckets(10.0, 2.0, 11)),
            interruption_messages: Family::default(),
            // 50 ms .. ~7 min: from AWS emitting a notice to its node marked.
            interruption_age: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            leader: Gauge::default(),
            controller_restarts: Counter::default(),
        };
        metrics.register();
        metrics.zero_what_alerts_count();
        metrics
    }
}

/// Every AWS operation the manager calls (`AwsCloud`, the queue): each
/// one's error series exists at 0 from the start (a test checks the list
/// against the calls in `src/cloud`).
pub const AWS_OPERATIONS: [&str; 15] = [
    "CompleteLifecycleAction",
    "DeleteMessage",
    "DescribeAutoScalingGroups",
    "DescribeInstances",
    "DescribeLaunchTemplates",
    "DescribeLifecycleHooks",
    "DescribeScalingActivities",
    "DescribeSpotPriceHistory",
    "DescribeWarmPool",
    "GetProducts",
    "GetQueueAttributes",
    "ReceiveMessage",
    "RecordLifecycleActionHeartbeat",
    "SetDesiredCapacity",
    "TerminateInstanceInAutoScalingGroup",
];

/// The kinds an AWS request fails by (`Metrics::aws_call_failed`).
const THROTTLED: &str = "throttled";
const REFUSED: &str = "refused";
const NO_RESPONSE: &str = "no_response";
const AWS_ERROR_KINDS: [&str; 3] = [THROTTLED, REFUSED, NO_RESPONSE];

impl Metrics {
    /// Registers every series with its name and help, by concern.
    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "aws_calls",
            "Every AWS request, pages and failures included, per API operation: the API budget the manager spends",
            self.aws_calls.clone(),
        );
        r.register(
            "aws_call_errors",
            "AWS requests that failed, per operation and kind: throttled, refused (any other AWS error code), or no_response (a timeout, a connection failure, a request fenced off after leadership was lost)",
            self.aws_call_errors.clone(),
        );
        r.register(
            "group_ready_nodes",
            "Ready nodes of each NodeGroup, as its inventory last counted",
            self.group_ready_nodes.clone(),
        );
        r.register(
            "group_desired_nodes",
            "Desired Ready nodes of each NodeGroup (its spec.desired)",
            self.group_desired_nodes.clone(),
        );
        r.register(
            "group_drifted_nodes",
            "Drifted nodes of each NodeGroup (status.driftedNodes): on an old launch template version, or marked kops.k8s.io/needs-update",
            self.group_drifted_nodes.clone(),
        );
        r.register(
            "group_operation",
            "1 while that operation (refresh or replenish) holds the NodeGroup's lock",
            self.group_operation.clone(),
        );
        r.register(
            "group_fallback_nodes",
            "Instances (InService or Pending) on each NodeGroup's on-demand fallback ASGs (spec.fallback)",
            self.group_fallback_nodes.clone(),
        );
        r.register(
            "on_demand_instance_seconds",
            "Instance-seconds spent on each NodeGroup's on-demand fallback, as its inventory counts them: what the fallback cost",
            self.on_demand_seconds.clone(),
        );
        self.register_runs();
        self.register_controllers();
        self.register_group_state();
        self.register_cost();
    }

    /// Refresh runs, drains and interruptions.
    fn register_runs(&mut self) {
        let r = &mut self.registry;
        r.register(
            "refresh_run_duration_seconds",
            "Seconds from a refresh run's start to its end, per result (Succeeded, Failed, Skipped)",
            self.refresh_run_duration.clone(),
        );
        r.register(
            "drains",
            "Drain steps, per outcome: started, blocked_by_pdb, throttled (a 429 without the eviction API's DisruptionBudget cause), finished, timed_out",
            self.drains.clone(),
        );
        r.register(
            "node_repairs",
            "Unhealthy nodes terminated by a repair (repaired) or a refresh (refreshed), and circuit-breaker episodes that held repairs back (blocked)",
            self.node_repairs.clone(),
        );
        r.register(
            "refresh_runs",
            "Refresh runs ended, per result (Succeeded, Failed, Skipped)",
            self.refresh_runs.clone(),
        );
        r.register(
            "refresh_runs_started",
            "Refresh runs and drift rolls started",
            self.refresh_runs_started.clone(),
        );
        r.register(
            "node_replacement_duration_seconds",
            "Seconds from the start of a node's drain to its replacement being Ready",
            self.node_replacement_duration.clone(),
        );
        r.register(
            "interruption_messages",
            "Interruption queue messages handled, per notice kind and outcome: acted, unmanaged (a node no NodeGroup lists, drained), ignored, rejected (unreadable), foreign_deleted, foreign_left, unknown_left (not recorded by the inventory yet: left for a minute), unjoined_left (ours, its Node not joined yet: left until the drain deadline), failed",
            self.interruption_messages.clone(),
        );
        r.register(
            "interruption_age_at_action_seconds",
            "Seconds from a notice's AWS time to its node cordoned and tainted",
            self.interruption_age.clone(),
        );
    }

    /// Reconciles, mutations, leadership and restarts.
    fn register_controllers(&mut self) {
        let r = &mut self.registry;
        r.register(
            "reconciles",
            "Reconciles run, per controller: inventory, replenisher, refresher, interruption-drain",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconciles that failed, per controller and error category (panic for a contained panic; a safety check that refused a mutation is named by its check, e.g. refused_too_few_ready, refused_other_masters_down)",
            self.reconcile_errors.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Seconds a reconcile took, per controller",
            self.reconcile_duration.clone(),
        );
        r.register(
            "mutations",
            "Every mutation through the one gate, per target (aws, kubernetes), action and outcome (performed, dry_run, failed, refused_not_leader)",
            self.mutations.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader lease",
            self.leader.clone(),
        );
        r.register(
            "controller_restarts",
            "Times the controllers stopped by themselves and were restarted (after a backoff)",
            self.controller_restarts.clone(),
        );
    }
}

impl Metrics {
    /// The counters the alerts read, at 0 from the start: a counter that
    /// came into being at its first increment shows no `increase()` for
    /// it, so the first failure after each start would never fire.
    fn zero_what_alerts_count(&self) {
        for result in crate::crd::refresher::RunResult::ALL {
            let result = result.label();
            let _ = self.refresh_runs.get_or_create(&RunLabels { result });
        }
        let kinds = crate::crd::nodegroup::NoticeClass::ALL
            .map(|c| c.label())
            .into_iter()
            .chain([crate::crd::nodegroup::NoticeClass::Unknown.label()]);
        for kind in kinds {
            let outcome = "failed";
            let _ = self
                .interruption_messages
                .get_or_create(&InterruptionLabels { kind, outcome });
        }
        for operation in AWS_OPERATIONS {
            let _ = self.aws_calls.get_or_create(&AwsCallLabels { operation });
            for kind in AWS_ERROR_KINDS {
                let _ = self
                    .aws_call_errors
                    .get_or_create(&AwsErrorLabels { operation, kind });
            }
        }
    }

    /// Leadership lost: the per-group series go (the new leader's are the
    /// ones that move; a follower's last values kept would be read beside
    /// them, a stale Ready count hiding a group below desired). Each group
    /// observed is forgotten as a deleted one is: every observation stamps
    /// its fallback clock, so those are the groups exported.
    pub fn groups_unled(&self) {
        let observed: Vec<GroupLabels> = self
            .fallback_counted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for group in observed {
            self.group_forgotten(&group.namespace, &group.group);
        }
    }

    /// Creates a controller's series at zero so they are scraped before its
    /// first reconcile.
    pub fn register_controller(&self, controller: &'static str) {
        let labels = ControllerLabels { controller };
        let _ = self.reconciles.get_or_create(&labels);
        let _ = self.reconcile_duration.get_or_create(&labels);
    }

    pub fn reconciled(
        &self,
        controller: &'static str,
        took: Duration,
        error_category: Option<&'static str>,
    ) {
        let labels = ControllerLabels { controller };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if let Some(category) = error_category {
            self.reconcile_errors
                .get_or_create(&ErrorLabels {
                    controller,
                    category,
                })
                .inc();
        }
    }

    pub fn interruption_message(&self, kind: &'static str, outcome: &'static str) {
        self.interruption_messages
            .get_or_create(&InterruptionLabels { kind, outcome })
            .inc();
    }

    pub fn interruption_age(&self, age: Duration) {
        self.interruption_age.observe(age.as_secs_f64());
    }

    pub fn refresh_run(&self, result: crate::crd::refresher::RunResult) {
        let result = result.label();
        self.refresh_runs.get_or_create(&RunLabels { result }).inc();
    }

    pub fn aws_call(&self, operation: &'static str) {
        self.aws_calls
            .get_or_create(&AwsCallLabels { operation })
            .inc();
    }

    /// A failed AWS request, by what kind of failure it was.
    pub fn aws_call_failed(&self, operation: &'static str, code: Option<&str>) {
        let kind = match code {
            _ if crate::error::is_aws_throttling(code) => THROTTLED,
            Some(_) => REFUSED,
            None => NO_RESPONSE,
        };
        self.aws_call_errors
            .get_or_create(&AwsErrorLabels { operation, kind })
            .inc();
    }

    /// A group's counts and lock, as its inventory just wrote them.
    pub fn group_observed(
        &self,
        namespace: &str,
        group: &str,
        status: &crate::crd::NodeGroupStatus,
    ) {
        use crate::crd::nodegroup::OperationKind;
        let labels = GroupLabels {
            namespace: namespace.to_string(),
            group: group.to_string(),
        };
        self.group_ready_nodes
            .get_or_create(&labels)
            .set(i64::from(status.ready_nodes.unwrap_or(0)));
        self.group_desired_nodes
            .get_or_create(&labels)
            .set(i64::from(status.desired_nodes.unwrap_or(0)));
        self.group_drifted_nodes
            .get_or_create(&labels)
            .set(i64::from(status.drifted_nodes.unwrap_or(0)));
        let fallback: i32 = status
            .auto_scaling_groups
            .iter()
            .filter(|a| a.fallback)
            .map(|a| a.instances)
            .sum();
        self.group_fallback_nodes
            .get_or_create(&labels)
            .set(i64::from(fallback));
        // The instances counted now ran since the last count (at most a
        // resync ago): the on-demand seconds, as far as the inventory sees.
        let now = std::time::Instant::now();
        let last = self
            .fallback_counted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(labels.clone(), now);
        let seconds = last.map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        self.on_demand_seconds
            .get_or_create(&labels)
            .inc_by(seconds * f64::from(fallback.max(0)));
        let held = status.operation.as_ref().map(|l| &l.holder);
        for (operation, kind) in [
            ("refresh", OperationKind::Refresh),
            ("replenish", OperationKind::Replenish),
        ] {
            self.group_operation
                .get_or_create(&OperationLabels {
                    namespace: namespace.to_string(),
                    group: group.to_string(),
                    operation,
                })
                .set(i64::from(held == Some(&kind)));
        }
        self.group_state_observed(namespace, group, status);
        self.cost_observed(namespace, group, status.cost.as_ref());
    }

    /// A deleted group's series go with it.
    pub fn group_forgotten(&self, namespace: &str, group: &str) {
        let labels = GroupLabels {
            namespace: namespace.to_string(),
            group: group.to_string(),
        };
        self.group_ready_nodes.remove(&labels);
        self.group_desired_nodes.remove(&labels);
        self.group_drifted_nodes.remove(&labels);
        self.group_fallback_nodes.remove(&labels);
        self.on_demand_seconds.remove(&labels);
        self.fallback_counted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&labels);
        for operation in ["refresh", "replenish"] {
            self.group_operation.remove(&OperationLabels {
                namespace: namespace.to_string(),
                group: group.to_string(),
                operation,
            });
        }
        self.group_state_forgotten(namespace, group);
        self.cost_forgotten(namespace, group);
    }

    pub fn node_repair(&self, outcome: &'static str) {
        self.node_repairs
            .get_or_create(&RepairLabels { outcome })
            .inc();
    }

    pub fn drain(&self, outcome: &'static str) {
        self.drains.get_or_create(&DrainLabels { outcome }).inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_gauges_follow_its_status_and_go_with_it() {
        use crate::crd::nodegroup::{OperationKind, OperationLock};
        let m = Metrics::default();
        let mut status = crate::crd::NodeGroupStatus {
            ready_nodes: Some(2),
            desired_nodes: Some(3),
            drifted_nodes: Some(1),
            ..Default::default()
        };
        status.operation = Some(OperationLock {
            holder: OperationKind::Replenish,
            holder_name: "workers".into(),
            since: chrono::Utc::now(),
        });
        m.group_observed("ns", "workers", &status);
        let text = m.encode();
        for line in [
            r#"spot_node_manager_group_ready_nodes{namespace="ns",group="workers"} 2"#,
            r#"spot_node_manager_group_desired_nodes{namespace="ns",group="workers"} 3"#,
            r#"spot_node_manager_group_drifted_nodes{namespace="ns",group="workers"} 1"#,
            r#"spot_node_manager_group_operation{namespace="ns",group="workers",operation="replenish"} 1"#,
            r#"spot_node_manager_group_operation{namespace="ns",group="workers",operation="refresh"} 0"#,
        ] {
            assert!(text.contains(line), "no {line} in:\n{text}");
        }
        m.group_forgotten("ns", "workers");
        assert!(!m.encode().contains(r#"group="workers""#), "{}", m.encode());
    }

    #[test]
    fn aws_failures_are_counted_by_kind() {
        let m = Metrics::default();
        m.aws_call_failed("DescribeInstances", Some("RequestLimitExceeded"));
        m.aws_call_failed("DescribeInstances", Some("InvalidInstanceID.Malformed"));
        m.aws_call_failed("DescribeInstances", None);
        let text = m.encode();
        for kind in ["throttled", "refused", "no_response"] {
            let line = format!(
                r#"spot_node_manager_aws_call_errors_total{{operation="DescribeInstances",kind="{kind}"}} 1"#
            );
            assert!(text.contains(&line), "no {line} in:\n{text}");
        }
    }

    #[test]
    fn reconcile_metrics_are_labelled_by_controller_and_category() {
        let m = Metrics::default();
        m.reconciled("inventory", Duration::from_millis(20), None);
        m.reconciled(
            "inventory",
            Duration::from_millis(30),
            Some("kube_conflict"),
        );
        let text = m.encode();
        assert!(
            text.contains(r#"spot_node_manager_reconciles_total{controller="inventory"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"spot_node_manager_reconcile_errors_total{controller="inventory",category="kube_conflict"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"spot_node_manager_reconcile_duration_seconds_count{controller="inventory"} 2"#
            ),
            "{text}"
        );
    }

    /// The first failure after a start fires its alert: `increase()` sees
    /// 0 then 1, because each counter an alert reads is scraped at 0 before
    /// anything has failed (the promtool cases in tests/fixtures/
    /// alerts_test.yaml start from there).
    #[test]
    fn what_the_alerts_count_is_at_zero_from_the_start() {
        let text = Metrics::default().encode();
        for line in [
            r#"spot_node_manager_refresh_runs_total{result="Failed"} 0"#,
            r#"spot_node_manager_refresh_runs_total{result="Succeeded"} 0"#,
            r#"spot_node_manager_interruption_messages_total{kind="spot_interruption",outcome="failed"} 0"#,
            r#"spot_node_manager_interruption_messages_total{kind="unknown",outcome="failed"} 0"#,
            r#"spot_node_manager_aws_call_errors_total{operation="SetDesiredCapacity",kind="refused"} 0"#,
            r#"spot_node_manager_aws_calls_total{operation="SetDesiredCapacity"} 0"#,
        ] {
            assert!(text.contains(line), "no {line} in:\n{text}");
        }
    }

    /// Every operation `src/cloud` counts is in `AWS_OPERATIONS`: a call
    /// added without it would have no zero to rise from.
    #[test]
    fn every_aws_operation_called_is_zeroed_from_the_start() {
        fn sources(dir: &std::path::Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).expect("a source folder") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(std::fs::read_to_string(&path).expect("a source file"));
                }
            }
        }
        let mut files = vec![];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cloud");
        sources(&dir, &mut files);
        let mut called = std::collections::BTreeSet::new();
        for source in &files {
            for call in ["count(\"", "failed(\"", "aws_call(\""] {
                for (at, _) in source.match_indices(call) {
                    let rest = &source[at + call.len()..];
                    let name = rest.split('"').next().unwrap_or_default();
                    called.insert(name.to_string());
                }
            }
        }
        assert!(called.len() >= 10, "the scan found the calls: {called:?}");
        let zeroed: std::collections::BTreeSet<String> =
            AWS_OPERATIONS.iter().map(|o| o.to_string()).collect();
        assert_eq!(called, zeroed);
    }

    /// A replica that lost the lease exports no group's series (its last
    /// values would be read beside the leader's), and keeps the rest.
    #[test]
    fn a_replica_that_stops_leading_exports_no_group_series() {
        let m = Metrics::default();
        let status = crate::crd::NodeGroupStatus {
            ready_nodes: Some(3),
            desired_nodes: Some(3),
            ..Default::default()
        };
        m.group_observed("ns", "workers", &status);
        m.leader.set(1);
        assert!(m.encode().contains(r#"group="workers""#));
        m.leader.set(0);
        m.groups_unled();
        let text = m.encode();
        assert!(!text.contains("group="), "{text}");
        assert!(text.contains("spot_node_manager_leader 0"), "{text}");
        assert!(
            text.contains(r#"spot_node_manager_refresh_runs_total{result="Failed"} 0"#),
            "{text}"
        );
        // Leading again, the groups come back as the inventory counts them.
        m.group_observed("ns", "workers", &status);
        assert!(
            m.encode().contains(
                r#"spot_node_manager_group_ready_nodes{namespace="ns",group="workers"} 3"#
            )
        );
    }
}
