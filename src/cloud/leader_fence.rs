//! Fencing of AWS calls by leadership: checked before every attempt the SDK
//! makes, retries included, so a replica whose lease ran out mid-call stops
//! at the next attempt instead of finishing a retry loop it began as leader.

use crate::leadership::Leadership;
use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_ec2::error::BoxError;

/// The error text of an attempt refused for want of leadership.
pub const NOT_LEADING: &str = "refused: this replica no longer holds the leader lease";

/// Refuses every request attempt while this replica does not lead.
#[derive(Clone)]
pub struct LeaderFence(pub Leadership);

impl std::fmt::Debug for LeaderFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LeaderFence")
            .field(&self.0.is_leading())
            .finish()
    }
}

impl Intercept for LeaderFence {
    fn name(&self) -> &'static str {
        "LeaderFence"
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if self.0.is_leading() {
            Ok(())
        } else {
            Err(NOT_LEADING.into())
        }
    }
}
