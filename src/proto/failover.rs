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
//! sides may start at once (both saw the reset): each RESUME is then the other's answer.
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
use crate::proto::core::{slot, ConnKey, Core, CoreEvent, Todo};
use crate::proto::endpoint::{EpState, Frag};
use crate::proto::links::LinkRoute;
use crate::wire::{FrameKind, Header, PeerId, Tag, COUNT_LEN};

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
    /// A RESUME to write first: our count, and whether it asks (we start a failover) or
    /// answers the peer's.
    pub(super) resume_out: Option<(u64, bool)>,
    /// The epoch of the peer's stream: 0, then one more at each RESUME we write, which
    /// names it (see "Runs" in [`wire`](crate::wire); nothing reads it while no stream is
    /// spread).
    pub(super) rx_epoch: u32,
    /// We wrote a RESUME on this connection and wait for the peer's.
    pub(super) awaiting: Option<ConnKey>,
    /// Batches of failed primaries still with the driver: until they are back no send
    /// completes (their bytes may still be read), and failures wait in `held`.
    pub(super) dead_batches: u32,
    pub(super) held: Vec<(u64, FailReason)>,
    /// The next probe of the primary's kernel timers, while one is due.
    pub(super) probe_at: Option<Instant>,
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
            confirmed: next,
            kept_from: next,
            dead_batches,
            held,
            ..Self::default()
        };
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
    /// Frames of `peer`'s stream consumed so far (0 for an unknown peer).
    pub(super) fn rx_count(&self, peer: PeerId) -> u64 {
        let Some(ep) = self.ep(peer) else { return 0 };
        let on_primary = match ep.state {
            EpState::Connected { conn } => self
                .conns
                .get(conn.0 as usize)
                .and_then(Option::as_ref)
                .map_or(0, |c| c.rx_frames),
            _ => 0,
        };
        ep.fo.rx_base + on_primary
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
        let count = self.promote(now, peer, dead, next);
        let handshake = self.cfg.handshake_timeout;
        let Some(ep) = self.ep_mut(peer) else {
            return false;
        };
        let EpState::Connected { conn } = ep.state else {
            return false;
        };
        ep.fo.resume_out = Some((count, true));
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
    /// that link's slot takes to be dialed again; returns our count of the peer's frames,
    /// final for the failed connection.
    fn promote(&mut self, now: Instant, peer: PeerId, dead: ConnKey, i: usize) -> u64 {
        let count = self.rx_count(peer);
        let dead_out = self.conn_mut(dead).is_some_and(|c| c.tx.is_none());
        if let Some(c) = self.conn_mut(dead) {
            c.failed_over = dead_out;
        }
        self.reset_conn(dead);
        let ep = self.ep_mut(peer).expect("promoting a known peer");
        ep.fo.rx_base = count;
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
        count
    }

    /// A RESUME with `count` arrived on `conn`. Returns false when the endpoint failed.
    pub(super) fn on_resume(
        &mut self,
        now: Instant,
        peer: PeerId,
        conn: ConnKey,
        count: u64,
    ) -> bool {
        let Some(ep) = self.ep(peer) else {
            return false;
        };
        let primary = match ep.state {
            EpState::Connected { conn } => Some(conn),
            _ => None,
        };
        let awaiting = ep.fo.awaiting;
        let link = self.conn_mut(conn).map_or(0, |c| c.link);
        match (awaiting, primary) {
            // The answer to ours (or the peer's own, crossing ours on the same link).
            (Some(k), _) if k == conn => {}
            // The peer moved the stream to a standby link: so do we, from our primary
            // (which it found dead, even one we had just moved to ourselves).
            (_, Some(p)) if link > 0 => {
                let i = usize::from(link) - 1;
                let ours = self.promote(now, peer, p, i);
                self.counters.failovers += 1;
                if let Some(ep) = self.ep_mut(peer) {
                    ep.fo.resume_out = Some((ours, false));
                }
            }
            _ => {
                let err = ProtoError::UnexpectedResume;
                self.fail_endpoint(peer, FailReason::Protocol { peer, err });
                return false;
            }
        }
        if let Some(c) = self.conn_mut(conn) {
            c.deadline = None;
        }
        if let Some(ep) = self.ep_mut(peer) {
            ep.fo.awaiting = None;
        }
        self.resend_from(peer, count)
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
    /// ([`Action::Probe`](super::core::Action::Probe)) while frames wait and a standby
    /// link is open, and stops otherwise.
    pub(super) fn probe_timer(&mut self, now: Instant, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        let Some(at) = ep.fo.probe_at else { return };
        let waiting = ep.fo.on && !ep.inflight.is_empty() && ep.links.iter().any(|l| l.open);
        let primary = match ep.state {
            EpState::Connected { conn } if waiting => conn,
            _ => {
                ep.fo.probe_at = None;
                return;
            }
        };
        if at > now {
            self.arm_timer(at);
            return;
        }
        let next = now + PROBE_EVERY;
        ep.fo.probe_at = Some(next);
        self.arm_timer(next);
        self.todo.push_back(Todo::Probe(primary));
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
