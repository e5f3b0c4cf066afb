//! Crash points for the tests of persist-then-act. Built with the
//! `fault-injection` feature (tests only), a process started with
//! `SNM_CRASH_AT=<point>` aborts when it reaches that point, as `kill -9`
//! would: no cleanup, nothing flushed. Without the feature it compiles to nothing.

/// Aborts the process if it was asked to crash at `point`.
#[cfg(feature = "fault-injection")]
pub fn crash_point(point: &str) {
    if std::env::var("SNM_CRASH_AT").is_ok_and(|p| p == point) {
        eprintln!("crash point {point}: aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn crash_point(_point: &str) {}
