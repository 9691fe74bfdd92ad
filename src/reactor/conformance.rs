//! Backend conformance tests: the contract of [`Backend`] (module doc of `reactor`),
//! checked over real loopback sockets for any backend.
//!
//! Each backend's test module calls [`run_all`] with a constructor. Everything binds to
//! 127.0.0.1, every wait is bounded (a case fails after [`DEADLINE`] rather than hangs),
//! and no duration is asserted beyond "it returned".

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{sys, Backend, ConnId, Event, RxBuf, SockOpts, TxBatch};

/// Upper bound for any single wait in a case.
const DEADLINE: Duration = Duration::from_secs(5);
/// Poll granularity while waiting.
const TICK: Duration = Duration::from_millis(10);

/// Runs every case against backends built by `make` (called once or more per case, with
/// the socket options the case needs).
pub(super) fn run_all<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    run_all_except(make, &[]);
}

/// [`run_all`] without the cases named in `skip` (each caller says why).
pub(super) fn run_all_except<B: Backend>(make: &dyn Fn(SockOpts) -> B, skip: &[&str]) {
    let cases: [(&str, Case<B>); 16] = [
        ("connect_accept", case_connect_accept),
        ("multipart_batch", case_multipart_batch),
        ("more_parts_than_iov_max", case_more_parts_than_iov_max),
        ("large_batch_slow_reader", case_large_batch_slow_reader),
        ("lent_batch_slow_reader", case_lent_batch_slow_reader),
        (
            "close_with_lent_send_pending",
            case_close_with_lent_send_pending,
        ),
        ("eof_after_peer_close", case_eof_after_peer_close),
        ("connect_refused", case_connect_refused),
        ("close_with_recv_pending", case_close_with_recv_pending),
        ("close_with_send_pending", case_close_with_send_pending),
        ("poll_timeout_idle", case_poll_timeout_idle),
        ("many_connections", case_many_connections),
        ("misuse_returns_buffers", case_misuse_returns_buffers),
        ("wants_all_completes_full", case_wants_all_completes_full),
        (
            "low_water_follows_the_record",
            case_low_water_follows_the_record,
        ),
        ("write_now_heads_the_batch", case_write_now_heads_the_batch),
    ];
    let backend = make(SockOpts::default()).name();
    for (name, case) in cases {
        if skip.contains(&name) {
            eprintln!("conformance[{backend}] {name}: skipped");
            continue;
        }
        let t = Instant::now();
        case(make);
        eprintln!("conformance[{backend}] {name}: ok ({:?})", t.elapsed());
    }
}

/// One conformance case: builds the backends it needs with the given constructor.
type Case<B> = fn(&dyn Fn(SockOpts) -> B);

fn loopback() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
}

/// A backend plus the events polled but not yet looked at.
struct Harness<B> {
    b: B,
    q: VecDeque<Event>,
    out: Vec<Event>,
}

impl<B: Backend> Harness<B> {
    fn new(b: B) -> Self {
        Self {
            b,
            q: VecDeque::new(),
            out: Vec::new(),
        }
    }

    /// One bounded poll; new events join the queue.
    fn pump(&mut self, t: Duration) {
        self.b.poll(Some(t), &mut self.out).expect("poll failed");
        for ev in self.out.drain(..) {
            // Every case accepts only connections it made itself.
            if let Event::AcceptError(e) = &ev {
                panic!("unexpected accept error: {e}");
            }
            self.q.push_back(ev);
        }
    }

    /// Polls for up to `t`, keeping every event.
    fn pump_for(&mut self, t: Duration) {
        let end = Instant::now() + t;
        while Instant::now() < end {
            self.pump(TICK);
        }
    }

    /// Removes and returns the first event matching `f`, polling until [`DEADLINE`].
    fn wait(&mut self, what: &str, f: impl Fn(&Event) -> bool) -> Event {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(i) = self.q.iter().position(&f) {
                return self.q.remove(i).expect("index from position");
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {what}; queued: {:?}",
                self.q
            );
            self.pump(TICK);
        }
    }

    fn wait_closed(&mut self, conn: ConnId) {
        self.wait(
            "Closed",
            |e| matches!(e, Event::Closed { conn: c } if *c == conn),
        );
    }

    fn wait_sent(&mut self, conn: ConnId) -> (TxBatch, io::Result<()>) {
        match self.wait(
            "Sent",
            |e| matches!(e, Event::Sent { conn: c, .. } if *c == conn),
        ) {
            Event::Sent { batch, result, .. } => (batch, result),
            _ => unreachable!(),
        }
    }

    fn wait_recv(&mut self, conn: ConnId) -> (RxBuf, io::Result<usize>) {
        match self.wait(
            "Recv",
            |e| matches!(e, Event::Recv { conn: c, .. } if *c == conn),
        ) {
            Event::Recv { rx, result, .. } => (rx, result),
            _ => unreachable!(),
        }
    }

    /// No event of `conn` shows up within `t`.
    fn assert_quiet(&mut self, conn: ConnId, t: Duration) {
        self.pump_for(t);
        let stray: Vec<_> = self.q.iter().filter(|e| conn_of(e) == Some(conn)).collect();
        assert!(
            stray.is_empty(),
            "unexpected events for {conn:?}: {stray:?}"
        );
    }

    /// Listens, connects, and waits for both ends. Returns (client, server).
    fn pair(&mut self) -> (ConnId, ConnId) {
        let addr = self.b.listen(loopback()).expect("listen");
        self.connect_to(addr)
    }

    fn connect_to(&mut self, addr: SocketAddr) -> (ConnId, ConnId) {
        let client = self.b.connect(addr, None).expect("connect");
        let server = match self.wait("Accepted", |e| matches!(e, Event::Accepted { .. })) {
            Event::Accepted { conn, peer } => {
                assert!(peer.ip().is_loopback(), "peer {peer}");
                conn
            }
            _ => unreachable!(),
        };
        match self.wait(
            "Connected",
            |e| matches!(e, Event::Connected { conn, .. } if *conn == client),
        ) {
            Event::Connected { result, .. } => result.expect("connect result"),
            _ => unreachable!(),
        }
        assert_ne!(client, server);
        (client, server)
    }

    /// Receives exactly `n` bytes on `conn` through repeated `recv`, `cap` bytes at most
    /// per read; with `slow`, pauses now and then without polling.
    fn recv_exact(&mut self, conn: ConnId, n: usize, cap: usize, slow: bool) -> Vec<u8> {
        let mut got = Vec::with_capacity(n);
        let mut rx = RxBuf::cache(cap);
        let mut filled = 0;
        let mut reads = 0u32;
        let end = Instant::now() + DEADLINE * 2;
        while got.len() < n {
            assert!(Instant::now() < end, "recv_exact: {} of {n}", got.len());
            self.b.recv(conn, rx);
            let (r, result) = self.wait_recv(conn);
            let k = result.expect("recv result");
            assert!(k > 0, "unexpected EOF after {} of {n} bytes", got.len());
            got.extend_from_slice(r.bytes(filled..filled + k));
            filled += k;
            rx = r;
            if filled == rx.capacity() {
                rx = RxBuf::cache(cap);
                filled = 0;
            }
            reads += 1;
            if slow && reads.is_multiple_of(32) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert_eq!(got.len(), n, "received more than sent");
        got
    }

    fn close_and_wait(&mut self, conns: &[ConnId]) {
        for &c in conns {
            self.b.close(c);
        }
        for &c in conns {
            self.wait_closed(c);
        }
    }
}

fn conn_of(e: &Event) -> Option<ConnId> {
    match e {
        Event::Accepted { conn, .. }
        | Event::Connected { conn, .. }
        | Event::Sent { conn, .. }
        | Event::Recv { conn, .. }
        | Event::RecvProvided { conn, .. }
        | Event::ProvidedPaused { conn }
        | Event::Closed { conn } => Some(*conn),
        Event::AcceptError(_) => None,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// A batch alternating copied pieces and external `Bytes` segments; returns it with the
/// byte stream it must produce.
fn mixed_batch(ext_parts: usize, ext_len: usize) -> (TxBatch, Vec<u8>) {
    let mut b = TxBatch::with_capacity(64 * ext_parts, 2 * ext_parts);
    let mut want = Vec::new();
    for i in 0..ext_parts {
        let hdr = pattern(16 + i % 7, i as u8);
        b.push_copy(&hdr);
        want.extend_from_slice(&hdr);
        let seg = pattern(ext_len, 100 + i as u8);
        want.extend_from_slice(&seg);
        b.push_ext(Bytes::from(seg));
        b.add_frame();
    }
    b.push_copy(b"trailer");
    want.extend_from_slice(b"trailer");
    (b, want)
}

fn small_bufs() -> SockOpts {
    SockOpts {
        nodelay: true,
        sndbuf: Some(16 * 1024),
        rcvbuf: Some(16 * 1024),
        ..SockOpts::default()
    }
}

/// Listen, connect, accept; both ends are usable in both directions and close cleanly.
fn case_connect_accept<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(SockOpts::default()));
    let (client, server) = h.pair();
    let mut b = TxBatch::default();
    b.push_copy(b"ping");
    h.b.send(client, b);
    assert_eq!(h.recv_exact(server, 4, 64, false), b"ping");
    h.wait_sent(client).1.expect("send");
    let mut b = TxBatch::default();
    b.push_copy(b"pong");
    h.b.send(server, b);
    assert_eq!(h.recv_exact(client, 4, 64, false), b"pong");
    h.wait_sent(server).1.expect("send");
    h.close_and_wait(&[client, server]);
}

/// A batch of copied and external parts arrives byte for byte, over several reads.
fn case_multipart_batch<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(SockOpts {
        nodelay: true,
        ..SockOpts::default()
    }));
    let (client, server) = h.pair();
    let (batch, want) = mixed_batch(12, 9_000);
    let total = batch.len();
    h.b.send(client, batch);
    let got = h.recv_exact(server, want.len(), 4096, false);
    assert!(got == want, "multipart stream differs");
    let (batch, result) = h.wait_sent(client);
    result.expect("send");
    assert_eq!(batch.remaining(), 0);
    assert_eq!(batch.len(), total);
    // A reused batch (cleared, refilled) goes out again.
    let mut batch = batch;
    batch.clear();
    batch.push_copy(b"again");
    h.b.send(client, batch);
    assert_eq!(h.recv_exact(server, 5, 4096, false), b"again");
    h.wait_sent(client).1.expect("second send");
    h.close_and_wait(&[client, server]);
}

/// A batch of more parts than one `sendmsg` takes (IOV_MAX = 1024): the backend sends
/// it in several calls, in order, and reports one `Sent`.
fn case_more_parts_than_iov_max<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(SockOpts::default()));
    let (client, server) = h.pair();
    let mut batch = TxBatch::with_capacity(0, 3000);
    let mut want = Vec::new();
    for i in 0..3000usize {
        let seg = pattern(1 + i % 61, i as u8);
        want.extend_from_slice(&seg);
        batch.push_ext(Bytes::from(seg));
    }
    assert_eq!(batch.parts(), 3000);
    h.b.send(client, batch);
    let got = h.recv_exact(server, want.len(), 64 * 1024, false);
    assert!(got == want, "stream of many parts differs");
    let (batch, result) = h.wait_sent(client);
    result.expect("send of many parts");
    assert_eq!(batch.remaining(), 0);
    h.close_and_wait(&[client, server]);
}

/// 8 MiB through small socket buffers to a slow reader: short writes are resumed inside
/// the backend and `Sent` comes once, when everything is written.
fn case_large_batch_slow_reader<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(small_bufs()));
    let (client, server) = h.pair();
    let (batch, want) = mixed_batch(8, 1 << 20);
    h.b.send(client, batch);
    let got = h.recv_exact(server, want.len(), 16 * 1024, true);
    assert!(got == want, "large stream differs");
    let (batch, result) = h.wait_sent(client);
    result.expect("large send");
    assert_eq!(batch.remaining(), 0);
    let sent_events =
        h.q.iter()
            .filter(|e| matches!(e, Event::Sent { .. }))
            .count();
    assert_eq!(sent_events, 0, "more than one Sent for one batch");
    h.close_and_wait(&[client, server]);
}

/// A batch whose large segments are lent (header copies, lent segments, a referenced
/// one, a trailer), through small socket buffers to a slow reader: the lent pages go
/// through the pipe (`Counters::spliced_bytes`: all but the few bytes each segment, which
/// starts inside a page, leaves after a pipe-full), the stream arrives byte for byte, and
/// `Sent` comes once. A second lent batch on the same connection reuses the pipe.
fn case_lent_batch_slow_reader<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(small_bufs()));
    let (client, server) = h.pair();
    let mut piped = 0;
    for round in 0..2u8 {
        let (batch, want, lent) = lent_batch(round);
        piped += lent;
        h.b.send(client, batch);
        let got = h.recv_exact(server, want.len(), 16 * 1024, true);
        assert!(got == want, "lent stream differs (round {round})");
        let (batch, result) = h.wait_sent(client);
        result.expect("lent send");
        assert_eq!(batch.remaining(), 0);
        let spliced = h.b.counters().spliced_bytes;
        assert_eq!(
            spliced, piped,
            "the lent bytes spliced (all but each segment's copied rest)"
        );
    }
    h.close_and_wait(&[client, server]);
}

/// A batch of header copies, three lent segments of 1 MiB (odd offsets and lengths), a
/// referenced one and a trailer; with the stream it must produce and how many of the lent
/// bytes go through the pipe.
fn lent_batch(seed: u8) -> (TxBatch, Vec<u8>, u64) {
    let mut b = TxBatch::with_capacity(256, 16);
    let (mut want, mut piped) = (Vec::new(), 0);
    for i in 0..3u8 {
        let hdr = pattern(8, seed ^ i);
        b.push_copy(&hdr);
        want.extend_from_slice(&hdr);
        let big = Bytes::from(pattern((1 << 20) + 8, seed.wrapping_add(40 + i)));
        // Starts and ends inside a page.
        let seg = big.slice(3 + usize::from(i)..(1 << 20) + 1);
        want.extend_from_slice(&seg);
        piped += super::op::piped_bytes(&seg) as u64;
        b.push_lent(seg);
        b.add_frame();
    }
    let ext = pattern(70_000, seed.wrapping_add(7));
    want.extend_from_slice(&ext);
    b.push_ext(Bytes::from(ext));
    b.push_copy(b"trailer");
    want.extend_from_slice(b"trailer");
    assert!(b.has_lent());
    (b, want, piped)
}

/// Close with a lent send pending (peer not reading, small buffers): `Sent{Err}` with
/// the batch, one `Closed`, and a new connection's lent send is not disturbed by bytes
/// the first one left in its pipe.
fn case_close_with_lent_send_pending<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(small_bufs()));
    let (client, server) = h.pair();
    let (batch, _, _) = lent_batch(1);
    let total = batch.len();
    close_mid_send(&mut h, client, batch, total);
    h.close_and_wait(&[server]);
    let (client, server) = h.pair();
    let (batch, want, _) = lent_batch(2);
    h.b.send(client, batch);
    let got = h.recv_exact(server, want.len(), 64 * 1024, false);
    assert!(got == want, "lent stream after a failed one differs");
    h.wait_sent(client).1.expect("lent send");
    h.close_and_wait(&[client, server]);
}

/// The peer closes: a receive completes with `Ok(0)`. `close` is idempotent.
fn case_eof_after_peer_close<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(SockOpts::default()));
    let (client, server) = h.pair();
    h.b.close(server);
    h.b.close(server);
    h.wait_closed(server);
    h.b.recv(client, RxBuf::cache(256));
    let (rx, result) = h.wait_recv(client);
    assert_eq!(result.expect("recv at EOF"), 0);
    assert_eq!(rx.pending(), 0);
    h.assert_quiet(server, Duration::from_millis(30));
    h.close_and_wait(&[client]);
}

/// Nobody listens: `Connected` carries ECONNREFUSED.
fn case_connect_refused<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(SockOpts::default()));
    let addr = {
        let l = std::net::TcpListener::bind(loopback()).expect("bind");
        l.local_addr().expect("local_addr")
    };
    let conn = h.b.connect(addr, None).expect("connect starts");
    match h.wait(
        "Connected",
        |e| matches!(e, Event::Connected { conn: c, .. } if *c == conn),
    ) {
        Event::Connected { result, .. } => {
            let err = result.expect_err("connect to a closed port succeeded");
            assert_eq!(err.raw_os_error(), Some(libc::ECONNREFUSED), "{err}");
        }
        _ => unreachable!(),
    }
    h.close_and_wait(&[conn]);
}

/// Close with a receive pending: the receive comes back with an error and its buffer,
/// then exactly one `Closed`.
fn case_close_with_recv_pending<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(SockOpts::default()));
    let (client, server) = h.pair();
    h.b.recv(server, RxBuf::cache(1000));
    h.pump_for(Duration::from_millis(20));
    assert!(h.q.is_empty(), "{:?}", h.q);
    h.b.close(server);
    h.b.close(server);
    let evs = collect_until_closed(&mut h, server);
    assert_eq!(evs.len(), 2, "{evs:?}");
    match &evs[0] {
        Event::Recv { rx, result, .. } => {
            assert!(result.is_err(), "recv after close: {result:?}");
            assert_eq!(rx.capacity(), 1000);
        }
        other => panic!("expected Recv first, got {other:?}"),
    }
    h.assert_quiet(server, Duration::from_millis(30));
    h.close_and_wait(&[client]);
}

/// Close with a send pending (peer not reading, small buffers): `Sent{Err}` with the
/// batch, then exactly one `Closed`.
fn case_close_with_send_pending<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(small_bufs()));
    let (client, server) = h.pair();
    let (batch, _) = mixed_batch(8, 1 << 20);
    let total = batch.len();
    close_mid_send(&mut h, client, batch, total);
    h.assert_quiet(client, Duration::from_millis(30));
    h.close_and_wait(&[server]);
}

/// Sends `batch` (`total` bytes, more than the small socket buffers hold) to a peer that
/// does not read, then closes `client`: `Sent{Err}` with the batch, then one `Closed`.
fn close_mid_send<B: Backend>(h: &mut Harness<B>, client: ConnId, batch: TxBatch, total: usize) {
    h.b.send(client, batch);
    h.pump_for(Duration::from_millis(50));
    assert!(
        !h.q.iter().any(|e| matches!(e, Event::Sent { .. })),
        "{total} bytes fit in small socket buffers?"
    );
    h.b.close(client);
    let evs = collect_until_closed(h, client);
    assert_eq!(evs.len(), 2, "{evs:?}");
    match &evs[0] {
        Event::Sent { batch, result, .. } => {
            assert!(result.is_err(), "send after close: {result:?}");
            assert_eq!(batch.len(), total);
            assert!(batch.remaining() > 0);
        }
        other => panic!("expected Sent first, got {other:?}"),
    }
}

/// Gathers every event of `conn` up to and including its `Closed`.
fn collect_until_closed<B: Backend>(h: &mut Harness<B>, conn: ConnId) -> Vec<Event> {
    let mut evs = Vec::new();
    loop {
        let e = h.wait("an event of the closing connection", |e| {
            conn_of(e) == Some(conn)
        });
        let done = matches!(e, Event::Closed { .. });
        evs.push(e);
        if done {
            return evs;
        }
    }
}

/// `poll(Some(t))` with nothing to do returns, without events.
fn case_poll_timeout_idle<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut b = make(SockOpts::default());
    let mut out = Vec::new();
    let t = Instant::now();
    b.poll(Some(Duration::from_millis(50)), &mut out)
        .expect("poll");
    assert!(out.is_empty(), "{out:?}");
    assert!(t.elapsed() < DEADLINE);
    b.poll(None, &mut out).expect("poll(None)");
    assert!(out.is_empty(), "{out:?}");
}

/// 50 connections at once, each carrying its own bytes both ways.
fn case_many_connections<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    const N: usize = 50;
    let mut h = Harness::new(make(SockOpts {
        nodelay: true,
        ..SockOpts::default()
    }));
    let addr = h.b.listen(loopback()).expect("listen");
    // Half of the clients bind their local end explicitly first.
    let clients: Vec<ConnId> = (0..N)
        .map(|i| {
            let bind = (i % 2 == 0).then(loopback);
            h.b.connect(addr, bind).expect("connect")
        })
        .collect();
    let mut servers = Vec::new();
    for _ in 0..N {
        match h.wait("Accepted", |e| matches!(e, Event::Accepted { .. })) {
            Event::Accepted { conn, .. } => servers.push(conn),
            _ => unreachable!(),
        }
    }
    for &c in &clients {
        match h.wait(
            "Connected",
            |e| matches!(e, Event::Connected { conn, .. } if *conn == c),
        ) {
            Event::Connected { result, .. } => result.expect("connect"),
            _ => unreachable!(),
        }
    }
    // Each client names itself; the server echoes the name back.
    for (i, &c) in clients.iter().enumerate() {
        let mut b = TxBatch::default();
        b.push_copy(&(i as u64).to_le_bytes());
        h.b.send(c, b);
    }
    let mut seen = [false; N];
    for &s in &servers {
        let got = h.recv_exact(s, 8, 64, false);
        let i = u64::from_le_bytes(got.as_slice().try_into().expect("8 bytes")) as usize;
        assert!(i < N && !seen[i], "bad or duplicate client id {i}");
        seen[i] = true;
        let mut b = TxBatch::default();
        b.push_copy(&got);
        h.b.send(s, b);
    }
    for (i, &c) in clients.iter().enumerate() {
        let got = h.recv_exact(c, 8, 64, false);
        assert_eq!(got, (i as u64).to_le_bytes());
    }
    for &c in clients.iter().chain(&servers) {
        h.wait_sent(c).1.expect("send");
    }
    let all: Vec<ConnId> = clients.iter().chain(&servers).copied().collect();
    h.close_and_wait(&all);
}

/// Operations on a closed connection fail and still return their buffers, with the
/// errno every backend uses for that misuse: `ENOTCONN` for an id that names no
/// connection, `ECANCELED` for a closing one, `EINVAL` for a receive buffer without room.
fn case_misuse_returns_buffers<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let errno = |r: &io::Result<usize>| r.as_ref().err().and_then(io::Error::raw_os_error);
    let mut h = Harness::new(make(SockOpts::default()));
    let (client, server) = h.pair();
    h.close_and_wait(&[client]);
    // `client` is free again; nothing of it lives in the backend.
    let mut b = TxBatch::default();
    b.push_copy(b"late");
    h.b.send(client, b);
    let (b, result) = h.wait_sent(client);
    assert!(result.is_err());
    assert_eq!(errno(&result.map(|()| 0)), Some(libc::ENOTCONN));
    assert_eq!(b.len(), 4);
    h.b.recv(client, RxBuf::cache(128));
    let (rx, result) = h.wait_recv(client);
    assert!(result.is_err());
    assert_eq!(errno(&result), Some(libc::ENOTCONN));
    assert_eq!(rx.capacity(), 128);
    // A buffer without spare room: a zero-length read would look like end of stream.
    let mut full = RxBuf::cache(128);
    let room = full.spare_mut().len();
    full.commit(room);
    h.b.recv(server, full);
    let (rx, result) = h.wait_recv(server);
    assert_eq!(errno(&result), Some(libc::EINVAL));
    assert_eq!(rx.pending(), room);
    // Closing, not yet closed: what comes now is cancelled.
    h.b.close(server);
    let mut b = TxBatch::default();
    b.push_copy(b"too late");
    h.b.send(server, b);
    h.b.recv(server, RxBuf::cache(64));
    let (b, result) = h.wait_sent(server);
    assert_eq!(errno(&result.map(|()| 0)), Some(libc::ECANCELED));
    assert_eq!(b.len(), 8);
    let (_, result) = h.wait_recv(server);
    assert_eq!(errno(&result), Some(libc::ECANCELED));
    h.wait_closed(server);
}

/// A buffer that wants all of its bytes (a large payload's) completes once, when it is
/// full, however many reads that takes; bytes it already held count as received.
/// Small socket buffers make sure the payload cannot arrive in one read.
fn case_wants_all_completes_full<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    const LEN: usize = 3 << 20;
    const HAD: usize = 1000;
    let mut h = Harness::new(make(small_bufs()));
    let (client, server) = h.pair();
    let payload = pattern(LEN, 11);
    let mut b = TxBatch::with_capacity(64, 2);
    b.push_ext(Bytes::copy_from_slice(&payload[HAD..]));
    h.b.send(client, b);
    let mut rx = whole_buf(LEN);
    assert!(rx.wants_all());
    // The first bytes of the payload came with an earlier read.
    rx.spare_mut()[..HAD].copy_from_slice(&payload[..HAD]);
    rx.commit(HAD);
    h.b.recv(server, rx);
    let (rx, result) = h.wait_recv(server);
    let n = result.expect("receive into a buffer that wants all");
    assert_eq!(n, LEN - HAD, "completed before the buffer was full");
    assert_eq!(rx.pending(), LEN);
    let at = rx.record_start();
    assert!(rx.bytes(at..at + LEN) == &payload[..], "payload differs");
    h.wait_sent(client).1.expect("send");
    h.assert_quiet(server, Duration::from_millis(20));
    h.close_and_wait(&[client, server]);
}

/// Polls for up to `t`, giving every receive of `conn` that completed short of its whole
/// buffer back to it (as the engine does); returns the buffer once it is full.
fn pump_whole<B: Backend>(h: &mut Harness<B>, conn: ConnId, t: Duration) -> Option<RxBuf> {
    let end = Instant::now() + t;
    loop {
        while let Some(i) =
            h.q.iter()
                .position(|e| matches!(e, Event::Recv { conn: c, .. } if *c == conn))
        {
            if let Some(Event::Recv { rx, result, .. }) = h.q.remove(i) {
                result.expect("receive into a buffer that wants all");
                if rx.missing() == 0 {
                    return Some(rx);
                }
                h.b.recv(conn, rx);
            }
        }
        if Instant::now() >= end {
            return None;
        }
        h.pump(TICK);
    }
}

/// On a connection with a receive low-water mark for large records (a paced one's,
/// `SockOpts::rcvlowat_for`), a buffer that wants all of a record raises the socket's
/// mark while more of the record than the mark is missing, and lowers it to the default
/// for the rest: the record's last bytes, fewer than the mark and sent after a pause,
/// still complete it (a wait on a socket whose mark is above what is still to come
/// would never end). Reads from io_uring may complete short of the buffer meanwhile.
fn case_low_water_follows_the_record<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    const LEN: usize = 1 << 20;
    const MARK: usize = 64 << 10;
    const HEAD: usize = 300 << 10;
    const TAIL: usize = 10;
    // The system's algorithm, said to pace, and loopback peers taken as other hosts: the
    // mark is asked for whatever the algorithm is.
    let opts = SockOpts {
        congestion: super::config::Congestion::System,
        system_paces: true,
        paced_rcvlowat: Some(MARK),
        rcvlowat_loopback: true,
        ..SockOpts::default()
    };
    assert_eq!(opts.rcvlowat_for(&loopback()), Some(MARK));
    let mut h = Harness::new(make(opts));
    let (client, server) = h.pair();
    let fd = h.b.open_fd(server).expect("the server's socket");
    let mark = || sys::rcvlowat(fd).expect("SO_RCVLOWAT");
    assert_eq!(mark(), 1, "a new socket has the default mark");
    let payload = pattern(LEN, 23);
    h.b.recv(server, whole_buf(LEN));
    for (piece, mark_then) in [(0..HEAD, MARK), (HEAD..LEN - TAIL, 1)] {
        let mut b = TxBatch::with_capacity(64, 2);
        b.push_ext(Bytes::copy_from_slice(&payload[piece.clone()]));
        h.b.send(client, b);
        h.wait_sent(client).1.expect("send");
        let rx = pump_whole(&mut h, server, Duration::from_millis(100));
        assert!(
            rx.is_none(),
            "complete with {} bytes missing",
            LEN - piece.end
        );
        assert_eq!(
            mark(),
            mark_then,
            "mark with {} bytes missing",
            LEN - piece.end
        );
    }
    let mut b = TxBatch::default();
    b.push_copy(&payload[LEN - TAIL..]);
    h.b.send(client, b);
    h.wait_sent(client).1.expect("send of the tail");
    let rx = pump_whole(&mut h, server, DEADLINE).expect("the record's last bytes never came");
    let at = rx.record_start();
    assert!(rx.bytes(at..at + LEN) == &payload[..], "payload differs");
    assert_eq!(mark(), 1, "the mark after the record");
    h.close_and_wait(&[client, server]);
}

/// `write_now` writes the head of a connection's next batch at once; the batch, advanced
/// by that count, brings the rest (or nothing) and completes as usual. It writes nothing
/// beside a send in progress, on a closing connection or on an id that names none.
fn case_write_now_heads_the_batch<B: Backend>(make: &dyn Fn(SockOpts) -> B) {
    let mut h = Harness::new(make(small_bufs()));
    let (client, server) = h.pair();
    // Part of the batch at once (its first piece), the rest by its send.
    let mut b = TxBatch::default();
    b.push_copy(b"head");
    b.push_ext(Bytes::from_static(b"+tail"));
    let mut pieces: [&[u8]; 4] = [&[]; 4];
    assert_eq!(b.unsent_pieces(&mut pieces), Some(2));
    assert_eq!(h.b.write_now(client, &pieces[..1]), 4);
    b.advance(4);
    h.b.send(client, b);
    assert_eq!(h.recv_exact(server, 9, 64, false), b"head+tail");
    h.wait_sent(client).1.expect("send of the rest");
    // All of it at once, gathered: the batch's send writes nothing more and completes.
    let mut b = TxBatch::default();
    b.push_copy(b"who");
    b.push_ext(Bytes::from_static(b"le"));
    let mut pieces: [&[u8]; 4] = [&[]; 4];
    let n = b.unsent_pieces(&mut pieces).expect("unsent pieces");
    let w = h.b.write_now(client, &pieces[..n]);
    assert_eq!(w, 5);
    b.advance(w);
    h.b.send(client, b);
    let (b, result) = h.wait_sent(client);
    result.expect("send of a written batch");
    assert_eq!(b.remaining(), 0);
    assert_eq!(h.recv_exact(server, 5, 64, false), b"whole");
    // Beside a send in progress (more than the small buffers hold, unread): nothing.
    let (batch, want) = mixed_batch(4, 256 * 1024);
    h.b.send(client, batch);
    h.pump_for(Duration::from_millis(30));
    assert_eq!(
        h.b.write_now(client, &[&b"cut in"[..]]),
        0,
        "written beside a send"
    );
    let got = h.recv_exact(server, want.len(), 64 * 1024, false);
    assert!(got == want, "the stream differs");
    h.wait_sent(client).1.expect("large send");
    h.assert_quiet(server, Duration::from_millis(20));
    // Closing, and an id that names no connection: nothing.
    h.b.close(server);
    assert_eq!(h.b.write_now(server, &[&b"late"[..]]), 0);
    h.wait_closed(server);
    assert_eq!(h.b.write_now(server, &[&b"gone"[..]]), 0);
    h.close_and_wait(&[client]);
}

/// An empty buffer that wants all of its `len` bytes: a large payload's buffer, made
/// the way the receive cache makes it (from a frame header), from a spare that held a
/// record this large before (so its read window is the whole payload at once; a fresh
/// one would start smaller and grow as the bytes arrive).
fn whole_buf(len: usize) -> RxBuf {
    use crate::proto::deframe::Frames;
    use crate::wire::{FrameKind, Header, Tag};
    let hdr = Header {
        kind: FrameKind::Send,
        tag: Tag(1),
        len: len as u32,
        ack: false,
        line: 0,
    };
    let bytes = hdr.to_bytes();
    let mut cache = RxBuf::cache(64);
    cache.spare_mut()[..bytes.len()].copy_from_slice(&bytes);
    cache.commit(bytes.len());
    cache.into_large(hdr, RxBuf::cache(len))
}
