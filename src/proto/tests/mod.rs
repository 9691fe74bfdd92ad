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
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use super::core::{
    Action, ConnKey, Core, CoreConfig, CoreEvent, EndpointState, InputStep, Source, Step,
};
use crate::buf::{RxBuf, TxBatch};
use crate::error::{Errno, FailReason, ProtoError, SendError, WireError};
use crate::wire::{
    FrameKind, Header, Hello, HelloKind, PeerId, RejectReason, Tag, HELLO_LEN, VERSION,
};

mod input;

pub(super) const TOKEN: u64 = 0x5249_4e47_4254_4c00;
const STEP_LIMIT: usize = 2_000_000;

/// xorshift64*: small, fast, good enough to pick interleavings.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self((seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xd1b5_4a32_d192_ed03) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 7000))
}

/// The engine configuration these tests use (process `pid`).
pub(super) fn cfg(pid: u32) -> CoreConfig {
    CoreConfig {
        pid: PeerId(pid),
        token: TOKEN,
        recv_cache: 64 * 1024,
        max_frame: 1 << 20,
        inline_limit: 1024,
        coalesce_bytes: 256 * 1024,
        max_iov: 256,
        connect_retries: 4,
        retry_delay: Duration::from_millis(20),
        handshake_timeout: Duration::from_secs(5),
        max_half_open: 1024,
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
    closed: bool,
    /// The first handshake record this end wrote.
    head: Vec<u8>,
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
            closed: false,
            head: Vec::new(),
        }
    }

    fn first_record(&self) -> Option<Hello> {
        (self.head.len() >= HELLO_LEN).then(|| Hello::parse(&self.head).expect("valid record"))
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
}

impl Net {
    /// One node per config; config `i` must have pid `i`. Every node knows every other
    /// and listens on `addr(i)`.
    fn new(seed: u64, cfgs: Vec<CoreConfig>) -> Self {
        let n = cfgs.len();
        let mut nodes = Vec::new();
        let mut listeners = HashMap::new();
        for (i, c) in cfgs.into_iter().enumerate() {
            assert_eq!(c.pid, PeerId(i as u32), "node index must equal its pid");
            let mut core = Core::new(c);
            for j in (0..n).filter(|&j| j != i) {
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
            });
        }
        Self {
            seed,
            rng: Rng::new(seed),
            knobs: Knobs {
                split: true,
                jitter: true,
                stall: None,
            },
            base: Instant::now(),
            offset: Duration::ZERO,
            nodes,
            socks: Vec::new(),
            listeners,
            raw_accepted: Vec::new(),
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
        let node = &mut self.nodes[n];
        let cookie = node.next_cookie;
        node.core.send(now, PeerId(to), Tag(tag), &segs, cookie)?;
        node.next_cookie += 1;
        node.sent.insert(cookie, (PeerId(to), tag, payload));
        Ok(cookie)
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
        let r = self.socks.len();
        let t = r + 1;
        self.socks.push(Sock::new(Owner::Raw, None, Some(t), true));
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

    /// Raw handshake as process `pid`.
    fn raw_hello(&mut self, r: usize, pid: u32, token: u64) {
        let h = Hello {
            kind: HelloKind::Hello,
            version: VERSION,
            pid: PeerId(pid),
            token,
        };
        self.raw_write(r, &h.to_bytes());
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
        self.nodes[n].core.flush();
        while let Some(a) = self.nodes[n].core.poll_action() {
            self.apply(n, a);
        }
        while let Some(e) = self.nodes[n].core.poll_event() {
            self.nodes[n].events.push(e);
        }
    }

    fn apply(&mut self, n: usize, a: Action) {
        match a {
            Action::Dial { peer, addr, .. } => {
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
                self.nodes[n].core.dial_started(peer, key);
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
                        Some(o) if !self.socks[o].closed => {
                            if self.socks[s].head.len() < HELLO_LEN {
                                let need = HELLO_LEN - self.socks[s].head.len();
                                let take = need.min(bytes.len());
                                self.socks[s].head.extend_from_slice(&bytes[..take]);
                            }
                            self.socks[o].inbox.extend(&bytes);
                        }
                        _ => {
                            // Writing to a connection the peer has closed: either the bytes
                            // vanish or the kernel reports the reset (always, once the peer
                            // process is gone).
                            if self.socks[s].peer_dead || self.rng.chance(1, 2) {
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
            Action::Close(k) => {
                let s = self.sock_of(n, k);
                assert!(
                    !self.socks[s].closing,
                    "seed {}: node {n}: {k:?} closed twice",
                    self.seed
                );
                self.socks[s].closing = true;
            }
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
                self.nodes[n].core.handle_accepted(now, key);
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
                self.nodes[n].core.handle_sent(now, key, batch, result);
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
                let mut guard = 0usize;
                loop {
                    guard += 1;
                    assert!(
                        guard < 1_000_000,
                        "seed {}: recv_step does not end",
                        self.seed
                    );
                    match self.nodes[n].core.recv_step(now, key, &mut rx) {
                        Step::Deliver { peer, tag, range } => {
                            let payload = rx.bytes(range).to_vec();
                            self.nodes[n].got.push((peer, tag, payload));
                        }
                        Step::Rearm => {
                            self.nodes[n].core.recv_done(key, rx);
                            break;
                        }
                        Step::Drop => break,
                    }
                }
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
            if !timers {
                return;
            }
            let next = self
                .nodes
                .iter()
                .filter(|x| x.alive)
                .filter_map(|x| x.core.poll_timeout())
                .min();
            let Some(t) = next else { return };
            if t > self.now() {
                self.offset = t - self.base;
            }
            self.fire_due_timers();
        }
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
    net.raw_hello(r, pid, TOKEN);
    net.drive();
    let ans = net.raw_read(r);
    let h = Hello::parse(&ans).expect("an answer record");
    assert_eq!(h.kind, HelloKind::Accept);
    assert_eq!(h.pid, PeerId(0));
    assert!(connected(net, 0, pid));
    r
}

fn frame(kind: FrameKind, tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Header {
        kind,
        tag: Tag(tag),
        len: payload.len() as u32,
    }
    .to_bytes()
    .to_vec();
    v.extend_from_slice(payload);
    v
}

// ----- 1. lazy connect and handshake ---------------------------------------------------------

#[test]
fn lazy_connect_queues_until_connected() {
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        net.send(0, 1, 7, b"first".to_vec()).unwrap();
        assert_eq!(
            net.core(0).state(PeerId(1)),
            Some(EndpointState::Connecting),
            "the first send dials"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), 1);
        // More frames while the connect and handshake are in progress.
        let k = net.rng.below(12);
        net.steps(k);
        let more = net.rng.below(20);
        for i in 0..more {
            let p = net.rng.bytes(i * 13);
            net.send(0, 1, i as u8, p).unwrap();
        }
        net.drive();
        assert!(
            connected(&net, 0, 1) && connected(&net, 1, 0),
            "seed {seed}"
        );
        assert_eq!(net.nodes[0].dials.len(), 1, "seed {seed}: one dial");
        assert_eq!(net.nodes[0].dials[0], (PeerId(1), addr(1)));
        assert!(
            net.nodes[1].dials.is_empty(),
            "seed {seed}: the acceptor never dials"
        );
        for (n, p) in [(0, 1), (1, 0)] {
            let c = net.count_events(n, |e| *e == CoreEvent::Connected(PeerId(p)));
            assert_eq!(c, 1, "seed {seed}: node {n}: one Connected event");
        }
        net.assert_all_delivered(0, 1);
        assert!(
            net.completions(0).values().all(Result::is_ok),
            "seed {seed}"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), 0);
        assert_eq!(net.open_socks(0).len(), 1);
        assert_eq!(net.open_socks(1).len(), 1);
        assert_eq!(net.core(1).counters().refused, 0);
        assert_eq!(net.core(0).counters().simultaneous, 0);
    }
}

// ----- 2. random traffic, random splits ------------------------------------------------------

fn random_traffic(seed: u64, nodes: usize) -> Net {
    let mut cfgs: Vec<CoreConfig> = (0..nodes as u32).map(cfg).collect();
    let mut rng = Rng::new(seed ^ 0xabcd);
    for c in &mut cfgs {
        if seed.is_multiple_of(3) {
            c.recv_cache = 4096;
        }
        if rng.chance(1, 3) {
            c.coalesce_bytes = 1 + rng.below(16 * 1024);
            c.max_iov = 8 + rng.below(24);
        }
        if rng.chance(1, 3) {
            c.inline_limit = rng.below(4096);
        }
    }
    let mut net = Net::new(seed, cfgs);
    let bursts = 1 + net.rng.below(5);
    for _ in 0..bursts {
        for from in 0..nodes {
            for to in (0..nodes).filter(|&t| t != from) {
                let k = net.rng.below(12);
                for _ in 0..k {
                    net.send_random(from, to as u32).unwrap();
                }
            }
        }
        let k = net.rng.below(200);
        net.steps(k);
    }
    net.drive();
    net
}

#[test]
fn random_frames_both_ways_arrive_in_order_once() {
    for seed in 0..120 {
        let net = random_traffic(seed, 2);
        for (a, b) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(a, b);
            assert!(
                net.completions(a).values().all(Result::is_ok),
                "seed {seed}"
            );
            assert!(net.failed_events(a).is_empty(), "seed {seed}");
        }
        // Whatever the interleaving, one connection per pair survives (if any was needed).
        let (s0, s1) = (net.open_socks(0), net.open_socks(1));
        if net.nodes[0].sent.is_empty() && net.nodes[1].sent.is_empty() {
            assert!(
                s0.is_empty() && s1.is_empty(),
                "seed {seed}: a connection nobody needed"
            );
            continue;
        }
        assert_eq!((s0.len(), s1.len()), (1, 1), "seed {seed}");
        assert_eq!(net.socks[s0[0]].other, Some(s1[0]), "seed {seed}");
    }
}

#[test]
fn three_nodes_all_to_all() {
    for seed in 0..40 {
        let net = random_traffic(seed, 3);
        for a in 0..3 {
            for b in (0..3).filter(|&b| b != a) {
                net.assert_all_delivered(a, b);
            }
            assert!(
                net.completions(a).values().all(Result::is_ok),
                "seed {seed}"
            );
            assert!(net.failed_events(a).is_empty(), "seed {seed}");
            let needed = (0..3)
                .filter(|&b| b != a)
                .filter(|&b| !net.sent(a, b).is_empty() || !net.sent(b, a).is_empty())
                .count();
            assert_eq!(
                net.open_socks(a).len(),
                needed,
                "seed {seed}: node {a}: one conn per peer"
            );
        }
    }
}

// ----- 3. simultaneous connect ---------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Order {
    ZeroFirst,
    OneFirst,
    AtOnce,
}

fn simultaneous(seed: u64, order: Order) {
    let mut net = Net::pair(seed);
    let (first, second) = match order {
        Order::ZeroFirst | Order::AtOnce => (0, 1),
        Order::OneFirst => (1, 0),
    };
    let n1 = 1 + net.rng.below(5);
    for _ in 0..n1 {
        net.send_random(first, second as u32).unwrap();
    }
    let lead = match order {
        Order::AtOnce => 0,
        _ => net.rng.below(10),
    };
    net.steps(lead);
    let n2 = 1 + net.rng.below(5);
    for _ in 0..n2 {
        net.send_random(second, first as u32).unwrap();
    }
    if matches!(order, Order::AtOnce) {
        // Both dials exist before either side hears anything.
        net.pump_all();
        assert_eq!(net.nodes[0].dials.len(), 1);
        assert_eq!(net.nodes[1].dials.len(), 1);
    }
    // More traffic while the race is being resolved.
    let k = net.rng.below(30);
    net.steps(k);
    for _ in 0..net.rng.below(4) {
        net.send_random(0, 1).unwrap();
        net.send_random(1, 0).unwrap();
    }
    net.drive();

    let ctx = format!("seed {seed} {order:?}");
    assert!(connected(&net, 0, 1) && connected(&net, 1, 0), "{ctx}");
    for (a, b) in [(0, 1), (1, 0)] {
        net.assert_all_delivered(a, b);
        assert!(net.completions(a).values().all(Result::is_ok), "{ctx}");
        assert!(net.failed_events(a).is_empty(), "{ctx}");
        let c = net.count_events(a, |e| *e == CoreEvent::Connected(PeerId(b as u32)));
        assert_eq!(c, 1, "{ctx}: node {a}: one Connected event");
    }
    // Exactly one connection survives, the same one on both sides.
    let (s0, s1) = (net.open_socks(0), net.open_socks(1));
    assert_eq!((s0.len(), s1.len()), (1, 1), "{ctx}: surviving sockets");
    assert_eq!(
        net.socks[s0[0]].other,
        Some(s1[0]),
        "{ctx}: both keep the same connection"
    );
    let winner = if net.socks[s0[0]].dialer {
        s0[0]
    } else {
        s1[0]
    };
    // No acceptor ever said ACCEPT on a connection that did not survive: nobody adopted a
    // dead socket. The losing dials were refused as simultaneous (or duplicate), or
    // closed before any answer.
    for s in 0..net.socks.len() {
        let k = &net.socks[s];
        if k.dialer {
            continue;
        }
        let dial = k.other.expect("acceptor has a dialer");
        if dial == winner {
            assert_eq!(
                k.first_record().map(|h| h.kind),
                Some(HelloKind::Accept),
                "{ctx}"
            );
            continue;
        }
        match k.first_record().map(|h| h.kind) {
            None
            | Some(HelloKind::Reject(RejectReason::Simultaneous))
            | Some(HelloKind::Reject(RejectReason::Duplicate)) => {}
            other => panic!("{ctx}: a losing dial was answered with {other:?}"),
        }
    }
    let sim = net.core(0).counters().simultaneous + net.core(1).counters().simultaneous;
    let dials = net.nodes[0].dials.len() + net.nodes[1].dials.len();
    if matches!(order, Order::AtOnce) {
        assert!(sim > 0, "{ctx}: the dials crossed");
        assert_eq!(dials, 2, "{ctx}: nobody redials");
    }
    if dials == 1 {
        assert_eq!(sim, 0, "{ctx}");
    }
}

#[test]
fn simultaneous_connect_zero_first() {
    for seed in 0..200 {
        simultaneous(seed, Order::ZeroFirst);
    }
}

#[test]
fn simultaneous_connect_one_first() {
    for seed in 0..200 {
        simultaneous(seed, Order::OneFirst);
    }
}

#[test]
fn simultaneous_connect_at_once() {
    for seed in 0..200 {
        simultaneous(seed, Order::AtOnce);
    }
}

#[test]
fn simultaneous_connect_without_split_reads() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        net.knobs.split = false;
        net.knobs.jitter = false;
        net.send(0, 1, 1, b"a".to_vec()).unwrap();
        net.send(1, 0, 2, b"b".to_vec()).unwrap();
        net.drive();
        assert!(
            connected(&net, 0, 1) && connected(&net, 1, 0),
            "seed {seed}"
        );
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        assert!(net.core(0).counters().simultaneous + net.core(1).counters().simultaneous > 0);
    }
}

// ----- 4. FIN --------------------------------------------------------------------------------

#[test]
fn fin_closes_both_sides_cleanly() {
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        for _ in 0..net.rng.below(10) {
            net.send_random(0, 1).unwrap();
        }
        for _ in 0..net.rng.below(10) {
            net.send_random(1, 0).unwrap();
        }
        let k = net.rng.below(40);
        net.steps(k);
        net.core(0).shutdown();
        assert_eq!(net.send(0, 1, 0, vec![1]), Err(SendError::ShuttingDown));
        let both = net.rng.chance(1, 3);
        let mut late = 0;
        let mut k = net.rng.below(60);
        while net.step() {
            if both && k == 0 {
                net.core(1).shutdown();
            }
            let heard = net.nodes[1]
                .events
                .contains(&CoreEvent::PeerClosed(PeerId(0)));
            if !both && !heard && late < 3 && net.rng.chance(1, 4) {
                // Node 1 keeps sending while the FIN travels.
                match net.send_random(1, 0) {
                    Ok(_) => {}
                    Err(SendError::Unreachable(p)) => assert_eq!(p, PeerId(0)),
                    Err(e) => panic!("seed {seed}: unexpected {e:?}"),
                }
                late += 1;
            }
            k = k.saturating_sub(1);
        }
        if both {
            net.core(1).shutdown();
        }
        net.drive();
        let ctx = format!("seed {seed}");
        // Every frame queued before the FIN arrived; after it, nothing.
        net.assert_all_delivered(0, 1);
        assert!(net.completions(0).values().all(Result::is_ok), "{ctx}");
        let done = net.assert_delivered_iff_ok(1, 0);
        for r in done.values() {
            assert!(
                matches!(r, Ok(()) | Err(FailReason::PeerClosed(PeerId(0)))),
                "{ctx}: {r:?}"
            );
        }
        assert_eq!(
            net.count_events(1, |e| *e == CoreEvent::PeerClosed(PeerId(0))),
            1,
            "{ctx}: the peer hears the FIN once"
        );
        for n in 0..2 {
            assert!(
                net.failed_events(n).is_empty(),
                "{ctx}: node {n}: {:?}",
                net.failed_events(n)
            );
            assert!(
                net.open_socks(n).is_empty(),
                "{ctx}: node {n} keeps a socket"
            );
            assert!(net.core(n).is_quiescent(), "{ctx}: node {n} not quiescent");
            assert_eq!(net.core(n).pending(PeerId(1 - n as u32)), 0);
        }
        assert!(
            net.nodes[0].keys.is_empty() && net.nodes[1].keys.is_empty(),
            "{ctx}: all closed"
        );
    }
}

#[test]
fn fin_while_a_batch_is_still_in_flight() {
    let mut modes = [0usize; 3];
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        let slow = net.rng.below(2);
        let other = 1 - slow;
        for _ in 0..1 + net.rng.below(5) {
            net.send_random(slow, other as u32).unwrap();
        }
        for _ in 0..net.rng.below(5) {
            net.send_random(other, slow as u32).unwrap();
        }
        let mode = net.rng.below(3);
        modes[mode] += 1;
        // With its FIN in the same batch, or queued behind it.
        let fin_in_batch = mode != 1 && net.rng.chance(1, 2);
        if fin_in_batch {
            net.core(slow).shutdown();
        }
        // The slow side's batch is in the kernel and its completion is late.
        net.knobs.stall = Some(slow);
        net.pump_all();
        match mode {
            0 if fin_in_batch => {}
            0 => net.core(slow).shutdown(),
            1 => net.core(other).shutdown(),
            _ => {
                // Both leave.
                if !fin_in_batch {
                    net.core(slow).shutdown();
                }
                let k = net.rng.below(10);
                net.steps(k);
                net.core(other).shutdown();
            }
        }
        net.run(false);
        net.knobs.stall = None;
        net.drive();
        let ctx = format!("seed {seed} mode {mode}");
        for (a, b) in [(0, 1), (1, 0)] {
            let done = net.assert_delivered_iff_ok(a, b);
            for r in done.values() {
                assert!(
                    matches!(r, Ok(()) | Err(FailReason::PeerClosed(_))),
                    "{ctx}: {r:?}"
                );
            }
            assert!(
                net.failed_events(a).is_empty(),
                "{ctx}: {:?}",
                net.failed_events(a)
            );
            assert!(net.core(a).is_quiescent(), "{ctx}: node {a} not quiescent");
            assert!(
                net.nodes[a].keys.is_empty(),
                "{ctx}: node {a} keeps sockets"
            );
        }
        // Whoever shut down first had every frame it accepted delivered.
        let first = if mode == 1 { other } else { slow };
        net.assert_all_delivered(first, 1 - first);
    }
    assert!(modes.iter().all(|&m| m > 0));
}

#[test]
fn fins_crossing_before_either_is_flushed() {
    for seed in 0..50 {
        let mut net = Net::pair(seed);
        net.knobs.split = false;
        connect_pair(&mut net);
        for _ in 0..net.rng.below(4) {
            net.send_random(1, 0).unwrap();
        }
        net.core(0).shutdown();
        net.pump(0);
        // Node 1 shuts down too; its FIN (and frames) are queued, not yet flushed, when
        // its next pass starts with the read that holds node 0's FIN.
        net.core(1).shutdown();
        let read = net
            .ready()
            .into_iter()
            .find(|it| matches!(it, Item::Read(s) if net.socks[*s].owner == Owner::Node(1)))
            .expect("node 0's FIN is waiting for node 1");
        net.exec(read);
        net.drive();
        let ctx = format!("seed {seed}");
        for (a, b) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(a, b);
            assert!(net.completions(a).values().all(Result::is_ok), "{ctx}");
            assert!(
                net.failed_events(a).is_empty(),
                "{ctx}: {:?}",
                net.failed_events(a)
            );
            assert!(net.core(a).is_quiescent(), "{ctx}");
            assert!(net.nodes[a].keys.is_empty(), "{ctx}");
        }
    }
}

#[test]
fn send_after_peer_fin_is_refused_or_fails() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        net.core(0).shutdown();
        net.pump_all();
        if seed.is_multiple_of(2) {
            // Right after the FIN arrived, while the connection is still being closed.
            while !net.nodes[1]
                .events
                .contains(&CoreEvent::PeerClosed(PeerId(0)))
            {
                assert!(net.step(), "seed {seed}: FIN never arrived");
            }
        } else {
            // After both sides closed.
            net.drive();
            assert_eq!(net.core(1).state(PeerId(0)), Some(EndpointState::Closed));
        }
        let retries = net.core(1).counters().connect_retries;
        let dials = net.nodes[1].dials.len();
        match net.send(1, 0, 3, b"late".to_vec()) {
            Err(SendError::Unreachable(_)) => {}
            Ok(c) => {
                net.drive();
                let r = &net.completions(1)[&c];
                assert_eq!(
                    *r,
                    Err(FailReason::PeerClosed(PeerId(0))),
                    "seed {seed}: a send after the peer's FIN"
                );
                assert!(
                    net.nodes[1].dials.len() <= dials + 1,
                    "seed {seed}: redials a peer that is shutting down"
                );
                assert_eq!(
                    net.core(1).counters().connect_retries,
                    retries,
                    "seed {seed}: retried a peer that is shutting down"
                );
            }
            Err(e) => panic!("seed {seed}: {e:?}"),
        }
        net.drive();
        net.completions(1);
        assert!(net.received(0, 1).is_empty(), "seed {seed}");
        assert!(net.nodes[0].keys.is_empty() && net.nodes[1].keys.is_empty());
    }
}

// ----- 5. failure ----------------------------------------------------------------------------

#[test]
fn abrupt_close_fails_every_pending_send_once() {
    let mut saw = [false; 2];
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        let stall = seed.is_multiple_of(2);
        for _ in 0..1 + net.rng.below(10) {
            net.send_random(0, 1).unwrap();
        }
        let k = net.rng.below(20);
        net.steps(k);
        if stall {
            // The peer stops reading: the batch in flight never completes by itself.
            net.knobs.stall = Some(0);
        }
        // Something in flight and something queued behind it.
        for _ in 0..1 + net.rng.below(10) {
            net.send_random(0, 1).unwrap();
        }
        net.pump(0);
        let k = net.rng.below(10);
        net.steps(k);
        for _ in 0..1 + net.rng.below(5) {
            net.send_random(0, 1).unwrap();
        }
        let pending = net.core(0).pending(PeerId(1));
        let inflight = net.inflight_frames(0);
        assert!(pending > 0);
        net.crash(1);
        net.drive();
        let ctx = format!("seed {seed}");
        let done = net.completions(0);
        let errs = done.values().filter(|r| r.is_err()).count();
        if stall {
            // Nothing that was pending at the crash can have succeeded.
            assert_eq!(errs, pending, "{ctx}: every pending send fails");
        } else {
            // Only the batch already handed to the kernel may report success.
            assert!(
                errs + inflight >= pending,
                "{ctx}: {errs} failed, {pending} pending"
            );
        }
        saw[usize::from(stall)] |= errs > 0;
        for r in done.values().filter_map(|r| r.as_ref().err()) {
            assert!(
                matches!(
                    r,
                    FailReason::ConnectionLost {
                        peer: PeerId(1),
                        ..
                    }
                ),
                "{ctx}: {r:?}"
            );
        }
        let failed = net.failed_events(0);
        assert_eq!(failed.len(), 1, "{ctx}: one PeerFailed: {failed:?}");
        assert!(matches!(
            failed[0],
            (PeerId(1), FailReason::ConnectionLost { .. })
        ));
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Failed));
        assert_eq!(net.core(0).pending(PeerId(1)), 0);
        net.assert_prefix_delivered(0, 1);
        assert_eq!(
            net.send(0, 1, 0, vec![]),
            Err(SendError::Unreachable(PeerId(1)))
        );
        net.drive();
        assert!(net.open_socks(0).is_empty(), "{ctx}");
        assert!(
            net.nodes[0].keys.is_empty(),
            "{ctx}: node 0 released every socket"
        );
    }
    assert_eq!(saw, [true, true]);
}

#[test]
fn a_batch_in_flight_completes_only_when_it_comes_back() {
    // The peer dies while node 0's batch is with the kernel (the send stalls): the
    // endpoint fails at once, but the sends of that batch complete only when the driver
    // hands it back, since until then the kernel may read their payload memory.
    for seed in 0..50 {
        let ctx = format!("seed {seed}");
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        net.knobs.stall = Some(0);
        let n = 1 + net.rng.below(4);
        for _ in 0..n {
            net.send(0, 1, 1, vec![7; 4096]).unwrap();
        }
        net.pump(0);
        let inflight = net.inflight_frames(0);
        assert_eq!(inflight, n, "{ctx}: one batch carries every send");
        let before = net.count_events(0, |e| matches!(e, CoreEvent::Completed { .. }));
        net.crash(1);
        let eof = net
            .ready()
            .into_iter()
            .find(|i| matches!(i, Item::Eof(_)))
            .expect("node 0 sees the end of the stream");
        net.exec(eof);
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Failed));
        assert_eq!(net.failed_events(0).len(), 1, "{ctx}");
        let after = net.count_events(0, |e| matches!(e, CoreEvent::Completed { .. }));
        assert_eq!(
            after, before,
            "{ctx}: completed while the kernel held the batch"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), n, "{ctx}");
        assert_eq!(net.core(0).orphaned(), n, "{ctx}");
        // The close cancels the send: the batch comes back, the sends complete once.
        net.drive();
        let done = net.completions(0);
        let errs: Vec<_> = done.values().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(errs.len(), n, "{ctx}: {done:?}");
        assert!(
            errs.iter().all(|r| matches!(
                r,
                FailReason::ConnectionLost {
                    peer: PeerId(1),
                    ..
                }
            )),
            "{ctx}: {errs:?}"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), 0, "{ctx}");
        assert_eq!(net.core(0).orphaned(), 0, "{ctx}");
    }
}

#[test]
fn abort_all_fails_pending_sends_once() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        for _ in 0..1 + net.rng.below(10) {
            net.send_random(0, 1).unwrap();
        }
        let k = net.rng.below(40);
        net.steps(k);
        net.core(0).abort_all();
        net.drive();
        let done = net.completions(0);
        for r in done.values() {
            assert!(
                matches!(r, Ok(()) | Err(FailReason::Shutdown)),
                "seed {seed}: {r:?}"
            );
        }
        net.assert_prefix_delivered(0, 1);
        assert!(net.open_socks(0).is_empty(), "seed {seed}");
        assert!(net.core(0).is_quiescent());
    }
}

#[test]
fn crash_of_one_peer_does_not_disturb_the_others() {
    for seed in 0..40 {
        let mut net = Net::new(seed, vec![cfg(0), cfg(1), cfg(2)]);
        for _ in 0..3 {
            for a in 0..3 {
                for b in (0..3).filter(|&b| b != a) {
                    for _ in 0..net.rng.below(4) {
                        net.send_random(a, b as u32).unwrap();
                    }
                }
            }
            let k = net.rng.below(100);
            net.steps(k);
        }
        net.crash(2);
        for _ in 0..net.rng.below(4) {
            net.send_random(0, 1).unwrap();
            net.send_random(1, 0).unwrap();
        }
        net.drive();
        let ctx = format!("seed {seed}");
        for (a, b) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(a, b);
            net.assert_prefix_delivered(a, 2);
            let done = net.completions(a);
            for (c, (to, _, _)) in &net.nodes[a].sent {
                if *to == PeerId(b as u32) {
                    assert!(done[c].is_ok(), "{ctx}");
                }
            }
            let failed = net.failed_events(a);
            assert!(failed.len() <= 1, "{ctx}: {failed:?}");
            assert!(failed.iter().all(|(p, _)| *p == PeerId(2)), "{ctx}");
            assert!(connected(&net, a, b as u32), "{ctx}");
        }
    }
}

/// True if `got` is `want` with some elements left out, order kept.
fn is_subsequence(got: &[Msg], want: &[Msg]) -> bool {
    let mut it = want.iter();
    got.iter().all(|g| it.any(|w| w == g))
}

#[test]
fn random_sends_shutdowns_and_crashes_keep_the_invariants() {
    for seed in 0..300 {
        let mut net = Net::new(seed, vec![cfg(0), cfg(1), cfg(2)]);
        let mut crashed: Option<usize> = None;
        let mut down = [false; 3];
        for _ in 0..5 + net.rng.below(20) {
            match net.rng.below(20) {
                0..=11 => {
                    let a = net.rng.below(3);
                    let b = (a + 1 + net.rng.below(2)) % 3;
                    if crashed == Some(a) {
                        continue;
                    }
                    match net.send_random(a, b as u32) {
                        Ok(_) => {}
                        Err(SendError::Unreachable(p)) => assert_eq!(p, PeerId(b as u32)),
                        Err(SendError::ShuttingDown) => assert!(down[a]),
                        Err(e) => panic!("seed {seed}: {e:?}"),
                    }
                }
                12..=17 => {
                    let k = net.rng.below(60);
                    net.steps(k);
                }
                18 => {
                    let a = net.rng.below(3);
                    if crashed != Some(a) {
                        net.core(a).shutdown();
                        down[a] = true;
                    }
                }
                _ => {
                    if crashed.is_none() {
                        let a = net.rng.below(3);
                        net.crash(a);
                        crashed = Some(a);
                    }
                }
            }
        }
        net.drive();
        let ctx = format!("seed {seed} crashed {crashed:?} down {down:?}");
        for a in (0..3).filter(|&a| crashed != Some(a)) {
            net.completions(a);
            for b in (0..3).filter(|&b| b != a) {
                let failed = net.failed_events(a);
                let n = failed
                    .iter()
                    .filter(|(p, _)| *p == PeerId(b as u32))
                    .count();
                assert!(n <= 1, "{ctx}: node {a}: {failed:?}");
                let broken = n > 0
                    || net
                        .failed_events(b)
                        .iter()
                        .any(|(p, _)| *p == PeerId(a as u32));
                if crashed.is_none() && !broken {
                    // A clean history: delivered exactly when completed Ok.
                    net.assert_delivered_iff_ok(a, b);
                } else {
                    // A send that completed Ok was written, not necessarily read.
                    let want: Vec<Msg> = net.sent(a, b).into_iter().map(|(_, m)| m).collect();
                    assert!(
                        is_subsequence(&net.received(b, a), &want),
                        "{ctx}: {a} -> {b}"
                    );
                }
                assert_eq!(
                    net.core(a).pending(PeerId(b as u32)),
                    0,
                    "{ctx}: {a} -> {b}"
                );
            }
            if down[a] {
                assert!(net.core(a).is_quiescent(), "{ctx}: node {a}");
                assert!(
                    net.nodes[a].keys.is_empty(),
                    "{ctx}: node {a} keeps sockets"
                );
            }
        }
        if let Some(c) = crashed {
            for a in (0..3).filter(|&a| a != c) {
                let want: Vec<Msg> = net.sent(c, a).into_iter().map(|(_, m)| m).collect();
                assert!(
                    is_subsequence(&net.received(a, c), &want),
                    "{ctx}: {c} -> {a}"
                );
            }
        }
    }
}

// ----- 6. connect refused --------------------------------------------------------------------

#[test]
fn connect_refused_fails_after_retries() {
    for seed in 0..50 {
        let mut net = Net::pair(seed);
        net.listeners.remove(&addr(1));
        let retries = cfg(0).connect_retries;
        let delay = cfg(0).retry_delay;
        let n = 1 + net.rng.below(5);
        for _ in 0..n {
            net.send_random(0, 1).unwrap();
        }
        net.drive();
        let ctx = format!("seed {seed}");
        assert_eq!(
            net.nodes[0].dials.len(),
            retries as usize,
            "{ctx}: dial attempts"
        );
        let failed = net.failed_events(0);
        assert_eq!(failed.len(), 1, "{ctx}");
        match &failed[0].1 {
            FailReason::ConnectFailed { peer, attempts, .. } => {
                assert_eq!((*peer, *attempts), (PeerId(1), retries), "{ctx}");
            }
            r => panic!("{ctx}: {r:?}"),
        }
        let done = net.completions(0);
        assert_eq!(done.len(), n);
        assert!(done
            .values()
            .all(|r| matches!(r, Err(FailReason::ConnectFailed { .. }))));
        assert_eq!(
            net.core(0).counters().connect_retries,
            u64::from(retries - 1)
        );
        // The backoff waited delay * (1 + 2 + 4 ...).
        let waited: Duration = (0..retries - 1).map(|i| delay * (1 << i)).sum();
        assert!(net.offset >= waited, "{ctx}: {:?} < {waited:?}", net.offset);
        assert_eq!(
            net.send(0, 1, 0, vec![]),
            Err(SendError::Unreachable(PeerId(1)))
        );
        assert!(
            net.nodes[0].keys.is_empty(),
            "{ctx}: every dial socket closed"
        );
    }
}

#[test]
fn connect_succeeds_when_peer_starts_listening_during_retries() {
    for seed in 0..50 {
        let mut net = Net::pair(seed);
        net.listeners.remove(&addr(1));
        net.send(0, 1, 1, b"x".to_vec()).unwrap();
        net.run(false);
        assert_eq!(net.nodes[0].dials.len(), 1);
        net.listeners.insert(addr(1), Listener::Node(1));
        net.drive();
        assert!(connected(&net, 0, 1), "seed {seed}");
        assert_eq!(net.nodes[0].dials.len(), 2);
        net.assert_all_delivered(0, 1);
        assert!(net.failed_events(0).is_empty());
    }
}

// ----- 7. handshake checks -------------------------------------------------------------------

#[test]
fn wrong_token_is_refused() {
    for seed in 0..50 {
        let mut c1 = cfg(1);
        c1.token = TOKEN ^ 1;
        let mut net = Net::new(seed, vec![cfg(0), c1]);
        for _ in 0..3 {
            net.send_random(1, 0).unwrap();
        }
        net.drive();
        let ctx = format!("seed {seed}");
        assert_eq!(net.core(0).counters().refused, 1, "{ctx}");
        assert_eq!(
            net.count_events(0, |e| *e
                == CoreEvent::Refused {
                    why: ProtoError::BadToken
                }),
            1
        );
        let failed = net.failed_events(1);
        assert_eq!(failed.len(), 1, "{ctx}");
        // The REJECT carries the acceptor's token, which the dialer does not share either.
        assert!(
            matches!(
                &failed[0].1,
                FailReason::Protocol {
                    peer: PeerId(0),
                    err: ProtoError::Rejected(RejectReason::BadToken) | ProtoError::BadToken
                }
            ),
            "{ctx}: {failed:?}"
        );
        assert!(net.completions(1).values().all(Result::is_err));
        assert!(net.received(0, 1).is_empty());
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        assert!(net.failed_events(0).is_empty());
        assert!(
            net.nodes[0].keys.is_empty() && net.nodes[1].keys.is_empty(),
            "{ctx}"
        );
    }
}

#[test]
fn bad_magic_drops_only_that_connection() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        for _ in 0..net.rng.below(6) {
            net.send_random(0, 1).unwrap();
            net.send_random(1, 0).unwrap();
        }
        let r = net.raw_dial(0);
        net.raw_write(r, b"GET / HTTP/1.1\r\nHost: example\r\n\r\n");
        net.drive();
        let ctx = format!("seed {seed}");
        assert_eq!(net.core(0).counters().bad_magic, 1, "{ctx}");
        assert!(net.raw_eof(r), "{ctx}: the stranger's socket is closed");
        assert!(net.raw_read(r).is_empty(), "{ctx}: no answer to a stranger");
        let why = ProtoError::Wire(WireError::BadMagic);
        assert_eq!(
            net.count_events(0, |e| *e == CoreEvent::Refused { why: why.clone() }),
            1
        );
        for (a, b) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(a, b);
            assert!(net.completions(a).values().all(Result::is_ok));
            assert!(net.failed_events(a).is_empty(), "{ctx}");
        }
        assert_eq!(net.core(1).state(PeerId(0)), net.core(0).state(PeerId(1)));
    }
}

#[test]
fn unknown_process_is_refused() {
    let mut net = Net::pair(1);
    let r = net.raw_dial(0);
    net.raw_hello(r, 99, TOKEN);
    net.drive();
    let ans = Hello::parse(&net.raw_read(r)).unwrap();
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::UnknownPeer));
    assert!(net.raw_eof(r));
    assert_eq!(net.core(0).counters().refused, 1);
    assert!(net.nodes[0].keys.is_empty());
    // Our own pid, a wrong version: refused too.
    let r = net.raw_dial(0);
    net.raw_hello(r, 0, TOKEN);
    net.drive();
    let ans = Hello::parse(&net.raw_read(r)).unwrap();
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::UnknownPeer));
    let r = net.raw_dial(0);
    let mut h = Hello {
        kind: HelloKind::Hello,
        version: VERSION + 1,
        pid: PeerId(1),
        token: TOKEN,
    }
    .to_bytes();
    net.raw_write(r, &h);
    net.drive();
    let ans = Hello::parse(&net.raw_read(r)).unwrap();
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::Version));
    assert_eq!(net.core(0).counters().refused, 3);
    // An ACCEPT where a HELLO belongs is garbage: dropped without an answer.
    let r = net.raw_dial(0);
    h[10] = 2;
    h[8..10].copy_from_slice(&VERSION.to_be_bytes());
    net.raw_write(r, &h);
    net.drive();
    assert!(net.raw_read(r).is_empty());
    assert!(net.raw_eof(r));
    assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
    assert!(net.failed_events(0).is_empty());
}

#[test]
fn second_connection_from_a_connected_peer_is_a_duplicate() {
    for seed in 0..30 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        let r = net.raw_dial(0);
        net.raw_hello(r, 1, TOKEN);
        net.drive();
        let ans = Hello::parse(&net.raw_read(r)).unwrap();
        assert_eq!(ans.kind, HelloKind::Reject(RejectReason::Duplicate));
        // The real connection is untouched.
        net.send(0, 1, 5, b"still here".to_vec()).unwrap();
        net.send(1, 0, 5, b"me too".to_vec()).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        assert!(net.failed_events(0).is_empty() && net.failed_events(1).is_empty());
    }
}

#[test]
fn silent_accepted_connection_times_out() {
    for partial in [0usize, 10, 23] {
        let mut net = Net::pair(partial as u64);
        let r = net.raw_dial(0);
        let h = Hello {
            kind: HelloKind::Hello,
            version: VERSION,
            pid: PeerId(1),
            token: TOKEN,
        }
        .to_bytes();
        net.raw_write(r, &h[..partial]);
        net.run(false);
        assert!(!net.raw_eof(r), "closed before the deadline");
        net.drive();
        assert!(net.raw_eof(r), "closed at the deadline");
        assert!(net.offset >= cfg(0).handshake_timeout);
        assert_eq!(
            net.count_events(0, |e| *e
                == CoreEvent::Refused {
                    why: ProtoError::HandshakeTimeout
                }),
            1
        );
        assert!(net.nodes[0].keys.is_empty());
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        // Node 0 still works.
        net.send(0, 1, 1, vec![1, 2, 3]).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
    }
}

#[test]
fn dialer_times_out_when_the_acceptor_never_answers() {
    let mut net = Net::pair(3);
    net.listeners.insert(addr(1), Listener::Raw);
    net.send(0, 1, 1, b"x".to_vec()).unwrap();
    net.drive();
    let c = cfg(0);
    assert_eq!(net.nodes[0].dials.len(), c.connect_retries as usize);
    assert_eq!(net.raw_accepted.len(), c.connect_retries as usize);
    let failed = net.failed_events(0);
    assert_eq!(failed.len(), 1);
    assert!(
        matches!(failed[0].1, FailReason::ConnectFailed { attempts, .. } if attempts == c.connect_retries)
    );
    assert!(net.completions(0).values().all(Result::is_err));
    assert!(net.nodes[0].keys.is_empty());
}

#[test]
fn simultaneous_loser_redials_when_the_winner_never_comes() {
    let mut net = Net::pair(5);
    // Whoever listens at node 0's address answers "simultaneous" and then nothing more.
    net.listeners.insert(addr(0), Listener::Raw);
    net.send(1, 0, 1, b"x".to_vec()).unwrap();
    net.run(false);
    let r = net.raw_accepted[0];
    let hello = Hello::parse(&net.raw_read(r)).unwrap();
    assert_eq!((hello.kind, hello.pid), (HelloKind::Hello, PeerId(1)));
    let rej = Hello {
        kind: HelloKind::Reject(RejectReason::Simultaneous),
        version: VERSION,
        pid: PeerId(0),
        token: TOKEN,
    };
    net.raw_write(r, &rej.to_bytes());
    net.run(false);
    // The loser closed its dial and waits for the winner's.
    assert!(net.raw_eof(r));
    assert_eq!(
        net.core(1).state(PeerId(0)),
        Some(EndpointState::ConnectAck)
    );
    assert_eq!(net.core(1).pending(PeerId(0)), 1);
    assert!(net.nodes[1].keys.is_empty());
    // The winner's dial does not come: after the handshake timeout, dial again.
    net.drive();
    let c = cfg(1);
    assert!(net.offset >= c.handshake_timeout);
    assert_eq!(net.nodes[1].dials.len(), c.connect_retries as usize);
    let failed = net.failed_events(1);
    assert_eq!(failed.len(), 1);
    assert!(matches!(failed[0].1, FailReason::ConnectFailed { .. }));
    assert_eq!(
        net.completions(1).values().filter(|r| r.is_err()).count(),
        1
    );
}

// ----- 8. protocol errors after connect ------------------------------------------------------

#[test]
fn bad_frame_after_connect_fails_the_endpoint() {
    let bad: [(&str, Vec<u8>); 4] = [
        ("too long", {
            let mut h = frame(FrameKind::Send, 1, &[]);
            h[4..8].copy_from_slice(&((1u32 << 20) + 1).to_be_bytes());
            h
        }),
        ("unknown kind", {
            let mut h = frame(FrameKind::Send, 1, &[]);
            h[0] = 0x7f;
            h
        }),
        ("flags", {
            let mut h = frame(FrameKind::Send, 1, &[]);
            h[2] = 1;
            h
        }),
        (
            "hello after handshake",
            Hello {
                kind: HelloKind::Hello,
                version: VERSION,
                pid: PeerId(1),
                token: TOKEN,
            }
            .to_bytes()
            .to_vec(),
        ),
    ];
    for (what, bytes) in bad {
        for seed in 0..30 {
            let mut net = Net::pair(seed);
            let r = raw_peer(&mut net, 1);
            // The raw peer never drains its socket: the first batch stays in flight.
            net.knobs.stall = Some(0);
            for _ in 0..1 + net.rng.below(6) {
                net.send_random(0, 1).unwrap();
            }
            let k = net.rng.below(6);
            net.steps(k);
            for _ in 0..1 + net.rng.below(4) {
                net.send_random(0, 1).unwrap();
            }
            net.pump(0);
            net.raw_write(r, &frame(FrameKind::Send, 9, b"fine"));
            net.raw_write(r, &bytes);
            net.drive();
            let ctx = format!("{what}, seed {seed}");
            assert_eq!(net.received(0, 1), vec![(9, b"fine".to_vec())], "{ctx}");
            let failed = net.failed_events(0);
            assert_eq!(failed.len(), 1, "{ctx}");
            assert!(
                matches!(
                    &failed[0].1,
                    FailReason::Protocol {
                        peer: PeerId(1),
                        err: ProtoError::Wire(_)
                    }
                ),
                "{ctx}: {failed:?}"
            );
            let done = net.completions(0);
            assert!(
                done.values().all(|r| *r == Err(failed[0].1.clone())),
                "{ctx}: every pending send fails with the endpoint's reason"
            );
            assert!(net.raw_eof(r), "{ctx}");
            assert!(net.nodes[0].keys.is_empty(), "{ctx}");
            assert_eq!(
                net.send(0, 1, 0, vec![]),
                Err(SendError::Unreachable(PeerId(1)))
            );
        }
    }
}

/// After a valid handshake, the raw peer writes `garbage` in random pieces. Nothing may
/// panic; every send completes once; at most one PeerFailed.
fn garbage_after_handshake(seed: u64, garbage: &[u8], valid_first: bool) {
    let mut c0 = cfg(0);
    c0.recv_cache = 256;
    c0.max_frame = 4096;
    let mut net = Net::new(seed, vec![c0, cfg(1)]);
    let r = raw_peer(&mut net, 1);
    for _ in 0..net.rng.below(5) {
        let len = net.rng.below(3000);
        let p = net.rng.bytes(len);
        net.send(0, 1, 2, p).unwrap();
    }
    if valid_first {
        net.raw_write(r, &frame(FrameKind::Send, 3, &[7; 1000]));
    }
    let mut at = 0;
    while at < garbage.len() {
        let n = 1 + net.rng.below(garbage.len() - at);
        net.raw_write(r, &garbage[at..at + n]);
        at += n;
        let k = net.rng.below(20);
        net.steps(k);
    }
    if net.rng.chance(1, 2) {
        net.raw_close(r);
    }
    net.drive();
    net.completions(0);
    assert!(net.failed_events(0).len() <= 1);
    if net.core(0).state(PeerId(1)) == Some(EndpointState::Failed) {
        assert_eq!(net.core(0).pending(PeerId(1)), 0);
        assert_eq!(net.failed_events(0).len(), 1);
    }
    for (_, _, p) in &net.nodes[0].got {
        assert!(p.len() <= 4096);
    }
}

#[test]
fn garbage_after_handshake_never_panics_seeded() {
    for seed in 0..300 {
        let mut rng = Rng::new(seed);
        let len = rng.below(600);
        let mut g = rng.bytes(len);
        // Often make it look almost right: valid kinds, small lengths.
        if seed.is_multiple_of(2) {
            for i in (0..g.len()).step_by(8) {
                g[i] = [1, 4, 1, 0x7f][rng.below(4)];
                if i + 7 < g.len() {
                    g[i + 2] = 0;
                    g[i + 3] = 0;
                    g[i + 4] = 0;
                    g[i + 5] = 0;
                    g[i + 6] = (rng.below(32)) as u8;
                }
            }
        }
        garbage_after_handshake(seed, &g, seed.is_multiple_of(3));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn garbage_after_handshake_never_panics(
        garbage in proptest::collection::vec(any::<u8>(), 0..400),
        seed in any::<u64>(),
        valid_first in any::<bool>(),
    ) {
        garbage_after_handshake(seed, &garbage, valid_first);
    }

    #[test]
    fn garbage_as_handshake_never_panics(
        garbage in proptest::collection::vec(any::<u8>(), 0..100),
        seed in any::<u64>(),
    ) {
        let mut net = Net::pair(seed);
        let r = net.raw_dial(0);
        net.raw_write(r, &garbage);
        net.drive();
        // Whatever it was, it did not become a connection, and it is gone.
        prop_assert!(net.raw_eof(r));
        prop_assert!(net.nodes[0].keys.is_empty());
        prop_assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        let wrong = garbage.len() >= 8 && garbage[..8] != crate::wire::MAGIC;
        if wrong && garbage.len() >= HELLO_LEN {
            prop_assert_eq!(net.core(0).counters().bad_magic, 1);
        }
    }
}
