//! The disruption authority: whether a node may be taken away now, asked by
//! every path that terminates one (a refresh run, a drift roll, a repair,
//! the replenisher's surplus removal, a node at risk, an instance that never
//! joined, a reclaimed node retired before AWS takes it), before the drain
//! that leads to the termination and again just before the termination
//! itself. Pure: the observed cluster in, a decision out, so a preview can
//! ask the same question later.
//!
//! Its cluster-wide rule today is the control plane's, counted as etcd
//! counts it: a master is taken away by our hand only while the *other*
//! masters that are up number at least the expected count less one. A
//! master is up while its instance is in service, its Node Ready, its
//! control-plane pods (kops's static kube-apiserver and etcd-manager) Ready
//! for its group's `refresh.masterSettleTime` (default 2m, on every path,
//! not only between a refresh's masters) and no loss is imminent for it (a spot warning; a scheduled retirement
//! only from its drain start, the group's `scheduledChangeLead` before AWS
//! takes it, not days ahead; a rebalance recommendation is no loss). So a replaced master is
//! back once its etcd has joined and settled, not when its Node turns Ready; and a
//! master retiring in two days does not stop the repair of a dead one.
//!
//! Masters are counted by instance across every Master group of the
//! namespace, not by Node: an instance that is booting (no Node yet, as a
//! kops master is for minutes), leaving, NotReady or joining is a master
//! down, and so is a place its ASG has not launched yet. That holds with
//! one Master group over three ASGs and with three Master groups of one.
//! Concurrency between groups is closed by the manager-wide slot a master
//! disruption holds (`k8s::disruption_slot`): never two Master groups at
//! once. Which rule binds which reason is the rule book (`rules`): this
//! decision asks it for the masters' rule, each path's plan and guard for
//! the group-level ones (windows, do-not-disrupt, the slot, the Ready
//! floor).

pub mod observe;
pub mod rules;
pub mod validate;

pub use rules::Reason;

use crate::crd::Role;
use chrono::{DateTime, Utc};
use std::collections::BTreeSet;

/// Why a master counts as down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownWhy {
    /// Its ASG has not launched it yet, or it has no Node yet.
    Launching,
    /// Its Node is not Ready.
    NotReady,
    /// Its Node is Ready, its control-plane pods not yet (etcd joining).
    Joining,
    /// Its control-plane pods are Ready, for less than its group's
    /// `refresh.masterSettleTime` (etcd catching up): up from `until`.
    Settling { until: DateTime<Utc> },
    /// Its instance is leaving (terminating, or a loss imminent).
    Leaving,
    /// Beside another master of its place (a replacement launched before
    /// its predecessor left, the predecessor serving or leaving): not an
    /// etcd member until the predecessor is gone.
    Beside,
    /// Its Node Ready, its control-plane pods missing or not Ready past its
    /// group's `joinTimeout` from launch: nothing the manager does brings
    /// it back.
    NotServing,
    /// A control-plane Node no Master group's described ASGs hold (an ASG
    /// kops renamed that a group names by its old name, a group nobody
    /// wrote), its Node or control plane not Ready: nothing of ours
    /// replaces it.
    Unlisted,
}

/// A master of the cluster that is not Ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterDown {
    /// The Master group it belongs to.
    pub group: String,
    /// None: a place its group's ASGs have not launched an instance for.
    pub instance: Option<String>,
    pub why: DownWhy,
}

impl std::fmt::Display for MasterDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.why {
            DownWhy::Launching => "launching".to_string(),
            DownWhy::NotReady => "NotReady".to_string(),
            DownWhy::Joining => "control plane not Ready".to_string(),
            DownWhy::Settling { until } => {
                format!("control plane Ready, settling until {}", until.to_rfc3339())
            }
            DownWhy::Leaving => "leaving".to_string(),
            DownWhy::Beside => "beside its predecessor, not an etcd member yet".to_string(),
            DownWhy::NotServing => {
                "Node Ready, control plane not serving past its joinTimeout".to_string()
            }
            DownWhy::Unlisted => {
                "a control-plane Node in no Master group's ASGs, not up: write or fix its NodeGroup"
                    .to_string()
            }
        };
        match &self.instance {
            Some(id) if self.why == DownWhy::Unlisted => write!(f, "{id} ({what})"),
            Some(id) => write!(f, "{id} of {} ({what})", self.group),
            None => write!(f, "a master of {} not launched yet", self.group),
        }
    }
}

/// The cluster's control plane, counted by instance across every Master
/// group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControlPlane {
    /// Masters the cluster is to have: the Master groups' desired counts.
    pub expected: i32,
    /// Master instances that are up: in service, Node and control-plane
    /// pods Ready, no loss imminent.
    pub ready: BTreeSet<String>,
    /// Every master that is not Ready, and why.
    pub down: Vec<MasterDown>,
    /// By control-plane pods, or (no master shows any) by Node Ready.
    pub counted_by: crate::k8s::control_plane::CountedBy,
    /// Every Master group sets `disruption.allowControlPlaneOutage`: a
    /// master may go where that stops the API ([`ControlPlane::outage`]).
    pub outage_allowed: bool,
}

/// etcd's quorum of `members`: a majority.
pub fn quorum(members: i32) -> i32 {
    members / 2 + 1
}

impl ControlPlane {
    /// Every master of the cluster is Ready (a master run may start). An
    /// instance beside a serving member (a master ASG its user raised)
    /// takes nothing from it: its place is served, and in kops it turns no
    /// control-plane pod Ready while it waits, maybe for good. One beside a
    /// leaving predecessor comes with that predecessor, which is down.
    pub fn whole(&self) -> bool {
        self.down.iter().all(|d| d.why == DownWhy::Beside)
            && self.ready.len() as i32 >= self.expected
    }

    /// Why no master may be taken away by our hand without stopping the
    /// Kubernetes API, if so: the cluster's masters are too few for etcd to
    /// keep its quorum with one fewer (one master, kops's default, or two),
    /// and not every Master group allows the outage. A fact of the
    /// cluster's size, not of the moment: nothing but the user ends it.
    pub fn outage(&self) -> Option<String> {
        let expected = self.expected;
        // One fewer keeps the quorum: three masters or more.
        if self.outage_allowed || expected < 1 || expected > quorum(expected) {
            return None;
        }
        Some(format!(
            "the cluster has {expected} master(s), and etcd needs {} of {expected} up: taking one away stops the Kubernetes API until its replacement's etcd has joined; set spec.disruption.allowControlPlaneOutage: true on every Master NodeGroup to allow that, or run 3 masters",
            quorum(expected)
        ))
    }

    /// `instance` waits beside its place's etcd member (`DownWhy::Beside`).
    pub fn beside(&self, instance: &str) -> bool {
        self.down
            .iter()
            .any(|d| d.why == DownWhy::Beside && d.instance.as_deref() == Some(instance))
    }
}

/// A path asks to take `instance` (of a group of `role`) away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    pub reason: Reason,
    pub role: Role,
    pub instance: &'a str,
}

/// Why the authority refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// Another master is not up (its Node or control-plane pods not Ready,
    /// booting, or leaving): taking this one would put a second master
    /// down by our hand.
    OtherMastersDown {
        instance: String,
        down: Vec<MasterDown>,
        ready_besides: i32,
        needed: i32,
        /// Nothing the manager does will end this refusal: no other master
        /// is on its way back (launching, or leaving to be replaced) and
        /// half of the masters or more are down, this one included. Only
        /// the user can bring them back.
        needs_user: bool,
    },
    /// No view of the control plane was taken: never act blind on a master.
    ControlPlaneUnobserved { instance: String },
    /// Taking it would leave fewer masters up than etcd's quorum (a
    /// cluster of one or two masters), and the user did not allow that
    /// outage (`ControlPlane::outage`).
    ControlPlaneOutage { instance: String, why: String },
}

impl Blocked {
    /// A fixed label (metrics, condition reasons).
    pub fn reason(&self) -> &'static str {
        match self {
            Blocked::OtherMastersDown { .. } if self.needs_user() => "ControlPlaneQuorumAtRisk",
            Blocked::OtherMastersDown { .. } => "OtherMastersNotReady",
            Blocked::ControlPlaneUnobserved { .. } => "ControlPlaneUnobserved",
            Blocked::ControlPlaneOutage { .. } => "ControlPlaneOutage",
        }
    }

    /// As a fixed label of the refusing check (the error's category).
    pub fn check(&self) -> &'static str {
        match self {
            Blocked::OtherMastersDown { .. } => "refused_other_masters_down",
            Blocked::ControlPlaneUnobserved { .. } => "refused_control_plane_unobserved",
            Blocked::ControlPlaneOutage { .. } => "refused_control_plane_outage",
        }
    }

    /// Only the user can end this refusal (see `needs_user` above).
    pub fn needs_user(&self) -> bool {
        matches!(
            self,
            Blocked::OtherMastersDown {
                needs_user: true,
                ..
            }
        )
    }
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::OtherMastersDown {
                instance,
                down,
                ready_besides,
                needed,
                ..
            } => {
                let list: Vec<String> = down.iter().map(|d| d.to_string()).collect();
                write!(
                    f,
                    "take master {instance} away: {ready_besides} other master(s) up (Node and control-plane pods Ready), {needed} needed; down: {}",
                    list.join(", ")
                )?;
                if self.needs_user() {
                    write!(
                        f,
                        "; the control plane's quorum is at risk and no replacement is on its way: bring the masters back by hand"
                    )?;
                }
                Ok(())
            }
            Blocked::ControlPlaneUnobserved { instance } => write!(
                f,
                "take master {instance} away: the control plane was not observed"
            ),
            Blocked::ControlPlaneOutage { instance, why } => {
                write!(f, "take master {instance} away: {why}")
            }
        }
    }
}

/// Whether the node on `instance` may be taken away now. Workers pass, and
/// so does a reason the rule book frees of the masters' rule (the
/// group-level rules stay with each path); a master only while every other
/// master of the cluster is up: the master instances up besides it are at
/// least the expected count less one. Its own state does not matter: a
/// master whose kubelet died may still serve etcd, so it too waits while
/// the others are short. Counted by place, an old
/// instance still terminating next to its Ready replacement holds nothing
/// back, and a place with no Ready master does, whatever is in it.
pub fn decide(control_plane: Option<&ControlPlane>, request: &Request) -> Result<(), Blocked> {
    if request.role != Role::Master || !rules::binds(request.reason, rules::Rule::Masters) {
        return Ok(());
    }
    let Some(cp) = control_plane else {
        return Err(Blocked::ControlPlaneUnobserved {
            instance: request.instance.into(),
        });
    };
    let ready_besides = cp.ready.iter().filter(|i| *i != request.instance).count() as i32;
    let needed = (cp.expected - 1).max(0);
    let down: Vec<MasterDown> = cp
        .down
        .iter()
        .filter(|d| d.instance.as_deref() != Some(request.instance))
        .cloned()
        .collect();
    if ready_besides >= needed {
        // The others are all up, yet too few for etcd's quorum without it
        // (one master, or two): unless the user allowed that outage.
        return match cp.outage() {
            Some(why) if ready_besides < quorum(cp.expected) => Err(Blocked::ControlPlaneOutage {
                instance: request.instance.into(),
                why,
            }),
            _ => Ok(()),
        };
    }
    let ready = ready_besides + i32::from(cp.ready.contains(request.instance));
    // A master not serving past its joinTimeout is on no way back; nor is
    // an instance beside a member (it brings back no place: a place that
    // hands over shows its leaving predecessor, on its way).
    let stuck = |d: &MasterDown| {
        matches!(
            d.why,
            DownWhy::NotReady | DownWhy::NotServing | DownWhy::Unlisted | DownWhy::Beside
        )
    };
    let on_its_way = down.iter().any(|d| !stuck(d));
    let not_serving = down.iter().any(|d| d.why == DownWhy::NotServing);
    Err(Blocked::OtherMastersDown {
        instance: request.instance.into(),
        down,
        ready_besides,
        needed,
        needs_user: !on_its_way && (not_serving || ready * 2 <= cp.expected),
    })
}

#[cfg(test)]
pub(crate) mod tests;
