//! # ringbtl-ffi: the C ABI of ringbtl
//!
//! A static library (`libringbtl_ffi.a`) and a shared library (`libringbtl_ffi.so`) that
//! put a C face on [`ringbtl::Transport`], described by the hand-written header
//! `ffi/include/ringbtl.h` (ABI version [`RINGBTL_ABI_VERSION`]). The Open MPI BTL
//! component is its first user.
//!
//! ```sh
//! cargo build --release -p ringbtl-ffi     # target/release/libringbtl_ffi.{a,so}
//! cc -std=c11 prog.c -Iffi/include target/release/libringbtl_ffi.a \
//!    -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
//! ```
//!
//! ## The contract, in short
//!
//! - `ringbtl_config_new` / `ringbtl_config_set` (by the `RINGBTL_*` variable names, with
//!   the environment's parser and range checks) / `ringbtl_config_from_env`, then
//!   `ringbtl_create` (consumes the configuration) and `ringbtl_destroy` (FIN, drain,
//!   close, free).
//! - `ringbtl_uris` publishes the local addresses; `ringbtl_add_peer` takes a peer's.
//!   `ringbtl_on_unknown_peer` sets a resolver asked when a process that was never added
//!   connects (after its handshake passed every other check): it may add the peer and
//!   accept (lazy add, as Open MPI adds remote processes on first contact).
//! - `ringbtl_register(tag, fn, ctx)`: a receive callback per tag; its bytes are borrowed
//!   for the call.
//! - `ringbtl_send(peer, tag, iov, iovcnt, cookie)`: a gather list of at most
//!   `ringbtl_max_segments()` pieces, sent without copying (small pieces are copied next
//!   to their header). The completion callback runs exactly once per accepted send, and
//!   only after the kernel is done with the bytes.
//! - `ringbtl_get(peer, key, addr, len, local_key, local_addr, cookie)`: `len` bytes of a
//!   region the peer registered as readable (`RINGBTL_REGION_PEER_READ`), written into
//!   one of ours; completes like a send once they are in place.
//! - `ringbtl_put(peer, key, addr, iov, iovcnt, cookie)`: the same gather list, written
//!   straight into a region the peer registered (`ringbtl_register_region`, which hands
//!   out the key; `ringbtl_deregister_region` takes it back). Completes like a send; a
//!   message sent after it arrives after its data is in place.
//! - `ringbtl_flush`: hands the queued sends to the kernel now, running no callback (for
//!   a caller that may block outside ringbtl right after sending).
//! - `ringbtl_progress` / `ringbtl_wait`: one pass; called from inside a callback they
//!   return 0 and do nothing, so callbacks may call anything that leads to them.
//! - Status codes (`RINGBTL_ERR_*`, negative) and a per-thread message,
//!   `ringbtl_last_error()`.
//!
//! ## Threads
//!
//! One thread drives a transport: every call on a handle, and every callback, happens on
//! it. There are no locks; a multi-threaded program serializes its calls.
//!
//! ## How it maps onto the library
//!
//! - Sends: each `ringbtl_iov_t` becomes a `Bytes::from_static` over the caller's memory
//!   (no allocation, nothing freed by the library), valid by the caller's promise until the
//!   completion.
//! - Receive: one dispatcher per tag registered with the transport looks up the C callback
//!   at each message, and lends the transport to the functions the callback calls.
//! - Completions and peer failures are queued during the pass and handed to C right after
//!   it, in order, when the callback may use the transport freely.
//! - Errors: [`ringbtl::Error`], [`ringbtl::SendError`] and [`ringbtl::FailReason`] map
//!   onto the codes; no panic crosses the boundary (`RINGBTL_ERR_INTERNAL`).
//! - Steady state allocates nothing on the send, progress, receive and completion paths
//!   (`tests/alloc.rs` counts).

mod config;
mod handle;
/// How a unit test says it cannot run here (the library's one helper).
#[cfg(test)]
#[path = "../../tests/common/skip.rs"]
mod skip;
mod status;

pub use config::{
    ringbtl_config_free, ringbtl_config_from_env, ringbtl_config_new, ringbtl_config_set,
    ringbtl_config_threads, RingbtlConfig,
};
pub use handle::{
    ringbtl_add_job, ringbtl_add_peer, ringbtl_add_peer_of_job, ringbtl_backend_name,
    ringbtl_create, ringbtl_deregister_region, ringbtl_destroy, ringbtl_flush,
    ringbtl_generate_job_key, ringbtl_get, ringbtl_job_public_key, ringbtl_link_stats,
    ringbtl_links_open, ringbtl_local_id, ringbtl_max_frame, ringbtl_max_segments,
    ringbtl_on_complete, ringbtl_on_error, ringbtl_on_unknown_peer, ringbtl_pending,
    ringbtl_progress, ringbtl_put, ringbtl_register, ringbtl_register_region, ringbtl_send,
    ringbtl_set_job_key, ringbtl_unregister, ringbtl_uris, ringbtl_wait, ringbtl_wait_fd,
    CompleteFn, ErrorFn, RecvFn, ResolveFn, Ringbtl, RingbtlIov, RingbtlLinkStats,
    RINGBTL_REGION_PEER_READ, RINGBTL_REGION_PEER_WRITE,
};
pub use status::*;

/// The ABI version this library implements (`RINGBTL_ABI_VERSION` in the header).
pub const RINGBTL_ABI_VERSION: u32 = 2;

/// The library's ABI version, to compare with the header's `RINGBTL_ABI_VERSION`.
#[no_mangle]
pub extern "C" fn ringbtl_abi_version() -> u32 {
    RINGBTL_ABI_VERSION
}
