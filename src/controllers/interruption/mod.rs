//! The interruption handler: spot interruption warnings, rebalance
//! recommendations, scheduled changes, instance state changes and ASG
//! terminate lifecycle actions, read from an SQS queue (EventBridge rules or
//! the ASG's own notifications put them there). On only when
//! `interruption.queueUrl` is set.
//!
//! - [`message`]: a body parsed into a typed notice, or why not;
//! - [`ownership`]: which instances are ours (through the inventory);
//! - [`plan`]: what to do with one message, pure;
//! - [`mark`]: the persisted first action on a doomed node;
//! - [`queue`] and [`handler`]: the SQS I/O and the loop;
//! - [`drainer`]: drains marked nodes by their deadline.

pub mod drainer;
pub mod message;
pub mod ownership;
pub mod plan;
pub mod receiver;
pub mod record;
