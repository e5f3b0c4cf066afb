//! The node inventory controller: maps each group's Nodes to their instances
//! and ASGs and writes it all to the NodeGroup's status (`controller`, the
//! I/O), computed by a pure function of what was observed (`plan`). What
//! wakes a group is in `watch`; its child resources in `children`; the
//! spec's validation against other groups in `validation`.

mod asg_health;
pub mod autoscalers;
pub mod children;
pub mod competing;
pub mod controller;
pub mod cost;
pub mod deletion;
pub mod drift;
pub mod external_update;
pub mod handlers;
pub mod hooks;
pub mod hourly;
pub mod instance_facts;
pub mod karpenter;
pub mod plan;
pub mod room;
mod validation;
mod watch;

pub use children::child_specs;
pub use controller::CONTROLLER;
pub use validation::{asg_conflicts, validated_status};
pub use watch::run;
