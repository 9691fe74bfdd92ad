//! The reactor: the only layer that owns file descriptors and makes socket syscalls.
//!
//! Everything above it sees a *completion* interface, whichever backend runs: operations
//! are submitted ([`Backend::connect`], [`Backend::send`], [`Backend::recv`],
//! [`Backend::close`]) and their results come back as [`Event`]s from
//! [`Backend::poll`]. The io_uring backend maps each operation to an SQE; the epoll
//! backend performs the same operation with non-blocking calls when the socket is ready.
//!
//! Layout: each operation is described once (`op`: its memory, its io_uring SQE, its
//! non-blocking call, the meaning of its result); the connection table is written once
//! (`slots`: generation-tagged slots, deferred events, the direct-receive set); socket
//! set-up and listening are shared (`sys`, `listen`). A backend (`uring`, `epoll`)
//! supplies only submission and completion.
//!
//! Buffer ownership ("rent"): [`Backend::send`] takes a [`TxBatch`] and
//! [`Backend::recv`] an [`RxBuf`] *by value*; the backend keeps them in the connection's
//! slot while the kernel may touch them and hands them back in [`Event::Sent`] /
//! [`Event::Recv`]. Nothing is freed while an operation is in flight.
//!
//! # Contract every backend keeps
//!
//! (Checked for both backends by the conformance suite, `reactor/conformance.rs`.)
//! - at most one send and one receive in flight per connection (the caller guarantees it;
//!   a second one is refused as misuse, below);
//! - a send completes only when every byte of the batch is written, or with an error:
//!   short writes are resumed inside the backend;
//! - sends never raise `SIGPIPE` (`MSG_NOSIGNAL`);
//! - a receive completes with the bytes it committed at the start of `rx.spare_mut()`:
//!   whatever one read brought (`Ok(0)` = end of stream), except for a buffer that
//!   [`wants_all`](RxBuf::wants_all) of its bytes (a large payload, which nothing can use
//!   before its last byte): that one completes once, when its spare region is full, or
//!   early only at end of stream or on an error;
//! - misuse is answered, never panics, and every backend answers it the same way: the
//!   operation completes through the next `poll` with its buffer and `ENOTCONN` (no such
//!   connection), `ECANCELED` (closing), `EBUSY` (one already in flight) or `EINVAL`
//!   (a receive buffer without spare room);
//! - after [`Backend::close`], every pending operation of that connection still
//!   completes (with `ECANCELED` or the socket's error) and returns its buffer; then
//!   exactly one [`Event::Closed`] follows, after which the id may be reused;
//! - events of one connection are delivered in completion order.
//!
//! # Provided-buffer receive (io_uring only, opt-in)
//!
//! An extension, not part of [`Backend`]: [`AnyBackend::provided`] is `Some` only for a
//! backend that has it ([`ProvidedRecv`]). After [`ProvidedRecv::provide_buffers`]
//! succeeded, [`ProvidedRecv::recv_provided`] arms one multishot receive per connection
//! that stays armed until end of stream, an error or [`Backend::close`]. Each read
//! arrives as an [`Event::RecvProvided`] carrying a [`ProvidedBuf`] lent from a ring
//! shared by every connection; the caller parses it in place and drops it, which gives
//! it back to the ring. When the ring runs empty the kernel stops that connection's
//! receive (`ENOBUFS`); the backend re-arms it as soon as a buffer is back, and since
//! the unread bytes stay in the socket nothing is lost.

#![allow(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

pub(crate) use crate::buf::RxBuf;
pub(crate) use crate::buf::TxBatch;
pub(crate) use bufring::{ProvidedBuf, RingGeometry};
pub(crate) use config::SockOpts;

pub(crate) mod bufring;
pub(crate) mod config;
#[cfg(test)]
mod conformance;
#[cfg(feature = "epoll")]
pub(crate) mod epoll;
pub(crate) mod lend;
pub(crate) mod listen;
pub(crate) mod op;
pub(crate) mod slots;
pub(crate) mod sys;
#[cfg(feature = "uring")]
pub(crate) mod uring;

/// A connection slot in the reactor. Dense and reused after [`Event::Closed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ConnId(pub(crate) u32);

/// A completed operation.
#[derive(Debug)]
pub(crate) enum Event {
    /// The listener accepted a connection; the reactor owns the new socket.
    Accepted { conn: ConnId, peer: SocketAddr },
    /// An accept failed (the backend keeps accepting unless the listener is gone).
    AcceptError(io::Error),
    /// A connect finished.
    Connected {
        conn: ConnId,
        result: io::Result<()>,
    },
    /// A send finished: all bytes written (`Ok`) or an error. The batch comes back.
    Sent {
        conn: ConnId,
        batch: TxBatch,
        result: io::Result<()>,
    },
    /// A receive finished: `Ok(n)` bytes were committed into `rx` (0 = end of stream).
    Recv {
        conn: ConnId,
        rx: RxBuf,
        result: io::Result<usize>,
    },
    /// A provided-buffer receive produced data (`Ok(n)`, `data` holds the `n` bytes),
    /// hit end of stream (`Ok(0)`, no data) or failed (no data). The receive stays armed
    /// after data; drop `data` once parsed, which gives it back to the ring. Only the
    /// io_uring backend produces it ([`ProvidedRecv`]).
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    RecvProvided {
        conn: ConnId,
        data: Option<ProvidedBuf>,
        result: io::Result<usize>,
    },
    /// The connection's multishot receive stopped as asked by
    /// [`ProvidedRecv::pause_provided`]: every byte the kernel put in provided buffers was
    /// reported before this, the rest is still in the socket. Only io_uring produces it.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    ProvidedPaused { conn: ConnId },
    /// The socket is closed and no operation of it remains; the id may be reused.
    Closed { conn: ConnId },
}

/// What every backend offers. Enum-dispatched through [`AnyBackend`].
pub(crate) trait Backend {
    /// Short name printed by tools ("uring", "epoll").
    fn name(&self) -> &'static str;
    /// One line on the set-up in force (ring flags, readiness mode), for tools.
    fn describe(&self) -> String;
    /// Binds and listens (backlog SOMAXCONN) on `addr`; accepted connections arrive as
    /// [`Event::Accepted`]. Returns the bound address. May be called more than once.
    fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr>;
    /// Creates a non-blocking socket (bound to `bind` if given) and starts connecting.
    fn connect(&mut self, addr: SocketAddr, bind: Option<SocketAddr>) -> io::Result<ConnId>;
    /// Starts writing the whole batch (one gathered `sendmsg`, resumed on short writes).
    fn send(&mut self, conn: ConnId, batch: TxBatch);
    /// Writes what the socket takes of `pieces` (in order) now, with one non-blocking
    /// call, and returns that count: 0 when the connection has a send of its own in
    /// progress, is still connecting or closing, or the call fails (the batch's send of
    /// the same bytes then meets the error and reports it). `pieces` must be the head of
    /// the connection's next batch, which the caller then advances by the count; at most
    /// [`DIRECT_PIECES`](crate::buf::DIRECT_PIECES) of them are written.
    fn write_now(&mut self, conn: ConnId, pieces: &[&[u8]]) -> usize;
    /// Starts receiving into `rx.spare_mut()` (all of it when `rx.wants_all()`).
    fn recv(&mut self, conn: ConnId, rx: RxBuf);
    /// Closes the connection once its pending operations have completed (they are
    /// cancelled). Idempotent.
    fn close(&mut self, conn: ConnId);
    /// As [`close`](Self::close), abortively: the socket's unsent bytes are discarded
    /// and the peer gets a reset (`SO_LINGER` 0).
    fn reset(&mut self, conn: ConnId);
    /// Submits what is queued and collects completions into `out`. `None` never blocks;
    /// `Some(t)` waits up to `t` when no event is ready.
    fn poll(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()>;
    /// Hands the operations queued so far to the kernel without collecting completions
    /// (they come with the next [`poll`](Self::poll)) and without waiting: a send queued
    /// before this call is on its way when it returns, whatever the caller does next.
    fn submit(&mut self) -> io::Result<()>;
    /// Collects the completions that are ready into `out`, attempting no new I/O (no
    /// receive is tried, as [`poll`](Self::poll) may in poll mode) and never waiting.
    fn collect(&mut self, out: &mut Vec<Event>) -> io::Result<()>;
    /// Why an open connection whose receive just reported end of stream ended, when the
    /// kernel aborted it rather than the peer closing it (`sys::timeout_abort`), else
    /// `None`. (An io_uring send that had moved part of its data reports that count and
    /// the abort shows only as end of stream; the socket still tells.)
    fn end_cause(&self, conn: ConnId) -> Option<io::Error>;
    /// The socket of an open connection (not closing), for a socket option set from
    /// outside the backend; the descriptor stays the backend's.
    fn open_fd(&self, conn: ConnId) -> Option<RawFd>;
    /// Readies the backend to be waited for outside it: hands the kernel what is queued,
    /// and returns a descriptor that polls readable once the backend has something to
    /// collect (the epoll instance, with every socket in it; an eventfd the ring signals),
    /// or `None` when it has something already (call [`poll`](Self::poll)). The
    /// descriptor stays the backend's.
    fn prepare_wait(&mut self) -> io::Result<Option<RawFd>>;
    /// What the backend counted so far.
    fn counters(&self) -> Counters;
    /// Whether payloads long enough to lend are to be lent now, as the backend's send
    /// calls measure (see [`lend`]).
    fn lend_wanted(&self) -> bool;
}

/// Counters kept by a backend.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Send operations handed to the kernel (a batch takes more than one when it is
    /// offered in `send_chunk` pieces, has more than IOV_MAX parts, or is written short).
    pub(crate) send_calls: u64,
    /// Zero-copy sends completed (`SENDMSG_ZC`, io_uring only).
    pub(crate) zerocopy_sends: u64,
    /// Of those, how many the kernel copied after all.
    pub(crate) zerocopy_copied: u64,
    /// Provided-buffer receives stopped because the ring was empty (io_uring only).
    pub(crate) recv_starved: u64,
    /// Bytes of lent segments that went through a pipe into the socket.
    pub(crate) spliced_bytes: u64,
    /// Pipes made for lent segments (one serves every connection in turn).
    pub(crate) lend_pipes: u64,
    /// Of those, the ones open now (held while bytes are in them, or spare).
    pub(crate) lend_pipes_open: u64,
    /// The large send calls' costs, lent and copied, and the verdict (see [`lend`]).
    pub(crate) lend: lend::LendCosts,
}

/// Provided-buffer receive, the extension a backend may have besides [`Backend`] (see the
/// module documentation). Reached through [`AnyBackend::provided`].
pub(crate) trait ProvidedRecv {
    /// Sets up a ring of `geo.count` provided buffers of `geo.size` bytes shared by every
    /// connection. Call before any connection exists.
    fn provide_buffers(&mut self, geo: RingGeometry) -> io::Result<()>;
    /// Arms the connection's multishot receive on the provided buffers (idempotent).
    /// Returns false when no ring is set up: the caller then uses [`Backend::recv`].
    fn recv_provided(&mut self, conn: ConnId) -> bool;
    /// Stops the connection's multishot receive so that the next bytes can be read with
    /// [`Backend::recv`] into a buffer of the caller's (a large payload's destination);
    /// [`Event::ProvidedPaused`] follows once no multishot receive of it is in flight.
    /// [`recv_provided`](Self::recv_provided) resumes it. Idempotent.
    fn pause_provided(&mut self, conn: ConnId);
}

/// The type behind [`AnyBackend::provided`].
#[cfg(feature = "uring")]
pub(crate) type Provided = uring::Uring;
/// The type behind [`AnyBackend::provided`]: none can exist without io_uring.
#[cfg(not(feature = "uring"))]
pub(crate) type Provided = NoProvided;

/// No backend of this build has provided buffers: a value of this type cannot exist.
#[cfg(not(feature = "uring"))]
pub(crate) enum NoProvided {}

#[cfg(not(feature = "uring"))]
impl ProvidedRecv for NoProvided {
    fn provide_buffers(&mut self, _: RingGeometry) -> io::Result<()> {
        match *self {}
    }
    fn recv_provided(&mut self, _: ConnId) -> bool {
        match *self {}
    }
    fn pause_provided(&mut self, _: ConnId) {
        match *self {}
    }
}

/// The backend kinds that can be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Probe io_uring, fall back to epoll.
    Auto,
    /// io_uring completion ring.
    Uring,
    /// epoll readiness.
    Epoll,
}

/// Enum dispatch over the compiled-in backends.
// One instance per transport, created once and never moved on the hot path: boxing the
// larger variant would only add an indirection to every call.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyBackend {
    #[cfg(feature = "uring")]
    Uring(uring::Uring),
    #[cfg(feature = "epoll")]
    Epoll(epoll::Epoll),
}

macro_rules! forward {
    ($self:ident, $b:ident => $e:expr) => {
        match $self {
            #[cfg(feature = "uring")]
            AnyBackend::Uring($b) => $e,
            #[cfg(feature = "epoll")]
            AnyBackend::Epoll($b) => $e,
        }
    };
}

impl AnyBackend {
    /// The provided-buffer receive extension, for a backend that has it (io_uring).
    #[inline]
    pub(crate) fn provided(&mut self) -> Option<&mut Provided> {
        match self {
            #[cfg(feature = "uring")]
            AnyBackend::Uring(b) => Some(b),
            #[cfg(feature = "epoll")]
            AnyBackend::Epoll(_) => None,
        }
    }
}

impl Backend for AnyBackend {
    fn name(&self) -> &'static str {
        forward!(self, b => b.name())
    }
    fn describe(&self) -> String {
        forward!(self, b => b.describe())
    }
    fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        forward!(self, b => b.listen(addr))
    }
    fn connect(&mut self, addr: SocketAddr, bind: Option<SocketAddr>) -> io::Result<ConnId> {
        forward!(self, b => b.connect(addr, bind))
    }
    #[inline]
    fn send(&mut self, conn: ConnId, batch: TxBatch) {
        forward!(self, b => b.send(conn, batch))
    }
    #[inline]
    fn write_now(&mut self, conn: ConnId, pieces: &[&[u8]]) -> usize {
        forward!(self, b => b.write_now(conn, pieces))
    }
    #[inline]
    fn recv(&mut self, conn: ConnId, rx: RxBuf) {
        forward!(self, b => b.recv(conn, rx))
    }
    fn close(&mut self, conn: ConnId) {
        forward!(self, b => b.close(conn))
    }
    fn reset(&mut self, conn: ConnId) {
        forward!(self, b => b.reset(conn))
    }
    #[inline]
    fn poll(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()> {
        forward!(self, b => b.poll(timeout, out))
    }
    #[inline]
    fn submit(&mut self) -> io::Result<()> {
        forward!(self, b => b.submit())
    }
    #[inline]
    fn collect(&mut self, out: &mut Vec<Event>) -> io::Result<()> {
        forward!(self, b => b.collect(out))
    }
    fn end_cause(&self, conn: ConnId) -> Option<io::Error> {
        forward!(self, b => b.end_cause(conn))
    }
    fn open_fd(&self, conn: ConnId) -> Option<RawFd> {
        forward!(self, b => b.open_fd(conn))
    }
    fn prepare_wait(&mut self) -> io::Result<Option<RawFd>> {
        forward!(self, b => b.prepare_wait())
    }
    fn counters(&self) -> Counters {
        forward!(self, b => b.counters())
    }
    #[inline]
    fn lend_wanted(&self) -> bool {
        forward!(self, b => b.lend_wanted())
    }
}

/// Chooses the backend: the requested one, or for `Auto` io_uring when it works here and
/// epoll otherwise. Returns the backend and the note explaining a fallback, or why no
/// backend can run.
pub(crate) fn make_backend(
    kind: BackendKind,
    opts: SockOpts,
) -> Result<(AnyBackend, Option<String>), String> {
    sys::raise_nofile_limit();
    match kind {
        BackendKind::Uring => uring(opts).map(|b| (b, None)),
        BackendKind::Epoll => epoll(opts).map(|b| (b, None)),
        // Built without io_uring: epoll is the only choice, nothing to explain.
        BackendKind::Auto if !cfg!(feature = "uring") => epoll(opts).map(|b| (b, None)),
        BackendKind::Auto => match uring(opts.clone()) {
            Ok(b) => Ok((b, None)),
            Err(why) => {
                let b = epoll(opts).map_err(|e| format!("{why}; and the epoll backend: {e}"))?;
                let note = format!("io_uring unavailable ({why}): using the epoll backend");
                eprintln!("ringbtl: {note}");
                Ok((b, Some(note)))
            }
        },
    }
}

#[cfg(feature = "uring")]
fn uring(opts: SockOpts) -> Result<AnyBackend, String> {
    #[cfg(feature = "testing")]
    if testing::uring_unavailable() {
        return Err("io_uring: made unavailable by ringbtl::testing".into());
    }
    uring::Uring::new(opts)
        .map(AnyBackend::Uring)
        .map_err(|e| format!("io_uring: {e}"))
}

#[cfg(not(feature = "uring"))]
fn uring(_: SockOpts) -> Result<AnyBackend, String> {
    Err("io_uring: backend not compiled in (cargo feature `uring`)".into())
}

#[cfg(feature = "epoll")]
fn epoll(opts: SockOpts) -> Result<AnyBackend, String> {
    epoll::Epoll::new(opts)
        .map(AnyBackend::Epoll)
        .map_err(|e| format!("epoll: {e}"))
}

#[cfg(not(feature = "epoll"))]
fn epoll(_: SockOpts) -> Result<AnyBackend, String> {
    Err("epoll: backend not compiled in (cargo feature `epoll`)".into())
}

/// Failure injection for the crate's own tests (cargo feature `testing`, enabled only
/// by the crate's dev-dependency on itself, so never in a build of a user's program).
#[cfg(feature = "testing")]
pub mod testing {
    use std::sync::atomic::{AtomicBool, Ordering};

    static URING_UNAVAILABLE: AtomicBool = AtomicBool::new(false);

    /// From now on, in this process, creating an io_uring backend fails as it does on a
    /// kernel where io_uring is disabled (`kernel.io_uring_disabled`, seccomp, memlock).
    pub fn make_uring_unavailable() {
        URING_UNAVAILABLE.store(true, Ordering::Relaxed);
    }

    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(super) fn uring_unavailable() -> bool {
        URING_UNAVAILABLE.load(Ordering::Relaxed)
    }
}
