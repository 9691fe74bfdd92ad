//! Steady state allocates nothing per message: a counting global allocator over 10,000
//! ping-pongs of 8 B and of 64 KiB, and over 2,000 rounds of register, put, message,
//! deregister (Open MPI's put pipeline), once per compiled backend.

mod common;

use std::cell::Cell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use ringbtl::{BackendKind, PeerId, PutTarget, Tag};

#[path = "common/count_alloc.rs"]
mod count_alloc;

backend_tests!(no_allocation_per_message, no_allocation_per_put);

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
        let n = count_alloc::allocations_during(|| round(10_000));
        println!(
            "backend {}: {size} B: {n} allocations in 10,000 ping-pongs",
            a.backend_name()
        );
        assert_eq!(n, 0, "{size} B ping-pong allocated {n} times once warm");
    }
}

/// As Open MPI's put pipeline does for each fragment: the receiver registers its buffer,
/// the sender puts 256 KiB into it and sends a message, the receiver deregisters on that
/// message. Once warm, none of it allocates (region slots are reused; the data goes
/// straight into the region).
fn no_allocation_per_put(kind: BackendKind) {
    const LEN: usize = 256 << 10;
    let (mut a, mut b) = common::pair(kind);
    let mut region = vec![0u8; LEN].into_boxed_slice();
    let base = NonNull::new(region.as_mut_ptr()).unwrap();
    let payload = Bytes::from(vec![9u8; LEN]);
    let got = Rc::new(Cell::new(0u64));
    let g = got.clone();
    b.register(Tag(3), move |_, _| g.set(g.get() + 1)).unwrap();
    let mut round = |n: u64| {
        for _ in 0..n {
            // SAFETY: `region` outlives both transports and is not touched by this test
            // until the key is deregistered below.
            #[allow(unsafe_code)]
            let key = unsafe { b.register_region(base, LEN, ringbtl::RegionAccess::Write) };
            let target = PutTarget {
                key,
                addr: base.as_ptr() as u64,
            };
            a.put(PeerId(1), target, std::slice::from_ref(&payload), 0)
                .unwrap();
            a.send(PeerId(1), Tag(3), &[Bytes::from_static(b"f")], 1)
                .unwrap();
            let want = got.get() + 1;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while got.get() < want {
                a.progress().unwrap();
                b.progress().unwrap();
                assert!(std::time::Instant::now() < deadline, "put round stalled");
            }
            b.deregister_region(key).unwrap();
        }
    };
    round(200);
    let n = count_alloc::allocations_during(|| round(2_000));
    println!(
        "backend {}: {n} allocations in 2,000 put rounds of 256 KiB",
        a.backend_name()
    );
    assert_eq!(n, 0, "put rounds allocated {n} times once warm");
    assert_eq!(b.stats().puts_placed, 2_200);
    assert!(region.iter().all(|&x| x == 9));
    drop((a, b));
}
