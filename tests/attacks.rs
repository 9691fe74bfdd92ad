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
//! This binary counts the largest allocation of a thread (its own global allocator).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::net::TcpStream;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
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

/// A peer announces a frame of the maximum size (64 MiB), sends what small socket buffers
/// take of it and stops (its process no longer makes progress). The receiver commits
/// memory only for the bytes that arrived (its largest allocation stays far below the
/// announced length), and fails the connection with a clear cause once no byte came for
/// `frame_stall` (the exact deadline is checked by the engine's tests).
fn huge_header_then_stall(kind: BackendKind) {
    const STALL: Duration = Duration::from_millis(500);
    let small = |c: &mut Config| {
        c.socket.sndbuf = Some(128 * 1024);
        c.socket.rcvbuf = Some(128 * 1024);
        c.core.frame_stall = STALL;
    };
    let (addr_tx, addr_rx) = mpsc::channel();
    let (b_addr_tx, b_addr_rx) = mpsc::channel();
    let (stalled_tx, stalled_rx) = mpsc::channel::<()>();
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let multishot = common::multishot();
    // The attacker: a transport in its own thread that stops making progress mid-frame.
    let attacker = std::thread::spawn(move || {
        common::set_multishot(multishot);
        let mut c = common::cfg(0, kind);
        small(&mut c);
        let mut a = Transport::new(c).unwrap();
        addr_tx.send(a.local_addr()).unwrap();
        a.add_peer(PeerId(1), vec![b_addr_rx.recv().unwrap()])
            .unwrap();
        let max = a.config().core.max_frame as usize;
        let huge = Bytes::from(vec![0x33u8; max]);
        a.send(PeerId(1), Tag(1), &[huge], 1).unwrap();
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            a.progress().unwrap();
        }
        stalled_tx.send(()).unwrap();
        // No progress from here on: the rest of the frame never leaves.
        let _ = end_rx.recv_timeout(Duration::from_secs(60));
        drop(a);
    });
    let mut c = common::cfg(1, kind);
    small(&mut c);
    let mut b = Transport::new(c).unwrap();
    b_addr_tx.send(b.local_addr()).unwrap();
    b.add_peer(PeerId(0), vec![addr_rx.recv().unwrap()])
        .unwrap();
    let delivered = Rc::new(Cell::new(0u32));
    let d = delivered.clone();
    b.register(Tag(1), move |_, _| d.set(d.get() + 1)).unwrap();
    let fb = failures(&mut b);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stopped = None;
    let largest = largest_allocation_during(|| {
        while fb.borrow().is_empty() {
            assert!(Instant::now() < deadline, "the stalled frame never failed");
            b.progress().unwrap();
            if stopped.is_none() && stalled_rx.try_recv().is_ok() {
                stopped = Some(Instant::now());
            }
        }
    });
    let stopped = stopped.expect("failed before the attacker stopped sending");
    let took = stopped.elapsed();
    end_tx.send(()).unwrap();
    attacker.join().unwrap();
    eprintln!(
        "{kind:?}: stalled 64 MiB frame failed after {took:?}; largest allocation {largest} B"
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
        largest <= 8 << 20,
        "{largest} bytes allocated at once for a frame that brought a few MiB at most"
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
