//! The endpoint state machine (one endpoint per peer): lazy connect, retries, the
//! handshake decisions (HELLO, ACCEPT, REJECT, simultaneous connect), FIN, failure. See
//! the state diagram in [`core`](super::core). No I/O here.

use std::collections::VecDeque;
use std::mem;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::buf::TxBatch;
use crate::error::{Cause, Errno, FailReason, ProtoError, SendError};
use crate::proto::conn::{Conn, Stage};
use crate::proto::core::{
    slot, ConnKey, Cookies, Core, CoreEvent, IdleCopy, Lending, Todo, MAX_PEERS, MAX_SEGMENTS,
};
use crate::proto::failover::Failover;
use crate::proto::get::PendingGet;
use crate::proto::links::Link;
use crate::proto::part::Parts;
use crate::proto::tx;
use crate::wire::{
    FrameKind, Header, Hello, HelloKind, PartHead, PeerId, PutTarget, RejectReason, Tag, HELLO_LEN,
    PUT_TARGET_LEN,
};

/// One queued message (or FIN), 72 bytes: its header already encoded (a PUT's target
/// too), then a payload of at most [`FRAG_INLINE`] bytes (the target counted) copied at
/// [`Core::send`], so that a small message costs no reference count on the caller's
/// buffer and moves into the batch with one fixed-size copy; or else the count of its
/// segments, which wait in [`Endpoint::segs`] in queue order.
#[derive(Debug)]
pub(super) struct Frag {
    pub(super) hdr: Header,
    /// The encoded header (and a PUT's target), followed by the payload when it is
    /// inline.
    pub(super) wire: [u8; FRAG_WIRE],
    /// Bytes of `wire` the header and target take.
    pub(super) head: u8,
    /// Segments of the payload in `Endpoint::segs` (0: inline or empty).
    pub(super) nsegs: u8,
    /// `None` for control frames (FIN).
    pub(super) cookie: Option<u64>,
    /// Kept for resending, its payload is the engine's own (inline, or copied when kept):
    /// its send completes at its write (see `failover.rs`).
    pub(super) own: bool,
    /// Its send completed already (it goes again after a failover): its cookie completes
    /// nothing more.
    pub(super) reported: bool,
    /// A piece of a put cut for spreading ([`Core::put`]) before its last: counted in
    /// the queued bytes, it completes nothing (the last piece has the put's cookie).
    pub(super) piece: bool,
}

const _: () = assert!(size_of::<Frag>() == 72);

/// Largest frame body (payload, and a PUT's target) a queued frame holds in place.
pub(super) const FRAG_INLINE: usize = 32;
/// Bytes of a queued frame's encoded header and inline body.
pub(super) const FRAG_WIRE: usize = Header::LEN + FRAG_INLINE;

impl Frag {
    pub(super) fn fin() -> Self {
        let hdr = Header {
            kind: FrameKind::Fin,
            tag: Tag(0),
            len: 0,
            ack: false,
            line: 0,
        };
        Self::new(hdr, None, None)
    }

    /// A frame of `hdr` (and the 16-byte head of a PUT, REPLY or PART, `place`) without
    /// payload bytes yet (the caller adds them).
    #[inline]
    fn new(hdr: Header, place: Option<&[u8; PUT_TARGET_LEN]>, cookie: Option<u64>) -> Self {
        let mut wire = [0u8; FRAG_WIRE];
        wire[..Header::LEN].copy_from_slice(&hdr.to_bytes());
        let mut head = Header::LEN;
        if let Some(t) = place {
            wire[head..head + PUT_TARGET_LEN].copy_from_slice(t);
            head += PUT_TARGET_LEN;
        }
        Self {
            hdr,
            wire,
            head: head as u8,
            nsegs: 0,
            cookie,
            own: false,
            reported: false,
            piece: false,
        }
    }

    pub(super) fn wire_len(&self) -> usize {
        Header::LEN + self.hdr.len as usize
    }

    /// The cookie its send still completes with: `None` for a control frame, and for a
    /// frame whose send completed already ([`reported`](Self::reported)).
    #[inline]
    pub(super) fn pending_cookie(&self) -> Option<u64> {
        self.cookie.filter(|_| !self.reported)
    }

    /// Whether its wire bytes count in [`Endpoint::queued_bytes`]: a caller's send or
    /// put (each piece of a cut one), and the reply to a peer's get (control frames and
    /// our own get requests do not; see `get.rs`).
    #[inline]
    pub(super) fn queued(&self) -> bool {
        self.cookie.is_some() || self.piece || self.hdr.kind == FrameKind::Reply
    }
}

/// A frame sent with `FLAG_ACK`, not yet acknowledged.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lent {
    /// Its sequence number (see `Endpoint::head_seq`).
    pub(super) seq: u64,
    /// Its payload segments.
    pub(super) segs: usize,
}

#[derive(Debug)]
pub(super) enum EpState {
    Closed,
    /// Dialing `conn` (None while a retry is scheduled at `retry_at`).
    Connecting {
        conn: Option<ConnKey>,
        retry_at: Option<Instant>,
    },
    /// HELLO sent on `conn`; or, with `conn == None`, our dial was rejected as the losing
    /// side of a simultaneous connect and we wait for the peer's dial until `deadline`.
    ConnectAck {
        conn: Option<ConnKey>,
        deadline: Option<Instant>,
    },
    Connected {
        conn: ConnKey,
    },
    Failed,
}

#[derive(Debug)]
pub(super) struct Endpoint {
    pub(super) addrs: Vec<SocketAddr>,
    /// Local bind address per entry of `addrs` (empty: never bind).
    pub(super) binds: Vec<Option<SocketAddr>>,
    pub(super) state: EpState,
    pub(super) queue: VecDeque<Frag>,
    /// The payload segments of the frames in `queue` that are not inline, in order.
    pub(super) segs: VecDeque<Bytes>,
    /// Wire bytes of the messages in `queue` and kept for resending (`fo.kept`; control
    /// frames aside), capped by `max_queued_bytes`.
    pub(super) queued_bytes: u64,
    /// Cookies of the frames handed to the connection and not yet complete, in order:
    /// the frames of its in-flight batch, behind the frames that were written but whose
    /// pages are lent until the peer's ACK (see [`lent`](Self::lent)), and any written
    /// after those.
    pub(super) inflight: Cookies,
    /// Frames at the front of `inflight` that were written.
    pub(super) written: usize,
    /// Sequence number of the front of `inflight` (frames handed to connections so far).
    pub(super) head_seq: u64,
    /// Sequence numbers of the frames sent with [`FLAG_ACK`](crate::wire::FLAG_ACK) and
    /// not yet acknowledged, in order; a frame behind one of them completes after it.
    pub(super) lent: VecDeque<Lent>,
    /// The segments of the lent frames whose batch came back, in order: the caller's
    /// memory, kept alive until their ACK (the kernel reads the pages until then).
    pub(super) lent_segs: VecDeque<Bytes>,
    /// Segments of lent frames acknowledged before their batch came back: the first
    /// ones of the next batch to come back, dropped then.
    pub(super) acked_early: usize,
    /// ACK frames owed to the peer (frames with `FLAG_ACK` read and not yet answered).
    pub(super) acks_owed: u32,
    /// A written lent frame must see the peer's next ACK by then (`frame_stall` after the
    /// write, or after the last ACK).
    pub(super) ack_deadline: Option<Instant>,
    /// Sends whose batch was in flight when the endpoint failed: they complete when the
    /// driver hands the batch back (see `Conn::orphans`).
    pub(super) orphaned: usize,
    pub(super) attempts: u32,
    /// No connect attempt starts after this (`connect_timeout`, counted from the first
    /// failed attempt of the current connect; `None` before it).
    pub(super) connect_deadline: Option<Instant>,
    pub(super) dirty: bool,
    pub(super) fin_sent: bool,
    pub(super) fin_rcvd: bool,
    /// Its links beyond the first (link `i + 1` at index `i`; see `links.rs`).
    pub(super) links: Vec<Link>,
    /// Confirmations, kept frames and RESUME (see `failover.rs`).
    pub(super) fo: Failover,
    /// Our gets waiting for their REPLY, in order, and what they ask for together (see
    /// `get.rs`).
    pub(super) gets: VecDeque<PendingGet>,
    pub(super) get_bytes: u64,
    /// The message being assembled from the peer's PART frames (see `part.rs`).
    pub(super) parts: Parts,
}

impl Endpoint {
    /// Its connections: the primary's (while connected), then its links'.
    pub(super) fn conns(&self) -> impl Iterator<Item = ConnKey> + '_ {
        let primary = match self.state {
            EpState::Connected { conn } => Some(conn),
            _ => None,
        };
        primary
            .into_iter()
            .chain(self.links.iter().filter_map(|l| l.conn))
    }

    /// Whether a caller's frame (or cut put) of `wire` bytes is refused now for the cap
    /// `cap` on queued bytes. Frames kept for resending count as queued (see
    /// `failover.rs`). Those kept as copies completed, and their count may wait for the
    /// peer's next frames: below the cap they refuse no send alone. A message is always
    /// taken when nothing is queued.
    fn over_cap(&self, wire: u64, cap: u64) -> bool {
        let idle = self.queue.is_empty()
            && (self.fo.kept.is_empty() || (self.fo.kept_borrowed == 0 && self.queued_bytes < cap));
        self.queued_bytes + wire > cap && !idle
    }

    /// Nothing left to send or to answer, and every frame complete: a clean close may
    /// follow once both FINs are exchanged.
    pub(super) fn drained(&self) -> bool {
        self.inflight.is_empty() && self.queue.is_empty() && self.acks_owed == 0
    }

    /// Takes every incomplete frame's cookie (the connection is gone): lent frames are
    /// no longer waited for.
    pub(super) fn take_inflight(&mut self) -> Cookies {
        self.head_seq += self.inflight.len() as u64;
        self.written = 0;
        self.lent.clear();
        self.lent_segs.clear();
        self.acked_early = 0;
        self.acks_owed = 0;
        self.ack_deadline = None;
        mem::take(&mut self.inflight)
    }

    pub(super) fn new(addrs: Vec<SocketAddr>, binds: Vec<Option<SocketAddr>>) -> Self {
        Self {
            addrs,
            binds,
            state: EpState::Closed,
            queue: VecDeque::new(),
            segs: VecDeque::new(),
            queued_bytes: 0,
            inflight: Vec::new(),
            written: 0,
            head_seq: 0,
            lent: VecDeque::new(),
            lent_segs: VecDeque::new(),
            acked_early: 0,
            acks_owed: 0,
            ack_deadline: None,
            orphaned: 0,
            attempts: 0,
            connect_deadline: None,
            dirty: false,
            fin_sent: false,
            fin_rcvd: false,
            links: Vec::new(),
            fo: Failover::default(),
            gets: VecDeque::new(),
            get_bytes: 0,
            parts: Parts::default(),
        }
    }
}

impl Core {
    /// Queues a message. On a Closed endpoint this starts the connect (lazy connect).
    /// The time argument keeps the `handle_*` shape; a send arms no timer and reads none.
    ///
    /// Returns [`SendError::WouldBlock`] (the message is not queued, no completion will
    /// come) when the messages already queued for `peer` and this one would exceed
    /// `max_queued_bytes`: the peer reads slower than we send. A message is always
    /// accepted when nothing is queued (the batch in flight aside), so one larger than the
    /// cap still leaves.
    pub fn send(
        &mut self,
        now: Instant,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
    ) -> Result<(), SendError> {
        self.send_inner(
            now,
            peer,
            tag,
            segs,
            cookie,
            None::<fn(ConnKey, &[u8]) -> usize>,
        )
    }

    /// [`send`](Self::send) for a driver that can write to a socket from inside the call
    /// (`Transport::send`): a message of at most 32 bytes (`FRAG_INLINE`) to a peer in a
    /// ping-pong leaves through `write` before this returns, without passing through its
    /// connection's batch. `write` gets the connection and the frame's bytes and returns
    /// how many the socket took (0 when it took none or the call failed). A frame taken
    /// whole has completed; the rest of one taken in part or not at all leaves with the
    /// batch at the next flush (where a failed call meets its error).
    ///
    /// A peer is in a ping-pong when its connection's last batch held one frame; the
    /// message must also be the first since the last flush, with nothing queued, no ACK
    /// owed and the batch idle and empty. So a second message in the same pass is gathered
    /// behind the first, as are a stream's (whose batches hold several frames). Every other
    /// message goes exactly as with `send`, and the driver then offers
    /// [`direct_pieces`](Self::direct_pieces) as after `send`.
    ///
    /// Why a path of its own: a ping-pong's latency includes the work between a receive and
    /// the reply's send. This path reads the endpoint and the connection and writes from
    /// the stack; the completion bookkeeping comes after the write, and no flush, send
    /// action or send event follows for a frame taken whole.
    #[inline]
    pub fn send_with(
        &mut self,
        now: Instant,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
        write: impl FnOnce(ConnKey, &[u8]) -> usize,
    ) -> Result<(), SendError> {
        self.send_inner(now, peer, tag, segs, cookie, Some(write))
    }

    #[inline]
    fn send_inner<W: FnOnce(ConnKey, &[u8]) -> usize>(
        &mut self,
        _now: Instant,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
        write: Option<W>,
    ) -> Result<(), SendError> {
        // The common case first: a small message that goes straight into its peer's batch
        // (or, with `write`, out).
        if self.send_small(peer, tag, segs, cookie, write) {
            return Ok(());
        }
        let hdr = Header {
            kind: FrameKind::Send,
            tag,
            len: 0,
            ack: false,
            line: 0,
        };
        let len = segs.iter().map(Bytes::len).sum::<usize>();
        if len > PIECE && self.spreads(peer) {
            let part = Header {
                kind: FrameKind::Part,
                len: PUT_TARGET_LEN as u32,
                ..hdr
            };
            let total = len as u64;
            let head = |off: usize| {
                PartHead {
                    total,
                    offset: off as u64,
                }
                .to_bytes()
            };
            return self.cut(peer, part, head, segs, len, len, cookie);
        }
        self.enqueue(peer, hdr, None, segs, Some(cookie))
    }

    /// The fast path of [`send`](Self::send): a message of at most [`FRAG_INLINE`] bytes
    /// (and the configured inline limit) to a connected peer with nothing queued, whose
    /// connection's batch is idle and has room, is written straight into that batch
    /// ([`tx::batch_small`]), or, given `write` and the peer in a ping-pong
    /// ([`send_with`](Self::send_with)), to the socket. Returns false, changing nothing, in
    /// every other case (every error among them), which [`enqueue`](Self::enqueue) then
    /// decides.
    #[inline]
    fn send_small<W: FnOnce(ConnKey, &[u8]) -> usize>(
        &mut self,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
        write: Option<W>,
    ) -> bool {
        let limits = (self.shutting_down, self.small_max);
        let Some((len, ep)) = small_target(&mut self.endpoints, limits, peer, segs) else {
            return false;
        };
        if let Some(write) = write {
            if let Some(conn) = tx::ping_conn(ep, &mut self.conns) {
                let mut wire = [0u8; FRAG_WIRE];
                wire[..Header::LEN].copy_from_slice(&Header::send_head(tag, len as u32));
                let at = copy_inline(&mut wire, Header::LEN, segs);
                let n = write(conn, &wire[..at]);
                self.written_now(peer, conn, &wire[..at], n, cookie);
                return true;
            }
        }
        if !tx::batch_small(ep, &mut self.conns, tag, len, segs, cookie, &self.cfg) {
            return false;
        }
        if !ep.dirty {
            ep.dirty = true;
            self.dirty.push(peer);
            // The first frame since the last flush, so alone in its batch: on a
            // connection whose last batch held one frame too, it leaves at once.
            if let EpState::Connected { conn } = ep.state {
                if slot(&mut self.conns, conn.0).is_some_and(|c| c.solo) {
                    self.direct = Some(conn);
                }
            }
        }
        true
    }

    /// The common case of a stream's send, for a driver to try before
    /// [`send_with`](Self::send_with) and small enough to inline into its callers: a
    /// message of at most 32 bytes (`FRAG_INLINE`, and the configured inline limit) to a
    /// peer that already gathered a frame since the last flush (so not a ping-pong's
    /// message, nor one that must start a batch or leave at once) goes straight into its
    /// connection's idle batch, as `send_with` would place it. Returns false, changing
    /// nothing, in every other case, which `send_with` (or [`send`](Self::send)) then
    /// decides; when it returns true, nothing is left for
    /// [`direct_pieces`](Self::direct_pieces).
    #[inline(always)]
    pub fn gather_small(&mut self, peer: PeerId, tag: Tag, segs: &[Bytes], cookie: u64) -> bool {
        let limits = (self.shutting_down, self.small_max);
        let Some((len, ep)) = small_target(&mut self.endpoints, limits, peer, segs) else {
            return false;
        };
        // Not dirty: the first frame since the last flush, which `send_small` places.
        if !ep.dirty || self.direct.is_some() {
            return false;
        }
        tx::batch_small(ep, &mut self.conns, tag, len, segs, cookie, &self.cfg)
    }

    /// [`send_with`](Self::send_with) wrote `n` bytes of the frame `wire` (cookie `cookie`)
    /// on `conn`: taken whole, it completes (a batch of its own for the statistics);
    /// otherwise its rest goes into the idle batch, for the flush. Either way the endpoint
    /// is dirty until that flush, so that the next message is gathered.
    fn written_now(&mut self, peer: PeerId, conn: ConnKey, wire: &[u8], n: usize, cookie: u64) {
        let (Some(ep), Some(c)) = (
            slot(&mut self.endpoints, peer.0),
            slot(&mut self.conns, conn.0),
        ) else {
            return;
        };
        ep.inflight.push(Some(cookie));
        ep.dirty = true;
        self.dirty.push(peer);
        if n > 0 {
            self.counters.written_at_once += 1;
        }
        if n >= wire.len() {
            self.counters.batches += 1;
            self.counters.frames += 1;
            ep.written += 1;
            self.release_written(peer);
        } else if let Some(batch) = c.tx.as_mut() {
            batch.push_copy(wire);
            batch.add_frame();
            batch.advance(n);
        }
    }

    /// Queues a put: the concatenated `segs` go to `target`, inside a region `peer`
    /// registered ([`Regions`](crate::buf::Regions)); no handler runs there. Completes,
    /// errors and orders exactly like [`send`](Self::send): a message sent after the put
    /// arrives after its data is in place.
    ///
    /// While a second link to `peer` is open, a put of more than 1 MiB (`PIECE`) goes
    /// as consecutive PUT frames of at most that much each, so that its pieces spread
    /// over the links (a frame is never cut across links; see docs/design/links.md). The
    /// receiver places each piece as any put; the put completes once, with its last
    /// piece, and is accepted or refused whole. A message ([`send`](Self::send)) is cut
    /// the same way, into PART frames that the receiver assembles.
    pub fn put(
        &mut self,
        peer: PeerId,
        target: PutTarget,
        segs: &[Bytes],
        cookie: u64,
    ) -> Result<(), SendError> {
        let len = segs.iter().map(Bytes::len).sum::<usize>();
        if len > PIECE && self.spreads(peer) {
            let head = |off: usize| {
                PutTarget {
                    key: target.key,
                    addr: target.addr.wrapping_add(off as u64),
                }
                .to_bytes()
            };
            let frame = PUT_TARGET_LEN + len;
            return self.cut(peer, put_header(), head, segs, len, frame, cookie);
        }
        self.enqueue(
            peer,
            put_header(),
            Some(target.to_bytes()),
            segs,
            Some(cookie),
        )
    }

    /// Whether `peer`'s stream may be spread: connected, with a link beside the first
    /// open.
    fn spreads(&self, peer: PeerId) -> bool {
        self.ep(peer).is_some_and(|ep| {
            matches!(ep.state, EpState::Connected { .. })
                && ep.fo.on
                && ep.links.iter().any(|l| l.open)
        })
    }

    /// A put or a message of `len` bytes (`frame` bytes as one frame) in pieces of
    /// [`PIECE`]: checked as one frame, then queued as consecutive frames of `hdr`'s kind
    /// and tag, each with the head `head` gives for its offset, the last with `cookie`.
    #[allow(clippy::too_many_arguments)]
    fn cut(
        &mut self,
        peer: PeerId,
        hdr: Header,
        head: impl Fn(usize) -> [u8; PUT_TARGET_LEN],
        segs: &[Bytes],
        len: usize,
        frame: usize,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.check_frame(segs.len(), frame)?;
        let cap = self.cfg.max_queued_bytes;
        let ep = slot(&mut self.endpoints, peer.0).ok_or(SendError::UnknownPeer(peer))?;
        if ep.fin_sent {
            return Err(SendError::Unreachable(peer));
        }
        // The whole against the cap, as one frame would be (see `enqueue`).
        let pieces = len.div_ceil(PIECE);
        let wire = (len + pieces * (Header::LEN + PUT_TARGET_LEN)) as u64;
        if ep.over_cap(wire, cap) {
            return Err(SendError::WouldBlock(peer));
        }
        let (mut seg, mut at) = (0, 0);
        let mut piece = Vec::with_capacity(segs.len().min(MAX_SEGMENTS));
        for k in 0..pieces {
            let off = k * PIECE;
            let mut want = PIECE.min(len - off);
            piece.clear();
            while want > 0 {
                let s = &segs[seg];
                let n = want.min(s.len() - at);
                if n > 0 {
                    piece.push(s.slice(at..at + n));
                }
                want -= n;
                at += n;
                if at == s.len() {
                    seg += 1;
                    at = 0;
                }
            }
            let cookie = (k + 1 == pieces).then_some(cookie);
            self.enqueue_piece(peer, hdr, Some(head(off)), &piece, cookie, true)?;
        }
        Ok(())
    }

    /// Queues a frame of `hdr`'s kind and tag (its length: `hdr.len` plus the segments').
    /// A frame without `cookie` (a get's request or reply) is not refused for the queue's
    /// bytes: `get.rs` bounds those.
    #[inline]
    pub(super) fn enqueue(
        &mut self,
        peer: PeerId,
        hdr: Header,
        place: Option<[u8; PUT_TARGET_LEN]>,
        segs: &[Bytes],
        cookie: Option<u64>,
    ) -> Result<(), SendError> {
        self.enqueue_piece(peer, hdr, place, segs, cookie, false)
    }

    /// A frame of `nsegs` segments and `len` bytes after its header may be queued now.
    fn check_frame(&self, nsegs: usize, len: usize) -> Result<(), SendError> {
        if self.shutting_down {
            return Err(SendError::ShuttingDown);
        }
        if nsegs > MAX_SEGMENTS {
            return Err(SendError::TooManySegments {
                got: nsegs,
                max: MAX_SEGMENTS,
            });
        }
        if len > self.cfg.max_frame as usize {
            return Err(SendError::TooLarge {
                len,
                max: self.cfg.max_frame as usize,
            });
        }
        Ok(())
    }

    /// [`enqueue`](Self::enqueue), and for a piece of a cut put or message
    /// ([`cut`](Self::cut), which checked the whole against the cap): not refused for
    /// the queue's bytes, and counted in them.
    #[inline]
    fn enqueue_piece(
        &mut self,
        peer: PeerId,
        mut hdr: Header,
        place: Option<[u8; PUT_TARGET_LEN]>,
        segs: &[Bytes],
        cookie: Option<u64>,
        cut: bool,
    ) -> Result<(), SendError> {
        let len = hdr.len as usize + segs.iter().map(Bytes::len).sum::<usize>();
        self.check_frame(segs.len(), len)?;
        let cap = self.cfg.max_queued_bytes;
        let inline = len <= FRAG_INLINE && len <= self.cfg.inline_limit;
        let ep = slot(&mut self.endpoints, peer.0).ok_or(SendError::UnknownPeer(peer))?;
        if matches!(ep.state, EpState::Failed) || ep.fin_sent {
            return Err(SendError::Unreachable(peer));
        }
        let wire = (Header::LEN + len) as u64;
        if cookie.is_some() && !cut && ep.over_cap(wire, cap) {
            return Err(SendError::WouldBlock(peer));
        }
        hdr.len = len as u32;
        let mut frag = Frag::new(hdr, place.as_ref(), cookie);
        frag.piece = cut && cookie.is_none();
        if inline {
            // Small: copied now, so the queue holds no reference to the caller's buffer.
            copy_inline(&mut frag.wire, frag.head as usize, segs);
        }
        if frag.queued() {
            ep.queued_bytes += wire;
        }
        if !inline {
            for s in segs.iter().filter(|s| !s.is_empty()) {
                ep.segs.push_back(s.clone());
                frag.nsegs += 1;
            }
        }
        ep.queue.push_back(frag);
        match ep.state {
            EpState::Closed => {
                ep.fin_rcvd = false;
                ep.attempts = 0;
                ep.connect_deadline = None;
                self.dial_next(peer);
            }
            // As `mark_dirty`, without looking the endpoint up again.
            EpState::Connected { conn } if !ep.dirty => {
                ep.dirty = true;
                self.dirty.push(peer);
                // Alone in the queue, first since the last flush, and the connection's
                // batch idle and empty: on a connection in a ping-pong it leaves at once.
                if ep.queue.len() == 1
                    && slot(&mut self.conns, conn.0).is_some_and(|c| {
                        c.solo && !c.unconfirmed && c.tx.as_ref().is_some_and(TxBatch::is_empty)
                    })
                {
                    self.direct = Some(conn);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Which payloads that find their peer idle `conn` copies ([`IdleCopy`]), as the
    /// driver, which chose its socket options, decides. [`IdleCopy::Full`] until said.
    pub fn set_idle_copy(&mut self, conn: ConnKey, idle_copy: IdleCopy) {
        if let Some(c) = slot(&mut self.conns, conn.0) {
            c.idle_copy = idle_copy;
        }
    }

    /// Which large payloads `conn` lends rather than copies ([`Lending`]), as the driver,
    /// which chose the connection's send calls, decides. [`Lending::Streams`] until said.
    pub fn set_lending(&mut self, conn: ConnKey, lending: Lending) {
        if let Some(c) = slot(&mut self.conns, conn.0) {
            c.lending = lending;
        }
    }

    /// Whether any payload may be lent, as the driver measured the send calls of lent
    /// and copied bytes on this machine: with `false`, every payload that
    /// [`set_lending`](Self::set_lending) and
    /// [`CoreConfig::splice_min`](crate::CoreConfig::splice_min) would lend is copied
    /// (one the idle copy's rule copies still counts in
    /// [`Counters::idle_copies`](crate::proto::core::Counters::idle_copies)). Lending
    /// until said.
    pub fn set_lend_judged(&mut self, lend: bool) {
        self.lend_judged = lend;
    }

    /// On `conn`, once a large message that found its peer idle (a ping-pong's, a
    /// request's) has left, the driver sets the socket to acknowledge at once
    /// (`TCP_QUICKACK`), as [`handle_sent`](Self::handle_sent) says; and such a
    /// message is copied as [`set_idle_copy`](Self::set_idle_copy) says (the driver asks
    /// for [`IdleCopy::Full`] with it). Off until said. Why: see
    /// [`SocketConfig::paced_quick_ack`](crate::SocketConfig::paced_quick_ack).
    pub fn set_quick_ack(&mut self, conn: ConnKey, on: bool) {
        if let Some(c) = slot(&mut self.conns, conn.0) {
            c.quick_ack = on;
        }
    }

    /// The driver opened the socket for an [`Action::Dial`](super::core::Action::Dial)
    /// of `peer`'s `link` and is connecting.
    pub fn dial_started(&mut self, peer: PeerId, link: u8, conn: ConnKey) {
        if link > 0 {
            return self.link_dial_started(peer, link, conn);
        }
        let own_cache = !self.cfg.multishot;
        self.put_conn(
            conn,
            Conn::new(Stage::Connecting, Some(peer), HELLO_LEN, own_cache),
        );
        if let Some(ep) = self.ep_mut(peer) {
            if let EpState::Connecting { conn: c, .. } = &mut ep.state {
                *c = Some(conn);
                return;
            }
        }
        // The endpoint moved on meanwhile (failed, or adopted the peer's dial).
        self.kill_conn(conn);
    }

    /// The driver could not even create the socket for a dial of `peer`'s `link`.
    pub fn dial_failed(&mut self, now: Instant, peer: PeerId, link: u8, err: Errno) {
        if link > 0 {
            return self.link_dial_failed(now, peer, link);
        }
        self.retry_or_fail(Some(now), peer, Cause::Os(err));
    }

    /// A connect finished (`Err`: the OS error it failed with).
    pub fn handle_connected(&mut self, now: Instant, conn: ConnKey, result: Result<(), Errno>) {
        let Some(c) = self.conn_mut(conn) else { return };
        if c.stage != Stage::Connecting {
            return;
        }
        let Some(peer) = c.peer else { return };
        match result {
            Ok(()) => {
                let Some(hello) = self.hello_for(conn, peer) else {
                    return self.no_nonce(now, conn, peer);
                };
                let deadline = now + self.cfg.handshake_timeout;
                let c = self.conn_mut(conn).expect("checked above");
                c.stage = Stage::ExpectChallenge;
                c.deadline = Some(deadline);
                c.write_record(&hello);
                self.arm_timer(deadline);
                self.todo.push_back(Todo::Receive(conn));
                self.submit_tx(conn);
                if let Some(ep) = self.ep_mut(peer) {
                    if matches!(ep.state, EpState::Connecting { conn: Some(k), .. } if k == conn) {
                        ep.state = EpState::ConnectAck {
                            conn: Some(conn),
                            deadline: None,
                        };
                    }
                }
            }
            Err(_) if self.is_link(conn) => self.link_lost(now, conn),
            Err(e) => {
                self.kill_conn(conn);
                if self.ep_dialing_on(peer, conn) {
                    self.retry_or_fail(Some(now), peer, Cause::Os(e));
                }
            }
        }
    }

    /// A handshake record of ours, addressed to nobody in particular, with zero nonce
    /// and MAC (REJECT, ACCEPT, PROBE_ACK carry nothing more).
    pub(super) fn record(&self, kind: HelloKind) -> Hello {
        let mut h = Hello::new(kind, self.cfg.pid);
        h.job = self.cfg.token;
        h
    }

    pub(super) fn ep_dialing_on(&self, peer: PeerId, conn: ConnKey) -> bool {
        matches!(
            self.ep(peer).map(|e| &e.state),
            Some(EpState::Connecting { conn: Some(c), .. } | EpState::ConnectAck { conn: Some(c), .. })
                if *c == conn
        )
    }

    pub(super) fn dial_next(&mut self, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        if ep.addrs.is_empty() {
            let reason = FailReason::ConnectFailed {
                peer,
                attempts: 0,
                cause: Cause::NoAddress,
            };
            self.fail_endpoint(peer, reason);
            return;
        }
        let i = ep.attempts as usize % ep.addrs.len();
        let (addr, bind) = (ep.addrs[i], ep.binds.get(i).copied().flatten());
        ep.attempts += 1;
        ep.state = EpState::Connecting {
            conn: None,
            retry_at: None,
        };
        self.todo.push_back(Todo::Dial {
            peer,
            link: 0,
            addr,
            bind,
        });
    }

    /// A dial failed: schedule the next attempt, or fail the endpoint after the last.
    ///
    /// A connection refused, reset or closed by the acceptor during the handshake (an
    /// acceptor under a flood closes its oldest strangers, see `conn.rs`) is retried
    /// until the connect deadline, whatever the number of attempts; any other failure
    /// (nobody listens, no answer in time) after `connect_retries` attempts. The delay
    /// doubles from `retry_delay`, up to [`MAX_RETRY_DELAY`], without jitter, and no
    /// attempt starts after the deadline: then the endpoint fails as after the last
    /// attempt.
    pub(super) fn retry_or_fail(&mut self, now: Option<Instant>, peer: PeerId, cause: Cause) {
        let (retries, base, limit) = (
            self.cfg.connect_retries,
            self.cfg.retry_delay,
            self.cfg.connect_timeout,
        );
        let shutting_down = self.shutting_down;
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        if matches!(ep.state, EpState::Failed | EpState::Connected { .. }) {
            return;
        }
        let deadline = now.map(|n| *ep.connect_deadline.get_or_insert(n + limit));
        let delay = base
            .saturating_mul(1u32 << ep.attempts.saturating_sub(1).min(10))
            .min(MAX_RETRY_DELAY);
        let at = now.map(|n| n + delay);
        let out_of_time = matches!((at, deadline), (Some(a), Some(d)) if a > d);
        let out_of_attempts = ep.attempts >= retries && !retry_in_handshake(&cause);
        if out_of_attempts || out_of_time || shutting_down {
            let attempts = ep.attempts;
            self.fail_endpoint(
                peer,
                FailReason::ConnectFailed {
                    peer,
                    attempts,
                    cause,
                },
            );
            return;
        }
        self.counters.connect_retries += 1;
        match at {
            Some(at) => {
                ep.state = EpState::Connecting {
                    conn: None,
                    retry_at: Some(at),
                };
                self.arm_timer(at);
            }
            None => self.dial_next(peer),
        }
    }

    /// Acceptor side: the dialer proved that it holds the job key and is `peer` (its
    /// AUTH verified): adopt the connection, or refuse it.
    pub(super) fn adopt_or_refuse(&mut self, conn: ConnKey, peer: PeerId) {
        let refuse = |core: &mut Self, reason: RejectReason, why: ProtoError| {
            core.refuse_incoming(conn, reason, why);
        };
        if self.shutting_down {
            return refuse(
                self,
                RejectReason::ShuttingDown,
                ProtoError::Rejected(RejectReason::ShuttingDown),
            );
        }
        if self.ep(peer).is_none() {
            if self.ask_unknown && peer.0 < MAX_PEERS && peer != self.cfg.pid {
                // Lazy add: the driver decides (`resolve_unknown`) within the deadline.
                let c = self.conn_mut(conn).expect("conn exists");
                c.stage = Stage::Resolving;
                c.peer = Some(peer);
                self.events.push_back(CoreEvent::UnknownPeer { conn, peer });
                return;
            }
            return refuse(
                self,
                RejectReason::UnknownPeer,
                ProtoError::Rejected(RejectReason::UnknownPeer),
            );
        }
        self.claim(conn, peer);
    }

    /// The driver's answer to [`CoreEvent::UnknownPeer`]: with `accept`, and once the
    /// peer was added, the waiting connection is handled as a HELLO from a known peer
    /// (adopted, or refused as a duplicate or simultaneous dial); otherwise it is refused
    /// with `REJECT(UnknownPeer)`. An answer for a connection that is no longer waiting
    /// (it timed out or closed) is ignored.
    pub fn resolve_unknown(&mut self, conn: ConnKey, accept: bool) {
        let Some(c) = self.conn_mut(conn) else { return };
        if c.stage != Stage::Resolving {
            return;
        }
        let peer = c
            .peer
            .take()
            .expect("a resolving conn holds the claimed id");
        c.stage = Stage::ExpectHello;
        if accept && self.ep(peer).is_some() && !self.shutting_down {
            self.claim(conn, peer);
            // Reading paused while the driver decided (frames may follow the AUTH).
            self.todo.push_back(Todo::Receive(conn));
            return;
        }
        let reason = if self.shutting_down {
            RejectReason::ShuttingDown
        } else {
            RejectReason::UnknownPeer
        };
        self.counters.refused += 1;
        self.events.push_back(CoreEvent::Refused {
            why: ProtoError::Rejected(reason),
        });
        self.reject(conn, reason);
    }

    /// Acceptor side: the HELLO of `peer`, whose endpoint exists, is acceptable on its
    /// face; decide whether `conn` becomes the endpoint's connection.
    fn claim(&mut self, conn: ConnKey, peer: PeerId) {
        let refuse = |core: &mut Self, reason: RejectReason, why: ProtoError| {
            core.counters.refused += 1;
            core.events.push_back(CoreEvent::Refused { why });
            core.reject(conn, reason);
        };
        let link = self.conn_mut(conn).map_or(0, |c| c.link);
        if link > 0 {
            return self.claim_link(conn, peer, link);
        }
        let peer_wins = self.below_me(peer);
        let ep = self.ep_mut(peer).expect("claim is called for a known peer");
        // Decide whether this incoming connection becomes the endpoint's connection.
        let adopt = match ep.state {
            // Nobody dialing: the peer's dial is the connection.
            EpState::Closed => true,
            // We lost a simultaneous connect earlier and wait for exactly this.
            EpState::ConnectAck { conn: None, .. } => true,
            // A retry is scheduled but no socket is open: take the peer's.
            EpState::Connecting { conn: None, .. } => true,
            // Both dialing: the dial of the lower process id wins.
            EpState::Connecting { conn: Some(_), .. }
            | EpState::ConnectAck { conn: Some(_), .. } => peer_wins,
            EpState::Connected { .. } => false,
            EpState::Failed => {
                return refuse(
                    self,
                    RejectReason::Unreachable,
                    ProtoError::Rejected(RejectReason::Unreachable),
                )
            }
        };
        if !adopt {
            let (reason, simultaneous) = match ep.state {
                EpState::Connected { .. } => (RejectReason::Duplicate, false),
                _ => (RejectReason::Simultaneous, true),
            };
            if simultaneous {
                self.counters.simultaneous += 1;
            }
            return refuse(self, reason, ProtoError::Rejected(reason));
        }
        // Abandon our own dial, if any: no frame was ever sent on it (a dial that carries
        // frames behind its AUTH is one of a lower id than the peer's, which is never
        // abandoned for the peer's: see `send_early`).
        let old = match ep.state {
            EpState::Connecting { conn, .. } | EpState::ConnectAck { conn, .. } => conn,
            _ => None,
        };

        ep.state = EpState::Connected { conn };
        ep.fin_rcvd = false;
        self.stream_starts(peer);
        if let Some(old) = old {
            debug_assert!(
                self.conn_mut(old).is_none_or(|c| c.early == 0),
                "a dial with early frames abandoned"
            );
            self.counters.simultaneous += 1;
            self.kill_conn(old);
        }
        let accept = self.record(HelloKind::Accept);
        let handshake = self.cfg.handshake_timeout;
        let c = self.conn_mut(conn).expect("conn exists");
        c.stage = Stage::Open;
        c.peer = Some(peer);
        c.write_record(&accept);
        // The ACCEPT leaves alone: our frames follow once the dialer's first bytes show
        // that it took the connection (it always sends: it dialed to send), or two
        // handshake timeouts after the accept, whichever comes first. A dialer that gave
        // up did so one handshake timeout after its connect, before our accept: the
        // second one is its time to be scheduled and close.
        c.deadline = c.accepted_at.map(|(at, _)| at + 2 * handshake);
        c.unconfirmed = c.deadline.is_some();
        if let Some(d) = c.deadline {
            self.arm_timer(d);
        } else {
            self.mark_dirty(peer);
        }
        self.submit_tx(conn);
        self.events.push_back(CoreEvent::Connected(peer));
        if !self.conn_mut(conn).is_some_and(|c| c.unconfirmed) {
            self.dial_links(peer);
        }
    }

    /// Acceptor: the connection adopted from the peer's HELLO ended (closed, reset, a
    /// failed send) before the peer sent a byte on it. The dialer gave up on that dial
    /// before reading our ACCEPT: its handshake deadline passed while its HELLO waited in
    /// our accept queue (a process that starts late or is not scheduled), or it adopted
    /// our own dial meanwhile. That is a failed handshake, not a lost peer: nothing but
    /// the ACCEPT was sent on it, so no frame is lost, and the endpoint connects again
    /// (our dial after the retry delay, or the peer's own retry, whichever comes first).
    pub(super) fn unconfirmed_lost(
        &mut self,
        now: Instant,
        peer: PeerId,
        conn: ConnKey,
        cause: Cause,
    ) {
        self.kill_conn(conn);
        self.counters.abandoned_handshakes += 1;
        let Some(ep) = self.ep_mut(peer) else { return };
        if !matches!(ep.state, EpState::Connected { conn: c } if c == conn) {
            return;
        }
        self.close_links(peer);
        let Some(ep) = self.ep_mut(peer) else { return };
        if ep.queue.is_empty() {
            ep.state = EpState::Closed;
            return;
        }
        ep.state = EpState::Connecting {
            conn: None,
            retry_at: None,
        };
        self.retry_or_fail(Some(now), peer, cause);
    }

    /// An unconfirmed connection (see [`unconfirmed_lost`](Self::unconfirmed_lost)) got
    /// bytes from its peer (the dialer took it), or reached its deadline with neither
    /// bytes nor an end (a silent peer gets our frames, as any connected peer does): our
    /// frames may go.
    pub(super) fn confirm(&mut self, peer: PeerId, conn: ConnKey) {
        if let Some(c) = self.conn_mut(conn) {
            c.unconfirmed = false;
            c.deadline = None;
            self.mark_dirty(peer);
            // The dialer took the connection, so it is connected too: links may join.
            self.dial_links(peer);
        }
    }

    /// Dialer side: the acceptor's answer arrived.
    pub(super) fn on_accept_record(&mut self, now: Instant, conn: ConnKey, h: Hello) {
        if self.is_link(conn) {
            return self.on_link_answer(now, conn, h);
        }
        let c = self.conn_mut(conn).expect("conn exists");
        let peer = c.peer.expect("dialer knows its peer");
        let (job, pid) = self.wire_name(peer);
        let err = match h.kind {
            HelloKind::Hello
            | HelloKind::Probe
            | HelloKind::ProbeAck
            | HelloKind::Challenge
            | HelloKind::Auth => Some(ProtoError::UnexpectedHello {
                state: "ExpectAccept",
            }),
            // A REJECT is taken for its reason from whichever job it comes (a process
            // of a job that does not know ours refuses it as `UnknownJob`).
            _ if h.pid != pid || (h.kind == HelloKind::Accept && h.job != job) => {
                Some(ProtoError::WrongPeer {
                    expected: peer,
                    got: h.pid,
                })
            }
            _ => None,
        };
        if let Some(err) = err {
            self.kill_conn(conn);
            if self.ep_dialing_on(peer, conn) {
                self.fail_endpoint(peer, FailReason::Protocol { peer, err });
            }
            return;
        }
        match h.kind {
            HelloKind::Accept => {
                if !self.ep_dialing_on(peer, conn) {
                    // We adopted the peer's dial meanwhile; this one is surplus.
                    self.kill_conn(conn);
                    return;
                }
                let c = self.conn_mut(conn).expect("conn exists");
                c.stage = Stage::Open;
                c.deadline = None;
                let ep = self.ep_mut(peer).expect("dialing endpoint");
                ep.state = EpState::Connected { conn };
                ep.fin_rcvd = false;
                self.stream_starts(peer);
                // The frames that went behind our AUTH were delivered.
                self.early_accepted(peer, conn);
                self.mark_dirty(peer);
                self.events.push_back(CoreEvent::Connected(peer));
                self.dial_links(peer);
            }
            HelloKind::Reject(reason) => {
                self.kill_conn(conn);
                if !self.ep_dialing_on(peer, conn) {
                    return;
                }
                match reason {
                    RejectReason::Simultaneous => {
                        // The peer's own dial wins; wait for it (bounded).
                        let deadline = now + self.cfg.handshake_timeout;
                        let ep = self.ep_mut(peer).expect("dialing endpoint");
                        ep.state = EpState::ConnectAck {
                            conn: None,
                            deadline: Some(deadline),
                        };
                        self.arm_timer(deadline);
                    }
                    // A duplicate goes away; a job the peer does not know yet, it adds
                    // soon (the two jobs add each other at about the same time).
                    RejectReason::Duplicate | RejectReason::UnknownJob => {
                        self.retry_or_fail(Some(now), peer, Cause::Refused(reason));
                    }
                    // The peer is leaving for good: retrying cannot help.
                    RejectReason::ShuttingDown => {
                        self.fail_endpoint(peer, FailReason::PeerClosed(peer));
                    }
                    _ => self.fail_endpoint(
                        peer,
                        FailReason::Protocol {
                            peer,
                            err: ProtoError::Rejected(reason),
                        },
                    ),
                }
            }
            HelloKind::Hello
            | HelloKind::Probe
            | HelloKind::ProbeAck
            | HelloKind::Challenge
            | HelloKind::Auth => {
                unreachable!("handled above")
            }
        }
    }

    /// Bytes arrived after the peer's FIN, which promised the end of the stream: that
    /// breaks the protocol and fails the endpoint. False when no FIN was received.
    pub(super) fn data_after_fin(&mut self, peer: PeerId) -> bool {
        if !self.ep(peer).is_some_and(|e| e.fin_rcvd) {
            return false;
        }
        self.fail_protocol(peer, ProtoError::DataAfterFin);
        true
    }

    /// The peer broke the protocol: its endpoint fails.
    pub(super) fn fail_protocol(&mut self, peer: PeerId, err: ProtoError) {
        self.fail_endpoint(peer, FailReason::Protocol { peer, err });
    }

    pub(super) fn on_fin(&mut self, peer: PeerId, conn: ConnKey) {
        // Its REPLYs would have come before its FIN.
        self.fail_gets(peer, &FailReason::PeerClosed(peer));
        let ep = self.ep_mut(peer).expect("open conn has an endpoint");
        ep.fin_rcvd = true;
        self.events.push_back(CoreEvent::PeerClosed(peer));
        let ep = self.ep_mut(peer).expect("exists");
        if !ep.fin_sent {
            // The peer reads until our FIN: what we queued still leaves, then our FIN.
            ep.fin_sent = true;
            ep.queue.push_back(Frag::fin());
            self.mark_dirty(peer);
        } else if ep.drained() {
            // Our FIN is out and theirs is in: done. (Otherwise the completion of the
            // send that carries our FIN closes.)
            self.close_clean(peer, conn);
        }
    }

    /// Both FINs exchanged (or the peer's EOF after its FIN): close without error.
    pub(super) fn close_clean(&mut self, peer: PeerId, conn: ConnKey) {
        // (Seen on a link, the end closes the primary with the links.)
        let conn = self.primary_conn(peer).unwrap_or(conn);
        self.kill_conn(conn);
        self.close_links(peer);
        if let Some(ep) = self.ep_mut(peer) {
            if matches!(ep.state, EpState::Connected { conn: c } if c == conn) {
                ep.state = EpState::Closed;
                ep.fin_sent = false;
                ep.take_inflight();
            }
        }
        // Whatever was still queued (the peer left) fails.
        self.fail_queued(peer, FailReason::PeerClosed(peer));
    }

    pub(super) fn fail_queued(&mut self, peer: PeerId, reason: FailReason) {
        self.fail_gets(peer, &reason);
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        let mut failed: Vec<u64> = ep.take_inflight().into_iter().flatten().collect();
        ep.queued_bytes = 0;
        ep.segs.clear();
        failed.extend(ep.queue.drain(..).filter_map(|f| f.pending_cookie()));
        ep.fo.kept.clear();
        ep.fo.kept_segs.clear();
        if ep.fo.dead_batches > 0 {
            // A failed primary's batch may still read these sends' bytes.
            ep.fo
                .held
                .extend(failed.into_iter().map(|c| (c, reason.clone())));
            return;
        }
        for cookie in failed {
            self.events.push_back(CoreEvent::Completed {
                peer,
                cookie,
                result: Err(reason.clone()),
            });
        }
    }

    /// The endpoint fails for good: close its sockets, fail every pending send once,
    /// tell the application once.
    pub(super) fn fail_endpoint(&mut self, peer: PeerId, reason: FailReason) {
        if self.fail_endpoint_quietly(peer, reason.clone()) {
            self.events.push_back(CoreEvent::PeerFailed(peer, reason));
        }
    }

    /// As [`fail_endpoint`](Self::fail_endpoint) without the PeerFailed event; false if
    /// it had failed before.
    pub(super) fn fail_endpoint_quietly(&mut self, peer: PeerId, reason: FailReason) -> bool {
        let Some(ep) = self.ep_mut(peer) else {
            return false;
        };
        // Lent pages go back to their owners now: none of their bytes may leave later.
        let lent = !ep.lent.is_empty();
        let conn = match mem::replace(&mut ep.state, EpState::Failed) {
            EpState::Failed => return false,
            EpState::Connected { conn } => Some(conn),
            EpState::Connecting { conn, .. } | EpState::ConnectAck { conn, .. } => conn,
            EpState::Closed => None,
        };
        if let Some(c) = conn {
            if lent {
                self.reset_conn(c);
            } else {
                self.kill_conn(c);
            }
            self.orphan_inflight(peer, c, &reason);
        }
        self.close_links(peer);
        self.fail_queued(peer, reason);
        true
    }
}

/// Whether a failed attempt is retried until the connect deadline rather than counted
/// against `connect_retries`: the acceptor refused as a duplicate, or as of a job it does
/// not know yet (another job adds ours when its own `add_procs` runs, which may come
/// later than a few quick retries), or closed or reset the connection before answering
/// (what it does to the oldest strangers under a flood).
fn retry_in_handshake(cause: &Cause) -> bool {
    match cause {
        Cause::ClosedInHandshake
        | Cause::Refused(RejectReason::Duplicate | RejectReason::UnknownJob) => true,
        Cause::Os(e) => matches!(*e, Errno::ECONNRESET | Errno::EPIPE | Errno::ECONNABORTED),
        _ => false,
    }
}

/// Longest delay between two connect attempts.
pub(super) const MAX_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The checks every small send starts with ([`Core::send_with`]'s fast path and
/// [`Core::gather_small`]), given whether the engine is shutting down and its small-send
/// limit: not shutting down, `segs` few enough and together at most `small_max` bytes,
/// `peer` known and sent no FIN by us (after which nothing more may leave; a Failed
/// endpoint is not Connected, which the batch's checks see). Returns the payload's
/// length and the endpoint, or `None`.
#[inline(always)]
fn small_target<'a>(
    endpoints: &'a mut [Option<Endpoint>],
    (shutting_down, small_max): (bool, usize),
    peer: PeerId,
    segs: &[Bytes],
) -> Option<(usize, &'a mut Endpoint)> {
    if shutting_down || segs.len() > MAX_SEGMENTS {
        return None;
    }
    let len = segs.iter().map(Bytes::len).sum::<usize>();
    if len > small_max {
        return None;
    }
    let ep = slot(endpoints, peer.0)?;
    // With a standby link every frame is kept for resending: it goes through the queue.
    if ep.fin_sent || ep.fo.on {
        return None;
    }
    Some((len, ep))
}

/// Copies the segments of an inline payload into `wire` from `at` on (they fit: the
/// caller checked their length against [`FRAG_INLINE`]); returns where they end. A
/// segment of 8 bytes (the common small message) is copied with a fixed-size copy, not a
/// call to `memcpy`, as in [`TxBatch::push_frame`](crate::buf::TxBatch::push_frame).
#[inline(always)]
fn copy_inline(wire: &mut [u8; FRAG_WIRE], mut at: usize, segs: &[Bytes]) -> usize {
    for s in segs {
        match <&[u8; 8]>::try_from(&s[..]) {
            Ok(eight) => wire[at..at + 8].copy_from_slice(eight),
            Err(_) => wire[at..at + s.len()].copy_from_slice(s),
        }
        at += s.len();
    }
    at
}

/// Puts and messages above this many bytes are cut into pieces of this many while a peer
/// has a second link open ([`Core::put`], [`Core::send`]), so that one spreads over the
/// links. A frame up to 2 MiB spreads as well as smaller ones over two links bound at
/// 100 MB/s each (`ringbtl-bench bw`: 185 MB/s at 2 MiB messages, 167 at 4 MiB, 113 at
/// 8 MiB before a held link read its next frame ahead; docs/design/links.md); 1 MiB keeps
/// a margin for sockets that hold less.
pub(super) const PIECE: usize = 1 << 20;

/// A PUT frame's header before its length is known.
fn put_header() -> Header {
    Header {
        kind: FrameKind::Put,
        tag: Tag(0),
        len: PUT_TARGET_LEN as u32,
        ack: false,
        line: 0,
    }
}
