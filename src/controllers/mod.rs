//! One folder per controller (`inventory`, `replenisher`, `refresher`), each
//! exposing `run(ctx, shutdown)`; what the child controllers share:
//! `vocabulary` (what their plans speak of), `observe` (what they look at),
//! `actions` (the persist-then-act executor and the AWS mutations), and the
//! `runtime` that starts them all (`run_all`).

pub mod actions;
pub mod inventory;
#[cfg(test)]
pub(crate) mod mock_api;
pub mod observe;
pub mod refresher;
pub mod replenisher;
pub mod runtime;
pub mod vocabulary;

pub use runtime::run_all;
