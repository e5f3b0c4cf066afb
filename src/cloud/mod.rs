//! AWS clients. The project-owned trait over them (and its fake) arrives with
//! the inventory; this module builds the SDK clients from the settings:
//! region, endpoint override (e.g. the moto emulator) and, for the emulator
//! only, the account to act in.

use crate::config::AwsSettings;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_ec2::error::BoxError;

/// Header moto uses to keep separate state per account.
pub const EMULATOR_ACCOUNT_HEADER: &str = "x-moto-account-id";

#[derive(Clone, Debug)]
pub struct AwsClients {
    pub autoscaling: aws_sdk_autoscaling::Client,
    pub ec2: aws_sdk_ec2::Client,
}

/// Loads the SDK configuration: the standard chain (env, profile, IRSA web
/// identity, instance metadata) with our region and endpoint overrides.
pub async fn load_sdk_config(settings: &AwsSettings) -> SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if let Some(region) = &settings.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint.clone());
    }
    loader.load().await
}

impl AwsClients {
    pub fn new(sdk: &SdkConfig, emulator_account: Option<&str>) -> Self {
        let mut asg = aws_sdk_autoscaling::config::Builder::from(sdk);
        let mut ec2 = aws_sdk_ec2::config::Builder::from(sdk);
        if let Some(account) = emulator_account {
            asg = asg.interceptor(EmulatorAccount(account.to_string()));
            ec2 = ec2.interceptor(EmulatorAccount(account.to_string()));
        }
        Self {
            autoscaling: aws_sdk_autoscaling::Client::from_conf(asg.build()),
            ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
        }
    }
}

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
