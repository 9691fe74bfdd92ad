//! Checks shared by the fuzz targets in `fuzz_targets/` and the seeded-corpus tests in
//! `tests/`.
//!
//! Each module takes one typed input (built by [`arbitrary`] from the fuzzer's bytes) and
//! panics when a property of DESIGN.md invariant 4 fails: nothing a peer sends may panic the
//! process, grow memory without bound, or stall other endpoints.
//!
//! - [`wire`]: `Header::parse` and `Hello::parse` on arbitrary bytes, and their round trips.
//! - [`deframer`]: the receive cache (`RxBuf`) fed an arbitrary stream cut into arbitrary
//!   reads, compared with a one-shot reference parse of the whole stream.
//! - [`engine`]: a protocol engine (`Core`) accepting a connection from a peer that sends
//!   arbitrary bytes, with the engine's send-completion and failure guarantees checked.
//! - [`handshake`]: the authenticated handshake (either side) against a peer sending
//!   well-formed, forged, replayed, reflected or mangled records: no endpoint is claimed,
//!   and no AUTH is sent, without the key; nothing secret in a refusal.
//! - [`rendezvous`]: the env + root rendezvous' records (hello, challenge, join, reply)
//!   from arbitrary bytes, and their MACs against forgery.
//!
//! [`corpus`] turns a seed into input bytes deterministically, so that the same checks run
//! on stable Rust without libFuzzer.

pub mod corpus;
pub mod deframer;
pub mod engine;
pub mod handshake;
pub mod rendezvous;
pub mod wire;
