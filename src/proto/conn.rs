//! The connection table: one [`Conn`] per socket, indexed by the driver's [`ConnKey`],
//! from accept or dial to close: its handshake stage, deadline, send batch and receive
//! buffers; and admission of incoming connections. No I/O here.
//!
//! # Admission
//!
//! An accepted connection whose handshake is not complete is a *stranger*, whatever
//! records the handshake exchanges: it holds a handshake-sized buffer (1 KiB once its
//! HELLO is answered, for the AUTH and the frames behind it) and a slot, and nothing
//! else, for a short fixed time. Strangers may not crowd out a legitimate peer:
//!
//! - a stranger must send its first bytes within
//!   [`first_bytes_timeout`](crate::proto::config::CoreConfig::first_bytes_timeout), and
//!   finish its handshake within
//!   [`handshake_timeout`](crate::proto::config::CoreConfig::handshake_timeout) of its
//!   accept;
//! - a newcomer is always admitted: when its source already has
//!   [`max_half_open_per_source`](crate::proto::config::CoreConfig::max_half_open_per_source)
//!   strangers, the oldest of them is closed; else, when
//!   [`max_half_open`](crate::proto::config::CoreConfig::max_half_open) strangers exist,
//!   the oldest of all is closed (counted in [`Counters::accept_overload`]).
//!
//! - when the process has no descriptor left for the next connection, the oldest stranger
//!   is closed ([`Core::handle_accept_exhausted`]) rather than accepting stopping while
//!   the listen backlog fills with more of a flood; and the driver bounds `max_half_open`
//!   by the descriptors the process may open.
//!
//! A flood of idle connections therefore only ever closes flooding connections older
//! than the newest legitimate one, and a legitimate dialer whose connection was closed
//! all the same retries within its connect deadline (`endpoint.rs`).
//!
//! [`Counters::accept_overload`]: crate::proto::core::Counters::accept_overload

use std::net::IpAddr;
use std::time::Instant;

use crate::buf::{RxBuf, TxBatch};
use crate::error::{FailReason, ProtoError, WireError};
use crate::proto::core::{slot, ConnKey, Cookies, Core, CoreEvent, IdleCopy, Lending, Todo};
use crate::proto::deframe::{self, Deframer};
use crate::proto::handshake::Handshake;
use crate::wire::{HelloKind, PeerId, RejectReason, HELLO_LEN};

/// What [`Core::strangers`] counts.
#[derive(Default)]
struct Strangers {
    all: usize,
    same: usize,
    oldest: Option<(u64, u32)>,
    oldest_same: Option<(u64, u32)>,
}

/// The sends of a batch rented to the driver when their endpoint failed: the peer, the
/// reason, and their cookies.
pub(super) type Orphans = (PeerId, FailReason, Cookies);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Acceptor: waiting for the dialer's HELLO.
    ExpectHello,
    /// Acceptor: the HELLO claims a process id the engine does not know; waiting for
    /// the driver's [`Core::resolve_unknown`] (the peer is in `Conn::peer`).
    Resolving,
    /// Acceptor: CHALLENGE sent, waiting for the dialer's AUTH (the claimed process id
    /// is not trusted yet).
    ExpectAuth,
    /// Dialer: connect in progress.
    Connecting,
    /// Dialer: HELLO sent, waiting for the acceptor's CHALLENGE.
    ExpectChallenge,
    /// Dialer: AUTH sent, waiting for ACCEPT/REJECT.
    ExpectAccept,
    /// Adopted by an endpoint; frames flow.
    Open,
    /// Being closed: ignore everything until the driver reports it closed.
    Dead,
}

#[derive(Debug)]
pub(super) struct Conn {
    pub(super) stage: Stage,
    /// The peer, once known (dialer: from the start; acceptor: after HELLO).
    pub(super) peer: Option<PeerId>,
    /// Send batch; `None` while rented to the driver (in flight). The only record of
    /// "a send is in flight on this connection".
    pub(super) tx: Option<TxBatch>,
    /// The cookies of the rented batch when its endpoint failed, and why: they complete
    /// only when the batch comes back, since until then the kernel may still read the
    /// caller's payload memory (which a C caller frees at the completion).
    pub(super) orphans: Option<Orphans>,
    /// The batch holds bytes not yet submitted (a Transmit is queued).
    pub(super) tx_ready: bool,
    /// Close once the current batch is written (a REJECT, or our FIN).
    pub(super) close_after_tx: bool,
    /// Receive buffer (the cache, or a large payload's buffer); `None` while rented.
    pub(super) rx: Option<RxBuf>,
    /// Deframing state beside `rx`.
    pub(super) deframer: Deframer,
    /// A [`Todo::PauseProvided`] was issued and its confirmation has not come yet.
    pub(super) pausing: bool,
    /// Handshake deadline; on an open connection, the time by which the frame in
    /// progress must see its next bytes (`frame_stall`).
    pub(super) deadline: Option<Instant>,
    /// Accepted and not yet open (a stranger, see the module documentation): when it
    /// was accepted, and its rank among accepts (smaller is older).
    pub(super) accepted_at: Option<(Instant, u64)>,
    /// Where a stranger comes from, when the driver said.
    pub(super) src: Option<IpAddr>,
    /// A stranger that has sent no byte yet (its deadline is the first-bytes one).
    pub(super) awaiting_first_bytes: bool,
    /// Nonces and claimed process id while the handshake runs.
    pub(super) hs: Option<Box<Handshake>>,
    /// A handshake record written while the batch was with the driver (the peer's answer
    /// can be read before our previous record's send completes): it joins the batch when
    /// the batch comes back.
    pub(super) held: Vec<u8>,
    /// Acceptor: adopted from the peer's HELLO, and no byte from the peer on it yet. Our
    /// frames wait until one comes: the dialer may have given up on this dial before it
    /// read our ACCEPT (see [`Core::unconfirmed_lost`]).
    pub(super) unconfirmed: bool,
    /// Dialer: the frames at the front of the endpoint's queue that were written right
    /// behind our AUTH on this connection (see [`Core::send_early`]). They stay queued
    /// until the acceptor's answer: ACCEPT completes them, anything else leaves them to
    /// the next connection.
    pub(super) early: u32,
    /// The last batch handed to the driver held one frame (a ping-pong, a request and
    /// its answer): a frame that finds the batch empty and nothing queued is written at once
    /// ([`Core::direct_pieces`]) rather than at the next flush, where a stream's frames
    /// are gathered.
    pub(super) solo: bool,
    /// Which payloads that find their peer idle are copied (the driver decides,
    /// [`Core::set_idle_copy`]).
    pub(super) idle_copy: IdleCopy,
    /// Which large payloads are lent (the driver decides, [`Core::set_lending`]).
    pub(super) lending: Lending,
    /// Once a large message that found its peer idle and was copied has left, the socket
    /// acknowledges at once ([`Core::set_quick_ack`]).
    pub(super) quick_ack: bool,
    /// The batch (with the driver, or being filled) carries such a message: when it
    /// comes back, the socket is set to acknowledge at once ([`Core::handle_sent`]).
    pub(super) answer_quick: bool,
    /// Which link of its endpoint this connection is (0: the first; see `links.rs`).
    pub(super) link: u8,
    /// The number (on the scale of `Endpoint::head_seq`) of the first frame of the
    /// batch, set as the batch takes its first frame: with runs on several links, batches
    /// come back out of order.
    pub(super) tx_first: u64,
    /// Bytes of frames put into this connection's batches (`Core::spread` gives the next
    /// frames to the one that carried the fewest).
    pub(super) tx_bytes: u64,
    /// Frames of the peer's stream consumed on this connection (see `failover.rs`).
    pub(super) rx_frames: u64,
    /// The endpoint's primary while a standby link is open: reads make a CONFIRM due.
    pub(super) confirms: bool,
    /// While `confirms`: bytes of the peer's frames (headers counted) consumed since the
    /// last count we sent; `u32::MAX` after a FIN or a frame longer than
    /// [`KEEP_COPY_MAX`](crate::wire::KEEP_COPY_MAX), whose sender waits for the count
    /// (see "Links" in [`wire`](crate::wire)). See [`count_due`](Self::count_due).
    pub(super) rx_lazy: u32,
    /// While a count is owed and not due (`rx_lazy`): it leaves by then at the latest
    /// ([`CONFIRM_LAZY`](crate::proto::failover::CONFIRM_LAZY) after the first frame it
    /// covers), so that the peer's kept frames and its probes do not wait for our next
    /// frames without end.
    pub(super) confirm_at: Option<Instant>,
    /// A failed primary whose batch was with the driver when it failed over.
    pub(super) failed_over: bool,
    /// Reading is held ([`Core::hold_reading`]): the walk stops before the next frame,
    /// and the receive buffer stays here, with the bytes it holds, instead of going back
    /// to a read.
    pub(super) hold_rx: bool,
    /// While `hold_rx`: the buffer in `rx` waits for [`Core::resume_reading`], which
    /// walks it again before the next read.
    pub(super) rx_parked: bool,
}

impl Conn {
    /// `own_cache`: the connection reads into its own cache (not into provided buffers).
    pub(super) fn new(stage: Stage, peer: Option<PeerId>, cache: usize, own_cache: bool) -> Self {
        Self {
            stage,
            peer,
            tx: Some(TxBatch::with_capacity(HELLO_LEN, 2)),
            orphans: None,
            tx_ready: false,
            close_after_tx: false,
            rx: Some(deframe::cache(cache)),
            deframer: if own_cache {
                Deframer::own_cache()
            } else {
                Deframer::default()
            },
            pausing: false,
            deadline: None,
            accepted_at: None,
            src: None,
            awaiting_first_bytes: false,
            hs: None,
            held: Vec::new(),
            unconfirmed: false,
            early: 0,
            solo: false,
            idle_copy: IdleCopy::Full,
            lending: Lending::Streams,
            quick_ack: false,
            answer_quick: false,
            link: 0,
            tx_first: 0,
            tx_bytes: 0,
            rx_frames: 0,
            confirms: false,
            rx_lazy: 0,
            confirm_at: None,
            failed_over: false,
            hold_rx: false,
            rx_parked: false,
        }
    }

    /// Whether the count of the peer's frames consumed here leaves at once: a sender
    /// waits for it, or more than [`LAZY_BYTES`](crate::proto::failover::LAZY_BYTES)
    /// were consumed since the last.
    #[inline]
    pub(super) fn count_due(&self) -> bool {
        self.rx_lazy > crate::proto::failover::LAZY_BYTES
    }

    /// Accepted, handshake not complete, not closing.
    pub(super) fn is_stranger(&self) -> bool {
        self.accepted_at.is_some() && !matches!(self.stage, Stage::Open | Stage::Dead)
    }

    pub(super) fn write_record(&mut self, h: &crate::wire::Hello) {
        match self.tx.as_mut() {
            Some(b) => b.push_copy(&h.to_bytes()),
            None => self.held.extend_from_slice(&h.to_bytes()),
        }
    }
}

impl Core {
    /// The listener accepted a connection, from a source the driver does not name
    /// (no per-source limit applies to it).
    pub fn handle_accepted(&mut self, now: Instant, conn: ConnKey) {
        self.admit(now, conn, None);
    }

    /// The listener accepted a connection from `src`. Admission is fair (see the
    /// module documentation of `conn.rs`): the newcomer is always admitted, and the
    /// oldest stranger of its source, or of all, makes room when the limits are reached.
    pub fn handle_accepted_from(&mut self, now: Instant, conn: ConnKey, src: IpAddr) {
        self.admit(now, conn, Some(src));
    }

    /// The process has no descriptor left for the listener's next connection (the driver
    /// saw `EMFILE` or the like): the oldest stranger is closed to make room, counted in
    /// [`Counters::accept_overload`](crate::proto::core::Counters::accept_overload), so
    /// that accepting goes on rather than leaving a legitimate peer queued behind a flood
    /// in the listen backlog. Returns whether there was a stranger to close.
    pub fn handle_accept_exhausted(&mut self) -> bool {
        let Strangers { oldest, .. } = self.strangers(None);
        if let Some((_, i)) = oldest {
            self.evict(ConnKey(i));
        }
        oldest.is_some()
    }

    /// The strangers of the table: how many in all and from `src`, and the oldest of each
    /// as (rank among accepts, slot). One pass.
    fn strangers(&self, src: Option<IpAddr>) -> Strangers {
        let mut s = Strangers::default();
        for (i, c) in self.conns.iter().enumerate() {
            let Some(c) = c.as_ref().filter(|c| c.is_stranger()) else {
                continue;
            };
            let at = (c.accepted_at.expect("a stranger was accepted").1, i as u32);
            s.all += 1;
            s.oldest = Some(s.oldest.map_or(at, |o| o.min(at)));
            if src.is_some() && c.src == src {
                s.same += 1;
                s.oldest_same = Some(s.oldest_same.map_or(at, |o| o.min(at)));
            }
        }
        s
    }

    /// Closes the stranger `conn` to make room for others.
    fn evict(&mut self, conn: ConnKey) {
        self.counters.accept_overload += 1;
        self.kill_conn(conn);
        self.events.push_back(CoreEvent::Refused {
            why: ProtoError::Evicted,
        });
    }

    fn admit(&mut self, now: Instant, conn: ConnKey, src: Option<IpAddr>) {
        let s = self.strangers(src);
        let victim = if s.same >= self.cfg.max_half_open_per_source {
            s.oldest_same
        } else if s.all >= self.cfg.max_half_open {
            s.oldest
        } else {
            None
        };
        if let Some((_, i)) = victim {
            self.evict(ConnKey(i));
        }
        let deadline = now + self.cfg.first_bytes_timeout.min(self.cfg.handshake_timeout);
        // A handshake-sized buffer: the cache grows when the connection is adopted.
        let mut c = Conn::new(Stage::ExpectHello, None, HELLO_LEN, !self.cfg.multishot);
        c.deadline = Some(deadline);
        self.accepts += 1;
        c.accepted_at = Some((now, self.accepts));
        c.src = src;
        c.awaiting_first_bytes = true;
        self.put_conn(conn, c);
        self.arm_timer(deadline);
        self.todo.push_back(Todo::Receive(conn));
    }

    /// A stranger's first bytes arrived: the rest of its handshake has until the
    /// handshake deadline, counted from the accept.
    #[cold]
    pub(super) fn first_bytes(&mut self, conn: ConnKey) {
        let handshake = self.cfg.handshake_timeout;
        let Some(c) = self.conn_mut(conn) else { return };
        c.awaiting_first_bytes = false;
        if let (Some((at, _)), Some(_)) = (c.accepted_at, c.deadline) {
            let d = at + handshake;
            c.deadline = Some(d);
            self.arm_timer(d);
        }
    }

    /// The driver closed the socket and no operation of it remains: forget it.
    pub fn handle_closed(&mut self, conn: ConnKey) {
        if let Some(slot) = self.conns.get_mut(conn.0 as usize) {
            // The batch comes back before the close; should it not have, its sends
            // still complete once.
            if let Some(o) = slot.take().and_then(|c| c.orphans) {
                self.complete_orphans(o);
            }
        }
    }

    pub(super) fn put_conn(&mut self, conn: ConnKey, c: Conn) {
        let i = conn.0 as usize;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        self.conns[i] = Some(c);
    }

    pub(super) fn kill_conn(&mut self, conn: ConnKey) {
        self.end_conn(conn, false);
    }

    /// As [`kill_conn`](Self::kill_conn), abortively ([`Action::Reset`](crate::proto::core::Action::Reset)).
    pub(super) fn reset_conn(&mut self, conn: ConnKey) {
        self.end_conn(conn, true);
    }

    fn end_conn(&mut self, conn: ConnKey, reset: bool) {
        if let Some(c) = slot(&mut self.conns, conn.0) {
            // A Dead connection was closed already, unless a REJECT is still being written.
            if c.stage != Stage::Dead || c.close_after_tx {
                c.stage = Stage::Dead;
                self.ended += 1;
                c.deadline = None;
                c.tx_ready = false;
                c.close_after_tx = false;
                self.todo.push_back(if reset {
                    Todo::Reset(conn)
                } else {
                    Todo::Close(conn)
                });
            }
        }
    }

    /// Answers a refused incoming connection and closes it once the answer is out.
    pub(super) fn reject(&mut self, conn: ConnKey, reason: RejectReason) {
        self.answer_and_close(conn, HelloKind::Reject(reason));
    }

    /// Writes a handshake record on `conn` and closes it once the record is out.
    pub(super) fn answer_and_close(&mut self, conn: ConnKey, kind: HelloKind) {
        let rec = self.record(kind);
        let Some(c) = slot(&mut self.conns, conn.0) else {
            return;
        };
        c.stage = Stage::Dead;
        self.ended += 1;
        c.deadline = None;
        c.hs = None;
        c.write_record(&rec);
        c.close_after_tx = true;
        c.tx_ready = true;
        // Closed by `handle_sent` once the answer is written: closing now would cancel it.
        self.todo.push_back(Todo::Transmit(conn));
    }

    /// Not a ringbtl peer, or nonsense during the handshake: drop the socket, count it.
    pub(super) fn handshake_garbage(&mut self, conn: ConnKey, why: ProtoError) {
        let Some(c) = self.conn_mut(conn) else { return };
        let (stage, peer) = (c.stage, c.peer);
        if why == ProtoError::Wire(WireError::BadMagic) {
            self.counters.bad_magic += 1;
        }
        self.kill_conn(conn);
        match (stage, peer) {
            (Stage::ExpectChallenge | Stage::ExpectAccept, Some(p))
                if self.ep_dialing_on(p, conn) =>
            {
                self.fail_endpoint(p, FailReason::Protocol { peer: p, err: why });
            }
            _ => self.events.push_back(CoreEvent::Refused { why }),
        }
    }
}
