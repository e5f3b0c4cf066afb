//! Whether this replica may act: a handle shared by the mutation gate and the
//! AWS clients' fence, renewed and revoked by the elector (`leader`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, watch};
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
    /// Asked to hand the lease over (its own node is being drained): not
    /// leading again until the elector has released the lease and waited.
    handing_over: AtomicBool,
    /// Wakes the elector to release the lease at once.
    hand_over_asked: Notify,
}

impl Leadership {
    /// Leader election disabled: this replica always leads.
    pub fn always() -> Self {
        Self {
            inner: Arc::new(Inner {
                valid_until: None,
                changes: watch::channel(true).0,
                handing_over: AtomicBool::new(false),
                hand_over_asked: Notify::new(),
            }),
        }
    }

    /// Leader election enabled: not leading until the elector says so.
    pub fn elected() -> Self {
        Self {
            inner: Arc::new(Inner {
                valid_until: Some(Mutex::new(None)),
                changes: watch::channel(false).0,
                handing_over: AtomicBool::new(false),
                hand_over_asked: Notify::new(),
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

    /// Whether leadership can go to another replica: only with leader
    /// election on.
    pub fn elected_by_lease(&self) -> bool {
        self.inner.valid_until.is_some()
    }

    /// Stops leading at once and asks the elector to hand the lease over,
    /// so a standby leads on its next round instead of after the lease
    /// expires. False (nothing done) with leader election off.
    pub fn hand_over(&self) -> bool {
        if !self.elected_by_lease() {
            return false;
        }
        self.inner.handing_over.store(true, Ordering::SeqCst);
        self.lost();
        self.inner.hand_over_asked.notify_one();
        true
    }

    /// The elector: whether a hand-over was asked, and a wait for one.
    pub(crate) fn handing_over(&self) -> bool {
        self.inner.handing_over.load(Ordering::SeqCst)
    }

    pub(crate) async fn hand_over_asked(&self) {
        self.inner.hand_over_asked.notified().await
    }

    /// The elector, once the lease is released and the standby had its
    /// chance: campaigning again.
    pub(crate) fn handed_over(&self) {
        self.inner.handing_over.store(false, Ordering::SeqCst);
    }

    pub(crate) fn renewed(&self, until: Instant) {
        // A renewal in flight when a hand-over was asked does not make us
        // lead again.
        if self.handing_over() {
            return;
        }
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
