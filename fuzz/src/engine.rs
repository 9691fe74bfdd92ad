//! A protocol engine accepting a connection from a peer that sends arbitrary bytes.
//!
//! The engine (`Core`, pid 0 or 2, knowing peer 1) accepts one connection. The peer's
//! bytes are an optional handshake record (valid or wrong in one field) followed by pieces
//! that are raw bytes, well-formed frames or FINs. A list of operations then drives the
//! engine the way the transport does, with a virtual clock: reads of arbitrary size
//! through the buffer of an `Action::Receive` walked with `walk_read` (the next read
//! started from its end when `rearm_now` allows, as the transport does), or,
//! in multishot mode, provided buffers walked with `input_begin` / `input_step` /
//! `input_done` (with the pause for a large payload), application sends to peer 1 through
//! `gather_small`, else `send_with` (with a prefix of a ping-pong's frame, and of what
//! `direct_pieces` offers, written at once), completions
//! of the gathered sends, end of stream, clock ticks through `handle_timeout`, a clean
//! shutdown. Dials the engine asks for are refused or left connecting. At the end every
//! socket is drained (sends complete, reads see end of stream, the clock runs far ahead).
//!
//! Properties:
//! - no panic, and every `walk_read` / `input_step` walk ends;
//! - every send the engine accepted completes exactly once, and nothing else completes;
//! - `PeerFailed` is raised at most once per peer;
//! - the driver contract holds: at most one send and one read in flight per socket, no
//!   read beside a multishot receive, no empty batch, no read armed without room, no
//!   socket closed twice, no bytes offered at once beside a send in flight.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use bytes::Bytes;
use ringbtl::auth::{handshake_mac, JobKey, Side, Transcript};
use ringbtl::buf::{RxBuf, TxBatch};
use ringbtl::proto::core::{
    walk_read, Action, ConnKey, Core, CoreConfig, CoreEvent, InputStep, NonceSource, Sink, Source,
    DIRECT_PIECES,
};
use ringbtl::wire::{FrameKind, Header, Hello, HelloKind, PeerId, Tag, NONCE_LEN};
use ringbtl::Errno;

const TOKEN: u64 = 0x5249_4e47_4254_4c00;
/// The job key of the engine (and of a peer that knows it).
const KEY: [u8; 32] = [0x4b; 32];
/// The peer's nonce in its HELLO.
const NONCE_D: [u8; NONCE_LEN] = [0x3c; NONCE_LEN];
/// Every nonce the engine draws: known in advance, so that the peer's AUTH can follow
/// its HELLO in the one stream.
const NONCE_A: [u8; NONCE_LEN] = [0x11; NONCE_LEN];
/// The only peer the engine knows.
const PEER: PeerId = PeerId(1);
/// The accepted connection.
const ACCEPTED: ConnKey = ConnKey(0);
/// Bound on the messages of one walk (`walk_read`, `input_step`): far above what any read
/// of a small cache can hold.
const STEP_LIMIT: usize = 1 << 20;
/// Bound on the rounds of the final drain.
const DRAIN_ROUNDS: usize = 256;

/// One fuzz case.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// Receive cache bytes, taken modulo 4096.
    pub recv_cache: u16,
    /// Maximum frame size.
    pub max_frame: u16,
    /// Payloads up to this size are copied into the batch, taken modulo 2048.
    pub inline_limit: u16,
    /// Our pid is 2 (above the peer's, so the peer's dial wins a simultaneous connect)
    /// instead of 0.
    pub high_pid: bool,
    /// Dials the engine asks for are started (and stay connecting until an operation
    /// completes them) instead of failing at once.
    pub dials_start: bool,
    /// Receives run as a multishot receive on provided buffers.
    pub multishot: bool,
    /// What the peer sends first.
    pub hello: Option<HelloSpec>,
    /// What the peer sends after it.
    pub stream: Vec<Piece>,
    /// How the engine is driven.
    pub ops: Vec<Op>,
}

/// The handshake record the peer opens with.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum HelloSpec {
    /// A valid HELLO and AUTH from peer 1.
    Good,
    /// A HELLO and an AUTH whose MAC has this byte flipped.
    BadMac(u8),
    /// A HELLO only (no AUTH follows).
    HelloOnly,
    /// A probe.
    Probe,
    /// A record of another kind (ACCEPT, PROBE_ACK) where a HELLO belongs.
    Accept,
    /// A HELLO with this version.
    Version(u16),
    /// A HELLO and AUTH from a process of the job of this token.
    Token(u64),
    /// A HELLO from this process id.
    Pid(u32),
}

/// A piece of the peer's stream.
#[derive(Debug, Arbitrary)]
pub enum Piece {
    /// Arbitrary bytes.
    Raw(Vec<u8>),
    /// A message frame with a payload of `len` bytes (maybe above the maximum).
    Frame {
        /// Tag.
        tag: u8,
        /// Payload length.
        len: u16,
    },
    /// A FIN frame.
    Fin,
}

/// One step of the driver.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Op {
    /// The armed read of the accepted connection gets up to this many bytes of the peer's
    /// stream (0: all it can take).
    Read(u16),
    /// The application sends `len` bytes in `segs` segments to the peer.
    Send {
        /// Payload length.
        len: u16,
        /// Number of segments (taken modulo 10: above the limit is refused).
        segs: u8,
        /// Tag.
        tag: u8,
    },
    /// The send in flight on a connection (index modulo the open ones) completes.
    SendDone {
        /// Which connection.
        conn: u8,
        /// Success, or an error.
        ok: bool,
    },
    /// A pending connect completes.
    Connect {
        /// Which connection.
        conn: u8,
        /// Success, or an error.
        ok: bool,
    },
    /// The accepted connection's read ends: end of stream, or an error.
    RecvEnd {
        /// An error instead of a plain end of stream.
        error: bool,
    },
    /// Closes requested by the engine finish.
    CloseDone,
    /// The clock advances by this many milliseconds and due timers fire.
    Tick(u16),
    /// A clean shutdown starts.
    Shutdown,
}

/// The driver's view of one socket.
#[derive(Debug, Default)]
struct Sock {
    /// Armed read.
    rx: Option<RxBuf>,
    /// Multishot receive armed.
    provided: bool,
    /// Multishot receive asked to pause, not confirmed yet.
    pausing: bool,
    /// Send in flight.
    tx: Option<TxBatch>,
    /// Connect in progress.
    connecting: bool,
    /// The engine asked to close it.
    closing: bool,
    /// The read side saw its end.
    ended: bool,
}

struct Driver {
    core: Core,
    base: Instant,
    ms: u64,
    dials_start: bool,
    socks: BTreeMap<u32, Sock>,
    next_key: u32,
    /// What the peer sends on the accepted connection, not read yet.
    inbox: VecDeque<u8>,
    next_cookie: u64,
    accepted: BTreeSet<u64>,
    completed: BTreeSet<u64>,
    failed: BTreeMap<u32, usize>,
}

/// Runs every check on `input`; panics on a violation.
pub fn run(input: &Input) {
    let cfg = CoreConfig {
        pid: PeerId(if input.high_pid { 2 } else { 0 }),
        token: TOKEN,
        recv_cache: usize::from(input.recv_cache % 4096),
        max_frame: u32::from(input.max_frame),
        inline_limit: usize::from(input.inline_limit % 2048),
        coalesce_bytes: 64 * 1024,
        max_iov: 64,
        connect_retries: 2,
        retry_delay: Duration::from_millis(20),
        handshake_timeout: Duration::from_secs(5),
        max_half_open: 16,
        multishot: input.multishot,
        job_key: Some(JobKey::from_bytes(KEY)),
        // Lent payloads (FLAG_ACK, completed on the peer's ACK) in half the runs.
        splice_min: (input.max_frame % 2 == 1).then_some(4096),
        ..CoreConfig::default()
    };
    let mut core = Core::with_nonces(cfg, NonceSource::new(|| Some(NONCE_A)));
    core.add_peer(PEER, vec![SocketAddr::from(([10, 0, 0, 2], 7000))])
        .expect("peer 1 is valid");
    let mut d = Driver {
        core,
        base: Instant::now(),
        ms: 0,
        dials_start: input.dials_start,
        socks: BTreeMap::new(),
        next_key: 1,
        inbox: peer_bytes(input).into(),
        next_cookie: 0,
        accepted: BTreeSet::new(),
        completed: BTreeSet::new(),
        failed: BTreeMap::new(),
    };
    d.socks.insert(ACCEPTED.0, Sock::default());
    let now = d.now();
    d.core.handle_accepted(now, ACCEPTED);
    d.pump();
    for op in &input.ops {
        d.op(*op);
        d.pump();
    }
    d.drain();
    let lost: Vec<_> = d.accepted.difference(&d.completed).collect();
    assert!(lost.is_empty(), "sends never completed: {lost:?}");
    assert_eq!(d.core.pending(PEER), 0);
}

/// The bytes the peer sends.
fn peer_bytes(input: &Input) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(spec) = input.hello {
        let mut h = Hello::new(HelloKind::Hello, PEER);
        h.nonce = NONCE_D;
        (h.job, h.to_job) = (TOKEN, TOKEN);
        let (mut token, mut flip, mut auth) = (TOKEN, None, true);
        match spec {
            HelloSpec::Good => {}
            HelloSpec::BadMac(i) => flip = Some(usize::from(i) % 32),
            HelloSpec::HelloOnly => auth = false,
            HelloSpec::Probe => h.kind = HelloKind::Probe,
            HelloSpec::Accept => h.kind = HelloKind::Accept,
            HelloSpec::Version(v) => h.version = v,
            HelloSpec::Token(t) => (token, h.job) = (t, t),
            HelloSpec::Pid(p) => h.pid = PeerId(p),
        }
        out.extend_from_slice(&h.to_bytes());
        if auth {
            let me = PeerId(if input.high_pid { 2 } else { 0 });
            let t = Transcript {
                job_d: token,
                job_a: TOKEN,
                nonce_d: &NONCE_D,
                nonce_a: &NONCE_A,
                pid_d: h.pid,
                pid_a: me,
                link: 0,
            };
            let mut a = Hello::new(HelloKind::Auth, h.pid);
            (a.to, a.job, a.to_job) = (me, h.job, TOKEN);
            a.mac = handshake_mac(&JobKey::from_bytes(KEY), Side::Dialer, &t);
            if let Some(i) = flip {
                a.mac[i] ^= 1;
            }
            out.extend_from_slice(&a.to_bytes());
        }
    }
    for (i, piece) in input.stream.iter().enumerate() {
        match piece {
            Piece::Raw(b) => out.extend_from_slice(b),
            Piece::Frame { tag, len } => {
                let h = Header {
                    kind: FrameKind::Send,
                    tag: Tag(*tag),
                    len: u32::from(*len),
                    ack: false,
                    line: 0,
                };
                out.extend_from_slice(&h.to_bytes());
                out.extend((0..*len).map(|j| (i as u16 ^ j) as u8));
            }
            Piece::Fin => out.extend_from_slice(
                &Header {
                    kind: FrameKind::Fin,
                    tag: Tag(0),
                    len: 0,
                    ack: false,
                    line: 0,
                }
                .to_bytes(),
            ),
        }
    }
    out
}

/// The engine walking one read (`walk_read`): every payload must be readable in place,
/// and a walk that does not end fails the case.
struct Walk<'a> {
    core: &'a mut Core,
    left: usize,
    /// The buffer of the next read, when the engine let the walk start it.
    rearmed: Option<RxBuf>,
}

impl Sink for Walk<'_> {
    fn core(&mut self) -> &mut Core {
        self.core
    }

    fn deliver(&mut self, _: PeerId, _: Tag, payload: &[u8]) {
        self.left = self
            .left
            .checked_sub(1)
            .expect("a read's walk does not end");
        std::hint::black_box(payload);
    }

    fn rearm(&mut self, conn: ConnKey, rx: RxBuf) {
        self.rearmed = self.core.rearm_now(conn, rx);
    }
}

impl Driver {
    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.ms)
    }

    /// Keys of the sockets the engine has not asked to close, in order.
    fn open_keys(&self) -> Vec<u32> {
        self.socks
            .iter()
            .filter(|(_, s)| !s.closing)
            .map(|(k, _)| *k)
            .collect()
    }

    fn pick(&self, i: u8) -> Option<u32> {
        let keys = self.open_keys();
        (!keys.is_empty()).then(|| keys[usize::from(i) % keys.len()])
    }

    fn op(&mut self, op: Op) {
        let now = self.now();
        match op {
            Op::Read(n) => self.read(if n == 0 { usize::MAX } else { usize::from(n) }),
            Op::Send { len, segs, tag } => {
                let segs = usize::from(segs % 10);
                let len = usize::from(len);
                let mut parts = Vec::with_capacity(segs);
                for i in 0..segs {
                    let n = if i + 1 == segs {
                        len - len / segs * i
                    } else {
                        len / segs
                    };
                    parts.push(Bytes::from(vec![i as u8; n]));
                }
                let cookie = self.next_cookie;
                self.next_cookie += 1;
                // As `Transport::send`: a small message behind another one goes into the
                // batch (`gather_small`), with nothing offered at once after it.
                if self.core.gather_small(PEER, Tag(tag), &parts, cookie) {
                    self.accepted.insert(cookie);
                    assert!(
                        !self.core.has_direct(),
                        "a gathered message left something to write at once"
                    );
                    return;
                }
                // Otherwise a message in a ping-pong is written from the call, here a
                // prefix of it that the input picks.
                let Self { core, socks, .. } = self;
                let sent = core.send_with(now, PEER, Tag(tag), &parts, cookie, |k, bytes| {
                    let s = socks.get(&k.0);
                    assert!(
                        s.is_some_and(|s| s.tx.is_none() && !s.connecting),
                        "bytes written at once on {k:?}, unknown, connecting or beside a send in flight"
                    );
                    len % (bytes.len() + 1)
                });
                if sent.is_ok() {
                    self.accepted.insert(cookie);
                }
                // What `Transport::send` does next: write what is offered at once, here a
                // prefix of it that the input picks.
                let mut pieces: [&[u8]; DIRECT_PIECES] = [&[]; DIRECT_PIECES];
                if let Some((k, np)) = self.core.direct_pieces(&mut pieces) {
                    let offered: usize = pieces[..np].iter().map(|p| p.len()).sum();
                    let n = len % (offered + 1);
                    assert!(
                        self.sock(k).tx.is_none(),
                        "bytes offered at once on {k:?} beside a send in flight"
                    );
                    self.core.direct_written(k, n);
                }
            }
            Op::SendDone { conn, ok } => {
                if let Some(k) = self.pick(conn) {
                    self.send_done(k, ok);
                }
            }
            Op::Connect { conn, ok } => {
                if let Some(k) = self.pick(conn) {
                    self.connect_done(k, ok);
                }
            }
            Op::RecvEnd { error } => {
                let err = error.then_some(Errno::ECONNRESET);
                self.recv_end(ACCEPTED.0, err);
            }
            Op::CloseDone => self.finish_closes(),
            Op::Tick(ms) => {
                self.ms += u64::from(ms);
                let now = self.now();
                self.core.handle_timeout(now);
            }
            Op::Shutdown => self.core.shutdown(),
        }
    }

    /// Performs every action the engine asked for and checks every event, until the engine
    /// is idle.
    fn pump(&mut self) {
        loop {
            self.core.flush();
            let Some(a) = self.core.poll_action() else {
                break;
            };
            self.action(a);
        }
        while let Some(ev) = self.core.poll_event() {
            self.event(ev);
        }
    }

    fn action(&mut self, a: Action) {
        let now = self.now();
        match a {
            Action::Dial { peer, link, .. } => {
                if self.dials_start {
                    let key = self.next_key;
                    self.next_key += 1;
                    self.socks.insert(
                        key,
                        Sock {
                            connecting: true,
                            ..Sock::default()
                        },
                    );
                    self.core.dial_started(peer, link, ConnKey(key));
                } else {
                    self.core.dial_failed(now, peer, link, Errno::ECONNREFUSED);
                }
            }
            Action::Transmit { conn: k, batch } => {
                assert!(!batch.is_empty(), "empty batch submitted on {k:?}");
                let s = self.sock(k);
                assert!(s.tx.is_none(), "two sends in flight on {k:?}");
                s.tx = Some(batch);
            }
            Action::Receive {
                conn: k,
                buf: mut rx,
            } => {
                assert!(
                    !rx.spare_mut().is_empty(),
                    "read armed with a full buffer on {k:?}"
                );
                let s = self.sock(k);
                assert!(s.rx.is_none(), "two reads armed on {k:?}");
                assert!(
                    !s.provided && !s.pausing,
                    "read armed on {k:?} beside its multishot receive"
                );
                assert!(!s.ended, "read armed on {k:?} after its end");
                s.rx = Some(rx);
            }
            Action::Walk { conn: k, buf } => {
                let s = self.sock(k);
                assert!(s.rx.is_none(), "a walk on {k:?} beside a read");
                assert_eq!(k, ACCEPTED, "a walk on {k:?}, which read nothing");
                self.walk(buf);
            }
            Action::ArmProvided(k) => {
                let s = self.sock(k);
                assert!(s.rx.is_none(), "multishot armed on {k:?} beside a read");
                if !s.ended {
                    s.provided = true;
                }
            }
            Action::PauseProvided(k) => {
                let s = self.sock(k);
                if s.provided {
                    s.provided = false;
                    s.pausing = true;
                }
            }
            Action::Close(k) | Action::Reset(k) => {
                let s = self.sock(k);
                assert!(!s.closing, "{k:?} closed twice");
                s.closing = true;
            }
            Action::Probe(k) => {
                self.sock(k);
                self.core.probed(now, k, 0);
            }
        }
    }

    fn sock(&mut self, k: ConnKey) -> &mut Sock {
        self.socks
            .get_mut(&k.0)
            .unwrap_or_else(|| panic!("action on unknown or closed {k:?}"))
    }

    fn event(&mut self, ev: CoreEvent) {
        match ev {
            CoreEvent::Completed { peer, cookie, .. } => {
                assert_eq!(peer, PEER, "completion for another peer");
                assert!(self.accepted.contains(&cookie), "unknown cookie {cookie}");
                assert!(
                    self.completed.insert(cookie),
                    "cookie {cookie} completed twice"
                );
            }
            CoreEvent::PeerFailed(p, why) => {
                let n = self.failed.entry(p.0).or_default();
                *n += 1;
                assert!(*n == 1, "PeerFailed({p}) raised twice, now for {why:?}");
            }
            CoreEvent::Connected(_)
            | CoreEvent::PeerClosed(_)
            | CoreEvent::Refused { .. }
            | CoreEvent::UnknownPeer { .. } => {}
        }
    }

    /// One read on the accepted connection, walked to its end.
    fn read(&mut self, max: usize) {
        let Some(s) = self.socks.get_mut(&ACCEPTED.0) else {
            return;
        };
        if s.closing {
            return;
        }
        if s.pausing && max.is_multiple_of(2) {
            // The pause takes effect before this read.
            s.pausing = false;
            self.core.handle_provided_paused(ACCEPTED);
            return;
        }
        if self.inbox.is_empty() {
            return;
        }
        if s.provided || s.pausing {
            return self.read_provided(max);
        }
        let Some(mut rx) = s.rx.take() else { return };
        let spare = rx.spare_mut();
        let n = max.min(spare.len()).min(self.inbox.len());
        for (d, b) in spare.iter_mut().zip(self.inbox.drain(..n)) {
            *d = b;
        }
        rx.commit(n);
        self.walk(rx);
    }

    /// Walks the bytes of `rx`, read on the accepted connection, to their end.
    fn walk(&mut self, rx: RxBuf) {
        let now = self.now();
        let mut walk = Walk {
            core: &mut self.core,
            left: STEP_LIMIT,
            rearmed: None,
        };
        walk_read(&mut walk, now, ACCEPTED, rx);
        // The next read, started by the walk's end as the transport does.
        if let Some(buf) = walk.rearmed.take() {
            self.action(Action::Receive {
                conn: ACCEPTED,
                buf,
            });
        }
    }

    /// One provided buffer of up to `max` bytes on the accepted connection, walked in
    /// place.
    fn read_provided(&mut self, max: usize) {
        let n = max.min(self.inbox.len());
        let input: Vec<u8> = self.inbox.drain(..n).collect();
        let now = self.now();
        let Some(mut rx) = self.core.input_begin(ACCEPTED) else {
            return;
        };
        let mut at = 0;
        for _ in 0..STEP_LIMIT {
            match self
                .core
                .input_step(now, ACCEPTED, &mut rx, &input, &mut at)
            {
                InputStep::Deliver { src, .. } => {
                    // The payload must be readable in place.
                    match src {
                        Source::Input(r) => std::hint::black_box(&input[r]),
                        Source::Cache(r) => std::hint::black_box(rx.bytes(r)),
                    };
                }
                InputStep::Done => {
                    assert_eq!(at, input.len(), "an input is used up");
                    self.core.input_done(ACCEPTED, rx);
                    return;
                }
                InputStep::Drop => return,
            }
        }
        panic!("input_step walk does not end");
    }

    fn send_done(&mut self, k: u32, ok: bool) {
        let Some(batch) = self.socks.get_mut(&k).and_then(|s| s.tx.take()) else {
            return;
        };
        let result = if ok { Ok(()) } else { Err(Errno::EPIPE) };
        let now = self.now();
        self.core.handle_sent(now, ConnKey(k), batch, result);
    }

    fn connect_done(&mut self, k: u32, ok: bool) {
        let Some(s) = self.socks.get_mut(&k).filter(|s| s.connecting) else {
            return;
        };
        s.connecting = false;
        let result = if ok { Ok(()) } else { Err(Errno::ECONNREFUSED) };
        let now = self.now();
        self.core.handle_connected(now, ConnKey(k), result);
    }

    fn recv_end(&mut self, k: u32, err: Option<Errno>) {
        let Some(s) = self.socks.get_mut(&k) else {
            return;
        };
        let armed = s.rx.take().is_some();
        let multishot = std::mem::take(&mut s.provided) | std::mem::take(&mut s.pausing);
        if !armed && !multishot {
            return;
        }
        s.ended = true;
        let now = self.now();
        self.core.handle_recv_end(now, ConnKey(k), err);
    }

    /// Every socket the engine asked to close: its pending operations are cancelled, then
    /// the close completes.
    fn finish_closes(&mut self) {
        let closing: Vec<u32> = self
            .socks
            .iter()
            .filter(|(_, s)| s.closing)
            .map(|(k, _)| *k)
            .collect();
        let now = self.now();
        for k in closing {
            let s = self.socks.get_mut(&k).expect("listed above");
            let (connecting, tx, rx) =
                (std::mem::take(&mut s.connecting), s.tx.take(), s.rx.take());
            let multishot = std::mem::take(&mut s.provided) | std::mem::take(&mut s.pausing);
            if connecting {
                self.core
                    .handle_connected(now, ConnKey(k), Err(Errno::ECANCELED));
            }
            if let Some(batch) = tx {
                self.core
                    .handle_sent(now, ConnKey(k), batch, Err(Errno::ECANCELED));
            }
            if rx.is_some() || multishot {
                self.core
                    .handle_recv_end(now, ConnKey(k), Some(Errno::ECANCELED));
            }
            self.socks.remove(&k);
            self.core.handle_closed(ConnKey(k));
        }
    }

    /// Brings everything to rest: the peer closes every connection, sends complete,
    /// connects fail, closes finish, and the clock runs until no timer is left.
    fn drain(&mut self) {
        for _ in 0..DRAIN_ROUNDS {
            for k in self.open_keys() {
                self.connect_done(k, false);
                self.pump();
                self.send_done(k, true);
                self.pump();
                self.recv_end(k, None);
                self.pump();
            }
            self.finish_closes();
            self.pump();
            match self.core.poll_timeout() {
                Some(t) => {
                    let due = t.saturating_duration_since(self.base).as_millis() as u64;
                    self.ms = self.ms.max(due);
                    let now = self.now();
                    self.core.handle_timeout(now);
                    self.pump();
                }
                None if self.socks.is_empty() => return,
                None => {}
            }
        }
        panic!(
            "no rest after {DRAIN_ROUNDS} rounds: sockets {:?}, timer {:?}",
            self.socks.keys().collect::<Vec<_>>(),
            self.core.poll_timeout()
        );
    }
}
