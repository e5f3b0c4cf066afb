//! Giving freed heap back to the system. glibc keeps memory freed in the
//! middle of its heaps (the decoded pages of a Node list, a superseded
//! cache, a large status) mapped until asked to release it: at 1,000 Nodes
//! 3.4 MiB of the manager's resident set was such free memory
//! (`benches/footprint.rs`, trimmed by hand). A trim after a full Node list
//! and once a minute returns it; it walks the free lists only, well under a
//! millisecond at this heap size.

use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often freed memory is given back outside a relist.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(60);

/// Returns the heap's free pages to the system. A no-op off glibc.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases glibc's own free lists;
    // it takes the allocator's locks and has no precondition on the caller.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims every `every` until `shutdown`.
pub async fn trim_periodically(every: Duration, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => release_freed(),
        }
    }
}
