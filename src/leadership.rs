//! Whether this replica may act: a handle shared by the mutation gate and the
//! AWS clients' fence, renewed and revoked by the elector (`leader`).

use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::time::Instant;

/// Shared view of whether this replica may act.
#[derive(Clone)]
pub struct Leadership {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None`: leader election is off, always leading.
    valid_until: Option<Mutex<Option<Instant>>>,
    changes: watch::Sender<bool>,
}

impl Leadership {
    /// Leader election disabled: this replica always leads.
    pub fn always() -> Self {
        Self {
            inner: Arc::new(Inner {
                valid_until: None,
                changes: watch::channel(true).0,
            }),
        }
    }

    /// Leader election enabled: not leading until the elector says so.
    pub fn elected() -> Self {
        Self {
            inner: Arc::new(Inner {
                valid_until: Some(Mutex::new(None)),
                changes: watch::channel(false).0,
            }),
        }
    }

    pub fn is_leading(&self) -> bool {
        match &self.inner.valid_until {
            None => true,
            Some(until) => {
                let until = *until.lock().unwrap_or_else(|p| p.into_inner());
                until.is_some_and(|t| Instant::now() < t)
            }
        }
    }

    /// Tests: lead until `until`, as a renewal would have it.
    #[cfg(any(test, feature = "test-support"))]
    pub fn lead_until(&self, until: Instant) {
        self.renewed(until);
    }

    /// Changes of leadership (true = leading).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.inner.changes.subscribe()
    }

    pub(crate) fn renewed(&self, until: Instant) {
        if let Some(slot) = &self.inner.valid_until {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
            self.inner
                .changes
                .send_if_modified(|leading| !std::mem::replace(leading, true));
        }
    }

    pub(crate) fn lost(&self) {
        if let Some(slot) = &self.inner.valid_until {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
            self.inner
                .changes
                .send_if_modified(|leading| std::mem::replace(leading, false));
        }
    }
}
