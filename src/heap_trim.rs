//! Giving freed heap back to the system. glibc keeps memory freed in the
//! middle of its heaps (the decoded pages of a Node list, a superseded
//! cache, a large status) mapped until asked to release it: at 1,000 Nodes
//! 3.4 MiB of the manager's resident set was such free memory
//! (`benches/footprint.rs`, trimmed by hand). A trim after a full Node list
//! and every 10 s returns it; it walks the free lists only, well under a
//! millisecond at this heap size. Every 10 s, not every minute: an
//! inventory pass at 1,000 nodes (an ASG description, the group status and
//! its JSON) leaves 2.5 MiB freed behind it, which a minute's trim kept
//! resident for most of the minute.

use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often freed memory is given back outside a relist.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// Sets glibc's allocator for a process that mostly waits: call before any
/// thread starts. A no-op off glibc.
///
/// - One arena: glibc gives each thread that meets contention an arena of
///   its own (up to 8 a core), and each keeps its own freed memory; the
///   manager's few threads (two workers, the blocking pool) mostly wait on
///   the network, so they share one. At 1,000 nodes polling AWS live, 3.4
///   MiB less resident (`benches/footprint.rs`).
/// - A fixed mmap threshold (128 KiB, glibc's starting value): a buffer
///   above it (a page of the Node list, an ASG description of 1,000
///   instances) is mapped and unmapped on its own. glibc otherwise raises
///   the threshold to the largest such buffer freed, and from then on
///   places them in the heap, where they fragment it.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc allocator parameters; called before
    // the runtime's threads exist, so no allocation races it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

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
