//! The protocol engine: every endpoint (one per peer) and every connection (one per
//! socket), with the BTL's state machine. No I/O, no clock: time comes in as `now`.
//!
//! # Call contract
//!
//! The driver (the [`Transport`](crate::Transport), or the in-memory pair in the tests)
//! feeds the engine with `handle_*` calls and [`Core::send`], then drains
//! [`Core::poll_action`] (operations to perform on sockets) and [`Core::poll_event`]
//! (completions and notices for the application), and calls [`Core::flush`] once per
//! progress pass so that every frame queued during the pass leaves in one gathered send
//! per connection. Received bytes are walked with [`Core::recv_step`] until it says
//! [`Step::Rearm`], then handed back with [`Core::recv_done`]. When bytes arrive in
//! buffers the connection does not own (multishot receive on provided buffers), they are
//! walked in place with [`Core::input_step`] instead, the connection's buffer serving only
//! to reassemble frames cut between two inputs, and handed back with [`Core::input_done`].
//!
//! # Endpoint states (as in Open MPI's TCP BTL)
//!
//! ```text
//!            send()                connect ok, HELLO sent        ACCEPT received
//!  Closed ───────────▶ Connecting ──────────────────▶ ConnectAck ───────────────▶ Connected
//!    │ ▲                   │  connect error: retry         │ REJECT(Simultaneous):    │
//!    │ │ FIN exchanged     │  after `connect_retries`      │ wait for the peer's dial  │
//!    │ └───────────────────┼──────────────────────────────┼──────────────────────────┘
//!    │                     ▼                               ▼
//!    │ peer's HELLO      Failed ◀── reset, EOF without FIN, protocol error, timeout
//!    └───────────────────▶ Connected (we send ACCEPT)
//! ```
//!
//! Simultaneous connect: when both processes dial each other, the connection dialed by
//! the process with the *lower* id survives. The higher-id side adopts the incoming
//! connection and closes its own dial (no frame was ever sent on it: frames flow only once
//! an endpoint is Connected). The lower-id side answers the losing dial with an explicit
//! `REJECT(Simultaneous)`, so the loser knows to wait for the winner instead of adopting
//! a socket that is about to die. No queued frame is lost or sent twice: frames stay in
//! the endpoint's queue until exactly one connection is adopted.
//!
//! Failure: every queued and in-flight send completes exactly once with an error, and a
//! [`CoreEvent::PeerFailed`] is raised once. A send whose batch the driver holds (the
//! kernel may still read its payload) completes when the batch comes back, so that its
//! completion always means "the caller's memory is free again". A failed endpoint stays failed; later sends
//! return [`SendError::Unreachable`] at once.

use std::collections::VecDeque;
use std::mem;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Instant;

use bytes::Bytes;

use crate::error::{FailReason, ProtoError, SendError};
pub use crate::proto::config::CoreConfig;
use crate::proto::recv_cache::{Next, RxBuf};
use crate::proto::tx::TxBatch;
use crate::wire::{
    FrameKind, Header, Hello, HelloKind, PeerId, RejectReason, Tag, HEADER_LEN, HELLO_LEN, VERSION,
};

/// Most payload segments (iovecs) one message may have.
pub const MAX_SEGMENTS: usize = 8;

/// A connection handle chosen by the driver (the reactor's slot index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey(pub u32);

/// Public view of an endpoint's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointState {
    /// No connection; the next send dials.
    Closed,
    /// A connect is in progress (or scheduled for retry).
    Connecting,
    /// Our HELLO is sent; awaiting ACCEPT, or the peer's own dial after a
    /// simultaneous-connect reject.
    ConnectAck,
    /// Frames flow.
    Connected,
    /// Unreachable for good.
    Failed,
}

/// A socket operation the driver must perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Open a connection to `addr` for `peer`, then report [`Core::dial_started`] (or
    /// [`Core::handle_connected`] with the error if it failed at once).
    Dial {
        /// Who.
        peer: PeerId,
        /// Where.
        addr: SocketAddr,
        /// Local address to bind the socket to before connecting (`None`: the kernel
        /// chooses the source).
        bind: Option<SocketAddr>,
    },
    /// Submit [`Core::take_tx`] on this connection.
    Transmit(ConnKey),
    /// Arm a read with [`Core::take_rx`].
    Receive(ConnKey),
    /// Close the socket (pending operations are cancelled).
    Close(ConnKey),
}

/// Something the application hears about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreEvent {
    /// A send finished.
    Completed {
        /// Destination.
        peer: PeerId,
        /// The caller's cookie.
        cookie: u64,
        /// Outcome.
        result: Result<(), FailReason>,
    },
    /// An endpoint became Connected.
    Connected(PeerId),
    /// An endpoint failed (raised once).
    PeerFailed(PeerId, FailReason),
    /// The peer closed cleanly (FIN received).
    PeerClosed(PeerId),
    /// An incoming connection was refused or dropped before it was adopted.
    Refused {
        /// Why.
        why: ProtoError,
    },
}

/// Counters of things that went wrong without harming anyone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counters {
    /// Incoming connections that did not start with our magic.
    pub bad_magic: u64,
    /// Incoming connections refused (token, unknown process id, version, duplicate).
    pub refused: u64,
    /// Simultaneous connects resolved.
    pub simultaneous: u64,
    /// Connect attempts that failed and were retried.
    pub connect_retries: u64,
    /// Probes answered.
    pub probes: u64,
    /// Incoming connections closed at once because too many handshakes were pending.
    pub accept_overload: u64,
    /// Gathered sends handed to the driver (one per batch).
    pub batches: u64,
    /// Frames (messages and FINs) carried by those batches.
    pub frames: u64,
}

/// What [`Core::recv_step`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// An active message: the payload is `rx.bytes(range)`.
    Deliver {
        /// Source.
        peer: PeerId,
        /// Tag.
        tag: Tag,
        /// Payload range in the buffer.
        range: Range<usize>,
    },
    /// Nothing more in this buffer: give it back with [`Core::recv_done`].
    Rearm,
    /// The connection is gone: drop the buffer.
    Drop,
}

/// Where the payload of an [`InputStep::Deliver`] lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// In the input slice given to [`Core::input_step`]: `&input[range]` (zero copy).
    Input(Range<usize>),
    /// In the connection's reassembly buffer: `rx.bytes(range)`. Only frames cut by the
    /// end of an input are delivered from here.
    Cache(Range<usize>),
}

/// What [`Core::input_step`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputStep {
    /// An active message whose payload lies at `src`.
    Deliver {
        /// Source.
        peer: PeerId,
        /// Tag.
        tag: Tag,
        /// Where the payload is.
        src: Source,
    },
    /// The input is used up (its tail, if any, is kept for reassembly): give the buffer
    /// back with [`Core::input_done`].
    Done,
    /// The connection is gone: drop the buffer.
    Drop,
}

/// One queued message.
#[derive(Debug)]
struct Frag {
    hdr: Header,
    segs: [Bytes; MAX_SEGMENTS],
    nsegs: u8,
    /// `None` for control frames (FIN).
    cookie: Option<u64>,
}

impl Frag {
    fn fin() -> Self {
        Self {
            hdr: Header {
                kind: FrameKind::Fin,
                tag: Tag(0),
                len: 0,
            },
            segs: Default::default(),
            nsegs: 0,
            cookie: None,
        }
    }

    fn wire_len(&self) -> usize {
        Header::LEN + self.hdr.len as usize
    }
}

#[derive(Debug)]
enum EpState {
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
struct Endpoint {
    addrs: Vec<SocketAddr>,
    /// Local bind address per entry of `addrs` (empty: never bind).
    binds: Vec<Option<SocketAddr>>,
    state: EpState,
    queue: VecDeque<Frag>,
    /// Cookies of the frames in the connection's in-flight batch, in order.
    inflight: VecDeque<Option<u64>>,
    /// Sends whose batch was in flight when the endpoint failed: they complete when the
    /// driver hands the batch back (see [`Conn::orphans`]).
    orphaned: usize,
    attempts: u32,
    dirty: bool,
    fin_sent: bool,
    fin_rcvd: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Acceptor: waiting for the dialer's HELLO.
    ExpectHello,
    /// Dialer: connect in progress.
    Connecting,
    /// Dialer: HELLO sent, waiting for ACCEPT/REJECT.
    ExpectAccept,
    /// Adopted by an endpoint; frames flow.
    Open,
    /// Being closed: ignore everything until the driver reports it closed.
    Dead,
}

#[derive(Debug)]
struct Conn {
    stage: Stage,
    /// The peer, once known (dialer: from the start; acceptor: after HELLO).
    peer: Option<PeerId>,
    /// Send batch; `None` while rented to the driver (in flight).
    tx: Option<TxBatch>,
    /// The cookies of the rented batch when its endpoint failed, and why: they complete
    /// only when the batch comes back, since until then the kernel may still read the
    /// caller's payload memory (which a C caller frees at the completion).
    orphans: Option<(PeerId, FailReason, VecDeque<Option<u64>>)>,
    /// The batch holds bytes not yet submitted.
    tx_ready: bool,
    /// Close once the current batch is written (a REJECT, or our FIN).
    close_after_tx: bool,
    /// Receive buffer; `None` while rented.
    rx: Option<RxBuf>,
    /// The cache, parked while a large payload is read into its own buffer.
    parked: Option<RxBuf>,
    /// Reused large-payload buffer.
    spare_large: Option<RxBuf>,
    large_delivered: bool,
    deadline: Option<Instant>,
}

/// The protocol engine. See the module documentation for the call contract.
#[derive(Debug)]
pub struct Core {
    cfg: CoreConfig,
    endpoints: Vec<Option<Endpoint>>,
    conns: Vec<Option<Conn>>,
    actions: VecDeque<Action>,
    events: VecDeque<CoreEvent>,
    dirty: Vec<PeerId>,
    /// Earliest time any timer may fire (a lower bound: conservative is fine).
    next_timer: Option<Instant>,
    shutting_down: bool,
    counters: Counters,
}

/// Largest process id accepted (endpoints are indexed by id).
pub const MAX_PEERS: u32 = 1 << 22;

impl Core {
    /// A new engine.
    pub fn new(cfg: CoreConfig) -> Self {
        Self {
            cfg,
            endpoints: Vec::new(),
            conns: Vec::new(),
            actions: VecDeque::with_capacity(64),
            events: VecDeque::with_capacity(256),
            dirty: Vec::with_capacity(64),
            next_timer: None,
            shutting_down: false,
            counters: Counters::default(),
        }
    }

    /// Our process id.
    pub fn pid(&self) -> PeerId {
        self.cfg.pid
    }

    /// Counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Adds (or updates the addresses of) a peer.
    pub fn add_peer(&mut self, peer: PeerId, addrs: Vec<SocketAddr>) -> Result<(), SendError> {
        self.add_peer_bound(peer, addrs, Vec::new())
    }

    /// Adds (or updates) a peer whose `addrs[i]` is dialed from local address `binds[i]`
    /// (a missing or `None` entry lets the kernel choose the source).
    pub fn add_peer_bound(
        &mut self,
        peer: PeerId,
        addrs: Vec<SocketAddr>,
        binds: Vec<Option<SocketAddr>>,
    ) -> Result<(), SendError> {
        if peer.0 >= MAX_PEERS || peer == self.cfg.pid {
            return Err(SendError::UnknownPeer(peer));
        }
        let i = peer.0 as usize;
        if self.endpoints.len() <= i {
            self.endpoints.resize_with(i + 1, || None);
        }
        match &mut self.endpoints[i] {
            Some(ep) => {
                ep.addrs = addrs;
                ep.binds = binds;
            }
            slot @ None => {
                *slot = Some(Endpoint {
                    addrs,
                    binds,
                    state: EpState::Closed,
                    queue: VecDeque::new(),
                    inflight: VecDeque::new(),
                    orphaned: 0,
                    attempts: 0,
                    dirty: false,
                    fin_sent: false,
                    fin_rcvd: false,
                })
            }
        }
        Ok(())
    }

    /// State of the endpoint for `peer`.
    pub fn state(&self, peer: PeerId) -> Option<EndpointState> {
        self.ep(peer).map(|e| match e.state {
            EpState::Closed => EndpointState::Closed,
            EpState::Connecting { .. } => EndpointState::Connecting,
            EpState::ConnectAck { .. } => EndpointState::ConnectAck,
            EpState::Connected { .. } => EndpointState::Connected,
            EpState::Failed => EndpointState::Failed,
        })
    }

    /// Number of sends accepted and not yet completed for `peer`.
    pub fn pending(&self, peer: PeerId) -> usize {
        self.ep(peer).map_or(0, |e| {
            e.queue.iter().filter(|f| f.cookie.is_some()).count()
                + e.inflight.iter().filter(|c| c.is_some()).count()
                + e.orphaned
        })
    }

    /// Queues a message. On a Closed endpoint this starts the connect (lazy connect).
    pub fn send(
        &mut self,
        now: Instant,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
    ) -> Result<(), SendError> {
        if self.shutting_down {
            return Err(SendError::ShuttingDown);
        }
        if segs.len() > MAX_SEGMENTS {
            return Err(SendError::TooManySegments {
                got: segs.len(),
                max: MAX_SEGMENTS,
            });
        }
        let len: usize = segs.iter().map(Bytes::len).sum();
        if len > self.cfg.max_frame as usize {
            return Err(SendError::TooLarge {
                len,
                max: self.cfg.max_frame as usize,
            });
        }
        let ep = self.ep_mut(peer).ok_or(SendError::UnknownPeer(peer))?;
        if matches!(ep.state, EpState::Failed) || ep.fin_sent {
            return Err(SendError::Unreachable(peer));
        }
        let mut frag = Frag {
            hdr: Header {
                kind: FrameKind::Send,
                tag,
                len: len as u32,
            },
            segs: Default::default(),
            nsegs: segs.len() as u8,
            cookie: Some(cookie),
        };
        for (d, s) in frag.segs.iter_mut().zip(segs) {
            *d = s.clone();
        }
        ep.queue.push_back(frag);
        match ep.state {
            EpState::Closed => {
                ep.fin_rcvd = false;
                self.start_dial(now, peer);
            }
            EpState::Connected { .. } => self.mark_dirty(peer),
            _ => {}
        }
        Ok(())
    }

    /// The driver opened the socket for an [`Action::Dial`] and is connecting.
    pub fn dial_started(&mut self, peer: PeerId, conn: ConnKey) {
        self.put_conn(conn, Conn::new(Stage::Connecting, Some(peer), HELLO_LEN));
        if let Some(ep) = self.ep_mut(peer) {
            if let EpState::Connecting { conn: c, .. } = &mut ep.state {
                *c = Some(conn);
                return;
            }
        }
        // The endpoint moved on meanwhile (failed, or adopted the peer's dial).
        self.kill_conn(conn);
    }

    /// The driver could not even create the socket for a dial.
    pub fn dial_failed(&mut self, now: Instant, peer: PeerId, err: String) {
        self.connect_attempt_failed(now, peer, err);
    }

    /// A connect finished.
    pub fn handle_connected(&mut self, now: Instant, conn: ConnKey, result: Result<(), String>) {
        let Some(c) = self.conn_mut(conn) else { return };
        if c.stage != Stage::Connecting {
            return;
        }
        let Some(peer) = c.peer else { return };
        match result {
            Ok(()) => {
                let hello = Hello {
                    kind: HelloKind::Hello,
                    version: VERSION,
                    pid: self.cfg.pid,
                    token: self.cfg.token,
                };
                let deadline = now + self.cfg.handshake_timeout;
                let c = self.conn_mut(conn).expect("checked above");
                c.stage = Stage::ExpectAccept;
                c.deadline = Some(deadline);
                c.write_record(&hello);
                self.arm_timer(deadline);
                self.actions.push_back(Action::Receive(conn));
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
            Err(e) => {
                self.kill_conn(conn);
                if self.ep_dialing_on(peer, conn) {
                    self.connect_attempt_failed(now, peer, e);
                }
            }
        }
    }

    /// The listener accepted a connection.
    pub fn handle_accepted(&mut self, now: Instant, conn: ConnKey) {
        let half_open = self
            .conns
            .iter()
            .flatten()
            .filter(|c| c.stage == Stage::ExpectHello)
            .count();
        if half_open >= self.cfg.max_half_open {
            // A connection flood: drop the newcomer before it costs any buffer.
            self.counters.accept_overload += 1;
            self.put_conn(conn, Conn::new(Stage::Dead, None, 0));
            self.actions.push_back(Action::Close(conn));
            return;
        }
        let deadline = now + self.cfg.handshake_timeout;
        // A handshake-sized buffer: the cache grows when the connection is adopted.
        let mut c = Conn::new(Stage::ExpectHello, None, HELLO_LEN);
        c.deadline = Some(deadline);
        self.put_conn(conn, c);
        self.arm_timer(deadline);
        self.actions.push_back(Action::Receive(conn));
    }

    /// Takes the send batch of `conn` for an [`Action::Transmit`].
    pub fn take_tx(&mut self, conn: ConnKey) -> Option<TxBatch> {
        let c = self.conn_mut(conn)?;
        if !c.tx_ready {
            return None;
        }
        c.tx_ready = false;
        c.tx.take()
    }

    /// A send finished: the batch comes back.
    pub fn handle_sent(
        &mut self,
        now: Instant,
        conn: ConnKey,
        mut batch: TxBatch,
        result: Result<(), String>,
    ) {
        let frames = batch.frames();
        batch.clear();
        let Some(c) = self.conn_mut(conn) else { return };
        c.tx = Some(batch);
        if let Some(o) = c.orphans.take() {
            self.complete_orphans(o);
        }
        let Some(c) = self.conn_mut(conn) else { return };
        let peer = c.peer;
        let close_after = c.close_after_tx;
        let stage = c.stage;
        if stage == Stage::Dead {
            // A REJECT is out (or failed): now the socket may go.
            if close_after {
                c.close_after_tx = false;
                self.actions.push_back(Action::Close(conn));
            }
            return;
        }
        if let Err(e) = result {
            if let Some(peer) = peer.filter(|_| stage == Stage::Open) {
                self.fail_endpoint(
                    peer,
                    FailReason::ConnectionLost {
                        peer,
                        why: format!("send failed: {e}"),
                    },
                );
            } else {
                self.kill_conn(conn);
                if let Some(p) = peer {
                    if self.ep_dialing_on(p, conn) {
                        self.connect_attempt_failed(now, p, e);
                    }
                }
            }
            return;
        }
        if stage == Stage::Open {
            if let Some(peer) = peer {
                self.complete_frames(peer, frames);
                let ep = self.ep(peer).expect("open conn has an endpoint");
                let (more, done) = (
                    !ep.queue.is_empty(),
                    ep.fin_sent && ep.fin_rcvd && ep.inflight.is_empty() && ep.queue.is_empty(),
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

    /// Takes the receive buffer of `conn` for an [`Action::Receive`].
    pub fn take_rx(&mut self, conn: ConnKey) -> Option<RxBuf> {
        let c = self.conn_mut(conn)?;
        if c.stage == Stage::Dead {
            return None;
        }
        c.rx.take()
    }

    /// A receive failed or hit end of stream.
    pub fn handle_recv_end(&mut self, now: Instant, conn: ConnKey, err: Option<String>) {
        let Some(c) = self.conn_mut(conn) else { return };
        let (stage, peer) = (c.stage, c.peer);
        match (stage, peer) {
            (Stage::Dead, _) => {}
            (Stage::Open, Some(peer)) => {
                let ep = self.ep(peer).expect("open conn has an endpoint");
                if ep.fin_rcvd {
                    // EOF after the peer's FIN: the clean end, once our own frames (and
                    // FIN) are written; otherwise the last send's completion closes.
                    if ep.inflight.is_empty() && ep.queue.is_empty() {
                        self.close_clean(peer, conn);
                    }
                } else {
                    let why = err.unwrap_or_else(|| "peer closed without FIN".into());
                    self.fail_endpoint(peer, FailReason::ConnectionLost { peer, why });
                }
            }
            (Stage::ExpectAccept, Some(peer)) => {
                // The acceptor dropped our dial before answering.
                self.kill_conn(conn);
                if self.ep_dialing_on(peer, conn) {
                    let why = err.unwrap_or_else(|| "closed during handshake".into());
                    self.retry_or_fail(Some(now), peer, why);
                }
            }
            _ => self.kill_conn(conn),
        }
    }

    /// Walks the bytes of a completed read. Call until it returns [`Step::Rearm`] or
    /// [`Step::Drop`]; deliver each [`Step::Deliver`] payload from `rx` before the next call.
    pub fn recv_step(&mut self, now: Instant, conn: ConnKey, rx: &mut RxBuf) -> Step {
        loop {
            let Some(c) = self.conn_mut(conn) else {
                return Step::Drop;
            };
            match c.stage {
                Stage::Dead | Stage::Connecting => return Step::Drop,
                Stage::ExpectHello | Stage::ExpectAccept => {
                    let stage = c.stage;
                    match self.handshake_record(now, conn, stage, rx.next_hello()) {
                        Some(true) => {}
                        Some(false) => return Step::Rearm,
                        None => return Step::Drop,
                    }
                }
                Stage::Open => {
                    let peer = c.peer.expect("open conn knows its peer");
                    self.adopted_cache(rx);
                    if let Some(s) = self.open_step(now, conn, peer, rx) {
                        return s;
                    }
                }
            }
        }
    }

    /// Handles what a connection still in its handshake parsed: `Some(true)` a record was
    /// handled (look again), `Some(false)` more bytes are needed, `None` the connection
    /// is gone (garbage: closed and counted).
    fn handshake_record(
        &mut self,
        now: Instant,
        conn: ConnKey,
        stage: Stage,
        parsed: Result<Option<Hello>, crate::error::WireError>,
    ) -> Option<bool> {
        match parsed {
            Ok(None) => Some(false),
            Ok(Some(h)) => {
                if stage == Stage::ExpectHello {
                    self.on_hello(now, conn, h);
                } else {
                    self.on_accept_record(now, conn, h);
                }
                Some(true)
            }
            Err(e) => {
                self.handshake_garbage(conn, e.into());
                None
            }
        }
    }

    /// An adopted connection trades its handshake-sized buffer for the full cache.
    fn adopted_cache(&self, rx: &mut RxBuf) {
        if !rx.wants_all() && rx.capacity() < self.cfg.recv_cache {
            rx.grow(self.cfg.recv_cache);
        }
    }

    /// Gives back the buffer after [`Step::Rearm`]; the next read is queued.
    pub fn recv_done(&mut self, conn: ConnKey, mut rx: RxBuf) {
        let Some(c) = self.conn_mut(conn) else { return };
        if c.stage == Stage::Dead {
            return;
        }
        if !rx.wants_all() {
            rx.compact();
        }
        c.rx = Some(rx);
        self.actions.push_back(Action::Receive(conn));
    }

    /// Walks bytes received into a buffer the connection does not own (a provided buffer
    /// of a multishot receive), using `rx` (from [`Core::take_rx`]) only to reassemble
    /// records cut by the end of an input. `at` is the offset in `input` where the walk
    /// stands (start at 0). Call until [`InputStep::Done`] or [`InputStep::Drop`];
    /// deliver each [`InputStep::Deliver`] payload (from `input` or `rx`) before the next
    /// call, then give `rx` back with [`Core::input_done`]. No [`Action::Receive`] follows:
    /// the driver's receive stays armed.
    ///
    /// A frame (or handshake record) wholly inside `input` is delivered as a range of
    /// `input`. A record cut by the end of `input` has its bytes copied into `rx`, and
    /// only the bytes it misses are copied from the next inputs, so the frames after it are
    /// again delivered in place; a payload larger than the cache continues in the reused
    /// large-payload buffer, which then stands in for `rx` until delivered.
    pub fn input_step(
        &mut self,
        now: Instant,
        conn: ConnKey,
        rx: &mut RxBuf,
        input: &[u8],
        at: &mut usize,
    ) -> InputStep {
        loop {
            let Some(c) = self.conn_mut(conn) else {
                return InputStep::Drop;
            };
            match c.stage {
                Stage::Dead | Stage::Connecting => return InputStep::Drop,
                Stage::ExpectHello | Stage::ExpectAccept => {
                    let stage = c.stage;
                    let rest = &input[(*at).min(input.len())..];
                    let parsed = if rx.pending() == 0 && rest.len() >= HELLO_LEN {
                        *at += HELLO_LEN;
                        Hello::parse(rest).map(Some)
                    } else {
                        *at += rx.append_upto(rest, HELLO_LEN);
                        rx.next_hello()
                    };
                    match self.handshake_record(now, conn, stage, parsed) {
                        Some(true) => {}
                        Some(false) => return InputStep::Done,
                        None => return InputStep::Drop,
                    }
                }
                Stage::Open => {
                    let peer = c.peer.expect("open conn knows its peer");
                    self.adopted_cache(rx);
                    if let Some(s) = self.input_open_step(conn, peer, rx, input, at) {
                        return s;
                    }
                }
            }
        }
    }

    /// Gives back the reassembly buffer after [`InputStep::Done`]. Unlike
    /// [`Core::recv_done`], queues no receive.
    pub fn input_done(&mut self, conn: ConnKey, rx: RxBuf) {
        let Some(c) = self.conn_mut(conn) else { return };
        if c.stage != Stage::Dead {
            c.rx = Some(rx);
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

    /// Sends that wait for their batch to come back from the driver (their peer failed
    /// meanwhile).
    pub fn orphaned(&self) -> usize {
        self.endpoints.iter().flatten().map(|e| e.orphaned).sum()
    }

    /// Completes the sends of every batch still with the driver now, without waiting for
    /// it: for a shutdown whose drain ran out of time (the driver then leaks the batches
    /// rather than free memory the kernel may read).
    pub fn release_orphans(&mut self) {
        for i in 0..self.conns.len() {
            if let Some(o) = self.conns[i].as_mut().and_then(|c| c.orphans.take()) {
                self.complete_orphans(o);
            }
        }
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.next_timer {
            Some(t) if t <= now => {}
            _ => return,
        }
        self.next_timer = None;
        // Handshake deadlines of connections.
        for i in 0..self.conns.len() {
            let Some(c) = self.conns[i].as_ref() else {
                continue;
            };
            let Some(d) = c.deadline else { continue };
            if d > now {
                self.arm_timer(d);
                continue;
            }
            let (stage, peer) = (c.stage, c.peer);
            let conn = ConnKey(i as u32);
            self.kill_conn(conn);
            match (stage, peer) {
                (Stage::ExpectAccept | Stage::Connecting, Some(p))
                    if self.ep_dialing_on(p, conn) =>
                {
                    self.retry_or_fail(Some(now), p, "handshake timed out".into());
                }
                (Stage::ExpectHello, _) => self.events.push_back(CoreEvent::Refused {
                    why: ProtoError::HandshakeTimeout,
                }),
                _ => {}
            }
        }
        // Endpoint timers: connect retries and waits for the winning dial.
        for i in 0..self.endpoints.len() {
            let Some(ep) = self.endpoints[i].as_mut() else {
                continue;
            };
            let peer = PeerId(i as u32);
            match ep.state {
                EpState::Connecting {
                    conn: None,
                    retry_at: Some(t),
                } => {
                    if t <= now {
                        self.dial_next(peer);
                    } else {
                        self.arm_timer(t);
                    }
                }
                EpState::ConnectAck {
                    conn: None,
                    deadline: Some(t),
                } => {
                    if t <= now {
                        // The winner never came: dial again ourselves.
                        self.retry_or_fail(Some(now), peer, "peer's dial did not arrive".into());
                    } else {
                        self.arm_timer(t);
                    }
                }
                _ => {}
            }
        }
    }

    /// Earliest instant at which [`handle_timeout`](Self::handle_timeout) has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_timer
    }

    /// Moves queued frames into the idle send batch of every connection that has some,
    /// and queues one [`Action::Transmit`] per such connection.
    pub fn flush(&mut self) {
        let mut dirty = mem::take(&mut self.dirty);
        for peer in dirty.drain(..) {
            let Some(ep) = self.ep_mut(peer) else {
                continue;
            };
            ep.dirty = false;
            let EpState::Connected { conn } = ep.state else {
                continue;
            };
            self.fill_batch(peer, conn);
        }
        self.dirty = dirty;
    }

    /// Next socket operation to perform.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Next event for the application.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<CoreEvent> {
        self.events.pop_front()
    }

    /// True when events are waiting.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Starts a clean shutdown: new sends are refused; every endpoint that is connected
    /// or connecting gets a FIN queued behind its pending frames, so what was accepted
    /// before still leaves, then the connection closes once both FINs are exchanged.
    pub fn shutdown(&mut self) {
        self.shutting_down = true;
        for i in 0..self.endpoints.len() {
            let peer = PeerId(i as u32);
            let Some(ep) = self.endpoints[i].as_mut() else {
                continue;
            };
            if matches!(ep.state, EpState::Closed | EpState::Failed) || ep.fin_sent {
                continue;
            }
            ep.fin_sent = true;
            ep.queue.push_back(Frag::fin());
            if matches!(ep.state, EpState::Connected { .. }) {
                self.mark_dirty(peer);
            }
        }
    }

    /// True once every endpoint is closed or failed (after [`shutdown`](Self::shutdown)).
    pub fn is_quiescent(&self) -> bool {
        self.endpoints
            .iter()
            .flatten()
            .all(|e| matches!(e.state, EpState::Closed | EpState::Failed) && e.queue.is_empty())
    }

    /// Abandons every connection (shutdown ran out of time): pending sends fail with
    /// [`FailReason::Shutdown`] and every socket is closed.
    pub fn abort_all(&mut self) {
        for i in 0..self.endpoints.len() {
            let peer = PeerId(i as u32);
            if self.endpoints[i].is_some() {
                self.fail_endpoint_quietly(peer, FailReason::Shutdown);
            }
        }
        for i in 0..self.conns.len() {
            if self.conns[i].is_some() {
                self.kill_conn(ConnKey(i as u32));
            }
        }
    }

    // ----- internals -------------------------------------------------------------------

    fn ep(&self, peer: PeerId) -> Option<&Endpoint> {
        self.endpoints.get(peer.0 as usize)?.as_ref()
    }

    fn ep_mut(&mut self, peer: PeerId) -> Option<&mut Endpoint> {
        slot(&mut self.endpoints, peer.0)
    }

    fn conn_mut(&mut self, conn: ConnKey) -> Option<&mut Conn> {
        slot(&mut self.conns, conn.0)
    }

    fn put_conn(&mut self, conn: ConnKey, c: Conn) {
        let i = conn.0 as usize;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        self.conns[i] = Some(c);
    }

    fn arm_timer(&mut self, t: Instant) {
        self.next_timer = Some(self.next_timer.map_or(t, |n| n.min(t)));
    }

    fn mark_dirty(&mut self, peer: PeerId) {
        if let Some(ep) = self.ep_mut(peer) {
            if !ep.dirty {
                ep.dirty = true;
                self.dirty.push(peer);
            }
        }
    }

    fn ep_dialing_on(&self, peer: PeerId, conn: ConnKey) -> bool {
        matches!(
            self.ep(peer).map(|e| &e.state),
            Some(EpState::Connecting { conn: Some(c), .. } | EpState::ConnectAck { conn: Some(c), .. })
                if *c == conn
        )
    }

    fn start_dial(&mut self, now: Instant, peer: PeerId) {
        let _ = now;
        if let Some(ep) = self.ep_mut(peer) {
            ep.attempts = 0;
        }
        self.dial_next(peer);
    }

    fn dial_next(&mut self, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        if ep.addrs.is_empty() {
            let reason = FailReason::ConnectFailed {
                peer,
                attempts: 0,
                errno: "no address known for this peer".into(),
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
        self.actions.push_back(Action::Dial { peer, addr, bind });
    }

    fn connect_attempt_failed(&mut self, now: Instant, peer: PeerId, err: String) {
        self.retry_or_fail(Some(now), peer, err);
    }

    /// A dial failed: schedule the next attempt, or fail the endpoint after the last.
    fn retry_or_fail(&mut self, now: Option<Instant>, peer: PeerId, err: String) {
        let (retries, base) = (self.cfg.connect_retries, self.cfg.retry_delay);
        let shutting_down = self.shutting_down;
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        if matches!(ep.state, EpState::Failed | EpState::Connected { .. }) {
            return;
        }
        if ep.attempts >= retries || shutting_down {
            let attempts = ep.attempts;
            self.fail_endpoint(
                peer,
                FailReason::ConnectFailed {
                    peer,
                    attempts,
                    errno: err,
                },
            );
            return;
        }
        match now {
            Some(now) => {
                let shift = ep.attempts.saturating_sub(1).min(10);
                self.counters.connect_retries += 1;
                let at = now + base * (1u32 << shift);
                ep.state = EpState::Connecting {
                    conn: None,
                    retry_at: Some(at),
                };
                self.arm_timer(at);
            }
            None => {
                self.counters.connect_retries += 1;
                self.dial_next(peer);
            }
        }
    }

    /// Acceptor side: the dialer's HELLO arrived.
    fn on_hello(&mut self, now: Instant, conn: ConnKey, h: Hello) {
        let refuse = |core: &mut Self, reason: RejectReason, why: ProtoError| {
            core.counters.refused += 1;
            core.events.push_back(CoreEvent::Refused { why });
            core.reject(conn, reason);
        };
        if h.kind == HelloKind::Probe {
            // "Is a ringbtl process listening here?": answer with our id, then close.
            self.counters.probes += 1;
            self.answer_and_close(conn, HelloKind::ProbeAck);
            return;
        }
        if h.kind != HelloKind::Hello {
            self.handshake_garbage(
                conn,
                ProtoError::UnexpectedHello {
                    state: "ExpectHello",
                },
            );
            return;
        }
        if h.version != VERSION {
            let why = ProtoError::UnsupportedVersion {
                got: h.version,
                ours: VERSION,
            };
            return refuse(self, RejectReason::Version, why);
        }
        if h.token != self.cfg.token {
            return refuse(self, RejectReason::BadToken, ProtoError::BadToken);
        }
        let peer = h.pid;
        if self.shutting_down {
            return refuse(
                self,
                RejectReason::ShuttingDown,
                ProtoError::Rejected(RejectReason::ShuttingDown),
            );
        }
        let me = self.cfg.pid;
        let Some(ep) = self.ep_mut(peer) else {
            return refuse(
                self,
                RejectReason::UnknownPeer,
                ProtoError::Rejected(RejectReason::UnknownPeer),
            );
        };
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
            | EpState::ConnectAck { conn: Some(_), .. } => peer < me,
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
        // Abandon our own dial, if any: no frame was ever sent on it.
        let old = match ep.state {
            EpState::Connecting { conn, .. } | EpState::ConnectAck { conn, .. } => conn,
            _ => None,
        };
        ep.state = EpState::Connected { conn };
        ep.fin_rcvd = false;
        if let Some(old) = old {
            self.counters.simultaneous += 1;
            self.kill_conn(old);
        }
        let accept = Hello {
            kind: HelloKind::Accept,
            version: VERSION,
            pid: me,
            token: self.cfg.token,
        };
        let c = self.conn_mut(conn).expect("conn exists");
        c.stage = Stage::Open;
        c.peer = Some(peer);
        c.deadline = None;
        c.write_record(&accept);
        // The ACCEPT leaves in the same batch as the first queued frames.
        self.mark_dirty(peer);
        self.submit_tx_if_no_frames(peer, conn);
        let _ = now;
        self.events.push_back(CoreEvent::Connected(peer));
    }

    /// Dialer side: the acceptor's answer arrived.
    fn on_accept_record(&mut self, now: Instant, conn: ConnKey, h: Hello) {
        let c = self.conn_mut(conn).expect("conn exists");
        let peer = c.peer.expect("dialer knows its peer");
        let err = match h.kind {
            _ if h.version != VERSION => Some(ProtoError::UnsupportedVersion {
                got: h.version,
                ours: VERSION,
            }),
            HelloKind::Hello | HelloKind::Probe | HelloKind::ProbeAck => {
                Some(ProtoError::UnexpectedHello {
                    state: "ExpectAccept",
                })
            }
            _ if h.token != self.cfg.token => Some(ProtoError::BadToken),
            _ if h.pid != peer => Some(ProtoError::WrongPeer {
                expected: peer,
                got: h.pid,
            }),
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
                self.mark_dirty(peer);
                self.events.push_back(CoreEvent::Connected(peer));
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
                    RejectReason::Duplicate => {
                        self.retry_or_fail(Some(now), peer, format!("refused by peer: {reason:?}"));
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
            HelloKind::Hello | HelloKind::Probe | HelloKind::ProbeAck => {
                unreachable!("handled above")
            }
        }
    }

    /// Frames on an open connection. `Some(step)` to return, `None` to loop.
    fn open_step(
        &mut self,
        now: Instant,
        conn: ConnKey,
        peer: PeerId,
        rx: &mut RxBuf,
    ) -> Option<Step> {
        let max = self.cfg.max_frame;
        if !rx.wants_all() && rx.pending() > 0 && self.data_after_fin(peer) {
            return Some(Step::Drop);
        }
        let c = self.conn_mut(conn).expect("conn exists");
        if rx.wants_all() {
            // A large payload buffer.
            if c.large_delivered {
                c.back_to_cache(rx);
                return None;
            }
            return match rx.large_complete() {
                Some((h, p)) => {
                    c.large_delivered = true;
                    Some(Step::Deliver {
                        peer,
                        tag: h.tag,
                        range: 0..p.len(),
                    })
                }
                None => Some(Step::Rearm),
            };
        }
        let _ = now;
        match rx.next_frame(max) {
            Ok(Next::NeedMore) => Some(Step::Rearm),
            Ok(Next::Frame(h, range)) => match h.kind {
                FrameKind::Send => Some(Step::Deliver {
                    peer,
                    tag: h.tag,
                    range,
                }),
                FrameKind::Fin => {
                    self.on_fin(peer, conn);
                    None
                }
            },
            Ok(Next::Large(h)) => {
                let spare = c.spare_large.take().unwrap_or_else(RxBuf::empty_large);
                let large = rx.into_large(h, spare);
                let cache = mem::replace(rx, large);
                c.parked = Some(cache);
                // `into_large` consumed the cache: the payload continues in `rx`.
                None
            }
            Err(e) => {
                self.fail_protocol(peer, e.into());
                Some(Step::Drop)
            }
        }
    }

    /// [`Core::input_step`] on an open connection. `Some(step)` to return, `None` to loop.
    fn input_open_step(
        &mut self,
        conn: ConnKey,
        peer: PeerId,
        rx: &mut RxBuf,
        input: &[u8],
        at: &mut usize,
    ) -> Option<InputStep> {
        let max = self.cfg.max_frame;
        let rest = &input[(*at).min(input.len())..];
        if !rest.is_empty() && self.data_after_fin(peer) {
            return Some(InputStep::Drop);
        }
        let c = self.conn_mut(conn).expect("conn exists");
        if rx.wants_all() {
            // A large payload being reassembled in its own buffer.
            if c.large_delivered {
                c.back_to_cache(rx);
                return None;
            }
            *at += rx.append(rest);
            return Some(match rx.large_complete() {
                Some((h, p)) => {
                    c.large_delivered = true;
                    InputStep::Deliver {
                        peer,
                        tag: h.tag,
                        src: Source::Cache(0..p.len()),
                    }
                }
                None => InputStep::Done,
            });
        }
        if rx.pending() == 0 {
            if rest.is_empty() {
                return Some(InputStep::Done);
            }
            // Fast path: a whole frame inside the input is delivered where it lies.
            if rest.len() >= HEADER_LEN {
                let h = match Header::parse(rest, max) {
                    Ok(h) => h,
                    Err(e) => return Some(self.input_protocol_error(peer, e)),
                };
                let need = HEADER_LEN + h.len as usize;
                if rest.len() >= need {
                    let start = *at + HEADER_LEN;
                    *at += need;
                    return match h.kind {
                        FrameKind::Send => Some(InputStep::Deliver {
                            peer,
                            tag: h.tag,
                            src: Source::Input(start..start + h.len as usize),
                        }),
                        FrameKind::Fin => {
                            self.on_fin(peer, conn);
                            None
                        }
                    };
                }
            }
        }
        // A frame cut by the end of an input: the header first, then exactly the bytes it
        // still misses, so the next frame starts at the front of the next input.
        *at += rx.append_upto(rest, HEADER_LEN);
        let h = match rx.peek_header(max) {
            Ok(Some(h)) => h,
            Ok(None) => return Some(InputStep::Done),
            Err(e) => return Some(self.input_protocol_error(peer, e)),
        };
        let need = HEADER_LEN + h.len as usize;
        if need > rx.capacity() {
            // Larger than the cache: continue in the large-payload buffer.
            let spare = c.spare_large.take().unwrap_or_else(RxBuf::empty_large);
            let large = rx.into_large(h, spare);
            c.parked = Some(mem::replace(rx, large));
            return None;
        }
        let rest = &input[(*at).min(input.len())..];
        *at += rx.append_upto(rest, need);
        match rx.next_frame(max) {
            Ok(Next::Frame(h, range)) => match h.kind {
                FrameKind::Send => Some(InputStep::Deliver {
                    peer,
                    tag: h.tag,
                    src: Source::Cache(range),
                }),
                FrameKind::Fin => {
                    self.on_fin(peer, conn);
                    None
                }
            },
            Ok(Next::NeedMore | Next::Large(_)) => Some(InputStep::Done),
            Err(e) => Some(self.input_protocol_error(peer, e)),
        }
    }

    /// Bytes arrived after the peer's FIN, which promised the end of the stream: that
    /// breaks the protocol and fails the endpoint. False when no FIN was received.
    fn data_after_fin(&mut self, peer: PeerId) -> bool {
        if !self.ep(peer).is_some_and(|e| e.fin_rcvd) {
            return false;
        }
        self.fail_protocol(peer, ProtoError::DataAfterFin);
        true
    }

    /// The peer broke the protocol: its endpoint fails.
    fn fail_protocol(&mut self, peer: PeerId, err: ProtoError) {
        self.fail_endpoint(peer, FailReason::Protocol { peer, err });
    }

    fn input_protocol_error(&mut self, peer: PeerId, e: crate::error::WireError) -> InputStep {
        self.fail_protocol(peer, e.into());
        InputStep::Drop
    }

    fn on_fin(&mut self, peer: PeerId, conn: ConnKey) {
        let ep = self.ep_mut(peer).expect("open conn has an endpoint");
        ep.fin_rcvd = true;
        self.events.push_back(CoreEvent::PeerClosed(peer));
        let ep = self.ep_mut(peer).expect("exists");
        if !ep.fin_sent {
            // The peer reads until our FIN: what we queued still leaves, then our FIN.
            ep.fin_sent = true;
            ep.queue.push_back(Frag::fin());
            self.mark_dirty(peer);
        } else if ep.inflight.is_empty() && ep.queue.is_empty() {
            // Our FIN is out and theirs is in: done. (Otherwise the completion of the
            // send that carries our FIN closes.)
            self.close_clean(peer, conn);
        }
    }

    /// Both FINs exchanged (or the peer's EOF after its FIN): close without error.
    fn close_clean(&mut self, peer: PeerId, conn: ConnKey) {
        self.kill_conn(conn);
        if let Some(ep) = self.ep_mut(peer) {
            if matches!(ep.state, EpState::Connected { conn: c } if c == conn) {
                ep.state = EpState::Closed;
                ep.fin_sent = false;
                ep.inflight.clear();
            }
        }
        // Whatever was still queued (the peer left) fails.
        self.fail_queued(peer, FailReason::PeerClosed(peer));
    }

    fn fill_batch(&mut self, peer: PeerId, conn: ConnKey) {
        let (budget, max_iov, inline) = (
            self.cfg.coalesce_bytes,
            self.cfg.max_iov,
            self.cfg.inline_limit,
        );
        let Some(c) = slot(&mut self.conns, conn.0) else {
            return;
        };
        let Some(batch) = c.tx.as_mut() else { return }; // in flight: next completion refills
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        while let Some(f) = ep.queue.front() {
            let first = batch.frames() == 0;
            let parts = batch.parts() + 1 + f.nsegs as usize;
            if !first && (batch.len() + f.wire_len() > budget || parts > max_iov) {
                break;
            }
            let Frag {
                hdr,
                segs,
                nsegs,
                cookie,
            } = ep.queue.pop_front().expect("front exists");
            batch.push_copy(&hdr.to_bytes());
            if hdr.len as usize <= inline {
                // Small: copied next to its header, so runs of small frames form one
                // contiguous iovec.
                for s in &segs[..nsegs as usize] {
                    batch.push_copy(s);
                }
            } else {
                // Large: the caller's buffers go out by reference.
                for s in segs.into_iter().take(nsegs as usize) {
                    batch.push_ext(s);
                }
            }
            batch.add_frame();
            ep.inflight.push_back(cookie);
        }
        if !batch.is_empty() && !c.tx_ready {
            c.tx_ready = true;
            self.counters.batches += 1;
            self.counters.frames += batch.frames() as u64;
            self.actions.push_back(Action::Transmit(conn));
        }
    }

    /// Sends the handshake record now when the endpoint has no frames to append to it.
    fn submit_tx_if_no_frames(&mut self, peer: PeerId, conn: ConnKey) {
        if self.ep(peer).is_some_and(|e| e.queue.is_empty()) {
            self.submit_tx(conn);
        }
    }

    fn submit_tx(&mut self, conn: ConnKey) {
        if let Some(c) = self.conn_mut(conn) {
            if c.tx.as_ref().is_some_and(|b| !b.is_empty()) && !c.tx_ready {
                c.tx_ready = true;
                self.actions.push_back(Action::Transmit(conn));
            }
        }
    }

    fn complete_frames(&mut self, peer: PeerId, frames: usize) {
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        for _ in 0..frames {
            if let Some(Some(cookie)) = ep.inflight.pop_front() {
                self.events.push_back(CoreEvent::Completed {
                    peer,
                    cookie,
                    result: Ok(()),
                });
            }
        }
    }

    /// Answers a refused incoming connection and closes it once the answer is out.
    fn reject(&mut self, conn: ConnKey, reason: RejectReason) {
        self.answer_and_close(conn, HelloKind::Reject(reason));
    }

    /// Writes a handshake record on `conn` and closes it once the record is out.
    fn answer_and_close(&mut self, conn: ConnKey, kind: HelloKind) {
        let rec = Hello {
            kind,
            version: VERSION,
            pid: self.cfg.pid,
            token: self.cfg.token,
        };
        let Some(c) = self.conn_mut(conn) else { return };
        c.stage = Stage::Dead;
        c.deadline = None;
        c.write_record(&rec);
        c.close_after_tx = true;
        c.tx_ready = true;
        // Closed by `handle_sent` once the answer is written: closing now would cancel it.
        self.actions.push_back(Action::Transmit(conn));
    }

    /// Not a ringbtl peer, or nonsense during the handshake: drop the socket, count it.
    fn handshake_garbage(&mut self, conn: ConnKey, why: ProtoError) {
        let Some(c) = self.conn_mut(conn) else { return };
        let (stage, peer) = (c.stage, c.peer);
        if why == ProtoError::Wire(crate::error::WireError::BadMagic) {
            self.counters.bad_magic += 1;
        }
        self.kill_conn(conn);
        match (stage, peer) {
            (Stage::ExpectAccept, Some(p)) if self.ep_dialing_on(p, conn) => {
                self.fail_endpoint(p, FailReason::Protocol { peer: p, err: why });
            }
            _ => self.events.push_back(CoreEvent::Refused { why }),
        }
    }

    fn kill_conn(&mut self, conn: ConnKey) {
        if let Some(c) = self.conn_mut(conn) {
            // A Dead connection was closed already, unless a REJECT is still being written.
            if c.stage != Stage::Dead || c.close_after_tx {
                c.stage = Stage::Dead;
                c.deadline = None;
                c.tx_ready = false;
                c.close_after_tx = false;
                self.actions.push_back(Action::Close(conn));
            }
        }
    }

    fn fail_queued(&mut self, peer: PeerId, reason: FailReason) {
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        for c in ep.inflight.drain(..).flatten() {
            self.events.push_back(CoreEvent::Completed {
                peer,
                cookie: c,
                result: Err(reason.clone()),
            });
        }
        for f in ep.queue.drain(..) {
            if let Some(cookie) = f.cookie {
                self.events.push_back(CoreEvent::Completed {
                    peer,
                    cookie,
                    result: Err(reason.clone()),
                });
            }
        }
    }

    /// The endpoint fails for good: close its sockets, fail every pending send once,
    /// tell the application once.
    fn fail_endpoint(&mut self, peer: PeerId, reason: FailReason) {
        if self.fail_endpoint_quietly(peer, reason.clone()) {
            self.events.push_back(CoreEvent::PeerFailed(peer, reason));
        }
    }

    /// As [`fail_endpoint`] without the PeerFailed event; false if it had failed before.
    fn fail_endpoint_quietly(&mut self, peer: PeerId, reason: FailReason) -> bool {
        let Some(ep) = self.ep_mut(peer) else {
            return false;
        };
        let conn = match mem::replace(&mut ep.state, EpState::Failed) {
            EpState::Failed => return false,
            EpState::Connected { conn } => Some(conn),
            EpState::Connecting { conn, .. } | EpState::ConnectAck { conn, .. } => conn,
            EpState::Closed => None,
        };
        if let Some(c) = conn {
            self.kill_conn(c);
            self.orphan_inflight(peer, c, &reason);
        }
        self.fail_queued(peer, reason);
        true
    }

    /// The endpoint of `peer` fails while `conn`'s batch is with the driver: its frames
    /// complete when it comes back ([`handle_sent`](Self::handle_sent)), not now.
    fn orphan_inflight(&mut self, peer: PeerId, conn: ConnKey, reason: &FailReason) {
        let (Some(c), Some(ep)) = (
            slot(&mut self.conns, conn.0),
            slot(&mut self.endpoints, peer.0),
        ) else {
            return;
        };
        if c.tx.is_some() || ep.inflight.is_empty() {
            return;
        }
        let cookies = mem::take(&mut ep.inflight);
        ep.orphaned += cookies.iter().flatten().count();
        c.orphans = Some((peer, reason.clone(), cookies));
    }

    fn complete_orphans(
        &mut self,
        (peer, reason, cookies): (PeerId, FailReason, VecDeque<Option<u64>>),
    ) {
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
}

/// Entry `i` of a slot table (endpoints, connections), if occupied. A free function so
/// that it borrows only that table, not the whole engine.
fn slot<T>(table: &mut [Option<T>], i: u32) -> Option<&mut T> {
    table.get_mut(i as usize)?.as_mut()
}

/// Large-payload buffers above this size are released after use (others are kept).
const LARGE_KEEP: usize = 16 << 20;

impl Conn {
    fn new(stage: Stage, peer: Option<PeerId>, cache: usize) -> Self {
        Self {
            stage,
            peer,
            tx: Some(TxBatch::with_capacity(HELLO_LEN, 2)),
            orphans: None,
            tx_ready: false,
            close_after_tx: false,
            rx: Some(RxBuf::cache(cache)),
            parked: None,
            spare_large: None,
            large_delivered: false,
            deadline: None,
        }
    }

    /// A delivered large payload: its buffer becomes the reusable spare again and `rx`
    /// is the receive cache parked during the large read.
    fn back_to_cache(&mut self, rx: &mut RxBuf) {
        self.large_delivered = false;
        let cache = self
            .parked
            .take()
            .expect("cache parked during a large read");
        let mut large = mem::replace(rx, cache);
        large.reset_large();
        large.trim(LARGE_KEEP);
        self.spare_large = Some(large);
    }

    fn write_record(&mut self, h: &Hello) {
        if let Some(b) = self.tx.as_mut() {
            b.push_copy(&h.to_bytes());
        }
    }
}
