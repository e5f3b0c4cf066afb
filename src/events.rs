//! Every Event reason the manager writes, in one list. A reconcile names a
//! [`Reason`], never a string, so docs/reference/events.md (generated from
//! this list) names every Event a user can meet. The only other Events are a
//! condition's own reason when it turns bad (see [`ConditionEvent`]).

use crate::crd::condition;

/// Declares [`Reason`]: each variant with the object it is written on, the
/// types it is sent with, and (its doc comment) what it means.
macro_rules! reasons {
    ($( $(#[doc = $doc:literal])+ $name:ident ($types:literal) on $on:literal; )*) => {
        /// An Event reason.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $( $(#[doc = $doc])+ $name, )*
        }

        impl Reason {
            /// Every reason, in the order docs/reference/events.md lists them.
            pub const ALL: &'static [Reason] = &[$(Reason::$name),*];

            pub fn as_str(self) -> &'static str {
                match self { $(Reason::$name => stringify!($name),)* }
            }

            /// `Normal`, `Warning`, or `Normal or Warning`.
            pub fn types(self) -> &'static str {
                match self { $(Reason::$name => $types,)* }
            }

            /// The object the Event is written on.
            pub fn on(self) -> &'static str {
                match self { $(Reason::$name => $on,)* }
            }

            /// What it means, from its doc comment.
            pub fn meaning(self) -> String {
                match self {
                    $(Reason::$name => [$($doc),+].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" "),)*
                }
            }
        }
    };
}

reasons! {
    /// A refresh run or a drift roll started: how many nodes it replaces, and its surplus.
    RefreshStarted("Normal") on "NodeGroup";
    /// A due run did not start, and why (suspended, too few Ready, no node old enough,
    /// an ASG with Launch or Terminate suspended, the circuit breaker, a kops rolling update).
    RefreshSkipped("Normal") on "NodeGroup";
    /// Dry-run: what a due run would have done, in order; nothing was done.
    RefreshPlanned("Normal") on "NodeGroup";
    /// A drift roll's set of nodes changed: nodes drifted since it started joined it,
    /// nodes no longer drifted (a rollback) left it.
    DriftRollChanged("Normal") on "NodeGroup";
    /// A run was set aside with nodes left: its window closed (Normal), or it was paused
    /// past `pauseTimeout` or the disruption authority stopped it (Warning). Lock and
    /// slot are given back; the rest resumes later.
    RefreshSetAside("Normal or Warning") on "NodeGroup";
    /// A run set aside resumed in an open window.
    RefreshResumed("Normal") on "NodeGroup";
    /// Protected nodes (do-not-disrupt, a foreign cordon, a pod nothing recreates) were
    /// left alone by a run, each with its reason.
    NodesSkipped("Warning") on "NodeGroup";
    /// A node was replaced by a run, and how long it took from its drain's start.
    NodeReplaced("Normal") on "NodeGroup";
    /// A run failed (a replacement not Ready in time, a drain past `drainTimeout` with
    /// `Abort`, the group deleted): the reason; its surplus is removed, the old nodes kept.
    RefreshFailed("Warning") on "NodeGroup";
    /// A replacement's validation timed out with `validationTimeoutAction: Proceed`:
    /// the run goes on with the next node.
    ValidationTimedOut("Warning") on "NodeGroup";
    /// Someone else lowered an ASG below the run's recorded count: the run ends at theirs.
    LayoutLowered("Normal") on "NodeGroup";
    /// A run ended: its result (Warning when Failed) and how many nodes it replaced.
    RefreshFinished("Normal or Warning") on "NodeGroup";
    /// A drain started (a refresh's node, a surplus node, a repair).
    DrainStarted("Normal") on "NodeGroup, related to the Node";
    /// An eviction was refused by a PodDisruptionBudget: the budgets and the pods.
    DrainBlocked("Warning") on "NodeGroup, related to the Node";
    /// The manager's own pod was the last pod to move off a node it drains: leadership went
    /// to a standby replica, which takes over at once and evicts it.
    LeadershipHandedOver("Normal") on "Node";
    /// The manager's own pod is the last pod on a node it drains and no other node could
    /// run it (the only control-plane node): it stays and goes with the instance; the
    /// Deployment's next pod resumes from status once the replacement has joined.
    OwnPodStays("Normal") on "Node";
    /// An unhealthy node (NotReady past `unhealthyTimeout`) was terminated by a repair or a refresh.
    NodeRepaired("Normal") on "NodeGroup, related to the Node";
    /// Repairs are held back: the circuit breaker is open, or (masters) the control plane
    /// has too few Ready masters; the nodes and the rule that holds them.
    RepairBlocked("Warning") on "NodeGroup, related to the Node";
    /// A repair was given up because its node is Ready again (or, for a master, the
    /// authority refuses it now): the node is uncordoned and kept.
    RepairAbandoned("Normal") on "NodeGroup, related to the Node";
    /// A scale-in was given up (a drain past 10 minutes, or Ready would drop below
    /// desired without the node): the node is uncordoned and kept.
    ScaleInAbandoned("Warning") on "NodeGroup, related to the Node";
    /// The replenisher raised an ASG's desired capacity: which, from what, to what, why.
    ScaledUp("Normal") on "NodeGroup";
    /// The replenisher removed a surplus node (a shortage ended) with decrement.
    ScaledDown("Normal") on "NodeGroup";
    /// Every spot ASG of a worker group was short for `fallback.after`: the on-demand
    /// fallback ASGs were raised by the missing count.
    FallbackRaised("Warning") on "NodeGroup";
    /// A node of the on-demand fallback was removed, its spot replacement Ready first.
    ReturnedToSpot("Normal") on "NodeGroup";
    /// A spot pool (an ASG) had 3 or more interruption warnings and rebalance
    /// recommendations in 24 hours: raises elsewhere go to pools with fewer. Once per
    /// episode.
    UnreliablePool("Warning") on "NodeGroup";
    /// An instance that never joined as a Node within `joinTimeout` was terminated.
    RemovedNotJoined("Warning") on "NodeGroup";
    /// Instances of one ASG keep not joining: the next removal there backs off.
    NotJoinedAgain("Warning") on "NodeGroup";
    /// An interrupted node was terminated by the manager, before AWS took it.
    InterruptedNodeRemoved("Normal") on "NodeGroup";
    /// Nodes of the group became drifted (an old launch template version, or
    /// `kops.k8s.io/needs-update`); once, not again while they stay so.
    DriftDetected("Normal") on "NodeGroup";
    /// A spot interruption warning, an instance state change, a scheduled retirement or
    /// stop, or a terminate lifecycle action: the node is cordoned, tainted and drained by
    /// its deadline (Warning; the note says when the notice came late), or there was
    /// nothing to drain (Normal: an instance that never joined, a lifecycle action naming
    /// another ASG).
    InterruptionNotice("Normal or Warning") on "Node and NodeGroup";
    /// A rebalance recommendation for the node: noted (`Ignore`), or a replacement launched (`Replace`).
    RebalanceRecommendation("Normal") on "Node and NodeGroup";
    /// An AWS Health scheduled change that is not a loss (a reboot, system maintenance):
    /// its start; nothing is done.
    ScheduledMaintenance("Normal") on "Node and NodeGroup";
    /// An interrupted node emptied before its deadline.
    InterruptionDrained("Normal") on "Node";
    /// An interrupted node's deadline came with pods left: at most 10 named, then a count.
    InterruptionDrainIncomplete("Warning") on "Node";
    /// The ASG terminate lifecycle action holding the node was completed (`CONTINUE`).
    LifecycleActionCompleted("Normal") on "Node";
}

impl Reason {
    /// Whether `type_` is one this reason is documented to be sent with.
    pub fn allows(self, type_: &kube::runtime::events::EventType) -> bool {
        let name = match type_ {
            kube::runtime::events::EventType::Normal => "Normal",
            kube::runtime::events::EventType::Warning => "Warning",
        };
        self.types().contains(name)
    }
}

/// The conditions whose turning bad is told as a Warning Event named by the
/// condition's own reason (e.g. `InvalidSchedule`, `NotLaunching`,
/// `TooManyNotReady`, `KopsRollingUpdate`): see docs/operations.md.
pub struct ConditionEvent;

impl ConditionEvent {
    /// (condition type, when its Event is sent), for the reference page.
    pub const ALL: &'static [(&'static str, &'static str)] = &[
        (condition::SPEC_VALID, "turns False"),
        (condition::DEGRADED, "turns True"),
        (condition::CIRCUIT_BREAKER, "turns True"),
        (condition::EXTERNAL_UPDATE, "turns True"),
        (condition::COMPETING_ASG_SETTINGS, "turns True"),
        (condition::NO_ROOM_ABOVE_DESIRED, "turns True"),
        (condition::OTHER_TERMINATION_HANDLER, "turns True"),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_listed_once_with_a_meaning() {
        let mut names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a reason is listed twice");
        for r in Reason::ALL {
            assert!(r.meaning().len() > 20, "{r:?} says too little");
            assert!(
                r.allows(&kube::runtime::events::EventType::Normal)
                    || r.allows(&kube::runtime::events::EventType::Warning)
            );
        }
    }
}
