//! libFuzzer entry point for [`ringbtl_fuzz::rendezvous`]; the properties checked are listed there.
//!
//! Coverage-guided, on a nightly toolchain (from the repository root):
//!
//! ```text
//! cargo +nightly fuzz run rendezvous -- -max_total_time=60
//! ```
//!
//! On stable, `RUSTC_BOOTSTRAP=1 cargo fuzz run rendezvous -- -max_total_time=60` does the same.
//! Without cargo-fuzz, `cargo test --manifest-path fuzz/Cargo.toml` runs the same checks
//! over a seeded corpus and replays any files in `fuzz/corpus/rendezvous` and
//! `fuzz/artifacts/rendezvous` (a crash found here is replayed on stable that way).
//! `tools/fuzz.sh [SECONDS]` runs every target in turn.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringbtl_fuzz::rendezvous::{run, Input};

fuzz_target!(|input: Input| run(&input));
