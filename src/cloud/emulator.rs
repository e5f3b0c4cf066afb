//! Test support, compiled only with the `test-support` feature (the test kit
//! enables it; the installed manager never has it): the moto emulator keeps
//! one state per account, chosen by a request header, so parallel tests each
//! get their own AWS.

use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_ec2::error::BoxError;

/// Header moto uses to keep separate state per account.
pub const EMULATOR_ACCOUNT_HEADER: &str = "x-moto-account-id";

/// Adds the emulator's account header to every request.
#[derive(Debug, Clone)]
pub struct EmulatorAccount(pub String);

impl Intercept for EmulatorAccount {
    fn name(&self) -> &'static str {
        "EmulatorAccount"
    }

    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        context
            .request_mut()
            .headers_mut()
            .insert(EMULATOR_ACCOUNT_HEADER, self.0.clone());
        Ok(())
    }
}
