#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for SECONDS each (default 30); exits non-zero on a crash.
#
#   tools/fuzz.sh [SECONDS]
#
# With cargo-fuzz installed (`cargo install cargo-fuzz`) the targets run under libFuzzer,
# coverage-guided, on the nightly toolchain if rustup has one, otherwise on stable with
# RUSTC_BOOTSTRAP=1. A crash leaves its input in fuzz/artifacts/<target>/; replay it with
# `cargo fuzz run <target> <file>`, or on stable with `cargo test --manifest-path
# fuzz/Cargo.toml`, which replays every saved input. Once fixed, keep the input in
# fuzz/regressions/<target>/ (committed; artifacts are not), where CI replays it.
# Without cargo-fuzz the same checks run on stable over random seeded inputs for SECONDS
# each (no coverage feedback).
set -euo pipefail

secs=${1:-30}
cd "$(dirname "$0")/.."
targets=(wire_parse deframer engine handshake rendezvous)

if cargo fuzz --version >/dev/null 2>&1; then
    toolchain=()
    if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        toolchain=(+nightly)
    else
        export RUSTC_BOOTSTRAP=1
    fi
    for t in "${targets[@]}"; do
        echo "== fuzz $t for ${secs}s"
        cargo "${toolchain[@]}" fuzz run -O "$t" -- -max_total_time="$secs"
    done
else
    echo "cargo-fuzz not found: random inputs on stable, without coverage feedback" >&2
    for t in "${targets[@]}"; do
        echo "== fuzz $t for ${secs}s (seeded)"
        RINGBTL_FUZZ_SECS=$secs RINGBTL_FUZZ_SEED=$(date +%s) \
            cargo test --release --manifest-path fuzz/Cargo.toml --no-default-features \
            --test corpus -- --exact "$t" --nocapture
    done
fi
