//! spot-node-manager: keeps a kops cluster of spot instances at its node count and
//! regularly refreshed. See docs/concepts/ for what each controller does.

pub mod admin;
pub mod apiserver_client;
pub mod check;
pub mod clock;
pub mod cloud;
pub mod config;
pub mod context;
pub mod controllers;
pub mod crash_points;
pub mod crd;
pub mod duration;
pub mod error;
pub mod events;
pub mod heap_trim;
pub mod iam_policy;
pub mod k8s;
pub mod leader;
pub mod leadership;
pub mod manager;
pub mod metrics;
pub mod mutation;
pub mod preview;
pub mod reference;
pub mod schedule;
pub mod telemetry;

pub use error::{Error, Result};
