//! Helpers for refresh tests and the refresh benchmark: groups with a
//! refresh due in seconds, a sampler of Ready nodes and capacity, and
//! instance accounting in moto.

use crate::coverage::{Coverage, Sampled, wait_after_end, wait_first};
use crate::sim::SIM_ACCOUNT_LABEL;
use crate::{World, assert_eventually};
use chrono::{Datelike, Timelike, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use spot_node_manager::crd::{NodeGroup, Refresher};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const WAIT: Duration = Duration::from_secs(90);
pub const RUN: Duration = Duration::from_secs(240);
pub const FAST: Duration = Duration::from_millis(300);

/// NodeGroup `name` over `asgs`, replenishing after a 1 s cooldown.
pub fn group(name: &str, role: &str, asgs: &[String], desired: i32) -> NodeGroup {
    let replenish = serde_json::json!({"replenish": {"cooldown": "1s"}});
    node_group(name, role, asgs, desired, replenish)
}

/// NodeGroup `name` over `asgs` with `desired` nodes, and the fields of
/// `extra` set in its spec (each replacing the field of that name).
pub fn node_group(
    name: &str,
    role: &str,
    asgs: &[String],
    desired: impl Into<serde_json::Value>,
    extra: serde_json::Value,
) -> NodeGroup {
    let asgs: Vec<_> = asgs
        .iter()
        .map(|a| serde_json::json!({"name": a}))
        .collect();
    let mut spec =
        serde_json::json!({"role": role, "autoScalingGroups": asgs, "desired": desired.into()});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("NodeGroup {name}: {e}"))
}

/// NodeGroup `workers` over `asgs` with `desired` nodes, replenishing
/// after a 1 s cooldown, a launch given `join_timeout` to join.
pub fn workers_joining_within(asgs: &[String], desired: i32, join_timeout: &str) -> NodeGroup {
    let replenish =
        serde_json::json!({"replenish": {"cooldown": "1s", "joinTimeout": join_timeout}});
    node_group("workers", "Worker", asgs, desired, replenish)
}

/// A cron expression (with seconds and year) that fires once, `secs` from now.
pub fn once_in(secs: i64) -> String {
    let t = Utc::now() + chrono::Duration::seconds(secs);
    format!(
        "{} {} {} {} {} * {}",
        t.second(),
        t.minute(),
        t.hour(),
        t.day(),
        t.month(),
        t.year()
    )
}

/// Turns refresh on for the group, due a few seconds from now. A one-off
/// schedule the manager first sees after its time never fires (a new cron
/// does not catch up), which a loaded machine can make happen: it is set
/// again, due a few seconds from then, until the Refresher has it ahead.
pub async fn schedule_refresh(world: &World, name: &str, extra: serde_json::Value) {
    for _ in 0..5 {
        let since = Utc::now() - chrono::Duration::seconds(1);
        let Some(key) = set_refresh(world, name, extra.clone()).await else {
            return;
        };
        if !schedule_missed(world, name, &key, since).await {
            return;
        }
    }
    panic!("the manager saw every one-off schedule of {name} only after its time");
}

/// Whether the Refresher took the schedule `key` only after its time: no
/// next run, none under way, none since `since`. False when it has it
/// ahead, or says nothing of it within a while (no manager running yet).
async fn schedule_missed(
    world: &World,
    name: &str,
    key: &str,
    since: chrono::DateTime<Utc>,
) -> bool {
    let refreshers: Api<Refresher> = world.api();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        let status = refreshers.get(name).await.ok().and_then(|r| r.status);
        if let Some(st) = status.filter(|st| st.next_run_from.as_deref() == Some(key)) {
            let ran = st.last_run.as_ref().is_some_and(|r| r.started >= since);
            return st.next_run.is_none() && st.run_start.is_none() && !ran;
        }
        tokio::time::sleep(FAST).await;
    }
    false
}

/// Patches the group's refresh; the Refresher's schedule key for it, or
/// None when `extra` brings a schedule of its own.
async fn set_refresh(world: &World, name: &str, extra: serde_json::Value) -> Option<String> {
    let own_schedule = extra.get("schedule").is_some();
    let mut refresh = serde_json::json!({
        // 6 s ahead: with 3 s, a full run under load (load average 20 on
        // 2 cores) saw every one of five attempts only after its time.
        "schedule": once_in(6),
        "timeZone": "UTC",
        // A drain paced by a budget waits for each moved pod to be Ready
        // elsewhere: under the full suite's load 30 s ran out (seen in CI);
        // the tests of the timeout itself set their own.
        "drainTimeout": "2m",
        "readyTimeout": "60s",
        // The tests compress time: a validated replacement holds for a
        // second, not the default five.
        "settleTime": "1s",
    });
    if let (Some(r), Some(e)) = (refresh.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    let groups: Api<NodeGroup> = world.api();
    groups
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"refresh": refresh}})),
        )
        .await
        .expect("schedule refresh");
    let schedule = refresh.get("schedule")?.as_str()?;
    let zone = refresh.get("timeZone")?.as_str()?;
    (!own_schedule).then(|| format!("{schedule} in {zone}"))
}

/// The group's nodes, oldest first (launch time, then name): the order a
/// refresh replaces them in, the reverse of the one a scale-in removes them in.
pub async fn nodes_oldest_first(groups: &Api<NodeGroup>, name: &str) -> Vec<String> {
    let mut by_age: Vec<(Option<chrono::DateTime<chrono::Utc>>, String)> = groups
        .get(name)
        .await
        .expect("group")
        .status
        .expect("status")
        .nodes
        .into_iter()
        .map(|n| (n.launch_time, n.name))
        .collect();
    by_age.sort();
    by_age.into_iter().map(|(_, n)| n).collect()
}

pub async fn ready_count(groups: &Api<NodeGroup>, name: &str) -> Option<i32> {
    groups.get(name).await.ok()?.status?.ready_nodes
}

/// What a sampler saw while a refresh ran. Its figures are read through
/// methods that first assert the sampler looked all through the period
/// ([`Coverage::assert_looked`]): a minimum over one sample, or over none,
/// proves nothing.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    coverage: Coverage,
    /// Fewest Nodes Ready whose instance was in service in one of the ASGs.
    min_ready: Option<i32>,
    /// Most desired capacity summed over the ASGs.
    max_desired: i32,
    /// Instance-seconds above `baseline` instances (the surplus used).
    extra_instance_secs: f64,
    /// Most Nodes of in-service instances cordoned at once (being drained).
    max_cordoned: usize,
}

impl Sampled for Samples {
    fn coverage(&mut self) -> &mut Coverage {
        &mut self.coverage
    }
}

impl Samples {
    /// The fewest Ready nodes of in-service instances seen at once.
    pub fn min_ready(&self) -> i32 {
        self.coverage.assert_looked("Ready nodes");
        self.min_ready.unwrap_or_default()
    }

    /// The most desired capacity (summed over the ASGs) seen.
    pub fn max_desired(&self) -> i32 {
        self.coverage.assert_looked("desired capacity");
        self.max_desired
    }

    /// Instance-seconds above the baseline.
    pub fn extra_instance_secs(&self) -> f64 {
        self.coverage.assert_looked("instances above the baseline");
        self.extra_instance_secs
    }

    /// The most cordoned nodes of in-service instances seen at once.
    pub fn max_cordoned(&self) -> usize {
        self.coverage.assert_looked("cordoned nodes");
        self.max_cordoned
    }

    /// Samples taken.
    pub fn count(&self) -> usize {
        self.coverage.count
    }
}

/// Samples, every 250 ms, the Ready Nodes whose instance is InService in the
/// group's ASGs (a Node of a terminated instance does not count, however
/// long its kubelet takes to go), and the ASGs' total desired count.
/// A running sampler; `stop` ends it and returns what it saw.
pub struct Sampler {
    samples: Arc<Mutex<Samples>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Ends the period, waits for a sample after it, and stops.
    pub async fn stop(self) -> Samples {
        wait_after_end(&self.samples).await;
        self.task.abort();
        self.samples.lock().expect("samples").clone()
    }
}

/// `baseline`: the instance count the group has outside a run. Returns
/// once the first sample is taken, so it precedes what the caller does
/// next.
pub async fn sample(world: &World, asgs: &[String], baseline: i32) -> Sampler {
    let samples = Arc::new(Mutex::new(Samples::default()));
    let nodes: Api<Node> = Api::all(world.client.clone());
    let autoscaling = world.aws.autoscaling.clone();
    let asgs = asgs.to_vec();
    let selector = format!("{SIM_ACCOUNT_LABEL}={}", world.account);
    let out = samples.clone();
    let task = tokio::spawn(async move {
        let mut last = Instant::now();
        loop {
            let described = autoscaling
                .describe_auto_scaling_groups()
                .set_auto_scaling_group_names(Some(asgs.clone()))
                .send()
                .await;
            let listed = nodes.list(&ListParams::default().labels(&selector)).await;
            let (described, listed) = match (described, listed) {
                (Ok(d), Ok(l)) => (d, l),
                (described, listed) => {
                    let why = match (described, listed) {
                        (Err(e), _) => {
                            aws_sdk_autoscaling::error::DisplayErrorContext(&e).to_string()
                        }
                        (_, Err(e)) => e.to_string(),
                        _ => String::new(),
                    };
                    out.lock().expect("samples").coverage.failed(why);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            };
            // Members not on their way out: a Node whose instance the ASG
            // still calls Pending serves pods all the same, and under a
            // loaded emulator Pending can outlast the Node's Ready.
            let in_service: BTreeSet<String> = described
                .auto_scaling_groups()
                .iter()
                .flat_map(|g| g.instances())
                .filter(|i| {
                    i.lifecycle_state().is_some_and(|s| {
                        s.as_str() == "InService" || s.as_str().starts_with("Pending")
                    })
                })
                .filter_map(|i| i.instance_id().map(str::to_string))
                .collect();
            let desired: i32 = described
                .auto_scaling_groups()
                .iter()
                .map(|g| g.desired_capacity().unwrap_or(0))
                .sum();
            let ready = listed
                .items
                .iter()
                .filter(|n| is_ready(n))
                .filter(|n| instance_of(n).is_some_and(|i| in_service.contains(&i)))
                .count() as i32;
            let cordoned = listed
                .items
                .iter()
                .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
                .filter(|n| instance_of(n).is_some_and(|i| in_service.contains(&i)))
                .count();
            let active = described
                .auto_scaling_groups()
                .iter()
                .flat_map(|g| g.instances())
                .filter(|i| {
                    i.lifecycle_state()
                        .is_some_and(|s| !s.as_str().starts_with("Terminat"))
                })
                .count() as i32;
            let now = Instant::now();
            {
                let mut s = out.lock().expect("samples");
                s.extra_instance_secs +=
                    f64::from((active - baseline).max(0)) * (now - last).as_secs_f64();
                s.coverage.sampled(now);
                s.min_ready = Some(s.min_ready.map_or(ready, |m| m.min(ready)));
                s.max_desired = s.max_desired.max(desired);
                s.max_cordoned = s.max_cordoned.max(cordoned);
            }
            last = now;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    wait_first(&samples).await;
    Sampler { samples, task }
}

pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn instance_of(node: &Node) -> Option<String> {
    let id = node.spec.as_ref()?.provider_id.as_ref()?;
    Some(id.rsplit('/').next()?.to_string())
}

/// The account's instances in state terminated.
pub async fn terminated_instances(world: &World) -> BTreeSet<String> {
    instances_by_state(world)
        .await
        .remove("terminated")
        .unwrap_or_default()
}

/// Waits for every ASG back at `before`'s desired counts (an
/// `asg_snapshot`) with no extra instance in any.
pub async fn layout_back(world: &World, asgs: &[String], before: &[(String, i32, Vec<String>)]) {
    let wanted = desired_counts(before);
    assert_eventually("the layout back", RUN, || async {
        let after = world.asg_snapshot(asgs).await;
        (desired_counts(&after) == wanted
            && after.iter().all(|(_, d, ids)| ids.len() == *d as usize))
        .then_some(())
    })
    .await;
}

/// Instance ids of the account's instances in each EC2 state.
pub async fn instances_by_state(world: &World) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let described = world
        .aws
        .ec2
        .describe_instances()
        .send()
        .await
        .expect("describe instances");
    for r in described.reservations() {
        for i in r.instances() {
            let state = i
                .state()
                .and_then(|s| s.name())
                .map(|n| n.as_str().to_string())
                .unwrap_or_default();
            if let Some(id) = i.instance_id() {
                out.entry(state).or_default().insert(id.to_string());
            }
        }
    }
    out
}

pub async fn all_instances(world: &World, asgs: &[String]) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for a in asgs {
        all.extend(world.asg_instances(a).await);
    }
    all
}

/// Waits for the run to end and returns the Refresher.
pub async fn run_finished(world: &World, name: &str) -> Refresher {
    run_finished_within(world, name, RUN).await
}

/// The same, for a run that may take up to `within` (a large group).
pub async fn run_finished_within(world: &World, name: &str, within: Duration) -> Refresher {
    let refreshers: Api<Refresher> = world.api();
    assert_eventually("the refresh run to end", within, || async {
        let rf = refreshers.get(name).await.ok()?;
        let status = rf.status.as_ref()?;
        (status.last_run.is_some() && status.run_start.is_none()).then_some(rf)
    })
    .await
}

/// A Pod on each node, so every drain has something to evict. Each has a
/// controller (a ConfigMap stands in for a ReplicaSet: it exists, so the
/// garbage collector keeps the pods): a pod nothing would recreate protects
/// its node from a refresh (`spec.disruption.evictUnmanagedPods`).
pub async fn pods_on(world: &World, nodes: &[String]) {
    labelled_pods_on(world, nodes, "app", &[("app", "web")]).await
}

/// [`pods_on`], the pods named `{prefix}-{i}` and labelled `labels` (say,
/// for a budget to select them).
pub async fn labelled_pods_on(
    world: &World,
    nodes: &[String],
    prefix: &str,
    labels: &[(&str, &str)],
) {
    let reference = app_owner(world).await;
    let pods: Api<Pod> = world.api();
    for (i, node) in nodes.iter().enumerate() {
        let mut pod = super::bound_pod(&format!("{prefix}-{i}"), node, labels);
        pod.metadata.owner_references = Some(vec![reference.clone()]);
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }
}

/// A controller owner reference for test pods (ConfigMap `app-owner`,
/// created on first use), so that drains treat them as managed.
pub async fn app_owner(
    world: &World,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    let owners: Api<k8s_openapi::api::core::v1::ConfigMap> = world.api();
    let owner = match owners
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "app-owner"}}))
                .expect("configmap"),
        )
        .await
    {
        Ok(owner) => owner,
        // Called again in the same world: the owner is there already.
        Err(_) => owners.get("app-owner").await.expect("the pods' owner"),
    };
    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "app-owner".into(),
        uid: owner.metadata.uid.unwrap_or_default(),
        controller: Some(true),
        ..Default::default()
    }
}

pub async fn node_names(world: &World, instances: &BTreeSet<String>) -> Vec<String> {
    let nodes: Api<Node> = Api::all(world.client.clone());
    let selector = format!("{SIM_ACCOUNT_LABEL}={}", world.account);
    nodes
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("nodes")
        .items
        .into_iter()
        .filter(|n| instance_of(n).is_some_and(|i| instances.contains(&i)))
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// How many times an Event with `reason` was recorded (repeats of the same
/// Event are a series on one object).
pub async fn event_count(world: &World, reason: &str) -> i32 {
    events_with_reason(world, reason)
        .await
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// Waits until an Event with `reason` was recorded: Events are sent after
/// the status writes a test reads, so reading them once races.
pub async fn assert_event(world: &World, reason: &str) {
    crate::cluster::assert_events(world, &[reason]).await;
}

/// The world's Events with `reason`.
pub async fn events_with_reason(
    world: &World,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let events: Api<k8s_openapi::api::events::v1::Event> = world.api();
    events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// The Refresher's status, asserting its last run succeeded (with the
/// manager's log when it did not).
pub fn assert_run_succeeded(
    rf: Refresher,
    manager: &super::ManagerProcess,
) -> spot_node_manager::crd::RefresherStatus {
    let status = rf.status.expect("status");
    let last = status.last_run.as_ref().expect("last run");
    assert_eq!(
        last.result,
        spot_node_manager::crd::refresher::RunResult::Succeeded,
        "{last:?}\n{}",
        manager.logs_for_failure(60)
    );
    status
}

/// The end of a three-worker run (surplus 1) that a killed manager left to
/// `manager`: it succeeds with the 3 old nodes replaced, never below 3 Ready,
/// each old node terminated once plus the one surplus, and every ASG back at
/// its desired count in `before` (an `asg_snapshot` taken before the run).
pub async fn assert_taken_over_run_finished(
    world: &World,
    asgs: &[String],
    manager: &super::ManagerProcess,
    sampler: Sampler,
    original: &BTreeSet<String>,
    before: &[(String, i32, Vec<String>)],
) {
    let rf = run_finished(world, "workers").await;
    let samples = sampler.stop().await;
    let last = assert_run_succeeded(rf, manager)
        .last_run
        .expect("last run");
    assert_eq!(last.replaced, 3, "every old node replaced, once");
    assert_eq!(samples.min_ready(), 3, "{samples:?}");
    let terminated = terminated_instances(world).await;
    assert!(original.is_subset(&terminated), "{terminated:?}");
    assert_eq!(
        terminated.len(),
        4,
        "the three old nodes and the one surplus, nothing twice: {terminated:?}"
    );
    let after = world.asg_snapshot(asgs).await;
    assert_eq!(desired_counts(&after), desired_counts(before));
}

/// (ASG, desired) of an `asg_snapshot`.
pub fn desired_counts(snapshot: &[(String, i32, Vec<String>)]) -> Vec<(String, i32)> {
    snapshot.iter().map(|(n, d, _)| (n.clone(), *d)).collect()
}

/// The wording of the scaling activity AWS writes for each termination.
const TERMINATING: &str = "Terminating EC2 instance: ";

/// Checks that AWS chose no victim: every termination among the ASGs'
/// scaling activity `descriptions` is one the manager asked for, by
/// instance, in its `plain_log`; and that at least `terminated` were
/// checked, one per instance terminated (an activity wording the check no
/// longer recognises would otherwise check nothing). How many were checked.
pub fn check_terminations_chosen(
    descriptions: &[String],
    plain_log: &str,
    terminated: usize,
) -> Result<usize, String> {
    let mut checked = 0;
    for id in descriptions
        .iter()
        .filter_map(|d| d.strip_prefix(TERMINATING))
    {
        checked += 1;
        let asked =
            format!("action=\"terminate_instance_in_auto_scaling_group\" object=instance/{id}");
        if !plain_log.contains(&asked) {
            return Err(format!(
                "{id} was terminated without the manager choosing it"
            ));
        }
    }
    if checked < terminated {
        return Err(format!(
            "{checked} termination activities for {terminated} terminated instances"
        ));
    }
    Ok(checked)
}

/// [`check_terminations_chosen`] on `asgs`' activities and `manager`'s log.
pub async fn assert_terminations_chosen(
    world: &World,
    asgs: &[String],
    manager: &super::ManagerProcess,
    terminated: usize,
) {
    let mut descriptions = vec![];
    for asg in asgs {
        descriptions.extend(world.activities(asg).await.into_iter().map(|(_, d)| d));
    }
    if let Err(e) = check_terminations_chosen(&descriptions, &manager.plain_logs(), terminated) {
        panic!("{e}");
    }
}

/// The nodes drained, in the order their drains started (the `DrainStarted`
/// Events, one per node).
pub async fn drained_in_order(world: &World) -> Vec<String> {
    let mut events = events_with_reason(world, "DrainStarted").await;
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    events
        .iter()
        .filter_map(|e| drained_node(e.note.as_deref()?))
        .collect()
}

/// The node a `DrainStarted` Event's note names ("draining <node>: …").
fn drained_node(note: &str) -> Option<String> {
    let node = note.strip_prefix("draining ")?.split([':', ' ']).next()?;
    Some(node.to_string())
}

/// Instances terminated or on their way (shutting-down), of
/// [`instances_by_state`].
pub fn terminated_or_going(states: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    let mut gone = states.get("terminated").cloned().unwrap_or_default();
    gone.extend(states.get("shutting-down").cloned().unwrap_or_default());
    gone
}

/// The Refresher's status, asserting its last run ended with `result`
/// (with the manager's log when it did not).
pub fn assert_run_ended(
    rf: Refresher,
    result: spot_node_manager::crd::refresher::RunResult,
    manager: &super::ManagerProcess,
) -> spot_node_manager::crd::RefresherStatus {
    let status = rf.status.expect("status");
    let last = status.last_run.as_ref().expect("last run");
    assert_eq!(last.result, result, "{last:?}\n{}", manager.logs());
    status
}

/// The node names of a preview's `nodes` list (`next.nodes`), in order.
pub fn previewed_nodes(nodes: &serde_json::Value) -> Vec<String> {
    nodes
        .as_array()
        .expect("a list of nodes")
        .iter()
        .filter_map(|n| n["node"].as_str().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activities(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|id| format!("{TERMINATING}{id}")).collect()
    }

    const LOG: &str =
        "INFO action=\"terminate_instance_in_auto_scaling_group\" object=instance/i-1\n";

    #[test]
    fn terminations_the_manager_asked_for_are_counted() {
        assert_eq!(
            check_terminations_chosen(&activities(&["i-1"]), LOG, 1),
            Ok(1)
        );
    }

    #[test]
    fn a_termination_the_manager_did_not_ask_for_fails() {
        let e = check_terminations_chosen(&activities(&["i-1", "i-2"]), LOG, 2);
        assert_eq!(
            e,
            Err("i-2 was terminated without the manager choosing it".into())
        );
    }

    /// An emulator whose wording changed used to pass by checking nothing.
    #[test]
    fn activities_in_another_wording_check_nothing_and_fail() {
        let reworded = vec!["Instance i-1 terminated".to_string()];
        let e = check_terminations_chosen(&reworded, LOG, 1);
        assert_eq!(
            e,
            Err("0 termination activities for 1 terminated instances".into())
        );
    }

    #[test]
    fn a_drain_note_names_its_node() {
        assert_eq!(
            drained_node("draining ip-10-0-1-2: 3 pod(s)"),
            Some("ip-10-0-1-2".into())
        );
        assert_eq!(drained_node("draining n1 (refresh)"), Some("n1".into()));
        assert_eq!(drained_node("cordoned n1"), None);
    }
}
