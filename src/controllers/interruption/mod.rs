//! The interruption handler: spot interruption warnings, rebalance
//! recommendations, scheduled changes, instance state changes and ASG
//! terminate lifecycle actions, read from an SQS queue (EventBridge rules or
//! the ASG's own notifications put them there). On only when
//! `interruption.queueUrl` is set.
//!
//! - [`message`]: a body parsed into a typed notice, or why not;
//! - [`ownership`]: which instances are ours (through the inventory);
//! - [`plan`]: what to do with one message, pure;
//! - [`lookup`]: the NodeGroups and Nodes a message is checked against;
//! - [`receiver`]: the loop over the SQS queue (`cloud::sqs`), marking
//!   doomed nodes (the record on the Node: `k8s::interruption_record`);
//! - [`drainer`]: drains marked nodes by their deadline.

pub mod drainer;
pub mod lookup;
pub mod message;
pub mod ownership;
pub mod plan;
pub mod receiver;
