//! The refresher, one per group: cron-scheduled rolling replacement
//! (`crate::schedule`: the next run in a time zone; `plan`: the pure state machine,
//! one module per phase; `execute`: the order a step is carried out in; `report`: its Events
//! and metrics;
//! `controller`: observe, decide, then execute against the cluster and AWS).

mod conditions;
pub mod controller;
pub mod plan;
#[cfg(test)]
mod reconcile_tests;
mod record;
mod report;
pub mod seen;

pub use controller::{CONTROLLER, run};
