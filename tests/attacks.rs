//! Attacks on admission and memory through the public API, once per compiled backend:
//!
//! - a half-open flood: 1,024 idle connections from loopback (and more arriving) while a
//!   legitimate peer connects: it gets in and its messages flow;
//! - a huge header followed by a stall: the header announces the maximum frame and the
//!   payload stops; the receiver's memory stays bounded and the connection fails after
//!   the frame-stall deadline;
//! - a peer that stops reading: `send` returns would-block past the queue cap, and once
//!   the peer reads again nothing is lost.
//!
//! This binary counts the largest allocation of a thread (its own global allocator). The
//! same half-open flood against a process held to 1,024 descriptors, which needs a job
//! process of its own, is `descriptors.rs`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::net::TcpStream;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{completions, drive, failures, pair_with};
use ringbtl::proto::core::EndpointState;
use ringbtl::{BackendKind, Cause, Config, FailReason, PeerId, SendError, Tag, Transport};

backend_tests!(
    half_open_flood_while_a_peer_connects,
    huge_header_then_stall,
    peer_that_stops_reading,
);

/// 1,024 idle connections from loopback hold the acceptor's half-open slots (its default
/// `max_half_open`), and 256 more arrive while a peer (also from loopback) dials it: the
/// oldest strangers make room, the peer gets in and 100 messages flow both ways; the idle
/// connections are closed at the first-bytes deadline.
fn half_open_flood_while_a_peer_connects(kind: BackendKind) {
    const FLOOD: usize = 1024;
    let (mut a, mut b) = pair_with(kind, |c: &mut Config| {
        c.core.first_bytes_timeout = Duration::from_secs(2);
    });
    let addr = b.local_addr();
    let mut flood: Vec<TcpStream> = Vec::with_capacity(FLOOD + 256);
    for _ in 0..FLOOD {
        flood.push(TcpStream::connect(addr).expect("flood connection"));
        if flood.len().is_multiple_of(64) {
            b.progress().unwrap();
        }
    }
    // Every flooding connection is accepted: past the per-source limit (all come from
    // 127.0.0.1), each newcomer closed the oldest of them.
    let per_source = b.config().core.max_half_open_per_source as u64;
    let want = (FLOOD as u64).saturating_sub(per_source);
    let deadline = Instant::now() + Duration::from_secs(20);
    while b.stats().accept_overload < want {
        assert!(Instant::now() < deadline, "flood not accepted");
        b.progress().unwrap();
    }
    let got = Rc::new(Cell::new(0u32));
    let g = got.clone();
    b.register(Tag(1), move |t, m| {
        g.set(g.get() + 1);
        t.send(m.src, Tag(2), &[Bytes::copy_from_slice(m.payload)], 0)
            .unwrap();
    })
    .unwrap();
    let back = Rc::new(Cell::new(0u32));
    let k = back.clone();
    a.register(Tag(2), move |_, _| k.set(k.get() + 1)).unwrap();
    let fa = failures(&mut a);
    for i in 0..100u64 {
        a.send(PeerId(1), Tag(1), &[Bytes::from(vec![i as u8; 100])], i)
            .unwrap();
    }
    // More strangers keep arriving while the peer connects.
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(30);
    while back.get() < 100 {
        assert!(
            Instant::now() < deadline,
            "the peer did not get through the flood: {} of 100 delivered, failures {:?}",
            got.get(),
            fa.borrow()
        );
        if flood.len() < FLOOD + 256 {
            flood.push(TcpStream::connect(addr).expect("flood connection"));
        }
        a.progress().unwrap();
        b.progress().unwrap();
    }
    eprintln!(
        "{kind:?}: through a flood of {} idle connections in {:?}; {} strangers evicted",
        flood.len(),
        t0.elapsed(),
        b.stats().accept_overload
    );
    assert!(fa.borrow().is_empty(), "{:?}", fa.borrow());
    assert_eq!(a.peer_state(PeerId(1)), Some(EndpointState::Connected));
    // The idle connections are closed by the first-bytes deadline: each sees EOF or a
    // reset while the acceptor makes progress.
    for s in &flood {
        s.set_nonblocking(true).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut open: Vec<&TcpStream> = flood.iter().collect();
    while !open.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} idle connections outlived the first-bytes deadline",
            open.len()
        );
        b.progress().unwrap();
        open.retain(|s| {
            let mut s: &TcpStream = s;
            matches!(
                std::io::Read::read(&mut s, &mut [0u8; 1]),
                Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock
            )
        });
    }
}

/// A peer announces a frame of the maximum size (64 MiB), sends 3 MiB of it and stops
/// (its socket stays open, no byte follows). The peer is a hand-made dialer that passes
/// the handshake, so the amount that arrives is exact whatever the machine's speed. The
/// receiver commits memory only for the bytes that arrived (its largest allocation stays
/// within twice of them, far below the announced length), and fails the connection with a
/// clear cause once no byte came for `frame_stall` (the exact deadline is checked by the
/// engine's tests).
fn huge_header_then_stall(kind: BackendKind) {
    use ringbtl::wire::{FrameKind, Header};
    use std::io::{ErrorKind, Write};
    const STALL: Duration = Duration::from_millis(500);
    const SENT: usize = 3 << 20;
    let mut c = common::cfg(1, kind);
    c.socket.rcvbuf = Some(128 * 1024);
    c.core.frame_stall = STALL;
    let mut b = Transport::new(c).unwrap();
    let max = b.config().core.max_frame;
    // Peer 0 is known (it never needs to be dialed: it dials first).
    b.add_peer(PeerId(0), vec!["127.0.0.1:9".parse().unwrap()])
        .unwrap();
    let delivered = Rc::new(Cell::new(0u32));
    let d = delivered.clone();
    b.register(Tag(1), move |_, _| d.set(d.get() + 1)).unwrap();
    let fb = failures(&mut b);
    let mut s = TcpStream::connect(b.local_addr()).unwrap();
    let ans = common::raw_handshake(
        &mut s,
        &mut [&mut b],
        PeerId(0),
        PeerId(1),
        &ringbtl::auth::PUBLIC_KEY,
    );
    assert!(
        ans.is_some_and(|a| a.kind == ringbtl::wire::HelloKind::Accept),
        "the hand-made dialer was not accepted: {ans:?}"
    );
    let hdr = Header {
        kind: FrameKind::Send,
        tag: Tag(1),
        len: max,
        ack: false,
        line: 0,
    };
    let mut out = hdr.to_bytes().to_vec();
    out.extend(std::iter::repeat_n(0x33u8, SENT));
    s.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stopped = None;
    let mut written = 0;
    let largest = largest_allocation_during(|| {
        while fb.borrow().is_empty() {
            assert!(Instant::now() < deadline, "the stalled frame never failed");
            if written < out.len() {
                match s.write(&out[written..]) {
                    Ok(n) => written += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("writing the frame: {e}"),
                }
                if written == out.len() {
                    stopped = Some(Instant::now());
                }
            }
            b.progress().unwrap();
        }
    });
    let stopped = stopped.expect("failed before the attacker stopped sending");
    let took = stopped.elapsed();
    eprintln!(
        "{kind:?}: a 64 MiB frame stalled after {SENT} B failed after {took:?}; largest allocation {largest} B"
    );
    assert_eq!(delivered.get(), 0);
    let f = fb.borrow();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        matches!(
            &f[0],
            (PeerId(0), FailReason::ConnectionLost { cause: Cause::FrameStalled(d), .. })
                if *d == STALL
        ),
        "{f:?}"
    );
    // The deadline counts from the last byte read, at most when the attacker stopped.
    assert!(
        took <= STALL + Duration::from_secs(2),
        "failed {took:?} after the attacker stopped (deadline {STALL:?})"
    );
    assert!(
        largest <= 2 * SENT,
        "{largest} bytes allocated at once for a frame that brought {SENT} B"
    );
}

/// The receiver stops reading (no progress): past `max_queued_bytes`, `send` returns
/// would-block and the message is not accepted; once the receiver reads again, every
/// accepted message arrives in order and completes once.
fn peer_that_stops_reading(kind: BackendKind) {
    const SIZE: usize = 256 * 1024;
    let (mut a, mut b) = pair_with(kind, |c: &mut Config| {
        c.core.max_queued_bytes = 4 << 20;
    });
    let got: Rc<RefCell<Vec<u8>>> = Rc::default();
    let g = got.clone();
    b.register(Tag(1), move |_, m| {
        assert_eq!(m.payload.len(), SIZE);
        g.borrow_mut().push(m.payload[0]);
    })
    .unwrap();
    let ca = completions(&mut a);
    a.send(PeerId(1), Tag(1), &[Bytes::from(vec![0u8; SIZE])], 0)
        .unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "connect",
        || ca.borrow().len() == 1,
    );
    // b makes no progress: a's sends fill the socket buffers, then its queue.
    let mut accepted = 1u64;
    let refused = loop {
        assert!(accepted < 2048, "never would-block (512 MiB offered)");
        let p = Bytes::from(vec![accepted as u8; SIZE]);
        match a.send(PeerId(1), Tag(1), &[p], accepted) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        a.progress().unwrap();
    };
    assert_eq!(refused, SendError::WouldBlock(PeerId(1)));
    assert_eq!(
        a.pending(PeerId(1)) as u64,
        accepted - ca.borrow().len() as u64
    );
    // b reads again.
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(30),
        "after reading again",
        || ca.borrow().len() as u64 == accepted && got.borrow().len() as u64 == accepted,
    );
    let want: Vec<u8> = (0..accepted).map(|i| i as u8).collect();
    assert_eq!(
        *got.borrow(),
        want,
        "every accepted message, in order, once"
    );
    let mut cookies: Vec<u64> = ca.borrow().iter().map(|c| c.cookie).collect();
    assert!(ca.borrow().iter().all(|c| c.result.is_ok()));
    cookies.sort_unstable();
    assert_eq!(
        cookies,
        (0..accepted).collect::<Vec<_>>(),
        "the refused send never completes"
    );
    a.send(
        PeerId(1),
        Tag(1),
        &[Bytes::from(vec![0xee; SIZE])],
        accepted,
    )
    .unwrap();
}

// ----- the largest allocation of a thread ----------------------------------------------

struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
}

fn note(size: usize) {
    if WATCHING.with(|w| w.get()) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only notes sizes asked on a watching thread.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Largest = Largest;

/// Runs `f` and returns the largest allocation (or reallocation) this thread asked for
/// meanwhile.
fn largest_allocation_during(f: impl FnOnce()) -> usize {
    LARGEST.store(0, Ordering::Relaxed);
    WATCHING.with(|w| w.set(true));
    f();
    WATCHING.with(|w| w.set(false));
    LARGEST.load(Ordering::Relaxed)
}
