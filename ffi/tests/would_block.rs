//! `ringbtl_send` to a peer that stopped reading: past `RINGBTL_MAX_QUEUED_BYTES` it
//! returns `RINGBTL_ERR_WOULD_BLOCK` (the send is not accepted: no completion), and once
//! the peer reads again every accepted send completes once and arrives, on each backend.

mod support;

use std::cell::Cell;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use ringbtl_ffi::*;

const TAG: u8 = 3;
const SIZE: usize = 32 * 1024;
/// Bytes offered before giving up on meeting a full queue (far above what loopback socket
/// buffers hold).
const OFFER_MAX: usize = 512 << 20;

#[derive(Default)]
struct Counts {
    received: Cell<u64>,
    completed: Cell<u64>,
    failed: Cell<u64>,
}

unsafe extern "C" fn on_recv(ctx: *mut c_void, _src: u32, _tag: u8, _d: *const c_void, len: usize) {
    // SAFETY: `ctx` is the `Counts` registered with this callback, alive for the test.
    let c = unsafe { &*(ctx as *const Counts) };
    assert_eq!(len, SIZE);
    c.received.set(c.received.get() + 1);
}

unsafe extern "C" fn on_complete(ctx: *mut c_void, _peer: u32, _cookie: u64, status: i32) {
    // SAFETY: as above.
    let c = unsafe { &*(ctx as *const Counts) };
    if status == RINGBTL_OK {
        c.completed.set(c.completed.get() + 1);
    } else {
        c.failed.set(c.failed.get() + 1);
    }
}

#[test]
fn send_to_a_peer_that_stops_reading_would_block() {
    for b in support::backends() {
        stop_reading(b);
    }
}

fn stop_reading(backend: &str) {
    let settings = [
        ("RINGBTL_BACKEND", backend),
        ("RINGBTL_MAX_QUEUED_BYTES", "65536"),
    ];
    let a = support::create_with(0, &settings).expect("create a");
    let b = support::create_with(1, &settings).expect("create b");
    let (ca, cb) = (Box::new(Counts::default()), Box::new(Counts::default()));
    let payload = vec![0x5au8; SIZE];
    let iov = RingbtlIov {
        base: payload.as_ptr().cast(),
        len: payload.len(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    // SAFETY: live handles; the callbacks' contexts and `payload` outlive the transports
    // (destroyed below); URI strings are read during the calls.
    unsafe {
        assert_eq!(ringbtl_add_peer(a, 1, ringbtl_uris(b)), RINGBTL_OK);
        assert_eq!(ringbtl_add_peer(b, 0, ringbtl_uris(a)), RINGBTL_OK);
        let (pa, pb) = (
            &*ca as *const Counts as *mut c_void,
            &*cb as *const Counts as *mut c_void,
        );
        assert_eq!(ringbtl_register(b, TAG, Some(on_recv), pb), RINGBTL_OK);
        ringbtl_on_complete(a, Some(on_complete), pa);
        // Connected, with one message.
        assert_eq!(ringbtl_send(a, 1, TAG, &iov, 1, 0), RINGBTL_OK);
        while ca.completed.get() < 1 {
            assert!(ringbtl_progress(a) >= 0 && ringbtl_progress(b) >= 0);
            assert!(Instant::now() < deadline, "{backend}: no connection");
        }
        // b stops reading: a's sends fill the socket buffers, then its queue.
        let mut accepted = 1u64;
        let mut offered = 0;
        let blocked = loop {
            assert!(offered < OFFER_MAX, "{backend}: never would-block");
            offered += SIZE;
            match ringbtl_send(a, 1, TAG, &iov, 1, accepted) {
                RINGBTL_OK => accepted += 1,
                RINGBTL_ERR_WOULD_BLOCK => break true,
                rc => panic!("{backend}: ringbtl_send: {rc}: {}", support::last_error()),
            }
            assert!(ringbtl_progress(a) >= 0);
        };
        assert!(blocked);
        assert!(
            support::last_error().contains("RINGBTL_MAX_QUEUED_BYTES"),
            "{}",
            support::last_error()
        );
        // Still refused while nothing drains; nothing was accepted by the refusals.
        assert_eq!(
            ringbtl_send(a, 1, TAG, &iov, 1, u64::MAX),
            RINGBTL_ERR_WOULD_BLOCK
        );
        assert_eq!(ringbtl_pending(a, 1) as u64, accepted - ca.completed.get());
        // b reads again: every accepted send arrives and completes once.
        while cb.received.get() < accepted || ca.completed.get() < accepted {
            assert!(ringbtl_progress(a) >= 0 && ringbtl_progress(b) >= 0);
            assert!(
                Instant::now() < deadline,
                "{backend}: stalled after reading again"
            );
        }
        assert_eq!(ringbtl_send(a, 1, TAG, &iov, 1, accepted), RINGBTL_OK);
        while ca.completed.get() < accepted + 1 {
            assert!(ringbtl_progress(a) >= 0 && ringbtl_progress(b) >= 0);
            assert!(Instant::now() < deadline, "{backend}: last send");
        }
        assert_eq!(ringbtl_destroy(a, 1000), RINGBTL_OK);
        assert_eq!(ringbtl_destroy(b, 1000), RINGBTL_OK);
    }
    assert_eq!(ca.failed.get(), 0);
    println!(
        "{backend}: {} sends accepted before would-block",
        ca.completed.get() - 1
    );
}
