//! The simulated group as the reconcile's guard observes it: a NodeGroup
//! and fresh ASG descriptions, so the executor's guard is the real one.

use super::*;
use crate::cloud::AsgDescription;
use crate::controllers::book::Book;
use crate::controllers::group_view::tests::{fresh, sim_group, status_node};
use crate::controllers::guard::Refusal;
use crate::controllers::guard::refresh::{Effect, Guard};
use crate::crd::{NodeGroup, NodeGroupStatus};

impl Sim {
    /// The NodeGroup (spec and inventory) and the ASGs as described now.
    fn observed(&self) -> (NodeGroup, Vec<AsgDescription>) {
        let names: Vec<&str> = self.asgs.iter().map(|a| a.name.as_str()).collect();
        let mut group: NodeGroup = sim_group(self.role, self.desired, &names);
        let (_, _, nodes) = self.views();
        group.status = Some(NodeGroupStatus {
            nodes: nodes
                .iter()
                .map(|n| {
                    let mut s = status_node(
                        &n.name,
                        n.asg.as_deref().unwrap_or_default(),
                        n.instance_id.as_deref().unwrap_or_default(),
                    );
                    s.ready = n.ready;
                    s
                })
                .collect(),
            ..Default::default()
        });
        let described = self
            .asgs
            .iter()
            .map(|a| {
                let ids: Vec<(&str, &str)> = self
                    .instances
                    .iter()
                    .filter(|i| i.asg == a.name)
                    .map(|i| (i.id.as_str(), "InService"))
                    .collect();
                let mut d = fresh(&a.name, &ids);
                d.desired = a.desired;
                d.max = a.max;
                d.suspended_processes = a.suspended.clone();
                d
            })
            .collect();
        (group, described)
    }

    /// The real guard's answer for `check`, recorded by `status`.
    pub(super) fn real_guard(
        &self,
        status: &RefresherStatus,
        check: Effect,
    ) -> Result<(), Refusal> {
        let (group, described) = self.observed();
        let (_, _, nodes) = self.views();
        let control_plane = self.control_plane(&nodes);
        // The rule book's scene as the plan is told it.
        let stopped = self.with_input(|i| i.group.stopped().map(str::to_string));
        let book = Book::new(self.window.clone(), &self.protected, self.slot.clone());
        Guard {
            group: &group,
            fresh: &described,
            nodes: &nodes,
            status,
            scene: book.scene(
                self.role,
                (self.role == Role::Master).then_some(&control_plane),
                self.breaker.as_deref(),
                stopped.as_deref(),
            ),
        }
        .check(check)
    }
}
