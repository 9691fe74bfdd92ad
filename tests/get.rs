//! One-sided gets between two transports on loopback, per backend and receive mode: the
//! bytes of the peer's readable region land in ours, each get completes once, after its
//! data is in place; a get the peer may not answer fails the connection without a byte
//! written; a destination outside our regions is refused before anything is sent; the
//! requester's limit and the peer's bound on what gets may pin hold.

mod common;

use std::cell::Cell;
use std::ptr::NonNull;
use std::time::Duration;

use bytes::Bytes;
use common::{completions, drive, failures, pair, pair_with};
use ringbtl::{
    BackendKind, FailReason, PeerId, ProtoError, PutTarget, RegionAccess, RegionError, SendError,
    Tag, Transport, WireError,
};

backend_tests!(
    gets_bring_the_peers_bytes_in_order,
    a_get_the_peer_may_not_answer_fails_the_connection,
    a_get_into_memory_not_ours_is_refused,
    a_put_into_a_region_peers_may_not_write_fails,
    the_requesters_limit_and_the_peers_bound_hold,
);

/// A region of `len` bytes of `fill(i)` registered on `t` with `access` (boxed: the
/// memory does not move).
fn region(
    t: &mut Transport,
    len: usize,
    access: RegionAccess,
    fill: impl Fn(usize) -> u8,
) -> (Box<[u8]>, u64) {
    let mut mem: Box<[u8]> = (0..len).map(fill).collect();
    let base = NonNull::new(mem.as_mut_ptr()).expect("boxed slice");
    // SAFETY: every test keeps `mem` alive until after the transports are dropped, and
    // reads it only after the gets into it completed (or the connection failed).
    #[allow(unsafe_code)]
    let key = unsafe { t.register_region(base, len, access) };
    (mem, key)
}

fn pattern(i: usize) -> u8 {
    (i * 7 + i / 4093) as u8
}

/// Gets of 0 B to 3 MiB + 5 from `b`'s readable region into `a`'s local region, at
/// offsets that are not aligned, mixed with messages both ways: every get completes once
/// and in order with the sends, after which the bytes are in place; the rest of `a`'s
/// region is untouched; `b` answered each one, and its region can be taken back.
fn gets_bring_the_peers_bytes_in_order(kind: BackendKind) {
    const LEN: usize = 8 << 20;
    let (mut a, mut b) = pair(kind);
    let (src, src_key) = region(&mut b, LEN, RegionAccess::Read, pattern);
    let (dst, dst_key) = region(&mut a, LEN, RegionAccess::Local, |_| 0);
    let (src_base, dst_base) = (src.as_ptr() as u64, dst.as_ptr() as u64);
    // (source offset, destination offset, length)
    let gets = [
        (0usize, 0usize, 0usize),
        (5, 3, 1),
        (100, 1000, 1000),
        (70_001, 2000, 200_000),
        (1 << 20, 300_000, (3 << 20) + 5),
        (LEN - 10, LEN - 10, 10),
    ];
    let mut model = vec![0u8; LEN];
    let comp = completions(&mut a);
    let got = Cell::new(0);
    b.register(Tag(3), move |_, _| {}).unwrap();
    let mut cookie = 0;
    for &(from, to, n) in &gets {
        model[to..to + n].copy_from_slice(&src[from..from + n]);
        let (f, t) = (
            PutTarget {
                key: src_key,
                addr: src_base + from as u64,
            },
            PutTarget {
                key: dst_key,
                addr: dst_base + to as u64,
            },
        );
        a.get(PeerId(1), f, n as u32, t, cookie).unwrap();
        cookie += 1;
        a.send(PeerId(1), Tag(3), &[Bytes::from_static(b"m")], cookie)
            .unwrap();
        cookie += 1;
    }
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(30),
        "gets and messages",
        || comp.borrow().len() == cookie as usize,
    );
    got.set(comp.borrow().len());
    let c = comp.borrow();
    assert!(c.iter().all(|c| c.result.is_ok()), "{c:?}");
    // Sends complete in order among themselves, gets among themselves.
    for parity in [0, 1] {
        let seq: Vec<u64> = c
            .iter()
            .map(|c| c.cookie)
            .filter(|k| k % 2 == parity)
            .collect();
        let want: Vec<u64> = (0..cookie).filter(|k| k % 2 == parity).collect();
        assert_eq!(seq, want, "completions of parity {parity}");
    }
    let first_diff = dst.iter().zip(&model).position(|(x, y)| x != y);
    assert_eq!(first_diff, None, "a's region after the gets");
    assert_eq!(a.stats().gets_completed, gets.len() as u64);
    assert_eq!(b.stats().gets_answered, gets.len() as u64);
    // Every reply is written (at the latest after a few passes): the region comes back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.deregister_region(src_key) == Err(RegionError::InUse(src_key)) {
        assert!(
            std::time::Instant::now() < deadline,
            "b's region still in use after 10 s"
        );
        a.progress().unwrap();
        b.progress().unwrap();
    }
    a.deregister_region(dst_key).unwrap();
    assert_eq!(got.get(), cookie as usize);
    drop((a, b));
    drop((src, dst));
}

/// A get past the end of the peer's region, one of a region peers may only write, and one
/// for a key that names no region: the peer fails the connection with a protocol error
/// that says why, our get fails once, and our region keeps every byte.
fn a_get_the_peer_may_not_answer_fails_the_connection(kind: BackendKind) {
    for case in 0..3 {
        let (mut a, mut b) = pair(kind);
        let access = if case == 1 {
            RegionAccess::Write
        } else {
            RegionAccess::ReadWrite
        };
        let (src, src_key) = region(&mut b, 4096, access, pattern);
        let (dst, dst_key) = region(&mut a, 4096, RegionAccess::Local, |_| 0);
        let from = match case {
            0 => PutTarget {
                key: src_key,
                addr: src.as_ptr() as u64 + 4000,
            },
            1 => PutTarget {
                key: src_key,
                addr: src.as_ptr() as u64,
            },
            _ => PutTarget {
                key: src_key + (7 << 32),
                addr: src.as_ptr() as u64,
            },
        };
        let to = PutTarget {
            key: dst_key,
            addr: dst.as_ptr() as u64,
        };
        let fails = failures(&mut b);
        let comp = completions(&mut a);
        a.send(PeerId(1), Tag(2), &[Bytes::from_static(b"x")], 0)
            .unwrap();
        a.get(PeerId(1), from, 200, to, 1).unwrap();
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(10),
            "protocol error",
            || !fails.borrow().is_empty() && comp.borrow().len() == 2,
        );
        let f = fails.borrow();
        assert_eq!(f.len(), 1, "case {case}: {f:?}");
        let why = match case {
            0 => RegionError::OutOfBounds {
                key: src_key,
                addr: from.addr,
                len: 200,
            },
            1 => RegionError::NotReadable(src_key),
            _ => RegionError::UnknownKey(from.key),
        };
        assert!(
            matches!(
                &f[0].1,
                FailReason::Protocol { err: ProtoError::GetOutsideRegions(e), .. } if *e == why
            ),
            "case {case}: {:?}",
            f[0]
        );
        let c = comp.borrow();
        let get: Vec<_> = c.iter().filter(|c| c.cookie == 1).collect();
        assert_eq!(get.len(), 1, "case {case}: the get completes once: {c:?}");
        assert!(get[0].result.is_err(), "case {case}: {:?}", get[0]);
        assert!(
            dst.iter().all(|&x| x == 0),
            "case {case}: a byte was written"
        );
        drop((a, b));
        drop((src, dst));
    }
}

/// A destination past the end of our region, or in no region: refused at once, nothing
/// sent (the peer answers no get, and a message sent after it arrives alone).
fn a_get_into_memory_not_ours_is_refused(kind: BackendKind) {
    let (mut a, mut b) = pair(kind);
    let (src, src_key) = region(&mut b, 4096, RegionAccess::Read, pattern);
    let (dst, dst_key) = region(&mut a, 4096, RegionAccess::Local, |_| 0);
    let from = PutTarget {
        key: src_key,
        addr: src.as_ptr() as u64,
    };
    for (to, why) in [
        (
            PutTarget {
                key: dst_key,
                addr: dst.as_ptr() as u64 + 4000,
            },
            RegionError::OutOfBounds {
                key: dst_key,
                addr: dst.as_ptr() as u64 + 4000,
                len: 200,
            },
        ),
        (
            PutTarget {
                key: dst_key ^ (3 << 32),
                addr: dst.as_ptr() as u64,
            },
            RegionError::UnknownKey(dst_key ^ (3 << 32)),
        ),
    ] {
        assert_eq!(
            a.get(PeerId(1), from, 200, to, 9),
            Err(SendError::Region(why))
        );
    }
    let seen = std::rc::Rc::new(Cell::new(0));
    let s = seen.clone();
    b.register(Tag(2), move |_, _| s.set(s.get() + 1)).unwrap();
    let comp = completions(&mut a);
    a.send(PeerId(1), Tag(2), &[Bytes::from_static(b"after")], 1)
        .unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "message",
        || seen.get() == 1 && !comp.borrow().is_empty(),
    );
    assert_eq!(b.stats().gets_answered, 0);
    let c = comp.borrow();
    assert!(
        c.len() == 1 && c[0].cookie == 1 && c[0].result.is_ok(),
        "{c:?}"
    );
    drop(c);
    drop((a, b));
    drop((src, dst));
}

/// A put into a region registered for our own gets only (or for peers' reads only) is a
/// protocol error, as a put outside every region: no byte lands.
fn a_put_into_a_region_peers_may_not_write_fails(kind: BackendKind) {
    for access in [RegionAccess::Local, RegionAccess::Read] {
        let (mut a, mut b) = pair(kind);
        let (mem, key) = region(&mut b, 4096, access, |_| 0);
        let fails = failures(&mut b);
        let target = PutTarget {
            key,
            addr: mem.as_ptr() as u64,
        };
        a.put(PeerId(1), target, &[Bytes::from(vec![0xEE; 100])], 0)
            .unwrap();
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(10),
            "protocol error",
            || !fails.borrow().is_empty(),
        );
        assert!(
            matches!(
                &fails.borrow()[0].1,
                FailReason::Protocol {
                    err: ProtoError::Wire(WireError::PutOutsideRegions { len: 100, .. }),
                    ..
                }
            ),
            "{access:?}: {:?}",
            fails.borrow()
        );
        assert!(
            mem.iter().all(|&x| x == 0),
            "{access:?}: a byte was written"
        );
        drop((a, b));
        drop(mem);
    }
}

/// The requester takes one get of any size, and more only while they ask for at most
/// `RINGBTL_MAX_QUEUED_BYTES` together (then `WouldBlock`, until one completes). A
/// requester that asks for more than that (its own limit set higher) and does not read
/// the replies meets the peer's bound: the peer fails the connection (`TooManyGets`),
/// and every get of the requester fails once.
fn the_requesters_limit_and_the_peers_bound_hold(kind: BackendKind) {
    const GET: usize = 200_000;
    // Both with a limit of 1 MiB: the sixth get of 200,000 bytes waits.
    {
        let (mut a, mut b) = pair_with(kind, |c| c.core.max_queued_bytes = 1 << 20);
        let (src, src_key) = region(&mut b, GET, RegionAccess::Read, pattern);
        let (dst, dst_key) = region(&mut a, GET, RegionAccess::Local, |_| 0);
        let from = PutTarget {
            key: src_key,
            addr: src.as_ptr() as u64,
        };
        let to = PutTarget {
            key: dst_key,
            addr: dst.as_ptr() as u64,
        };
        let comp = completions(&mut a);
        for k in 0..5 {
            a.get(PeerId(1), from, GET as u32, to, k).unwrap();
        }
        assert_eq!(
            a.get(PeerId(1), from, GET as u32, to, 5),
            Err(SendError::WouldBlock(PeerId(1)))
        );
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(10),
            "first get",
            || !comp.borrow().is_empty(),
        );
        a.get(PeerId(1), from, GET as u32, to, 5).unwrap();
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(10),
            "gets",
            || comp.borrow().len() == 6,
        );
        assert!(comp.borrow().iter().all(|c| c.result.is_ok()));
        assert_eq!(&dst[..], &src[..]);
        drop((a, b));
        drop((src, dst));
    }
    // The requester's limit 256 MiB, the peer's 64 KiB with frames of at most 256 KiB:
    // the peer's bound is 4 x (64 KiB + 256 KiB). The requester asks for 200 gets of
    // 200,000 bytes (40 MB) and is not driven while the peer answers.
    let side = Cell::new(0);
    let (mut a, mut b) = pair_with(kind, |c| {
        if side.replace(side.get() + 1) == 1 {
            c.core.max_queued_bytes = 64 << 10;
            c.core.max_frame = 256 << 10;
        }
    });
    let (src, src_key) = region(&mut b, GET, RegionAccess::Read, pattern);
    let (dst, dst_key) = region(&mut a, GET, RegionAccess::Local, |_| 0);
    let from = PutTarget {
        key: src_key,
        addr: src.as_ptr() as u64,
    };
    let to = PutTarget {
        key: dst_key,
        addr: dst.as_ptr() as u64,
    };
    let fails = failures(&mut b);
    let comp = completions(&mut a);
    // Connected first (the handshake needs both sides driven).
    a.send(PeerId(1), Tag(2), &[Bytes::from_static(b"x")], 1000)
        .unwrap();
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "connect",
        || comp.borrow().len() == 1,
    );
    const GETS: u64 = 200;
    for k in 0..GETS {
        a.get(PeerId(1), from, GET as u32, to, k).unwrap();
    }
    a.flush().unwrap();
    drive(
        &mut [&mut b],
        Duration::from_secs(20),
        "the peer's bound",
        || !fails.borrow().is_empty(),
    );
    assert!(
        matches!(
            &fails.borrow()[0].1,
            FailReason::Protocol {
                err: ProtoError::TooManyGets,
                ..
            }
        ),
        "{:?}",
        fails.borrow()
    );
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(20),
        "every get ends",
        || comp.borrow().len() as u64 == 1 + GETS,
    );
    let c = comp.borrow();
    let done: Vec<u64> = c
        .iter()
        .filter(|c| c.cookie < GETS)
        .map(|c| c.cookie)
        .collect();
    let mut sorted = done.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), GETS as usize, "each get completes once");
    assert!(
        c.iter().any(|c| c.cookie < GETS && c.result.is_err()),
        "some gets fail with the connection"
    );
    drop(c);
    drop((a, b));
    drop((src, dst));
}
