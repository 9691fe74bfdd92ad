//! # ringbtl
//!
//! A TCP byte-transfer layer for message passing between the processes of an HPC job on
//! Linux: it does the job of Open MPI's TCP BTL, built around an io_uring completion
//! ring, with an epoll backend for kernels or containers where io_uring is disabled.
//!
//! ## Architecture
//!
//! ```text
//!   application ──send(peer, tag, [Bytes])──▶ Transport ──handlers[tag](src, payload)──▶ application
//!                                                │  progress(): flush ▸ poll ▸ dispatch ▸ flush
//!                      ┌─────────────────────────┴──────────────────────────┐
//!                      │ proto::core::Core (sans-IO: no fds, no clock)       │
//!                      │  Endpoint per peer: Closed→Connecting→ConnectAck→   │
//!                      │  Connected / Failed; send queue; FIN; retries       │
//!                      │  Conn per socket: handshake, RxBuf cache, TxBatch   │
//!                      └─────────────▲───────────────────────┬──────────────┘
//!                        Event::{Recv,Sent,..}          Action::{Dial,Transmit,..}
//!                      ┌─────────────┴───────────────────────▼──────────────┐
//!                      │ reactor::AnyBackend: Uring (SQE/CQE) | Epoll         │
//!                      │ owns every fd and every buffer the kernel may touch  │
//!                      └──────────────────────────────────────────────────────┘
//! ```
//!
//! - **Reactor** (`reactor`): the only code with file descriptors and syscalls. It
//!   submits connect / accept / gathered `sendmsg` / `recv` / close and reports their
//!   completions. Buffers are *rented*: a [`TxBatch`](buf::TxBatch) or
//!   [`RxBuf`](buf::RxBuf) (neutral byte containers, [`buf`]) is moved into the operation
//!   and handed back with its completion, so nothing the kernel may touch can be freed or
//!   moved early. The reactor knows no protocol type.
//! - **Protocol engine** ([`proto::core::Core`]): the endpoint state machine of the BTL
//!   (handshake with magic, version, process id and job token; simultaneous-connect
//!   resolution; FIN on clean close; failure reported to every pending send), the send
//!   queue and the receive cache. Pure data in, actions out: unit-tested without sockets.
//! - **Wire format** ([`wire`]): a 100-byte handshake record (mutual challenge-response
//!   over the job key, or the pair key of two jobs) and an 8-byte frame header,
//!   big-endian, documented there. Frames are active messages (SEND), one-sided puts into
//!   memory the receiver registered (PUT) and FIN.
//! - **Wire-up** ([`wireup`]): at start-up only. With [`WireupConfig::listen`] `None` the
//!   transport selects interfaces (`RINGBTL_IF_INCLUDE` / `RINGBTL_IF_EXCLUDE`), listens
//!   on the wildcard address of each family on one port (`RINGBTL_PORT` or ephemeral) and
//!   publishes [`Transport::uris`]; ranks exchange those through PMIx (the system's
//!   libpmix, opened at run time), PMI-1 / PMI-2 or the env + root rendezvous, and
//!   [`Transport::add_peer_uris`] orders each peer's addresses by subnet and binds the
//!   dialing socket to the matching local address.
//!   [`wireup::probe`] asks an address whether a ringbtl process listens there.
//! - **Transport** ([`Transport`]): the public API. One thread drives it; handlers run
//!   on that thread, get the payload in place in the receive cache, and may send.
//! - **Configuration** ([`Config`]): the settings of each layer ([`CoreConfig`],
//!   [`SocketConfig`], [`WireupConfig`]) and the transport's own, each layer declaring
//!   its parameters in a table ([`param`]) that drives parsing from the environment,
//!   validation of values set in code and in the environment alike, the README's
//!   configuration table and `ringbtl-bench --print-config`.
//!
//! ## Guarantees
//!
//! 1. Every send that [`Transport::send`] accepted completes exactly once (`Ok` or an
//!    error with the reason), through the [`Transport::on_complete`] callback.
//! 2. Per peer, messages arrive in the order they were sent, none twice, none lost:
//!    at most one gathered send is in flight per socket; frames queued meanwhile leave
//!    together in the next one.
//! 3. Nothing a peer sends can panic the process or make it allocate more than the
//!    configured maximum frame size per connection; a violation fails that peer only.
//!    A large payload's buffer grows as its bytes arrive (from 256 KiB, doubling), not
//!    on the word of its header, and a frame whose bytes stop for
//!    `RINGBTL_FRAME_STALL_MS` fails its connection. (We chose growth over a cap on the
//!    memory of frames in progress: a cap would have to refuse or stall legitimate large
//!    messages when many arrive at once; growth costs a stalled peer only what it sent.)
//! 4. Steady state does not allocate per message (see `tests/alloc.rs`).
//! 5. Admission is fair: an accepted connection whose handshake is not complete holds a
//!    slot only until its first-bytes and handshake deadlines; past the half-open limits
//!    (in all, and per source address) the oldest such connection is closed to admit
//!    the newcomer; a dialer whose connection is closed, reset or refused as a duplicate
//!    during the handshake retries until `RINGBTL_CONNECT_TIMEOUT_MS`. Running out of
//!    descriptors pauses accepting (no busy loop); the soft `RLIMIT_NOFILE` is raised
//!    to the hard limit once per process.
//! 6. A put ([`Transport::put`]) writes only inside a region the receiver registered
//!    ([`Transport::register_region`]): the whole write is checked against the region
//!    before a byte lands, a write outside every region fails that peer, and a region
//!    cannot be deregistered while a put is being received into it. A get
//!    ([`Transport::get`]) reads only a region its owner registered as readable
//!    ([`RegionAccess::ReadWrite`]), checked the same way, and that region cannot be
//!    deregistered while the reply still reads it; a peer's gets pin at most four times
//!    `RINGBTL_MAX_QUEUED_BYTES` and the maximum frame of replies, past which it fails.
//! 7. A peer that stops reading cannot grow the send queue without bound: past
//!    `RINGBTL_MAX_QUEUED_BYTES` for one peer, [`Transport::send`] returns
//!    [`SendError::WouldBlock`] and does not accept the message; progress, then send it
//!    again.
//!
//! ## Backends
//!
//! | cargo feature | backend | notes |
//! |---|---|---|
//! | `uring` (default) | io_uring ring with `SINGLE_ISSUER`, `DEFER_TASKRUN`, `TASKRUN_FLAG` when the kernel has them | one ring per transport |
//! | `epoll` (default) | non-blocking sockets + epoll | same protocol, same tests |
//!
//! The cargo feature `pmix` has no effect and is kept only so that builds which name it
//! keep working: every build speaks PMIx, through the system's `libpmix` opened at run
//! time when a launcher offers PMIx (`mpirun`, `srun --mpi=pmix`; see [`wireup::pmix`]).
//! Nothing is linked at build time, so a plain `cargo build --release` runs under
//! `mpirun`, `srun --mpi=pmix`, `srun --mpi=pmi2` and `mpiexec.hydra` alike.
//!
//! With both compiled in, [`BackendKind::Auto`] probes io_uring (ring creation and the
//! opcodes used: `SENDMSG`, `RECV`, `CONNECT`, `ACCEPT`, `ASYNC_CANCEL`, `CLOSE`) and falls
//! back to epoll with one line on stderr saying why (`kernel.io_uring_disabled`, a
//! seccomp profile, `RLIMIT_MEMLOCK`...). `RINGBTL_BACKEND=uring|epoll|auto` or
//! [`SocketConfig::backend`] force a choice; a forced backend that cannot run is an error.
//!
//! ## Kernel requirements
//!
//! io_uring backend: Linux 5.19 or newer for multishot accept (older kernels use
//! single-shot accept), 6.0 for the opt-in multishot receive on provided buffers
//! ([`SocketConfig::recv_multishot`]), 6.1 for `DEFER_TASKRUN`; the ring's memory (and the
//! provided-buffer ring's descriptor page) counts against `RLIMIT_MEMLOCK` on kernels
//! before 5.12. epoll backend: any Linux.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod buf;
pub mod config;
pub mod error;
pub mod param;
pub mod proto;
pub(crate) mod reactor;
pub mod transport;
pub mod wire;
pub mod wireup;

/// How a unit test says it cannot run here (shared with the integration tests).
#[cfg(test)]
#[path = "../tests/common/skip.rs"]
pub(crate) mod skip;

pub use buf::{Access as RegionAccess, RegionError};
pub use config::{
    Config, Congestion, CoreConfig, Keepalive, ProgressMode, Setting, SocketConfig, WireupConfig,
};
pub use error::{Cause, Errno, Error, FailReason, ProbeError, ProtoError, SendError, WireError};
pub use param::Origin;
pub use proto::core::MAX_SEGMENTS;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use reactor::testing;
pub use reactor::BackendKind;
pub use transport::{Am, Completion, Stats, Transport};
pub use wire::{PeerId, PutTarget, Tag};
pub use wireup::parse_uri_list;

#[cfg(not(any(feature = "uring", feature = "epoll")))]
compile_error!("ringbtl needs a backend: enable the `uring` and/or `epoll` cargo feature");

/// The README's example compiles (checked by `cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
