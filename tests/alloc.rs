//! Steady state allocates nothing per message: a counting global allocator over 10,000
//! ping-pongs of 8 B and of 64 KiB, once per compiled backend.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use ringbtl::{BackendKind, PeerId, Tag};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards to the system allocator; only counts calls made on a thread that
// enabled counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

backend_tests!(no_allocation_per_message);

fn no_allocation_per_message(kind: BackendKind) {
    for size in [8usize, 64 * 1024] {
        let (mut a, mut b) = common::pair(kind);
        let payload = Bytes::from(vec![5u8; size]);
        let reply = payload.clone();
        b.register(Tag(1), move |t, am| {
            t.send(am.src, Tag(2), std::slice::from_ref(&reply), 0)
                .unwrap();
        })
        .unwrap();
        let got = Rc::new(Cell::new(0u64));
        let g = got.clone();
        a.register(Tag(2), move |_, _| g.set(g.get() + 1)).unwrap();
        let done = Rc::new(Cell::new(0u64));
        let d = done.clone();
        a.on_complete(move |c| {
            assert!(c.result.is_ok());
            d.set(d.get() + 1);
        });
        let mut round = |n: u64| {
            for _ in 0..n {
                let want = got.get() + 1;
                a.send(PeerId(1), Tag(1), std::slice::from_ref(&payload), 0)
                    .unwrap();
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while got.get() < want {
                    a.progress().unwrap();
                    b.progress().unwrap();
                    assert!(std::time::Instant::now() < deadline, "ping-pong stalled");
                }
            }
        };
        round(1_000); // warm-up: connections, pools and queues reach their sizes
        ALLOCS.store(0, Ordering::Relaxed);
        COUNTING.with(|c| c.set(true));
        round(10_000);
        COUNTING.with(|c| c.set(false));
        let n = ALLOCS.load(Ordering::Relaxed);
        println!(
            "backend {}: {size} B: {n} allocations in 10,000 ping-pongs",
            a.backend_name()
        );
        assert_eq!(n, 0, "{size} B ping-pong allocated {n} times once warm");
    }
}
