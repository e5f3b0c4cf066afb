//! Whether a sampler looked. A floor ("never below N Ready") or a ceiling
//! read from samples holds only if samples were taken all through the
//! period it claims: the first before the caller went on to disrupt
//! anything, the last after the caller said the period ended, enough of
//! them, and none far apart. A sampler that sampled once, or whose reads
//! all failed, reports a minimum over nothing; [`Coverage::assert_looked`]
//! fails it instead, saying how many samples it took.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest two samples (or the period's start and the first, or the
/// last and its end) may be apart. Samplers sample every 100–250 ms; the
/// slack is for a loaded machine's slow reads, not for skipped ones.
pub const MAX_GAP: Duration = Duration::from_secs(3);
/// The fewest samples that say anything about a period.
pub const MIN_SAMPLES: usize = 3;
/// How long [`wait_first`] and [`wait_after_end`] wait for a sample.
const WAIT: Duration = Duration::from_secs(30);

/// When a sampler's samples were taken.
#[derive(Debug, Clone)]
pub struct Coverage {
    /// When the sampler started.
    begun: Instant,
    /// When its caller saw its first sample and went on.
    armed: Option<Instant>,
    /// When its caller ended the period.
    ended: Option<Instant>,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Samples taken, and reads that failed (no sample).
    pub count: usize,
    pub failed: usize,
    /// The last failed read's error.
    last_error: Option<String>,
    /// The longest time between the start and the first sample, or between
    /// two samples.
    max_gap: Duration,
}

impl Default for Coverage {
    fn default() -> Self {
        Coverage::new(Instant::now())
    }
}

impl Coverage {
    pub fn new(begun: Instant) -> Coverage {
        Coverage {
            begun,
            armed: None,
            ended: None,
            first: None,
            last: None,
            count: 0,
            failed: 0,
            last_error: None,
            max_gap: Duration::ZERO,
        }
    }

    /// A sample taken at `at`.
    pub fn sampled(&mut self, at: Instant) {
        let previous = self.last.unwrap_or(self.begun);
        self.max_gap = self.max_gap.max(at.saturating_duration_since(previous));
        self.first.get_or_insert(at);
        self.last = Some(at);
        self.count += 1;
    }

    /// A read that failed: no sample, and said in a failure.
    pub fn failed(&mut self, error: impl std::fmt::Display) {
        self.failed += 1;
        self.last_error = Some(error.to_string());
    }

    /// The caller saw a sample and goes on (to disrupt something).
    pub fn arm(&mut self, at: Instant) {
        self.armed.get_or_insert(at);
    }

    /// The caller ends the period at `at`.
    pub fn end(&mut self, at: Instant) {
        self.ended.get_or_insert(at);
    }

    pub fn has_sample(&self) -> bool {
        self.count > 0
    }

    /// Whether a sample was taken after the end.
    pub fn sampled_after_end(&self) -> bool {
        matches!((self.ended, self.last), (Some(end), Some(last)) if last >= end)
    }

    /// Panics unless the samples cover the period `what` claims: armed
    /// (the first sample seen before the caller went on), ended with a
    /// sample after the end, at least [`MIN_SAMPLES`], and no two more
    /// than [`MAX_GAP`] apart. Says how many it took, and why reads failed.
    pub fn assert_looked(&self, what: &str) {
        let said = format!(
            "{what}: {} samples, {} failed reads (last error: {}), the longest gap {:?}",
            self.count,
            self.failed,
            self.last_error.as_deref().unwrap_or("none"),
            self.max_gap
        );
        assert!(
            self.armed.is_some(),
            "{said}: the first sample was not awaited before the period began"
        );
        assert!(
            self.sampled_after_end(),
            "{said}: no sample after the period ended"
        );
        assert!(self.count >= MIN_SAMPLES, "{said}: too few samples");
        assert!(
            self.max_gap <= MAX_GAP,
            "{said}: samples more than {MAX_GAP:?} apart"
        );
    }
}

/// What a sampler shares with its caller: its samples, with their
/// [`Coverage`].
pub trait Sampled {
    fn coverage(&mut self) -> &mut Coverage;
}

/// Waits (up to 30 s) until the sampler has a sample, then arms it: its
/// first sample precedes whatever the caller does next. A sampler with none
/// by then fails at [`Coverage::assert_looked`], with its counts.
pub async fn wait_first<S: Sampled>(shared: &Mutex<S>) {
    wait_for(shared, Coverage::has_sample).await;
    with(shared, |c| c.arm(Instant::now()));
}

/// Ends the period now and waits (up to 30 s) for a sample taken after it.
pub async fn wait_after_end<S: Sampled>(shared: &Mutex<S>) {
    with(shared, |c| c.end(Instant::now()));
    wait_for(shared, Coverage::sampled_after_end).await;
}

fn with<S: Sampled, T>(shared: &Mutex<S>, f: impl FnOnce(&mut Coverage) -> T) -> T {
    let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
    f(s.coverage())
}

async fn wait_for<S: Sampled>(shared: &Mutex<S>, done: impl Fn(&Coverage) -> bool) {
    let deadline = Instant::now() + WAIT;
    while !with(shared, |c| done(c)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    /// Samples every 250 ms from 0 to `until` ms, neither armed nor
    /// ended; and when they began.
    fn quarters(until: u64) -> (Instant, Coverage) {
        let start = Instant::now();
        let mut c = Coverage::new(start);
        for ms in (0..=until).step_by(250) {
            c.sampled(at(start, ms));
        }
        (start, c)
    }

    /// The same, armed at the first and ended at `end` ms.
    fn every_quarter(until: u64, end: u64) -> (Instant, Coverage) {
        let (start, mut c) = quarters(until);
        c.arm(start);
        c.end(at(start, end));
        (start, c)
    }

    #[test]
    fn samples_all_through_the_period_looked() {
        every_quarter(5_000, 4_900)
            .1
            .assert_looked("a steady sampler");
    }

    #[test]
    #[should_panic(expected = "1 samples, 0 failed reads")]
    fn a_sampler_that_sampled_once_fails() {
        let start = Instant::now();
        let mut c = Coverage::new(start);
        c.sampled(start);
        c.arm(start);
        c.end(start);
        c.assert_looked("once");
    }

    #[test]
    #[should_panic(expected = "0 samples, 7 failed reads (last error: refused)")]
    fn a_sampler_whose_reads_all_failed_fails() {
        let start = Instant::now();
        let mut c = Coverage::new(start);
        for _ in 0..7 {
            c.failed("refused");
        }
        c.arm(start);
        c.end(start);
        c.assert_looked("never read");
    }

    #[test]
    #[should_panic(expected = "samples more than 3s apart")]
    fn samples_far_apart_fail() {
        let (start, mut c) = every_quarter(1_000, 9_000);
        c.sampled(at(start, 9_500));
        c.assert_looked("a gap");
    }

    #[test]
    #[should_panic(expected = "no sample after the period ended")]
    fn a_period_ended_after_the_last_sample_fails() {
        every_quarter(5_000, 6_000).1.assert_looked("stopped early");
    }

    #[test]
    #[should_panic(expected = "not awaited before the period began")]
    fn a_first_sample_not_awaited_fails() {
        let (start, mut c) = quarters(2_000);
        c.end(at(start, 1_000));
        c.assert_looked("not armed");
    }
}
