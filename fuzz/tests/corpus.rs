//! The fuzz checks on stable Rust: each target's check runs over a seeded corpus of inputs
//! generated deterministically, then over any saved inputs (see `ringbtl_fuzz::corpus`).
//!
//! `RINGBTL_FUZZ_CASES=N` changes the number of seeded inputs per target (default 3000);
//! `RINGBTL_FUZZ_SEED=S` starts the seeds at `S` instead of 0, to explore further;
//! `RINGBTL_FUZZ_SECS=T` keeps taking further seeds until `T` seconds have passed (random
//! testing without coverage feedback, for machines without cargo-fuzz).

use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use ringbtl_fuzz::{corpus, deframer, engine, handshake, rendezvous, wire};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `check` on every input of the target, naming the failing one.
fn run_all<T: for<'a> Arbitrary<'a>>(target: &str, check: fn(&T)) {
    let first = env_u64("RINGBTL_FUZZ_SEED", 0);
    let cases = env_u64("RINGBTL_FUZZ_CASES", 3000);
    let until = Instant::now() + Duration::from_secs(env_u64("RINGBTL_FUZZ_SECS", 0));
    let one = |data: &[u8], what: &dyn Fn() -> String| {
        let Ok(input) = T::arbitrary_take_rest(Unstructured::new(data)) else {
            return;
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&input)));
        if r.is_err() {
            panic!("{target}: {} fails", what());
        }
    };
    let mut seed = first;
    while seed < first + cases || Instant::now() < until {
        one(&corpus::bytes(seed), &|| format!("seed {seed}"));
        seed += 1;
    }
    eprintln!("{target}: {} seeded inputs from seed {first}", seed - first);
    for path in corpus::files(target) {
        let data = std::fs::read(&path).expect("readable input");
        one(&data, &|| format!("{}", path.display()));
    }
}

#[test]
fn wire_parse() {
    run_all("wire_parse", wire::run);
}

#[test]
fn deframer() {
    run_all("deframer", deframer::run);
}

#[test]
fn engine() {
    run_all("engine", engine::run);
}

#[test]
fn handshake() {
    run_all("handshake", handshake::run);
}

#[test]
fn rendezvous() {
    run_all("rendezvous", rendezvous::run);
}
