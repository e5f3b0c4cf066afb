//! The refresher, one per group: cron-scheduled rolling replacement
//! (`schedule`: the next run in a time zone; `plan`: the pure state machine;
//! `controller`: observe, persist, act).

pub mod controller;
pub mod plan;
pub mod schedule;

pub use controller::{CONTROLLER, run};
