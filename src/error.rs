//! The crate's error type. Each variant keeps its source; `category()` gives a
//! static label for metrics and Event reasons (never object names).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("kubernetes API call failed: {context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("AWS {operation} on {resource} failed: {message}")]
    Aws {
        operation: &'static str,
        /// The ASG or instance(s) the call was about.
        resource: String,
        /// AWS error code, e.g. `Throttling`, `ValidationError`.
        code: Option<String>,
        message: String,
    },
    #[error("configuration error: {0}")]
    Config(String),
    #[error("serialization failed: {context}: {source}")]
    Serialization {
        context: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("refused to mutate: this replica is not the leader")]
    NotLeader,
    #[error("invalid object: {0}")]
    InvalidObject(String),
    /// A safety check refused a mutation: `check` names which (a fixed
    /// label, `controllers::guard::Refusal::check`), `message` what it saw.
    #[error("refusing to {message}")]
    Refused {
        check: &'static str,
        message: String,
    },
    #[error("admin server: {0}")]
    Admin(#[source] std::io::Error),
    /// A reconcile panicked; contained to that object and retried later.
    #[error("{controller} reconcile panicked: {message}")]
    Panicked {
        controller: &'static str,
        message: String,
    },
}

impl Error {
    /// A static label for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => match source {
                kube::Error::Api(status) if status.code == 409 => "kube_conflict",
                kube::Error::Api(status) if status.code == 429 => "kube_throttled",
                kube::Error::Api(status) if status.code == 404 => "kube_not_found",
                _ => "kube",
            },
            Error::Aws { code, .. } if is_aws_throttling(code.as_deref()) => "aws_throttled",
            Error::Aws { .. } => "aws",
            Error::Config(_) => "config",
            Error::Serialization { .. } => "serialization",
            Error::NotLeader => "not_leader",
            Error::InvalidObject(_) => "invalid_object",
            Error::Refused { check, .. } => check,
            Error::Admin(_) => "admin",
            Error::Panicked { .. } => "panic",
        }
    }

    /// Expected contention, not a failure: a conflict, throttling (Kubernetes
    /// or AWS), a lost lease. Retried soon, quietly.
    pub fn is_expected_contention(&self) -> bool {
        matches!(
            self.category(),
            "kube_conflict" | "kube_throttled" | "aws_throttled" | "not_leader"
        )
    }

    /// Wraps a kube error with what we were doing.
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }
}

/// AWS's error codes for a request refused for its rate: one list for the
/// error category and the failure metric.
pub const AWS_THROTTLING_CODES: [&str; 3] =
    ["Throttling", "ThrottlingException", "RequestLimitExceeded"];

/// Whether an AWS error code says the request was throttled.
pub fn is_aws_throttling(code: Option<&str>) -> bool {
    code.is_some_and(|c| AWS_THROTTLING_CODES.contains(&c))
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_is_retried_quietly_and_failures_are_not() {
        let throttled = Error::Aws {
            operation: "DescribeAutoScalingGroups",
            resource: "asg/a".into(),
            code: Some("Throttling".into()),
            message: "Rate exceeded".into(),
        };
        let refused = Error::Aws {
            operation: "SetDesiredCapacity",
            resource: "asg/a".into(),
            code: Some("ValidationError".into()),
            message: "above max".into(),
        };
        assert!(throttled.is_expected_contention());
        assert!(Error::NotLeader.is_expected_contention());
        assert!(!refused.is_expected_contention());
        assert!(!Error::InvalidObject("refusing".into()).is_expected_contention());
    }
}
