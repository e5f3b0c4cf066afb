//! The replenisher, one per group: keeps Ready nodes at the desired count
//! (`plan`: pure decisions, one module per stage; `controller`: observe,
//! persist, act; `guard`: the checks re-made just before each mutation).

pub mod controller;
mod effects;
pub mod plan;
#[cfg(test)]
mod reconcile_tests;
mod record;
mod told;

pub use controller::{CONTROLLER, run};
pub use told::drained;
