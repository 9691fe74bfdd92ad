//! Shared helpers for the loopback tests: one test body runs once per compiled backend.
#![allow(dead_code, unreachable_pub)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringbtl::{BackendKind, Completion, Config, FailReason, PeerId, Transport};

pub mod ipv6;
pub mod netns;
pub mod process;
pub mod skip;
pub(crate) use skip::skip;

/// Whether the kernel offers `bbr`; skips (saying so) where it does not.
#[allow(dead_code)] // not every test binary uses it
pub fn have_bbr() -> bool {
    let avail = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    let have = avail.split_whitespace().any(|a| a == "bbr");
    if !have {
        skip(format_args!(
            "no bbr among the kernel's algorithms ({avail:?})"
        ));
    }
    have
}

/// Generates one `#[test]` per compiled backend and receive mode for each listed
/// function `fn name(kind: BackendKind)`; the test names carry the backend (`uring::name`,
/// `uring_multishot::name`, `epoll::name`). `uring_multishot` runs io_uring with
/// [`Config::recv_multishot`] on (every transport made by [`cfg`] on that test's thread).
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        #[cfg(feature = "uring")]
        mod uring {
            $( #[test] fn $name() {
                if $crate::common::usable(ringbtl::BackendKind::Uring) {
                    super::$name(ringbtl::BackendKind::Uring)
                }
            } )*
        }
        #[cfg(feature = "uring")]
        mod uring_multishot {
            $( #[test] fn $name() {
                $crate::common::set_multishot(true);
                if $crate::common::usable(ringbtl::BackendKind::Uring) {
                    super::$name(ringbtl::BackendKind::Uring)
                }
            } )*
        }
        #[cfg(feature = "epoll")]
        mod epoll {
            $( #[test] fn $name() { super::$name(ringbtl::BackendKind::Epoll) } )*
        }
    };
}

/// Whether `kind` can run here; otherwise [`skip`]s the test with the reason (io_uring
/// may be disabled by the kernel).
pub fn usable(kind: BackendKind) -> bool {
    match Transport::new(cfg(0, kind)) {
        Ok(_) => true,
        Err(e) => {
            skip(format_args!("backend {kind:?} unavailable here: {e}"));
            false
        }
    }
}

thread_local! {
    static MULTISHOT: Cell<bool> = const { Cell::new(false) };
}

/// Makes [`cfg`] on this thread turn on [`Config::recv_multishot`].
pub fn set_multishot(on: bool) {
    MULTISHOT.with(|m| m.set(on));
}

/// Whether [`cfg`] turns on multishot receive: [`set_multishot`] on this thread, or
/// `RINGBTL_RECV_MULTISHOT=1` in the environment (to run the whole suite that way).
pub fn multishot() -> bool {
    MULTISHOT.with(|m| m.get())
        || std::env::var("RINGBTL_RECV_MULTISHOT").is_ok_and(|v| v.trim() == "1")
}

/// A loopback config for process `pid`.
pub fn cfg(pid: u32, kind: BackendKind) -> Config {
    let mut c = Config::new(PeerId(pid));
    c.socket.backend = kind;
    c.socket.recv_multishot = multishot();
    c.core.connect_retries = 3;
    c.core.retry_delay = Duration::from_millis(5);
    c
}

/// Two transports that know each other.
pub fn pair(kind: BackendKind) -> (Transport, Transport) {
    pair_with(kind, |_| {})
}

/// Two transports that know each other, configs adjusted by `f`.
pub fn pair_with(kind: BackendKind, f: impl Fn(&mut Config)) -> (Transport, Transport) {
    let mut c0 = cfg(0, kind);
    let mut c1 = cfg(1, kind);
    f(&mut c0);
    f(&mut c1);
    let mut a = Transport::new(c0).expect("transport 0");
    let mut b = Transport::new(c1).expect("transport 1");
    for t in [&a, &b] {
        if multishot() && kind == BackendKind::Uring && t.backend_note().is_none() {
            assert!(
                t.backend_detail().contains("multishot"),
                "{}",
                t.backend_detail()
            );
        }
    }
    a.add_peer(PeerId(1), vec![b.local_addr()]).unwrap();
    b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    (a, b)
}

/// Progresses every transport until `done()` or the deadline (then panics with `what`).
pub fn drive(
    ts: &mut [&mut Transport],
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        for t in ts.iter_mut() {
            t.progress().expect("progress");
        }
    }
}

/// Records every completion.
/// Asserts that exactly `n` sends completed, each once and successfully, in the order
/// of their cookies `0..n`.
#[allow(dead_code)] // not every test binary uses it
pub fn assert_all_ok_in_order(comp: &[Completion], n: usize) {
    assert_eq!(comp.len(), n, "completions");
    for (i, c) in comp.iter().enumerate() {
        assert_eq!((c.cookie, &c.result), (i as u64, &Ok(())));
    }
}

/// Connects `a` to peer 1 `b` by sending one message of four zero bytes (tag 1, cookie
/// 0) and progressing both until it completed; returns `a`'s completion log.
#[allow(dead_code)] // not every test binary uses it
pub fn connect_by_first_send(a: &mut Transport, b: &mut Transport) -> Rc<RefCell<Vec<Completion>>> {
    let comp = completions(a);
    a.send(
        PeerId(1),
        ringbtl::Tag(1),
        &[Bytes::from_static(&[0; 4])],
        0,
    )
    .unwrap();
    drive(&mut [a, b], Duration::from_secs(10), "connect", || {
        comp.borrow().len() == 1
    });
    comp
}

pub fn completions(t: &mut Transport) -> Rc<RefCell<Vec<Completion>>> {
    let v = Rc::new(RefCell::new(Vec::new()));
    let v2 = v.clone();
    t.on_complete(move |c| v2.borrow_mut().push(c));
    v
}

/// Records every peer failure.
pub fn failures(t: &mut Transport) -> Rc<RefCell<Vec<(PeerId, FailReason)>>> {
    let v = Rc::new(RefCell::new(Vec::new()));
    let v2 = v.clone();
    t.on_error(move |p, r| v2.borrow_mut().push((p, r.clone())));
    v
}

/// Deterministic xorshift generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A message stream both sides can regenerate from a seed: sizes, tags, segment cuts
/// and contents, so the receiver checks every byte, the order and the count.
pub struct Stream {
    rng: Rng,
    pattern: Bytes,
    pub seq: u64,
}

/// One generated message.
pub struct Msg {
    pub seq: u64,
    pub tag: u8,
    pub segs: Vec<Bytes>,
    pub len: usize,
}

pub const PATTERN_LEN: usize = 5 << 20;

/// The shared pattern every payload is cut from (zero copy for the sender).
pub fn pattern() -> Bytes {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let v: Vec<u8> = (0..PATTERN_LEN).map(|_| r.next() as u8).collect();
    Bytes::from(v)
}

impl Stream {
    pub fn new(seed: u64, pattern: Bytes) -> Self {
        Self {
            rng: Rng(seed | 1),
            pattern,
            seq: 0,
        }
    }

    /// Next message: mostly 0..=4 KiB, one in `large_every` between 64 KiB and 4 MiB.
    pub fn next(&mut self, large_every: u64) -> Msg {
        let seq = self.seq;
        self.seq += 1;
        let len = if large_every > 0 && self.rng.below(large_every) == 0 {
            64 * 1024 + self.rng.below(4 * 1024 * 1024 - 64 * 1024 + 1) as usize
        } else {
            self.rng.below(4097) as usize
        };
        let tag = 1 + self.rng.below(4) as u8;
        let nsegs = 1 + self.rng.below(8) as usize;
        // Contents: the sequence number (little endian, truncated to len) then a slice
        // of the pattern at a seq-dependent offset.
        let off = (seq as usize * 4099) % (PATTERN_LEN - len.max(1));
        let head_len = len.min(8);
        let head = Bytes::copy_from_slice(&seq.to_le_bytes()[..head_len]);
        let body = self.pattern.slice(off..off + (len - head_len));
        let mut segs = vec![head];
        // Cut the body into 1..=7 pieces (at most 8 segments in all).
        let pieces = nsegs.saturating_sub(1).max(1);
        let mut rest = body;
        for _ in 1..pieces {
            let cut = self.rng.below(rest.len() as u64 + 1) as usize;
            segs.push(rest.split_to(cut));
        }
        segs.push(rest);
        Msg {
            seq,
            tag,
            segs,
            len,
        }
    }

    /// Checks a received payload against the next expected message.
    pub fn check(&mut self, large_every: u64, tag: u8, payload: &[u8]) -> Result<(), String> {
        let m = self.next(large_every);
        if tag != m.tag {
            return Err(format!("seq {}: tag {} != {}", m.seq, tag, m.tag));
        }
        if payload.len() != m.len {
            return Err(format!("seq {}: len {} != {}", m.seq, payload.len(), m.len));
        }
        let mut off = 0;
        for s in &m.segs {
            if payload[off..off + s.len()] != s[..] {
                return Err(format!(
                    "seq {}: bytes differ at segment offset {off}",
                    m.seq
                ));
            }
            off += s.len();
        }
        Ok(())
    }
}

/// Registers handlers for tags 1..=4 on `t` that check every message against the stream
/// generated from `seed` (content, order, count; a mismatch panics). Returns the number
/// of messages checked and how many of them were 64 KiB or more.
pub fn register_checker(
    t: &mut Transport,
    seed: u64,
    large_every: u64,
    pattern: Bytes,
) -> (Rc<Cell<u64>>, Rc<Cell<u64>>) {
    let st = Rc::new(RefCell::new(Stream::new(seed, pattern)));
    let got = Rc::new(Cell::new(0u64));
    let large = Rc::new(Cell::new(0u64));
    for tag in 1..=4u8 {
        let (st, got, large) = (st.clone(), got.clone(), large.clone());
        t.register(ringbtl::Tag(tag), move |_, am| {
            if let Err(e) = st.borrow_mut().check(large_every, am.tag.0, am.payload) {
                panic!("{e}");
            }
            if am.payload.len() >= 64 * 1024 {
                large.set(large.get() + 1);
            }
            got.set(got.get() + 1);
        })
        .unwrap();
    }
    (got, large)
}

/// Reads one whole handshake record from `s` (non-blocking) while driving `ts`; `None`
/// if the connection closed first.
pub fn read_record(
    s: &mut std::net::TcpStream,
    ts: &mut [&mut Transport],
    what: &str,
) -> Option<ringbtl::wire::Hello> {
    use ringbtl::wire::{Hello, HELLO_LEN};
    use std::io::Read;
    s.set_nonblocking(true).unwrap();
    let mut rec = Vec::new();
    let mut closed = false;
    drive(ts, Duration::from_secs(10), what, || {
        let mut buf = [0u8; HELLO_LEN];
        match s.read(&mut buf[..HELLO_LEN - rec.len()]) {
            Ok(0) => closed = true,
            Ok(n) => rec.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => closed = true,
        }
        closed || rec.len() == HELLO_LEN
    });
    s.set_nonblocking(false).unwrap();
    (rec.len() == HELLO_LEN).then(|| Hello::parse(&rec).expect("a handshake record"))
}

/// A hand-made dialer on `s`: HELLO as `me` to `to` (the listener, `ts[0]`, whose job
/// the dialer claims as its own), then, after the CHALLENGE (whose MAC is checked against
/// `key`), an AUTH made with `key`; returns the acceptor's answer (`None`: closed without
/// one). Drives `ts` meanwhile.
pub fn raw_handshake(
    s: &mut std::net::TcpStream,
    ts: &mut [&mut Transport],
    me: PeerId,
    to: PeerId,
    key: &ringbtl::auth::JobKey,
) -> Option<ringbtl::wire::Hello> {
    use ringbtl::auth::{handshake_mac, verify_handshake, Side, Transcript};
    use ringbtl::wire::{Hello, HelloKind};
    use std::io::Write;
    let token = ts[0].config().core.token;
    let nonce_d = [0x6e; 32];
    let mut hello = Hello::new(HelloKind::Hello, me);
    (hello.job, hello.to_job, hello.to) = (token, token, to);
    hello.nonce = nonce_d;
    s.write_all(&hello.to_bytes()).unwrap();
    let ch = read_record(s, ts, "CHALLENGE")?;
    assert_eq!(ch.kind, HelloKind::Challenge, "{ch:?}");
    let t = Transcript {
        job_d: token,
        job_a: token,
        nonce_d: &nonce_d,
        nonce_a: &ch.nonce,
        pid_d: me,
        pid_a: to,
        link: 0,
    };
    let genuine = verify_handshake(key, Side::Acceptor, &t, &ch.mac);
    let mut auth = Hello::new(HelloKind::Auth, me);
    (auth.job, auth.to_job, auth.to) = (token, token, to);
    auth.mac = handshake_mac(key, Side::Dialer, &t);
    if s.write_all(&auth.to_bytes()).is_err() {
        return None;
    }
    let ans = read_record(s, ts, "answer to AUTH");
    if ans.is_some_and(|a| a.kind == HelloKind::Accept) {
        assert!(
            genuine,
            "accepted although the CHALLENGE did not verify with our key"
        );
    }
    ans
}
