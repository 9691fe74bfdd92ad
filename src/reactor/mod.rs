//! The reactor: the only layer that owns file descriptors and makes socket syscalls.
//!
//! Everything above it sees a *completion* interface, whichever backend runs: operations
//! are submitted ([`Backend::connect`], [`Backend::send`], [`Backend::recv`],
//! [`Backend::close`]) and their results come back as [`Event`]s from
//! [`Backend::poll`]. The io_uring backend maps each operation to an SQE; the epoll
//! backend performs the same operation with non-blocking calls when the socket is ready.
//!
//! Buffer ownership ("rent"): [`Backend::send`] takes a [`TxBatch`] and
//! [`Backend::recv`] an [`RxBuf`] *by value*; the backend keeps them in the connection's
//! slot while the kernel may touch them and hands them back in [`Event::Sent`] /
//! [`Event::Recv`]. Nothing is freed while an operation is in flight.
//!
//! Contract every backend keeps:
//! - at most one send and one receive in flight per connection (the caller guarantees it;
//!   the backend may `debug_assert!` it);
//! - a send completes only when every byte of the batch is written, or with an error:
//!   short writes are resumed inside the backend;
//! - sends never raise `SIGPIPE` (`MSG_NOSIGNAL`);
//! - after [`Backend::close`], every pending operation of that connection still
//!   completes (usually with `ECANCELED` or the socket's error) and returns its buffer;
//!   then exactly one [`Event::Closed`] follows, after which the id may be reused;
//! - events of one connection are delivered in completion order.
//!
//! Provided-buffer receives (io_uring only, opt-in): after [`Backend::provide_buffers`]
//! succeeded, [`Backend::recv_provided`] arms one multishot receive per connection that
//! stays armed until end of stream, an error or [`Backend::close`]. Each read arrives as an
//! [`Event::RecvProvided`] carrying a [`ProvidedBuf`] lent from a ring shared by every
//! connection; the caller parses it in place and gives it back with
//! [`Backend::recycle`] (dropping it does the same). When the ring runs empty the kernel
//! stops that connection's receive (`ENOBUFS`); the backend re-arms it as soon as a
//! buffer is back, and since the unread bytes stay in the socket nothing is lost.

#![allow(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

pub(crate) use crate::proto::recv_cache::RxBuf;
pub(crate) use crate::proto::tx::TxBatch;
pub(crate) use bufring::{ProvidedBuf, RingGeometry};

pub(crate) mod bufring;
#[cfg(test)]
mod conformance;
#[cfg(feature = "epoll")]
pub(crate) mod epoll;
pub(crate) mod sys;
#[cfg(feature = "uring")]
pub(crate) mod uring;

/// A connection slot in the reactor. Dense and reused after [`Event::Closed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ConnId(pub(crate) u32);

/// Socket options applied to every connected or accepted socket.
#[derive(Debug, Clone, Default)]
pub(crate) struct SockOpts {
    /// TCP_NODELAY.
    pub(crate) nodelay: bool,
    /// SO_SNDBUF when set (else kernel autotuning).
    pub(crate) sndbuf: Option<usize>,
    /// SO_RCVBUF when set (else kernel autotuning).
    pub(crate) rcvbuf: Option<usize>,
    /// TCP_USER_TIMEOUT when set (else the kernel's retransmission limit).
    pub(crate) user_timeout: Option<Duration>,
    /// SO_KEEPALIVE with TCP_KEEPIDLE / TCP_KEEPINTVL / TCP_KEEPCNT when set.
    pub(crate) keepalive: Option<crate::config::Keepalive>,
    /// TCP congestion control (`TCP_CONGESTION`), by peer (see `Congestion`).
    pub(crate) congestion: crate::config::Congestion,
    /// Most bytes one send call hands to the kernel (`None`: no limit).
    pub(crate) send_chunk: Option<usize>,
    /// Zero-copy sends (io_uring `SENDMSG_ZC`) for batches of at least this many bytes;
    /// `None` = never. The epoll backend ignores it.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) zerocopy_min: Option<usize>,
    /// Allow zero-copy on loopback peers too, where the kernel copies anyway (tests).
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) zerocopy_loopback: bool,
}

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
    /// after data; give `data` back with [`Backend::recycle`] once parsed. Only the
    /// io_uring backend produces it.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    RecvProvided {
        conn: ConnId,
        data: Option<ProvidedBuf>,
        result: io::Result<usize>,
    },
    /// The connection's multishot receive stopped as asked by
    /// [`Backend::pause_provided`]: every byte the kernel put in provided buffers was
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
    /// Starts one read into `rx.spare_mut()` (whole, with `MSG_WAITALL`, when
    /// `rx.wants_all()`).
    fn recv(&mut self, conn: ConnId, rx: RxBuf);
    /// Closes the connection once its pending operations have completed (they are
    /// cancelled). Idempotent.
    fn close(&mut self, conn: ConnId);
    /// Submits what is queued and collects completions into `out`. `None` never blocks;
    /// `Some(t)` waits up to `t` when no event is ready.
    fn poll(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()>;
    /// Sets up a ring of `geo.count` provided buffers of `geo.size` bytes shared by every
    /// connection, for [`recv_provided`](Self::recv_provided). `Ok(false)`: this backend
    /// has no provided buffers (epoll), receives stay single-shot. Call before any
    /// connection exists.
    fn provide_buffers(&mut self, geo: RingGeometry) -> io::Result<bool> {
        let _ = geo;
        Ok(false)
    }
    /// Arms the connection's multishot receive on the provided buffers (idempotent).
    /// Returns false when the backend has no provided buffers: the caller then uses
    /// [`recv`](Self::recv).
    fn recv_provided(&mut self, conn: ConnId) -> bool {
        let _ = conn;
        false
    }
    /// Stops the connection's multishot receive so that the next bytes can be read with
    /// [`recv`](Self::recv) into a buffer of the caller's (a large payload's
    /// destination); [`Event::ProvidedPaused`] follows once no multishot receive of it
    /// is in flight. [`recv_provided`](Self::recv_provided) resumes it. Idempotent;
    /// nothing for a backend without provided buffers.
    fn pause_provided(&mut self, conn: ConnId) {
        let _ = conn;
    }
    /// Returns a buffer lent by [`Event::RecvProvided`] to the ring.
    #[inline]
    fn recycle(&mut self, buf: ProvidedBuf) {
        drop(buf);
    }
    /// How many times a provided-buffer receive stopped because the ring was empty.
    fn recv_starved(&self) -> u64 {
        0
    }
    /// Why an open connection whose receive just reported end of stream ended, when the
    /// kernel aborted it rather than the peer closing it (see
    /// `sys::timeout_abort`). `None` by default: a backend whose operations always
    /// report a connection's error needs no second look.
    fn end_cause(&self, _conn: ConnId) -> Option<io::Error> {
        None
    }
    /// Zero-copy sends completed, and how many of them the kernel copied after all.
    fn zerocopy_counts(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Send operations handed to the kernel (a batch takes more than one when it is
    /// offered in `send_chunk` pieces, has more than IOV_MAX parts, or is written short).
    fn send_calls(&self) -> u64;
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
    fn recv(&mut self, conn: ConnId, rx: RxBuf) {
        forward!(self, b => b.recv(conn, rx))
    }
    fn close(&mut self, conn: ConnId) {
        forward!(self, b => b.close(conn))
    }
    #[inline]
    fn poll(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()> {
        forward!(self, b => b.poll(timeout, out))
    }
    fn provide_buffers(&mut self, geo: RingGeometry) -> io::Result<bool> {
        forward!(self, b => b.provide_buffers(geo))
    }
    #[inline]
    fn recv_provided(&mut self, conn: ConnId) -> bool {
        forward!(self, b => b.recv_provided(conn))
    }
    fn pause_provided(&mut self, conn: ConnId) {
        forward!(self, b => b.pause_provided(conn))
    }
    #[inline]
    fn recycle(&mut self, buf: ProvidedBuf) {
        forward!(self, b => b.recycle(buf))
    }
    fn recv_starved(&self) -> u64 {
        forward!(self, b => b.recv_starved())
    }
    fn end_cause(&self, conn: ConnId) -> Option<io::Error> {
        forward!(self, b => b.end_cause(conn))
    }
    fn zerocopy_counts(&self) -> (u64, u64) {
        forward!(self, b => b.zerocopy_counts())
    }
    fn send_calls(&self) -> u64 {
        forward!(self, b => b.send_calls())
    }
}
