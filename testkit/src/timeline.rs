//! The demo's live timeline: successive snapshots of the cluster (instances,
//! Nodes, the application's pods, the group's Refresher and Replenisher)
//! turned into one line per thing that happened, and per operation (a
//! refresh run, a replenishment) a summary of how available the group and
//! the application stayed. Pure: the `timeline` binary takes the snapshots.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    pub ready: bool,
    pub cordoned: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodState {
    pub node: Option<String>,
    pub ready: bool,
    /// Has a deletionTimestamp (evicted or deleted).
    pub terminating: bool,
}

/// What an operation of the group looks like from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// A refresh run (Refresher `status.runStart` set).
    Refresh,
    /// The replenisher acting (its phase is not Steady).
    Replenish,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Seconds since the timeline started.
    pub at: f64,
    /// Instance id -> ASG, for instances in service or on their way.
    pub instances: BTreeMap<String, String>,
    pub nodes: BTreeMap<String, NodeState>,
    pub pods: BTreeMap<String, PodState>,
    /// The refresher's phase, when a run is under way.
    pub refresh_phase: Option<String>,
    /// The replenisher's phase, when not Steady.
    pub replenish_phase: Option<String>,
}

impl Snapshot {
    fn ready_nodes(&self) -> usize {
        self.nodes.values().filter(|n| n.ready).count()
    }

    /// Ready pods not being deleted: what still serves.
    fn ready_pods(&self) -> usize {
        self.pods
            .values()
            .filter(|p| p.ready && !p.terminating)
            .count()
    }

    fn operation(&self) -> Option<Operation> {
        if self.refresh_phase.is_some() {
            Some(Operation::Refresh)
        } else if self.replenish_phase.is_some() {
            Some(Operation::Replenish)
        } else {
            None
        }
    }
}

/// An operation's availability figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub operation: Operation,
    pub seconds: f64,
    pub min_ready_nodes: usize,
    pub min_ready_pods: usize,
    pub held: bool,
}

impl Summary {
    pub fn line(&self, desired: usize, pod_floor: usize) -> String {
        format!(
            "summary {}: took {:.1}s; min Ready nodes {}/{desired}; min Ready pods {} (budget floor {pod_floor}); {}",
            match self.operation {
                Operation::Refresh => "refresh",
                Operation::Replenish => "replenish",
            },
            self.seconds,
            self.min_ready_nodes,
            self.min_ready_pods,
            if self.held {
                "floors held"
            } else {
                "BELOW A FLOOR"
            }
        )
    }
}

struct Running {
    operation: Operation,
    since: f64,
    min_ready_nodes: usize,
    min_ready_pods: usize,
}

/// Turns snapshots into lines. `desired` Ready nodes and `pod_floor` Ready
/// pods are the floors an operation must not go below.
pub struct Timeline {
    desired: usize,
    pod_floor: usize,
    last: Option<Snapshot>,
    running: Option<Running>,
    /// The group was seen whole (desired Ready nodes, no operation): only
    /// operations after that are judged (not the cluster coming up).
    whole_seen: bool,
    pub summaries: Vec<Summary>,
}

impl Timeline {
    pub fn new(desired: usize, pod_floor: usize) -> Timeline {
        Timeline {
            desired,
            pod_floor,
            last: None,
            running: None,
            whole_seen: false,
            summaries: vec![],
        }
    }

    /// The lines for what changed since the last snapshot.
    pub fn observe(&mut self, next: Snapshot) -> Vec<String> {
        let mut lines = vec![];
        let at = next.at;
        let mut say = |what: String| lines.push(format!("{at:7.1}s  {what}"));
        let empty = Snapshot::default();
        let prev = self.last.as_ref().unwrap_or(&empty);
        for (id, asg) in &next.instances {
            if !prev.instances.contains_key(id) {
                say(format!("instance {id} launched in {asg}"));
            }
        }
        for (name, node) in &next.nodes {
            let before = prev.nodes.get(name);
            if node.ready && !before.is_some_and(|b| b.ready) {
                say(format!("node {name} Ready"));
            }
            if !node.ready && before.is_some_and(|b| b.ready) {
                say(format!("node {name} NotReady"));
            }
            if node.cordoned && !before.is_some_and(|b| b.cordoned) {
                say(format!("node {name} cordoned"));
            }
            if !node.cordoned && before.is_some_and(|b| b.cordoned) {
                say(format!("node {name} uncordoned"));
            }
        }
        for name in prev.nodes.keys() {
            if !next.nodes.contains_key(name) {
                say(format!("node {name} gone"));
            }
        }
        for (name, pod) in &next.pods {
            let before = prev.pods.get(name);
            let on = pod.node.as_deref().unwrap_or("-");
            if pod.terminating && !before.is_some_and(|b| b.terminating) {
                say(format!("pod {name} evicted from {on}"));
            }
            if pod.ready && !pod.terminating && !before.is_some_and(|b| b.ready) {
                say(format!("pod {name} Ready on {on}"));
            }
        }
        for (id, asg) in &prev.instances {
            if !next.instances.contains_key(id) {
                say(format!("instance {id} terminated in {asg}"));
            }
        }
        let phase_of = |s: &Snapshot| (s.refresh_phase.clone(), s.replenish_phase.clone());
        if phase_of(&next) != phase_of(prev) {
            if let Some(p) = &next.refresh_phase {
                say(format!("refresh: {p}"));
            }
            if let Some(p) = &next.replenish_phase {
                say(format!("replenisher: {p}"));
            }
        }
        // Operations: start, track the minimums, summarise at the end.
        match (&mut self.running, next.operation()) {
            (Some(r), Some(op)) if r.operation == op => {
                r.min_ready_nodes = r.min_ready_nodes.min(next.ready_nodes());
                r.min_ready_pods = r.min_ready_pods.min(next.ready_pods());
            }
            (running, op) => {
                if let Some(r) = running.take() {
                    let summary = Summary {
                        operation: r.operation,
                        seconds: at - r.since,
                        min_ready_nodes: r.min_ready_nodes,
                        min_ready_pods: r.min_ready_pods,
                        held: r.min_ready_nodes >= self.desired
                            && r.min_ready_pods >= self.pod_floor,
                    };
                    say(summary.line(self.desired, self.pod_floor));
                    self.summaries.push(summary);
                }
                *running = op.filter(|_| self.whole_seen).map(|operation| Running {
                    operation,
                    since: at,
                    min_ready_nodes: next.ready_nodes(),
                    min_ready_pods: next.ready_pods(),
                });
            }
        }
        if next.operation().is_none() && next.ready_nodes() >= self.desired {
            self.whole_seen = true;
        }
        self.last = Some(next);
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(
        at: f64,
        nodes: &[(&str, bool, bool)],
        pods: &[(&str, &str, bool, bool)],
    ) -> Snapshot {
        Snapshot {
            at,
            instances: nodes
                .iter()
                .map(|(n, _, _)| (format!("i-{n}"), "nodes-a".to_string()))
                .collect(),
            nodes: nodes
                .iter()
                .map(|(n, ready, cordoned)| {
                    (
                        n.to_string(),
                        NodeState {
                            ready: *ready,
                            cordoned: *cordoned,
                        },
                    )
                })
                .collect(),
            pods: pods
                .iter()
                .map(|(p, node, ready, terminating)| {
                    (
                        p.to_string(),
                        PodState {
                            node: Some(node.to_string()),
                            ready: *ready,
                            terminating: *terminating,
                        },
                    )
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_refresh_reads_as_one_line_per_event_and_a_summary() {
        let mut t = Timeline::new(2, 2);
        t.observe(snapshot(
            0.0,
            &[("a", true, false), ("b", true, false)],
            &[("web-1", "a", true, false), ("web-2", "b", true, false)],
        ));
        let mut s = snapshot(
            1.0,
            &[("a", true, true), ("b", true, false), ("c", true, false)],
            &[
                ("web-1", "a", true, true),
                ("web-2", "b", true, false),
                ("web-3", "c", true, false),
            ],
        );
        s.refresh_phase = Some("Draining".into());
        let lines = t.observe(s).join("\n");
        for expected in [
            "instance i-c launched in nodes-a",
            "node c Ready",
            "node a cordoned",
            "pod web-1 evicted from a",
            "pod web-3 Ready on c",
            "refresh: Draining",
        ] {
            assert!(
                lines.contains(expected),
                "{expected} missing from:\n{lines}"
            );
        }
        let lines = t
            .observe(snapshot(
                3.5,
                &[("b", true, false), ("c", true, false)],
                &[("web-2", "b", true, false), ("web-3", "c", true, false)],
            ))
            .join("\n");
        assert!(lines.contains("node a gone"), "{lines}");
        assert!(lines.contains("instance i-a terminated"), "{lines}");
        assert!(
            lines.contains(
                "summary refresh: took 2.5s; min Ready nodes 3/2; min Ready pods 2 (budget floor 2); floors held"
            ),
            "{lines}"
        );
        assert_eq!(t.summaries.len(), 1);
        assert!(t.summaries[0].held);
    }

    #[test]
    fn the_cluster_coming_up_is_not_judged() {
        let mut t = Timeline::new(2, 2);
        let mut s = snapshot(0.0, &[], &[]);
        s.replenish_phase = Some("Waiting".into());
        t.observe(s);
        t.observe(snapshot(
            5.0,
            &[("a", true, false), ("b", true, false)],
            &[],
        ));
        assert!(t.summaries.is_empty(), "{:?}", t.summaries);
    }

    #[test]
    fn an_operation_that_dips_below_a_floor_is_flagged() {
        let mut t = Timeline::new(2, 2);
        t.observe(snapshot(
            0.0,
            &[("a", true, false), ("b", true, false)],
            &[("web-1", "a", true, false), ("web-2", "b", true, false)],
        ));
        let mut s = snapshot(1.0, &[("a", true, false), ("b", false, false)], &[]);
        s.replenish_phase = Some("ScalingUp".into());
        t.observe(s);
        let lines = t.observe(snapshot(
            5.0,
            &[("a", true, false), ("b", true, false)],
            &[("web-1", "a", true, false), ("web-2", "b", true, false)],
        ));
        let summary = lines
            .iter()
            .find(|l| l.contains("summary"))
            .expect("summary");
        assert!(summary.contains("summary replenish"), "{summary}");
        assert!(summary.contains("min Ready nodes 1/2"), "{summary}");
        assert!(summary.contains("BELOW A FLOOR"), "{summary}");
        assert!(!t.summaries[0].held);
    }
}
