//! Steady state allocates nothing per message: a counting global allocator over 10,000
//! ping-pongs of 8 B and of 64 KiB, once per compiled backend.

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use ringbtl::{BackendKind, PeerId, Tag};

#[path = "common/count_alloc.rs"]
mod count_alloc;

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
        let n = count_alloc::allocations_during(|| round(10_000));
        println!(
            "backend {}: {size} B: {n} allocations in 10,000 ping-pongs",
            a.backend_name()
        );
        assert_eq!(n, 0, "{size} B ping-pong allocated {n} times once warm");
    }
}
