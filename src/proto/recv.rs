//! The engine's receive side: one walk over received bytes for both receive modes (the
//! connection's own cache, or input lent from a provided buffer), every decision about a
//! large payload (when to pause the multishot receive and read straight into the
//! payload's buffer), and the end of a receive stream. No I/O here.

use std::mem;
use std::time::Instant;

use crate::buf::{Regions, RxBuf};
use crate::error::{Cause, Errno, FailReason, ProtoError, WireError};
use crate::proto::conn::{Conn, Stage};
use crate::proto::core::{slot, ConnKey, Core, CoreEvent, InputStep, RunHead, Step, Todo};
use crate::proto::deframe::Source;
use crate::proto::endpoint::EpState;
use crate::proto::failover::CONFIRM_LAZY;
use crate::proto::spread::Take;
use crate::wire::{
    FrameKind, GetRequest, Header, Hello, PeerId, ResumeFrame, RunFrame, HEADER_LEN, KEEP_COPY_MAX,
    PUT_TARGET_LEN,
};

impl Core {
    /// The regions peers' PUT frames may write into.
    pub fn regions_mut(&mut self) -> &mut Regions {
        &mut self.regions
    }

    /// Walks the bytes a [`Receive`](super::core::Action::Receive) read into `rx`. Call
    /// until it returns [`Step::Rearm`] or [`Step::Drop`]; deliver each [`Step::Deliver`]
    /// payload from `rx` before the next call.
    #[inline]
    pub fn recv_step(&mut self, now: Instant, conn: ConnKey, rx: &mut RxBuf) -> Step {
        if let Some(step) = self.cached_send(now, conn, rx) {
            return step;
        }
        let mut at = 0;
        match self.walk(now, conn, rx, &[], &mut at) {
            InputStep::Deliver {
                peer,
                tag,
                src: Source::Cache(range),
            } => Step::Deliver { peer, tag, range },
            InputStep::Deliver {
                src: Source::Input(_),
                ..
            } => unreachable!("an empty input holds no frame"),
            InputStep::Done => Step::Rearm,
            InputStep::Drop => Step::Drop,
        }
    }

    /// A [`Run`](super::core::Run) of the plain active messages at the front of `rx`
    /// (`conn`'s cache, as for [`recv_step`](Self::recv_step)), when the connection allows
    /// one: the checks of [`recv_step`](Self::recv_step)'s fast path, made once for the
    /// run. `None` leaves everything to `recv_step`.
    #[inline]
    pub(super) fn recv_run(&mut self, conn: ConnKey, rx: &RxBuf) -> Option<RunHead> {
        let max = self.cfg.max_frame;
        let ended = self.ended;
        let (peer, c) = self.cache_peer(conn, rx)?;
        c.deframer.runs(rx).then_some(RunHead { peer, max, ended })
    }

    /// A run handed out `frames` messages read on `conn` (counted in its stream), `bytes`
    /// with their headers.
    #[inline]
    pub(super) fn consumed(&mut self, now: Instant, conn: ConnKey, frames: u64, bytes: usize) {
        let Some(c) = slot(&mut self.conns, conn.0) else {
            return;
        };
        c.rx_frames += frames;
        if c.confirms && frames > 0 {
            // Their payloads together stand for the longest (a ping-pong's run is one
            // message; a stream's, whose count goes at once, many).
            let longest = bytes - (frames as usize - 1) * HEADER_LEN;
            let bytes = bytes.min(u32::MAX as usize) as u32;
            if let Some(t) = count_lazy(c, bytes, longest, now) {
                self.arm_timer(t);
            }
        }
    }

    /// Whether `run` still holds after a delivery: no connection ended meanwhile. A
    /// handler changes no connection otherwise (it cannot run a pass), so `conn` is still
    /// open and its peer's FIN still unseen.
    #[inline]
    pub(super) fn run_holds(&self, run: &RunHead) -> bool {
        self.ended == run.ended
    }

    /// The peer and the connection `conn` when its frames may be handed out from the
    /// cache `rx` without the walk: an open connection past every check of its first
    /// bytes, whose peer sent no FIN, and a buffer not due to grow.
    #[inline]
    fn cache_peer(&mut self, conn: ConnKey, rx: &RxBuf) -> Option<(PeerId, &mut Conn)> {
        let (cache, multishot) = (self.cfg.recv_cache, self.cfg.multishot);
        // A handshake-sized buffer that the walk would now trade for the full cache (see
        // `walk`; a frame larger than the buffer is not whole in it, and goes there too).
        let grow = rx.capacity() < cache && (multishot || rx.pending() >= rx.capacity());
        let c = slot(&mut self.conns, conn.0)?;
        if c.stage != Stage::Open
            || c.unconfirmed
            || c.awaiting_first_bytes
            || grow
            || c.link != 0
            || c.hold_rx
        {
            return None;
        }
        let peer = c.peer?;
        if slot(&mut self.endpoints, peer.0).is_none_or(|e| e.fin_rcvd || e.fo.rx_spread) {
            return None;
        }
        Some((peer, c))
    }

    /// The fast path of [`recv_step`](Self::recv_step): on a connection and buffer as for
    /// [`cache_peer`](Self::cache_peer), an active message wholly in the cache is
    /// delivered, and a cache used up asks for the next read, without the walk's other
    /// cases. `None` leaves everything else (and everything wrong) to the walk.
    #[inline]
    fn cached_send(&mut self, now: Instant, conn: ConnKey, rx: &mut RxBuf) -> Option<Step> {
        let max = self.cfg.max_frame;
        let (peer, c) = self.cache_peer(conn, rx)?;
        if let Some((tag, range)) = c.deframer.cached_send(rx, max) {
            c.rx_frames += 1;
            if c.confirms {
                // (A frame is at most `max_frame` bytes, below `u32::MAX`.)
                let wire = HEADER_LEN + range.len();
                if let Some(t) = count_lazy(c, wire as u32, wire, now) {
                    self.arm_timer(t);
                }
            }
            return Some(Step::Deliver { peer, tag, range });
        }
        rearm_drained(c, rx)
    }

    /// The end of a `run` over `rx` that still holds ([`run_holds`](Self::run_holds))
    /// when [`Run::next`](super::core::Run::next) found no frame: [`Step::Rearm`] for a
    /// read used up, as [`recv_step`](Self::recv_step) would answer; `None` for anything
    /// else, which `recv_step` decides.
    #[inline]
    pub(super) fn run_end(&mut self, conn: ConnKey, rx: &RxBuf) -> Option<Step> {
        rearm_drained(slot(&mut self.conns, conn.0)?, rx)
    }

    /// [`recv_done`](Self::recv_done) for a driver that can start the next read itself:
    /// the buffer comes back, ready, when that read is the
    /// [`Receive`](super::core::Action::Receive) the engine would queue (an open
    /// connection reading into its own cache); otherwise the engine takes it as
    /// `recv_done` does, and `None`.
    #[inline]
    pub fn rearm_now(&mut self, conn: ConnKey, rx: RxBuf) -> Option<RxBuf> {
        let c = slot(&mut self.conns, conn.0)?;
        let open = c.stage == Stage::Open && !c.hold_rx;
        if c.confirms && c.count_due() {
            // What this read consumed is confirmed with the next flush.
            if let Some(p) = c.peer {
                self.mark_dirty(p);
            }
        }
        if open && !self.cfg.multishot {
            return Some(for_next_read(rx));
        }
        self.recv_done(conn, rx);
        None
    }

    /// Gives back the buffer after [`Step::Rearm`]; the next read is queued.
    pub fn recv_done(&mut self, conn: ConnKey, rx: RxBuf) {
        let Some(c) = self.conn_mut(conn) else { return };
        if c.stage == Stage::Dead {
            return;
        }
        c.rx = Some(for_next_read(rx));
        let confirms = (c.confirms && c.count_due()).then_some(c.peer).flatten();
        if c.hold_rx {
            // Held: the buffer waits here, with what it holds, for the resume.
            c.rx_parked = true;
        } else {
            self.todo.push_back(Todo::Receive(conn));
        }
        if let Some(p) = confirms {
            self.mark_dirty(p);
        }
    }

    /// Lends the connection's receive buffer for walking a provided buffer with
    /// [`input_step`](Self::input_step); `None` when the connection is gone (drop the
    /// input). Give it back with [`input_done`](Self::input_done).
    pub fn input_begin(&mut self, conn: ConnKey) -> Option<RxBuf> {
        let c = self.conn_mut(conn)?;
        if c.stage == Stage::Dead {
            return None;
        }
        c.rx.take()
    }

    /// Walks bytes received into a buffer the connection does not own (a provided buffer
    /// of a multishot receive), using `rx` (from [`input_begin`](Self::input_begin)) only
    /// to reassemble records cut by the end of an input. `at` is the offset in `input`
    /// where the walk stands (start at 0). Call until [`InputStep::Done`] or
    /// [`InputStep::Drop`]; deliver each [`InputStep::Deliver`] payload (from `input` or
    /// `rx`) before the next call, then give `rx` back with [`input_done`](Self::input_done).
    ///
    /// A frame (or handshake record) wholly inside `input` is delivered as a range of
    /// `input`. A record cut by the end of `input` has its bytes copied into `rx`, and
    /// only the bytes it misses are copied from the next inputs; a payload larger than
    /// the cache continues in the reused large-payload buffer, which then stands in for
    /// `rx` until delivered.
    #[inline]
    pub fn input_step(
        &mut self,
        now: Instant,
        conn: ConnKey,
        rx: &mut RxBuf,
        input: &[u8],
        at: &mut usize,
    ) -> InputStep {
        self.walk(now, conn, rx, input, at)
    }

    /// Gives back the buffer after [`InputStep::Done`]. When a large payload still misses
    /// at least a cache's worth of bytes, the engine asks the driver to pause the
    /// multishot receive ([`Action::PauseProvided`](super::core::Action::PauseProvided)),
    /// so that the rest is read straight into the payload's buffer.
    pub fn input_done(&mut self, conn: ConnKey, rx: RxBuf) {
        let cache = self.cfg.recv_cache;
        let Some(c) = self.conn_mut(conn) else { return };
        if c.stage == Stage::Dead {
            return;
        }
        let direct = rx.wants_all() && rx.missing() >= cache;
        c.rx = Some(rx);
        if direct && !c.pausing {
            c.pausing = true;
            self.todo.push_back(Todo::PauseProvided(conn));
        }
    }

    /// The multishot receive of `conn` stopped as asked: the rest of a large payload is
    /// read straight into its buffer, or, if provided buffers completed it meanwhile, the
    /// multishot receive resumes.
    pub fn handle_provided_paused(&mut self, conn: ConnKey) {
        let Some(c) = self.conn_mut(conn) else { return };
        c.pausing = false;
        if c.stage == Stage::Dead {
            return;
        }
        let Some(rx) = c.rx.as_ref() else { return };
        if rx.wants_all() {
            self.counters.recv_direct += 1;
        }
        self.todo.push_back(Todo::Receive(conn));
    }

    /// Holds the reading of `conn` (own-cache mode only; nothing happens with
    /// [`CoreConfig::multishot`](crate::CoreConfig::multishot)): from the next frame
    /// boundary on, no frame of it is walked, its receive buffer stays with the engine
    /// with the bytes it holds, and no read is armed on it, so that what follows waits in
    /// the socket (and flow control holds its sender). A read in flight completes into
    /// the buffer and is kept. [`resume_reading`](Self::resume_reading) walks the kept
    /// bytes, then reads again.
    pub(super) fn hold_reading(&mut self, conn: ConnKey) {
        if self.cfg.multishot {
            return;
        }
        let Some(c) = self.conn_mut(conn) else { return };
        if c.stage == Stage::Dead || c.hold_rx {
            return;
        }
        c.hold_rx = true;
        // A run of plain messages in progress stops, as at the end of a connection.
        self.ended += 1;
    }

    /// Ends a hold of `conn` ([`hold_reading`](Self::hold_reading)): a kept buffer goes
    /// to the driver to be walked ([`Action::Walk`](super::core::Action::Walk)), and the
    /// reads follow; a read in flight goes on as if nothing happened.
    pub(super) fn resume_reading(&mut self, conn: ConnKey) {
        let Some(c) = self.conn_mut(conn) else { return };
        if !c.hold_rx {
            return;
        }
        c.hold_rx = false;
        if mem::take(&mut c.rx_parked) && c.stage != Stage::Dead {
            self.todo.push_back(Todo::Walk(conn));
        }
    }

    /// Holds (`hold`) or resumes the reading of `peer`'s primary connection
    /// ([`hold_reading`](Self::hold_reading)); false when nothing is held: `peer` has no
    /// open connection, or the receive is multishot.
    #[cfg(feature = "testing")]
    pub(crate) fn hold_primary(&mut self, peer: PeerId, hold: bool) -> bool {
        let Some(EpState::Connected { conn }) = self.ep(peer).map(|e| &e.state) else {
            return false;
        };
        let conn = *conn;
        if hold {
            self.hold_reading(conn);
        } else {
            self.resume_reading(conn);
        }
        hold && !self.cfg.multishot
    }

    /// Whether the reading of `conn` is held.
    #[cfg(test)]
    pub(super) fn reading_held(&self, conn: ConnKey) -> bool {
        self.conns
            .get(conn.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.hold_rx)
    }

    /// A receive failed (`Some`: the OS error) or hit end of stream (`None`).
    pub fn handle_recv_end(&mut self, now: Instant, conn: ConnKey, err: Option<Errno>) {
        let Some(c) = self.conn_mut(conn) else { return };
        let (stage, peer) = (c.stage, c.peer);
        match (stage, peer) {
            (Stage::Dead, _) => {}
            (_, Some(_)) if c.link > 0 => self.link_lost(now, conn),
            (Stage::Open, Some(peer)) if c.unconfirmed => {
                let cause = err.map_or(Cause::ClosedInHandshake, Cause::Os);
                self.unconfirmed_lost(now, peer, conn, cause);
            }
            (Stage::Open, Some(peer)) => {
                let ep = self.ep(peer).expect("open conn has an endpoint");
                if ep.fin_rcvd {
                    // EOF after the peer's FIN: the clean end, once our own frames (and
                    // FIN) are written; otherwise the last send's completion closes. A
                    // peer that leaves without the ACKs it owes us lost the frames. A
                    // peer closes once it read our FIN: what it did not confirm it read
                    // (as a frame written without links completes at the write).
                    if ep.fo.on {
                        self.all_confirmed(peer);
                    }
                    let ep = self.ep(peer).expect("open conn has an endpoint");
                    if ep.drained() {
                        self.close_clean(peer, conn);
                    } else if !ep.lent.is_empty() {
                        let cause = Cause::ClosedWithoutFin;
                        self.fail_endpoint(peer, FailReason::ConnectionLost { peer, cause });
                    }
                } else if !self.fail_over(now, peer, conn) {
                    let cause = err.map_or(Cause::ClosedWithoutFin, Cause::Os);
                    self.fail_endpoint(peer, FailReason::ConnectionLost { peer, cause });
                }
            }
            (Stage::ExpectChallenge | Stage::ExpectAccept, Some(peer)) => {
                // The acceptor dropped our dial before answering.
                self.kill_conn(conn);
                if self.ep_dialing_on(peer, conn) {
                    let cause = err.map_or(Cause::ClosedInHandshake, Cause::Os);
                    self.retry_or_fail(Some(now), peer, cause);
                }
            }
            _ => self.kill_conn(conn),
        }
    }

    /// The one walk over received bytes: what `rx` holds, then `input[*at..]` (empty in
    /// the own-cache mode). Handshake records go to the state machine, frames to the
    /// caller.
    #[inline]
    fn walk(
        &mut self,
        now: Instant,
        conn: ConnKey,
        rx: &mut RxBuf,
        input: &[u8],
        at: &mut usize,
    ) -> InputStep {
        let (max, cache, stall, multishot, ask_unknown) = (
            self.cfg.max_frame,
            self.cfg.recv_cache,
            self.cfg.frame_stall,
            self.cfg.multishot,
            self.ask_unknown,
        );
        if self.conn_mut(conn).is_some_and(|c| c.awaiting_first_bytes) {
            self.first_bytes(conn);
        }
        loop {
            let Some(c) = self.conn_mut(conn) else {
                return InputStep::Drop;
            };
            match c.stage {
                Stage::Dead | Stage::Connecting => return InputStep::Drop,
                Stage::Resolving => {
                    // The dialer waits for our answer: it has nothing to send meanwhile.
                    if *at < input.len() || (!rx.wants_all() && rx.pending() > 0) {
                        self.handshake_garbage(
                            conn,
                            ProtoError::UnexpectedHello { state: "Resolving" },
                        );
                        return InputStep::Drop;
                    }
                    return InputStep::Done;
                }
                Stage::ExpectHello
                | Stage::ExpectAuth
                | Stage::ExpectChallenge
                | Stage::ExpectAccept => {
                    let stage = c.stage;
                    // Reading into its own buffer, past the HELLO: the next record and
                    // the first frames right behind it (a dialer's behind its AUTH, an
                    // acceptor's behind its ACCEPT) come in one read, so that they are
                    // handled, and answered, in one pass. Not while a resolver may have
                    // to decide about the dialer (nothing behind an AUTH is read then).
                    let next_and_frames = match stage {
                        Stage::ExpectAuth => !ask_unknown,
                        Stage::ExpectAccept => true,
                        _ => false,
                    };
                    if next_and_frames
                        && !multishot
                        && !rx.wants_all()
                        && rx.capacity() < HANDSHAKE_READ
                    {
                        rx.grow(HANDSHAKE_READ);
                    }
                    let parsed = c.deframer.hello(rx, input, at);
                    match self.handshake_record(now, conn, stage, parsed) {
                        Some(true) => {}
                        Some(false) => return InputStep::Done,
                        None => return InputStep::Drop,
                    }
                }
                Stage::Open => {
                    let peer = c.peer.expect("open conn knows its peer");
                    if c.hold_rx && c.deframer.between_frames(rx) {
                        // Held: the next frame waits, unread, in the buffer (and what
                        // follows in the socket); nothing is stalled meanwhile.
                        c.deadline = None;
                        return InputStep::Done;
                    }
                    let link = usize::from(c.link);
                    // Runs (see `spread.rs`): what this link's next frame is.
                    let take = slot(&mut self.endpoints, peer.0)
                        .map_or(Take::Frame, |e| e.fo.rx_order.next(link));
                    if take == Take::Hold {
                        // A run further in the stream: it waits until the position
                        // reaches it (watched: `Core::owed_timer`). Its first frame is
                        // read ahead, whole, first: a frame larger than the socket holds
                        // would otherwise stop its sender until the reader comes to it,
                        // and the links would take turns (docs/design/links.md).
                        self.owed_timer(now, peer);
                        if *at >= input.len() && !multishot {
                            adopt_cache(rx, cache, max, false);
                            let c = slot(&mut self.conns, conn.0).expect("conn exists");
                            match c.deframer.read_ahead(rx, max) {
                                Ok(true) if rx.wants_all() && !c.hold_rx => {
                                    self.counters.read_ahead += 1;
                                }
                                Ok(true) => {}
                                Ok(false) => {
                                    // Its next bytes must come within `frame_stall`.
                                    let d = now + stall;
                                    c.deadline = Some(d);
                                    self.arm_timer(d);
                                    return InputStep::Done;
                                }
                                Err(e) => {
                                    self.fail_protocol(peer, e.into());
                                    return InputStep::Drop;
                                }
                            }
                        }
                        self.hold_reading(conn);
                        if let Some(c) = self.conn_mut(conn) {
                            c.deadline = None;
                        }
                        return InputStep::Done;
                    }
                    let c = slot(&mut self.conns, conn.0).expect("conn exists");
                    // (After a large payload read into its own buffer, the deframer moves to
                    // the next frame first; the check below the frame covers it.)
                    if link > 0 && take == Take::Frame && !rx.wants_all() {
                        // Between runs a link carries a RUN, a CONFIRM or a RESUME only:
                        // other bytes on it end it.
                        let unread = standby_unread(rx, input, *at);
                        if unread < HEADER_LEN {
                            // The next header is not whole yet: as for any frame in
                            // progress, its bytes must come within `frame_stall`.
                            c.deadline = (unread > 0).then(|| now + stall);
                            if let Some(d) = c.deadline {
                                self.arm_timer(d);
                            }
                            return InputStep::Done;
                        }
                        let kind = next_kind(rx, &input[*at..]);
                        if kind.is_none_or(|k| k.counted()) {
                            if *at < input.len() || (!rx.wants_all() && rx.pending() > 0) {
                                self.events.push_back(CoreEvent::Refused {
                                    why: ProtoError::FrameOnLink,
                                });
                                self.link_lost(now, conn);
                                return InputStep::Drop;
                            }
                            return InputStep::Done;
                        }
                    }
                    adopt_cache(rx, cache, max, multishot);
                    let unread = *at < input.len() || (!rx.wants_all() && rx.pending() > 0);
                    if unread && c.unconfirmed {
                        self.confirm(peer, conn);
                    }
                    // After its FIN a peer sends nothing but ACKs and CONFIRMs (and the
                    // RUNs of its ACKs).
                    if unread
                        && self.ep(peer).is_some_and(|e| e.fin_rcvd)
                        && next_kind(rx, &input[*at..]).is_some_and(|k| {
                            !matches!(k, FrameKind::Ack | FrameKind::Confirm | FrameKind::Run)
                        })
                        && self.data_after_fin(peer)
                    {
                        return InputStep::Drop;
                    }
                    let c = slot(&mut self.conns, conn.0).expect("conn exists");
                    let Some(ep) = slot(&mut self.endpoints, peer.0) else {
                        return InputStep::Drop;
                    };
                    // A PART the walk will drop (`run_frame`) is placed aside.
                    ep.parts.set_dropping(ep.fo.rx_order.drops(take));
                    match c
                        .deframer
                        .frame(rx, input, at, max, &self.regions, &mut ep.parts)
                    {
                        Ok(Some((h, src))) => {
                            if take != Take::Frame && !h.kind.counted() {
                                // A CONFIRM, RESUME or RUN inside a run.
                                self.fail_protocol(peer, ProtoError::RunOutOfOrder);
                                return InputStep::Drop;
                            }
                            if link > 0 && take == Take::Frame && h.kind.counted() {
                                self.events.push_back(CoreEvent::Refused {
                                    why: ProtoError::FrameOnLink,
                                });
                                self.link_lost(now, conn);
                                return InputStep::Drop;
                            }
                            match self.run_frame(peer, conn, link, take, h.kind) {
                                RunFrameIs::Consumed => {}
                                RunFrameIs::Dropped => continue,
                            }
                            let c = slot(&mut self.conns, conn.0).expect("conn exists");
                            let mut lazy = None;
                            if h.kind.counted() {
                                c.rx_frames += 1;
                                if c.confirms {
                                    // A FIN's count is owed at once (the peer closes).
                                    let wire = match h.kind {
                                        FrameKind::Fin => usize::MAX,
                                        _ => HEADER_LEN + h.len as usize,
                                    };
                                    let bytes = wire.min(u32::MAX as usize) as u32;
                                    lazy = count_lazy(c, bytes, wire, now);
                                }
                            }
                            let placed_at = c.deframer.placed_at();
                            if let Some(t) = lazy {
                                self.arm_timer(t);
                            }
                            if h.ack {
                                // Read whole: the peer may have its pages back.
                                self.owe_ack(peer);
                            }
                            match h.kind {
                                FrameKind::Send => {
                                    return InputStep::Deliver {
                                        peer,
                                        tag: h.tag,
                                        src,
                                    }
                                }
                                // The data is in place; the receiver learns it from what
                                // the peer sends next.
                                FrameKind::Put => self.counters.puts_placed += 1,
                                FrameKind::Part => {
                                    let piece = h.len as usize - PUT_TARGET_LEN;
                                    if self.ep_mut(peer).is_some_and(|e| e.parts.took(piece)) {
                                        // The last piece: the message, whole, in the
                                        // buffer that placed it.
                                        self.counters.parts_assembled += 1;
                                        return InputStep::Deliver {
                                            peer,
                                            tag: h.tag,
                                            src,
                                        };
                                    }
                                }
                                FrameKind::Get => {
                                    let req = GetRequest::parse(bytes_at(rx, input, &src));
                                    if !self.on_get(peer, req) {
                                        return InputStep::Drop;
                                    }
                                }
                                FrameKind::Reply => {
                                    if !self.on_reply(peer, placed_at, src_len(&src)) {
                                        return InputStep::Drop;
                                    }
                                }
                                FrameKind::Fin => self.on_fin(peer, conn),
                                FrameKind::Ack => {
                                    if !self.on_ack(now, peer, conn) {
                                        return InputStep::Drop;
                                    }
                                }
                                FrameKind::Confirm => {
                                    let n = count_at(rx, input, &src);
                                    if let Err(e) = self.on_confirm(peer, n) {
                                        self.fail_protocol(peer, e);
                                        return InputStep::Drop;
                                    }
                                    if self
                                        .ep(peer)
                                        .is_some_and(|e| e.fin_sent && e.fin_rcvd && e.drained())
                                    {
                                        self.close_clean(peer, conn);
                                    }
                                }
                                FrameKind::Resume => {
                                    // (The epoch and the asks mark matter only to a
                                    // spread stream: see `spread.rs`.)
                                    let r = match ResumeFrame::parse(bytes_at(rx, input, &src)) {
                                        Ok(r) => r,
                                        Err(e) => {
                                            self.fail_protocol(peer, ProtoError::Wire(e));
                                            return InputStep::Drop;
                                        }
                                    };
                                    if !self.on_resume(now, peer, conn, r) {
                                        return InputStep::Drop;
                                    }
                                }
                                FrameKind::Run => {
                                    let r = RunFrame::parse(bytes_at(rx, input, &src))
                                        .map_err(ProtoError::Wire)
                                        .and_then(|r| self.on_run(peer, link, r));
                                    if let Err(e) = r {
                                        self.fail_protocol(peer, e);
                                        return InputStep::Drop;
                                    }
                                }
                            }
                        }
                        Ok(None) if c.unconfirmed => return InputStep::Done,
                        Ok(None) => {
                            // A frame in progress must see its next bytes within
                            // `frame_stall` (checked by `handle_timeout`).
                            let partial = rx.wants_all() || rx.pending() > 0;
                            c.deadline = partial.then(|| now + stall);
                            if let Some(d) = c.deadline {
                                self.arm_timer(d);
                            }
                            return InputStep::Done;
                        }
                        Err(e) => {
                            self.fail_protocol(peer, e.into());
                            return InputStep::Drop;
                        }
                    }
                }
            }
        }
    }

    /// A whole frame of `kind` read on `conn` (link `link` of `peer`), whose link was
    /// at `take`: whether it is consumed (handled as usual) or dropped (a frame of an
    /// older epoch, see `spread.rs`). A consumed frame moves the stream's position: a
    /// link held for the run that starts there is read again.
    fn run_frame(
        &mut self,
        peer: PeerId,
        conn: ConnKey,
        link: usize,
        take: Take,
        kind: FrameKind,
    ) -> RunFrameIs {
        if !kind.counted() {
            return RunFrameIs::Consumed;
        }
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return RunFrameIs::Consumed;
        };
        let order = &mut ep.fo.rx_order;
        let moved = match take {
            Take::Frame if order.drops(take) => {
                // Outside a run after a failover: a frame of epoch 0, sent again.
                return RunFrameIs::Dropped;
            }
            Take::Frame => {
                if !ep.fo.rx_spread {
                    return RunFrameIs::Consumed;
                }
                order.took_bare();
                true
            }
            Take::Drop(_) => {
                order.took(link, 1);
                return RunFrameIs::Dropped;
            }
            Take::Stream(_) | Take::Hold => order.took(link, 1),
        };
        let next = if moved { order.ready() } else { None };
        let held = match next {
            Some(l) if l != link => match l {
                0 => match ep.state {
                    EpState::Connected { conn } => Some(conn),
                    _ => None,
                },
                l => ep.links.get(l - 1).and_then(|x| x.conn),
            },
            _ => None,
        };
        if link > 0 {
            // Frames read on a link: the count is owed at once (a stream spread over
            // links is a large one, whose sender waits for it).
            self.counters.run_frames_in += 1;
            if let Some(p) = self.primary_conn(peer).and_then(|k| self.conn_mut(k)) {
                p.rx_lazy = u32::MAX;
            }
            self.mark_dirty(peer);
        }
        if let Some(k) = held.filter(|&k| k != conn) {
            self.resume_reading(k);
        }
        RunFrameIs::Consumed
    }

    /// A RUN `r` was read on link `link` of `peer`.
    fn on_run(&mut self, peer: PeerId, link: usize, r: RunFrame) -> Result<(), ProtoError> {
        let count = self.rx_count(peer);
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return Ok(());
        };
        // (A RUN may come before this side saw the link it was sent beside open: the
        // acceptor of a link spreads once it answered the join.)
        if !ep.fo.rx_spread {
            // The first run of epoch 0: the frames consumed outside runs (some on the
            // fast paths, which stop now) set the position.
            ep.fo.rx_spread = true;
            ep.fo.rx_order.sync(count - ep.fo.rx_epoch_base);
            self.ended += 1;
        }
        ep.fo.rx_order.on_run(link, r)
    }

    /// Handles what a connection still in its handshake parsed: `Some(true)` a record was
    /// handled (look again), `Some(false)` more bytes are needed, `None` the connection
    /// is gone (garbage: closed and counted).
    fn handshake_record(
        &mut self,
        now: Instant,
        conn: ConnKey,
        stage: Stage,
        parsed: Result<Option<Hello>, WireError>,
    ) -> Option<bool> {
        match parsed {
            Ok(None) => Some(false),
            Ok(Some(h)) => {
                match stage {
                    Stage::ExpectHello => self.on_hello(conn, h),
                    Stage::ExpectAuth => self.on_auth(conn, h),
                    Stage::ExpectChallenge => self.on_challenge(now, conn, h),
                    _ => self.on_accept_record(now, conn, h),
                }
                Some(true)
            }
            Err(e) if self.is_link(conn) => {
                // A link's dial met nonsense: the link alone ends (its next attempt
                // follows).
                self.events.push_back(CoreEvent::Refused { why: e.into() });
                self.link_lost(now, conn);
                None
            }
            Err(WireError::BadVersion { got, ours }) => {
                // Another version of ringbtl: a clear error on both sides.
                self.version_mismatch(conn, stage, ProtoError::UnsupportedVersion { got, ours });
                None
            }
            Err(e) => {
                self.handshake_garbage(conn, e.into());
                None
            }
        }
    }
}

impl Core {
    /// A frame with `FLAG_ACK` was read whole: an ACK goes back with the next batch.
    fn owe_ack(&mut self, peer: PeerId) {
        if let Some(ep) = self.ep_mut(peer) {
            ep.acks_owed += 1;
        }
        self.mark_dirty(peer);
    }

    /// The peer's ACK: the oldest lent frame completes. False (the endpoint failed) when
    /// no frame waited for it.
    fn on_ack(&mut self, now: Instant, peer: PeerId, conn: ConnKey) -> bool {
        if !self.handle_ack(peer) {
            self.fail_protocol(peer, ProtoError::UnexpectedAck);
            return false;
        }
        self.await_acks(now, peer, true);
        if self
            .ep(peer)
            .is_some_and(|e| e.fin_sent && e.fin_rcvd && e.drained())
        {
            self.close_clean(peer, conn);
        }
        true
    }
}

/// The kind of the next frame of `rx`'s cache and then `input`, whatever its length;
/// `None` while less than a header is there, or for a header the deframer will refuse.
/// What [`Core::run_frame`] made of a frame.
enum RunFrameIs {
    Consumed,
    Dropped,
}

fn next_kind(rx: &RxBuf, input: &[u8]) -> Option<FrameKind> {
    let mut h = [0u8; HEADER_LEN];
    let cached = if rx.wants_all() { &[][..] } else { rx.unread() };
    let n = cached.len().min(HEADER_LEN);
    h[..n].copy_from_slice(&cached[..n]);
    let m = (HEADER_LEN - n).min(input.len());
    h[n..n + m].copy_from_slice(&input[..m]);
    if n + m < HEADER_LEN {
        return None;
    }
    Header::parse(&h, u32::MAX).ok().map(|h| h.kind)
}

/// `wire` more bytes of the peer's frames were consumed on `c`, a primary that confirms,
/// the longest frame `longest` bytes: returns the moment by which the count they make owed
/// leaves, when a timer must be armed for it (the first frame of a count not due at once;
/// see `Conn::rx_lazy`).
#[inline]
fn count_lazy(c: &mut Conn, wire: u32, longest: usize, now: Instant) -> Option<Instant> {
    if longest > HEADER_LEN + KEEP_COPY_MAX {
        // Kept by reference: its sender waits for the count.
        c.rx_lazy = u32::MAX;
    }
    c.rx_lazy = c.rx_lazy.saturating_add(wire);
    if c.confirm_at.is_some() || c.count_due() {
        return None;
    }
    let t = now + CONFIRM_LAZY;
    c.confirm_at = Some(t);
    Some(t)
}

/// Bytes not walked yet on a connection: in its cache, then in `input` from `at`.
fn standby_unread(rx: &RxBuf, input: &[u8], at: usize) -> usize {
    let waiting = if rx.wants_all() { 0 } else { rx.pending() };
    waiting + input.len().saturating_sub(at)
}

/// The count a CONFIRM carries (its payload at `src`; the deframer checked its length).
fn count_at(rx: &RxBuf, input: &[u8], src: &Source) -> u64 {
    bytes_at(rx, input, src)
        .try_into()
        .map_or(0, u64::from_be_bytes)
}

/// The payload of a frame the deframer handed out.
fn bytes_at<'a>(rx: &'a RxBuf, input: &'a [u8], src: &Source) -> &'a [u8] {
    match src {
        Source::Cache(r) => rx.bytes(r.clone()),
        Source::Input(r) => &input[r.clone()],
    }
}

/// The length of a frame's payload the deframer handed out.
fn src_len(src: &Source) -> usize {
    match src {
        Source::Cache(r) | Source::Input(r) => r.len(),
    }
}

/// An adopted connection trades its handshake-sized buffer `rx` for the full cache of
/// `cache` bytes: at once with provided buffers (`multishot`); reading into its own
/// cache, once a read fills the small buffer or a frame needs more room (zeroing a full
/// cache for each of the 63 connections of a 64-rank wire-up, whose frames are small,
/// was a quarter of its CPU).
#[inline]
fn adopt_cache(rx: &mut RxBuf, cache: usize, max: u32, multishot: bool) {
    if !rx.wants_all() && rx.capacity() < cache && (multishot || needs_room(rx, max)) {
        rx.grow(cache);
    }
}

/// Whether an adopted connection's handshake-sized buffer is too small for what comes:
/// a read filled it, or the frame it holds the header of is longer than the buffer.
fn needs_room(rx: &RxBuf, max: u32) -> bool {
    let pending = rx.pending();
    if pending >= rx.capacity() {
        return true;
    }
    if pending < HEADER_LEN {
        return false;
    }
    // A header the deframer refuses is its to report.
    Header::parse(rx.unread(), max).is_ok_and(|h| HEADER_LEN + h.len as usize > rx.capacity())
}

/// The buffer of a connection in its handshake once past the HELLO (see `walk`): a
/// record and the first frames behind it. An acceptor's stranger holds this much at most.
pub(super) const HANDSHAKE_READ: usize = 1024;

/// [`Step::Rearm`] when every frame of the read in `rx` was handed out (the next read; no
/// frame in progress, so no stall deadline), on a connection that may take frames from
/// its cache ([`Core::cache_peer`]).
#[inline]
fn rearm_drained(c: &mut Conn, rx: &RxBuf) -> Option<Step> {
    if c.deframer.drained(rx) {
        c.deadline = None;
        return Some(Step::Rearm);
    }
    None
}

/// A walked cache made ready for the next read: its unread bytes moved to the front (a
/// whole buffer keeps filling where it stands).
#[inline]
fn for_next_read(mut rx: RxBuf) -> RxBuf {
    if !rx.wants_all() {
        rx.compact();
    }
    rx
}
