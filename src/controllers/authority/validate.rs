//! The one check of the rule book: whether a disruption may take its next
//! effect now (a cordon or eviction, a termination), on a fresh view of
//! the cluster. Every rule of [`Rule::ALL`] that the table ([`binds`])
//! binds to the disruption's reason is asked, in the table's order, and the
//! first that refuses is returned, typed, with what would end it. The
//! executor asks it (through each path's guard) right before every effect
//! that takes capacity away; the plans ask the same function to choose, so
//! a plan that forgets a rule is refused, not obeyed.

use super::rules::{Reason, Rule, binds};
use super::{Blocked, ControlPlane, Request, decide};
use crate::crd::Role;
use crate::k8s::disruption_slot::SlotState;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

/// The group's maintenance windows now, as the rules need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Open,
    /// Closed; the next opens then (None: never again).
    Closed {
        opens: Option<DateTime<Utc>>,
    },
}

/// What the rules are judged on: the group's side of the cluster, fresh.
#[derive(Debug, Clone, Copy)]
pub struct Scene<'a> {
    pub role: Role,
    /// Masters: the cluster's control plane (None: not looked at).
    pub control_plane: Option<&'a ControlPlane>,
    pub window: Window,
    /// The group's nodes protected from voluntary disruption, with why
    /// (`k8s::protection`: do-not-disrupt, a foreign cordon, a pod nothing
    /// recreates).
    pub protected: &'a BTreeMap<String, String>,
    /// The manager-wide disruption slot from this path's side.
    pub slot: &'a SlotState,
    /// Why the group's circuit breaker is open, if it is. A Master group
    /// passes None: its masters are counted by the masters' rule across
    /// the cluster instead (one dead master of a group of one is 100%).
    pub breaker: Option<&'a str>,
    /// Why nothing of ours happens to the group now (suspended, its spec
    /// invalid, a kops rolling update replacing its nodes), if so.
    pub stopped: Option<&'a str>,
}

/// The Ready nodes a disruption leaves, against what the group needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Floor {
    pub ready_besides: i32,
    pub needed: i32,
    /// Whether the disruption keeps the floor (a node that is not Ready
    /// costs none, whatever the count).
    pub kept: bool,
}

impl Floor {
    /// Kept while the Ready nodes besides the target number `needed`.
    pub fn of(ready_besides: i32, needed: i32) -> Floor {
        Floor {
            ready_besides,
            needed,
            kept: ready_besides >= needed,
        }
    }
}

/// One disruption's next effect, as the rules judge it.
#[derive(Debug, Clone, Copy)]
pub struct Disruption<'a> {
    pub reason: Reason,
    pub instance: &'a str,
    /// Its Node, when it has one.
    pub node: Option<&'a str>,
    /// Its drain has begun (the path holds the node, cordoned): a window
    /// closing meanwhile does not leave it half-drained; the window gates
    /// a node's first effect.
    pub in_hand: bool,
    /// NotReady past the unhealthy timeout: no protection holds a dead
    /// node (its pods can no longer be kept running by keeping it).
    pub dead: bool,
    /// None: the path takes no Ready node (no Node, or none counted).
    pub floor: Option<Floor>,
}

/// A rule that refuses a disruption, with what it saw and what ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    Masters(Blocked),
    Window {
        instance: String,
        opens: Option<DateTime<Utc>>,
    },
    Protected {
        node: String,
        why: String,
    },
    NoSlot {
        instance: String,
        /// Who holds the slots, or that this path has not taken one.
        why: String,
    },
    Floor {
        instance: String,
        ready_besides: i32,
        needed: i32,
    },
    Breaker {
        instance: String,
        why: String,
    },
    Stopped {
        instance: String,
        why: String,
    },
}

impl Refused {
    /// The rule of the table that refuses.
    pub fn rule(&self) -> Rule {
        match self {
            Refused::Masters(_) => Rule::Masters,
            Refused::Window { .. } => Rule::Window,
            Refused::Protected { .. } => Rule::DoNotDisrupt,
            Refused::NoSlot { .. } => Rule::Slot,
            Refused::Floor { .. } => Rule::ReadyFloor,
            Refused::Breaker { .. } => Rule::Breaker,
            Refused::Stopped { .. } => Rule::Stopped,
        }
    }

    /// A fixed label (metrics, the error's category).
    pub fn check(&self) -> &'static str {
        match self {
            Refused::Masters(blocked) => blocked.check(),
            Refused::Window { .. } => "refused_window_closed",
            Refused::Protected { .. } => "refused_protected",
            Refused::NoSlot { .. } => "refused_no_slot",
            Refused::Floor { .. } => "refused_too_few_ready",
            Refused::Breaker { .. } => "refused_breaker_open",
            Refused::Stopped { .. } => "refused_group_stopped",
        }
    }

    /// What would end the refusal, for the user.
    pub fn ends(&self) -> String {
        match self {
            Refused::Masters(b) if b.needs_user() => "the masters brought back by hand".into(),
            Refused::Masters(Blocked::ControlPlaneOutage { .. }) => {
                "allowControlPlaneOutage set on every Master group, or 3 masters".into()
            }
            Refused::Masters(_) => "the other masters up (Node and control plane Ready)".into(),
            Refused::Window { opens: Some(t), .. } => {
                format!("the next window opening at {}", t.to_rfc3339())
            }
            Refused::Window { opens: None, .. } => "a window that opens (none will)".into(),
            Refused::Protected { .. } => "the protection lifted".into(),
            Refused::NoSlot { .. } => "a disruption slot taken by this path".into(),
            Refused::Floor { needed, .. } => format!("{needed} other Ready node(s)"),
            Refused::Breaker { .. } => "the circuit breaker closing".into(),
            Refused::Stopped { .. } => "the group resumed".into(),
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Masters(blocked) => return write!(f, "{blocked}"),
            Refused::Window { instance, .. } => {
                write!(f, "disrupt {instance}: outside the maintenance windows")?
            }
            Refused::Protected { node, why } => write!(f, "disrupt {node}: protected ({why})")?,
            Refused::NoSlot { instance, why } => {
                write!(f, "disrupt {instance} without a disruption slot ({why})")?
            }
            Refused::Floor {
                instance,
                ready_besides,
                needed,
            } => write!(
                f,
                "terminate {instance}: {ready_besides} other Ready node(s), {needed} needed"
            )?,
            Refused::Breaker { instance, why } => write!(
                f,
                "terminate {instance}: the circuit breaker is open ({why})"
            )?,
            Refused::Stopped { instance, why } => write!(f, "disrupt {instance}: {why}")?,
        }
        write!(f, "; until {}", self.ends())
    }
}

/// Whether `d` may take its next effect now: every rule the table binds to
/// its reason, in the table's order; the first refusal.
pub fn validate(d: &Disruption, scene: &Scene) -> Result<(), Refused> {
    for rule in Rule::ALL {
        if binds(d.reason, rule) {
            check_one(rule, d, scene)?;
        }
    }
    Ok(())
}

/// One rule's answer, whether or not the table binds it to `d`'s reason.
pub(crate) fn check_one(rule: Rule, d: &Disruption, scene: &Scene) -> Result<(), Refused> {
    let instance = || d.instance.to_string();
    match rule {
        Rule::Stopped => match scene.stopped {
            Some(why) => Err(Refused::Stopped {
                instance: instance(),
                why: why.into(),
            }),
            None => Ok(()),
        },
        Rule::Breaker => match scene.breaker {
            Some(why) if scene.role == Role::Worker => Err(Refused::Breaker {
                instance: instance(),
                why: why.into(),
            }),
            _ => Ok(()),
        },
        Rule::Masters => {
            let request = Request {
                reason: d.reason,
                role: scene.role,
                instance: d.instance,
            };
            decide(scene.control_plane, &request).map_err(Refused::Masters)
        }
        Rule::Window => match scene.window {
            Window::Closed { opens } if !d.in_hand => Err(Refused::Window {
                instance: instance(),
                opens,
            }),
            _ => Ok(()),
        },
        Rule::DoNotDisrupt => match d.node.and_then(|n| scene.protected.get(n)) {
            Some(why) if !d.dead => Err(Refused::Protected {
                node: d.node.unwrap_or(d.instance).into(),
                why: why.clone(),
            }),
            _ => Ok(()),
        },
        Rule::Slot => match scene.slot {
            SlotState::Ours => Ok(()),
            SlotState::Free => Err(Refused::NoSlot {
                instance: instance(),
                why: "none taken".into(),
            }),
            SlotState::Full(holders) => Err(Refused::NoSlot {
                instance: instance(),
                why: holders.clone(),
            }),
        },
        Rule::ReadyFloor => match d.floor {
            Some(floor) if !floor.kept => Err(Refused::Floor {
                instance: instance(),
                ready_besides: floor.ready_besides,
                needed: floor.needed,
            }),
            _ => Ok(()),
        },
    }
}

#[cfg(test)]
pub(crate) mod tests;
