//! The replenisher, one per group: keeps Ready nodes at the desired count
//! (`plan`: pure decisions, one function per stage; `controller`: observe,
//! persist, act).

pub mod controller;
pub mod plan;

pub use controller::{CONTROLLER, run};
