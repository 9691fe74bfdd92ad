//! The environment + root rendezvous: a small TCP exchange hosted by rank 0.
//!
//! Rank 0 listens at `RINGBTL_ROOT=host:port`. Every other rank connects (retrying until
//! its deadline, since rank 0 may start last), sends one join message and waits for one
//! reply. Once all `size` ranks have joined, rank 0 sends every rank the full table
//! (rank → URI list). Receiving the table implies a barrier: nobody gets it before
//! everybody has joined.
//!
//! Messages are a 4-byte big-endian length followed by the body; bodies are bounded
//! ([`MAX_JOIN_LEN`], [`MAX_TABLE_LEN`]) and checked before anything is allocated:
//!
//! ```text
//! join   = magic "RBRV" | version u16 | token u64 | rank u32 | size u32 | len u16 | uris
//! reply  = magic "RBRV" | version u16 | 0 u8 | count u32 | count × (len u16 | uris)
//!        | magic "RBRV" | version u16 | 1 u8 | len u16 | error text
//! ```
//!
//! The root checks each join: wrong magic, version, token, size, a rank out of range or
//! already present earns an error reply and the connection is dropped and counted
//! ([`Rendezvous::rejected`]); the others are unaffected. If not everybody joined by the
//! deadline, the root tells every waiting rank which ranks are missing and fails with the
//! same message; a rank that hears nothing fails after its own deadline plus a grace
//! period. The root serves all connections from one thread with non-blocking sockets.
//!
//! The job token travels in clear text: it keeps two jobs that share a root address from
//! mixing their tables, it does not stop an attacker on the network.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::Modex;
use crate::error::Error;

/// First bytes of every message.
pub const MAGIC: [u8; 4] = *b"RBRV";
/// Protocol version.
pub const VERSION: u16 = 0x0001;
/// Longest URI list a rank may publish.
pub const MAX_URIS_LEN: usize = 4096;
/// Largest join body.
pub const MAX_JOIN_LEN: usize = 24 + MAX_URIS_LEN;
/// Largest reply body (the table of a very large job; checked before allocating).
pub const MAX_TABLE_LEN: usize = 64 << 20;

/// One rank's side of the rendezvous.
#[derive(Debug)]
pub struct Rendezvous {
    rank: u32,
    size: u32,
    token: u64,
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
    /// Rank 0, serving on `listener` (see [`bind_root`]).
    pub fn root(listener: TcpListener, size: u32, token: u64, timeout: Duration) -> Self {
        Self {
            rank: 0,
            size,
            token,
            timeout,
            role: Role::Root(listener),
            rejected: 0,
        }
    }

    /// Rank `rank` (not 0) of `size`, joining the root at `root` (each address is tried
    /// in turn).
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

    /// Connections the root refused so far (bad token, duplicate rank, malformed join…).
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
        let mut joined: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
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
                for s in joined.iter_mut().flatten() {
                    let _ = send_error(s, &msg, now + REPLY_WRITE_TIMEOUT);
                }
                return (Err(Error::Wireup(msg)), rejected);
            }
            let mut progress = false;
            loop {
                match listener.accept() {
                    Ok((s, peer)) => {
                        progress = true;
                        if pending.len() >= MAX_PENDING || s.set_nonblocking(true).is_err() {
                            rejected += 1;
                            continue;
                        }
                        pending.push(Pending {
                            stream: s,
                            peer,
                            buf: Vec::new(),
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // ECONNABORTED and friends concern one connection; keep serving.
                    Err(_) => break,
                }
            }
            let mut i = 0;
            while i < pending.len() {
                let step = pending[i].poll();
                if !matches!(step, Poll::Waiting) {
                    progress = true;
                }
                let p = match step {
                    Poll::Waiting => {
                        i += 1;
                        continue;
                    }
                    Poll::Closed => {
                        pending.swap_remove(i);
                        continue;
                    }
                    Poll::Oversized => {
                        rejected += 1;
                        let p = pending.swap_remove(i);
                        tracing::warn!(peer = %p.peer, "rendezvous: dropped an oversized join");
                        continue;
                    }
                    Poll::Ready => pending.swap_remove(i),
                };
                match decode_join(&p.buf[4..], self.token, self.size) {
                    Err(why) => {
                        rejected += 1;
                        tracing::warn!(peer = %p.peer, "rendezvous: refused a join: {why}");
                        let mut s = p.stream;
                        let _ = send_error(&mut s, &why, now + REPLY_WRITE_TIMEOUT);
                    }
                    Ok((rank, uris)) => {
                        let r = rank as usize;
                        let stale = joined[r].as_ref().is_some_and(is_closed);
                        if table[r].is_some() && !stale {
                            rejected += 1;
                            let why = format!("rank {rank} has already joined");
                            tracing::warn!(peer = %p.peer, "rendezvous: refused a join: {why}");
                            let mut s = p.stream;
                            let _ = send_error(&mut s, &why, now + REPLY_WRITE_TIMEOUT);
                        } else {
                            if table[r].is_none() {
                                count += 1;
                            }
                            table[r] = Some(uris);
                            joined[r] = Some(p.stream);
                        }
                    }
                }
            }
            if !progress {
                std::thread::sleep(POLL_INTERVAL);
            }
        }
        let table: Vec<String> = table.into_iter().map(Option::unwrap_or_default).collect();
        let reply = encode_table(&table);
        let until = Instant::now() + REPLY_WRITE_TIMEOUT.max(self.timeout);
        for (rank, s) in joined.iter_mut().enumerate() {
            if let Some(s) = s {
                if let Err(e) = write_frame(s, &reply, until) {
                    // That rank fails on its own; the others still get their table.
                    tracing::warn!(rank, "rendezvous: could not send the table: {e}");
                }
            }
        }
        (Ok(table), rejected)
    }

    /// A member's side: connect, send the join, wait for the table.
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

    /// [`join`](Self::join), calling `on_retry(n, error)` after the `n`th round of
    /// connection attempts failed (the root does not listen yet) and before the next.
    fn join_observed(
        &self,
        root: &[SocketAddr],
        my_uris: &str,
        on_retry: &mut dyn FnMut(u32, &io::Error),
    ) -> Result<Vec<String>, Error> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let rank = self.rank;
        let mut s = connect_retry(root, deadline, on_retry).map_err(|e| {
            Error::Wireup(format!(
                "rank {rank}: cannot reach the rendezvous root at {} within {} ms: {e}",
                list_addrs(root),
                self.timeout.as_millis()
            ))
        })?;
        let _ = s.set_nodelay(true);
        let join = encode_join(self.token, rank, self.size, my_uris);
        write_frame(&mut s, &join, deadline)
            .map_err(|e| Error::Wireup(format!("rank {rank}: sending the join failed: {e}")))?;
        // The root decides when the exchange has failed and says which ranks are missing;
        // wait a little longer than our own deadline to hear it.
        let grace = (self.timeout / 10).clamp(Duration::from_millis(200), Duration::from_secs(5));
        let body = read_frame(&mut s, MAX_TABLE_LEN, deadline + grace).map_err(|e| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                Error::Wireup(format!(
                    "rank {rank}: no address table from the rendezvous root at {} within {} ms; \
                     the root reports which ranks are missing",
                    list_addrs(root),
                    (self.timeout + grace).as_millis()
                ))
            } else {
                Error::Wireup(format!("rank {rank}: rendezvous reply: {e}"))
            }
        })?;
        let table = decode_reply(&body, self.size)
            .map_err(|e| Error::Wireup(format!("rank {rank}: {e}")))?;
        Ok(table)
    }
}

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
/// Connections waiting to send their join; more are refused (a flood cannot exhaust fds).
const MAX_PENDING: usize = 1024;
const STATUS_TABLE: u8 = 0;
const STATUS_ERROR: u8 = 1;

struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
}

enum Poll {
    Waiting,
    Ready,
    Closed,
    Oversized,
}

impl Pending {
    /// Reads what is available without blocking; `Ready` once a whole join is buffered.
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

fn encode_join(token: u64, rank: u32, size: u32, uris: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(24 + uris.len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_be_bytes());
    b.extend_from_slice(&token.to_be_bytes());
    b.extend_from_slice(&rank.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&(uris.len() as u16).to_be_bytes());
    b.extend_from_slice(uris.as_bytes());
    b
}

/// Checks a join body; the error text is sent back to the joining rank.
fn decode_join(b: &[u8], token: u64, size: u32) -> Result<(u32, String), String> {
    let mut r = Reader(b);
    if r.take(4) != Some(&MAGIC[..]) {
        return Err("not a ringbtl rendezvous join (bad magic)".into());
    }
    let version = r.u16().ok_or("truncated join")?;
    if version != VERSION {
        return Err(format!(
            "rendezvous version {version:#06x} not supported (root speaks {VERSION:#06x})"
        ));
    }
    if r.u64().ok_or("truncated join")? != token {
        return Err("job token mismatch".into());
    }
    let rank = r.u32().ok_or("truncated join")?;
    let their_size = r.u32().ok_or("truncated join")?;
    if their_size != size {
        return Err(format!(
            "rank {rank} believes the job has {their_size} ranks, the root has {size}"
        ));
    }
    if rank == 0 || rank >= size {
        return Err(format!("rank {rank} is out of range 1..{size}"));
    }
    let len = r.u16().ok_or("truncated join")? as usize;
    let uris = r.take(len).ok_or("truncated join")?;
    if !r.0.is_empty() {
        return Err("trailing bytes after the join".into());
    }
    let uris = std::str::from_utf8(uris).map_err(|_| "address list is not UTF-8".to_owned())?;
    Ok((rank, uris.to_owned()))
}

fn encode_table(table: &[String]) -> Vec<u8> {
    let mut b = Vec::with_capacity(11 + table.iter().map(|u| 2 + u.len()).sum::<usize>());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_be_bytes());
    b.push(STATUS_TABLE);
    b.extend_from_slice(&(table.len() as u32).to_be_bytes());
    for u in table {
        b.extend_from_slice(&(u.len() as u16).to_be_bytes());
        b.extend_from_slice(u.as_bytes());
    }
    b
}

fn decode_reply(b: &[u8], size: u32) -> Result<Vec<String>, String> {
    let mut r = Reader(b);
    if r.take(4) != Some(&MAGIC[..]) || r.u16() != Some(VERSION) {
        return Err("rendezvous root sent a reply we cannot read (bad magic or version)".into());
    }
    match r.take(1) {
        Some([STATUS_ERROR]) => {
            let len = r.u16().ok_or("truncated error reply")? as usize;
            let text = r.take(len).ok_or("truncated error reply")?;
            Err(format!(
                "rendezvous root refused: {}",
                String::from_utf8_lossy(text)
            ))
        }
        Some([STATUS_TABLE]) => {
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
        _ => Err("unknown rendezvous reply".into()),
    }
}

fn send_error(s: &mut TcpStream, msg: &str, until: Instant) -> io::Result<()> {
    let text = &msg.as_bytes()[..msg.len().min(u16::MAX as usize)];
    let mut b = Vec::with_capacity(9 + text.len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_be_bytes());
    b.push(STATUS_ERROR);
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

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const TOKEN: u64 = 0xfeed_f00d;

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
            Rendezvous::root(l, size, TOKEN, Duration::from_millis(timeout_ms)),
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
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l); // nobody listens yet: members retry
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
        let l = TcpListener::bind(a).unwrap();
        let mut r0 = Rendezvous::root(l, 2, TOKEN, Duration::from_secs(10));
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
        let bad = member(a, 1, n, TOKEN + 1, 5_000)
            .exchange(&uri(1))
            .unwrap_err();
        assert!(bad.to_string().contains("job token mismatch"), "{bad}");
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
        assert_eq!(rejected, 3);
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
        assert!(decode_reply(&body, n).unwrap_err().contains("bad magic"));
        // A silent connection does not block the others.
        let _idle = TcpStream::connect(a).unwrap();
        let t = member(a, 1, n, TOKEN, 10_000).exchange(&uri(1)).unwrap();
        let (t0, rejected) = srv.join().unwrap();
        assert_eq!(t0.unwrap(), t);
        assert_eq!(rejected, 2);
    }

    #[test]
    fn codec_round_trip_and_bounds() {
        let j = encode_join(7, 3, 4, "tcp://1.2.3.4:5");
        assert_eq!(
            decode_join(&j, 7, 4).unwrap(),
            (3, "tcp://1.2.3.4:5".to_owned())
        );
        for cut in 0..j.len() {
            assert!(decode_join(&j[..cut], 7, 4).is_err());
        }
        assert!(decode_join(&encode_join(7, 0, 4, ""), 7, 4)
            .unwrap_err()
            .contains("out of range"));
        assert!(decode_join(&encode_join(7, 4, 4, ""), 7, 4)
            .unwrap_err()
            .contains("out of range"));
        let t = vec!["a".to_owned(), String::new(), "ccc".to_owned()];
        let b = encode_table(&t);
        assert_eq!(decode_reply(&b, 3).unwrap(), t);
        assert!(decode_reply(&b, 4).is_err());
        for cut in 0..b.len() {
            assert!(decode_reply(&b[..cut], 3).is_err());
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
