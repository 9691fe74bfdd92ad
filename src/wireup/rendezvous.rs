//! The environment + root rendezvous: a small TCP exchange hosted by rank 0.
//!
//! Rank 0 listens at `RINGBTL_ROOT=host:port`. Every other rank connects (retrying until
//! its deadline, since rank 0 may start last), sends one join message and waits for one
//! reply. Once all `size` ranks have joined, rank 0 sends every rank the full table
//! (rank → URI list). Receiving the table implies a barrier: nobody gets it before
//! everybody has joined.
//!
//! Messages are a 4-byte big-endian length followed by the body; bodies are bounded
//! ([`MAX_JOIN_LEN`], [`MAX_TABLE_LEN`]) and checked before anything is allocated. A join
//! is a challenge-response over the job key (the same key as the transport's handshake;
//! the public key when none is configured, see [`auth`](mod@crate::auth)):
//!
//! ```text
//! hello     = magic "RBRV" | version u16 | 2 u8 | rank u32 | size u32 | nonce Nm (32 B)
//! challenge = magic "RBRV" | version u16 | 3 u8 | nonce Nr (32 B) | MAC_r (32 B)
//! join      = magic "RBRV" | version u16 | 4 u8 | MAC_m (32 B) | len u16 | uris
//! reply     = magic "RBRV" | version u16 | 0 u8 | MAC_t (32 B) | count u32
//!             | count × (len u16 | uris)
//!           | magic "RBRV" | version u16 | 1 u8 | len u16 | error text
//! ```
//!
//! `MAC_r = HMAC(K, "ringbtl rendezvous root" | version | token | Nm | Nr | rank | size)`
//! proves the root's key before the member says anything more; `MAC_m` (label
//! `"ringbtl rendezvous member"`, the same fields, then the URI list) proves the
//! member's, and only then does the root record the rank; `MAC_t` (label `"ringbtl
//! rendezvous table"`, the nonces, then the table) lets the member trust the table. The
//! labels differ, the nonces are fresh: no MAC can be reflected or replayed, and the key
//! never crosses the wire. An error reply carries nothing secret.
//!
//! The root checks each join: wrong magic, version, size, a rank out of range, a MAC that
//! does not verify, or a rank that already joined (on a connection still open) earns an
//! error reply and the connection is dropped and counted ([`Rendezvous::rejected`]); the
//! others are unaffected. Every connection has a deadline for its hello and its join
//! ([`CONN_TIMEOUT`]); when [`MAX_PENDING`] connections wait at once, the oldest is dropped
//! for the newcomer, so that idle connections cannot lock members out. A member whose
//! connection is dropped before its table arrives joins again (with a growing pause,
//! until its deadline). If not everybody joined by the deadline, the root tells every
//! waiting rank which ranks are missing and fails with the same message; a rank that
//! hears nothing fails after its own deadline plus a grace period. The root serves all
//! connections from one thread with non-blocking sockets.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::Modex;
use crate::auth::{self, JobKey, PUBLIC_KEY};
use crate::error::Error;
use crate::wire::{MAC_LEN, NONCE_LEN};

/// First bytes of every message.
pub const MAGIC: [u8; 4] = *b"RBRV";
/// Protocol version (2: joins authenticated by challenge-response; 1 sent the job token).
pub const VERSION: u16 = 0x0002;
/// Longest URI list a rank may publish.
pub const MAX_URIS_LEN: usize = 4096;
/// Largest message a member may send (its join).
pub const MAX_JOIN_LEN: usize = 7 + MAC_LEN + 2 + MAX_URIS_LEN;
/// Largest reply body (the table of a very large job; checked before allocating).
pub const MAX_TABLE_LEN: usize = 64 << 20;
/// Time a connection to the root has to send its hello, and again its join.
pub const CONN_TIMEOUT: Duration = Duration::from_secs(3);
/// Connections waiting for their hello or join at once; a newcomer beyond that drops the
/// oldest (a flood cannot exhaust descriptors nor lock members out).
pub const MAX_PENDING: usize = 256;

const STATUS_TABLE: u8 = 0;
const STATUS_ERROR: u8 = 1;
const KIND_HELLO: u8 = 2;
const KIND_CHALLENGE: u8 = 3;
const KIND_JOIN: u8 = 4;
const LABEL_ROOT: &[u8] = b"ringbtl rendezvous root";
const LABEL_MEMBER: &[u8] = b"ringbtl rendezvous member";
const LABEL_TABLE: &[u8] = b"ringbtl rendezvous table";

/// One rank's side of the rendezvous.
#[derive(Debug)]
pub struct Rendezvous {
    rank: u32,
    size: u32,
    token: u64,
    key: JobKey,
    timeout: Duration,
    role: Role,
    rejected: u32,
}

#[derive(Debug)]
enum Role {
    Root(TcpListener),
    Member(Vec<SocketAddr>),
}

impl Rendezvous {
    /// Rank 0, serving on `listener` (see [`bind_root`]), with the public key until
    /// [`with_key`](Self::with_key).
    pub fn root(listener: TcpListener, size: u32, token: u64, timeout: Duration) -> Self {
        Self {
            rank: 0,
            size,
            token,
            key: PUBLIC_KEY,
            timeout,
            role: Role::Root(listener),
            rejected: 0,
        }
    }

    /// Rank `rank` (not 0) of `size`, joining the root at `root` (each address is tried
    /// in turn), with the public key until [`with_key`](Self::with_key).
    pub fn member(
        root: Vec<SocketAddr>,
        rank: u32,
        size: u32,
        token: u64,
        timeout: Duration,
    ) -> Result<Self, Error> {
        if rank == 0 || rank >= size {
            return Err(Error::Wireup(format!(
                "rendezvous member rank {rank} must be in 1..{size}"
            )));
        }
        if root.is_empty() {
            return Err(Error::Wireup("rendezvous root has no address".into()));
        }
        Ok(Self {
            rank,
            size,
            token,
            key: PUBLIC_KEY,
            timeout,
            role: Role::Member(root),
            rejected: 0,
        })
    }

    /// Rank `rank` of `size` with the root at `root` (`host:port`, as in `RINGBTL_ROOT`):
    /// rank 0 binds it, every other rank resolves it.
    pub fn from_root(
        root: &str,
        rank: u32,
        size: u32,
        token: u64,
        timeout: Duration,
    ) -> Result<Self, Error> {
        if rank == 0 {
            Ok(Self::root(bind_root(root)?, size, token, timeout))
        } else {
            Self::member(resolve(root)?, rank, size, token, timeout)
        }
    }

    /// Joins are proved with `key` (the job's; every rank must hold the same).
    pub fn with_key(mut self, key: JobKey) -> Self {
        self.key = key;
        self
    }

    /// Connections the root refused so far (bad MAC, duplicate rank, malformed join…).
    /// Always 0 on other ranks.
    pub fn rejected(&self) -> u32 {
        self.rejected
    }

    /// The address the root listens on (`None` on other ranks).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.role {
            Role::Root(l) => l.local_addr().ok(),
            Role::Member(_) => None,
        }
    }

    /// Rank 0's side: collects every join, then answers all. Returns the outcome and the
    /// number of refused connections.
    fn serve(&self, listener: &TcpListener, my_uris: &str) -> (Result<Vec<String>, Error>, u32) {
        let deadline = Instant::now() + self.timeout;
        let size = self.size as usize;
        let mut table: Vec<Option<String>> = vec![None; size];
        table[0] = Some(my_uris.to_owned());
        // Per joined rank: its connection and the nonces that the table's MAC covers.
        let mut joined: Vec<Option<(TcpStream, Nonces)>> = (0..size).map(|_| None).collect();
        let mut pending: Vec<Pending> = Vec::new();
        let mut rejected = 0u32;
        let mut count = 1usize;
        if let Err(e) = listener.set_nonblocking(true) {
            return (Err(Error::io("rendezvous: set_nonblocking", e)), 0);
        }
        while count < size {
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<u32> = (0..self.size)
                    .filter(|&r| table[r as usize].is_none())
                    .collect();
                let msg = format!(
                    "rendezvous timed out after {} ms: missing ranks {} \
                     ({count} of {size} joined, {rejected} connections rejected)",
                    self.timeout.as_millis(),
                    format_ranks(&missing)
                );
                for (s, _) in joined.iter_mut().flatten() {
                    let _ = send_error(s, &msg, now + REPLY_WRITE_TIMEOUT);
                }
                return (Err(Error::Wireup(msg)), rejected);
            }
            let mut progress = false;
            loop {
                match listener.accept() {
                    Ok((s, peer)) => {
                        progress = true;
                        if s.set_nonblocking(true).is_err() {
                            rejected += 1;
                            continue;
                        }
                        if pending.len() >= MAX_PENDING {
                            // The oldest waiting connection makes room: idle connections
                            // cannot lock members out (members retry a dropped join).
                            rejected += 1;
                            pending.remove(0);
                        }
                        pending.push(Pending {
                            stream: s,
                            peer,
                            buf: Vec::new(),
                            until: (now + CONN_TIMEOUT).min(deadline),
                            stage: Stage::Hello,
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // ECONNABORTED, EMFILE and friends: keep serving (connections already
                    // accepted expire and free their descriptors).
                    Err(_) => break,
                }
            }
            let mut i = 0;
            while i < pending.len() {
                let step = pending[i].poll();
                if !matches!(step, Poll::Waiting) {
                    progress = true;
                }
                match step {
                    Poll::Waiting if pending[i].until <= now => {
                        rejected += 1;
                        let p = pending.remove(i);
                        tracing::debug!(peer = %p.peer, "rendezvous: dropped a silent connection");
                        continue;
                    }
                    Poll::Waiting => {
                        i += 1;
                        continue;
                    }
                    Poll::Closed => {
                        pending.remove(i);
                        continue;
                    }
                    Poll::Oversized => {
                        rejected += 1;
                        let p = pending.remove(i);
                        tracing::warn!(peer = %p.peer, "rendezvous: dropped an oversized message");
                        continue;
                    }
                    Poll::Ready => {}
                }
                let body = std::mem::take(&mut pending[i].buf);
                let body = &body[4..];
                let outcome = match pending[i].stage {
                    Stage::Hello => match decode_hello(body, self.size) {
                        Err(why) => Err(why),
                        Ok((rank, nonce_m)) => match auth::os_nonce() {
                            None => Err("the root has no random numbers".to_owned()),
                            Some(nonce_r) => {
                                let n = Nonces {
                                    rank,
                                    m: nonce_m,
                                    r: nonce_r,
                                };
                                let ch = encode_challenge(&self.key, self.token, self.size, &n);
                                let p = &mut pending[i];
                                match write_frame(&mut p.stream, &ch, now + REPLY_WRITE_TIMEOUT)
                                    .and_then(|()| p.stream.set_nonblocking(true))
                                {
                                    Ok(()) => {
                                        p.stage = Stage::Join(n);
                                        p.until = (now + CONN_TIMEOUT).min(deadline);
                                        i += 1;
                                        continue;
                                    }
                                    Err(_) => {
                                        pending.remove(i);
                                        continue;
                                    }
                                }
                            }
                        },
                    },
                    Stage::Join(n) => decode_join(body, &self.key, self.token, self.size, &n)
                        .map(|uris| (n, uris)),
                };
                let p = pending.remove(i);
                match outcome {
                    Err(why) => {
                        rejected += 1;
                        tracing::warn!(peer = %p.peer, "rendezvous: refused a join: {why}");
                        let mut s = p.stream;
                        let _ = send_error(&mut s, &why, now + REPLY_WRITE_TIMEOUT);
                    }
                    Ok((n, uris)) => {
                        let r = n.rank as usize;
                        let stale = joined[r].as_ref().is_some_and(|(s, _)| is_closed(s));
                        if table[r].is_some() && !stale {
                            rejected += 1;
                            let why = format!("rank {} has already joined", n.rank);
                            tracing::warn!(peer = %p.peer, "rendezvous: refused a join: {why}");
                            let mut s = p.stream;
                            let _ = send_error(&mut s, &why, now + REPLY_WRITE_TIMEOUT);
                        } else {
                            if table[r].is_none() {
                                count += 1;
                            }
                            table[r] = Some(uris);
                            joined[r] = Some((p.stream, n));
                        }
                    }
                }
            }
            if !progress {
                std::thread::sleep(POLL_INTERVAL);
            }
        }
        let table: Vec<String> = table.into_iter().map(Option::unwrap_or_default).collect();
        let body = encode_table_body(&table);
        let until = Instant::now() + REPLY_WRITE_TIMEOUT.max(self.timeout);
        for (rank, j) in joined.iter_mut().enumerate() {
            if let Some((s, n)) = j {
                let reply = encode_table(&self.key, self.token, n, &body);
                if let Err(e) = write_frame(s, &reply, until) {
                    // That rank fails on its own; the others still get their table.
                    tracing::warn!(rank, "rendezvous: could not send the table: {e}");
                }
            }
        }
        (Ok(table), rejected)
    }

    /// A member's side: connect, prove the key, send the join, wait for the table.
    fn join(&self, root: &[SocketAddr], my_uris: &str) -> Result<Vec<String>, Error> {
        let rank = self.rank;
        self.join_observed(root, my_uris, &mut |n, e| {
            tracing::debug!(
                "rank {rank}: rendezvous root at {} not reachable yet (attempt {n}: {e}); \
                 retrying",
                list_addrs(root)
            );
        })
    }

    /// [`join`](Self::join), calling `on_retry(n, error)` after the `n`th attempt failed
    /// (the root does not listen yet, or dropped the connection before the table) and
    /// before the next.
    fn join_observed(
        &self,
        root: &[SocketAddr],
        my_uris: &str,
        on_retry: &mut dyn FnMut(u32, &io::Error),
    ) -> Result<Vec<String>, Error> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let rank = self.rank;
        // The root decides when the exchange has failed and says which ranks are missing;
        // wait a little longer than our own deadline to hear it.
        let grace = (self.timeout / 10).clamp(Duration::from_millis(200), Duration::from_secs(5));
        let mut delay = Duration::from_millis(10);
        let mut round = 0u32;
        let mut failures = 0u32;
        loop {
            let mut s = connect_retry(root, deadline, &mut |_, e| {
                round += 1;
                on_retry(round, e);
            })
            .map_err(|e| {
                Error::Wireup(format!(
                    "rank {rank}: cannot reach the rendezvous root at {} within {} ms: {e}",
                    list_addrs(root),
                    self.timeout.as_millis()
                ))
            })?;
            let _ = s.set_nodelay(true);
            match self.join_once(&mut s, my_uris, deadline, grace) {
                Ok(table) => return Ok(table),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Dropped(e)) => {
                    failures += 1;
                    let left = deadline.saturating_duration_since(Instant::now());
                    let silent = matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    );
                    if left.is_zero() && silent {
                        return Err(Error::Wireup(format!(
                            "rank {rank}: no address table from the rendezvous root at {} \
                             within {} ms (it never answered our join)",
                            list_addrs(root),
                            self.timeout.as_millis()
                        )));
                    }
                    if left.is_zero() || failures > MAX_JOIN_ATTEMPTS {
                        return Err(Error::Wireup(format!(
                            "rank {rank}: the rendezvous root at {} dropped our join {failures} \
                             times: {e}",
                            list_addrs(root)
                        )));
                    }
                    round += 1;
                    on_retry(round, &e);
                    std::thread::sleep(delay.min(left));
                    delay = (delay * 2).min(Duration::from_millis(250));
                }
            }
        }
    }

    /// One join on a connected stream.
    fn join_once(
        &self,
        s: &mut TcpStream,
        my_uris: &str,
        deadline: Instant,
        grace: Duration,
    ) -> Result<Vec<String>, Attempt> {
        let rank = self.rank;
        let fatal = |m: String| Attempt::Fatal(Error::Wireup(format!("rank {rank}: {m}")));
        let nonce_m =
            auth::os_nonce().ok_or_else(|| fatal("no random numbers for a nonce".into()))?;
        write_frame(s, &encode_hello(rank, self.size, &nonce_m), deadline)
            .map_err(Attempt::Dropped)?;
        // A root that does not answer within a connection's time limit dropped us (or
        // has not accepted yet): join again.
        let step = (Instant::now() + CONN_TIMEOUT).min(deadline);
        let body = read_frame(s, MAX_JOIN_LEN, step).map_err(Attempt::Dropped)?;
        let nonce_r = match decode_challenge(&body) {
            Ok(c) => c,
            Err(Refusal::Text(t)) => return Err(fatal(format!("rendezvous root refused: {t}"))),
            Err(Refusal::Bad(t)) => return Err(fatal(t)),
        };
        let n = Nonces {
            rank,
            m: nonce_m,
            r: nonce_r.0,
        };
        let parts = mac_parts(LABEL_ROOT, self.token, self.size, &n);
        if !mac_ok(&self.key, &parts, &[], &nonce_r.1) {
            return Err(fatal(
                "the rendezvous root does not hold this job's key (RINGBTL_JOB_KEY); \
                 refusing to join"
                    .into(),
            ));
        }
        let join = encode_join(&self.key, self.token, self.size, &n, my_uris);
        write_frame(s, &join, deadline).map_err(Attempt::Dropped)?;
        let body = read_frame(s, MAX_TABLE_LEN, deadline + grace).map_err(|e| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                fatal(format!(
                    "no address table from the rendezvous root within {} ms; the root \
                     reports which ranks are missing",
                    (self.timeout + grace).as_millis()
                ))
            } else {
                Attempt::Dropped(e)
            }
        })?;
        decode_reply(&body, &self.key, self.token, self.size, &n).map_err(fatal)
    }
}

/// How one join attempt failed.
enum Attempt {
    /// The connection was lost or dropped by the root: join again.
    Dropped(io::Error),
    /// A refusal or a failure that another attempt would meet again.
    Fatal(Error),
}

/// At most this many joins dropped by the root before a member gives up (each after a
/// pause, and never past the deadline).
const MAX_JOIN_ATTEMPTS: u32 = 64;

impl Modex for Rendezvous {
    fn exchange(&mut self, my_uris: &str) -> Result<Vec<String>, Error> {
        if my_uris.len() > MAX_URIS_LEN {
            return Err(Error::Wireup(format!(
                "address list of {} bytes exceeds the rendezvous limit of {MAX_URIS_LEN}",
                my_uris.len()
            )));
        }
        if self.size == 0 {
            return Err(Error::Wireup("rendezvous for a job of 0 ranks".into()));
        }
        match &self.role {
            Role::Root(listener) => {
                let (table, rejected) = self.serve(listener, my_uris);
                self.rejected += rejected;
                table
            }
            Role::Member(root) => self.join(root, my_uris),
        }
    }

    fn rank(&self) -> u32 {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn job_key(&self) -> Option<JobKey> {
        (!self.key.is_public()).then(|| self.key.clone())
    }
}

/// Binds the root's listen socket at `host:port` (the first resolved address that binds).
pub fn bind_root(root: &str) -> Result<TcpListener, Error> {
    let mut last = None;
    for a in resolve(root)? {
        match TcpListener::bind(a) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some((a, e)),
        }
    }
    let (a, e) = last.expect("resolve returns at least one address");
    Err(Error::Wireup(format!(
        "rank 0 cannot listen on RINGBTL_ROOT={root} ({a}): {e}; rank 0 must run on the host it names"
    )))
}

/// Formats a rank set compactly: `0-3,7,9-10`, cut short after about 200 characters.
pub fn format_ranks(ranks: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if out.len() > 200 {
            let _ = write!(out, "... ({} more)", ranks.len() - i);
            break;
        }
        if i == j {
            out.push_str(&ranks[i].to_string());
        } else {
            let _ = write!(out, "{}-{}", ranks[i], ranks[j]);
        }
        i = j + 1;
    }
    out
}

const POLL_INTERVAL: Duration = Duration::from_millis(1);
const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// The nonces of one join and the rank it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nonces {
    /// The rank the member claims.
    pub rank: u32,
    /// The member's nonce (from its hello).
    pub m: [u8; NONCE_LEN],
    /// The root's nonce (from its challenge).
    pub r: [u8; NONCE_LEN],
}

#[derive(Debug, Clone, Copy)]
enum Stage {
    /// Waiting for the hello.
    Hello,
    /// Challenge sent; waiting for the join.
    Join(Nonces),
}

struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
    /// The connection's deadline for its next message.
    until: Instant,
    stage: Stage,
}

enum Poll {
    Waiting,
    Ready,
    Closed,
    Oversized,
}

impl Pending {
    /// Reads what is available without blocking; `Ready` once a whole message is buffered.
    fn poll(&mut self) -> Poll {
        loop {
            let want = if self.buf.len() < 4 {
                4
            } else {
                let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                if len as usize > MAX_JOIN_LEN {
                    // Not a join; never allocate what a stranger announces.
                    return Poll::Oversized;
                }
                4 + len as usize
            };
            if self.buf.len() == want && want > 4 {
                return Poll::Ready;
            }
            let mut chunk = [0u8; 1024];
            let room = (want - self.buf.len()).min(chunk.len());
            match self.stream.read(&mut chunk[..room]) {
                Ok(0) => return Poll::Closed,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Waiting,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Poll::Closed,
            }
        }
    }
}

fn is_closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    }
}

/// The fields every MAC of one join covers, after its label.
fn mac_parts<'a>(label: &'a [u8], token: u64, size: u32, n: &'a Nonces) -> MacParts<'a> {
    MacParts {
        label,
        head: {
            let mut h = [0u8; 18];
            h[..2].copy_from_slice(&VERSION.to_be_bytes());
            h[2..10].copy_from_slice(&token.to_be_bytes());
            h[10..14].copy_from_slice(&n.rank.to_be_bytes());
            h[14..18].copy_from_slice(&size.to_be_bytes());
            h
        },
        n,
    }
}

/// A MAC's input: label | version | token | rank | size | Nm | Nr (then, for some,
/// more data).
struct MacParts<'a> {
    label: &'a [u8],
    head: [u8; 18],
    n: &'a Nonces,
}

fn mac_of(key: &JobKey, p: &MacParts<'_>, more: &[u8]) -> [u8; MAC_LEN] {
    key.mac(&[p.label, &p.head, &p.n.m, &p.n.r, more])
}

fn mac_ok(key: &JobKey, p: &MacParts<'_>, more: &[u8], mac: &[u8]) -> bool {
    key.verify(&[p.label, &p.head, &p.n.m, &p.n.r, more], mac)
}

fn header(kind: u8, cap: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(7 + cap);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_be_bytes());
    b.push(kind);
    b
}

/// A member's hello: the rank it claims, the job size, its nonce.
pub fn encode_hello(rank: u32, size: u32, nonce_m: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut b = header(KIND_HELLO, 8 + NONCE_LEN);
    b.extend_from_slice(&rank.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(nonce_m);
    b
}

/// Reads magic, version and kind; the error text is sent back (it names both versions).
fn open_message<'a>(b: &'a [u8], kind: u8, what: &str) -> Result<Reader<'a>, String> {
    let mut r = Reader(b);
    if r.take(4) != Some(&MAGIC[..]) {
        return Err(format!("not a ringbtl rendezvous {what} (bad magic)"));
    }
    let version = r.u16().ok_or_else(|| format!("truncated {what}"))?;
    if version != VERSION {
        return Err(format!(
            "rendezvous version {version:#06x} not supported (this side speaks {VERSION:#06x})"
        ));
    }
    match r.take(1) {
        Some([k]) if *k == kind => Ok(r),
        Some(_) => Err(format!("not a rendezvous {what}")),
        None => Err(format!("truncated {what}")),
    }
}

/// Checks a hello (the root's side): the rank it claims and the member's nonce; the
/// error text is sent back.
pub fn decode_hello(b: &[u8], size: u32) -> Result<(u32, [u8; NONCE_LEN]), String> {
    let mut r = open_message(b, KIND_HELLO, "join")?;
    let rank = r.u32().ok_or("truncated join")?;
    let their_size = r.u32().ok_or("truncated join")?;
    let nonce: [u8; NONCE_LEN] = r
        .take(NONCE_LEN)
        .and_then(|n| n.try_into().ok())
        .ok_or("truncated join")?;
    if !r.0.is_empty() {
        return Err("trailing bytes after the join".into());
    }
    if their_size != size {
        return Err(format!(
            "rank {rank} believes the job has {their_size} ranks, the root has {size}"
        ));
    }
    if rank == 0 || rank >= size {
        return Err(format!("rank {rank} is out of range 1..{size}"));
    }
    Ok((rank, nonce))
}

/// The root's challenge: its nonce and its MAC (label root) over the join's fields.
pub fn encode_challenge(key: &JobKey, token: u64, size: u32, n: &Nonces) -> Vec<u8> {
    let mut b = header(KIND_CHALLENGE, NONCE_LEN + MAC_LEN);
    b.extend_from_slice(&n.r);
    b.extend_from_slice(&mac_of(key, &mac_parts(LABEL_ROOT, token, size, n), &[]));
    b
}

/// What a member read instead of a challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The root's error reply.
    Text(String),
    /// Something unreadable.
    Bad(String),
}

/// The root's nonce and MAC, or its refusal (a member's side; the MAC is checked by the
/// caller).
pub fn decode_challenge(b: &[u8]) -> Result<([u8; NONCE_LEN], [u8; MAC_LEN]), Refusal> {
    if let Some(text) = decode_error(b) {
        return Err(Refusal::Text(text));
    }
    let mut r = open_message(b, KIND_CHALLENGE, "challenge").map_err(Refusal::Bad)?;
    let bad = || Refusal::Bad("truncated rendezvous challenge".into());
    let nonce = r
        .take(NONCE_LEN)
        .and_then(|n| n.try_into().ok())
        .ok_or_else(bad)?;
    let mac = r
        .take(MAC_LEN)
        .and_then(|n| n.try_into().ok())
        .ok_or_else(bad)?;
    if !r.0.is_empty() {
        return Err(Refusal::Bad("trailing bytes after the challenge".into()));
    }
    Ok((nonce, mac))
}

/// A member's join: its MAC (label member) over the join's fields and its URI list.
pub fn encode_join(key: &JobKey, token: u64, size: u32, n: &Nonces, uris: &str) -> Vec<u8> {
    let mut b = header(KIND_JOIN, MAC_LEN + 2 + uris.len());
    let mac = mac_of(
        key,
        &mac_parts(LABEL_MEMBER, token, size, n),
        uris.as_bytes(),
    );
    b.extend_from_slice(&mac);
    b.extend_from_slice(&(uris.len() as u16).to_be_bytes());
    b.extend_from_slice(uris.as_bytes());
    b
}

/// Checks a join (after the challenge `n`; the root's side): its MAC, then its URI
/// list. The error text is sent back, and carries nothing secret.
pub fn decode_join(
    b: &[u8],
    key: &JobKey,
    token: u64,
    size: u32,
    n: &Nonces,
) -> Result<String, String> {
    let mut r = open_message(b, KIND_JOIN, "join")?;
    let mac = r.take(MAC_LEN).ok_or("truncated join")?;
    let len = r.u16().ok_or("truncated join")? as usize;
    let uris = r.take(len).ok_or("truncated join")?;
    if !r.0.is_empty() {
        return Err("trailing bytes after the join".into());
    }
    if !mac_ok(key, &mac_parts(LABEL_MEMBER, token, size, n), uris, mac) {
        return Err(format!(
            "rank {}: authentication failed (this process does not hold the job key, or its \
             token differs)",
            n.rank
        ));
    }
    let uris = std::str::from_utf8(uris).map_err(|_| "address list is not UTF-8".to_owned())?;
    Ok(uris.to_owned())
}

/// The table's entries as they follow the MAC: count, then each list.
pub fn encode_table_body(table: &[String]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + table.iter().map(|u| 2 + u.len()).sum::<usize>());
    b.extend_from_slice(&(table.len() as u32).to_be_bytes());
    for u in table {
        b.extend_from_slice(&(u.len() as u16).to_be_bytes());
        b.extend_from_slice(u.as_bytes());
    }
    b
}

/// The root's reply with the table: its MAC (label table) over the nonces and `body`.
pub fn encode_table(key: &JobKey, token: u64, n: &Nonces, body: &[u8]) -> Vec<u8> {
    let mut b = header(STATUS_TABLE, MAC_LEN + body.len());
    // The table's MAC does not depend on the job size: members check the count.
    b.extend_from_slice(&mac_of(key, &mac_parts(LABEL_TABLE, token, 0, n), body));
    b.extend_from_slice(body);
    b
}

/// The text of an error reply (`None` when `b` is not one).
pub fn decode_error(b: &[u8]) -> Option<String> {
    let mut r = open_message(b, STATUS_ERROR, "reply").ok()?;
    let len = r.u16()? as usize;
    let text = r.take(len)?;
    Some(String::from_utf8_lossy(text).into_owned())
}

/// Checks the root's reply (a member's side): an error reply's text, or the table
/// whose MAC verifies and whose count is `size`.
pub fn decode_reply(
    b: &[u8],
    key: &JobKey,
    token: u64,
    size: u32,
    n: &Nonces,
) -> Result<Vec<String>, String> {
    if let Some(text) = decode_error(b) {
        return Err(format!("rendezvous root refused: {text}"));
    }
    let mut r = open_message(b, STATUS_TABLE, "reply").map_err(|_| {
        "rendezvous root sent a reply we cannot read (bad magic, version or kind)".to_owned()
    })?;
    let mac = r.take(MAC_LEN).ok_or("truncated table")?;
    let body = r.0;
    if !mac_ok(key, &mac_parts(LABEL_TABLE, token, 0, n), body, mac) {
        return Err("the rendezvous table's MAC does not verify; refusing it".into());
    }
    let count = r.u32().ok_or("truncated table")?;
    if count != size {
        return Err(format!(
            "table has {count} entries, the job has {size} ranks"
        ));
    }
    let mut out = Vec::with_capacity(count.min(1 << 16) as usize);
    for rank in 0..count {
        let len = r.u16().ok_or("truncated table")? as usize;
        let u = r.take(len).ok_or("truncated table")?;
        let u = std::str::from_utf8(u)
            .map_err(|_| format!("address list of rank {rank} is not UTF-8"))?;
        out.push(u.to_owned());
    }
    if !r.0.is_empty() {
        return Err("trailing bytes after the table".into());
    }
    Ok(out)
}

fn send_error(s: &mut TcpStream, msg: &str, until: Instant) -> io::Result<()> {
    let text = &msg.as_bytes()[..msg.len().min(u16::MAX as usize)];
    let mut b = header(STATUS_ERROR, 2 + text.len());
    b.extend_from_slice(&(text.len() as u16).to_be_bytes());
    b.extend_from_slice(text);
    write_frame(s, &b, until)
}

fn write_frame(s: &mut TcpStream, body: &[u8], until: Instant) -> io::Result<()> {
    s.set_nonblocking(false)?;
    let left = until
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_write_timeout(Some(left))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
    s.write_all(&frame)?;
    s.flush()
}

/// Reads one frame of at most `max` bytes, giving up at `until`.
fn read_frame(s: &mut TcpStream, max: usize, until: Instant) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_exact_until(s, &mut len, until)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("announced {len} bytes, at most {max} allowed"),
        ));
    }
    let mut body = vec![0u8; len];
    read_exact_until(s, &mut body, until)?;
    Ok(body)
}

fn read_exact_until(s: &mut TcpStream, mut buf: &mut [u8], until: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(buf) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed by the rendezvous peer",
                ))
            }
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Connects to the first address of `root` that accepts, trying them all in rounds until
/// `deadline`, with a growing pause between rounds; `on_retry` hears of every failed round.
fn connect_retry(
    root: &[SocketAddr],
    deadline: Instant,
    on_retry: &mut dyn FnMut(u32, &io::Error),
) -> io::Result<TcpStream> {
    let mut delay = Duration::from_millis(10);
    let mut round = 0u32;
    loop {
        let mut last = None;
        for a in root {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let last = last.unwrap_or_else(|| io::ErrorKind::TimedOut.into());
        if left.is_zero() {
            return Err(last);
        }
        round += 1;
        on_retry(round, &last);
        std::thread::sleep(delay.min(left));
        delay = (delay * 2).min(Duration::from_millis(250));
    }
}

fn resolve(root: &str) -> Result<Vec<SocketAddr>, Error> {
    let addrs: Vec<SocketAddr> = root
        .to_socket_addrs()
        .map_err(|e| Error::Config(format!("RINGBTL_ROOT={root:?}: expected host:port: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(Error::Config(format!(
            "RINGBTL_ROOT={root:?} resolves to no address"
        )));
    }
    Ok(addrs)
}

fn list_addrs(a: &[SocketAddr]) -> String {
    a.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" / ")
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const TOKEN: u64 = 0xfeed_f00d;

    fn key() -> JobKey {
        JobKey::from_bytes([0x21; 32])
    }

    fn uri(rank: u32) -> String {
        format!(
            "tcp://127.0.0.1:{};tcp://[::1]:{}",
            40000 + rank,
            40000 + rank
        )
    }

    fn root(size: u32, timeout_ms: u64) -> (Rendezvous, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        (
            Rendezvous::root(l, size, TOKEN, Duration::from_millis(timeout_ms)).with_key(key()),
            a,
        )
    }

    fn member(a: SocketAddr, rank: u32, size: u32, token: u64, timeout_ms: u64) -> Rendezvous {
        Rendezvous::member(
            vec![a],
            rank,
            size,
            token,
            Duration::from_millis(timeout_ms),
        )
        .unwrap()
        .with_key(key())
    }

    #[test]
    fn n_ranks_get_the_same_table() {
        let n = 6;
        let (mut r0, a) = root(n, 10_000);
        let members: Vec<_> = (1..n)
            .map(|r| thread::spawn(move || member(a, r, n, TOKEN, 10_000).exchange(&uri(r))))
            .collect();
        let t0 = r0.exchange(&uri(0)).unwrap();
        let want: Vec<String> = (0..n).map(uri).collect();
        assert_eq!(t0, want);
        for m in members {
            assert_eq!(m.join().unwrap().unwrap(), want);
        }
        assert_eq!(r0.rejected(), 0);
    }

    /// A member started before the root is refused, retries, and joins once the root
    /// listens: the root starts only after the member reported a failed attempt.
    #[test]
    fn members_may_start_before_the_root() {
        // Bound without SO_REUSEADDR and not listening yet: the members' connects are
        // refused, and no other socket can take the port before the root listens on it.
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        s.bind(&any.into()).unwrap();
        let a = s.local_addr().unwrap().as_socket().unwrap();
        let (tx, retries) = std::sync::mpsc::channel();
        let m = thread::spawn(move || {
            member(a, 1, 2, TOKEN, 10_000).join_observed(&[a], "tcp://127.0.0.1:1", &mut |n, e| {
                let _ = tx.send((n, e.kind()));
            })
        });
        let (n, kind) = retries
            .recv_timeout(Duration::from_secs(10))
            .expect("the member reports a refused attempt before the root exists");
        assert_eq!((n, kind), (1, io::ErrorKind::ConnectionRefused));
        s.listen(128).unwrap();
        let mut r0 = Rendezvous::root(TcpListener::from(s), 2, TOKEN, Duration::from_secs(10))
            .with_key(key());
        let t = r0.exchange("tcp://127.0.0.1:2").unwrap();
        assert_eq!(t, ["tcp://127.0.0.1:2", "tcp://127.0.0.1:1"]);
        assert_eq!(m.join().unwrap().unwrap(), t);
    }

    #[test]
    fn bad_token_and_duplicate_rank_are_refused_and_counted() {
        let n = 3;
        let (mut r0, a) = root(n, 10_000);
        let srv = thread::spawn(move || {
            let t = r0.exchange(&uri(0));
            (t, r0.rejected())
        });
        // Another token: the root's challenge does not verify, the member refuses to join.
        let bad = member(a, 1, n, TOKEN + 1, 5_000)
            .exchange(&uri(1))
            .unwrap_err();
        assert!(
            bad.to_string().contains("does not hold this job's key"),
            "{bad}"
        );
        let wrong_size = member(a, 1, n + 1, TOKEN, 5_000)
            .exchange(&uri(1))
            .unwrap_err();
        assert!(wrong_size.to_string().contains("4 ranks"), "{wrong_size}");
        // Two processes claim rank 1: whichever joins first wins, the other is refused.
        // The loser finishes first (the winner waits for rank 2), so rank 2 joins only then.
        let (tx, rx) = std::sync::mpsc::channel();
        let claimants: Vec<_> = [7, 8]
            .into_iter()
            .map(|port| {
                let tx = tx.clone();
                thread::spawn(move || {
                    let mine = format!("tcp://127.0.0.1:{port}");
                    let r = member(a, 1, n, TOKEN, 10_000).exchange(&mine);
                    tx.send(r.is_err()).unwrap();
                    (mine, r)
                })
            })
            .collect();
        assert!(
            rx.recv().unwrap(),
            "the first claimant to finish must be the refused one"
        );
        let t2 = member(a, 2, n, TOKEN, 10_000).exchange(&uri(2)).unwrap();
        let mut winners = 0;
        for c in claimants {
            let (mine, r) = c.join().unwrap();
            match r {
                Ok(t) => {
                    winners += 1;
                    assert_eq!(t, t2);
                    assert_eq!(t[1], mine);
                }
                Err(e) => assert!(e.to_string().contains("rank 1 has already joined"), "{e}"),
            }
        }
        assert_eq!(winners, 1);
        let (t, rejected) = srv.join().unwrap();
        assert_eq!(t.unwrap(), t2);
        assert_eq!(t2[0], uri(0));
        assert_eq!(t2[2], uri(2));
        // The wrong size and the second claimant of rank 1 (the member with another token
        // left on its own).
        assert_eq!(rejected, 2);
    }

    #[test]
    fn timeout_names_the_missing_ranks() {
        let n = 5;
        let (mut r0, a) = root(n, 1000);
        let present: Vec<_> = [1, 3]
            .into_iter()
            .map(|r| thread::spawn(move || member(a, r, n, TOKEN, 1000).exchange(&uri(r))))
            .collect();
        let e = r0.exchange(&uri(0)).unwrap_err().to_string();
        assert!(e.contains("missing ranks 2,4"), "{e}");
        assert!(e.contains("3 of 5 joined"), "{e}");
        for p in present {
            let e = p.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("missing ranks 2,4"), "{e}");
        }
    }

    #[test]
    fn member_without_root_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        // The listener accepts (backlog) but never answers.
        let e = member(a, 1, 2, TOKEN, 200)
            .exchange("tcp://127.0.0.1:1")
            .unwrap_err();
        assert!(e.to_string().contains("no address table"), "{e}");
        drop(l);
        let e = member(a, 1, 2, TOKEN, 200)
            .exchange("tcp://127.0.0.1:1")
            .unwrap_err();
        assert!(
            e.to_string().contains("cannot reach the rendezvous root"),
            "{e}"
        );
    }

    #[test]
    fn garbage_and_oversized_joins_do_not_disturb_the_root() {
        let n = 2;
        let (mut r0, a) = root(n, 10_000);
        let srv = thread::spawn(move || (r0.exchange(&uri(0)), r0.rejected()));
        // A huge announced length: dropped without allocating or replying.
        let mut s = TcpStream::connect(a).unwrap();
        s.write_all(&u32::MAX.to_be_bytes()).unwrap();
        let mut b = [0u8; 1];
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(s.read(&mut b).unwrap_or(0), 0);
        // Well-framed garbage: refused with an error reply.
        let mut s = TcpStream::connect(a).unwrap();
        write_frame(
            &mut s,
            b"HTTP/1.1 GET /",
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap();
        let body = read_frame(&mut s, 1024, Instant::now() + Duration::from_secs(5)).unwrap();
        assert!(decode_error(&body).unwrap().contains("bad magic"));
        // A silent connection does not block the others.
        let _idle = TcpStream::connect(a).unwrap();
        let t = member(a, 1, n, TOKEN, 10_000).exchange(&uri(1)).unwrap();
        let (t0, rejected) = srv.join().unwrap();
        assert_eq!(t0.unwrap(), t);
        assert_eq!(rejected, 2);
    }

    fn nonces(rank: u32) -> Nonces {
        Nonces {
            rank,
            m: [1; NONCE_LEN],
            r: [2; NONCE_LEN],
        }
    }

    #[test]
    fn codec_round_trip_and_bounds() {
        let h = encode_hello(3, 4, &[9; NONCE_LEN]);
        assert_eq!(decode_hello(&h, 4).unwrap(), (3, [9; NONCE_LEN]));
        for cut in 0..h.len() {
            assert!(decode_hello(&h[..cut], 4).is_err());
        }
        for bad in [0, 4] {
            let e = decode_hello(&encode_hello(bad, 4, &[0; NONCE_LEN]), 4).unwrap_err();
            assert!(e.contains("out of range"), "{e}");
        }
        let n = nonces(3);
        let j = encode_join(&key(), 7, 4, &n, "tcp://1.2.3.4:5");
        assert_eq!(
            decode_join(&j, &key(), 7, 4, &n).unwrap(),
            "tcp://1.2.3.4:5"
        );
        for cut in 0..j.len() {
            assert!(decode_join(&j[..cut], &key(), 7, 4, &n).is_err());
        }
        // Another key, token, size, nonce or rank: the MAC does not verify.
        let other = JobKey::from_bytes([0x22; 32]);
        for (k, tok, size, nn) in [
            (&other, 7, 4, n),
            (&key(), 8, 4, n),
            (&key(), 7, 5, n),
            (
                &key(),
                7,
                4,
                Nonces {
                    r: [3; NONCE_LEN],
                    ..n
                },
            ),
            (&key(), 7, 4, nonces(2)),
        ] {
            let e = decode_join(&j, k, tok, size, &nn).unwrap_err();
            assert!(e.contains("authentication failed"), "{e}");
        }
        // The root's MAC is not a member's (labels differ): a reflected one fails.
        let ch = encode_challenge(&key(), 7, 4, &n);
        let (nr, mac_r) = decode_challenge(&ch).ok().unwrap();
        assert_eq!(nr, n.r);
        let mut reflected = header(KIND_JOIN, 0);
        reflected.extend_from_slice(&mac_r);
        reflected.extend_from_slice(&15u16.to_be_bytes());
        reflected.extend_from_slice(b"tcp://1.2.3.4:5");
        assert!(decode_join(&reflected, &key(), 7, 4, &n).is_err());
        let t = vec!["a".to_owned(), String::new(), "ccc".to_owned()];
        let b = encode_table(&key(), 7, &n, &encode_table_body(&t));
        assert_eq!(decode_reply(&b, &key(), 7, 3, &n).unwrap(), t);
        assert!(decode_reply(&b, &key(), 7, 4, &n).is_err());
        assert!(decode_reply(&b, &other, 7, 3, &n)
            .unwrap_err()
            .contains("MAC"));
        for cut in 0..b.len() {
            assert!(decode_reply(&b[..cut], &key(), 7, 3, &n).is_err());
        }
        let size1 = Rendezvous::root(
            TcpListener::bind("127.0.0.1:0").unwrap(),
            1,
            0,
            Duration::ZERO,
        )
        .exchange("x")
        .unwrap();
        assert_eq!(size1, ["x"]);
        assert!(Rendezvous::member(vec![], 1, 2, 0, Duration::ZERO).is_err());
        assert!(Rendezvous::member(
            vec!["127.0.0.1:1".parse().unwrap()],
            0,
            2,
            0,
            Duration::ZERO
        )
        .is_err());
    }

    /// Someone without the key claims rank 1 first: the root refuses it after the
    /// challenge, and the real rank 1 joins. (The first join won before.)
    #[test]
    fn impersonation_is_refused_and_the_real_rank_joins() {
        let n = 2;
        let (mut r0, a) = root(n, 10_000);
        let srv = thread::spawn(move || (r0.exchange(&uri(0)), r0.rejected()));
        let impostor = Rendezvous::member(vec![a], 1, n, TOKEN, Duration::from_secs(5))
            .unwrap()
            .with_key(JobKey::from_bytes([0x66; 32]))
            .exchange("tcp://6.6.6.6:666")
            .unwrap_err();
        assert!(
            impostor
                .to_string()
                .contains("does not hold this job's key"),
            "{impostor}"
        );
        // A raw impostor that answers the challenge with a made-up MAC.
        let mut s = TcpStream::connect(a).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        write_frame(&mut s, &encode_hello(1, n, &[7; NONCE_LEN]), until).unwrap();
        let ch = read_frame(&mut s, 1024, until).unwrap();
        let (nr, _) = decode_challenge(&ch).ok().unwrap();
        let forged = encode_join(
            &JobKey::from_bytes([0x66; 32]),
            TOKEN,
            n,
            &Nonces {
                rank: 1,
                m: [7; NONCE_LEN],
                r: nr,
            },
            "tcp://6.6.6.6:666",
        );
        write_frame(&mut s, &forged, until).unwrap();
        let body = read_frame(&mut s, 1024, until).unwrap();
        let text = decode_error(&body).unwrap();
        assert!(text.contains("authentication failed"), "{text}");
        // The reply carries nothing of the key.
        assert!(!body.windows(4).any(|w| w == [0x21; 4]));
        let t = member(a, 1, n, TOKEN, 10_000).exchange(&uri(1)).unwrap();
        assert_eq!(t, vec![uri(0), uri(1)]);
        let (t0, rejected) = srv.join().unwrap();
        assert_eq!(t0.unwrap(), t);
        assert_eq!(rejected, 1);
    }

    /// Raises the soft descriptor limit to the hard one: the flood below needs more than
    /// a common soft limit of 1,024.
    #[allow(unsafe_code)]
    fn raise_nofile_limit() {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit, read during the call only.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    }

    /// 1,100 idle connections to the root: they expire or make room, and every member
    /// still joins. (The root refused members once 1,024 idle connections held it.)
    #[test]
    fn a_flood_of_idle_connections_does_not_stop_the_wireup() {
        raise_nofile_limit();
        let n = 4;
        let (mut r0, a) = root(n, 30_000);
        let srv = thread::spawn(move || (r0.exchange(&uri(0)), r0.rejected()));
        let mut idle = Vec::new();
        for _ in 0..1100 {
            match TcpStream::connect(a) {
                Ok(s) => idle.push(s),
                Err(e) => panic!("flood connection {}: {e}", idle.len()),
            }
        }
        let start = Instant::now();
        let members: Vec<_> = (1..n)
            .map(|r| thread::spawn(move || member(a, r, n, TOKEN, 30_000).exchange(&uri(r))))
            .collect();
        let want: Vec<String> = (0..n).map(uri).collect();
        for m in members {
            assert_eq!(m.join().unwrap().unwrap(), want);
        }
        let (t0, rejected) = srv.join().unwrap();
        assert_eq!(t0.unwrap(), want);
        assert!(rejected > 0, "idle connections were dropped");
        println!(
            "wire-up through 1,100 idle connections: {} ms, {rejected} dropped",
            start.elapsed().as_millis()
        );
        drop(idle);
    }

    #[test]
    fn ranks_are_formatted_compactly() {
        assert_eq!(format_ranks(&[]), "");
        assert_eq!(format_ranks(&[4]), "4");
        assert_eq!(format_ranks(&[0, 1, 2, 3, 7, 9, 10]), "0-3,7,9-10");
        let many: Vec<u32> = (0..10_000).step_by(2).collect();
        let s = format_ranks(&many);
        assert!(s.len() < 260 && s.contains("more)"), "{s}");
    }
}
