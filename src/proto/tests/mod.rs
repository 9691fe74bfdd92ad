//! The protocol engine driven through a deterministic in-memory network.
//!
//! [`Net`] plays the reactor for several [`Core`]s at once: it performs every
//! [`Action`], keeps one byte pipe per socket end, completes operations in a seeded
//! random order, splits reads at random boundaries and runs a virtual clock. A socket end
//! may also be "raw": the test writes and reads its bytes directly, to play a peer that
//! is not a ringbtl process or that breaks the protocol.
//!
//! Every random choice comes from one seeded generator, so a failing seed replays.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use super::core::{
    walk_read, Action, ConnKey, Core, CoreConfig, CoreEvent, EndpointState, InputStep, NonceSource,
    Sink, Source, DIRECT_PIECES,
};
use crate::auth::{self, AuthMode, JobKey, Side, Transcript};
use crate::buf::{RxBuf, TxBatch};
use crate::error::{Errno, FailReason, ProtoError, SendError, WireError};
use crate::wire::{
    FrameKind, Header, Hello, HelloKind, PeerId, RejectReason, Tag, HELLO_LEN, NONCE_LEN, VERSION,
};

mod abandoned;
mod admit;
mod auth_handshake;
mod close;
mod connect;
mod direct;
mod early;
mod garbage;
mod hold;
mod input;
mod jobs;
mod lazy;
mod lent;
mod links;
mod pad;
mod run;
mod traffic;

pub(super) const TOKEN: u64 = 0x5249_4e47_4254_4c00;
/// Where raw ends dial from unless a test says otherwise.
const RAW_SRC: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 200));
/// The job key of the nodes these tests run.
pub(super) const KEY: [u8; 32] = [0x4b; 32];
/// The nonce of the dialer's HELLO that the raw ends send.
pub(super) const RAW_NONCE: [u8; NONCE_LEN] = [0x3c; NONCE_LEN];
const STEP_LIMIT: usize = 2_000_000;

/// xorshift64*: small, fast, good enough to pick interleavings (here and in the run
/// model of `spread.rs`).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Self((seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xd1b5_4a32_d192_ed03) | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub(super) fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 7000))
}

/// Payloads from this size lend their pages (FLAG_ACK): low, so that the tests' large
/// frames go through the ACK exchange.
const SPLICE_MIN: Option<usize> = Some(4096);

/// The engine configuration these tests use (process `pid`).
pub(super) fn cfg(pid: u32) -> CoreConfig {
    CoreConfig {
        pid: PeerId(pid),
        token: TOKEN,
        job_key: Some(JobKey::from_bytes(KEY)),
        job_key_file: None,
        auth: AuthMode::Auto,
        recv_cache: 64 * 1024,
        max_frame: 1 << 20,
        inline_limit: 1024,
        coalesce_bytes: 256 * 1024,
        max_iov: 256,
        connect_retries: 4,
        retry_delay: Duration::from_millis(20),
        handshake_timeout: Duration::from_secs(5),
        max_half_open: 1024,
        max_half_open_per_source: 256,
        // The handshake deadline alone, unless a test says otherwise (`admit.rs`).
        first_bytes_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(30),
        frame_stall: Duration::from_secs(60),
        max_queued_bytes: 64 << 20,
        splice_min: SPLICE_MIN,
        splice_max: None,
        splice_idle: Some(crate::proto::config::DEFAULT_SPLICE_IDLE),
        // The engine alone: no driver measures (`Core::set_lend_judged` says it).
        splice_judged: false,
        multishot: false,
    }
}

/// Most bytes one provided buffer holds in the multishot receive these tests simulate.
const PROVIDED_BUF: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Node(usize),
    Raw,
}

/// One end of a TCP connection.
#[derive(Debug)]
struct Sock {
    owner: Owner,
    /// The engine's handle (None for raw ends and not-yet-accepted ends).
    key: Option<ConnKey>,
    /// The other end; `None` when the dial reached nobody.
    other: Option<usize>,
    dialer: bool,
    /// Bytes that arrived and were not read yet.
    inbox: VecDeque<u8>,
    /// The other end is closed: EOF once `inbox` is drained.
    peer_closed: bool,
    /// The other end's process died: writes fail with a reset.
    peer_dead: bool,
    accept_pending: bool,
    connect_pending: bool,
    /// Armed read.
    rx: Option<RxBuf>,
    /// Multishot receive armed on provided buffers.
    provided: bool,
    /// The multishot receive was asked to pause; the confirmation is still to come.
    pausing: bool,
    /// Send in flight, and the error it will complete with (if any).
    tx: Option<TxBatch>,
    tx_err: Option<Errno>,
    /// A Close was requested; it completes once no operation is pending.
    closing: bool,
    /// Closed abortively ([`Action::Reset`]).
    reset: bool,
    closed: bool,
    /// The first handshake record this end wrote.
    head: Vec<u8>,
    /// A raw dialing end's source address (node ends come from their node's address).
    src: Option<IpAddr>,
    /// The path is gone without a word (an interface down): nothing written arrives,
    /// nothing ends.
    silent: bool,
    /// Bytes this end wrote were lost on a silent path: the kernel's retransmission
    /// timer keeps firing (without them, a probe finds nothing wrong).
    unacked: bool,
    /// Reads armed on this end ([`Action::Receive`]).
    reads: usize,
    /// Bytes the engine read on this end.
    read_bytes: usize,
}

impl Sock {
    fn new(owner: Owner, key: Option<ConnKey>, other: Option<usize>, dialer: bool) -> Self {
        Self {
            owner,
            key,
            other,
            dialer,
            inbox: VecDeque::new(),
            peer_closed: false,
            peer_dead: false,
            accept_pending: false,
            connect_pending: false,
            rx: None,
            provided: false,
            pausing: false,
            tx: None,
            tx_err: None,
            closing: false,
            reset: false,
            closed: false,
            head: Vec::new(),
            src: None,
            silent: false,
            unacked: false,
            reads: 0,
            read_bytes: 0,
        }
    }

    /// The first handshake record this end wrote other than a CHALLENGE: an acceptor's
    /// decision (ACCEPT, REJECT), or a dialer's HELLO.
    fn first_record(&self) -> Option<Hello> {
        self.head
            .chunks_exact(HELLO_LEN)
            .map(|r| Hello::parse(r).expect("valid record"))
            .find(|h| h.kind != HelloKind::Challenge)
    }
}

#[derive(Debug, Clone, Copy)]
enum Item {
    Accept(usize),
    Connect(usize),
    SendDone(usize),
    Read(usize),
    /// A multishot receive fills a provided buffer.
    ReadProvided(usize),
    /// The multishot receive stopped as asked.
    Paused(usize),
    Eof(usize),
    Cancel(usize),
    CloseDone(usize),
}

#[derive(Debug, Clone, Copy)]
enum Listener {
    Node(usize),
    Raw,
}

type Msg = (u8, Vec<u8>);

struct Node {
    core: Core,
    alive: bool,
    keys: HashMap<ConnKey, usize>,
    free: Vec<u32>,
    next_key: u32,
    events: Vec<CoreEvent>,
    /// Delivered active messages: (source, tag, payload).
    got: Vec<(PeerId, Tag, Vec<u8>)>,
    /// Accepted sends: cookie -> (destination, tag, payload).
    sent: BTreeMap<u64, (PeerId, u8, Vec<u8>)>,
    next_cookie: u64,
    dials: Vec<(PeerId, SocketAddr)>,
    /// Resolve unknown peers that connect (lazy add): add them at their listening address
    /// and accept, as a driver with a resolver does.
    lazy: bool,
    /// Connections whose socket the engine had set to acknowledge at once after a send
    /// (`Core::handle_sent`), in order.
    quick_acks: Vec<ConnKey>,
}

/// A node walking one read (`walk_read`), its deliveries bounded so that a walk that does
/// not end fails the test.
struct Walk<'a> {
    node: &'a mut Node,
    left: usize,
    seed: u64,
    /// [`Knobs::end_at_delivery`], with the time and the walked connection.
    end_at: Option<(usize, Instant, ConnKey)>,
    delivered: usize,
    /// The buffer of the next read, when the engine let the walk start it
    /// (`Core::rearm_now`).
    rearmed: Option<RxBuf>,
}

impl Sink for Walk<'_> {
    fn core(&mut self) -> &mut Core {
        &mut self.node.core
    }

    fn deliver(&mut self, peer: PeerId, tag: Tag, payload: &[u8]) {
        self.left = self
            .left
            .checked_sub(1)
            .unwrap_or_else(|| panic!("seed {}: a read's walk does not end", self.seed));
        self.node.got.push((peer, tag, payload.to_vec()));
        self.delivered += 1;
        if let Some((at, now, key)) = self.end_at {
            if self.delivered == at {
                let reset = Some(Errno::ECONNRESET);
                self.node.core.handle_recv_end(now, key, reset);
            }
        }
    }

    fn rearm(&mut self, conn: ConnKey, rx: RxBuf) {
        self.rearmed = self.node.core.rearm_now(conn, rx);
    }
}

/// Fault knobs.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    /// Split reads at random boundaries (otherwise read all that is there).
    split: bool,
    /// Let the clock creep forward between steps.
    jitter: bool,
    /// Sends of this node never complete (the peer stopped reading) until the socket is
    /// closed.
    stall: Option<usize>,
    /// How many bytes a socket takes of a write made at once ([`Net::write_direct`]);
    /// `None`: all of them, a part or none, at random.
    at_once: Option<usize>,
    /// The delivery of a read's walk (counted from 1) after which the walked connection
    /// ends (reset by the peer), as when a handler's `flush` meets a failed send.
    end_at_delivery: Option<usize>,
}

struct Net {
    seed: u64,
    rng: Rng,
    knobs: Knobs,
    base: Instant,
    offset: Duration,
    nodes: Vec<Node>,
    socks: Vec<Sock>,
    listeners: HashMap<SocketAddr, Listener>,
    /// Raw ends created by dials to a raw listener.
    raw_accepted: Vec<usize>,
    /// Buffers walked without a read ([`Action::Walk`]).
    walks: usize,
}

impl Net {
    /// One node per config; config `i` must have pid `i`. Every node knows every other
    /// and listens on `addr(i)`.
    fn new(seed: u64, cfgs: Vec<CoreConfig>) -> Self {
        Self::with_known(seed, cfgs, |_, _| true)
    }

    /// As [`new`](Self::new), but node `i` is told about node `j` only when
    /// `known(i, j)`.
    fn with_known(seed: u64, cfgs: Vec<CoreConfig>, known: impl Fn(usize, usize) -> bool) -> Self {
        let n = cfgs.len();
        let mut nodes = Vec::new();
        let mut listeners = HashMap::new();
        for (i, c) in cfgs.into_iter().enumerate() {
            assert_eq!(c.pid, PeerId(i as u32), "node index must equal its pid");
            // Deterministic nonces: seed, node and a counter.
            let mut count = 0u64;
            let nonces = NonceSource::new(move || {
                count += 1;
                let mut b = [0u8; NONCE_LEN];
                b[..8].copy_from_slice(&seed.to_be_bytes());
                b[8..16].copy_from_slice(&(i as u64).to_be_bytes());
                b[16..24].copy_from_slice(&count.to_be_bytes());
                Some(b)
            });
            let mut core = Core::with_nonces(c, nonces);
            for j in (0..n).filter(|&j| j != i && known(i, j)) {
                core.add_peer(PeerId(j as u32), vec![addr(j)]).unwrap();
            }
            listeners.insert(addr(i), Listener::Node(i));
            nodes.push(Node {
                core,
                alive: true,
                keys: HashMap::new(),
                free: Vec::new(),
                next_key: 0,
                events: Vec::new(),
                got: Vec::new(),
                sent: BTreeMap::new(),
                next_cookie: 1,
                dials: Vec::new(),
                lazy: false,
                quick_acks: Vec::new(),
            });
        }
        Self {
            seed,
            rng: Rng::new(seed),
            knobs: Knobs {
                split: true,
                jitter: true,
                stall: None,
                at_once: None,
                end_at_delivery: None,
            },
            base: Instant::now(),
            offset: Duration::ZERO,
            nodes,
            socks: Vec::new(),
            listeners,
            raw_accepted: Vec::new(),
            walks: 0,
        }
    }

    fn pair(seed: u64) -> Self {
        Self::new(seed, vec![cfg(0), cfg(1)])
    }

    fn now(&self) -> Instant {
        self.base + self.offset
    }

    fn core(&mut self, n: usize) -> &mut Core {
        &mut self.nodes[n].core
    }

    // ----- application side -------------------------------------------------------------

    /// Sends `payload` cut into `nsegs` segments at random points.
    fn send_segs(
        &mut self,
        n: usize,
        to: u32,
        tag: u8,
        payload: Vec<u8>,
        nsegs: usize,
    ) -> Result<u64, SendError> {
        let mut cuts: Vec<usize> = (1..nsegs)
            .map(|_| self.rng.below(payload.len() + 1))
            .collect();
        cuts.sort_unstable();
        let whole = Bytes::from(payload.clone());
        let mut segs = Vec::new();
        let mut at = 0;
        for c in cuts {
            segs.push(whole.slice(at..c));
            at = c;
        }
        segs.push(whole.slice(at..));
        let now = self.now();
        let Self {
            nodes,
            socks,
            rng,
            knobs,
            seed,
            ..
        } = self;
        let node = &mut nodes[n];
        let cookie = node.next_cookie;
        // What `Transport::send` does: a small message behind another one goes into the
        // batch (`gather_small`); otherwise `send_with`, where a message in a ping-pong is
        // written from the call.
        if node.core.gather_small(PeerId(to), Tag(tag), &segs, cookie) {
            node.next_cookie += 1;
            node.sent.insert(cookie, (PeerId(to), tag, payload));
            return Ok(cookie);
        }
        let keys = &node.keys;
        node.core
            .send_with(now, PeerId(to), Tag(tag), &segs, cookie, |k, bytes| {
                let s = *keys.get(&k).expect("written on a known connection");
                write_at_once(socks, rng, knobs, *seed, n, s, bytes)
            })?;
        node.next_cookie += 1;
        node.sent.insert(cookie, (PeerId(to), tag, payload));
        self.write_direct(n);
        Ok(cookie)
    }

    /// What the driver does after every send (`Transport::send`): writes what
    /// `direct_pieces` offers at once, with the socket taking all of it, a part of it
    /// (a full buffer) or nothing, and reports the count.
    fn write_direct(&mut self, n: usize) {
        let mut pieces: [&[u8]; DIRECT_PIECES] = [&[]; DIRECT_PIECES];
        let Some((k, np)) = self.nodes[n].core.direct_pieces(&mut pieces) else {
            return;
        };
        let bytes = pieces[..np].concat();
        let s = self.sock_of(n, k);
        let take = write_at_once(
            &mut self.socks,
            &mut self.rng,
            &self.knobs,
            self.seed,
            n,
            s,
            &bytes,
        );
        self.nodes[n].core.direct_written(k, take);
    }

    /// Bytes written by end `s` arrive at its other end `o`.
    fn wire_out(&mut self, s: usize, o: usize, bytes: &[u8]) {
        wire_out(&mut self.socks, s, o, bytes);
    }

    fn send(&mut self, n: usize, to: u32, tag: u8, payload: Vec<u8>) -> Result<u64, SendError> {
        self.send_segs(n, to, tag, payload, 1)
    }

    /// A random payload: mostly small, some medium, a few up to 200 KiB.
    fn payload(&mut self) -> Vec<u8> {
        let len = match self.rng.below(12) {
            0 => 0,
            // Around the cache sizes used here: fits exactly, or one byte too many.
            10 => 4096 - 12 + self.rng.below(24),
            11 => 65536 - 12 + self.rng.below(24),
            1..=6 => self.rng.below(300),
            7 | 8 => self.rng.below(8 * 1024),
            _ => self.rng.below(200 * 1024 + 1),
        };
        self.rng.bytes(len)
    }

    fn send_random(&mut self, n: usize, to: u32) -> Result<u64, SendError> {
        let tag = self.rng.next() as u8;
        let p = self.payload();
        let nsegs = 1 + self.rng.below(8);
        self.send_segs(n, to, tag, p, nsegs)
    }

    /// Messages `n` delivered from `from`, in arrival order.
    fn received(&self, n: usize, from: usize) -> Vec<Msg> {
        self.nodes[n]
            .got
            .iter()
            .filter(|(p, _, _)| *p == PeerId(from as u32))
            .map(|(_, t, b)| (t.0, b.clone()))
            .collect()
    }

    /// Messages `n` accepted for `to`, in send order, with their cookies.
    fn sent(&self, n: usize, to: usize) -> Vec<(u64, Msg)> {
        self.nodes[n]
            .sent
            .iter()
            .filter(|(_, (p, _, _))| *p == PeerId(to as u32))
            .map(|(c, (_, t, b))| (*c, (*t, b.clone())))
            .collect()
    }

    /// The cookies node `n`'s sends completed with so far without error, in order.
    fn completed_ok(&self, n: usize) -> Vec<u64> {
        self.nodes[n]
            .events
            .iter()
            .filter_map(|e| match e {
                CoreEvent::Completed {
                    cookie,
                    result: Ok(()),
                    ..
                } => Some(*cookie),
                _ => None,
            })
            .collect()
    }

    /// Asserts every accepted send of `n` completed exactly once, and nothing else did.
    fn completions(&self, n: usize) -> BTreeMap<u64, Result<(), FailReason>> {
        let mut seen: BTreeMap<u64, Result<(), FailReason>> = BTreeMap::new();
        for e in &self.nodes[n].events {
            if let CoreEvent::Completed {
                peer,
                cookie,
                result,
            } = e
            {
                let (to, _, _) = self.nodes[n].sent.get(cookie).unwrap_or_else(|| {
                    panic!(
                        "seed {}: node {n}: completion of unknown cookie {cookie}",
                        self.seed
                    )
                });
                assert_eq!(
                    peer, to,
                    "seed {}: completion names the wrong peer",
                    self.seed
                );
                let dup = seen.insert(*cookie, result.clone());
                assert!(
                    dup.is_none(),
                    "seed {}: node {n}: cookie {cookie} completed twice",
                    self.seed
                );
            }
        }
        for c in self.nodes[n].sent.keys() {
            assert!(
                seen.contains_key(c),
                "seed {}: node {n}: cookie {c} never completed",
                self.seed
            );
        }
        seen
    }

    fn count_events(&self, n: usize, f: impl Fn(&CoreEvent) -> bool) -> usize {
        self.nodes[n].events.iter().filter(|e| f(e)).count()
    }

    fn failed_events(&self, n: usize) -> Vec<(PeerId, FailReason)> {
        self.nodes[n]
            .events
            .iter()
            .filter_map(|e| match e {
                CoreEvent::PeerFailed(p, r) => Some((*p, r.clone())),
                _ => None,
            })
            .collect()
    }

    /// Socket ends of `n` that are not closed and not being closed.
    fn open_socks(&self, n: usize) -> Vec<usize> {
        (0..self.socks.len())
            .filter(|&s| {
                let k = &self.socks[s];
                k.owner == Owner::Node(n) && !k.closed && !k.closing && !k.accept_pending
            })
            .collect()
    }

    // ----- raw peers ----------------------------------------------------------------------

    /// A connection from a raw end to node `to`; returns the raw end.
    fn raw_dial(&mut self, to: usize) -> usize {
        self.raw_dial_from(to, RAW_SRC)
    }

    /// A connection from a raw end at address `src` to node `to`; returns the raw end.
    fn raw_dial_from(&mut self, to: usize, src: IpAddr) -> usize {
        let r = self.socks.len();
        let t = r + 1;
        let mut raw = Sock::new(Owner::Raw, None, Some(t), true);
        raw.src = Some(src);
        self.socks.push(raw);
        let mut acc = Sock::new(Owner::Node(to), None, Some(r), false);
        acc.accept_pending = true;
        self.socks.push(acc);
        r
    }

    fn raw_write(&mut self, r: usize, bytes: &[u8]) {
        assert!(!self.socks[r].closed);
        if let Some(o) = self.socks[r].other {
            if !self.socks[o].closed {
                self.socks[o].inbox.extend(bytes);
            }
        }
    }

    fn raw_read(&mut self, r: usize) -> Vec<u8> {
        self.socks[r].inbox.drain(..).collect()
    }

    /// True once the node closed its end.
    fn raw_eof(&self, r: usize) -> bool {
        self.socks[r].peer_closed
    }

    fn raw_close(&mut self, r: usize) {
        self.socks[r].closed = true;
        if let Some(o) = self.socks[r].other {
            self.socks[o].peer_closed = true;
        }
    }

    /// Raw HELLO as process `pid` (nonce [`RAW_NONCE`]), addressed to node 0.
    fn raw_hello(&mut self, r: usize, pid: u32) {
        self.raw_hello_link(r, pid, 0);
    }

    /// [`raw_hello`](Self::raw_hello) for link `link` of the endpoint.
    fn raw_hello_link(&mut self, r: usize, pid: u32, link: u8) {
        let mut h = Hello::new(HelloKind::Hello, PeerId(pid));
        h.to = PeerId(0);
        h.nonce = RAW_NONCE;
        h.link = link;
        self.raw_write(r, &h.to_bytes());
    }

    /// After [`raw_hello`](Self::raw_hello) as `pid` to node 0: reads node 0's CHALLENGE,
    /// checks its MAC with `key`, and writes an AUTH made with `key` and `token`.
    fn raw_send_auth(&mut self, r: usize, pid: u32, key: &JobKey, token: u64) {
        self.raw_send_auth_link(r, pid, key, token, 0, 0);
    }

    /// [`raw_send_auth`](Self::raw_send_auth) after a HELLO for link `link`: the CHALLENGE
    /// must name that link and prove the key over it; the AUTH's MAC is made over link
    /// `mac_link` (the same link, unless a test forges it).
    fn raw_send_auth_link(
        &mut self,
        r: usize,
        pid: u32,
        key: &JobKey,
        token: u64,
        link: u8,
        mac_link: u8,
    ) {
        self.run(false);
        let ch = Hello::parse(&self.raw_read(r)).expect("a CHALLENGE");
        assert_eq!(
            (ch.kind, ch.pid, ch.to, ch.link),
            (HelloKind::Challenge, PeerId(0), PeerId(pid), link)
        );
        let mut t = Transcript {
            job_d: token,
            job_a: token,
            nonce_d: &RAW_NONCE,
            nonce_a: &ch.nonce,
            pid_d: PeerId(pid),
            pid_a: PeerId(0),
            link,
        };
        assert_eq!(
            auth::verify_handshake(key, Side::Acceptor, &t, &ch.mac),
            *key == JobKey::from_bytes(KEY) && token == TOKEN,
            "the CHALLENGE proves node 0's key"
        );
        t.link = mac_link;
        let mut a = Hello::new(HelloKind::Auth, PeerId(pid));
        a.to = PeerId(0);
        a.link = link;
        a.mac = auth::handshake_mac(key, Side::Dialer, &t);
        self.raw_write(r, &a.to_bytes());
    }

    /// HELLO and AUTH as `pid` with the nodes' key (the answer is left unread).
    fn raw_join(&mut self, r: usize, pid: u32) {
        self.raw_hello(r, pid);
        self.raw_send_auth(r, pid, &JobKey::from_bytes(KEY), TOKEN);
    }

    /// A join's AUTH for link `link` as `pid` with the nodes' key, then node 0's answer.
    fn raw_auth_link(&mut self, r: usize, pid: u32, link: u8) -> Option<Hello> {
        self.raw_send_auth_link(r, pid, &JobKey::from_bytes(KEY), TOKEN, link, link);
        self.run(false);
        let ans = self.raw_read(r);
        (!ans.is_empty()).then(|| Hello::parse(&ans).expect("an answer record"))
    }

    /// [`raw_send_auth`](Self::raw_send_auth), then node 0's answer (`None`: the
    /// connection closed without one).
    fn raw_auth(&mut self, r: usize, pid: u32, key: &JobKey, token: u64) -> Option<Hello> {
        self.raw_send_auth(r, pid, key, token);
        self.run(false);
        let ans = self.raw_read(r);
        (!ans.is_empty()).then(|| Hello::parse(&ans).expect("an answer record"))
    }

    // ----- the reactor ------------------------------------------------------------------

    fn alloc_key(&mut self, n: usize, s: usize) -> ConnKey {
        let node = &mut self.nodes[n];
        let k = node.free.pop().unwrap_or_else(|| {
            node.next_key += 1;
            node.next_key - 1
        });
        let key = ConnKey(k);
        assert!(node.keys.insert(key, s).is_none(), "key reused while live");
        key
    }

    fn sock_of(&self, n: usize, k: ConnKey) -> usize {
        *self.nodes[n]
            .keys
            .get(&k)
            .unwrap_or_else(|| panic!("seed {}: node {n}: action on unknown {k:?}", self.seed))
    }

    /// One progress pass of node `n` after its inputs: flush, perform actions, collect
    /// events.
    fn pump(&mut self, n: usize) {
        if !self.nodes[n].alive {
            return;
        }
        loop {
            self.nodes[n].core.flush();
            while let Some(a) = self.nodes[n].core.poll_action() {
                self.apply(n, a);
            }
            let mut resolved = false;
            while let Some(e) = self.nodes[n].core.poll_event() {
                if let CoreEvent::UnknownPeer { conn, peer } = e {
                    if self.nodes[n].lazy {
                        let at = vec![addr(peer.0 as usize)];
                        let core = &mut self.nodes[n].core;
                        core.add_peer(peer, at).unwrap();
                        core.resolve_unknown(conn, true);
                        resolved = true;
                    }
                }
                self.nodes[n].events.push(e);
            }
            if !resolved {
                break;
            }
        }
    }

    fn apply(&mut self, n: usize, a: Action) {
        match a {
            Action::Dial {
                peer, link, addr, ..
            } => {
                self.nodes[n].dials.push((peer, addr));
                let s = self.socks.len();
                let key = self.alloc_key(n, s);
                let mut sock = Sock::new(Owner::Node(n), Some(key), None, true);
                sock.connect_pending = true;
                self.socks.push(sock);
                match self.listeners.get(&addr).copied() {
                    Some(Listener::Node(m)) if self.nodes[m].alive => {
                        let t = self.socks.len();
                        let mut acc = Sock::new(Owner::Node(m), None, Some(s), false);
                        acc.accept_pending = true;
                        self.socks.push(acc);
                        self.socks[s].other = Some(t);
                    }
                    Some(Listener::Raw) => {
                        let t = self.socks.len();
                        self.socks.push(Sock::new(Owner::Raw, None, Some(s), false));
                        self.socks[s].other = Some(t);
                        self.raw_accepted.push(t);
                    }
                    _ => {}
                }
                self.nodes[n].core.dial_started(peer, link, key);
            }
            Action::Transmit { conn: k, batch } => {
                let s = self.sock_of(n, k);
                assert!(
                    self.socks[s].tx.is_none(),
                    "seed {}: node {n}: two sends in flight on {k:?}",
                    self.seed
                );
                assert!(
                    !batch.is_empty(),
                    "seed {}: empty batch submitted",
                    self.seed
                );
                let bytes = batch.unsent_to_vec();
                if self.socks[s].closing {
                    self.socks[s].tx_err = Some(Errno::ECANCELED);
                } else {
                    match self.socks[s].other {
                        Some(o) if !self.socks[o].closed => self.wire_out(s, o, &bytes),
                        _ => {
                            // Writing to a connection the peer has closed: either the bytes
                            // vanish or the kernel reports the reset (always, once the peer
                            // process is gone).
                            // A path gone silently takes the bytes and says nothing.
                            let silent = self.socks[s].silent;
                            self.socks[s].unacked |= silent;
                            if !silent && (self.socks[s].peer_dead || self.rng.chance(1, 2)) {
                                self.socks[s].tx_err = Some(Errno::ECONNRESET);
                            }
                        }
                    }
                }
                self.socks[s].tx = Some(batch);
            }
            Action::Receive { conn: k, buf } => {
                let s = self.sock_of(n, k);
                assert!(
                    self.socks[s].rx.is_none(),
                    "seed {}: node {n}: two reads armed on {k:?}",
                    self.seed
                );
                assert!(
                    !self.socks[s].provided && !self.socks[s].pausing,
                    "seed {}: node {n}: a read armed on {k:?} beside its multishot receive",
                    self.seed
                );
                self.socks[s].rx = Some(buf);
                self.socks[s].reads += 1;
            }
            Action::Walk { conn: k, buf } => {
                let s = self.sock_of(n, k);
                assert!(
                    self.socks[s].rx.is_none() && !self.socks[s].provided,
                    "seed {}: node {n}: a walk on {k:?} beside a read",
                    self.seed
                );
                self.walks += 1;
                self.walk(n, k, buf);
            }
            Action::ArmProvided(k) => {
                let s = self.sock_of(n, k);
                assert!(
                    self.socks[s].rx.is_none(),
                    "seed {}: node {n}: multishot armed on {k:?} beside a read",
                    self.seed
                );
                self.socks[s].provided = true;
            }
            Action::PauseProvided(k) => {
                let s = self.sock_of(n, k);
                if self.socks[s].provided {
                    self.socks[s].provided = false;
                    self.socks[s].pausing = true;
                }
            }
            Action::Close(k) | Action::Reset(k) => {
                let s = self.sock_of(n, k);
                assert!(
                    !self.socks[s].closing,
                    "seed {}: node {n}: {k:?} closed twice",
                    self.seed
                );
                self.socks[s].closing = true;
                self.socks[s].reset = matches!(a, Action::Reset(_));
            }
            Action::Probe(k) => {
                // A path gone silently keeps timing out once bytes written on it were
                // lost; any other is acknowledged.
                let s = self.sock_of(n, k);
                let sock = &self.socks[s];
                let retransmits = if sock.silent && sock.unacked { 3 } else { 0 };
                let now = self.now();
                self.nodes[n].core.probed(now, k, retransmits);
            }
        }
    }

    /// Node `n` walks the bytes of `rx`, read on `key`, as the transport does.
    fn walk(&mut self, n: usize, key: ConnKey, rx: RxBuf) {
        let now = self.now();
        let (seed, end_at) = (self.seed, self.knobs.end_at_delivery);
        let mut walk = Walk {
            node: &mut self.nodes[n],
            left: 1_000_000,
            seed,
            end_at: end_at.map(|d| (d, now, key)),
            delivered: 0,
            rearmed: None,
        };
        walk_read(&mut walk, now, key, rx);
        // The next read, started by the walk's end as the transport does.
        if let Some(buf) = walk.rearmed.take() {
            self.apply(n, Action::Receive { conn: key, buf });
        }
    }

    fn ready(&self) -> Vec<Item> {
        let mut v = Vec::new();
        for (s, k) in self.socks.iter().enumerate() {
            let Owner::Node(n) = k.owner else { continue };
            if k.closed || !self.nodes[n].alive {
                continue;
            }
            if k.accept_pending {
                v.push(Item::Accept(s));
                continue;
            }
            if k.connect_pending {
                v.push(Item::Connect(s));
            }
            if k.tx.is_some() && (k.closing || self.knobs.stall != Some(n)) {
                v.push(Item::SendDone(s));
            }
            if k.rx.is_some() || k.provided {
                if k.closing {
                    v.push(Item::Cancel(s));
                } else if !k.inbox.is_empty() {
                    v.push(if k.provided {
                        Item::ReadProvided(s)
                    } else {
                        Item::Read(s)
                    });
                } else if k.peer_closed {
                    v.push(Item::Eof(s));
                }
            }
            if k.pausing {
                // Buffers the kernel filled before the pause took effect still arrive.
                if !k.closing && !k.inbox.is_empty() {
                    v.push(Item::ReadProvided(s));
                }
                v.push(Item::Paused(s));
            }
            if k.closing
                && !k.connect_pending
                && k.tx.is_none()
                && k.rx.is_none()
                && !k.provided
                && !k.pausing
            {
                v.push(Item::CloseDone(s));
            }
        }
        v
    }

    /// A read size: sometimes one byte, sometimes a few (straddling a header), sometimes
    /// everything there is.
    fn chunk(&mut self, max: usize) -> usize {
        if !self.knobs.split || max <= 1 {
            return max;
        }
        match self.rng.below(10) {
            0 => 1,
            1 | 2 => 1 + self.rng.below(max.min(30)),
            3..=6 => 1 + self.rng.below(max),
            _ => max,
        }
    }

    fn node_of(&self, s: usize) -> (usize, ConnKey) {
        match self.socks[s].owner {
            Owner::Node(n) => (n, self.socks[s].key.expect("accepted")),
            Owner::Raw => unreachable!("raw ends have no engine"),
        }
    }

    fn exec(&mut self, it: Item) {
        let now = self.now();
        match it {
            Item::Accept(s) => {
                let Owner::Node(n) = self.socks[s].owner else {
                    unreachable!()
                };
                self.socks[s].accept_pending = false;
                let key = self.alloc_key(n, s);
                self.socks[s].key = Some(key);
                // The source address: a node dials from its own address.
                let src = self.socks[s].other.map(|o| match self.socks[o].owner {
                    Owner::Node(m) => addr(m).ip(),
                    Owner::Raw => self.socks[o].src.unwrap_or(RAW_SRC),
                });
                match src {
                    Some(ip) => self.nodes[n].core.handle_accepted_from(now, key, ip),
                    None => self.nodes[n].core.handle_accepted(now, key),
                }
                self.pump(n);
            }
            Item::Connect(s) => {
                let (n, key) = self.node_of(s);
                self.socks[s].connect_pending = false;
                let result = if self.socks[s].closing {
                    Err(Errno::ECANCELED)
                } else if self.socks[s].other.is_some() {
                    Ok(())
                } else {
                    Err(Errno::ECONNREFUSED)
                };
                self.nodes[n].core.handle_connected(now, key, result);
                self.pump(n);
            }
            Item::SendDone(s) => {
                let (n, key) = self.node_of(s);
                let batch = self.socks[s].tx.take().expect("send in flight");
                let err = self.socks[s].tx_err.take();
                let result = match err {
                    Some(e) => Err(e),
                    None if self.socks[s].closing => Err(Errno::ECANCELED),
                    None => Ok(()),
                };
                // As the transport: the engine says whether the socket now acknowledges
                // at once.
                if self.nodes[n].core.handle_sent(now, key, batch, result) {
                    self.nodes[n].quick_acks.push(key);
                }
                self.pump(n);
            }
            Item::Read(s) => {
                let (n, key) = self.node_of(s);
                let mut rx = self.socks[s].rx.take().expect("read armed");
                let room = rx.spare_mut().len();
                assert!(
                    room > 0,
                    "seed {}: node {n}: read armed with a full buffer",
                    self.seed
                );
                let avail = self.socks[s].inbox.len();
                let want = self.chunk(room.min(avail));
                let spare = rx.spare_mut();
                for (d, b) in spare.iter_mut().zip(self.socks[s].inbox.drain(..want)) {
                    *d = b;
                }
                rx.commit(want);
                self.socks[s].read_bytes += want;
                self.walk(n, key, rx);
                self.pump(n);
            }
            Item::ReadProvided(s) => {
                let (n, key) = self.node_of(s);
                let avail = self.socks[s].inbox.len().min(PROVIDED_BUF);
                let want = self.chunk(avail);
                let input: Vec<u8> = self.socks[s].inbox.drain(..want).collect();
                if let Some(mut rx) = self.nodes[n].core.input_begin(key) {
                    let mut at = 0;
                    let mut guard = 0usize;
                    loop {
                        guard += 1;
                        assert!(
                            guard < 1_000_000,
                            "seed {}: input_step does not end",
                            self.seed
                        );
                        match self.nodes[n]
                            .core
                            .input_step(now, key, &mut rx, &input, &mut at)
                        {
                            InputStep::Deliver { peer, tag, src } => {
                                let payload = match src {
                                    Source::Input(r) => input[r].to_vec(),
                                    Source::Cache(r) => rx.bytes(r).to_vec(),
                                };
                                self.nodes[n].got.push((peer, tag, payload));
                            }
                            InputStep::Done => {
                                assert_eq!(at, input.len(), "seed {}: input left", self.seed);
                                self.nodes[n].core.input_done(key, rx);
                                break;
                            }
                            InputStep::Drop => break,
                        }
                    }
                }
                self.pump(n);
            }
            Item::Paused(s) => {
                let (n, key) = self.node_of(s);
                self.socks[s].pausing = false;
                self.nodes[n].core.handle_provided_paused(key);
                self.pump(n);
            }
            Item::Eof(s) | Item::Cancel(s) => {
                let (n, key) = self.node_of(s);
                self.socks[s].rx = None;
                self.socks[s].provided = false;
                let err = matches!(it, Item::Cancel(_)).then_some(Errno::ECANCELED);
                self.nodes[n].core.handle_recv_end(now, key, err);
                self.pump(n);
            }
            Item::CloseDone(s) => {
                let (n, key) = self.node_of(s);
                self.socks[s].closed = true;
                if let Some(o) = self.socks[s].other {
                    self.socks[o].peer_closed = true;
                }
                self.nodes[n].keys.remove(&key);
                self.nodes[n].free.push(key.0);
                self.nodes[n].core.handle_closed(key);
                self.pump(n);
            }
        }
    }

    fn fire_due_timers(&mut self) {
        let now = self.now();
        for n in 0..self.nodes.len() {
            if !self.nodes[n].alive {
                continue;
            }
            if self.nodes[n].core.poll_timeout().is_some_and(|t| t <= now) {
                self.nodes[n].core.handle_timeout(now);
                self.pump(n);
            }
        }
    }

    /// Performs one ready completion chosen at random. False when nothing is ready.
    fn step(&mut self) -> bool {
        let items = self.ready();
        if items.is_empty() {
            return false;
        }
        let it = items[self.rng.below(items.len())];
        self.exec(it);
        if self.knobs.jitter && self.rng.chance(1, 8) {
            self.offset += Duration::from_micros(self.rng.below(200) as u64);
            self.fire_due_timers();
        }
        true
    }

    fn pump_all(&mut self) {
        for n in 0..self.nodes.len() {
            self.pump(n);
        }
    }

    /// Up to `k` steps (no waiting for timers).
    fn steps(&mut self, k: usize) {
        self.pump_all();
        for _ in 0..k {
            if !self.step() {
                break;
            }
        }
    }

    /// Runs until nothing is ready, optionally advancing the clock to the next timer
    /// whenever the network is quiet.
    fn run(&mut self, timers: bool) {
        self.pump_all();
        let mut n = 0;
        loop {
            n += 1;
            assert!(
                n < STEP_LIMIT,
                "seed {}: network not idle after {STEP_LIMIT} steps; ready: {:?}",
                self.seed,
                self.ready()
            );
            if self.step() {
                continue;
            }
            if !timers || !self.next_timer() {
                return;
            }
        }
    }

    /// Moves the clock to the earliest timer of a live node and fires what is due then;
    /// false when no node has a timer.
    fn next_timer(&mut self) -> bool {
        let next = self
            .nodes
            .iter()
            .filter(|x| x.alive)
            .filter_map(|x| x.core.poll_timeout())
            .min();
        let Some(t) = next else { return false };
        if t > self.now() {
            self.offset = t - self.base;
        }
        self.fire_due_timers();
        true
    }

    /// As [`drive`](Self::drive), until `done` holds (true) or the clock passed `until`
    /// (false).
    fn drive_until(&mut self, until: Instant, done: impl Fn(&Self) -> bool) -> bool {
        self.pump_all();
        for _ in 0..STEP_LIMIT {
            if done(self) {
                return true;
            }
            if self.now() > until || (!self.step() && !self.next_timer()) {
                return done(self);
            }
        }
        panic!("seed {}: not done after {STEP_LIMIT} steps", self.seed);
    }

    fn drive(&mut self) {
        self.run(true);
    }

    /// Node `n` dies: its sockets vanish, peers see EOF, nobody listens at its address.
    fn crash(&mut self, n: usize) {
        self.nodes[n].alive = false;
        self.listeners.remove(&addr(n));
        for s in 0..self.socks.len() {
            if self.socks[s].owner == Owner::Node(n) && !self.socks[s].closed {
                self.socks[s].closed = true;
                self.socks[s].rx = None;
                self.socks[s].provided = false;
                self.socks[s].pausing = false;
                self.socks[s].tx = None;
                if let Some(o) = self.socks[s].other {
                    self.socks[o].peer_closed = true;
                    self.socks[o].peer_dead = true;
                }
            }
        }
    }

    /// Frames in the batches node `n` has handed to the kernel and not got back.
    fn inflight_frames(&self, n: usize) -> usize {
        self.socks
            .iter()
            .filter(|k| k.owner == Owner::Node(n) && !k.closed)
            .filter_map(|k| k.tx.as_ref())
            .map(TxBatch::frames)
            .sum()
    }

    /// Asserts that every message `from` accepted for `to` arrived, in order, once.
    fn assert_all_delivered(&self, from: usize, to: usize) {
        let want: Vec<Msg> = self.sent(from, to).into_iter().map(|(_, m)| m).collect();
        let got = self.received(to, from);
        assert_eq!(
            got.len(),
            want.len(),
            "seed {}: {from} -> {to}: {} delivered, {} sent",
            self.seed,
            got.len(),
            want.len()
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w,
                "seed {}: {from} -> {to}: message {i} differs",
                self.seed
            );
        }
    }

    /// Asserts that what `to` received from `from` is exactly the sends that completed Ok
    /// (in order), and returns the completions.
    fn assert_delivered_iff_ok(
        &self,
        from: usize,
        to: usize,
    ) -> BTreeMap<u64, Result<(), FailReason>> {
        let done = self.completions(from);
        let want: Vec<Msg> = self
            .sent(from, to)
            .into_iter()
            .filter(|(c, _)| done[c].is_ok())
            .map(|(_, m)| m)
            .collect();
        let got = self.received(to, from);
        assert!(
            got == want,
            "seed {}: {from} -> {to}: {} delivered, {} completed Ok",
            self.seed,
            got.len(),
            want.len()
        );
        done
    }

    /// Asserts that what `to` received from `from` is a prefix of what was sent.
    fn assert_prefix_delivered(&self, from: usize, to: usize) {
        let want: Vec<Msg> = self.sent(from, to).into_iter().map(|(_, m)| m).collect();
        let got = self.received(to, from);
        assert!(
            got.len() <= want.len(),
            "seed {}: more delivered than sent",
            self.seed
        );
        assert!(
            got[..] == want[..got.len()],
            "seed {}: {from} -> {to}: delivered frames are not a prefix of the sent ones",
            self.seed
        );
    }
}

fn connected(net: &Net, n: usize, peer: u32) -> bool {
    net.nodes[n].core.state(PeerId(peer)) == Some(EndpointState::Connected)
}

/// Brings up the 0 <-> 1 connection with one message and drains it.
fn connect_pair(net: &mut Net) {
    net.send(0, 1, 1, b"hi".to_vec()).unwrap();
    net.drive();
    assert!(
        connected(net, 0, 1) && connected(net, 1, 0),
        "seed {}: pair not connected",
        net.seed
    );
}

/// A raw end that completed the handshake with node 0 as process `pid`.
fn raw_peer(net: &mut Net, pid: u32) -> usize {
    let r = net.raw_dial(0);
    net.raw_hello(r, pid);
    let h = net
        .raw_auth(r, pid, &JobKey::from_bytes(KEY), TOKEN)
        .expect("an answer record");
    assert_eq!(h.kind, HelloKind::Accept);
    assert_eq!(h.pid, PeerId(0));
    assert!(connected(net, 0, pid));
    r
}

/// The frames in `bytes` (a whole number of them): header, and what follows it.
fn frames(bytes: &[u8]) -> Vec<(Header, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let h = Header::parse(&bytes[at..], u32::MAX).expect("a valid header");
        let end = at + Header::LEN + h.len as usize;
        out.push((h, &bytes[at + Header::LEN..end]));
        at = end;
    }
    assert_eq!(at, bytes.len(), "whole frames");
    out
}

/// A raw peer (process 1) whose first frame reached node 0, so that node 0's frames
/// leave at once (not at the first-bytes deadline) and no timer is needed.
fn confirmed_raw_peer(net: &mut Net) -> usize {
    let r = raw_peer(net, 1);
    net.raw_write(r, &frame(FrameKind::Send, 9, b"hi"));
    net.run(false);
    r
}

fn frame(kind: FrameKind, tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Header {
        kind,
        tag: Tag(tag),
        len: payload.len() as u32,
        ack: false,
        line: 0,
    }
    .to_bytes()
    .to_vec();
    v.extend_from_slice(payload);
    v
}

/// Bytes written by end `s` arrive at its other end `o`.
fn wire_out(socks: &mut [Sock], s: usize, o: usize, bytes: &[u8]) {
    if socks[s].head.len() < 2 * HELLO_LEN {
        let need = 2 * HELLO_LEN - socks[s].head.len();
        let take = need.min(bytes.len());
        socks[s].head.extend_from_slice(&bytes[..take]);
    }
    socks[o].inbox.extend(bytes);
}

/// A write at once of `bytes` by node `n` on its end `s` (`Transport::send`'s): the socket
/// takes all of them, a part (a full buffer) or none, as the knobs or the random source
/// say; a closing or broken connection takes none (the batch's own send meets the error).
/// Returns the count taken.
fn write_at_once(
    socks: &mut [Sock],
    rng: &mut Rng,
    knobs: &Knobs,
    seed: u64,
    n: usize,
    s: usize,
    bytes: &[u8],
) -> usize {
    assert!(
        socks[s].tx.is_none(),
        "seed {seed}: node {n}: bytes written at once on end {s} beside a send in flight"
    );
    let Some(o) = socks[s].other else { return 0 };
    if socks[s].closing || socks[o].closed || socks[s].peer_dead {
        return 0;
    }
    let take = match knobs.at_once {
        Some(t) => t.min(bytes.len()),
        None => match rng.below(4) {
            0 => 0,
            1 => rng.below(bytes.len()),
            _ => bytes.len(),
        },
    };
    wire_out(socks, s, o, &bytes[..take]);
    take
}
