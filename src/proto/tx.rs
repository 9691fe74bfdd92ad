//! Batching: the frames queued for a peer are gathered into its connection's one
//! [`TxBatch`] (headers and small payloads copied, large payloads by reference), handed
//! out with an [`Action::Transmit`](super::core::Action::Transmit), and completed when the
//! batch comes back. At most one batch per connection is out at a time: the batch is
//! simply not here while it is. No I/O here.

use std::collections::VecDeque;
use std::mem;
use std::time::Instant;

use bytes::Bytes;

use crate::buf::TxBatch;
use crate::error::{Cause, Errno, FailReason};
use crate::proto::config::{CoreConfig, IDLE_COPY_MIN, IDLE_COPY_PACED_MAX};
use crate::proto::conn::{Conn, Orphans, Stage};
use crate::proto::core::{
    slot, ConnKey, Cookies, Core, CoreEvent, Counters, IdleCopy, Lending, Todo,
};
use crate::proto::endpoint::{Endpoint, EpState, Frag, Lent, FRAG_INLINE, FRAG_WIRE};
use crate::proto::failover::count_frame;
use crate::wire::{
    FrameKind, Header, PeerId, ResumeFrame, RunFrame, Tag, FLAG_ACK, HEADER_LEN, KEEP_COPY_MAX,
    LINE, MAX_LINKS, PAD_ALIGN, RUN_LEN,
};

/// The ACK frame (see [`FrameKind::Ack`]).
const ACK_FRAME: [u8; Header::LEN] = Header {
    kind: FrameKind::Ack,
    tag: Tag(0),
    len: 0,
    ack: false,
    line: 0,
}
.to_bytes();

impl Core {
    /// Moves queued frames into the idle send batch of every connection that has some,
    /// and queues one [`Action::Transmit`](super::core::Action::Transmit) per such
    /// connection. Returns whether frames of a connected peer stay queued (its batch is
    /// out, or was filled to its budget): they leave once the batch comes back
    /// ([`handle_sent`](Self::handle_sent)).
    #[inline]
    pub fn flush(&mut self) -> bool {
        if self.dirty.is_empty() {
            // Every progress pass flushes, most of them with nothing new.
            return false;
        }
        self.flush_dirty()
    }

    /// Whether a send left a frame for [`direct_pieces`](Self::direct_pieces).
    #[inline]
    pub fn has_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The frame a send just began an empty batch with, on a connection in a ping-pong
    /// (its last batch held one frame), for the driver to write at once with one
    /// non-blocking call before the rest of its pass, then to report with
    /// [`direct_written`](Self::direct_written): its bytes as at most `N` pieces in `out`
    /// (a queued frame is moved into the batch first), and how many. The batch stays
    /// where it is: the next flush hands it over as usual with what is left of it
    /// (nothing, normally), and its send completes the frame. `None` in every other case
    /// (and for lent pages), so a stream's frames are gathered into one send per pass.
    #[inline]
    pub fn direct_pieces<'a, const N: usize>(
        &'a mut self,
        out: &mut [&'a [u8]; N],
    ) -> Option<(ConnKey, usize)> {
        let k = self.direct.take()?;
        let peer = self.conn_mut(k)?.peer?;
        if self.ep(peer).is_some_and(|e| !e.queue.is_empty()) {
            self.fill_batch(peer, k, false);
        }
        let batch = self.conn_mut(k)?.tx.as_ref()?;
        Some((k, batch.unsent_pieces(out)?))
    }

    /// The driver wrote the first `n` bytes of what [`direct_pieces`](Self::direct_pieces)
    /// gave it.
    #[inline]
    pub fn direct_written(&mut self, k: ConnKey, n: usize) {
        if n == 0 {
            return;
        }
        if let Some(batch) = self.conn_mut(k).and_then(|c| c.tx.as_mut()) {
            batch.advance(n);
            self.counters.written_at_once += 1;
        }
    }

    fn flush_dirty(&mut self) -> bool {
        let mut held = false;
        let mut dirty = mem::take(&mut self.dirty);
        for &peer in &dirty {
            let Some(ep) = slot(&mut self.endpoints, peer.0) else {
                continue;
            };
            ep.dirty = false;
            let EpState::Connected { conn } = ep.state else {
                continue;
            };
            // Nothing queued (a ping-pong's message went out at once, a stream's small
            // ones straight into the batch): only the batch may have to leave.
            let queued = !ep.queue.is_empty() || ep.acks_owed > 0 || ep.fo.on;
            let Some(c) = slot(&mut self.conns, conn.0) else {
                continue;
            };
            if c.unconfirmed {
                // Frames wait for the dialer's first bytes (`Core::confirm`).
                continue;
            }
            if !queued {
                submit_batch(c, conn, &mut self.counters, &mut self.todo);
                continue;
            }
            let turns = self.ep(peer).is_some_and(|e| {
                e.fo.tx_runs
                    && !e.queue.is_empty()
                    && e.fo.resume_out.is_none()
                    && e.fo.awaiting.is_none()
            });
            if turns {
                // In runs every open connection takes its turn first.
                self.spread(peer, true);
            } else {
                self.fill_batch(peer, conn, true);
                self.spread(peer, false);
            }
            held |= self.ep(peer).is_some_and(|e| !e.queue.is_empty());
        }
        dirty.clear();
        self.dirty = dirty;
        held
    }

    /// Frames of `peer` still queued after its primary's batch was filled (that batch is
    /// out, or full) go to every open link whose batch is here, each batch a run: a link
    /// takes the next frames each time its batch comes back, so each carries a share in
    /// proportion to what it moves. The first spread batch of an epoch puts the stream in
    /// runs for good (see "Runs" in [`wire`](crate::wire)); from then on the primary
    /// (`with_primary`) is one of the connections.
    fn spread(&mut self, peer: PeerId, with_primary: bool) {
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        let EpState::Connected { conn: primary } = ep.state else {
            return;
        };
        if ep.queue.is_empty()
            || !ep.fo.on
            || ep.fo.awaiting.is_some()
            || ep.fo.resume_out.is_some()
            || !ep.lent.is_empty()
        {
            return;
        }
        // The connections whose batch is here, the one that carried the fewest bytes
        // first: links of equal speed carry equal shares, and a slower one, whose batch
        // is out longer, takes fewer.
        let mut idle = [(u64::MAX, None); MAX_LINKS];
        let mut n = 0;
        for k in with_primary
            .then_some(primary)
            .into_iter()
            .chain(ep.links.iter().filter(|l| l.open).filter_map(|l| l.conn))
        {
            if let Some(c) = slot(&mut self.conns, k.0) {
                if c.stage == Stage::Open && c.tx.is_some() {
                    idle[n] = (c.tx_bytes, Some(k));
                    n += 1;
                }
            }
        }
        idle[..n].sort_unstable_by_key(|&(b, _)| b);
        for &(_, k) in &idle[..n] {
            let Some(k) = k else { continue };
            if self.ep(peer).is_some_and(|e| !e.fo.tx_runs) {
                self.runs_begin(peer, primary);
            }
            self.fill_batch(peer, k, true);
            if self.ep(peer).is_none_or(|e| e.queue.is_empty()) {
                break;
            }
        }
    }

    /// `peer`'s stream goes in runs from its next batch on. The primary's batch holds the
    /// last frames handed out (one connection carried them all).
    fn runs_begin(&mut self, peer: PeerId, primary: ConnKey) {
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        ep.fo.tx_runs = true;
        let next = ep.head_seq + ep.inflight.len() as u64;
        if let Some(c) = slot(&mut self.conns, primary.0) {
            c.tx_first = match c.tx.as_ref() {
                // Out: the frames after the written ones.
                None => ep.head_seq + ep.written as u64,
                // Here: the last frames handed out, written at once or gathered into it.
                Some(b) => next - b.frames() as u64,
            };
        }
        self.counters.spread_streams += 1;
    }

    /// A send finished (`Err`: the OS error it failed with): the batch comes back.
    /// Returns whether the driver now sets the socket of `conn` to acknowledge at once
    /// (`TCP_QUICKACK`): on a connection that asked for it
    /// ([`set_quick_ack`](Self::set_quick_ack)), when the batch, sent, carried a large
    /// message that found its peer idle and was copied
    /// ([`CoreConfig::splice_idle`](crate::CoreConfig::splice_idle)): in a ping-pong its
    /// answer is large too.
    pub fn handle_sent(
        &mut self,
        now: Instant,
        conn: ConnKey,
        batch: TxBatch,
        result: Result<(), Errno>,
    ) -> bool {
        let quick = self
            .conn_mut(conn)
            .is_some_and(|c| mem::take(&mut c.answer_quick))
            && result.is_ok();
        self.sent_back(now, conn, batch, result);
        quick
    }

    /// [`handle_sent`](Self::handle_sent) but for its answer.
    fn sent_back(
        &mut self,
        now: Instant,
        conn: ConnKey,
        mut batch: TxBatch,
        result: Result<(), Errno>,
    ) {
        let frames = batch.frames();
        if batch.has_lent() && result.is_ok() {
            self.keep_lent(conn, &mut batch);
        }
        batch.clear();
        let Some(c) = self.conn_mut(conn) else { return };
        c.tx = Some(batch);
        let dead_of = mem::take(&mut c.failed_over).then_some(c.peer).flatten();
        if let Some(o) = c.orphans.take() {
            self.complete_orphans(o);
        }
        if let Some(peer) = dead_of {
            // A failed primary's batch, or one of an epoch before a failover: the sends it
            // held may complete now. Its frames went again; it counts none.
            self.dead_batch_back(peer);
        }
        let Some(c) = self.conn_mut(conn) else { return };
        let peer = c.peer;
        let close_after = c.close_after_tx;
        let stage = c.stage;
        if !c.held.is_empty() && result.is_ok() && (stage != Stage::Dead || close_after) {
            // A handshake record written meanwhile leaves now (a REJECT before the close).
            let held = mem::take(&mut c.held);
            if let Some(b) = c.tx.as_mut() {
                b.push_copy(&held);
            }
            c.tx_ready = false;
            self.submit_tx(conn);
            if stage == Stage::Dead {
                return;
            }
        }
        if stage == Stage::Dead {
            // A REJECT is out (or failed): now the socket may go.
            if close_after {
                let Some(c) = self.conn_mut(conn) else { return };
                c.close_after_tx = false;
                self.todo.push_back(Todo::Close(conn));
            }
            return;
        }
        if let Err(e) = result {
            if self.is_link(conn) {
                return self.link_lost(now, conn);
            }
            let unconfirmed = self.conn_mut(conn).is_some_and(|c| c.unconfirmed);
            if let Some(peer) = peer.filter(|_| stage == Stage::Open && unconfirmed) {
                self.unconfirmed_lost(now, peer, conn, Cause::Os(e));
            } else if let Some(peer) = peer.filter(|_| stage == Stage::Open) {
                if self.fail_over(now, peer, conn) {
                    return;
                }
                let cause = Cause::SendFailed(e);
                self.fail_endpoint(peer, FailReason::ConnectionLost { peer, cause });
            } else {
                self.kill_conn(conn);
                if let Some(p) = peer {
                    if self.ep_dialing_on(p, conn) {
                        self.retry_or_fail(Some(now), p, Cause::Os(e));
                    }
                }
            }
            return;
        }
        if stage == Stage::Open {
            if let Some(peer) = peer {
                if dead_of.is_none() {
                    self.complete_frames(peer, conn, frames);
                }
                self.await_acks(now, peer, false);
                let ep = self.ep(peer).expect("open conn has an endpoint");
                if ep.fo.on && ep.fo.probe_at.is_none() {
                    self.start_probing(now, peer);
                }
                let ep = self.ep(peer).expect("open conn has an endpoint");
                let (more, done) = (
                    !ep.queue.is_empty()
                        || ep.acks_owed > 0
                        || ep.fo.resume_out.is_some()
                        || (ep.fo.on && self.confirm_due(peer)),
                    ep.fin_sent && ep.fin_rcvd && ep.drained(),
                );
                if more {
                    self.mark_dirty(peer);
                }
                if done {
                    self.close_clean(peer, conn);
                }
            }
        }
    }

    /// A batch with lent segments came back written: the segments of frames not yet
    /// acknowledged stay with the endpoint until their ACK.
    fn keep_lent(&mut self, conn: ConnKey, batch: &mut TxBatch) {
        let Some(c) = slot(&mut self.conns, conn.0) else {
            return;
        };
        let (Stage::Open, Some(peer)) = (c.stage, c.peer) else {
            return;
        };
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        if !matches!(ep.state, EpState::Connected { conn: k } if k == conn) {
            return;
        }
        batch.take_lent(|b| {
            if ep.acked_early > 0 {
                ep.acked_early -= 1;
            } else {
                ep.lent_segs.push_back(b);
            }
        });
    }

    /// Moves `peer`'s queued frames (ACKs owed first) into the idle batch of `conn`, as
    /// far as its budget goes, and, with `submit`, queues the batch's
    /// [`Action::Transmit`](super::core::Action::Transmit). Without, the flush that
    /// follows submits it (frames a send writes at once, [`direct_pieces`](Self::direct_pieces)).
    fn fill_batch(&mut self, peer: PeerId, conn: ConnKey, submit: bool) {
        let (budget, max_iov, inline, max_frame) = (
            self.cfg.coalesce_bytes,
            self.cfg.max_iov,
            self.cfg.inline_limit,
            self.cfg.max_frame,
        );
        let (splice_min, splice_max, splice_idle, judged) = (
            self.cfg.splice_min,
            self.cfg.splice_max,
            self.cfg.splice_idle,
            self.lend_judged,
        );
        // The count of the peer's frames we consumed (over every link), and whether it
        // is owed now; it may leave on any link, between runs.
        // (Counted only while confirmations are on: one link's fill reads no other
        // connection.)
        let confirms = self.ep(peer).is_some_and(|e| e.fo.on);
        let (rx_count, due) = match confirms {
            true => (self.rx_count(peer), self.confirm_due(peer)),
            false => (0, false),
        };
        let primary = self.primary_conn(peer);
        let Some(c) = slot(&mut self.conns, conn.0) else {
            return;
        };
        // The idle copy's bounds on this connection (`Core::set_idle_copy`).
        let (idle_min, splice_idle) = match c.idle_copy {
            IdleCopy::Off => (IDLE_COPY_MIN, None),
            IdleCopy::Paced => (0, splice_idle.map(|m| m.min(IDLE_COPY_PACED_MAX))),
            IdleCopy::Full => (IDLE_COPY_MIN, splice_idle),
        };
        let lending = c.lending;
        let Some(batch) = c.tx.as_mut() else { return }; // in flight: next completion refills
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        let mut told = false;
        // Failover (see `failover.rs`): a RESUME first, on the primary; nothing else
        // until the peer's answers ours; then the count of the peer's frames we
        // consumed, when it grew.
        if Some(conn) == primary {
            if let Some((count, epoch, asks)) = ep.fo.resume_out.take() {
                batch.push_copy(&ResumeFrame { count, epoch, asks }.to_bytes());
                ep.fo.rx_told = count;
                told = true;
            }
        }
        if ep.fo.awaiting.is_some() || ep.fo.resume_out.is_some() {
            if submit {
                submit_batch(c, conn, &mut self.counters, &mut self.todo);
            }
            if told {
                self.count_told(primary);
            }
            return;
        }
        if ep.fo.on {
            // The count leaves on its own when the peer may wait for it (`Conn::rx_lazy`),
            // else with the frames that leave anyway (the answer of a ping-pong).
            let rides = batch.frames() > 0 || !ep.queue.is_empty() || ep.acks_owed > 0;
            let poke = ep.fo.poke && Some(conn) == primary;
            if (rx_count > ep.fo.rx_told && (rides || due)) || poke {
                batch.push_copy(&count_frame(FrameKind::Confirm, rx_count));
                ep.fo.rx_told = rx_count;
                ep.fo.poke = false;
                told = true;
            }
        }
        let next = ep.head_seq + ep.inflight.len() as u64;
        if batch.frames() == 0 {
            c.tx_first = next;
        }
        // In runs, the batch's counted frames are one: its RUN goes before the first, and
        // says how many once they are known. A batch whose frames another link's run
        // followed takes no more (its frames must stay consecutive).
        let runs = ep.fo.tx_runs;
        let closed = runs && c.tx_first + batch.frames() as u64 != next;
        let mut run_at: Option<usize> = None;
        let mut run_frames = 0u32;
        // ACKs first: the peer's lent pages wait for them.
        // A batch that held frames already (gathered small messages) holds a message.
        let (fresh, mut acks) = (batch.frames() == 0, 0);
        while !closed && ep.acks_owed > 0 && (batch.frames() == 0 || batch.parts() < max_iov) {
            ep.acks_owed -= 1;
            open_run(batch, runs, &mut run_at, &mut run_frames);
            batch.push_copy(&ACK_FRAME);
            batch.add_frame();
            ep.inflight.push(None);
            if ep.fo.on {
                ep.fo.kept.push_back(Frag::ack());
            }
            acks += 1;
        }
        while let Some(f) = ep.queue.front().filter(|_| !closed) {
            let first = batch.frames() == 0;
            // No message before this one in the batch (ACKs aside).
            let data_first = fresh && batch.frames() == acks;
            let parts = batch.parts() + 1 + f.nsegs as usize;
            if !first && (batch.len() + f.wire_len() > budget || parts > max_iov) {
                break;
            }
            if f.hdr.kind == FrameKind::Fin && Some(conn) != primary {
                // A FIN goes on the primary: the peer, having read it, may close, and
                // its end of the primary must come after our FIN on the primary.
                break;
            }
            let mut f = ep.queue.pop_front().expect("front exists");
            let (hdr, cookie, queued) = (f.hdr, f.pending_cookie(), f.queued());
            open_run(batch, runs, &mut run_at, &mut run_frames);
            let keep = ep.fo.on;
            // Kept, a short payload is copied: its send completes at its write.
            let copy = keep && !f.own && hdr.len as usize <= KEEP_COPY_MAX;
            // A payload this large lends its pages (spliced, not copied): the header asks
            // the peer for an ACK, and the send completes on it. Unless it is a stream's
            // and larger than one trip through the lending pipe (`CoreConfig::splice_max`)
            // or on a connection that lends no stream (`Core::set_lending`), or an idle
            // one that is larger than that trip where only those within it are lent,
            // or the peer is idle, waiting for this message alone and it is short enough
            // to copy (`CoreConfig::splice_idle`).
            let len = hdr.len as usize;
            let idle = data_first && ep.queue.is_empty() && ep.lent.is_empty();
            let lendable = f.nsegs > 0
                && !keep
                && splice_min.is_some_and(|m| len >= m)
                && match (idle, lending) {
                    (true, Lending::IdleWithinMax) | (false, Lending::Streams) => {
                        splice_max.is_none_or(|m| len <= m)
                    }
                    (true, _) => true,
                    (false, _) => false,
                };
            let idle_copy =
                lendable && idle && len >= idle_min && splice_idle.is_some_and(|m| len <= m);
            // (The machine's verdict comes last: an idle copy is the same either way.)
            let lend = lendable && !idle_copy && judged;
            if idle_copy {
                self.counters.idle_copies += 1;
            }
            // A large message its peer waits for alone, copied: the answer, large too
            // in a ping-pong, is acknowledged at once (`Core::handle_sent`).
            c.answer_quick |= c.quick_ack && idle_copy;
            if f.nsegs == 0 {
                // Header (and target) and inline payload, if any: one fixed-size copy.
                batch.push_small(&f.wire, f.wire_len());
            } else {
                let head = &f.wire[..f.head as usize];
                let small = hdr.len as usize <= inline;
                let segs = || ep.segs.iter().take(usize::from(f.nsegs));
                if lend {
                    let mut h = [0u8; FRAG_WIRE];
                    h[..head.len()].copy_from_slice(head);
                    let line = payload_line(segs());
                    let flags = FLAG_ACK | (u16::from(line) << 8);
                    h[2..4].copy_from_slice(&flags.to_be_bytes());
                    batch.push_copy(&h[..head.len()]);
                } else if let Some(pad) = (hdr.kind == FrameKind::Send && !small)
                    .then(|| copy_pad(batch.remaining(), segs()))
                    .filter(|&p| p > 0 && hdr.len as usize + p <= max_frame as usize)
                {
                    // The header, then the padding that puts the payload where its copy
                    // runs fast (zeros: the arena is not read by the peer's handler).
                    let mut h = [0u8; Header::LEN + PAD_MAX];
                    let padded = Header {
                        len: hdr.len + pad as u32,
                        line: pad as u8,
                        ..hdr
                    };
                    h[..Header::LEN].copy_from_slice(&padded.to_bytes());
                    batch.push_copy(&h[..Header::LEN + pad]);
                } else {
                    batch.push_copy(head);
                }
                for _ in 0..f.nsegs {
                    let Some(s) = ep.segs.pop_front() else { break };
                    if copy {
                        let c = ep.fo.copy(&s);
                        ep.fo.kept_segs.push_back(c);
                    } else if keep {
                        ep.fo.kept_segs.push_back(s.clone());
                    }
                    if lend {
                        batch.push_lent(s);
                    } else if small {
                        // Small: copied next to its header, so runs of small frames form
                        // one contiguous iovec.
                        batch.push_copy(&s);
                    } else {
                        // Large: the caller's buffers go out by reference.
                        batch.push_ext(s);
                    }
                }
            }
            batch.add_frame();
            c.tx_bytes += f.wire_len() as u64;
            if queued && !keep {
                // (A kept frame counts until it completes, see `Core::drop_kept`.)
                ep.queued_bytes -= (Header::LEN + hdr.len as usize) as u64;
            }
            if lend {
                ep.lent.push_back(Lent {
                    seq: ep.head_seq + ep.inflight.len() as u64,
                    segs: usize::from(f.nsegs),
                });
            }
            ep.inflight.push(cookie);
            if keep {
                f.own |= copy || f.nsegs == 0;
                if !f.own {
                    ep.fo.kept_borrowed += 1;
                }
                ep.fo.kept.push_back(f);
            }
        }
        if let Some(at) = run_at {
            let first = ep.head_seq + ep.inflight.len() as u64 - u64::from(run_frames);
            let run = RunFrame {
                offset: first - ep.fo.tx_epoch_start,
                epoch: ep.fo.tx_epoch,
                len: run_frames,
            };
            batch.patch(at, &run.to_bytes());
        }
        if submit {
            submit_batch(c, conn, &mut self.counters, &mut self.todo);
        }
        if told {
            self.count_told(primary);
        }
    }

    /// The primary connection of `peer` (the one its stream started on, or moved to).
    pub(super) fn primary_conn(&self, peer: PeerId) -> Option<ConnKey> {
        match self.ep(peer)?.state {
            EpState::Connected { conn } => Some(conn),
            _ => None,
        }
    }

    /// A count went out: the primary owes none until more is consumed.
    fn count_told(&mut self, primary: Option<ConnKey>) {
        if let Some(c) = primary.and_then(|k| self.conn_mut(k)) {
            c.rx_lazy = 0;
            c.confirm_at = None;
        }
    }

    pub(super) fn submit_tx(&mut self, conn: ConnKey) {
        if let Some(c) = self.conn_mut(conn) {
            if c.tx.as_ref().is_some_and(|b| !b.is_empty()) && !c.tx_ready {
                c.tx_ready = true;
                self.todo.push_back(Todo::Transmit(conn));
            }
        }
    }

    /// The endpoint of `peer` fails while `conn`'s batch is with the driver: its frames
    /// complete when it comes back ([`handle_sent`](Self::handle_sent)), not now.
    pub(super) fn orphan_inflight(&mut self, peer: PeerId, conn: ConnKey, reason: &FailReason) {
        let (Some(c), Some(ep)) = (
            slot(&mut self.conns, conn.0),
            slot(&mut self.endpoints, peer.0),
        ) else {
            return;
        };
        if c.tx.is_some() || ep.inflight.is_empty() {
            return;
        }
        let cookies = ep.take_inflight();
        ep.orphaned += cookies.iter().flatten().count();
        c.orphans = Some((peer, reason.clone(), cookies));
    }

    pub(super) fn complete_orphans(&mut self, (peer, reason, cookies): Orphans) {
        if let Some(ep) = self.ep_mut(peer) {
            ep.orphaned = ep.orphaned.saturating_sub(cookies.iter().flatten().count());
        }
        for cookie in cookies.into_iter().flatten() {
            self.events.push_back(CoreEvent::Completed {
                peer,
                cookie,
                result: Err(reason.clone()),
            });
        }
    }

    /// The first `frames` sends in flight to `peer` completed without error: their
    /// cookies become one run of completions (no event per message), due after the
    /// events queued before it.
    /// `conn`'s batch came back written with `frames` counted frames.
    fn complete_frames(&mut self, peer: PeerId, conn: ConnKey, frames: usize) {
        let first = self.conn_mut(conn).map_or(0, |c| c.tx_first);
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        if !ep.fo.tx_runs {
            // One connection carries the stream: its batches come back in order.
            ep.written += frames;
        } else if frames > 0 {
            let at = ep.head_seq + ep.written as u64;
            if first > at {
                // A later run came back first: written once the ones before it are.
                ep.fo.written_ahead.push((first, first + frames as u64));
                return;
            }
            ep.written += frames;
            while let Some(i) =
                (ep.fo.written_ahead.iter()).position(|r| r.0 == ep.head_seq + ep.written as u64)
            {
                let (from, to) = ep.fo.written_ahead.swap_remove(i);
                ep.written += (to - from) as usize;
            }
        }
        self.release_written(peer);
    }

    /// Keeps the ACK deadline of `peer`: armed while a written frame waits for an ACK
    /// (restarted when `progress`, an ACK, came), cleared when none does.
    pub(super) fn await_acks(&mut self, now: Instant, peer: PeerId, progress: bool) {
        let stall = self.cfg.frame_stall;
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        let waiting = ep
            .lent
            .front()
            .is_some_and(|l| l.seq < ep.head_seq + ep.written as u64);
        if !waiting {
            ep.ack_deadline = None;
        } else if progress || ep.ack_deadline.is_none() {
            let d = now + stall;
            ep.ack_deadline = Some(d);
            self.arm_timer(d);
        }
    }

    /// The peer read the oldest frame whose pages were lent (its ACK came): that frame
    /// and the written frames behind it up to the next lent one complete. False when no
    /// frame waits for an ACK (the peer broke the protocol).
    pub(super) fn handle_ack(&mut self, peer: PeerId) -> bool {
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return true;
        };
        let Some(l) = ep.lent.pop_front() else {
            return false;
        };
        // The peer read the bytes: the caller's memory may go.
        let back = l.segs.min(ep.lent_segs.len());
        ep.lent_segs.drain(..back);
        ep.acked_early += l.segs - back;
        self.release_written(peer);
        true
    }

    /// Completes the written frames at the front of `peer`'s in-flight frames, up to the
    /// first one whose pages are still lent; with a standby link open, up to the first one
    /// not confirmed, and then the written frames kept as copies behind it, up to the first
    /// one kept by reference (see `failover.rs`).
    pub(super) fn release_written(&mut self, peer: PeerId) {
        self.release_front(peer);
        self.report_own(peer);
    }

    /// [`release_written`](Self::release_written) of the frames that leave `inflight`.
    fn release_front(&mut self, peer: PeerId) {
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        ep.written = ep.written.min(ep.inflight.len());
        let mut frames = ep.written;
        if let Some(l) = ep.lent.front() {
            frames = frames.min((l.seq - ep.head_seq) as usize);
        }
        if ep.fo.on || ep.fo.dead_batches > 0 {
            // Complete once confirmed (they may have to go again), and not while a failed
            // primary's batch may still read them.
            let confirmed = ep.fo.confirmed.saturating_sub(ep.head_seq) as usize;
            frames = if ep.fo.dead_batches > 0 {
                0
            } else {
                frames.min(confirmed)
            };
        }
        if frames == 0 {
            return;
        }
        ep.written -= frames;
        ep.head_seq += frames as u64;
        let spare = self.sent.spare.pop().unwrap_or_default();
        let cookies = if frames >= ep.inflight.len() {
            // The usual case: the batch carried every send in flight.
            mem::replace(&mut ep.inflight, spare)
        } else {
            let mut run = spare;
            run.extend(ep.inflight.drain(..frames));
            run
        };
        if !ep.fo.kept.is_empty() {
            self.drop_kept(peer);
        }
        if cookies.iter().all(Option::is_none) {
            self.sent.recycle(cookies);
            return;
        }
        self.push_sent(peer, cookies);
    }

    /// With a standby link open: the sends of the written frames that wait only for their
    /// confirmation and whose bytes the engine holds ([`Frag::own`]) complete now, in
    /// order, up to the first that is not such a frame. Their cookies leave `inflight`
    /// (a `None` stays in their place until the confirmation), and their frames stay
    /// kept for resending.
    fn report_own(&mut self, peer: PeerId) {
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        let fo = &mut ep.fo;
        if !fo.on || fo.dead_batches > 0 {
            return;
        }
        let mut end = ep.head_seq + ep.written as u64;
        if let Some(l) = ep.lent.front() {
            end = end.min(l.seq);
        }
        let mut s = fo.reported.max(ep.head_seq);
        let mut cookies: Option<Cookies> = None;
        while s < end {
            let kept = s
                .checked_sub(fo.kept_from)
                .and_then(|i| fo.kept.get(i as usize));
            if !kept.is_some_and(|f| f.own) {
                break;
            }
            let at = (s - ep.head_seq) as usize;
            if let Some(c) = ep.inflight.get_mut(at).and_then(Option::take) {
                cookies
                    .get_or_insert_with(|| self.sent.spare.pop().unwrap_or_default())
                    .push(Some(c));
            }
            s += 1;
        }
        fo.reported = s;
        if let Some(cookies) = cookies {
            self.push_sent(peer, cookies);
        }
    }

    /// `cookies` of `peer` completed without error: a run, due after the events queued
    /// before it.
    fn push_sent(&mut self, peer: PeerId, cookies: Cookies) {
        self.sent.runs.push_back(SentRun {
            due: self.sent.popped + self.events.len() as u64,
            peer,
            cookies,
            next: 0,
        });
    }

    /// The next run of sends to one peer that completed without error, once every event
    /// queued before it was taken with [`poll_event`](Self::poll_event): the peer and the
    /// cookies in send order (`None` for a control frame, which completes nothing). Give
    /// the cookies back with [`recycle_sent`](Self::recycle_sent), so that steady state
    /// allocates nothing. A driver that takes runs here calls the application once per
    /// cookie without an event per message; `poll_event` alone reports the same sends one
    /// [`CoreEvent::Completed`] at a time.
    pub fn poll_sent(&mut self) -> Option<(PeerId, Cookies)> {
        if self.sent.runs.front()?.due != self.sent.popped {
            return None;
        }
        let mut run = self.sent.runs.pop_front()?;
        // Those `poll_event` reported already.
        run.cookies.drain(..run.next);
        Some((run.peer, run.cookies))
    }

    /// Whether [`poll_event`](Self::poll_event) or [`poll_sent`](Self::poll_sent) has
    /// something (checked without a call).
    #[inline]
    pub fn has_events(&self) -> bool {
        !self.events.is_empty() || !self.sent.runs.is_empty()
    }

    /// Takes back the cookies of a run from [`poll_sent`](Self::poll_sent) (for reuse).
    pub fn recycle_sent(&mut self, cookies: Cookies) {
        self.sent.recycle(cookies);
    }

    /// For [`poll_event`](Self::poll_event): the next completion of a due run.
    pub(super) fn next_sent(&mut self) -> Option<CoreEvent> {
        loop {
            let run = self.sent.runs.front_mut()?;
            if run.due != self.sent.popped {
                return None;
            }
            let next = run.cookies.get(run.next).copied();
            run.next += 1;
            match next {
                Some(Some(cookie)) => {
                    return Some(CoreEvent::Completed {
                        peer: run.peer,
                        cookie,
                        result: Ok(()),
                    })
                }
                Some(None) => {}
                None => {
                    let run = self.sent.runs.pop_front().expect("front exists");
                    self.sent.recycle(run.cookies);
                }
            }
        }
    }
}

/// Before a counted frame goes into a batch of a stream in runs (`runs`): the batch's
/// RUN, at its first such frame (its arena offset in `run_at`, completed by
/// `Core::fill_batch`), and one more frame in it.
#[inline]
fn open_run(batch: &mut TxBatch, runs: bool, run_at: &mut Option<usize>, frames: &mut u32) {
    if !runs {
        return;
    }
    if run_at.is_none() {
        *run_at = Some(batch.arena_len());
        batch.push_copy(&[0u8; HEADER_LEN + RUN_LEN]);
    }
    *frames += 1;
}

/// Hands `conn`'s batch to the driver (one [`Todo::Transmit`]) when it holds frames and
/// is not with the driver already, and counts it.
#[inline]
fn submit_batch(c: &mut Conn, conn: ConnKey, counters: &mut Counters, todo: &mut VecDeque<Todo>) {
    let Some(batch) = c.tx.as_ref() else { return }; // in flight: its completion refills
    if !batch.is_empty() && !c.tx_ready {
        c.tx_ready = true;
        counters.batches += 1;
        counters.frames += batch.frames() as u64;
        todo.push_back(Todo::Transmit(conn));
    }
}

/// The fast path of a small send ([`Core::send`]): with nothing queued for the peer and
/// its connection's batch idle (not with the driver), the SEND frame for `tag` (its
/// payload `segs`, together `len` bytes, at most [`FRAG_INLINE`]) is written straight
/// into the batch, as [`Core::flush`] would move it there (same budget), and its cookie
/// joins the batch's. Returns false, changing nothing, when the frame must be queued
/// instead.
#[inline(always)]
pub(super) fn batch_small(
    ep: &mut Endpoint,
    conns: &mut [Option<Conn>],
    tag: Tag,
    len: usize,
    segs: &[Bytes],
    cookie: u64,
    cfg: &CoreConfig,
) -> bool {
    let Some(batch) = idle_conn(ep, conns).and_then(|(_, c)| c.tx.as_mut()) else {
        return false;
    };
    let wire = Header::LEN + len;
    if batch.frames() > 0
        && (batch.len() + wire > cfg.coalesce_bytes || batch.parts() + 1 > cfg.max_iov)
    {
        return false;
    }
    let head = Header::send_head(tag, len as u32);
    // One segment of 8 bytes, the common small message: one copy of 16 bytes.
    match segs.first().map(|s| <&[u8; 8]>::try_from(&s[..])) {
        Some(Ok(eight)) if segs.len() == 1 => batch.push_frame16(&head, eight),
        _ => batch.push_frame::<{ Header::LEN }, FRAG_INLINE>(&head, segs),
    }
    batch.add_frame();
    ep.inflight.push(Some(cookie));
    true
}

/// `ep`'s connection when a frame may go straight into its batch: connected, nothing
/// queued before it, the dialer's first bytes seen, the batch not with the driver.
#[inline(always)]
fn idle_conn<'a>(ep: &Endpoint, conns: &'a mut [Option<Conn>]) -> Option<(ConnKey, &'a mut Conn)> {
    let EpState::Connected { conn } = ep.state else {
        return None;
    };
    // A stream in runs has each batch's RUN written by `Core::fill_batch`.
    if !ep.queue.is_empty() || ep.fo.tx_runs {
        return None;
    }
    let c = slot(conns, conn.0)?;
    // Frames wait for the dialer's first bytes (`Core::confirm`).
    if c.unconfirmed || c.tx.is_none() {
        return None;
    }
    Some((conn, c))
}

/// The connection on which a small message to the endpoint `ep` may be written at once
/// ([`Core::send_with`]): idle as for [`batch_small`], in a ping-pong (its last batch held
/// one frame), its batch empty, nothing gathered since the last flush and no ACK owed
/// (implied: an owed ACK keeps the endpoint dirty, or the batch out, until it leaves).
#[inline]
pub(super) fn ping_conn(ep: &Endpoint, conns: &mut [Option<Conn>]) -> Option<ConnKey> {
    // Dirty: a frame went into the batch, or out at once, since the last flush.
    if ep.dirty || ep.acks_owed > 0 {
        return None;
    }
    let (conn, c) = idle_conn(ep, conns)?;
    (c.solo && c.tx.as_ref().is_some_and(TxBatch::is_empty)).then_some(conn)
}

/// Sends completed without error and not yet reported, a run per batch. A run is due
/// once the events queued before it were taken: `popped` counts the events taken so
/// far, and a run made when `n` events waited is due at `popped + n`, so completions
/// and other events reach the application in the order they happened.
#[derive(Debug, Default)]
pub(crate) struct SentRuns {
    runs: VecDeque<SentRun>,
    /// Events taken with `poll_event` so far.
    pub(super) popped: u64,
    /// Emptied cookie queues, for reuse.
    spare: Vec<Cookies>,
}

#[derive(Debug)]
struct SentRun {
    due: u64,
    peer: PeerId,
    cookies: Cookies,
    /// Cookies before this one were reported by [`Core::next_sent`].
    next: usize,
}

impl SentRuns {
    fn recycle(&mut self, mut cookies: Cookies) {
        cookies.clear();
        self.spare.push(cookies);
    }
}

/// Most padding [`copy_pad`] asks for.
const PAD_MAX: usize = LINE - PAD_ALIGN;

/// A copied payload whose largest segment is at least this large is padded ([`copy_pad`]):
/// below a page the copy's speed hardly shows.
pub(crate) const PAD_MIN: usize = 4096;

/// [`Header::pad`] for a copied SEND whose header starts `at` bytes into the next write
/// and whose payload is made of `segs`: the padding after which the payload's largest
/// segment lies, in the kernel's socket pages (which an idle socket's write starts at a
/// page's first byte), at most 7 bytes before its own offset in a [`LINE`], where the
/// kernel's copy from it runs fast (see [`wire`](crate::wire), "Padding"). 0 when that
/// segment is under [`PAD_MIN`] or already lies there.
fn copy_pad<'a>(at: usize, segs: impl Iterator<Item = &'a Bytes>) -> usize {
    let (best, src, before) = largest_segment(segs);
    if best < PAD_MIN {
        return 0;
    }
    // Where the segment lands without padding: `at + header + before`.
    let unpadded = at.wrapping_add(Header::LEN).wrapping_add(before);
    (src.wrapping_sub(unpadded) % LINE) & !(PAD_ALIGN - 1)
}

/// [`Header::line`] of a lent payload made of `segs`: where its first byte would lie in a
/// [`LINE`] of the sender's memory if the payload were contiguous, taken from its largest
/// segment (the one whose copy counts), so that the receiver, placing the payload at that
/// offset, puts that segment at the offset of its pages.
fn payload_line<'a>(segs: impl Iterator<Item = &'a Bytes>) -> u8 {
    let (_, src, before) = largest_segment(segs);
    (src.wrapping_sub(before) % LINE) as u8
}

/// The largest of a payload's segments (the first of equals): its length, its address, and
/// the payload's bytes before it; all 0 for no bytes.
fn largest_segment<'a>(segs: impl Iterator<Item = &'a Bytes>) -> (usize, usize, usize) {
    let (mut off, mut best) = (0usize, (0usize, 0usize, 0usize));
    for s in segs {
        if s.len() > best.0 {
            best = (s.len(), s.as_ptr() as usize, off);
        }
        off += s.len();
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line of a lent payload follows its largest segment, counted back to the
    /// payload's first byte.
    #[test]
    fn payload_line_follows_the_largest_segment() {
        let mem = Bytes::from(vec![0u8; 4096]);
        let base = mem.as_ptr() as usize;
        let line = |segs: &[Bytes]| usize::from(payload_line(segs.iter()));
        let at = |off: usize| (base + off) % LINE;
        assert_eq!(line(&[mem.slice(..)]), at(0));
        assert_eq!(line(&[mem.slice(13..)]), at(13));
        // A small header segment before the data: the data's place, 40 bytes back.
        let head = Bytes::from_static(&[1; 40]);
        assert_eq!(
            line(&[head.clone(), mem.slice(100..)]),
            (at(100) + LINE - 40) % LINE
        );
        // The larger of two segments counts.
        let segs = [mem.slice(3..1003), mem.slice(2000..2100)];
        assert_eq!(line(&segs), at(3));
        let segs = [mem.slice(3..53), mem.slice(2000..2100)];
        assert_eq!(line(&segs), (at(2000) + LINE - 50) % LINE);
        assert_eq!(line(&[]), 0);
    }
}
