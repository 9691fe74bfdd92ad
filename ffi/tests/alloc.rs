//! The C ABI's hot path allocates nothing once warm: a counting global allocator over
//! 10,000 ping-pongs of 8 B and of 64 KiB driven only through the exported functions
//! (`ringbtl_send` from the caller and from inside the receive callback,
//! `ringbtl_flush` after each send, `ringbtl_progress`, the receive and completion
//! callbacks), once per backend.

mod support;

use std::cell::Cell;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use ringbtl_ffi::*;

#[path = "../../tests/common/count_alloc.rs"]
mod count_alloc;

const PING: u8 = 1;
const PONG: u8 = 2;

/// What the callbacks of one side see (`ctx`).
struct Side {
    /// The transport the callbacks send on.
    t: Cell<*mut Ringbtl>,
    /// The reply sent from inside the receive callback (stays valid until its completion:
    /// for the whole test).
    reply: Vec<u8>,
    received: Cell<u64>,
    completed: Cell<u64>,
    failed: Cell<u64>,
}

impl Side {
    fn new(reply_len: usize) -> Box<Self> {
        Box::new(Self {
            t: Cell::new(std::ptr::null_mut()),
            reply: vec![9; reply_len],
            received: Cell::new(0),
            completed: Cell::new(0),
            failed: Cell::new(0),
        })
    }
}

/// B's receive callback: answers every ping from inside the callback.
unsafe extern "C" fn on_ping(
    ctx: *mut c_void,
    src: u32,
    _tag: u8,
    data: *const c_void,
    len: usize,
) {
    // SAFETY: `ctx` is the `Side` registered with this callback, alive for the test.
    let s = unsafe { &*(ctx as *const Side) };
    s.received.set(s.received.get() + 1);
    // SAFETY: `data` points to `len` bytes valid during the call.
    let payload = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    assert!(payload.iter().all(|&b| b == 5), "ping payload");
    let iov = RingbtlIov {
        base: s.reply.as_ptr().cast(),
        len: s.reply.len(),
    };
    // SAFETY: a live handle; the reply buffer outlives its completion.
    let r = unsafe { ringbtl_send(s.t.get(), src, PONG, &iov, 1, 7) };
    assert_eq!(r, RINGBTL_OK, "reply from the callback");
}

/// A's receive callback: counts pongs.
unsafe extern "C" fn on_pong(
    ctx: *mut c_void,
    _src: u32,
    _tag: u8,
    _data: *const c_void,
    len: usize,
) {
    // SAFETY: as above.
    let s = unsafe { &*(ctx as *const Side) };
    assert_eq!(len, s.reply.len());
    s.received.set(s.received.get() + 1);
}

unsafe extern "C" fn on_complete(ctx: *mut c_void, _peer: u32, _cookie: u64, status: i32) {
    // SAFETY: as above.
    let s = unsafe { &*(ctx as *const Side) };
    if status == RINGBTL_OK {
        s.completed.set(s.completed.get() + 1);
    } else {
        s.failed.set(s.failed.get() + 1);
    }
}

#[test]
fn c_abi_hot_path_allocates_nothing_once_warm() {
    for backend in support::backends() {
        for size in [8usize, 64 * 1024] {
            ping_pong(backend, size);
        }
    }
}

fn ping_pong(backend: &str, size: usize) {
    let a = support::create(0, backend).expect("create a");
    let b = support::create(1, backend).expect("create b");
    let sa = Side::new(size);
    let sb = Side::new(size);
    sa.t.set(a);
    sb.t.set(b);
    let payload = vec![5u8; size];
    // SAFETY: live handles; the callbacks' contexts (`sa`, `sb`) outlive the transports
    // (destroyed below); URI strings are read during the calls.
    unsafe {
        assert_eq!(ringbtl_add_peer(a, 1, ringbtl_uris(b)), RINGBTL_OK);
        assert_eq!(ringbtl_add_peer(b, 0, ringbtl_uris(a)), RINGBTL_OK);
        let (pa, pb) = (
            &*sa as *const Side as *mut c_void,
            &*sb as *const Side as *mut c_void,
        );
        assert_eq!(ringbtl_register(b, PING, Some(on_ping), pb), RINGBTL_OK);
        assert_eq!(ringbtl_register(a, PONG, Some(on_pong), pa), RINGBTL_OK);
        ringbtl_on_complete(a, Some(on_complete), pa);
        ringbtl_on_complete(b, Some(on_complete), pb);
    }
    let iov = RingbtlIov {
        base: payload.as_ptr().cast(),
        len: payload.len(),
    };
    let mut cookie = 0u64;
    let mut round = |n: u64| {
        for _ in 0..n {
            let want = sa.received.get() + 1;
            cookie += 1;
            // SAFETY: live handles; `payload` outlives every completion.
            unsafe {
                assert_eq!(ringbtl_send(a, 1, PING, &iov, 1, cookie), RINGBTL_OK);
                assert_eq!(ringbtl_flush(a), RINGBTL_OK);
                let deadline = Instant::now() + Duration::from_secs(10);
                while sa.received.get() < want {
                    assert!(ringbtl_progress(a) >= 0);
                    assert!(ringbtl_progress(b) >= 0);
                    assert!(Instant::now() < deadline, "ping-pong stalled");
                }
            }
        }
    };
    round(1_000); // warm-up: connections, pools, queues and the completion queue grow
    let n = count_alloc::allocations_during(|| round(10_000));
    println!("backend {backend}: {size} B: {n} allocations in 10,000 ping-pongs through the C ABI");
    assert_eq!(sb.received.get(), 11_000, "every ping arrived");
    assert!(
        sa.completed.get() >= 10_000 && sb.completed.get() >= 10_000,
        "completions ran"
    );
    assert_eq!((sa.failed.get(), sb.failed.get()), (0, 0));
    // SAFETY: live handles, destroyed once; no callback runs.
    unsafe {
        assert_eq!(ringbtl_destroy(a, 1000), RINGBTL_OK);
        assert_eq!(ringbtl_destroy(b, 1000), RINGBTL_OK);
    }
    assert_eq!(sa.completed.get(), 11_000, "every ping completed once");
    assert_eq!(sb.completed.get(), 11_000, "every pong completed once");
    assert_eq!(
        n, 0,
        "{size} B ping-pong through the C ABI allocated {n} times once warm"
    );
}
