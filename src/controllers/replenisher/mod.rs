//! The replenisher, one per group: keeps Ready nodes at the desired count
//! (`plan`: pure decisions, one module per stage; `controller`: observe,
//! persist, act).

pub mod controller;
pub mod plan;
#[cfg(test)]
mod reconcile_tests;

pub use controller::{CONTROLLER, run};
