//! The context shared by every controller: clients, clock, metrics, the
//! mutation gate, the Event recorder and the settings.

use crate::clock::Clock;
use crate::cloud::CloudProvider;
use crate::config::Settings;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::mutation::Mutations;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::sync::Arc;
use tracing::debug;

/// Field manager for every write we make (one owner of our status fields).
pub const FIELD_MANAGER: &str = "spot-node-manager";

pub struct Context {
    pub client: kube::Client,
    /// Same cluster, without kube's 429 retry: a PDB-blocked eviction must
    /// surface at once instead of stalling the reconcile.
    pub eviction_client: kube::Client,
    pub settings: Arc<Settings>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub mutations: Mutations,
    pub leadership: Leadership,
    pub cloud: Arc<dyn CloudProvider>,
    recorder: Recorder,
}

impl Context {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: kube::Client,
        eviction_client: kube::Client,
        settings: Arc<Settings>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        leadership: Leadership,
        cloud: Arc<dyn CloudProvider>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(settings.identity.clone()),
            },
        );
        let mutations = Mutations::new(settings.dry_run, leadership.clone(), metrics.clone());
        Self {
            client,
            eviction_client,
            settings,
            clock,
            metrics,
            mutations,
            leadership,
            cloud,
            recorder,
        }
    }

    /// Publishes an Event. Best effort: Events are for people, never a reason to
    /// fail a reconcile (1.20 even rejects some for cluster-scoped objects).
    pub async fn event(
        &self,
        on: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if !self.leadership.is_leading() {
            return;
        }
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, on).await {
            debug!(error = %e, reason, "could not publish event");
        }
    }
}
