//! Failover: an endpoint with a standby link open confirms the frames it consumes, keeps
//! the frames it writes until the peer confirms them, and moves its stream to a standby
//! link when its primary connection fails, losing nothing. No I/O here.
//!
//! Each direction's stream counts its frames from 0 at the endpoint's first connection
//! (every frame but CONFIRM and RESUME; see "Links" in [`wire`](crate::wire)). While a
//! standby link is open on this side:
//!
//! - the sender keeps every frame it hands to a batch (header, inline bytes, segments)
//!   until a CONFIRM covers it: its bytes may have to go again. A frame of at most
//!   [`KEEP_COPY_MAX`] bytes after its header is kept as a copy ([`Frag::own`]) and its
//!   send completes at its write, as without links; a longer one is kept by reference,
//!   and its send completes at its confirmation (the caller may reuse its memory at the
//!   completion), the copies behind it with it, so that sends complete in order;
//! - the receiver sends a CONFIRM with the count it consumed when a sender may wait for
//!   it (a frame over [`KEEP_COPY_MAX`] bytes, or a FIN, consumed since its last count),
//!   or past [`LAZY_BYTES`] consumed. Otherwise the count goes with the next frames it
//!   writes (a ping-pong's answer carries the count of its question, and no write is
//!   spent on it alone), at the latest [`CONFIRM_LAZY`] after the first frame it covers;
//! - large payloads are not lent (a frame kept for resending must not wait for an ACK of
//!   pages), and no frame leaves outside a batch.
//!
//! When the primary fails (reset, end of stream, a send error, a stalled frame,
//! `TCP_USER_TIMEOUT`), the side that sees it writes a RESUME with its own count as the
//! first frame on its lowest open standby link, which becomes the primary; the failed
//! connection is reset. The peer, reading a RESUME on a standby link, resets its own
//! primary, makes that link the primary, answers with a RESUME of its count and sends
//! its kept frames from the count it read; the first side, reading the answer, does the
//! same. So each side resends exactly the frames the other did not consume: nothing is
//! lost, nothing delivered twice, the order holds, and every send completes once. Both
//! sides may start at once (both saw the reset): each resends from the other's RESUME and
//! answers it as well, which starts one more epoch (see `spread.rs`). A link beyond the
//! primary that carried runs and fails makes its side ask on the primary, and a receiver
//! whose stream stood still while owed frames asks too ([`OWED_STALL`]).
//!
//! A peer whose frames were written before a standby link opened, and not confirmed, may
//! have lost some with the primary: the RESUME it reads then asks for frames no longer
//! kept, and the endpoint fails as it would have without links (no silent loss). So does
//! an endpoint with lent pages out, or one whose last link fails.
//!
//! [`KEEP_COPY_MAX`]: crate::wire::KEEP_COPY_MAX

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::error::{Cause, FailReason, ProtoError};
use crate::proto::conn::Conn;
use crate::proto::conn::Stage;
use crate::proto::core::{slot, ConnKey, Core, CoreEvent, Todo};
use crate::proto::endpoint::{EpState, Frag};
use crate::proto::links::LinkRoute;
use crate::proto::spread::RunOrder;
use crate::wire::{FrameKind, Header, PeerId, ResumeFrame, Tag, COUNT_LEN};

/// The failover state of one endpoint.
#[derive(Debug, Default)]
pub(super) struct Failover {
    /// A standby link is open: confirmations and keeping are on.
    pub(super) on: bool,
    /// Number (on the scale of `Endpoint::head_seq`) of our first frame in the stream.
    pub(super) tx_origin: u64,
    /// Our frames below this number are confirmed by the peer.
    pub(super) confirmed: u64,
    /// The peer's frames consumed on the stream's earlier primaries.
    pub(super) rx_base: u64,
    /// The count last sent in a CONFIRM or RESUME.
    pub(super) rx_told: u64,
    /// Frames handed to batches and not confirmed, from number `kept_from` on, and the
    /// segments of those whose payload is not inline.
    pub(super) kept: VecDeque<Frag>,
    pub(super) kept_segs: VecDeque<Bytes>,
    /// Where short payloads are copied when kept (segments of `kept_segs` are split off
    /// it): one allocation serves many, and is reused once their frames are confirmed.
    pub(super) copies: BytesMut,
    pub(super) kept_from: u64,
    /// Kept frames whose payload is the caller's memory (not [`Frag::own`]): they
    /// complete at their confirmation.
    pub(super) kept_borrowed: usize,
    /// Our frames below this number whose sends completed at their write (own frames,
    /// written and not yet confirmed; on the scale of `Endpoint::head_seq`).
    pub(super) reported: u64,
    /// A RESUME to write first: our count, the epoch it starts for the stream we
    /// receive, and whether it asks (we start a failover) or answers the peer's.
    pub(super) resume_out: Option<(u64, u32, bool)>,
    /// The receiver's order of the peer's runs (see [`spread`](super::spread)); its epoch
    /// is the one our last RESUME named.
    pub(super) rx_order: RunOrder,
    /// Our count of the peer's frames when its stream's current epoch began.
    pub(super) rx_epoch_base: u64,
    /// The peer's stream comes in runs (a RUN was read in this epoch, or the epoch is
    /// past 0): every frame goes through the walk, which follows the runs.
    pub(super) rx_spread: bool,
    /// Our stream goes in runs: every counted frame we write is in one, on any open
    /// link (from our first spread batch of epoch 0 on, and in every later epoch).
    pub(super) tx_runs: bool,
    /// The epoch of our stream, as the peer's last RESUME named it, and the number of
    /// our frame it began with (on the scale of `Endpoint::head_seq`).
    pub(super) tx_epoch: u32,
    pub(super) tx_epoch_start: u64,
    /// While the peer's stream is owed frames (`RunOrder::waiting`): the position it
    /// stood at, and when a RESUME is asked if it has not moved by then.
    pub(super) owed: Option<(Instant, (u32, u64))>,
    /// Batches written out of order (a later run's link was faster): the frame numbers
    /// they cover, until the frames before them are written too.
    pub(super) written_ahead: Vec<(u64, u64)>,
    /// Our asking RESUMEs the peer has not answered yet.
    pub(super) asks_out: u32,
    /// We wrote a RESUME on this connection and wait for the peer's.
    pub(super) awaiting: Option<ConnKey>,
    /// Batches of failed primaries still with the driver: until they are back no send
    /// completes (their bytes may still be read), and failures wait in `held`.
    pub(super) dead_batches: u32,
    pub(super) held: Vec<(u64, FailReason)>,
    /// The next probe of the primary's kernel timers, while one is due.
    pub(super) probe_at: Option<Instant>,
    /// While frames wait for their confirmation: the count confirmed, and since when it
    /// stands there (see [`CONFIRM_STALL`]).
    pub(super) confirm_watch: Option<(u64, Instant)>,
    /// A CONFIRM of ours is to be written on the primary even if our count did not grow.
    pub(super) poke: bool,
    /// Dialer: the route of the primary since a link took its place (`None`: the first
    /// connection's, the endpoint's first address), which the link's slot takes when the
    /// primary fails in turn.
    pub(super) primary_route: Option<LinkRoute>,
}

/// Bytes of the peer's frames (headers counted) consumed since our last count past which
/// the count leaves at once even when no sender waits for it: it bounds the copies the
/// peer keeps, below the least `max_queued_bytes` (64 KiB), under which its copies refuse
/// no send.
pub(crate) const LAZY_BYTES: u32 = 32 << 10;

/// Bytes [`Failover::copies`] grows by when a copy does not fit.
pub(super) const COPIES_BLOCK: usize = 64 << 10;

/// Longest a count of consumed frames that no sender waits for stays unsent when no frame
/// of ours carries it (see `Conn::rx_lazy`).
pub(crate) const CONFIRM_LAZY: Duration = Duration::from_millis(10);

/// Longest the position of a stream owed frames may stand still before its receiver
/// starts a new epoch itself (`Core::owed_timer`): past the probe's (about 0.7 s).
pub(super) const OWED_STALL: Duration = Duration::from_secs(1);

/// Longest our frames may wait for their confirmation, the primary's kernel timers
/// reading healthy, before we write on the primary ourselves (a CONFIRM of our count,
/// which the peer takes as a repeat): a CONFIRM of the peer's lost with a primary cut
/// without a word leaves our kernel nothing to retransmit, so nothing to time out on; our
/// write gives it something, and the probes then see the path dead (or its
/// acknowledgement shows it alive: a peer that reads slowly is no failure).
pub(super) const CONFIRM_STALL: Duration = Duration::from_secs(1);

/// How often the primary of a peer with a standby link is probed while frames wait.
pub(super) const PROBE_EVERY: Duration = Duration::from_millis(100);

/// Timeouts in a row of the kernel's timer on a primary (retransmissions, or probes of
/// data that could not leave; each twice the last, from the kernel's 200 ms floor) after
/// which a primary with a standby link is taken for dead: the peer's kernel acknowledges
/// nothing, or our packets find no way out. A peer that merely reads slowly (its window
/// closed) answers every probe, which starts the count again.
pub(super) const STALL_TIMEOUTS: u8 = 2;

impl Failover {
    /// The stream starts on a newly adopted first connection; our next frame has number
    /// `next`.
    pub(super) fn start(&mut self, next: u64) {
        let dead_batches = self.dead_batches;
        let held = std::mem::take(&mut self.held);
        *self = Self {
            tx_origin: next,
            tx_epoch_start: next,
            confirmed: next,
            kept_from: next,
            dead_batches,
            held,
            ..Self::default()
        };
    }

    /// The epoch of the peer's stream: 0, then the one each RESUME we wrote named.
    #[cfg(test)]
    pub(super) fn rx_epoch(&self) -> u32 {
        self.rx_order.position().0
    }

    /// A copy of `s`, kept for resending (see [`Failover::copies`]).
    pub(super) fn copy(&mut self, s: &[u8]) -> Bytes {
        if self.copies.capacity() - self.copies.len() < s.len() {
            self.copies.reserve(s.len().max(COPIES_BLOCK));
        }
        self.copies.extend_from_slice(s);
        self.copies.split().freeze()
    }
}

impl Frag {
    /// The ACK frame (kept as a frame when confirmations are on).
    pub(super) fn ack() -> Self {
        let mut f = Self::fin();
        f.own = true;
        f.hdr.kind = FrameKind::Ack;
        f.wire[..Header::LEN].copy_from_slice(&f.hdr.to_bytes());
        f
    }
}

/// The encoded CONFIRM frame carrying `count` (or a frame of another kind of its shape,
/// for tests).
pub(super) fn count_frame(kind: FrameKind, count: u64) -> [u8; Header::LEN + COUNT_LEN] {
    let hdr = Header {
        kind,
        tag: Tag(0),
        len: COUNT_LEN as u32,
        ack: false,
        line: 0,
    };
    let mut b = [0u8; Header::LEN + COUNT_LEN];
    b[..Header::LEN].copy_from_slice(&hdr.to_bytes());
    b[Header::LEN..].copy_from_slice(&count.to_be_bytes());
    b
}

impl Core {
    /// Frames of `peer`'s stream consumed so far, over every link (0 for an unknown
    /// peer).
    pub(super) fn rx_count(&self, peer: PeerId) -> u64 {
        let Some(ep) = self.ep(peer) else { return 0 };
        let frames = |k: ConnKey| {
            self.conns
                .get(k.0 as usize)
                .and_then(Option::as_ref)
                .map_or(0, |c| c.rx_frames)
        };
        ep.fo.rx_base + ep.conns().map(frames).sum::<u64>()
    }

    /// Folds the frames of `peer`'s stream consumed on each connection into the
    /// endpoint's count (before a connection goes) and returns the count.
    pub(super) fn fold_rx(&mut self, peer: PeerId) -> u64 {
        let count = self.rx_count(peer);
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return count;
        };
        ep.fo.rx_base = count;
        for k in ep.conns() {
            if let Some(c) = slot(&mut self.conns, k.0) {
                c.rx_frames = 0;
            }
        }
        count
    }

    /// A RESUME of ours is due: starts a new epoch of `peer`'s stream at the count
    /// consumed now, from which on every run of an older epoch is dropped. Returns the
    /// count and the epoch, or `None` (the endpoint failed) when the epochs ran out.
    fn new_rx_epoch(&mut self, peer: PeerId) -> Option<(u64, u32)> {
        let count = self.fold_rx(peer);
        let ep = self.ep_mut(peer)?;
        let Some(epoch) = ep.fo.rx_order.start_epoch() else {
            let err = ProtoError::RunOutOfOrder;
            self.fail_endpoint(peer, FailReason::Protocol { peer, err });
            return None;
        };
        ep.fo.rx_epoch_base = count;
        ep.fo.rx_spread = true;
        ep.parts.new_epoch();
        // Every run read so far is of an older epoch now: held links are read again, to
        // drop their runs and reach what follows (a RESUME behind them).
        let conns: Vec<ConnKey> = ep.conns().collect();
        for k in conns {
            self.resume_reading(k);
        }
        // A run of plain messages in progress stops: every frame now goes through the walk.
        self.ended += 1;
        Some((count, epoch))
    }

    /// Whether the count of `peer`'s frames we consumed is owed now (see
    /// [`Conn::count_due`]).
    pub(super) fn confirm_due(&self, peer: PeerId) -> bool {
        let Some(EpState::Connected { conn }) = self.ep(peer).map(|e| &e.state) else {
            return false;
        };
        self.conns
            .get(conn.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(Conn::count_due)
    }

    /// Whether `conn` is `peer`'s primary connection (the one its stream is on).
    pub fn is_primary(&self, peer: PeerId, conn: ConnKey) -> bool {
        self.ep(peer)
            .is_some_and(|ep| matches!(ep.state, EpState::Connected { conn: c } if c == conn))
    }

    /// The endpoint's first connection was adopted: both streams start.
    pub(super) fn stream_starts(&mut self, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        let next = ep.head_seq + ep.inflight.len() as u64;
        ep.fo.start(next);
        self.links_changed(peer);
    }

    /// A standby link opened or closed: confirmations and keeping start with the first
    /// open one and stay on for the rest of the stream, so that a frame written while a
    /// link stood by completes only once confirmed, whatever happens to the links after.
    pub(super) fn links_changed(&mut self, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        let on = matches!(ep.state, EpState::Connected { .. }) && ep.links.iter().any(|l| l.open);
        if !on || ep.fo.on {
            return;
        }
        ep.fo.on = true;
        ep.fo.kept_from = ep.head_seq + ep.inflight.len() as u64;
        if let EpState::Connected { conn } = ep.state {
            if let Some(c) = slot(&mut self.conns, conn.0) {
                c.confirms = true;
                // Frames written before the link opened complete at this count.
                c.rx_lazy = u32::MAX;
            }
        }
        // A first CONFIRM: what was consumed so far.
        self.mark_dirty(peer);
    }

    /// The peer confirmed `count` frames of our stream.
    pub(super) fn on_confirm(&mut self, peer: PeerId, count: u64) -> Result<(), ProtoError> {
        let Some(ep) = self.ep_mut(peer) else {
            return Ok(());
        };
        let at = ep.fo.tx_origin.saturating_add(count);
        if at > ep.head_seq + ep.inflight.len() as u64 {
            return Err(ProtoError::CountBeyondSent);
        }
        if at > ep.fo.confirmed {
            ep.fo.confirmed = at;
            self.release_written(peer);
        }
        Ok(())
    }

    /// Moves the kept frames below `ep.head_seq` out (they completed).
    pub(super) fn drop_kept(&mut self, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        let fo = &mut ep.fo;
        while fo.kept_from < ep.head_seq {
            let Some(f) = fo.kept.pop_front() else {
                fo.kept_from = ep.head_seq;
                break;
            };
            let n = usize::from(f.nsegs).min(fo.kept_segs.len());
            fo.kept_segs.drain(..n);
            fo.kept_from += 1;
            if !f.own {
                fo.kept_borrowed = fo.kept_borrowed.saturating_sub(1);
            }
            if f.queued() {
                ep.queued_bytes = ep.queued_bytes.saturating_sub(f.wire_len() as u64);
            }
        }
    }

    /// The primary connection of `peer` failed: moves the stream to a standby link and
    /// returns true, or returns false (nothing done) when the endpoint must fail instead.
    pub(super) fn fail_over(&mut self, now: Instant, peer: PeerId, dead: ConnKey) -> bool {
        let Some(ep) = self.ep(peer) else {
            return false;
        };
        let is_primary = matches!(ep.state, EpState::Connected { conn } if conn == dead);
        if !is_primary || !ep.fo.on || ep.fin_sent || ep.fin_rcvd || !ep.lent.is_empty() {
            // (Without a standby link open, `position` below finds none.)
            return false;
        }
        let Some(next) = ep.links.iter().position(|l| l.open && l.conn.is_some()) else {
            return false;
        };
        self.promote(now, peer, dead, next);
        self.ask_resume(now, peer)
    }

    /// Starts a failover of `peer`'s streams on its primary: a new epoch of the stream
    /// we receive, and a RESUME that asks for the peer's (written first, see
    /// `Core::fill_batch`); nothing else leaves until the peer answers. False when the
    /// endpoint failed.
    pub(super) fn ask_resume(&mut self, now: Instant, peer: PeerId) -> bool {
        let handshake = self.cfg.handshake_timeout;
        let Some((count, epoch)) = self.new_rx_epoch(peer) else {
            return false;
        };
        let Some(ep) = self.ep_mut(peer) else {
            return false;
        };
        let EpState::Connected { conn } = ep.state else {
            return false;
        };
        ep.fo.resume_out = Some((count, epoch, true));
        ep.fo.asks_out += 1;
        ep.fo.awaiting = Some(conn);
        // The peer answers at once; a silent new primary fails over again, or fails.
        if let Some(c) = self.conn_mut(conn) {
            c.deadline = Some(now + handshake);
        }
        self.arm_timer(now + handshake);
        self.counters.failovers += 1;
        self.mark_dirty(peer);
        true
    }

    /// Makes link `i + 1` of `peer` its primary in place of `dead` (reset), whose route
    /// that link's slot takes to be dialed again. What was consumed on `dead` stays
    /// counted.
    fn promote(&mut self, now: Instant, peer: PeerId, dead: ConnKey, i: usize) {
        self.fold_rx(peer);
        // (A batch of an older epoch is counted already.)
        let dead_out = self
            .conn_mut(dead)
            .is_some_and(|c| c.tx.is_none() && !c.failed_over);
        if let Some(c) = self.conn_mut(dead) {
            c.failed_over |= dead_out;
        }
        self.reset_conn(dead);
        let ep = self.ep_mut(peer).expect("promoting a known peer");
        // The new primary's runs are read as link 0's from now on.
        ep.fo.rx_order.moved(i + 1, 0);
        if dead_out {
            ep.fo.dead_batches += 1;
        }
        let route = ep.fo.primary_route.or_else(|| {
            ep.addrs
                .first()
                .map(|&a| (a, ep.binds.first().copied().flatten()))
        });
        let l = &mut ep.links[i];
        let conn = l.conn.take().expect("an open link has a connection");
        l.open = false;
        if l.route.is_some() {
            // The slot dials the failed primary's route; the primary now has the link's.
            ep.fo.primary_route = std::mem::replace(&mut l.route, route);
        }
        ep.state = EpState::Connected { conn };
        let confirms = ep.fo.on;
        if let Some(c) = self.conn_mut(conn) {
            c.link = 0;
            c.rx_frames = 0;
            c.deadline = None;
            c.confirms = confirms;
        }
        // The failed interface may come back: its route is dialed again as a link.
        self.link_dial_later(now, peer, (i + 1) as u8);
    }

    /// A RESUME `r` arrived on `conn`. Returns false when the endpoint failed.
    pub(super) fn on_resume(
        &mut self,
        now: Instant,
        peer: PeerId,
        conn: ConnKey,
        r: ResumeFrame,
    ) -> bool {
        let Some(ep) = self.ep(peer) else {
            return false;
        };
        if r.epoch <= ep.fo.tx_epoch {
            // Overtaken: a newer RESUME of the peer was read already.
            return true;
        }
        let primary = match ep.state {
            EpState::Connected { conn } => Some(conn),
            _ => None,
        };
        let (awaiting, asked) = (ep.fo.awaiting, ep.fo.asks_out > 0);
        let link = self.conn_mut(conn).map_or(0, |c| c.link);
        let answer = match (awaiting, primary) {
            // The answer to ours, or the peer's own crossing ours, which is answered
            // too (each then resends from the other's count, one epoch more).
            (Some(k), _) if k == conn => r.asks,
            // The peer moved the stream to a standby link: so do we, from our primary
            // (which it found dead, even one we had just moved to ourselves).
            (_, Some(p)) if link > 0 => {
                self.promote(now, peer, p, usize::from(link) - 1);
                self.counters.failovers += 1;
                true
            }
            // On the primary: the peer lost a link that carried runs, and asks; or it
            // answers an earlier RESUME of ours (we asked again before its first answer).
            (None, Some(p)) if p == conn && (r.asks || asked) => r.asks,
            _ => {
                let err = ProtoError::UnexpectedResume;
                self.fail_endpoint(peer, FailReason::Protocol { peer, err });
                return false;
            }
        };
        if answer {
            let Some((ours, epoch)) = self.new_rx_epoch(peer) else {
                return false;
            };
            if let Some(ep) = self.ep_mut(peer) {
                ep.fo.resume_out = Some((ours, epoch, false));
            }
            if link == 0 && awaiting.is_none() {
                // (A side that asked counted its failover then.)
                self.counters.failovers += 1;
            }
        }
        if let Some(c) = self.conn_mut(conn) {
            c.deadline = None;
        }
        if let Some(ep) = self.ep_mut(peer) {
            if !r.asks {
                ep.fo.asks_out = ep.fo.asks_out.saturating_sub(1);
            }
            ep.fo.awaiting = None;
            ep.fo.tx_epoch = r.epoch;
            // After a failover the stream goes in runs (its frames of older epochs may
            // still be read on surviving links, and must be told from the new).
            ep.fo.tx_runs = true;
        }
        self.resend_from(peer, r.count)
    }

    /// The peer consumed `count` frames of our stream: those complete, the kept frames
    /// after them go again, first in the queue. False (the endpoint failed) when some of
    /// them were not kept.
    fn resend_from(&mut self, peer: PeerId, count: u64) -> bool {
        let Some(ep) = self.ep_mut(peer) else {
            return false;
        };
        let at = ep.fo.tx_origin.saturating_add(count);
        let end = ep.head_seq + ep.inflight.len() as u64;
        if at > end {
            let err = ProtoError::CountBeyondSent;
            self.fail_endpoint(peer, FailReason::Protocol { peer, err });
            return false;
        }
        if at < ep.head_seq.max(ep.fo.kept_from) && at < end {
            // Frames the peer did not consume completed without a confirmation, before a
            // standby link opened: they are gone with the failed connection.
            let cause = Cause::LostBeforeLinks;
            self.fail_endpoint(peer, FailReason::ConnectionLost { peer, cause });
            return false;
        }
        let fo = &mut ep.fo;
        fo.confirmed = fo.confirmed.max(at);
        fo.tx_epoch_start = at;
        fo.written_ahead.clear();
        // Kept frames from `at` on go back to the front of the queue, in order.
        let skip = (at - fo.kept_from) as usize;
        let mut again: Vec<Frag> = fo.kept.drain(..).collect();
        // Kept again when they leave again.
        fo.kept_borrowed = 0;
        let mut segs: VecDeque<Bytes> = fo.kept_segs.drain(..).collect();
        for f in again.drain(..skip.min(again.len())) {
            let n = usize::from(f.nsegs).min(segs.len());
            segs.drain(..n);
            if f.queued() {
                ep.queued_bytes = ep.queued_bytes.saturating_sub(f.wire_len() as u64);
            }
        }
        fo.kept_from = at;
        // Those whose sends completed at their write complete nothing when they go again.
        for (f, seq) in again.iter_mut().zip(at..) {
            f.reported |= seq < fo.reported;
        }
        fo.reported = fo.reported.min(at);
        for s in segs.into_iter().rev() {
            ep.segs.push_front(s);
        }
        for f in again.into_iter().rev() {
            // (Still counted in `queued_bytes`, as every kept frame.)
            ep.queue.push_front(f);
        }
        // In flight now: the frames before `at`, confirmed (written, or in a failed
        // primary's batch, which `dead_batches` waits for).
        let keep = (at - ep.head_seq) as usize;
        ep.inflight.truncate(keep);
        ep.written = ep.inflight.len();
        // Batches still out carry frames of the old epoch: until they are back no send
        // completes (the kernel may still read their bytes), and they count nothing.
        let out: Vec<ConnKey> = ep.conns().collect();
        for k in out {
            let Some(c) = slot(&mut self.conns, k.0) else {
                continue;
            };
            // (A batch here that holds frames was filled before the RESUME: it leaves with
            // them, of the old epoch, and must count none either.)
            let old = c.tx.as_ref().is_none_or(|b| b.frames() > 0);
            if old && !c.failed_over && c.stage != Stage::Dead {
                c.failed_over = true;
                if let Some(ep) = slot(&mut self.endpoints, peer.0) {
                    ep.fo.dead_batches += 1;
                }
            }
        }
        self.release_written(peer);
        self.mark_dirty(peer);
        true
    }

    /// The peer ended the connection after its FIN and ours were exchanged: it consumed
    /// everything, so every frame written is confirmed.
    pub(super) fn all_confirmed(&mut self, peer: PeerId) {
        if let Some(ep) = self.ep_mut(peer) {
            ep.fo.confirmed = ep.head_seq + ep.inflight.len() as u64;
        }
        self.release_written(peer);
    }

    /// The probe timer of `peer`: due, it asks the driver to probe the primary
    /// ([`Action::Probe`](super::core::Action::Probe)) while frames, or a RESUME of ours,
    /// wait for the peer and a standby link is open, and stops otherwise.
    pub(super) fn probe_timer(&mut self, now: Instant, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        let Some(at) = ep.fo.probe_at else { return };
        // Frames wait for their confirmation, or a RESUME of ours for its answer.
        let waiting = ep.fo.on
            && (!ep.inflight.is_empty() || ep.fo.awaiting.is_some())
            && ep.links.iter().any(|l| l.open);
        let primary = match ep.state {
            EpState::Connected { conn } if waiting => conn,
            _ => {
                ep.fo.probe_at = None;
                ep.fo.confirm_watch = None;
                return;
            }
        };
        if at > now {
            self.arm_timer(at);
            return;
        }
        let next = now + PROBE_EVERY;
        ep.fo.probe_at = Some(next);
        let confirmed = ep.fo.confirmed;
        let poke = match ep.fo.confirm_watch {
            Some((c, since)) if c == confirmed => now.duration_since(since) >= CONFIRM_STALL,
            _ => {
                ep.fo.confirm_watch = Some((confirmed, now));
                false
            }
        };
        if poke {
            ep.fo.confirm_watch = Some((confirmed, now));
            ep.fo.poke = true;
            self.mark_dirty(peer);
        }
        let Some(ep) = self.ep_mut(peer) else { return };
        // Every open link with it: a stream in runs may have frames on any.
        let links: Vec<ConnKey> = (ep.links.iter())
            .filter(|l| l.open && ep.fo.tx_runs)
            .filter_map(|l| l.conn)
            .collect();
        self.arm_timer(next);
        self.todo.push_back(Todo::Probe(primary));
        self.todo.extend(links.into_iter().map(Todo::Probe));
    }

    /// The receiver's watch over a stream owed frames (see `RunOrder::waiting`): armed
    /// when a link is held for a later run; when the position has not moved for
    /// [`OWED_STALL`], the frames at the position went with a link this side did not see
    /// fail, or the peer's RESUME waits behind a held run: a RESUME that asks, which
    /// starts a new epoch (held links are read again) and makes the peer send again.
    ///
    /// Also while an earlier RESUME of ours waits for its answer: that answer may be
    /// behind a held run too, or lost with a link that failed since (asking again is
    /// asking twice, which the peer answers as two RESUMEs that crossed). While a RESUME
    /// of ours is still to be written, the watch waits another period.
    pub(super) fn owed_timer(&mut self, now: Instant, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        let waiting = ep.fo.rx_order.waiting()
            && matches!(ep.state, EpState::Connected { .. })
            && !ep.fin_rcvd;
        if !waiting {
            ep.fo.owed = None;
            return;
        }
        let pos = ep.fo.rx_order.position();
        match ep.fo.owed {
            Some((at, p)) if p == pos && at <= now => {
                if ep.fo.resume_out.is_some() {
                    let at = now + OWED_STALL;
                    ep.fo.owed = Some((at, pos));
                    self.arm_timer(at);
                    return;
                }
                ep.fo.owed = None;
                self.counters.stalls += 1;
                self.ask_resume(now, peer);
            }
            Some((at, p)) if p == pos => self.arm_timer(at),
            _ => {
                let at = now + OWED_STALL;
                ep.fo.owed = Some((at, pos));
                self.arm_timer(at);
            }
        }
    }

    /// Starts probing `peer`'s primary, if it is not probed already.
    pub(super) fn start_probing(&mut self, now: Instant, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        if !ep.fo.on || ep.fo.probe_at.is_some() {
            return;
        }
        let next = now + PROBE_EVERY;
        ep.fo.probe_at = Some(next);
        self.arm_timer(next);
    }

    /// The driver's answer to [`Action::Probe`](super::core::Action::Probe): the
    /// kernel's timer on `conn` fired `timeouts` times in a row without an
    /// acknowledgement. From 2 such timeouts on, a primary with a standby link fails
    /// over.
    pub fn probed(&mut self, now: Instant, conn: ConnKey, timeouts: u8) {
        if timeouts < STALL_TIMEOUTS {
            return;
        }
        let Some(peer) = self.conn_mut(conn).and_then(|c| c.peer) else {
            return;
        };
        if self.fail_over(now, peer, conn) {
            self.counters.stalls += 1;
        } else if self.is_link(conn) && self.conn_mut(conn).is_some_and(|c| c.stage == Stage::Open)
        {
            self.counters.stalls += 1;
            self.link_lost(now, conn);
        }
    }

    /// A batch of a failed primary came back.
    pub(super) fn dead_batch_back(&mut self, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        ep.fo.dead_batches = ep.fo.dead_batches.saturating_sub(1);
        if ep.fo.dead_batches > 0 {
            return;
        }
        let held = std::mem::take(&mut ep.fo.held);
        for (cookie, reason) in held {
            self.events.push_back(CoreEvent::Completed {
                peer,
                cookie,
                result: Err(reason),
            });
        }
        self.release_written(peer);
    }
}
