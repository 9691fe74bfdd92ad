//! The public face: [`Transport`] = reactor backend + protocol engine + active-message
//! table, driven by [`Transport::progress`] on one thread.
//!
//! One progress pass: (1) frames queued since the last pass are gathered into one send per
//! connection and submitted together with every other queued operation, (2) completions
//! are reaped, (3) each received buffer is walked frame by frame and every active message
//! is handed to its handler in place (no copy), (4) replies queued by handlers are gathered
//! and pushed, to reach the kernel at the start of the next pass (for the io_uring
//! backend: in the same `io_uring_enter` as the re-armed receives).

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::mem;
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::auth::JobKey;
use crate::buf::{RegionError, RxBuf};
use crate::config::{Config, Congestion};
use crate::error::{Errno, Error, FailReason, SendError};
use crate::proto::am::AmTable;
use crate::proto::config::CoreConfig;
use crate::proto::core::{
    self, Action, ConnKey, Core, CoreEvent, EndpointState, IdleCopy, InputStep, Lending, Sink,
    Source, DIRECT_PIECES,
};
use crate::reactor::listen::AcceptBackoff;
use crate::reactor::{
    sys, AnyBackend, Backend, ConnId, Event, ProvidedBuf, ProvidedRecv, RingGeometry, SockOpts,
};
use crate::wire::{PeerId, PutTarget, Tag};
use crate::wireup::ifaces::{self, Interface};
use crate::wireup::uri;

mod peers;

/// A received active message, valid during the handler call (the payload points into
/// the connection's receive cache, or, with multishot receive, into the provided buffer
/// the kernel filled).
#[derive(Debug)]
pub struct Am<'a> {
    /// Sender.
    pub src: PeerId,
    /// Tag it was sent with.
    pub tag: Tag,
    /// Payload bytes.
    pub payload: &'a [u8],
}

/// A finished send, reported once per accepted [`Transport::send`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Destination.
    pub peer: PeerId,
    /// The cookie given to `send`.
    pub cookie: u64,
    /// `Ok` once every byte was handed to the kernel, or why it never will be.
    pub result: Result<(), FailReason>,
}

/// Counters for things that happened without an error reaching the caller.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Active messages for a tag with no handler (dropped).
    pub unknown_tag: u64,
    /// Incoming connections without ringbtl's magic (closed).
    pub bad_magic: u64,
    /// Incoming connections refused (token, process id, version, duplicate).
    pub refused: u64,
    /// Handshakes whose peer could not prove the job key (its MAC did not verify).
    pub auth_failed: u64,
    /// Simultaneous connects resolved.
    pub simultaneous: u64,
    /// Failed connect attempts that were retried.
    pub connect_retries: u64,
    /// Accept calls that failed.
    pub accept_errors: u64,
    /// Incoming connections dropped because too many handshakes were pending.
    pub accept_overload: u64,
    /// Connections adopted from a peer's HELLO that ended before the peer sent a byte on
    /// them (the dialer had given up on that dial): connected again, not failed.
    pub abandoned_handshakes: u64,
    /// Gathered sends submitted (each carries one or more frames).
    pub batches: u64,
    /// Frames carried by those sends: `frames / batches` is the coalescing factor.
    pub frames: u64,
    /// Send operations handed to the kernel (sendmsg calls or io_uring SQEs). Above
    /// `batches` when batches are offered in [`SocketConfig::send_chunk`](crate::SocketConfig::send_chunk) pieces, have more
    /// than IOV_MAX parts, or meet a full socket buffer.
    pub send_calls: u64,
    /// Zero-copy sends completed (io_uring `SENDMSG_ZC`).
    pub zerocopy_sends: u64,
    /// Of those, how many the kernel copied after all (always, on loopback).
    pub zerocopy_copied: u64,
    /// Payload bytes sent from lent pages (`vmsplice` and `splice`, see
    /// [`CoreConfig::splice_min`](crate::CoreConfig::splice_min)) rather than copied.
    pub spliced_bytes: u64,
    /// Pipes made for lent pages since the transport started: a connection holds one
    /// only while its bytes are in it, and up to two empty ones are kept for the next
    /// (others are closed as they empty), so pipes are made again only when more
    /// connections than that lend pages at the same time.
    pub lend_pipes: u64,
    /// Of [`lend_pipes`](Self::lend_pipes), those open now: one per connection whose
    /// lent bytes are still in its pipe, plus at most two empty spares, however many
    /// peers large messages go to.
    pub lend_pipes_open: u64,
    /// Median cost of sending a lent byte on this machine (its frame's header `send`, its
    /// `vmsplice` and `splice`), in picoseconds, over the last pipe-fulls of at least
    /// 64 KiB; 0 until measured.
    /// See [`lending`](Self::lending).
    pub lend_cost_ps: u64,
    /// Median cost of sending a copied byte (`send`, `sendmsg`), in picoseconds, over the
    /// last calls that copied at least 64 KiB; 0 until measured.
    pub copy_cost_ps: u64,
    /// Send calls timed for [`lend_cost_ps`](Self::lend_cost_ps) and
    /// [`copy_cost_ps`](Self::copy_cost_ps).
    pub send_calls_timed: u64,
    /// Whether lending is the verdict of those costs: payloads long enough to lend are
    /// lent only while it holds (but for one lent message a second, to measure again),
    /// copied otherwise (and one copied message a second while it holds). True until
    /// both ways are measured. See docs/design/large-messages.md.
    pub lending: bool,
    /// Times a multishot receive stopped because every provided buffer was in use
    /// (`ENOBUFS`) and was re-armed once buffers came back; no data is lost. Always 0
    /// without [`SocketConfig::recv_multishot`](crate::SocketConfig::recv_multishot).
    pub recv_starved: u64,
    /// Multishot receive only: payloads too large for the receive cache whose remaining
    /// bytes were read straight into their buffer (the connection's multishot receive
    /// paused meanwhile) instead of being copied out of provided buffers.
    pub recv_direct: u64,
    /// Puts from peers whose data was placed in a registered region.
    pub puts_placed: u64,
    /// Peers' gets answered: their reply queued, borrowing a readable region.
    pub gets_answered: u64,
    /// Our gets completed: their data in place.
    pub gets_completed: u64,
    /// Messages written to the socket, all or in part, by [`send`](Transport::send)
    /// itself, before the rest of the caller's pass: those that found their connection's
    /// batch empty and nothing queued, on a connection whose last gathered send carried
    /// one frame (a ping-pong, a request and its answer), lent pages excepted. A stream's
    /// messages are gathered and leave together at the end of the pass.
    pub written_at_once: u64,
    /// Payloads long enough to lend ([`CoreConfig::splice_min`](crate::CoreConfig::splice_min))
    /// that were copied instead because they found their peer idle: the first message of
    /// their batch, nothing queued behind them, none of the peer's lent pages
    /// unacknowledged ([`CoreConfig::splice_idle`](crate::CoreConfig::splice_idle)).
    pub idle_copies: u64,
    /// Links beyond a peer's first connection that completed their handshake (see
    /// [`WireupConfig::links`](crate::WireupConfig::links)).
    pub links_joined: u64,
    /// Open links beyond a peer's first connection that failed or ended while the peer
    /// stayed connected (each is dialed again).
    pub links_lost: u64,
    /// Times a peer's stream moved to a standby link because its primary connection
    /// failed, losing nothing (see [`WireupConfig::links`](crate::WireupConfig::links)).
    pub failovers: u64,
    /// Of those, the ones this side started because the primary's kernel timer
    /// (retransmissions or probes) kept firing with a standby link open: a path gone without an error (an interface
    /// down), found within about a second rather than at `TCP_USER_TIMEOUT`.
    pub stalls: u64,
    /// Times a peer's stream started to go in runs over several links at once: its
    /// primary's send was busy and a link's idle, so the link took the next messages
    /// (once per stream and failover at most).
    pub spread_streams: u64,
    /// Frames of peers' streams read on links beyond their first connection.
    pub run_frames_in: u64,
    /// Frames larger than the receive cache that a connection read whole, ahead, while
    /// it waited for the stream to reach its run (so that its sender did not wait).
    pub read_ahead: u64,
    /// Messages that arrived cut into pieces spread over links (their sender had a
    /// second link open), assembled in place and handed out whole.
    pub parts_assembled: u64,
    /// Large messages after whose send this side's socket was set to acknowledge at once
    /// (`TCP_QUICKACK`, see
    /// [`SocketConfig::paced_quick_ack`](crate::SocketConfig::paced_quick_ack)), so that
    /// the first segment of the peer's answer is acknowledged as it arrives and a pacing
    /// peer's bandwidth estimate sees how fast it came.
    pub quick_acks: u64,
}

type Handler = Box<dyn FnMut(&mut Transport, &Am<'_>)>;
type CompletionFn = Box<dyn FnMut(Completion)>;
type ErrorFn = Box<dyn FnMut(PeerId, &FailReason)>;
type ResolverFn = Box<dyn FnMut(&mut Transport, PeerId) -> bool>;

/// A TCP transport for one process: it owns every socket, drives the protocol and
/// dispatches active messages. Single-threaded: the thread that calls
/// [`progress`](Self::progress) runs every handler and callback.
pub struct Transport {
    backend: AnyBackend,
    core: Core,
    handlers: AmTable<Handler>,
    on_complete: Option<CompletionFn>,
    on_error: Option<ErrorFn>,
    /// Asked about a peer that claims a process id never added (lazy add).
    resolver: Option<ResolverFn>,
    /// Bumped by every change of `resolver`, so that a change made by the resolver
    /// itself is not undone when it is put back after its call.
    resolver_gen: u32,
    events: Vec<Event>,
    /// Events collected by [`flush`](Transport::flush) that it may not handle (anything but
    /// a finished send, and any event of a connection with an earlier one waiting here):
    /// the next pass handles them first, in their order.
    stash: VecDeque<Event>,
    /// `flush`'s own event buffer (it may run inside a pass, which holds `events`).
    flush_events: Vec<Event>,
    local: SocketAddr,
    /// The addresses published by [`uris`](Self::uris).
    published: Vec<SocketAddr>,
    /// The selected local interfaces (`listen: None`), used to route to peers.
    ifaces: Option<Vec<Interface>>,
    cfg: Config,
    dispatching: u32,
    /// Buffers of held links to walk again ([`Action::Walk`]) that came up while a handler
    /// ran (its `flush`): walked once no handler runs, since a walk calls handlers.
    walks: Vec<(ConnKey, RxBuf)>,
    accept_errors: u64,
    /// Successful `TCP_QUICKACK` calls ([`Stats::quick_acks`]).
    quick_acks: u64,
    backend_note: Option<String>,
    last_now: Instant,
    idle_passes: u32,
    /// The sockets' options as the backend applies them: which connections are paced.
    sock: SockOpts,
    /// `RINGBTL_AUTH` was applied to the key in force (at the first peer added).
    auth_checked: bool,
    /// The backend's verdict on lending, as last told to the engine.
    lend_wanted: bool,
}

/// Idle progress passes between two clock reads for the engine's timers.
const TIMER_SPIN: u32 = 256;

/// A transport walking a read of a connection's own cache ([`core::walk_read`]): the
/// messages go to its handlers. (Not `Sink` for `Transport` itself, which would hand its
/// engine to anyone.)
struct Reader<'a>(&'a mut Transport);

impl Sink for Reader<'_> {
    #[inline]
    fn core(&mut self) -> &mut Core {
        &mut self.0.core
    }

    #[inline]
    fn deliver(&mut self, peer: PeerId, tag: Tag, payload: &[u8]) {
        self.0.dispatch(peer, tag, payload);
    }

    /// A run's messages, the handler looked up once for a series of one tag: it stays out
    /// of its slot between the series' calls, and goes back after the series or as soon
    /// as a call registered or removed any handler ([`AmTable::changes`]).
    #[inline]
    fn deliver_run(&mut self, run: &mut core::Run<'_>) {
        let t = &mut *self.0;
        let src = run.peer();
        let mut next = run.next(&t.core);
        while let Some((tag, mut payload)) = next {
            let Some(mut h) = t.take_handler(src, tag) else {
                next = run.next(&t.core);
                continue;
            };
            let changes = t.handlers.changes();
            // Inside a handler for the whole series (as `call` counts one call): no code
            // of the application runs between its calls.
            t.dispatching += 1;
            loop {
                h(t, &Am { src, tag, payload });
                next = run.next(&t.core);
                match next {
                    Some((same, p)) if same == tag && t.handlers.changes() == changes => {
                        payload = p;
                    }
                    _ => break,
                }
            }
            t.dispatching -= 1;
            t.handlers.restore(tag, h);
        }
    }

    /// The next read starts here, not at the end of the pass through the engine's queue
    /// of actions.
    #[inline]
    fn rearm(&mut self, conn: ConnKey, rx: RxBuf) {
        if let Some(rx) = self.0.core.rearm_now(conn, rx) {
            self.0.backend.recv(conn_id(conn), rx);
        }
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("pid", &self.cfg.core.pid)
            .field("backend", &self.backend.name())
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Creates the backend (probing io_uring when `cfg.backend` is `Auto`) and listens.
    pub fn new(mut cfg: Config) -> Result<Self, Error> {
        cfg.validate()?;
        if cfg.core.job_key.is_none() {
            if let Some(path) = &cfg.core.job_key_file {
                cfg.core.job_key = Some(JobKey::from_file(path)?);
            }
        }
        if let Congestion::Use(name) = &cfg.socket.tcp_congestion {
            sys::check_congestion(name).map_err(|e| {
                let list = |k: &str| {
                    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{k}"))
                        .map(|s| s.trim().to_string())
                        .unwrap_or_else(|_| "?".into())
                };
                Error::Config(format!(
                    "tcp_congestion {name:?} (RINGBTL_TCP_CONGESTION): {e}; available: {}; \
                     allowed without CAP_NET_ADMIN: {}",
                    list("tcp_available_congestion_control"),
                    list("tcp_allowed_congestion_control")
                ))
            })?;
        }
        let sock = cfg.socket.sock_opts();
        let (mut backend, mut backend_note) =
            crate::reactor::make_backend(cfg.socket.backend, sock.clone())
                .map_err(Error::NoBackend)?;
        let mut multishot = false;
        if cfg.socket.recv_multishot {
            let geo = RingGeometry {
                count: cfg.socket.recv_ring_bufs as u16,
                size: cfg.socket.recv_ring_buf_size as u32,
            };
            match backend.provided().map(|p| p.provide_buffers(geo)) {
                Some(Ok(())) => multishot = true,
                // This backend has no provided buffers: receives stay single-shot.
                None => {}
                Some(Err(e)) => {
                    let note = format!("multishot receive unavailable ({e}): single-shot receives");
                    tracing::warn!("{note}");
                    backend_note = Some(note);
                }
            }
        }
        let (local, published, ifaces) = match cfg.wireup.listen {
            Some(addr) => {
                let local = backend.listen(addr).map_err(|e| Error::io("listen", e))?;
                (local, vec![local], None)
            }
            None => {
                let ifs = ifaces::select_local(&cfg.if_selection()?)?;
                let port = backend
                    .listen_wildcard(ifs.iter().map(|i| i.addr), cfg.wireup.ports)
                    .map_err(|e| listen_error(e, cfg.wireup.ports))?;
                let mut published: Vec<SocketAddr> = Vec::new();
                for i in &ifs {
                    let a = SocketAddr::new(i.addr, port);
                    if !published.contains(&a) {
                        published.push(a);
                    }
                }
                (published[0], published, Some(ifs))
            }
        };
        // Strangers may hold at most half of the descriptors the process may open, so
        // that a flood of idle connections meets the admission limits before the
        // descriptor limit: newcomers then evict the oldest strangers and accepting goes
        // on, instead of pausing while a legitimate peer waits behind the flood.
        if let Some(cap) = sys::nofile_limit().map(half_open_cap) {
            if cap < cfg.core.max_half_open {
                tracing::debug!(
                    "max_half_open {} lowered to {cap}: half of the descriptor limit",
                    cfg.core.max_half_open
                );
                cfg.core.max_half_open = cap;
                cfg.core.max_half_open_per_source =
                    cfg.core.max_half_open_per_source.min((cap / 4).max(1));
            }
        }
        let core = Core::new(CoreConfig {
            multishot,
            ..cfg.core.clone()
        });
        Ok(Self {
            backend,
            core,
            handlers: AmTable::new(),
            on_complete: None,
            on_error: None,
            resolver: None,
            resolver_gen: 0,
            events: Vec::with_capacity(256),
            stash: VecDeque::with_capacity(256),
            flush_events: Vec::with_capacity(256),
            local,
            published,
            ifaces,
            cfg,
            dispatching: 0,
            walks: Vec::new(),
            accept_errors: 0,
            quick_acks: 0,
            backend_note,
            last_now: Instant::now(),
            idle_passes: 0,
            sock,
            auth_checked: false,
            lend_wanted: true,
        })
    }

    /// Sets the job key every later handshake proves (the one the launcher provides,
    /// [`Modex::job_key`](crate::wireup::Modex::job_key), known after the address
    /// exchange); it replaces a configured one. Call it before adding peers and before
    /// the first [`progress`](Self::progress) after the exchange, so that no handshake
    /// runs with another key.
    pub fn set_job_key(&mut self, key: JobKey) {
        self.core.set_job_key(key.clone());
        self.cfg.core.job_key = Some(key);
    }

    /// True when connections are authenticated: a job key is in force (else the handshake
    /// runs with the public key).
    pub fn authenticated(&self) -> bool {
        self.core.authenticated()
    }

    /// Applies `RINGBTL_AUTH` once, when the first peer is added (by then the launcher's
    /// key, if any, was set): `required` without a key is an error, `auto` says once on
    /// stderr that connections are unauthenticated.
    fn check_auth(&mut self) -> Result<(), Error> {
        if !self.auth_checked {
            self.cfg.core.auth.check(self.cfg.core.job_key.as_ref())?;
            self.auth_checked = true;
        }
        Ok(())
    }

    /// The address this transport listens on (with `listen: None`, the first published
    /// address: a selected interface's address with the listen port).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The addresses peers can reach this transport at, as a `tcp://` URI list
    /// (`tcp://10.1.0.5:40123;tcp://[fd00::5]:40123`), for the address exchange.
    pub fn uris(&self) -> String {
        uri::format_uri_list(&self.published)
    }

    /// The local interfaces selected at start-up (`listen: None`), else `None`.
    pub fn interfaces(&self) -> Option<&[Interface]> {
        self.ifaces.as_deref()
    }

    /// This process's id.
    pub fn local_id(&self) -> PeerId {
        self.cfg.core.pid
    }

    /// The backend in use: `"uring"` or `"epoll"`.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Readies the transport to be waited for outside it, by a thread that then calls
    /// [`progress`](Self::progress) (every call on the transport serialized): returns a
    /// descriptor that polls readable (`poll(2)`, `POLLIN`) once the transport has
    /// something to collect (its epoll instance, or an eventfd its io_uring ring signals), or
    /// `None` when it
    /// has something already (progress now). Call it right after a pass, before each
    /// wait. The transport's own timers (handshake and stall deadlines, retries) are not
    /// on the descriptor: wait with a timeout. Never close the descriptor.
    pub fn prepare_wait(&mut self) -> Result<Option<std::os::fd::RawFd>, Error> {
        if self.dispatching > 0 {
            return Err(Error::Reentrant("prepare_wait"));
        }
        self.backend
            .prepare_wait()
            .map_err(|e| Error::io("prepare_wait", e))
    }

    /// The backend's set-up in force (ring flags, readiness mode).
    pub fn backend_detail(&self) -> String {
        self.backend.describe()
    }

    /// Why `Auto` did not pick io_uring, when it fell back to epoll.
    pub fn backend_note(&self) -> Option<&str> {
        self.backend_note.as_deref()
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// State of the endpoint for `peer` (`None` for an unknown peer).
    pub fn peer_state(&self, peer: PeerId) -> Option<EndpointState> {
        self.core.state(peer)
    }

    /// Registers the handler for `tag`. The handler gets the transport (it may `send`,
    /// for example a reply, but not `progress`) and the message, whose payload is only
    /// valid during the call.
    pub fn register<F>(&mut self, tag: Tag, f: F) -> Result<(), Error>
    where
        F: FnMut(&mut Transport, &Am<'_>) + 'static,
    {
        self.handlers
            .register(tag, Box::new(f))
            .map_err(|_| Error::TagInUse(tag))
    }

    /// Removes the handler for `tag`; returns whether there was one. A handler may
    /// remove itself while it runs: it is then not put back after the call.
    pub fn unregister(&mut self, tag: Tag) -> bool {
        self.handlers.remove(tag)
    }

    /// Sets the callback that hears every send completion (once per accepted send).
    pub fn on_complete<F: FnMut(Completion) + 'static>(&mut self, f: F) {
        self.on_complete = Some(Box::new(f));
    }

    /// Sets the callback that hears when a peer becomes unreachable (once per peer).
    pub fn on_error<F: FnMut(PeerId, &FailReason) + 'static>(&mut self, f: F) {
        self.on_error = Some(Box::new(f));
    }

    /// Sets the resolver of unknown peers (lazy add). When a process connects and
    /// claims a process id that was never added (with [`add_peer`](Self::add_peer) or
    /// [`add_peer_uris`](Self::add_peer_uris)), the transport calls `f(self, id)` from
    /// its progress pass, instead of refusing the connection at once. The resolver may
    /// add the peer (for example from the job's address exchange) and returns `true` to
    /// accept the connection, or `false` to refuse it (`REJECT(UnknownPeer)`, as without
    /// a resolver). Accepting a peer that it did not add refuses too.
    ///
    /// The resolver is asked only once the connection's handshake has passed every
    /// other check (protocol version, job token, and the peer's authentication when the
    /// transport authenticates); the connection waits for the answer within the handshake
    /// deadline. Inside the call, `send` and the peer calls work; `progress` and `wait`
    /// return [`Error::Reentrant`].
    pub fn on_unknown_peer<F>(&mut self, f: F)
    where
        F: FnMut(&mut Transport, PeerId) -> bool + 'static,
    {
        self.resolver = Some(Box::new(f));
        self.resolver_gen = self.resolver_gen.wrapping_add(1);
        self.core.ask_unknown(true);
    }

    /// Removes the resolver of unknown peers: a process id never added is refused again.
    pub fn clear_unknown_peer(&mut self) {
        self.resolver = None;
        self.resolver_gen = self.resolver_gen.wrapping_add(1);
        self.core.ask_unknown(false);
    }

    /// Queues an active message of the concatenated `segs` (at most
    /// [`MAX_SEGMENTS`](crate::proto::core::MAX_SEGMENTS), not copied unless small) for
    /// `peer`. Accepted sends complete exactly once through the completion callback with
    /// `cookie`; frames to one peer arrive in the order they were sent.
    #[inline]
    pub fn send(
        &mut self,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
    ) -> Result<(), SendError> {
        // A stream's small message behind another one in this pass: a few checks and a
        // copy into the batch, inlined into the caller's loop (`Core::gather_small`).
        if self.core.gather_small(peer, tag, segs, cookie) {
            return Ok(());
        }
        self.send_placed(peer, tag, segs, cookie)
    }

    /// [`send`](Self::send) of a message that `Core::gather_small` did not take: the first
    /// since the last flush (which may leave at once), a large one, or one the engine
    /// queues or refuses.
    #[inline(never)]
    fn send_placed(
        &mut self,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
    ) -> Result<(), SendError> {
        // The engine reads `now` only to arm timers, which a send does not do: the time
        // of the last pass is precise enough and saves a clock read per message. A small
        // message in a ping-pong is written from here (`Core::send_with`).
        let backend = &mut self.backend;
        self.core
            .send_with(self.last_now, peer, tag, segs, cookie, |k, frame| {
                backend.write_now(conn_id(k), &[frame])
            })?;
        if self.core.has_direct() {
            self.write_direct();
        }
        Ok(())
    }

    /// A ping-pong's message leaves now, before the rest of the caller's pass (see
    /// [`Stats::written_at_once`]).
    #[inline(never)]
    fn write_direct(&mut self) {
        let mut pieces: [&[u8]; DIRECT_PIECES] = [&[]; DIRECT_PIECES];
        if let Some((k, n)) = self.core.direct_pieces(&mut pieces) {
            let w = self.backend.write_now(conn_id(k), &pieces[..n]);
            self.core.direct_written(k, w);
        }
    }

    /// Queues a put of the concatenated `segs` for `peer`: the bytes go straight into the
    /// memory of a region that `peer` registered ([`register_region`](Self::register_region))
    /// and told us about out of band, at `target.addr`, and no handler runs there. The
    /// peer checks the whole write against its region and treats a write outside it as
    /// a protocol error on the connection. Completion, errors, would-block and ordering
    /// are those of [`send`](Self::send): a message sent after a put reaches the peer
    /// after the put's data is in place, which is how the peer learns it. While a second
    /// link to `peer` is open, a put of more than 1 MiB goes as pieces of 1 MiB that
    /// spread over the links (one completion still); the peer checks each piece, so
    /// pieces inside a region may be in place before one outside it fails the connection.
    #[inline]
    pub fn put(
        &mut self,
        peer: PeerId,
        target: PutTarget,
        segs: &[Bytes],
        cookie: u64,
    ) -> Result<(), SendError> {
        self.core.put(peer, target, segs, cookie)
    }

    /// Queues a get from `peer`: `len` bytes of a region `peer` registered as readable,
    /// at `from` (its key and an address inside it, which `peer` told us out of band),
    /// are written at `to` in a region of ours, straight from the socket. The get
    /// completes with `cookie`, as a send does, once every byte is in place, or fails when
    /// the peer does (also when the peer finds `from` outside its readable regions, which
    /// it treats as a protocol error). Refused with [`SendError::Region`] when `to` does not
    /// lie inside a region of ours (then nothing is sent), and with
    /// [`SendError::WouldBlock`] while the gets in progress to `peer` already ask for
    /// `RINGBTL_MAX_QUEUED_BYTES`. A message sent after a get leaves after the get's
    /// request, but the get completes after the peer answered it.
    #[inline]
    pub fn get(
        &mut self,
        peer: PeerId,
        from: PutTarget,
        len: u32,
        to: PutTarget,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.core.get(peer, from, len, to, cookie)
    }

    /// Registers `len` bytes at `base` as memory that peers may [`put`](Self::put) into
    /// (and, with [`RegionAccess::ReadWrite`](crate::RegionAccess::ReadWrite), read with
    /// [`get`](Self::get)), and returns the key they name it by (the region's owner hands
    /// it to them, with addresses inside the region, through its own messages). The
    /// replies of our own gets land in regions too: any access allows them.
    ///
    /// # Safety
    ///
    /// Until [`deregister_region`](Self::deregister_region) returns `Ok` for the key (or
    /// the transport is dropped), the memory must stay valid for writes and must not be
    /// read or written by anyone else while a put may land in it, nor written while a get
    /// may read it: the kernel writes into it (and reads from it) during this transport's
    /// progress calls (and, with io_uring, between them while a receive or send is in
    /// flight).
    #[allow(unsafe_code)]
    pub unsafe fn register_region(
        &mut self,
        base: NonNull<u8>,
        len: usize,
        access: crate::RegionAccess,
    ) -> u64 {
        // SAFETY: the caller's contract is `Regions::register`'s, word for word.
        unsafe { self.core.regions_mut().register(base, len, access) }
    }

    /// Takes a registered region back. Refused with [`RegionError::InUse`] while a
    /// peer's put (or our get's reply) is being received into it, or the reply to a
    /// peer's get still reads it: the memory stays the transport's until a later call
    /// succeeds (a progress call in between lets the transfer finish, or the connection
    /// fail).
    pub fn deregister_region(&mut self, key: u64) -> Result<(), RegionError> {
        self.core.regions_mut().deregister(key)
    }

    /// One non-blocking pass: submit what is queued, reap what completed, dispatch.
    /// Returns the number of reactor events handled.
    #[inline]
    pub fn progress(&mut self) -> Result<usize, Error> {
        if self.dispatching > 0 {
            return Err(Error::Reentrant("progress"));
        }
        self.pass(None)
    }

    /// Hands every send queued so far to the kernel now, without reaping completions or
    /// running any handler or callback (those wait for the next [`progress`](Self::progress)).
    ///
    /// `send` only queues, so that the frames queued during one pass leave together in one
    /// gathered send per peer; a program that queues a message and then blocks outside
    /// the transport (in a launcher's barrier, say) calls this first so that the message
    /// is on the wire meanwhile. It costs one system call on io_uring (none when nothing
    /// is queued); on epoll `send` has already written what the socket took. Allowed inside
    /// handlers and callbacks.
    pub fn flush(&mut self) -> Result<(), Error> {
        if self.core.flush() {
            // Frames wait behind a batch in flight (one per connection): it may be back by
            // now, and then they can leave too.
            self.reap_sent()?;
        }
        self.settle();
        self.backend.submit().map_err(|e| Error::io("submit", e))
    }

    /// Collects what completed without running a handler or callback and without trying
    /// any receive: finished sends are handed to the engine (their completions are
    /// reported at the next pass); every other event is stashed for the next pass, as is a
    /// finished send behind a stashed event of its connection, so that each connection's
    /// events keep their order.
    fn reap_sent(&mut self) -> Result<(), Error> {
        let mut evs = mem::take(&mut self.flush_events);
        let r = self.backend.collect(&mut evs);
        if !evs.is_empty() {
            let now = Instant::now();
            self.last_now = now;
            for ev in evs.drain(..) {
                match ev {
                    Event::Sent { conn, .. }
                        if !self.stash.iter().any(|e| event_conn(e) == Some(conn)) =>
                    {
                        self.handle_event(now, ev)
                    }
                    ev => self.stash.push_back(ev),
                }
            }
        }
        self.flush_events = evs;
        r.map_err(|e| Error::io("collect", e))
    }

    /// Like [`progress`](Self::progress) but waits in the kernel up to `timeout` when
    /// nothing is ready.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, Error> {
        if self.dispatching > 0 {
            return Err(Error::Reentrant("wait"));
        }
        let timeout = match self.core.poll_timeout() {
            Some(t) => timeout.min(t.saturating_duration_since(Instant::now())),
            None => timeout,
        };
        self.pass(Some(timeout))
    }

    /// Drives progress until `done(self)` holds (returns `Ok(true)`) or `deadline` passes
    /// (`Ok(false)`), waiting as [`Config::progress`] says; `done` is checked before the
    /// first pass and after each one.
    ///
    /// - [`Poll`](crate::ProgressMode::Poll): [`progress`](Self::progress) back to back.
    /// - [`Block`](crate::ProgressMode::Block): [`wait`](Self::wait) until the deadline,
    ///   in the kernel.
    /// - [`SpinThenBlock(d)`](crate::ProgressMode::SpinThenBlock): `progress` while the
    ///   last pass that handled an event (or the call) is less than `d` ago, then one
    ///   `wait`, then spin again.
    ///
    /// The policy is above the reactor: every backend behaves the same. A program with
    /// its own loop composes it the same way from `progress` (non-blocking) and `wait`
    /// (blocking).
    pub fn wait_until<F>(&mut self, deadline: Instant, mut done: F) -> Result<bool, Error>
    where
        F: FnMut(&Transport) -> bool,
    {
        use crate::config::ProgressMode;
        /// Passes between two clock reads while spinning.
        const PASSES_PER_CLOCK: u32 = 16;
        if self.dispatching > 0 {
            return Err(Error::Reentrant("wait_until"));
        }
        let spin = match self.cfg.progress {
            ProgressMode::Poll => None,
            ProgressMode::Block => Some(Duration::ZERO),
            ProgressMode::SpinThenBlock(d) => Some(d),
        };
        // Poll mode needs the clock only for the deadline: start from the time of the last
        // pass that handled events (never later than now) and read it every few passes.
        let mut now = match spin {
            None => self.last_now,
            Some(_) => Instant::now(),
        };
        let mut spin_end = spin.map(|d| now + d);
        let mut passes = 0u32;
        loop {
            if done(self) {
                return Ok(true);
            }
            if now >= deadline {
                return Ok(false);
            }
            match spin_end {
                Some(end) if now >= end => {
                    self.wait(deadline - now)?;
                    now = Instant::now();
                    spin_end = spin.map(|d| now + d);
                }
                _ => {
                    let n = self.pass(None)?;
                    passes = passes.wrapping_add(1);
                    if n > 0 {
                        // The pass read the clock before handling its events: no second
                        // read between the events and `done` (a reply's critical path).
                        now = self.last_now;
                        spin_end = spin.map(|d| now + d);
                    } else if passes.is_multiple_of(PASSES_PER_CLOCK) {
                        now = Instant::now();
                    }
                }
            }
        }
    }

    /// Sends FIN to every connected peer, waits (up to `timeout`) for their FINs and for
    /// every socket to close, then abandons whatever is left (pending sends complete with
    /// [`FailReason::Shutdown`]). Sends are refused from the first call on. Every send
    /// accepted before has completed when this returns; only a send whose batch the kernel
    /// still held at the deadline completes while the kernel may read its bytes.
    pub fn shutdown(&mut self, timeout: Duration) -> Result<(), Error> {
        if self.dispatching > 0 {
            return Err(Error::Reentrant("shutdown"));
        }
        let deadline = Instant::now() + timeout;
        self.core.shutdown();
        while !self.core.is_quiescent() || self.core.orphaned() > 0 {
            let now = Instant::now();
            if now >= deadline {
                self.core.abort_all();
                break;
            }
            self.pass(Some((deadline - now).min(Duration::from_millis(10))))?;
        }
        // Let the closes go through so the sockets are gone when this returns.
        self.pass(None)?;
        self.pass(Some(Duration::from_millis(1)))?;
        if self.core.orphaned() > 0 {
            // Batches still in the kernel past the deadline: their sends complete now
            // (the reactor leaks those batches rather than free them under the kernel).
            self.core.release_orphans();
            self.deliver_core_events();
        }
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        let c = self.core.counters();
        let k = self.backend.counters();
        Stats {
            unknown_tag: self.handlers.unknown(),
            bad_magic: c.bad_magic,
            refused: c.refused,
            auth_failed: c.auth_failed,
            simultaneous: c.simultaneous,
            connect_retries: c.connect_retries,
            accept_errors: self.accept_errors,
            accept_overload: c.accept_overload,
            abandoned_handshakes: c.abandoned_handshakes,
            zerocopy_sends: k.zerocopy_sends,
            zerocopy_copied: k.zerocopy_copied,
            spliced_bytes: k.spliced_bytes,
            lend_pipes: k.lend_pipes,
            lend_pipes_open: k.lend_pipes_open,
            lend_cost_ps: k.lend.lend_ps,
            copy_cost_ps: k.lend.copy_ps,
            send_calls_timed: k.lend.samples,
            lending: k.lend.lending,
            batches: c.batches,
            frames: c.frames,
            send_calls: k.send_calls,
            recv_starved: k.recv_starved,
            recv_direct: c.recv_direct,
            puts_placed: c.puts_placed,
            gets_answered: c.gets_answered,
            gets_completed: c.gets_completed,
            written_at_once: c.written_at_once,
            idle_copies: c.idle_copies,
            links_joined: c.links_joined,
            links_lost: c.links_lost,
            failovers: c.failovers,
            stalls: c.stalls,
            spread_streams: c.spread_streams,
            run_frames_in: c.run_frames_in,
            read_ahead: c.read_ahead,
            parts_assembled: c.parts_assembled,
            quick_acks: self.quick_acks,
        }
    }

    /// Test hook: holds (`hold`) or resumes the reading of `peer`'s connection. While
    /// held, nothing of it is delivered and no read is armed on it (its bytes wait in the
    /// socket); the resume walks what was read before the hold, then reads again. False
    /// when nothing is held: no connection, or the multishot receive, which holds none.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn hold_reading(&mut self, peer: PeerId, hold: bool) -> bool {
        let held = self.core.hold_primary(peer, hold);
        self.settle();
        held
    }

    /// Connections open to `peer`: its first and its links (0 when not connected).
    pub fn links_open(&self, peer: PeerId) -> usize {
        self.core.links_open(peer)
    }

    /// Number of sends to `peer` accepted and not yet completed.
    pub fn pending(&self, peer: PeerId) -> usize {
        self.core.pending(peer)
    }

    // ----- the progress pass -----------------------------------------------------------

    fn pass(&mut self, timeout: Option<Duration>) -> Result<usize, Error> {
        if self.cfg.core.splice_judged {
            self.judge_lending();
        }
        let stashed = self.stash.len();
        if stashed > 0 {
            // Older than anything the backend has now: handled first.
            let now = Instant::now();
            self.last_now = now;
            while let Some(ev) = self.stash.pop_front() {
                self.handle_event(now, ev);
            }
        }
        self.settle();
        let mut evs = mem::take(&mut self.events);
        // Stashed events count as work: no sleep in the kernel after handling them.
        let timeout = if stashed > 0 { None } else { timeout };
        let r = self.backend.poll(timeout, &mut evs);
        let n = evs.len() + stashed;
        if n > 0 {
            let now = Instant::now();
            self.last_now = now;
            for ev in evs.drain(..) {
                self.handle_event(now, ev);
            }
        }
        self.events = evs;
        r.map_err(|e| Error::io("poll", e))?;
        // Timers are coarse (retries, handshake limits): read the clock when something
        // happened, or once every TIMER_SPIN idle passes, not on every spin.
        if self.core.poll_timeout().is_some() {
            self.idle_passes = self.idle_passes.wrapping_add(1);
            if n > 0 || self.idle_passes.is_multiple_of(TIMER_SPIN) {
                let now = if n > 0 { self.last_now } else { Instant::now() };
                if self.core.poll_timeout().is_some_and(|t| t <= now) {
                    self.core.handle_timeout(now);
                }
            }
        }
        // Replies queued by handlers leave now, gathered per connection.
        self.settle();
        self.deliver_core_events();
        Ok(n)
    }

    /// Tells the engine whether payloads may be lent now, when the backend's measure of
    /// its send calls changed its mind (see `reactor::lend`).
    #[inline]
    fn judge_lending(&mut self) {
        let w = self.backend.lend_wanted();
        if w != self.lend_wanted {
            self.lend_wanted = w;
            self.core.set_lend_judged(w);
        }
    }

    fn handle_event(&mut self, now: Instant, ev: Event) {
        match ev {
            Event::Accepted { conn, peer } => {
                tracing::debug!("accepted a connection from {peer}");
                self.core.handle_accepted_from(now, key(conn), peer.ip());
                self.set_socket_traits(key(conn), &peer);
            }
            Event::AcceptError(e) => {
                self.accept_errors += 1;
                // Out of descriptors: the oldest stranger makes room, so that the backend's
                // pause ends as its descriptor closes.
                if AcceptBackoff::is_exhaustion(&e) && self.core.handle_accept_exhausted() {
                    tracing::debug!("accept failed ({e}): closed the oldest stranger");
                } else {
                    tracing::warn!("accept failed: {e}");
                }
            }
            Event::Connected { conn, result } => {
                let result = result.map_err(|e| Errno::of(&e));
                self.core.handle_connected(now, key(conn), result);
            }
            Event::Sent {
                conn,
                batch,
                result,
            } => {
                let result = result.map_err(|e| match Errno::of(&e) {
                    // The kernel reports a timer's abort (ETIMEDOUT) to one operation
                    // only; a send after it sees a plain EPIPE. The socket tells which.
                    Errno::EPIPE => self
                        .backend
                        .end_cause(conn)
                        .map_or(Errno::EPIPE, |c| Errno::of(&c)),
                    errno => errno,
                });
                // A large message its peer waited for left: the answer is acknowledged at
                // once.
                if self.core.handle_sent(now, key(conn), batch, result) {
                    self.quick_ack(key(conn));
                }
            }
            Event::Recv { conn, rx, result } => match result {
                Ok(0) => {
                    // A connection the kernel aborted may show only as end of stream:
                    // ask the socket for the cause.
                    let cause = self.backend.end_cause(conn).map(|e| Errno::of(&e));
                    self.core.handle_recv_end(now, key(conn), cause)
                }
                Ok(_) => self.on_recv(now, key(conn), rx),
                Err(e) => self
                    .core
                    .handle_recv_end(now, key(conn), Some(Errno::of(&e))),
            },
            Event::RecvProvided { conn, data, result } => match (data, result) {
                (Some(buf), Ok(_)) => self.on_recv_provided(now, key(conn), buf),
                (_, Ok(_)) => self.core.handle_recv_end(now, key(conn), None),
                (_, Err(e)) => self
                    .core
                    .handle_recv_end(now, key(conn), Some(Errno::of(&e))),
            },
            Event::ProvidedPaused { conn } => self.core.handle_provided_paused(key(conn)),
            Event::Closed { conn } => self.core.handle_closed(key(conn)),
        }
    }

    /// Parses a provided buffer in place: whole frames are dispatched from it, a frame cut
    /// at its end is reassembled in the connection's cache. The buffer goes back to the
    /// ring right after.
    fn on_recv_provided(&mut self, now: Instant, k: ConnKey, buf: ProvidedBuf) {
        if let Some(mut rx) = self.core.input_begin(k) {
            let input = buf.bytes();
            let mut at = 0;
            loop {
                match self.core.input_step(now, k, &mut rx, input, &mut at) {
                    InputStep::Deliver { peer, tag, src } => {
                        let payload = match src {
                            Source::Input(r) => &input[r],
                            Source::Cache(r) => rx.bytes(r),
                        };
                        self.dispatch(peer, tag, payload);
                    }
                    InputStep::Done => {
                        self.core.input_done(k, rx);
                        break;
                    }
                    InputStep::Drop => break,
                }
            }
        }
        self.recycle(buf);
    }

    fn on_recv(&mut self, now: Instant, k: ConnKey, rx: RxBuf) {
        core::walk_read(&mut Reader(self), now, k, rx);
    }

    fn dispatch(&mut self, src: PeerId, tag: Tag, payload: &[u8]) {
        // The handler is moved out for the call so it can borrow the transport mutably.
        let Some(mut h) = self.take_handler(src, tag) else {
            return;
        };
        self.call(&mut h, &Am { src, tag, payload });
        // Put back unless the call removed it or registered another one for the tag.
        self.handlers.restore(tag, h);
    }

    /// The handler of `tag`, out of its slot for calls; `None` (the message from `src`
    /// dropped, and counted) when the tag has none.
    #[inline]
    fn take_handler(&mut self, src: PeerId, tag: Tag) -> Option<Handler> {
        let h = self.handlers.take(tag);
        if h.is_none() {
            unregistered(src, tag);
        }
        h
    }

    /// Calls a handler taken from its slot for `am`.
    #[inline]
    fn call(&mut self, h: &mut Handler, am: &Am<'_>) {
        self.dispatching += 1;
        h(self, am);
        self.dispatching -= 1;
    }

    /// Moves queued frames into batches and performs what the engine decided, until
    /// nothing is left to do: a buffer walked here ([`Action::Walk`], a held link read
    /// again) may owe a count or queue frames, which leave in this pass too.
    #[inline]
    fn settle(&mut self) {
        loop {
            self.core.flush();
            if self.dispatching == 0 && !self.walks.is_empty() {
                for (k, buf) in mem::take(&mut self.walks) {
                    self.on_recv(Instant::now(), k, buf);
                }
                continue;
            }
            if !self.core.has_actions() {
                return;
            }
            self.run_actions_now();
        }
    }

    /// Performs what the engine decided. The engine owns every decision (including
    /// when a large payload bypasses the provided buffers) and at most one send per
    /// connection is ever handed out; this only forwards.
    fn run_actions_now(&mut self) {
        while let Some(a) = self.core.poll_action() {
            match a {
                Action::Transmit { conn, batch } => self.backend.send(conn_id(conn), batch),
                Action::Receive { conn, buf } => self.backend.recv(conn_id(conn), buf),
                Action::Walk { conn, buf } if self.dispatching > 0 => self.walks.push((conn, buf)),
                Action::Walk { conn, buf } => self.on_recv(Instant::now(), conn, buf),
                Action::ArmProvided(k) => self.arm_provided(k),
                Action::PauseProvided(k) => self.pause_provided(k),
                Action::Close(k) => self.backend.close(conn_id(k)),
                Action::Reset(k) => self.backend.reset(conn_id(k)),
                Action::Probe(k) => {
                    let fd = self.backend.open_fd(conn_id(k));
                    let n = fd.and_then(sys::unanswered_timeouts).unwrap_or(0);
                    self.core.probed(Instant::now(), k, n);
                }
                Action::Dial {
                    peer,
                    link,
                    addr,
                    bind,
                } => match self.backend.connect(addr, bind) {
                    Ok(c) => {
                        self.core.dial_started(peer, link, key(c));
                        self.set_socket_traits(key(c), &addr);
                    }
                    Err(e) => self
                        .core
                        .dial_failed(Instant::now(), peer, link, Errno::of(&e)),
                },
            }
        }
    }

    /// Tells the engine what the options of the socket of `k`, a connection to `peer`,
    /// mean for it: which large payloads it lends (`SocketConfig::paced_copy_chunk`),
    /// which of those that find their peer idle it copies (where its congestion control
    /// paces, towards another host), and whether the answers to such copies are
    /// acknowledged at once
    /// ([`SocketConfig::paced_quick_ack`](crate::SocketConfig::paced_quick_ack)).
    fn set_socket_traits(&mut self, k: ConnKey, peer: &SocketAddr) {
        let paced = self.sock.paced_for(peer);
        let loopback = peer.ip().is_loopback();
        let quick_ack = self.sock.paced_quick_ack && paced;
        let copy_streams = self.sock.paced_copy_chunk.is_some();
        self.core
            .set_idle_copy(k, IdleCopy::for_path(paced, loopback, quick_ack));
        self.core
            .set_lending(k, Lending::for_path(paced, loopback, copy_streams));
        self.core.set_quick_ack(k, quick_ack);
    }

    /// Puts the socket of `k` in quick-ACK mode (`TCP_QUICKACK`), as the engine asked
    /// ([`Core::handle_sent`]): what it holds unacknowledged is acknowledged now, and
    /// the next segments as they arrive, until the kernel's delayed ACKs come back (when
    /// this side sends soon after receiving). Best effort: a failure (the socket just
    /// closed, say) leaves the delayed ACKs.
    fn quick_ack(&mut self, k: ConnKey) {
        let Some(fd) = self.backend.open_fd(conn_id(k)) else {
            return;
        };
        match sys::quick_ack(fd) {
            Ok(()) => self.quick_acks += 1,
            Err(e) => tracing::debug!("TCP_QUICKACK failed: {e}"),
        }
    }

    // ----- provided-buffer receive (the backend's multishot extension) -------------------

    fn arm_provided(&mut self, k: ConnKey) {
        let armed = self
            .backend
            .provided()
            .is_some_and(|p| p.recv_provided(conn_id(k)));
        debug_assert!(
            armed,
            "multishot asked of a backend without provided buffers"
        );
    }

    fn pause_provided(&mut self, k: ConnKey) {
        if let Some(p) = self.backend.provided() {
            p.pause_provided(conn_id(k));
        }
    }

    /// A provided buffer goes back to the ring when dropped.
    fn recycle(&mut self, buf: ProvidedBuf) {
        drop(buf);
    }

    /// Asks the resolver about a connection that claims the unknown `peer`, and hands
    /// the answer to the engine.
    fn resolve(&mut self, conn: ConnKey, peer: PeerId) {
        let accept = match self.resolver.take() {
            Some(mut f) => {
                let gen = self.resolver_gen;
                self.dispatching += 1;
                let ok = f(self, peer);
                self.dispatching -= 1;
                if self.resolver_gen == gen {
                    self.resolver = Some(f);
                }
                ok
            }
            None => false,
        };
        tracing::debug!(
            "unknown {peer} connected: {}",
            if accept { "accepted" } else { "declined" }
        );
        self.core.resolve_unknown(conn, accept);
    }

    #[inline]
    fn deliver_core_events(&mut self) {
        if self.core.has_events() {
            self.deliver_core_events_now();
        }
    }

    fn deliver_core_events_now(&mut self) {
        loop {
            let mut resolved = false;
            self.deliver_core_events_once(&mut resolved);
            if !resolved {
                return;
            }
            // The answers (ACCEPT or REJECT) leave now.
            self.settle();
        }
    }

    fn deliver_core_events_once(&mut self, resolved: &mut bool) {
        loop {
            // Sends completed together: one walk over their cookies, no event each.
            if let Some((peer, cookies)) = self.core.poll_sent() {
                if let Some(cb) = self.on_complete.as_mut() {
                    for &cookie in cookies.iter().flatten() {
                        cb(Completion {
                            peer,
                            cookie,
                            result: Ok(()),
                        });
                    }
                }
                self.core.recycle_sent(cookies);
                continue;
            }
            let Some(e) = self.core.poll_event() else {
                return;
            };
            match e {
                CoreEvent::UnknownPeer { conn, peer } => {
                    self.resolve(conn, peer);
                    *resolved = true;
                }
                CoreEvent::Completed {
                    peer,
                    cookie,
                    result,
                } => {
                    if let Some(cb) = self.on_complete.as_mut() {
                        cb(Completion {
                            peer,
                            cookie,
                            result,
                        });
                    }
                }
                CoreEvent::PeerFailed(peer, reason) => {
                    tracing::warn!("{peer} failed: {reason}");
                    if let Some(cb) = self.on_error.as_mut() {
                        cb(peer, &reason);
                    }
                }
                CoreEvent::Connected(peer) => tracing::debug!("{peer} connected"),
                CoreEvent::PeerClosed(peer) => tracing::debug!("{peer} closed cleanly"),
                CoreEvent::Refused { why } => {
                    tracing::warn!("incoming connection refused: {why}");
                }
            }
        }
    }
}

/// A message from `src` for `tag`, which has no handler, was dropped.
#[cold]
#[inline(never)]
fn unregistered(src: PeerId, tag: Tag) {
    tracing::debug!("dropped a message from {src} for unregistered {tag:?}");
}

/// The error of listening on the wildcard addresses: no free port, or a failed call.
fn listen_error(e: io::Error, ports: Option<(u16, u16)>) -> Error {
    if e.kind() != io::ErrorKind::AddrInUse {
        return Error::io("listen", e);
    }
    let what = match ports {
        Some((lo, hi)) => format!("no free port in RINGBTL_PORT={lo}-{hi}"),
        None => "no ephemeral port free in every address family".into(),
    };
    Error::Wireup(format!("listen: {what} ({e})"))
}

/// The most strangers a process whose descriptor limit is `limit` admits at once: half of
/// its descriptors (at least 8), the rest left to its peers and listeners.
fn half_open_cap(limit: u64) -> usize {
    usize::try_from(limit / 2).unwrap_or(usize::MAX).max(8)
}

/// The connection an event belongs to (none for a failed accept).
fn event_conn(ev: &Event) -> Option<ConnId> {
    match *ev {
        Event::Accepted { conn, .. }
        | Event::Connected { conn, .. }
        | Event::Sent { conn, .. }
        | Event::Recv { conn, .. }
        | Event::RecvProvided { conn, .. }
        | Event::ProvidedPaused { conn }
        | Event::Closed { conn } => Some(conn),
        Event::AcceptError(_) => None,
    }
}

fn key(c: ConnId) -> ConnKey {
    ConnKey(c.0)
}

fn conn_id(k: ConnKey) -> ConnId {
    ConnId(k.0)
}

#[cfg(test)]
mod tests {
    use super::half_open_cap;

    /// Strangers get half of the descriptors, never fewer than 8.
    #[test]
    fn strangers_hold_at_most_half_the_descriptors() {
        assert_eq!(half_open_cap(1024), 512);
        assert_eq!(half_open_cap(20_000), 10_000);
        assert_eq!(half_open_cap(10), 8);
        assert_eq!(half_open_cap(0), 8);
    }
}
