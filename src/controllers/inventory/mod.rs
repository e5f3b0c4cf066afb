//! The node inventory controller: maps each group's Nodes to their instances
//! and ASGs and writes it all to the NodeGroup's status (`controller`, the
//! I/O), computed by a pure function of what was observed (`plan`).

pub mod controller;
pub mod deletion;
pub mod facts;
pub mod plan;

pub use controller::{CONTROLLER, run};
