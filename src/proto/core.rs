//! The protocol engine: every endpoint (one per peer) and every connection (one per
//! socket), with the BTL's state machine. No I/O, no clock: time comes in as `now`.
//!
//! This file holds the engine's face (its types, the polling calls, timers, shutdown);
//! the endpoint state machine is in `endpoint.rs`, the connection table in `conn.rs`, the
//! receive side in `recv.rs` (over the one deframer, [`deframe`](super::deframe)) and
//! the send batches in `tx.rs`.
//!
//! # Call contract
//!
//! The driver (the [`Transport`](crate::Transport), or the in-memory pair in the tests)
//! feeds the engine with `handle_*` calls and [`Core::send`], then drains
//! [`Core::poll_action`] (operations to perform on sockets, carrying the buffers they
//! need) and [`Core::poll_event`] (completions and notices for the application), and
//! calls [`Core::flush`] once per progress pass so that every frame queued during the pass
//! leaves in one gathered send per connection.
//!
//! - [`Action::Transmit`] moves a connection's send batch to the driver; it comes back
//!   with [`Core::handle_sent`]. The engine emits the next Transmit of that connection
//!   only then: at most one send is in flight per connection, and the engine alone
//!   keeps that rule.
//! - [`Action::Receive`] moves a receive buffer to the driver for one read; after the
//!   read, the driver walks it with [`walk_read`], which hands every active message to
//!   the driver's [`Sink`], then the buffer to [`Sink::rearm`] for the next read: back
//!   to the engine, which queues it ([`Core::recv_done`]), or, from
//!   [`Core::rearm_now`], straight to the driver's next read. (The walk's steps are
//!   [`Core::recv_step`]'s until [`Step::Rearm`]; `walk_read` takes the plain messages
//!   of a read as one run.)
//! - [`Action::Walk`] hands back a receive buffer whose bytes were read but not walked:
//!   the engine held that connection's reading (`Core::hold_reading`: the walk stopped
//!   before a frame, the buffer stayed with the engine, and no read was armed, so that
//!   the rest waits in the socket) and resumed it. The driver walks it with
//!   [`walk_read`] as after a read.
//! - With [`CoreConfig::multishot`], receives are armed once with
//!   [`Action::ArmProvided`] on buffers the driver provides; each such buffer is walked
//!   in place with [`Core::input_step`], between [`Core::input_begin`] and
//!   [`Core::input_done`]. When a payload too large for the cache still misses at least a
//!   cache's worth of bytes, the engine asks [`Action::PauseProvided`]; once the driver
//!   reports [`Core::handle_provided_paused`], the rest of the payload is read straight
//!   into its own buffer with an [`Action::Receive`], and [`Action::ArmProvided`] follows.
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
//! connection and closes its own dial (no frame was ever sent on it: only the lower-id
//! side writes frames behind its AUTH, see `Core::send_early`; the other's flow once its
//! endpoint is Connected). The lower-id side answers the losing dial with an explicit
//! `REJECT(Simultaneous)`, so the loser knows to wait for the winner instead of adopting
//! a socket that is about to die. No queued frame is lost or sent twice: frames stay in
//! the endpoint's queue until exactly one connection is adopted.
//!
//! A dial can outlive its dialer's interest: its HELLO may wait in the acceptor's queue
//! past the dialer's handshake deadline, and the dialer then closes it. So the acceptor
//! sends only the ACCEPT on a connection it adopted, and its frames follow the dialer's
//! first bytes (a dialer always has a frame to send: it dialed to send one, and a lower-id
//! dialer's first frames come right behind its AUTH); a connection
//! that ends before them was a failed handshake, not a lost peer, and the endpoint
//! connects again with nothing lost (`Core::unconfirmed_lost`).
//!
//! Failure: every queued and in-flight send completes exactly once with an error, and a
//! [`CoreEvent::PeerFailed`] is raised once. A send whose batch the driver holds (the
//! kernel may still read its payload) completes when the batch comes back, so that its
//! completion always means "the caller's memory is free again". A failed endpoint stays
//! failed; later sends return [`SendError::Unreachable`] at once.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Instant;

use crate::auth::{JobKey, PUBLIC_KEY};
use crate::buf::{Regions, RxBuf, TxBatch};
use crate::error::{Cause, FailReason, ProtoError, SendError};
pub use crate::proto::config::CoreConfig;
use crate::proto::conn::{Conn, Stage};
pub use crate::proto::deframe::Source;
use crate::proto::endpoint::{Endpoint, EpState, Frag, FRAG_INLINE};
pub use crate::proto::handshake::NonceSource;
use crate::proto::jobs::Jobs;
pub use crate::proto::links::LinkRoute;
use crate::proto::tx::SentRuns;
use crate::wire::{PeerId, Tag};

/// Most payload segments (iovecs) one message may have.
pub const MAX_SEGMENTS: usize = 8;

/// Slots a driver offers [`Core::direct_pieces`] (defined beside the batches the reactor
/// moves, which it sizes).
pub use crate::buf::DIRECT_PIECES;

/// Largest process id accepted (endpoints are indexed by id).
pub const MAX_PEERS: u32 = 1 << 22;

/// A connection handle chosen by the driver (the reactor's slot index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey(pub u32);

/// Which large payloads a connection lends (`vmsplice` and `splice`) rather than copies,
/// as the driver, which chose the connection's send calls, decides
/// ([`Core::set_lending`]). Payloads shorter than
/// [`CoreConfig::splice_min`](crate::CoreConfig::splice_min) are copied whatever this says,
/// and an idle one in the idle copy's range
/// ([`CoreConfig::splice_idle`](crate::CoreConfig::splice_idle)) too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lending {
    /// A stream's payloads (queued behind each other, or behind lent pages) up to
    /// [`CoreConfig::splice_max`](crate::CoreConfig::splice_max), and one that finds its
    /// peer idle whatever its size. The default.
    #[default]
    Streams,
    /// Only a payload that finds its peer idle, whatever its size; a stream's are copied.
    Idle,
    /// Only a payload that finds its peer idle and is no longer than
    /// [`CoreConfig::splice_max`](crate::CoreConfig::splice_max) (one trip through the
    /// lending pipe); every other is copied.
    IdleWithinMax,
}

/// Which payloads that find their peer idle (a ping-pong's, a request's answer) a
/// connection copies rather than lends, as the driver, which knows the connection's
/// congestion control and peer, decides ([`Core::set_idle_copy`]). Only payloads up to
/// [`CoreConfig::splice_idle`](crate::CoreConfig::splice_idle) are ever copied so, and
/// but for [`IdleCopy::Paced`] only those from
/// [`IDLE_COPY_MIN`](crate::proto::config::IDLE_COPY_MIN) up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleCopy {
    /// None: they are lent like any other large payload.
    Off,
    /// Every one up to [`IDLE_COPY_PACED_MAX`](crate::proto::config::IDLE_COPY_PACED_MAX),
    /// the short ones below `IDLE_COPY_MIN` too (a connection whose congestion control
    /// paces, towards another host).
    Paced,
    /// Every one in the range. The default.
    #[default]
    Full,
}

impl Lending {
    /// What a connection lends, from what the driver knows of it: whether its congestion
    /// control paces its sending, whether its peer is on loopback, and whether paced
    /// connections copy streams (the socket layer's copy chunk is set). A paced
    /// connection that copies streams lends only the payloads that find their peer idle
    /// (towards loopback peers only those within one trip through the lending pipe);
    /// every other connection lends streams too. See docs/design/pacing.md.
    pub fn for_path(paced: bool, loopback: bool, copy_streams: bool) -> Self {
        match (paced && copy_streams, loopback) {
            (false, _) => Lending::Streams,
            (true, true) => Lending::IdleWithinMax,
            (true, false) => Lending::Idle,
        }
    }
}

impl IdleCopy {
    /// Which payloads that find their peer idle a connection copies, from what the driver
    /// knows of it: on a paced connection that acknowledges answers at once
    /// (`quick_ack`) every one in the range; on another paced connection towards another
    /// host every lent one up to
    /// [`IDLE_COPY_PACED_MAX`](crate::proto::config::IDLE_COPY_PACED_MAX); none elsewhere,
    /// where lent payloads arrive sooner. See docs/design/pacing.md.
    pub fn for_path(paced: bool, loopback: bool, quick_ack: bool) -> Self {
        match (paced, quick_ack, loopback) {
            (false, _, _) => IdleCopy::Off,
            (true, true, _) => IdleCopy::Full,
            (true, false, true) => IdleCopy::Off,
            (true, false, false) => IdleCopy::Paced,
        }
    }
}

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

/// A socket operation the driver must perform. Operations that move bytes carry their
/// buffer.
#[derive(Debug)]
pub enum Action {
    /// Open a connection to `addr` for `peer`, then report [`Core::dial_started`] (or
    /// [`Core::dial_failed`] if it failed at once).
    Dial {
        /// Who.
        peer: PeerId,
        /// Which link of the endpoint (0: its first connection; see
        /// [`Core::set_link_routes`]).
        link: u8,
        /// Where.
        addr: SocketAddr,
        /// Local address to bind the socket to before connecting (`None`: the kernel
        /// chooses the source).
        bind: Option<SocketAddr>,
    },
    /// Write the whole batch on `conn`; give it back with [`Core::handle_sent`].
    Transmit {
        /// The connection.
        conn: ConnKey,
        /// The bytes (frames) to write.
        batch: TxBatch,
    },
    /// Read once into `buf.spare_mut()` on `conn` (whole when `buf.wants_all()`), then
    /// walk it with [`walk_read`].
    Receive {
        /// The connection.
        conn: ConnKey,
        /// The buffer to read into.
        buf: RxBuf,
    },
    /// Walk the bytes `buf` holds already with [`walk_read`], without reading first: a
    /// connection whose reading was held comes back to the bytes it kept
    /// (`Core::resume_reading`). The walk's end starts the next read as after a
    /// [`Receive`](Action::Receive).
    Walk {
        /// The connection.
        conn: ConnKey,
        /// The buffer, with the bytes read before the hold.
        buf: RxBuf,
    },
    /// Arm (or keep armed) the multishot receive of `conn` on provided buffers; walk each
    /// buffer with [`Core::input_step`].
    ArmProvided(ConnKey),
    /// Stop the multishot receive of `conn` (a large payload is next, to be read straight
    /// into its buffer); report [`Core::handle_provided_paused`] once it stopped.
    PauseProvided(ConnKey),
    /// Close the socket (pending operations are cancelled).
    Close(ConnKey),
    /// Close the socket abortively: what the kernel still holds to send is discarded and
    /// the peer gets a reset (`SO_LINGER` 0). For a connection that fails while pages
    /// lent to it are given back to their owners, so that none of their bytes leave
    /// after that.
    Reset(ConnKey),
    /// Read how many times in a row the kernel's timer on `conn` fired without an
    /// acknowledgement (`tcpi_retransmits` or `tcpi_probes` of `TCP_INFO`, whichever is
    /// larger: retransmissions, or probes of data that could not leave), and report it with
    /// [`Core::probed`]. Asked of the primary connection of a peer with a standby link
    /// while frames wait for the peer, to find a path that died without an error (an
    /// interface down) long before `TCP_USER_TIMEOUT` would.
    Probe(ConnKey),
}

/// The cookies of sends in the order they were queued (`None` for a control frame, which
/// completes nothing): a peer's sends in flight, or a run of them completed together
/// ([`Core::poll_sent`]).
pub type Cookies = Vec<Option<u64>>;

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
    /// An incoming connection's HELLO claims process id `peer`, which was never added.
    /// Raised only after [`Core::ask_unknown`]`(true)`; the connection waits (within the
    /// handshake deadline) until the driver calls [`Core::resolve_unknown`], after adding
    /// the peer if it is one of the job's processes.
    UnknownPeer {
        /// The waiting connection.
        conn: ConnKey,
        /// The process id it claims.
        peer: PeerId,
    },
    /// An incoming connection was refused or dropped before it was adopted.
    Refused {
        /// Why.
        why: ProtoError,
    },
}

/// Counters of things that went wrong without harming anyone, and of batching.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counters {
    /// Incoming connections that did not start with our magic.
    pub bad_magic: u64,
    /// Incoming connections refused (authentication, unknown process id, version,
    /// duplicate).
    pub refused: u64,
    /// Handshakes whose peer could not prove the job key (its MAC did not verify), on
    /// either side.
    pub auth_failed: u64,
    /// Simultaneous connects resolved.
    pub simultaneous: u64,
    /// Connect attempts that failed and were retried.
    pub connect_retries: u64,
    /// Incoming connections still in their handshake closed to admit a newcomer (the
    /// oldest of their source, or of all; see `max_half_open`).
    pub accept_overload: u64,
    /// Connections adopted from a peer's HELLO that ended before the peer sent a byte
    /// on them (the dialer had given up on that dial): connected again, not failed.
    pub abandoned_handshakes: u64,
    /// Gathered sends handed to the driver (one per batch).
    pub batches: u64,
    /// Frames (messages and FINs) carried by those batches.
    pub frames: u64,
    /// Multishot receive: large payloads whose rest was read straight into their buffer
    /// (the multishot receive paused meanwhile).
    pub recv_direct: u64,
    /// PUT frames whose data was placed in a registered region.
    pub puts_placed: u64,
    /// GET frames answered with a REPLY.
    pub gets_answered: u64,
    /// Our gets whose REPLY's data was placed.
    pub gets_completed: u64,
    /// Messages whose bytes went to the socket, all or in part, from the send call
    /// itself ([`Core::direct_pieces`]) rather than with the next flush.
    pub written_at_once: u64,
    /// Payloads long enough to lend that were copied because they found their peer idle
    /// ([`CoreConfig::splice_idle`](crate::CoreConfig::splice_idle)).
    pub idle_copies: u64,
    /// Links beyond an endpoint's first that completed their handshake, on either side.
    pub links_joined: u64,
    /// Open links beyond an endpoint's first that failed or ended while their endpoint
    /// stayed connected.
    pub links_lost: u64,
    /// Times an endpoint's stream moved to a standby link because its primary failed
    /// (on either side).
    pub failovers: u64,
    /// Of those, the ones this side started because the primary's kernel timer
    /// fired again and again ([`Action::Probe`]): a path gone without an error.
    pub stalls: u64,
    /// Times a stream to a peer started to go in runs over several links (once per
    /// epoch at most).
    pub spread_streams: u64,
    /// Frames of peers' streams read on links beyond the first, in runs.
    pub run_frames_in: u64,
    /// Frames larger than the receive cache read whole, ahead, on a connection held for
    /// a run further in the stream.
    pub read_ahead: u64,
    /// Messages assembled from the PART frames their sender cut them into.
    pub parts_assembled: u64,
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

/// Where [`walk_read`] hands the active messages of a read: the driver.
pub trait Sink {
    /// The engine.
    fn core(&mut self) -> &mut Core;
    /// An active message from `peer` for `tag`; `payload` is valid during the call only.
    fn deliver(&mut self, peer: PeerId, tag: Tag, payload: &[u8]);
    /// The plain active messages at the front of a read, one [`deliver`](Self::deliver)
    /// each, until [`Run::next`] has none left. A driver may take them in a loop of its
    /// own (the [`Transport`](crate::Transport) looks a handler up once for a series of
    /// messages with the same tag); it must deliver them in order and stop where
    /// `Run::next` stops.
    #[inline]
    fn deliver_run(&mut self, run: &mut Run<'_>) {
        while let Some((tag, payload)) = run.next(self.core()) {
            self.deliver(run.peer(), tag, payload);
        }
    }
    /// The walk is over and the connection reads again: by default the buffer goes back
    /// to the engine, which queues the read ([`Core::recv_done`]); a driver that can
    /// start it at once takes the buffer from [`Core::rearm_now`].
    fn rearm(&mut self, conn: ConnKey, rx: RxBuf) {
        self.core().recv_done(conn, rx);
    }
}

/// Walks the bytes a [`Receive`](Action::Receive) read into `rx` on `conn` to their end,
/// every active message to `sink`, and hands the buffer to [`Sink::rearm`] for the next
/// read (it is dropped with its connection).
///
/// The steps are [`Core::recv_step`]'s, but for the plain active messages at the front
/// of the cache (a stream's read holds hundreds): they go as a [`Run`] to
/// [`Sink::deliver_run`], the connection checked once for all of them, and again only
/// after a delivery that ended a connection (a handler's `flush`, say), the only change a
/// handler can make to one.
pub fn walk_read<S: Sink>(sink: &mut S, now: Instant, conn: ConnKey, mut rx: RxBuf) {
    loop {
        let mut end = None;
        if let Some(head) = sink.core().recv_run(conn, &rx) {
            let mut run = Run {
                head,
                bytes: rx.unread(),
                used: 0,
                frames: 0,
            };
            sink.deliver_run(&mut run);
            let (used, frames) = (run.used, run.frames);
            rx.consume(used);
            sink.core().consumed(now, conn, frames, used);
            if sink.core().run_holds(&head) {
                end = sink.core().run_end(conn, &rx);
            }
        }
        match end.unwrap_or_else(|| sink.core().recv_step(now, conn, &mut rx)) {
            Step::Deliver { peer, tag, range } => sink.deliver(peer, tag, rx.bytes(range)),
            Step::Rearm => return sink.rearm(conn, rx),
            Step::Drop => return,
        }
    }
}

/// What a run of plain active messages at the front of a connection's cache
/// ([`Core::recv_run`]) was checked for: the connection's checks, made at its first
/// message, hold until a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RunHead {
    /// Source of the run's messages.
    pub(super) peer: PeerId,
    pub(super) max: u32,
    /// [`Core::ended`] when the run began.
    pub(super) ended: u64,
}

/// The plain active messages at the front of a read ([`walk_read`]): SENDs without
/// flags whole in the bytes read, of one peer, handed out in order by
/// [`next`](Self::next) until anything else comes or a connection ends.
#[derive(Debug)]
pub struct Run<'a> {
    head: RunHead,
    /// The read's unread bytes when the run began.
    bytes: &'a [u8],
    /// How many of `bytes` the messages handed out took.
    used: usize,
    /// How many messages were handed out.
    frames: u64,
}

impl<'a> Run<'a> {
    /// Source of the run's messages.
    #[inline]
    pub fn peer(&self) -> PeerId {
        self.head.peer
    }

    /// The next message of the run, consumed: its tag and its payload; `None` at the
    /// first frame that is not a plain SEND whole in the read, and once a connection
    /// ended (`core`'s, which a delivery can cause), leaving the rest to the walk.
    #[inline]
    pub fn next(&mut self, core: &Core) -> Option<(Tag, &'a [u8])> {
        if !core.run_holds(&self.head) {
            return None;
        }
        let bytes = self.bytes.get(self.used..)?;
        let (tag, need) = crate::proto::deframe::plain_at(bytes, self.head.max)?;
        self.used += need;
        self.frames += 1;
        Some((tag, &bytes[crate::wire::HEADER_LEN..need]))
    }
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

/// An operation decided but not yet handed out. Buffers are attached when
/// [`Core::poll_action`] hands it out, so that frames queued meanwhile still join the
/// batch.
#[derive(Debug)]
pub(super) enum Todo {
    Dial {
        peer: PeerId,
        link: u8,
        addr: SocketAddr,
        bind: Option<SocketAddr>,
    },
    Transmit(ConnKey),
    Receive(ConnKey),
    Walk(ConnKey),
    PauseProvided(ConnKey),
    Close(ConnKey),
    Reset(ConnKey),
    Probe(ConnKey),
}

/// The protocol engine. See the module documentation for the call contract.
#[derive(Debug)]
pub struct Core {
    pub(super) cfg: CoreConfig,
    pub(super) endpoints: Vec<Option<Endpoint>>,
    pub(super) conns: Vec<Option<Conn>>,
    pub(super) todo: VecDeque<Todo>,
    pub(super) events: VecDeque<CoreEvent>,
    /// Sends completed without error, a run per batch, in order with `events`.
    pub(super) sent: SentRuns,
    pub(super) dirty: Vec<PeerId>,
    /// A send just began a batch that the driver should write at once
    /// ([`direct_pieces`](Self::direct_pieces)).
    pub(super) direct: Option<ConnKey>,
    /// Earliest time any timer may fire (a lower bound: conservative is fine).
    pub(super) next_timer: Option<Instant>,
    pub(super) shutting_down: bool,
    /// Ask the driver about unknown process ids instead of refusing them at once.
    pub(super) ask_unknown: bool,
    pub(super) counters: Counters,
    /// Connections accepted so far (ranks strangers by age).
    pub(super) accepts: u64,
    /// Largest payload of a small message ([`FRAG_INLINE`], the configured inline limit
    /// and the largest frame, whichever is least): one comparison at each send.
    pub(super) small_max: usize,
    /// Connections ended, or held ([`hold_reading`](Self::hold_reading)), so far (either
    /// stops a [`Run`]).
    pub(super) ended: u64,
    /// The job key of the handshake's MACs ([`PUBLIC_KEY`] without one).
    pub(super) key: JobKey,
    pub(super) nonces: NonceSource,
    /// Memory that peers' PUT frames may write into.
    pub(super) regions: Regions,
    /// Payloads may be lent ([`set_lend_judged`](Self::set_lend_judged)).
    pub(super) lend_judged: bool,
    /// The other jobs this process talks to.
    pub(super) jobs: Jobs,
}

impl Core {
    /// A new engine, with nonces from the operating system.
    pub fn new(cfg: CoreConfig) -> Self {
        Self::with_nonces(cfg, NonceSource::os())
    }

    /// A new engine whose handshake nonces come from `nonces` (tests make them
    /// deterministic).
    pub fn with_nonces(cfg: CoreConfig, nonces: NonceSource) -> Self {
        let key = cfg.job_key.clone().unwrap_or(PUBLIC_KEY);
        let small_max = FRAG_INLINE
            .min(cfg.inline_limit)
            .min(cfg.max_frame as usize);
        Self {
            key,
            small_max,
            nonces,
            regions: Regions::default(),
            lend_judged: true,
            jobs: Jobs::default(),
            cfg,
            endpoints: Vec::new(),
            conns: Vec::new(),
            todo: VecDeque::with_capacity(64),
            events: VecDeque::with_capacity(256),
            sent: SentRuns::default(),
            dirty: Vec::with_capacity(64),
            direct: None,
            next_timer: None,
            shutting_down: false,
            ask_unknown: false,
            counters: Counters::default(),
            accepts: 0,
            ended: 0,
        }
    }

    /// Sets the job key of later handshakes (one from the launcher, known only after the
    /// address exchange). Set it before the first connection.
    pub fn set_job_key(&mut self, key: JobKey) {
        self.key = key.clone();
        self.cfg.job_key = Some(key);
    }

    /// True when a job key other than the public one is in use.
    pub fn authenticated(&self) -> bool {
        !self.key.is_public()
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
            slot @ None => *slot = Some(Endpoint::new(addrs, binds)),
        }
        Ok(())
    }

    /// With `true`, a HELLO that claims a process id never added is not refused at once:
    /// the engine raises [`CoreEvent::UnknownPeer`] and waits for
    /// [`resolve_unknown`](Self::resolve_unknown) (lazy add of peers, as Open MPI adds
    /// remote processes only when they first talk). With `false` (the default) such a
    /// HELLO is refused with `REJECT(UnknownPeer)`.
    pub fn ask_unknown(&mut self, on: bool) {
        self.ask_unknown = on;
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
            e.queue
                .iter()
                .filter(|f| f.pending_cookie().is_some())
                .count()
                + e.inflight.iter().filter(|c| c.is_some()).count()
                + e.orphaned
                + e.gets.len()
        })
    }

    /// Sends to `peer` that were written and wait for the peer's ACK of a lent frame (at
    /// or before them) to complete.
    pub fn unacked(&self, peer: PeerId) -> usize {
        self.ep(peer).map_or(0, |e| {
            e.inflight
                .iter()
                .take(e.written)
                .filter(|c| c.is_some())
                .count()
        })
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

    /// Next socket operation to perform, with the buffer it needs.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        if self.todo.is_empty() {
            return None;
        }
        self.next_action()
    }

    /// Whether [`poll_action`](Self::poll_action) may have something (a driver's loop
    /// checks this first, without a call).
    #[inline]
    pub fn has_actions(&self) -> bool {
        !self.todo.is_empty()
    }

    fn next_action(&mut self) -> Option<Action> {
        while let Some(t) = self.todo.pop_front() {
            let a = match t {
                Todo::Dial {
                    peer,
                    link,
                    addr,
                    bind,
                } => Action::Dial {
                    peer,
                    link,
                    addr,
                    bind,
                },
                Todo::Close(k) => Action::Close(k),
                Todo::Reset(k) => Action::Reset(k),
                Todo::Probe(k) => Action::Probe(k),
                Todo::PauseProvided(k) => Action::PauseProvided(k),
                Todo::Transmit(k) => {
                    let Some(c) = self.conn_mut(k) else { continue };
                    if !c.tx_ready {
                        continue;
                    }
                    c.tx_ready = false;
                    let Some(batch) = c.tx.take() else { continue };
                    c.solo = batch.frames() == 1;
                    Action::Transmit { conn: k, batch }
                }
                Todo::Walk(k) => {
                    let Some(c) = self.conn_mut(k) else { continue };
                    if c.stage == Stage::Dead || c.hold_rx {
                        continue;
                    }
                    let Some(buf) = c.rx.take() else { continue };
                    Action::Walk { conn: k, buf }
                }
                Todo::Receive(k) => {
                    let multishot = self.cfg.multishot;
                    let ask_unknown = self.ask_unknown;
                    let Some(c) = self.conn_mut(k) else { continue };
                    // No read while the driver decides about an unknown process id: the
                    // dialer's first frames may follow its AUTH, and they wait in the
                    // socket until the connection is adopted (`resolve_unknown` reads
                    // again) or refused.
                    if matches!(c.stage, Stage::Dead | Stage::Resolving) {
                        continue;
                    }
                    if c.hold_rx {
                        // Held: the buffer stays, and the read waits for the resume.
                        if c.rx.is_some() {
                            c.rx_parked = true;
                        }
                        continue;
                    }
                    let Some(buf) = c.rx.take() else { continue };
                    // When unknown process ids are asked about, a connection in its
                    // handshake reads its records one at a time into its own
                    // handshake-sized buffer, so that no frame behind the AUTH is taken
                    // while the driver decides; the multishot receive is armed once the
                    // connection is adopted.
                    let one_record = ask_unknown && c.stage != Stage::Open;
                    if multishot && !buf.wants_all() && !one_record {
                        // The receive stays armed on the shared provided buffers; the
                        // cache stays here, for records cut between two of them.
                        c.rx = Some(buf);
                        Action::ArmProvided(k)
                    } else {
                        Action::Receive { conn: k, buf }
                    }
                }
            };
            return Some(a);
        }
        None
    }

    /// Next event for the application (sends completed together come one by one; see
    /// [`poll_sent`](Self::poll_sent) for them as a run).
    #[must_use]
    pub fn poll_event(&mut self) -> Option<CoreEvent> {
        if let Some(e) = self.next_sent() {
            return Some(e);
        }
        let e = self.events.pop_front()?;
        self.sent.popped += 1;
        Some(e)
    }

    /// Earliest instant at which [`handle_timeout`](Self::handle_timeout) has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_timer
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
            let Some(c) = self.conns[i].as_mut() else {
                continue;
            };
            match c.confirm_at {
                // A count of the peer's frames no frame of ours carried: it leaves now.
                Some(t) if t <= now => {
                    c.confirm_at = None;
                    c.rx_lazy = u32::MAX;
                    if let Some(p) = c.peer {
                        self.mark_dirty(p);
                    }
                }
                Some(t) => self.arm_timer(t),
                None => {}
            }
            let Some(c) = self.conns[i].as_ref() else {
                continue;
            };
            let Some(d) = c.deadline else { continue };
            if d > now {
                self.arm_timer(d);
                continue;
            }
            let (stage, peer) = (c.stage, c.peer);
            if stage == Stage::ExpectAccept && c.early > 0 {
                // Frames went behind our AUTH, so the acceptor, which proved the key, may
                // have delivered them: its answer decides whether they go again, and
                // only it can give it (it closes the connection unadopted once its own
                // handshake deadline passes). Wait for the answer, as for a connected
                // peer's.
                self.conns[i].as_mut().expect("checked").deadline = None;
                continue;
            }
            // The first-bytes deadline, when it is the shorter one, fired.
            let silent =
                c.awaiting_first_bytes && self.cfg.first_bytes_timeout < self.cfg.handshake_timeout;
            let stranger = c.is_stranger();
            let unconfirmed = c.unconfirmed;
            let is_link = c.link > 0;
            let conn = ConnKey(i as u32);
            if let (Stage::Open, Some(p), true) = (stage, peer, unconfirmed) {
                self.confirm(p, conn);
                continue;
            }
            if is_link {
                // A link's handshake deadline, or its frame stall: the link alone ends.
                self.link_lost(now, conn);
                continue;
            }
            if let (Stage::Open, Some(p)) = (stage, peer) {
                // The frame in progress saw no byte for `frame_stall`, or a RESUME no
                // answer within the handshake timeout: the stream moves on if it can.
                if self.fail_over(now, p, conn) {
                    continue;
                }
                let stalled = self.cfg.frame_stall;
                let cause = Cause::FrameStalled(stalled);
                self.fail_endpoint(p, FailReason::ConnectionLost { peer: p, cause });
                continue;
            }
            self.kill_conn(conn);
            match (stage, peer) {
                (Stage::ExpectChallenge | Stage::ExpectAccept | Stage::Connecting, Some(p))
                    if self.ep_dialing_on(p, conn) =>
                {
                    self.retry_or_fail(Some(now), p, Cause::HandshakeTimeout);
                }
                _ if stranger => self.events.push_back(CoreEvent::Refused {
                    why: if silent {
                        ProtoError::FirstBytesTimeout
                    } else {
                        ProtoError::HandshakeTimeout
                    },
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
            if !ep.links.is_empty() {
                self.link_timers(now, peer);
                self.probe_timer(now, peer);
            }
            if self.endpoints[i]
                .as_ref()
                .is_some_and(|e| e.fo.owed.is_some())
            {
                self.owed_timer(now, peer);
            }
            let Some(ep) = self.endpoints[i].as_mut() else {
                continue;
            };
            if let (EpState::Connected { .. }, Some(t)) = (&ep.state, ep.ack_deadline) {
                if t <= now {
                    // The peer keeps lent pages unread (or unanswered) too long.
                    let cause = Cause::AckStalled(self.cfg.frame_stall);
                    self.fail_endpoint(peer, FailReason::ConnectionLost { peer, cause });
                    continue;
                }
                self.arm_timer(t);
            }
            let Some(ep) = self.endpoints[i].as_mut() else {
                continue;
            };
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
                        self.retry_or_fail(Some(now), peer, Cause::PeerDialMissing);
                    } else {
                        self.arm_timer(t);
                    }
                }
                _ => {}
            }
        }
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

    // ----- table access shared by the engine's files -------------------------------------

    pub(super) fn ep(&self, peer: PeerId) -> Option<&Endpoint> {
        self.endpoints.get(peer.0 as usize)?.as_ref()
    }

    pub(super) fn ep_mut(&mut self, peer: PeerId) -> Option<&mut Endpoint> {
        slot(&mut self.endpoints, peer.0)
    }

    pub(super) fn conn_mut(&mut self, conn: ConnKey) -> Option<&mut Conn> {
        slot(&mut self.conns, conn.0)
    }

    pub(super) fn arm_timer(&mut self, t: Instant) {
        self.next_timer = Some(self.next_timer.map_or(t, |n| n.min(t)));
    }

    pub(super) fn mark_dirty(&mut self, peer: PeerId) {
        if let Some(ep) = self.ep_mut(peer) {
            if !ep.dirty {
                ep.dirty = true;
                self.dirty.push(peer);
            }
        }
    }
}

/// Entry `i` of a slot table (endpoints, connections), if occupied. A free function so
/// that it borrows only that table, not the whole engine.
pub(super) fn slot<T>(table: &mut [Option<T>], i: u32) -> Option<&mut T> {
    table.get_mut(i as usize)?.as_mut()
}
