//! The one gate every mutation passes through.
//!
//! Before anything is changed in AWS or Kubernetes, the caller describes it as
//! an [`Intent`] and hands the operation to [`Mutations::perform`], which:
//! - refuses when this replica is not the leader (checked on every call, so a
//!   replica that lost the lease stops mutating at once);
//! - in dry-run, logs the intended mutation and does not perform it;
//! - counts the outcome in metrics and logs it.
//!
//! Writes to our own custom resources (their status, and the Refresher and
//! Replenisher children of a NodeGroup) are [`Scope::Own`]: dry-run lets them
//! through so users can see in status what would happen. Everything else (AWS,
//! Nodes, Pods, evictions) is [`Scope::External`] and is intercepted by dry-run.

use crate::leadership::Leadership;
use crate::metrics::{Metrics, MutationLabels};
use crate::{Error, Result};
use std::future::Future;
use std::sync::Arc;
use tracing::info;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Aws,
    Kubernetes,
}

impl Target {
    fn label(self) -> &'static str {
        match self {
            Target::Aws => "aws",
            Target::Kubernetes => "kubernetes",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Changes the world: AWS resources, Nodes, Pods, evictions.
    External,
    /// Our own custom resources: their status and the manager-created children.
    Own,
}

/// A described mutation: what, on which object, and why.
#[derive(Debug, Clone)]
pub struct Intent {
    pub target: Target,
    pub scope: Scope,
    /// Static verb for metrics, e.g. `set_desired_capacity`, `cordon_node`.
    pub action: &'static str,
    /// The object acted on, e.g. `asg/nodes-a` or `node/ip-10-0-0-1`.
    pub object: String,
    /// Human-readable detail for the log.
    pub detail: String,
}

/// What an intent names, for the log's fields.
#[derive(Debug, Default, PartialEq)]
pub struct Subject<'a> {
    pub node: Option<&'a str>,
    pub instance: Option<&'a str>,
    pub asg: Option<&'a str>,
}

impl Intent {
    /// The node, instance or ASG acted on, from `object`'s kind: logged as
    /// their own fields, so a JSON log can be searched by any of them.
    pub fn subject(&self) -> Subject<'_> {
        let (kind, name) = self.object.split_once('/').unwrap_or(("", ""));
        let is = |k: &str| (kind == k && !name.is_empty()).then_some(name);
        Subject {
            node: is("node"),
            instance: is("instance"),
            asg: is("asg"),
        }
    }

    pub fn aws(action: &'static str, object: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            target: Target::Aws,
            scope: Scope::External,
            action,
            object: object.into(),
            detail: detail.into(),
        }
    }

    pub fn kube(
        action: &'static str,
        object: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            target: Target::Kubernetes,
            scope: Scope::External,
            action,
            object: object.into(),
            detail: detail.into(),
        }
    }

    pub fn own(action: &'static str, object: impl Into<String>) -> Self {
        Self {
            target: Target::Kubernetes,
            scope: Scope::Own,
            action,
            object: object.into(),
            detail: String::new(),
        }
    }
}

/// Whether a mutation was carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied<T> {
    Performed(T),
    /// Dry-run: logged, not performed.
    DryRun,
}

impl<T> Applied<T> {
    pub fn performed(self) -> Option<T> {
        match self {
            Applied::Performed(v) => Some(v),
            Applied::DryRun => None,
        }
    }
}

#[derive(Clone)]
pub struct Mutations {
    dry_run: bool,
    leadership: Leadership,
    metrics: Arc<Metrics>,
}

impl Mutations {
    pub fn new(dry_run: bool, leadership: Leadership, metrics: Arc<Metrics>) -> Self {
        Self {
            dry_run,
            leadership,
            metrics,
        }
    }

    pub async fn perform<T, F, Fut>(&self, intent: Intent, op: F) -> Result<Applied<T>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let count = |outcome: &'static str| {
            self.metrics
                .mutations
                .get_or_create(&MutationLabels {
                    target: intent.target.label(),
                    action: intent.action,
                    outcome,
                })
                .inc();
        };
        if !self.leadership.is_leading() {
            count("refused_not_leader");
            return Err(Error::NotLeader);
        }
        let subject = intent.subject();
        if self.dry_run && intent.scope == Scope::External {
            info!(
                target_system = intent.target.label(),
                action = intent.action,
                object = %intent.object,
                node = subject.node,
                instance = subject.instance,
                asg = subject.asg,
                detail = %intent.detail,
                "dry-run: would mutate"
            );
            count("dry_run");
            return Ok(Applied::DryRun);
        }
        match op().await {
            Ok(value) => {
                if intent.scope == Scope::External {
                    info!(
                        action = intent.action,
                        object = %intent.object,
                        node = subject.node,
                        instance = subject.instance,
                        asg = subject.asg,
                        detail = %intent.detail,
                        "mutated"
                    );
                }
                count("performed");
                Ok(Applied::Performed(value))
            }
            Err(e) => {
                count("failed");
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_of_an_intent_is_its_node_instance_or_asg() {
        let subject = |object: &str| {
            let i = Intent::aws("x", object, "");
            let s = i.subject();
            (
                s.node.map(str::to_string),
                s.instance.map(str::to_string),
                s.asg.map(str::to_string),
            )
        };
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            subject("node/ip-10-0-0-1"),
            (some("ip-10-0-0-1"), None, None)
        );
        assert_eq!(subject("instance/i-0abc"), (None, some("i-0abc"), None));
        assert_eq!(
            subject("asg/nodes.example.com"),
            (None, None, some("nodes.example.com"))
        );
        assert_eq!(subject("pod/ns/web-1"), (None, None, None));
        assert_eq!(subject("node/"), (None, None, None));
        assert_eq!(subject("https://sqs/queue"), (None, None, None));
    }
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn gate(dry_run: bool, leadership: Leadership) -> (Mutations, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        (
            Mutations::new(dry_run, leadership, metrics.clone()),
            metrics,
        )
    }

    #[tokio::test]
    async fn performs_when_leading() {
        let (m, metrics) = gate(false, Leadership::always());
        let calls = AtomicUsize::new(0);
        let out = m
            .perform(
                Intent::aws("set_desired_capacity", "asg/a", "3 -> 4"),
                || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok(7)
                },
            )
            .await
            .expect("performed");
        assert_eq!(out, Applied::Performed(7));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(
            metrics
                .encode()
                .contains(r#"action="set_desired_capacity",outcome="performed"} 1"#)
        );
    }

    #[tokio::test]
    async fn dry_run_never_calls_external_mutations() {
        let (m, metrics) = gate(true, Leadership::always());
        let calls = AtomicUsize::new(0);
        for intent in [
            Intent::aws("terminate_instance", "i-1", "refresh"),
            Intent::kube("cordon_node", "node/n1", ""),
        ] {
            let out = m
                .perform(intent, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .await
                .expect("dry-run is not an error");
            assert_eq!(out, Applied::DryRun);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(
            metrics
                .encode()
                .contains(r#"action="terminate_instance",outcome="dry_run"} 1"#)
        );
    }

    #[tokio::test]
    async fn dry_run_still_writes_own_status() {
        let (m, _) = gate(true, Leadership::always());
        let out = m
            .perform(Intent::own("patch_status", "nodegroup/ns/g"), || async {
                Ok(1)
            })
            .await
            .expect("status written");
        assert_eq!(out, Applied::Performed(1));
    }

    #[tokio::test]
    async fn a_follower_mutates_nothing_not_even_status() {
        let (m, metrics) = gate(false, Leadership::elected());
        let calls = AtomicUsize::new(0);
        for intent in [
            Intent::aws("terminate_instance", "i-1", ""),
            Intent::own("patch_status", "nodegroup/ns/g"),
        ] {
            let err = m
                .perform(intent, || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .await
                .expect_err("must refuse");
            assert!(matches!(err, Error::NotLeader));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(
            metrics
                .encode()
                .contains(r#"outcome="refused_not_leader"} 1"#)
        );
    }

    #[tokio::test]
    async fn failures_are_counted_and_returned() {
        let (m, metrics) = gate(false, Leadership::always());
        let err = m
            .perform(Intent::aws("detach_instances", "asg/a", ""), || async {
                Err::<(), _>(Error::Aws {
                    operation: "DetachInstances",
                    resource: "asg/a".into(),
                    code: None,
                    message: "boom".into(),
                })
            })
            .await
            .expect_err("fails");
        assert_eq!(err.category(), "aws");
        assert!(
            metrics
                .encode()
                .contains(r#"action="detach_instances",outcome="failed"} 1"#)
        );
    }
}
