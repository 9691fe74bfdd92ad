//! The one way a test says it cannot run on this machine (no io_uring, no launcher, no
//! root for namespaces, no Slurm...): [`skip`] prints the reason where `cargo test` shows
//! it, or fails the test when `RINGBTL_REQUIRE_ALL=1` (CI sets it, so that nothing passes
//! there by not running). Shared by the integration tests (`tests/common`) and the
//! library's unit tests (`src/lib.rs` includes this file).

use std::io::Write;

/// The variable that turns every skip into a failure.
pub(crate) const REQUIRE_ALL: &str = "RINGBTL_REQUIRE_ALL";

/// Whether `RINGBTL_REQUIRE_ALL=1`: every test must run.
pub(crate) fn required() -> bool {
    std::env::var(REQUIRE_ALL).is_ok_and(|v| v.trim() == "1")
}

/// Reports that the current test cannot run here, and why. Panics (fails the test) when
/// [`required`]; otherwise writes one `SKIPPED` line straight to the process's stderr,
/// which the test harness does not capture, so that the reason shows in `cargo test`'s
/// output. The caller returns without asserting anything more.
#[track_caller]
pub(crate) fn skip(why: impl std::fmt::Display) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("test");
    if required() {
        panic!("{test} cannot run here: {why} ({REQUIRE_ALL}=1 requires every test to run)");
    }
    // Ignoring a failed write: a closed stderr cannot be reported anywhere else.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {why} (set {REQUIRE_ALL}=1 to fail instead)"
    );
}
