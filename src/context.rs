//! The context shared by every controller: clients, clock, metrics, the
//! mutation gate, the Event recorder and the settings.

use crate::clock::Clock;
use crate::cloud::CloudProvider;
use crate::config::Settings;
use crate::crd::condition::Condition;
use crate::events::Reason;
use crate::leadership::Leadership;
use crate::metrics::Metrics;
use crate::mutation::Mutations;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::sync::Arc;
use tracing::debug;

/// Field manager for every write we make (one owner of our status fields).
pub const FIELD_MANAGER: &str = "spot-node-manager";
/// Field manager for the children's specs the inventory applies (the main
/// resource). Not `FIELD_MANAGER`: an apiserver before 1.22 keeps one
/// managed-fields entry per manager and operation for an object and its
/// status subresource, so a spec applied under the status's manager drops
/// its ownership of every status field, and a status field the next status
/// apply omits (a removal given back) is then never removed.
pub const CHILDREN_FIELD_MANAGER: &str = "spot-node-manager-children";

pub struct Context {
    pub client: kube::Client,
    /// Same cluster, without kube's 429 retry: a PDB-blocked eviction must
    /// surface at once instead of stalling the reconcile.
    pub eviction_client: kube::Client,
    /// The apiserver refused a `policy/v1` Eviction: evictions are sent as
    /// `policy/v1beta1` (see `k8s::eviction`).
    pub eviction_legacy: std::sync::atomic::AtomicBool,
    pub settings: Arc<Settings>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub mutations: Mutations,
    pub leadership: Leadership,
    pub cloud: Arc<dyn CloudProvider>,
    /// The interruption queue, when one is configured.
    pub interruption_queue: Option<Arc<crate::cloud::sqs::Queue>>,
    /// The node whose drain we handed leadership over from (see
    /// `k8s::own_pod`): leading again there means no standby took over.
    handed_over_on: std::sync::Mutex<Option<String>>,
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
            eviction_legacy: Default::default(),
            settings,
            clock,
            metrics,
            mutations,
            leadership,
            cloud,
            interruption_queue: None,
            handed_over_on: Default::default(),
            recorder,
        }
    }

    pub fn handed_over_on(&self) -> Option<String> {
        self.handed_over_on
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_handed_over_on(&self, node: &str) {
        *self
            .handed_over_on
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(node.to_string());
    }

    pub fn with_interruption_queue(mut self, queue: Option<Arc<crate::cloud::sqs::Queue>>) -> Self {
        self.interruption_queue = queue;
        self
    }

    /// Server-side applies the status of one of our custom resources with our
    /// single field manager, through the mutation gate.
    pub async fn apply_status<K>(
        &self,
        namespace: &str,
        name: &str,
        status: &impl serde::Serialize,
    ) -> crate::Result<()>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let kind = K::kind(&());
        let api: kube::Api<K> = kube::Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": kind,
            "status": status,
        });
        let object = format!("{}/{namespace}/{name}", kind.to_lowercase());
        self.mutations
            .perform(
                crate::mutation::Intent::own("patch_status", object),
                || async {
                    api.patch_status(
                        name,
                        &kube::api::PatchParams::apply(FIELD_MANAGER).force(),
                        &kube::api::Patch::Apply(&patch),
                    )
                    .await
                    .map_err(crate::Error::kube(format!(
                        "patch status of {kind} {namespace}/{name}"
                    )))
                },
            )
            .await?;
        Ok(())
    }

    /// Publishes an Event. Best effort: Events are for people, never a reason to
    /// fail a reconcile (1.20 even rejects some for cluster-scoped objects).
    pub async fn event(
        &self,
        on: &ObjectReference,
        type_: EventType,
        reason: Reason,
        action: &str,
        note: String,
    ) {
        self.event_related(on, None, type_, reason, action, note)
            .await
    }

    /// A Warning Event named by a condition's own reason, when the
    /// condition turns bad (see [`crate::events::ConditionEvent`]).
    pub async fn condition_event(&self, on: &ObjectReference, condition: &Condition, action: &str) {
        self.publish(
            on,
            None,
            EventType::Warning,
            &condition.reason,
            action,
            condition.message.clone(),
        )
        .await
    }

    /// [`Self::event`] about `related` as well (a NodeGroup's Event about
    /// one of its Nodes). kube's recorder makes an Event with the same
    /// object, reason and related object the next of a series: it patches
    /// the first one (keeping its note) instead of creating another. Naming
    /// the node keeps each node's Event (and note) its own, and a burst of
    /// them (150 interruptions at once) from racing to patch one object,
    /// which took the apiserver seconds per Event and slowed every call.
    pub async fn event_related(
        &self,
        on: &ObjectReference,
        related: Option<&ObjectReference>,
        type_: EventType,
        reason: Reason,
        action: &str,
        note: String,
    ) {
        debug_assert!(reason.allows(&type_), "{reason:?} sent as {type_:?}");
        self.publish(on, related, type_, reason.as_str(), action, note)
            .await
    }

    async fn publish(
        &self,
        on: &ObjectReference,
        related: Option<&ObjectReference>,
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
            note: Some(fit_note(note)),
            action: action.into(),
            secondary: related.cloned(),
        };
        if let Err(e) = self.recorder.publish(&event, on).await {
            debug!(error = %e, reason, "could not publish event");
        }
    }
}

/// The apiserver refuses an Event whose note is over 1 KiB.
pub const NOTE_LIMIT: usize = 1024;

/// Pure: `note` cut to fit [`NOTE_LIMIT`] bytes, at a character boundary,
/// saying how much was left out (a dry-run plan or a blocked drain can name
/// hundreds of instances or pods).
pub fn fit_note(note: String) -> String {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    // Room for the suffix, whatever the count's width.
    let room = NOTE_LIMIT - " ... (+99999999 more bytes left out)".len();
    let mut cut = room;
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    // Prefer ending at a list separator, so no name is cut in half.
    if let Some(sep) = note[..cut].rfind(", ")
        && sep > room / 2
    {
        cut = sep;
    }
    let left_out = note.len() - cut;
    format!("{} ... (+{left_out} more bytes left out)", &note[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_to_the_apiservers_limit_saying_what_was_left_out() {
        let short = "drained n1".to_string();
        assert_eq!(fit_note(short.clone()), short);
        let pods: Vec<String> = (0..200).map(|i| format!("web-{i:05}")).collect();
        let long = format!("left on n1: {}", pods.join(", "));
        let fitted = fit_note(long.clone());
        assert!(fitted.len() <= NOTE_LIMIT, "{}", fitted.len());
        assert!(fitted.starts_with("left on n1: web-00000, web-00001"));
        let left_out: usize = fitted
            .rsplit("(+")
            .next()
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("a count");
        let kept = fitted.split(" ... (+").next().expect("kept part");
        assert_eq!(kept.len() + left_out, long.len(), "the count is exact");
        assert!(
            kept.ends_with(|c: char| c.is_ascii_digit()),
            "no name cut: {kept}"
        );
        // Multi-byte text is cut at a character boundary.
        let wide = "ノード".repeat(400);
        let fitted = fit_note(wide);
        assert!(fitted.len() <= NOTE_LIMIT);
        assert!(fitted.starts_with("ノード"));
    }
}
