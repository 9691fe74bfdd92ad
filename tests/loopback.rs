//! Loopback tests through the public API, two transports in one process, once per
//! compiled backend.

mod common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::{completions, drive, failures, pair, pair_with, pattern, Stream};
use ringbtl::proto::core::EndpointState;
use ringbtl::wire::RejectReason;
use ringbtl::{
    BackendKind, Config, Errno, Error, FailReason, PeerId, ProtoError, SendError, Stats, Tag,
    Transport,
};

backend_tests!(
    stream_100k_checked_both_directions,
    reply_from_handler,
    ping_pong_messages_leave_from_send,
    connect_refused_fails_after_retries,
    unknown_tag_is_counted_not_fatal,
    clean_shutdown_sends_fin,
    peer_drop_fails_pending_sends_once,
    register_twice_is_an_error,
    simultaneous_connect,
    bad_token_is_refused,
    garbage_client_is_dropped,
    coalesced_small_messages_keep_order,
    chunked_large_sends_arrive_whole,
    loopback_connections_use_reno,
    connection_flood_is_bounded,
    data_after_fin_is_a_protocol_error,
    connect_refused_keeps_the_errno,
    handler_unregisters_its_own_tag,
    handlers_changed_during_a_read_take_its_next_messages,
    flush_puts_queued_sends_on_the_wire,
    unknown_peer_resolved_lazily,
    lent_pages_to_many_peers_share_pipes,
    a_large_ping_pong_and_a_large_stream_are_lent,
    lending_follows_the_measured_costs,
    paced_loopback_connections_lend_idle_payloads,
    paced_quick_ack_copies_idle_payloads_and_acks_the_answers,
);

const WINDOW: usize = 128;

/// 100,000+ messages (0 B..4 KiB, 200+ of 64 KiB..4 MiB, 1..8 segments) each way, every
/// one checked for content, order and count; every send completes exactly once.
fn stream_100k_checked_both_directions(kind: BackendKind) {
    let (mut a, mut b) = pair(kind);
    let pat = pattern();
    const N: u64 = 60_000; // per direction: 120,000 messages in all
    const LARGE_EVERY: u64 = 250; // ~240 large ones per direction
    let mut recv_checks = Vec::new();
    for (t, seed) in [(&mut a, 2u64), (&mut b, 1u64)] {
        // Each side checks what the other sends (seeds swapped).
        recv_checks.push(common::register_checker(t, seed, LARGE_EVERY, pat.clone()));
    }
    let ca = completions(&mut a);
    let cb = completions(&mut b);
    let mut sa = Stream::new(1, pat.clone());
    let mut sb = Stream::new(2, pat.clone());
    let (mut sent_a, mut sent_b) = (0u64, 0u64);
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        let done_a = ca.borrow().len() as u64;
        let done_b = cb.borrow().len() as u64;
        while sent_a < N && (sent_a - done_a) < WINDOW as u64 {
            let m = sa.next(LARGE_EVERY);
            a.send(PeerId(1), Tag(m.tag), &m.segs, m.seq).unwrap();
            sent_a += 1;
        }
        while sent_b < N && (sent_b - done_b) < WINDOW as u64 {
            let m = sb.next(LARGE_EVERY);
            b.send(PeerId(0), Tag(m.tag), &m.segs, m.seq).unwrap();
            sent_b += 1;
        }
        a.progress().unwrap();
        b.progress().unwrap();
        let received = recv_checks[0].0.get() + recv_checks[1].0.get();
        if received == 2 * N && done_a == N && done_b == N {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stream timed out at {received}"
        );
    }
    for c in [&ca, &cb] {
        let c = c.borrow();
        // Exactly once each, in order, all Ok.
        common::assert_all_ok_in_order(&c, N as usize);
    }
    assert!(
        recv_checks[0].1.get() >= 200,
        "large: {}",
        recv_checks[0].1.get()
    );
    assert!(
        recv_checks[1].1.get() >= 200,
        "large: {}",
        recv_checks[1].1.get()
    );
    println!("backend {}: {} messages checked", a.backend_name(), 2 * N);
}

/// A pair whose transport 1 answers every message of tag 7 from its handler with the
/// same payload on tag 8; transport 0 keeps those answers, in order.
#[allow(clippy::type_complexity)]
fn echo_pair(kind: BackendKind) -> (Transport, Transport, Rc<RefCell<Vec<Vec<u8>>>>) {
    echo_pair_with(kind, |_| {})
}

/// [`echo_pair`] with both configurations adjusted by `f`.
#[allow(clippy::type_complexity)]
fn echo_pair_with(
    kind: BackendKind,
    f: impl Fn(&mut Config),
) -> (Transport, Transport, Rc<RefCell<Vec<Vec<u8>>>>) {
    let (mut a, mut b) = pair_with(kind, f);
    b.register(Tag(7), |t, am| {
        let reply = Bytes::copy_from_slice(am.payload);
        t.send(am.src, Tag(8), &[reply], 0).unwrap();
    })
    .unwrap();
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    a.register(Tag(8), move |_, am| {
        g.borrow_mut().push(am.payload.to_vec())
    })
    .unwrap();
    (a, b, got)
}

fn reply_from_handler(kind: BackendKind) {
    let (mut a, mut b, got) = echo_pair(kind);
    for i in 0..100u32 {
        a.send(
            PeerId(1),
            Tag(7),
            &[Bytes::copy_from_slice(&i.to_le_bytes())],
            0,
        )
        .unwrap();
    }
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(20),
        "replies",
        || got.borrow().len() == 100,
    );
    for (i, p) in got.borrow().iter().enumerate() {
        assert_eq!(p, &(i as u32).to_le_bytes());
    }
    // progress() from inside a handler is refused, not a recursion.
    let seen = Rc::new(Cell::new(None));
    let s = seen.clone();
    b.register(Tag(9), move |t, _| {
        s.set(Some(matches!(t.progress(), Err(Error::Reentrant(_)))))
    })
    .unwrap();
    a.send(PeerId(1), Tag(9), &[], 0).unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "reentrancy",
        || seen.get().is_some(),
    );
    assert_eq!(seen.get(), Some(true));
}

/// In a ping-pong, each message (8 B, or 1.5 KiB by reference) is written by `send`
/// itself (the ping from the caller, the pong from the handler), not at the end of the
/// pass; every one arrives, in order, and completes once.
fn ping_pong_messages_leave_from_send(kind: BackendKind) {
    const N: u32 = 200;
    let (mut a, mut b, got) = echo_pair(kind);
    let comp = completions(&mut a);
    for i in 0..N {
        // Small pings are copied next to their header, larger ones (every third) go by
        // reference, gathered; both leave at once.
        let len = if i % 3 == 2 { 1500 } else { 4 };
        let ping = Bytes::from([&i.to_le_bytes()[..], &vec![0xa5; len]].concat());
        a.send(PeerId(1), Tag(7), &[ping], u64::from(i)).unwrap();
        let want = i as usize + 1;
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(10),
            "pong",
            || got.borrow().len() == want,
        );
    }
    for (i, p) in got.borrow().iter().enumerate() {
        assert_eq!(p[..4], (i as u32).to_le_bytes(), "pong {i}");
        assert_eq!(p.len(), if i % 3 == 2 { 1504 } else { 8 }, "pong {i}");
    }
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "completions",
        || comp.borrow().len() == N as usize,
    );
    common::assert_all_ok_in_order(&comp.borrow(), N as usize);
    // All but the first few (connecting, then a batch of one frame to learn from): a
    // ping-pong never fills a socket buffer, so each frame is taken at once.
    let (sa, sb) = (a.stats(), b.stats());
    for (who, st) in [("pinging", &sa), ("answering", &sb)] {
        assert!(
            st.written_at_once >= u64::from(N) - 3,
            "{}: {who} side wrote {} of {N} messages at once",
            a.backend_name(),
            st.written_at_once
        );
    }
}

/// A transport whose peer 5 is a loopback port where nobody listens, with `retries`
/// connect attempts, its completion and failure logs, and the socket that holds the port:
/// bound without `SO_REUSEADDR` and not listening, so that every connect to it is refused
/// and no other socket (another test's listener) can take the port while it lives.
#[allow(clippy::type_complexity)]
fn dialing_nobody(
    kind: BackendKind,
    retries: u32,
) -> (
    Transport,
    Rc<RefCell<Vec<ringbtl::Completion>>>,
    Rc<RefCell<Vec<(PeerId, FailReason)>>>,
    socket2::Socket,
) {
    let dead = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    dead.bind(&any.into()).unwrap();
    let addr = dead.local_addr().unwrap().as_socket().unwrap();
    let mut c = common::cfg(0, kind);
    c.core.connect_retries = retries;
    let mut a = Transport::new(c).unwrap();
    a.add_peer(PeerId(5), vec![addr]).unwrap();
    let comp = completions(&mut a);
    let fails = failures(&mut a);
    (a, comp, fails, dead)
}

fn connect_refused_fails_after_retries(kind: BackendKind) {
    let (mut a, comp, fails, _port) = dialing_nobody(kind, 3);
    for i in 0..10 {
        a.send(PeerId(5), Tag(1), &[Bytes::from_static(b"x")], i)
            .unwrap();
    }
    drive(
        &mut [&mut a],
        Duration::from_secs(20),
        "connect failure",
        || comp.borrow().len() == 10,
    );
    for (i, c) in comp.borrow().iter().enumerate() {
        assert_eq!(c.cookie, i as u64);
        assert!(
            matches!(c.result, Err(FailReason::ConnectFailed { attempts: 3, .. })),
            "{:?}",
            c.result
        );
    }
    assert_eq!(fails.borrow().len(), 1);
    assert_eq!(
        a.send(PeerId(5), Tag(1), &[], 99),
        Err(SendError::Unreachable(PeerId(5)))
    );
    assert_eq!(a.stats().connect_retries, 2);
}

fn unknown_tag_is_counted_not_fatal(kind: BackendKind) {
    let (mut a, mut b) = pair(kind);
    let n = Rc::new(Cell::new(0));
    let n2 = n.clone();
    b.register(Tag(2), move |_, _| n2.set(n2.get() + 1))
        .unwrap();
    a.send(PeerId(1), Tag(200), &[Bytes::from_static(b"nobody")], 0)
        .unwrap();
    a.send(PeerId(1), Tag(2), &[Bytes::from_static(b"somebody")], 1)
        .unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "tag",
        || n.get() == 1,
    );
    assert_eq!(b.stats().unknown_tag, 1);
}

fn clean_shutdown_sends_fin(kind: BackendKind) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc};
    // b runs in its own thread so that a's blocking shutdown() has a live peer.
    let got = Arc::new(AtomicUsize::new(0));
    let (addr_tx, addr_rx) = mpsc::channel();
    let (a_addr_tx, a_addr_rx) = mpsc::channel();
    let g = got.clone();
    let peer = std::thread::spawn(move || {
        let mut b = Transport::new(common::cfg(1, kind)).unwrap();
        addr_tx.send(b.local_addr()).unwrap();
        let a_addr = a_addr_rx.recv().unwrap();
        b.add_peer(PeerId(0), vec![a_addr]).unwrap();
        b.register(Tag(1), move |_, _| {
            g.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        let fb = failures(&mut b);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // Until a's FIN arrives and the connection is closed cleanly.
        let mut was_connected = false;
        loop {
            b.progress().unwrap();
            let st = b.peer_state(PeerId(0));
            was_connected |= st == Some(EndpointState::Connected);
            if was_connected && st == Some(EndpointState::Closed) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no FIN seen");
        }
        let failed = fb.borrow().len();
        failed
    });
    let mut a = Transport::new(common::cfg(0, kind)).unwrap();
    a.add_peer(PeerId(1), vec![addr_rx.recv().unwrap()])
        .unwrap();
    a_addr_tx.send(a.local_addr()).unwrap();
    let fa = failures(&mut a);
    let ca = completions(&mut a);
    for i in 0..1000 {
        a.send(PeerId(1), Tag(1), &[Bytes::from_static(&[0u8; 100])], i)
            .unwrap();
    }
    a.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        a.peer_state(PeerId(1)),
        Some(EndpointState::Closed),
        "{:?}",
        (ca.borrow().len(), fa.borrow().clone())
    );
    let b_failures = peer.join().unwrap();
    assert_eq!(b_failures, 0, "a clean close is not a failure");
    assert!(fa.borrow().is_empty(), "{:?}", fa.borrow());
    assert_eq!(ca.borrow().len(), 1000);
    assert!(ca.borrow().iter().all(|c| c.result.is_ok()));
    assert_eq!(got.load(Ordering::Relaxed), 1000);
    assert_eq!(
        a.send(PeerId(1), Tag(1), &[], 0),
        Err(SendError::ShuttingDown)
    );
}

fn peer_drop_fails_pending_sends_once(kind: BackendKind) {
    let (mut a, b) = pair_with(kind, |c: &mut Config| c.socket.sndbuf = Some(64 * 1024));
    let mut b = b;
    let fa = failures(&mut a);
    b.register(Tag(1), |_, _| {}).unwrap();
    let ca = common::connect_by_first_send(&mut a, &mut b);
    // Queue far more than the socket buffers hold, then the peer vanishes (no FIN).
    let big = Bytes::from(vec![7u8; 1 << 20]);
    for i in 1..=64 {
        a.send(PeerId(1), Tag(1), std::slice::from_ref(&big), i)
            .unwrap();
    }
    a.progress().unwrap();
    drop(b);
    drive(&mut [&mut a], Duration::from_secs(20), "failure", || {
        ca.borrow().len() == 65
    });
    let c = ca.borrow();
    let mut cookies: Vec<u64> = c.iter().map(|c| c.cookie).collect();
    cookies.sort_unstable();
    cookies.dedup();
    assert_eq!(cookies.len(), 65, "every send completes exactly once");
    assert!(c.iter().skip(1).any(|c| c.result.is_err()));
    assert_eq!(fa.borrow().len(), 1);
    assert_eq!(
        a.send(PeerId(1), Tag(1), &[], 0),
        Err(SendError::Unreachable(PeerId(1)))
    );
}

fn register_twice_is_an_error(kind: BackendKind) {
    let (mut a, _b) = pair(kind);
    a.register(Tag(3), |_, _| {}).unwrap();
    assert!(matches!(
        a.register(Tag(3), |_, _| {}),
        Err(Error::TagInUse(Tag(3)))
    ));
    assert!(a.unregister(Tag(3)));
    a.register(Tag(3), |_, _| {}).unwrap();
}

/// Both sides send before either has progressed: both dial; one connection survives and
/// every message arrives once, in order.
fn simultaneous_connect(kind: BackendKind) {
    for round in 0..5 {
        let (mut a, mut b) = pair(kind);
        let ga = Rc::new(RefCell::new(Vec::new()));
        let gb = Rc::new(RefCell::new(Vec::new()));
        let (g1, g2) = (ga.clone(), gb.clone());
        a.register(Tag(1), move |_, am| g1.borrow_mut().push(am.payload[0]))
            .unwrap();
        b.register(Tag(1), move |_, am| g2.borrow_mut().push(am.payload[0]))
            .unwrap();
        for i in 0..50u8 {
            a.send(PeerId(1), Tag(1), &[Bytes::copy_from_slice(&[i])], 0)
                .unwrap();
            b.send(PeerId(0), Tag(1), &[Bytes::copy_from_slice(&[i])], 0)
                .unwrap();
        }
        // Alternate who progresses first.
        let mut ts: [&mut Transport; 2] = if round % 2 == 0 {
            [&mut a, &mut b]
        } else {
            [&mut b, &mut a]
        };
        drive(&mut ts, Duration::from_secs(20), "simultaneous", || {
            ga.borrow().len() == 50 && gb.borrow().len() == 50
        });
        let want: Vec<u8> = (0..50).collect();
        assert_eq!(*ga.borrow(), want);
        assert_eq!(*gb.borrow(), want);
        let sims = a.stats().simultaneous + b.stats().simultaneous;
        assert!(sims >= 1, "both dialed, so a tie-break happened");
    }
}

fn bad_token_is_refused(kind: BackendKind) {
    let mut c0 = common::cfg(0, kind);
    c0.core.token = 1;
    // Another job's refusals are retried until the connect timeout.
    c0.core.connect_timeout = Duration::from_secs(1);
    let mut c1 = common::cfg(1, kind);
    c1.core.token = 2;
    let mut a = Transport::new(c0).unwrap();
    let mut b = Transport::new(c1).unwrap();
    a.add_peer(PeerId(1), vec![b.local_addr()]).unwrap();
    b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    let fa = failures(&mut a);
    let ca = completions(&mut a);
    a.send(PeerId(1), Tag(1), &[], 0).unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "refusal",
        || ca.borrow().len() == 1,
    );
    assert!(ca.borrow()[0].result.is_err());
    assert_eq!(fa.borrow().len(), 1);
    // Another token is another job, which `b` never added: refused before any proof.
    let f = fa.borrow()[0].1.to_string();
    assert!(f.contains("UnknownJob"), "{f}");
    assert!(b.stats().refused >= 1);
    assert_eq!(a.stats().auth_failed, 0);
}

fn garbage_client_is_dropped(kind: BackendKind) {
    use std::io::{Read, Write};
    let (mut a, mut b) = pair(kind);
    let mut s = std::net::TcpStream::connect(b.local_addr()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s.set_nonblocking(true).unwrap();
    let mut closed = false;
    let got = Rc::new(Cell::new(0));
    let g = got.clone();
    b.register(Tag(1), move |_, _| g.set(g.get() + 1)).unwrap();
    a.send(PeerId(1), Tag(1), &[], 0).unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "garbage dropped",
        || {
            let mut buf = [0u8; 64];
            match s.read(&mut buf) {
                Ok(0) => closed = true,
                Ok(_) => panic!("no answer is expected for a bad magic"),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => closed = true,
            }
            closed && got.get() == 1
        },
    );
    assert_eq!(b.stats().bad_magic, 1);
}

/// A burst of small messages queued while a send is in flight leaves in gathered sends
/// of many frames each; order and per-message completions are kept, with mixed sizes.
fn coalesced_small_messages_keep_order(kind: BackendKind) {
    let (mut a, mut b) = pair(kind);
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    b.register(Tag(1), move |_, am| {
        let seq = u32::from_le_bytes(am.payload[..4].try_into().unwrap());
        // Every payload is its sequence number then (seq % 3000) bytes of seq as u8.
        assert_eq!(am.payload.len(), 4 + (seq % 3000) as usize);
        assert!(am.payload[4..].iter().all(|&x| x == seq as u8));
        g.borrow_mut().push(seq);
    })
    .unwrap();
    // Connect first (message 0), so the burst below is queued behind in-flight sends.
    let comp = common::connect_by_first_send(&mut a, &mut b);
    const N: u32 = 20_000;
    for seq in 1..N {
        let mut p = seq.to_le_bytes().to_vec();
        p.resize(4 + (seq % 3000) as usize, seq as u8);
        a.send(PeerId(1), Tag(1), &[Bytes::from(p)], seq as u64)
            .unwrap();
    }
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(60),
        "burst",
        || got.borrow().len() == N as usize && comp.borrow().len() == N as usize,
    );
    assert_eq!(*got.borrow(), (0..N).collect::<Vec<_>>());
    common::assert_all_ok_in_order(&comp.borrow(), N as usize);
    let st = a.stats();
    println!(
        "backend {}: {} frames in {} gathered sends",
        a.backend_name(),
        st.frames,
        st.batches
    );
    assert!(
        st.frames >= 4 * st.batches,
        "frames were not coalesced: {} frames in {} sends",
        st.frames,
        st.batches
    );
    // Only the burst's first message found the batch of a lone frame (message 0's):
    // the others were gathered, none written from `send` itself.
    assert!(
        st.written_at_once <= 1,
        "{} messages of a burst written at once",
        st.written_at_once
    );
}

/// With `send_chunk` = 128 KiB (cut at whole segments: one 65,483-byte segment on
/// loopback, never more than the chunk) every large message leaves in many send calls
/// (counted), interleaved with small ones; each arrives whole, in order, checked byte by
/// byte, and completes once.
fn chunked_large_sends_arrive_whole(kind: BackendKind) {
    const CHUNK: usize = 128 * 1024;
    let (mut a, mut b) = pair_with(kind, |c| c.socket.send_chunk = Some(CHUNK));
    let large_bytes = alternating_stream(&mut a, &mut b, 16);
    let st = a.stats();
    println!(
        "backend {}: {} batches, {} send calls",
        a.backend_name(),
        st.batches,
        st.send_calls
    );
    assert!(
        st.send_calls >= (large_bytes / CHUNK) as u64,
        "{} send calls for {large_bytes} bytes in chunks of {CHUNK}",
        st.send_calls
    );
}

/// Multishot receive on a ring far smaller than a payload: each 1 MiB payload pauses
/// the connection's multishot receive and is read straight into its buffer; the small
/// messages around it still come through the ring. Everything is checked byte by byte.
#[cfg(feature = "uring")]
#[test]
fn multishot_large_payloads_are_received_directly() {
    let Some((mut a, mut b)) = multishot_pair(8, 4096) else {
        return;
    };
    const N: u8 = 16;
    alternating_stream(&mut a, &mut b, N);
    let st = b.stats();
    println!(
        "{} of {} large payloads received directly",
        st.recv_direct,
        N / 2
    );
    // The ring (32 KiB) cannot hold a payload, so every one of them goes direct.
    assert_eq!(st.recv_direct, u64::from(N / 2));
}

/// Two io_uring transports with multishot receive on a ring of `bufs` x `size` bytes;
/// `None` (the test is [`common::skip`]ped) where io_uring or multishot receive is
/// unavailable.
#[cfg(feature = "uring")]
fn multishot_pair(bufs: u32, size: usize) -> Option<(Transport, Transport)> {
    if !common::usable(BackendKind::Uring) {
        return None;
    }
    let (a, b) = pair_with(BackendKind::Uring, |c| {
        c.socket.recv_multishot = true;
        c.socket.recv_ring_bufs = bufs;
        c.socket.recv_ring_buf_size = size;
    });
    if let Some(note) = b.backend_note() {
        common::skip(note);
        return None;
    }
    Some((a, b))
}

/// Sends `n` messages from `a` to peer 1 `b` on tag 2, even ones of 1 MiB + seq bytes
/// in three segments, odd ones of 100 bytes, all queued at once; `b` checks every
/// byte and the order, every send completes once. Returns the large messages' bytes.
fn alternating_stream(a: &mut Transport, b: &mut Transport, n: u8) -> usize {
    let len = |seq: u8| {
        if seq.is_multiple_of(2) {
            (1 << 20) + seq as usize
        } else {
            100
        }
    };
    let byte = |seq: u8, i: usize| (i as u8).wrapping_mul(31).wrapping_add(seq);
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    b.register(Tag(2), move |_, am| {
        let seq = am.payload[0];
        assert_eq!(am.payload.len(), len(seq), "message {seq}");
        let ok = am.payload[1..]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == byte(seq, i));
        assert!(ok, "message {seq} corrupted");
        g.borrow_mut().push(seq);
    })
    .unwrap();
    let comp = completions(a);
    for seq in 0..n {
        let mut p = vec![seq; len(seq)];
        for (i, x) in p[1..].iter_mut().enumerate() {
            *x = byte(seq, i);
        }
        // Three segments, so chunk boundaries fall inside and across them.
        let p = Bytes::from(p);
        let (x, y) = (p.len() / 3, 2 * p.len() / 3);
        let segs = [p.slice(..x), p.slice(x..y), p.slice(y..)];
        a.send(PeerId(1), Tag(2), &segs, seq as u64).unwrap();
    }
    drive(
        &mut [a, b],
        Duration::from_secs(60),
        "alternating stream",
        || got.borrow().len() == n as usize && comp.borrow().len() == n as usize,
    );
    assert_eq!(*got.borrow(), (0..n).collect::<Vec<_>>());
    common::assert_all_ok_in_order(&comp.borrow(), n as usize);
    (0..n).filter(|s| s.is_multiple_of(2)).map(len).sum()
}

/// Connections that never say HELLO cost no cache and are capped: beyond the limit they
/// are closed at once; the handshake deadline closes the others; peers keep working.
fn connection_flood_is_bounded(kind: BackendKind) {
    let (mut a, mut b) = pair_with(kind, |c: &mut Config| {
        c.core.max_half_open = 8;
        c.core.handshake_timeout = Duration::from_millis(300);
    });
    let addr = b.local_addr();
    let flood: Vec<std::net::TcpStream> = (0..40)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.stats().accept_overload < 32 {
        b.progress().unwrap();
        assert!(std::time::Instant::now() < deadline, "flood not accepted");
    }
    assert_eq!(b.stats().accept_overload, 32);
    // The handshake deadline closes the half-open ones: wait until every flooding socket
    // sees its connection closed (EOF or reset), then a real peer connects.
    for s in &flood {
        s.set_nonblocking(true).unwrap();
    }
    let mut open: Vec<&std::net::TcpStream> = flood.iter().collect();
    while !open.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} half-open connections outlived the handshake deadline",
            open.len()
        );
        b.progress().unwrap();
        open.retain(|s| {
            let mut s: &std::net::TcpStream = s;
            matches!(
                std::io::Read::read(&mut s, &mut [0u8; 1]),
                Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock
            )
        });
    }
    let got = Rc::new(Cell::new(0));
    let g = got.clone();
    b.register(Tag(1), move |_, _| g.set(g.get() + 1)).unwrap();
    a.send(PeerId(1), Tag(1), &[Bytes::from_static(b"still here")], 0)
        .unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "peer after flood",
        || got.get() == 1,
    );
    drop(flood);
}

/// A transport told that several threads enter it (`SocketConfig::threads`) builds its
/// io_uring ring without task-run flags, which any thread may drive; by default the
/// ring is bound to its creator (`SINGLE_ISSUER | DEFER_TASKRUN`). Messages flow
/// either way. (`ffi/tests/c/threads_test.c` drives such transports from four threads.)
#[cfg(feature = "uring")]
#[test]
fn a_transport_entered_from_threads_has_a_ring_any_thread_may_drive() {
    if !common::usable(BackendKind::Uring) {
        return;
    }
    for (threads, flags) in [(true, "no task-run flags"), (false, "SINGLE_ISSUER")] {
        let (mut a, mut b) = pair_with(BackendKind::Uring, |c| c.socket.threads = threads);
        if let Some(note) = b.backend_note() {
            common::skip(note);
            return;
        }
        for t in [&a, &b] {
            assert!(
                t.backend_detail().contains(flags),
                "threads {threads}: {}",
                t.backend_detail()
            );
        }
        one_way_checked_stream(&mut a, &mut b, 200, 8, 64, 3);
    }
}

/// Multishot receive on a ring of two 4 KiB provided buffers while the peer floods mixed
/// sizes (up to 1 MiB, so most frames straddle buffers and large ones are reassembled):
/// the ring runs empty (the kernel reports ENOBUFS, counted in `recv_starved`), the
/// receive is re-armed once buffers come back, and every message arrives intact, in
/// order, exactly once.
#[cfg(feature = "uring")]
#[test]
fn multishot_tiny_ring_flood_loses_nothing() {
    let Some((mut a, mut b)) = multishot_pair(2, 4096) else {
        return;
    };
    assert!(
        b.backend_detail().contains("multishot"),
        "{}",
        b.backend_detail()
    );
    // A deep window keeps the socket full, so the two buffers run out.
    one_way_checked_stream(&mut a, &mut b, 20_000, 500, 1024, 7);
    let starved = b.stats().recv_starved;
    println!("ring of 2 x 4 KiB: receive re-armed after ENOBUFS {starved} times");
    assert!(starved > 0, "the provided-buffer ring never ran empty");
}

/// A hand-made peer that completes the handshake, sends FIN, then more data: the
/// transport fails that peer with a protocol error (FIN promises the end of the stream).
fn data_after_fin_is_a_protocol_error(kind: BackendKind) {
    use ringbtl::wire::{FrameKind, Header, HelloKind};
    use std::io::Write;
    let (_a, mut b) = pair(kind);
    let fails = failures(&mut b);
    let mut s = std::net::TcpStream::connect(b.local_addr()).unwrap();
    let ack = common::raw_handshake(
        &mut s,
        &mut [&mut b],
        PeerId(0),
        PeerId(1),
        &ringbtl::auth::PUBLIC_KEY,
    );
    assert_eq!(ack.map(|h| h.kind), Some(HelloKind::Accept));
    let fin = Header {
        kind: FrameKind::Fin,
        tag: Tag(0),
        len: 0,
        ack: false,
        line: 0,
    };
    let send = Header {
        kind: FrameKind::Send,
        tag: Tag(1),
        len: 3,
        ack: false,
        line: 0,
    };
    let mut bytes = fin.to_bytes().to_vec();
    bytes.extend_from_slice(&send.to_bytes());
    bytes.extend_from_slice(b"bad");
    s.set_nonblocking(false).unwrap();
    s.write_all(&bytes).unwrap();
    drive(
        &mut [&mut b],
        Duration::from_secs(10),
        "protocol error",
        || !fails.borrow().is_empty(),
    );
    let f = fails.borrow();
    assert_eq!(f.len(), 1);
    assert!(
        matches!(
            &f[0].1,
            FailReason::Protocol {
                err: ProtoError::DataAfterFin,
                ..
            }
        ),
        "{:?}",
        f[0]
    );
}

/// Zero-copy sends (forced on loopback, from 16 KiB): a checked stream of large and small
/// messages arrives intact and in order, and the kernel's notifications are counted.
#[cfg(feature = "uring")]
#[test]
fn zero_copy_stream_checked() {
    if !common::usable(BackendKind::Uring) {
        return;
    }
    let (mut a, mut b) = pair_with(BackendKind::Uring, |c| {
        c.socket.zerocopy_min = Some(16 * 1024);
        c.socket.zerocopy_loopback = true;
    });
    one_way_checked_stream(&mut a, &mut b, 3_000, 20, 64, 11);
    let st = a.stats();
    if st.zerocopy_sends == 0 {
        common::skip(
            "SENDMSG_ZC unsupported on this kernel (the checked stream above used plain sends)",
        );
        return;
    }
    println!(
        "{} zero-copy sends, {} copied by the kernel (loopback copies)",
        st.zerocopy_sends, st.zerocopy_copied
    );
    assert!(st.zerocopy_copied <= st.zerocopy_sends);
}

/// Streams `n` generated messages (one in `large_every` of 64 KiB..4 MiB) from `a` to
/// peer 1 `b`, at most `window` outstanding; `b` checks every byte, the order and the
/// count; every send completes Ok exactly once.
#[cfg(feature = "uring")]
fn one_way_checked_stream(
    a: &mut Transport,
    b: &mut Transport,
    n: u64,
    large_every: u64,
    window: u64,
    seed: u64,
) {
    let pat = pattern();
    let (got, _) = common::register_checker(b, seed, large_every, pat.clone());
    let comp = completions(a);
    let mut s = Stream::new(seed, pat);
    let mut sent = 0u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while got.get() < n || (comp.borrow().len() as u64) < n {
        while sent < n && sent - (comp.borrow().len() as u64) < window {
            let m = s.next(large_every);
            a.send(PeerId(1), Tag(m.tag), &m.segs, m.seq).unwrap();
            sent += 1;
        }
        a.progress().unwrap();
        b.progress().unwrap();
        assert!(
            std::time::Instant::now() < deadline,
            "stream stalled at {}",
            got.get()
        );
    }
    common::assert_all_ok_in_order(&comp.borrow(), n as usize);
}

/// An unknown congestion control algorithm is refused when the transport starts, with
/// a message that names the setting and what the kernel offers.
#[test]
fn unknown_congestion_control_is_refused() {
    let mut c = common::cfg(0, BackendKind::Auto);
    c.socket.tcp_congestion = ringbtl::Congestion::Use("no-such-cc".into());
    match Transport::new(c) {
        Err(Error::Config(m)) => {
            assert!(
                m.contains("RINGBTL_TCP_CONGESTION") && m.contains("available"),
                "{m}"
            );
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

/// Both ends of a loopback connection (the dialed and the accepted socket) run `reno`
/// under the default `Congestion::Auto`, whatever the system's default; with
/// `Congestion::System` they run the system's. Read back with `ss -ti` (iproute2);
/// [`common::skip`]ped where `ss` is missing.
fn loopback_connections_use_reno(kind: BackendKind) {
    let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .unwrap()
        .trim()
        .to_string();
    for (cc, want) in [
        (ringbtl::Congestion::Auto, "reno".to_string()),
        (ringbtl::Congestion::System, system),
    ] {
        let (mut a, mut b) = pair_with(kind, |c| c.socket.tcp_congestion = cc.clone());
        common::connect_by_first_send(&mut a, &mut b);
        let port = b.local_addr().port();
        let filter = format!("( sport = :{port} or dport = :{port} )");
        let out = match std::process::Command::new("ss")
            .args(["-tinH", "state", "established", &filter])
            .output()
        {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            other => {
                common::skip(format_args!("`ss` (iproute2) unavailable: {other:?}"));
                return;
            }
        };
        // `ss -i` prints each socket's algorithm among its TCP details.
        let algos: Vec<&str> = out
            .split_whitespace()
            .filter(|w| ["reno", "cubic", "bbr", "dctcp", "vegas", "htcp"].contains(w))
            .collect();
        assert_eq!(algos.len(), 2, "both ends of the connection: {out}");
        assert!(algos.iter().all(|&w| w == want), "{cc:?}: {algos:?}\n{out}");
    }
}

/// The OS error of a failed connect reaches the application as a number it can match on.
fn connect_refused_keeps_the_errno(kind: BackendKind) {
    let (mut a, comp, fails, _port) = dialing_nobody(kind, 1);
    a.send(PeerId(5), Tag(1), &[Bytes::from_static(b"x")], 0)
        .unwrap();
    drive(
        &mut [&mut a],
        Duration::from_secs(20),
        "connect failure",
        || comp.borrow().len() == 1,
    );
    let errno = |r: &FailReason| match r {
        FailReason::ConnectFailed { cause, .. } => cause.errno(),
        other => panic!("not a connect failure: {other:?}"),
    };
    let from_completion = errno(comp.borrow()[0].result.as_ref().unwrap_err());
    assert_eq!(from_completion, Some(Errno::ECONNREFUSED));
    assert_eq!(
        from_completion.map(Errno::kind),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
    assert_eq!(fails.borrow().len(), 1);
    assert_eq!(errno(&fails.borrow()[0].1), Some(Errno::ECONNREFUSED));
}

/// A handler that unregisters its own tag stays unregistered after its call.
fn handler_unregisters_its_own_tag(kind: BackendKind) {
    let (mut a, mut b) = pair(kind);
    let calls = Rc::new(Cell::new(0));
    let removed = Rc::new(Cell::new(None));
    let (c2, r2) = (calls.clone(), removed.clone());
    b.register(Tag(3), move |t, _| {
        c2.set(c2.get() + 1);
        r2.set(Some(t.unregister(Tag(3))));
    })
    .unwrap();
    // A last message on another tag: frames arrive in order, so once it is in, both
    // messages for tag 3 were dispatched.
    let last = Rc::new(Cell::new(false));
    let l2 = last.clone();
    b.register(Tag(4), move |_, _| l2.set(true)).unwrap();
    for i in 0..2 {
        a.send(PeerId(1), Tag(3), &[Bytes::from_static(b"once")], i)
            .unwrap();
    }
    a.send(PeerId(1), Tag(4), &[], 2).unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "self-unregister",
        || last.get(),
    );
    assert_eq!(calls.get(), 1, "the second message finds no handler");
    assert_eq!(b.stats().unknown_tag, 1);
    assert_eq!(
        removed.get(),
        Some(true),
        "unregister saw the running handler"
    );
    assert!(!b.unregister(Tag(3)), "nothing was put back");
    b.register(Tag(3), |_, _| {}).unwrap();
}

/// Handlers registered or replaced by a handler take the very next messages of the same
/// read: a read's messages of one tag share one lookup of their handler, which must not
/// outlive such a change.
fn handlers_changed_during_a_read_take_its_next_messages(kind: BackendKind) {
    let (mut a, mut b) = pair(kind);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s1 = seen.clone();
    b.register(Tag(3), move |t, am| {
        s1.borrow_mut().push(('A', am.payload[0]));
        if am.payload[0] == 1 {
            // Replace itself, and start taking tag 5.
            assert!(t.unregister(Tag(3)));
            let s2 = s1.clone();
            t.register(Tag(3), move |_, am| {
                s2.borrow_mut().push(('B', am.payload[0]))
            })
            .unwrap();
            let s3 = s1.clone();
            t.register(Tag(5), move |_, am| {
                s3.borrow_mut().push(('C', am.payload[0]))
            })
            .unwrap();
        }
    })
    .unwrap();
    let last = Rc::new(Cell::new(false));
    let l2 = last.clone();
    b.register(Tag(4), move |_, _| l2.set(true)).unwrap();
    b.register(Tag(1), |_, _| {}).unwrap();
    common::connect_by_first_send(&mut a, &mut b);
    // One pass: one batch, so (on loopback) one read on the other side.
    for (i, tag) in [3u8, 3, 3, 5, 3, 3].into_iter().enumerate() {
        a.send(PeerId(1), Tag(tag), &[Bytes::from(vec![i as u8])], i as u64)
            .unwrap();
    }
    a.send(PeerId(1), Tag(4), &[], 9).unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "the series of messages",
        || last.get(),
    );
    assert_eq!(
        *seen.borrow(),
        [('A', 0), ('A', 1), ('B', 2), ('C', 3), ('B', 4), ('B', 5)]
    );
    assert_eq!(b.stats().unknown_tag, 0);
}

/// `flush` hands a queued send to the kernel with no progress pass afterwards: the peer
/// receives it while the sender does nothing at all (as a rank blocked in a launcher's
/// barrier right after a send), and the completion waits for the sender's next pass.
fn flush_puts_queued_sends_on_the_wire(kind: BackendKind) {
    let (mut a, mut b) = pair(kind);
    let got = Rc::new(RefCell::new(Vec::new()));
    let g2 = got.clone();
    b.register(Tag(5), move |_, am| {
        g2.borrow_mut().push(am.payload.to_vec())
    })
    .unwrap();
    let comp = common::connect_by_first_send(&mut a, &mut b);
    for i in 1..=3u64 {
        a.send(PeerId(1), Tag(5), &[Bytes::from(vec![i as u8; 100])], i)
            .unwrap();
    }
    a.flush().unwrap();
    drive(
        &mut [&mut b],
        Duration::from_secs(10),
        "flushed sends",
        || got.borrow().len() == 3,
    );
    for (i, m) in got.borrow().iter().enumerate() {
        assert_eq!(m, &vec![i as u8 + 1; 100]);
    }
    assert_eq!(comp.borrow().len(), 1, "no completion without a pass");
    // One send after another, each flushed, the sender still never progressing: each must
    // leave although the one before it was in flight when it was queued.
    for i in 4..=6u64 {
        a.send(PeerId(1), Tag(5), &[Bytes::from(vec![i as u8; 100])], i)
            .unwrap();
        a.flush().unwrap();
        drive(
            &mut [&mut b],
            Duration::from_secs(10),
            "one flushed send",
            || got.borrow().len() == i as usize,
        );
    }
    for (i, m) in got.borrow().iter().enumerate() {
        assert_eq!(m, &vec![i as u8 + 1; 100]);
    }
    assert_eq!(comp.borrow().len(), 1, "no completion without a pass");
    drive(
        &mut [&mut a],
        Duration::from_secs(10),
        "completions",
        || comp.borrow().len() == 7,
    );
    common::assert_all_ok_in_order(&comp.borrow(), 7);
    // Nothing queued: a flush is a no-op, and one from inside a handler is allowed.
    a.flush().unwrap();
    a.register(Tag(6), |t, _| t.flush().unwrap()).unwrap();
    b.send(PeerId(0), Tag(6), &[], 0).unwrap();
    let seen = Rc::new(Cell::new(false));
    let s2 = seen.clone();
    b.on_complete(move |c| {
        assert!(c.result.is_ok());
        s2.set(true)
    });
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "flush in a handler",
        || seen.get(),
    );
}

/// Lazy add: `a` was never told about process 2; when 2 connects, `a`'s resolver adds it
/// (at the address 2 listens on) and accepts, and messages flow both ways. Then a
/// resolver that declines gets the refusal of old, and without a resolver as well.
fn unknown_peer_resolved_lazily(kind: BackendKind) {
    let mut a = Transport::new(common::cfg(0, kind)).unwrap();
    let mut c = Transport::new(common::cfg(2, kind)).unwrap();
    c.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    let c_addr = c.local_addr();
    let asked = Rc::new(RefCell::new(Vec::new()));
    let q = asked.clone();
    a.on_unknown_peer(move |t, peer| {
        q.borrow_mut().push(peer);
        // Inside the resolver the transport is usable, but not its progress.
        assert!(matches!(t.progress(), Err(Error::Reentrant(_))));
        t.add_peer(peer, vec![c_addr]).unwrap();
        true
    });
    let got_a = Rc::new(RefCell::new(Vec::new()));
    let g = got_a.clone();
    a.register(Tag(3), move |t, am| {
        g.borrow_mut().push(am.payload.to_vec());
        // A reply to the peer just resolved.
        t.send(am.src, Tag(4), &[Bytes::copy_from_slice(am.payload)], 0)
            .unwrap();
    })
    .unwrap();
    let got_c = Rc::new(RefCell::new(Vec::new()));
    let g = got_c.clone();
    c.register(Tag(4), move |_, am| {
        g.borrow_mut().push(am.payload.to_vec())
    })
    .unwrap();
    let fc = failures(&mut c);
    for i in 0..20u8 {
        c.send(PeerId(0), Tag(3), &[Bytes::copy_from_slice(&[i; 3])], 0)
            .unwrap();
    }
    drive(
        &mut [&mut a, &mut c],
        Duration::from_secs(20),
        "lazy add",
        || got_c.borrow().len() == 20,
    );
    let want: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 3]).collect();
    assert_eq!(*got_a.borrow(), want);
    assert_eq!(*got_c.borrow(), want);
    assert_eq!(*asked.borrow(), vec![PeerId(2)], "asked once");
    assert_eq!(a.peer_state(PeerId(2)), Some(EndpointState::Connected));
    assert_eq!(a.stats().refused, 0);
    assert!(fc.borrow().is_empty());

    // A resolver that declines: the dialer's endpoint fails, nothing is added.
    for declining in [true, false] {
        let mut d = Transport::new(common::cfg(3, kind)).unwrap();
        d.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
        let fd = failures(&mut d);
        if declining {
            let q = asked.clone();
            a.on_unknown_peer(move |_, peer| {
                q.borrow_mut().push(peer);
                false
            });
        } else {
            a.clear_unknown_peer();
        }
        let refused = a.stats().refused;
        let asked_before = asked.borrow().len();
        d.send(PeerId(0), Tag(3), &[Bytes::from_static(b"no")], 0)
            .unwrap();
        drive(
            &mut [&mut a, &mut d],
            Duration::from_secs(20),
            "refusal",
            || !fd.borrow().is_empty(),
        );
        assert_eq!(a.stats().refused, refused + 1);
        assert_eq!(a.peer_state(PeerId(3)), None);
        let asked_now = asked.borrow().len();
        assert_eq!(asked_now, asked_before + usize::from(declining));
        assert!(
            matches!(
                &fd.borrow()[0].1,
                FailReason::Protocol {
                    err: ProtoError::Rejected(RejectReason::UnknownPeer),
                    ..
                }
            ),
            "{:?}",
            fd.borrow()
        );
    }
}

/// Large messages to several peers lend their pages through pipes that the connections
/// share: sent to one peer after another, every peer's pages pass through the same pipe;
/// sent to all at once, no more pipes are made than there are peers, and every byte still
/// reaches its own peer, checked in content and order.
fn lent_pages_to_many_peers_share_pipes(kind: BackendKind) {
    const PEERS: usize = 4;
    let pat = pattern();
    // Every payload that can be lent is: none is copied for finding its peer idle, or
    // for being longer than one trip through a pipe, or because copying measured
    // cheaper on this machine.
    let cfg = |p| {
        let mut c = common::cfg(p, kind);
        c.core.splice_judged = false;
        c.core.splice_idle = None;
        c.core.splice_max = None;
        c
    };
    let mut a = Transport::new(cfg(0)).unwrap();
    let mut bs = Vec::new();
    let mut checks = Vec::new();
    let mut streams = Vec::new();
    for p in 1..=PEERS as u32 {
        let mut b = Transport::new(cfg(p)).unwrap();
        a.add_peer(PeerId(p), vec![b.local_addr()]).unwrap();
        b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
        // Every message 64 KiB..4 MiB (most of them above the 128 KiB that lends).
        checks.push(common::register_checker(
            &mut b,
            u64::from(p),
            1,
            pat.clone(),
        ));
        streams.push(Stream::new(u64::from(p), pat.clone()));
        bs.push(b);
    }
    let comp = completions(&mut a);
    let mut sent = 0u64;
    // Until every send completed and every peer checked what it was sent.
    let run = |a: &mut Transport, bs: &mut [Transport], sent: u64, each: &[u64], what: &str| {
        let mut ts: Vec<&mut Transport> = vec![a];
        ts.extend(bs.iter_mut());
        let what = format!("lent sends to {what}");
        drive(&mut ts, Duration::from_secs(120), &what, || {
            comp.borrow().len() as u64 == sent
                && checks.iter().zip(each).all(|((got, _), n)| got.get() == *n)
        });
    };
    // Peer p's next message, sent and counted.
    let send = |a: &mut Transport, p: usize, s: &mut Stream, sent: &mut u64, each: &mut [u64]| {
        let m = s.next(1);
        a.send(PeerId(p as u32 + 1), Tag(m.tag), &m.segs, *sent)
            .unwrap();
        *sent += 1;
        each[p] += 1;
    };
    let mut each = [0u64; PEERS];
    for (p, s) in streams.iter_mut().enumerate() {
        for _ in 0..2 {
            send(&mut a, p, s, &mut sent, &mut each);
        }
        run(&mut a, &mut bs, sent, &each, "one peer after another");
    }
    let st = a.stats();
    assert!(st.spliced_bytes > 0, "no page was lent: {st:?}");
    assert_eq!(
        st.lend_pipes, 1,
        "one pipe serves every peer in turn: {st:?}"
    );
    for _ in 0..3 {
        for (p, s) in streams.iter_mut().enumerate() {
            send(&mut a, p, s, &mut sent, &mut each);
        }
    }
    run(&mut a, &mut bs, sent, &each, "every peer at once");
    // Peers lending at the same time each hold a pipe, so more may have been made (and
    // made again: only two empty ones are kept); once every byte left, none is held,
    // and what stays open is at most the two spares.
    let st = a.stats();
    assert!(st.lend_pipes >= 1, "pipes made: {st:?}");
    assert!(
        (1..=2).contains(&st.lend_pipes_open),
        "pipes open after every lent byte left: {st:?}"
    );
    for c in comp.borrow().iter() {
        assert_eq!(c.result, Ok(()), "cookie {}", c.cookie);
    }
    for (got, large) in &checks {
        assert_eq!(
            (got.get(), large.get()),
            (5, 5),
            "messages checked at a peer"
        );
    }
}

/// A ping-pong of 512 KiB messages (long enough to lend) is lent both ways, each message
/// finding its peer idle on a loopback connection, which copies no idle payload: every
/// byte of every payload spliced. A stream of them sent at once is lent too; a stream of
/// 2 MiB ones (above `splice_max`) is not, but for those that find their peer idle.
/// Every payload arrives whole and in order.
fn a_large_ping_pong_and_a_large_stream_are_lent(kind: BackendKind) {
    const LEN: usize = 512 * 1024;
    const N: u32 = 8;
    // The rules, not this machine's verdict (see `lending_follows_the_measured_costs`).
    let (mut a, mut b, got) = echo_pair_with(kind, |c| c.core.splice_judged = false);
    let body = |i: u32| Bytes::from((0..LEN).map(|k| (k as u32 ^ i) as u8).collect::<Vec<u8>>());
    ping_pong(&mut a, &mut b, &got, N, body, "large pong");
    let (sa, sb) = (a.stats(), b.stats());
    for (who, st) in [("pinging", &sa), ("answering", &sb)] {
        assert_eq!(
            (st.idle_copies, st.spliced_bytes),
            (0, u64::from(N) * LEN as u64),
            "{}: {who} side: {st:?}",
            a.backend_name()
        );
    }
    // One way, all at once: lent (the pages went through a pipe).
    stream_at_once(&mut a, &mut b, Tag(9), N, body, "large stream");
    let st = a.stats();
    assert_eq!(
        (st.idle_copies, st.spliced_bytes - sa.spliced_bytes),
        (0, u64::from(N) * LEN as u64),
        "{}: the stream was not lent: {st:?}",
        a.backend_name()
    );
    // Payloads longer than one trip through the lending pipe (`splice_max`, 1 MiB by
    // default), sent all at once: copied by the kernel, each whole, but for those that
    // find their peer idle (lent): the first, and the last if the ACKs of the lent pages
    // ahead of it came before it left.
    const OVER: usize = 2 * 1024 * 1024 + 8;
    const M: u32 = 6;
    let over = |i: u32| {
        Bytes::from(
            (0..OVER)
                .map(|k| (k as u32 ^ !i) as u8)
                .collect::<Vec<u8>>(),
        )
    };
    stream_at_once(&mut a, &mut b, Tag(10), M, over, "stream of long messages");
    let after = a.stats();
    assert!(
        after.spliced_bytes - st.spliced_bytes <= 2 * OVER as u64,
        "{}: a stream's payload above splice_max was lent: {after:?}",
        a.backend_name()
    );
}

/// With the built-in choice, whether a payload is lent is measured, not assumed: each
/// side times its large send calls, and its first large messages go lent and copied in
/// turn (three of each), then follow the verdict. A ping-pong of 300,000-byte messages
/// (every one finding its peer idle, so every one lendable by the rules): each side
/// timed both ways, lent at least three messages and copied at least three, and its
/// verdict agrees with the costs it reports; every message arrives whole.
fn lending_follows_the_measured_costs(kind: BackendKind) {
    const LEN: usize = 300_000;
    const N: u32 = 24;
    const WARM: u64 = 3;
    let (mut a, mut b, got) = echo_pair(kind);
    let body = |i: u32| {
        Bytes::from(
            (0..LEN)
                .map(|k| (k as u32 ^ (i * 7)) as u8)
                .collect::<Vec<u8>>(),
        )
    };
    ping_pong(&mut a, &mut b, &got, N, body, "judged pong");
    for (who, st) in [("pinging", a.stats()), ("answering", b.stats())] {
        let ctx = format!("{}: {who} side: {st:?}", a.backend_name());
        assert!(st.lend_cost_ps > 0 && st.copy_cost_ps > 0, "{ctx}");
        assert!(st.send_calls_timed >= 3 * WARM, "{ctx}");
        let lent = st.spliced_bytes.div_ceil(LEN as u64);
        assert!(
            (WARM..=u64::from(N) - WARM).contains(&lent),
            "lent and copied in turn while warming up: {lent} lent; {ctx}"
        );
        // The judge's rule (src/reactor/lend.rs): lending holds while a lent byte costs
        // at most 6/8 of a copied one; copying holds until it costs at most 5/8 of one.
        match st.lending {
            true => assert!(st.lend_cost_ps * 8 <= st.copy_cost_ps * 6, "{ctx}"),
            false => assert!(st.lend_cost_ps * 8 > st.copy_cost_ps * 5, "{ctx}"),
        }
    }
}

/// `n` messages from `a` to `b`'s echo (`echo_pair`), one at a time, message `i` being
/// `body(i)`: each answer arrives before the next leaves (every message finds its peer
/// idle), and every answer is the message sent.
fn ping_pong(
    a: &mut Transport,
    b: &mut Transport,
    got: &RefCell<Vec<Vec<u8>>>,
    n: u32,
    body: impl Fn(u32) -> Bytes,
    what: &str,
) {
    for i in 0..n {
        a.send(PeerId(1), Tag(7), &[body(i)], u64::from(i)).unwrap();
        let want = i as usize + 1;
        drive(
            &mut [&mut *a, &mut *b],
            Duration::from_secs(20),
            what,
            || got.borrow().len() == want,
        );
    }
    for (i, p) in got.borrow().iter().enumerate() {
        assert!(p[..] == body(i as u32)[..], "{what}: answer {i} differs");
    }
}

/// Sends `n` messages `body(0..n)` from `a` to `b` on `tag` all at once, and drives both
/// until `b` has checked each (content and order) and every send completed, in order.
fn stream_at_once(
    a: &mut Transport,
    b: &mut Transport,
    tag: Tag,
    n: u32,
    body: impl Fn(u32) -> Bytes + 'static,
    what: &str,
) {
    let seen = Rc::new(Cell::new(0u32));
    let s = seen.clone();
    let body = Rc::new(body);
    let expect = body.clone();
    b.register(tag, move |_, am| {
        assert!(
            am.payload == &expect(s.get())[..],
            "{tag:?}: message {} differs",
            s.get()
        );
        s.set(s.get() + 1);
    })
    .unwrap();
    let comp = completions(a);
    for i in 0..n {
        a.send(PeerId(1), tag, &[body(i)], u64::from(i)).unwrap();
    }
    drive(&mut [a, b], Duration::from_secs(60), what, || {
        seen.get() == n && comp.borrow().len() == n as usize
    });
    common::assert_all_ok_in_order(&comp.borrow(), n as usize);
}

/// A ping-pong of 4 `len`-byte messages under BBR (chosen for loopback), `f` applied to
/// both configurations: each side's stats.
fn paced_pong(kind: BackendKind, len: usize, f: impl Fn(&mut Config)) -> [Stats; 2] {
    let bbr = ringbtl::Congestion::Use("bbr".into());
    let (mut a, mut b, got) = echo_pair_with(kind, |c| {
        c.socket.tcp_congestion = bbr.clone();
        c.core.splice_judged = false;
        f(c);
    });
    for i in 0..4u8 {
        a.send(PeerId(1), Tag(7), &[Bytes::from(vec![i; len])], 0)
            .unwrap();
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(20),
            "paced pong",
            || got.borrow().len() == usize::from(i) + 1,
        );
    }
    assert!(got.borrow().iter().all(|p| p.len() == len), "{len} B pongs");
    [a.stats(), b.stats()]
}

/// On loopback connections whose congestion control paces (BBR, chosen here), idle
/// payloads are lent like elsewhere on loopback (those up to 512 KiB are copied only
/// towards other hosts): 384 KiB and 768 KiB ping-pongs lent both ways, every byte
/// spliced; no socket is set to acknowledge at once. [`common::skip`]ped where the kernel
/// has no `bbr`.
fn paced_loopback_connections_lend_idle_payloads(kind: BackendKind) {
    if !common::have_bbr() {
        return;
    }
    for len in [384 * 1024, 768 * 1024] {
        let stats = paced_pong(kind, len, |_| {});
        for (who, st) in ["pinging", "answering"].iter().zip(stats) {
            assert_eq!(
                (st.idle_copies, st.spliced_bytes, st.quick_acks),
                (0, 4 * len as u64, 0),
                "{kind:?}: {len} B, {who} side: {st:?}"
            );
        }
    }
}

/// With quick ACKs on (`SocketConfig::paced_quick_ack`): on a paced connection a 768 KiB
/// ping-pong's messages are copied (up to `splice_idle`, 1 MiB), and after each has left
/// its sender's socket is set to acknowledge the answer at once (`TCP_QUICKACK`): 4 on
/// each side. Skipped where the kernel has no `bbr`.
fn paced_quick_ack_copies_idle_payloads_and_acks_the_answers(kind: BackendKind) {
    if !common::have_bbr() {
        return;
    }
    let stats = paced_pong(kind, 768 * 1024, |c| c.socket.paced_quick_ack = true);
    for (who, st) in ["pinging", "answering"].iter().zip(stats) {
        assert!(
            st.idle_copies == 4 && st.spliced_bytes == 0 && st.quick_acks == 4,
            "{kind:?}: {who} side: {st:?}"
        );
    }
}
