//! One-sided puts between two transports on loopback, per backend and receive mode: the
//! data lands in the receiver's registered region before the message sent after it, and a
//! put outside every region fails the connection without writing a byte.

mod common;

use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::{completions, drive, failures, pair};
use ringbtl::{BackendKind, FailReason, PeerId, ProtoError, PutTarget, Tag, WireError};

backend_tests!(
    puts_land_before_the_next_message,
    put_outside_the_region_fails_the_connection
);

/// A region of `len` zero bytes registered on `t` (boxed: the memory does not move).
fn register(t: &mut ringbtl::Transport, len: usize) -> (Box<[u8]>, u64) {
    let mut mem = vec![0u8; len].into_boxed_slice();
    let base = NonNull::new(mem.as_mut_ptr()).expect("boxed slice");
    // SAFETY: every test keeps `mem` alive until after the transport is dropped, and reads
    // it only after the message that follows the puts arrived (no put into it is left).
    #[allow(unsafe_code)]
    let key = unsafe { t.register_region(base, len, ringbtl::RegionAccess::Write) };
    (mem, key)
}

fn data(seed: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|j| (seed * 131 + j * 7 + j / 4096) as u8)
        .collect()
}

/// Puts of 0 B to 3 MiB (in one segment and in several), mixed with messages: each put's
/// bytes are in the region, at its address, when the message sent after it arrives; the
/// rest of the region is untouched; every put completes once, in order with the sends.
fn puts_land_before_the_next_message(kind: BackendKind) {
    const LEN: usize = 8 << 20;
    let (mut a, mut b) = pair(kind);
    let (mem, key) = register(&mut b, LEN);
    let base = mem.as_ptr() as u64;
    // (offset, length, segments)
    let puts = [
        (0usize, 0usize, 1usize),
        (5, 1, 1),
        (100, 1000, 3),
        (70_000, 200_000, 1),
        (1 << 20, (3 << 20) + 5, 4),
        (LEN - 10, 10, 1),
    ];
    let mut model = vec![0u8; LEN];
    // What b's handler saw of the region at each message: equal to the model then?
    let seen = Rc::new(RefCell::new(Vec::new()));
    {
        let (seen, region) = (seen.clone(), mem.as_ptr() as usize);
        b.register(Tag(2), move |_, am| {
            let i = am.payload[0] as usize;
            // SAFETY: the region outlives the transports; no put into it is in progress
            // while a message is being delivered on the one connection.
            #[allow(unsafe_code)]
            let now = unsafe { std::slice::from_raw_parts(region as *const u8, LEN) };
            seen.borrow_mut().push((i, now.to_vec()));
        })
        .unwrap();
    }
    let comp = completions(&mut a);
    let mut expect = Vec::new();
    let mut cookie = 0;
    for (i, &(off, n, nsegs)) in puts.iter().enumerate() {
        let d = data(i, n);
        model[off..off + n].copy_from_slice(&d);
        let cut = n / nsegs;
        let segs: Vec<Bytes> = (0..nsegs)
            .map(|s| {
                let end = if s + 1 == nsegs { n } else { (s + 1) * cut };
                Bytes::copy_from_slice(&d[s * cut..end])
            })
            .collect();
        let target = PutTarget {
            key,
            addr: base + off as u64,
        };
        a.put(PeerId(1), target, &segs, cookie).unwrap();
        cookie += 1;
        a.send(PeerId(1), Tag(2), &[Bytes::from(vec![i as u8])], cookie)
            .unwrap();
        cookie += 1;
        expect.push((i, model.clone()));
    }
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(30),
        "puts and messages",
        || seen.borrow().len() == puts.len() && comp.borrow().len() == cookie as usize,
    );
    common::assert_all_ok_in_order(&comp.borrow(), cookie as usize);
    let seen = seen.borrow();
    for ((i, got), (j, want)) in seen.iter().zip(&expect) {
        assert_eq!(i, j);
        let first_diff = got.iter().zip(want).position(|(x, y)| x != y);
        assert_eq!(first_diff, None, "region after put {i}");
    }
    assert_eq!(b.stats().puts_placed, puts.len() as u64);
    assert_eq!(b.stats().unknown_tag, 0);
    b.deregister_region(key).unwrap();
    drop((a, b));
    drop(mem);
}

/// A put that would write past the end of the region, one for a key that names no
/// region, and one for a deregistered region: the receiver fails the connection with a
/// protocol error naming the target, the region keeps every byte, and the sender's put
/// does not complete as delivered anywhere but the kernel.
fn put_outside_the_region_fails_the_connection(kind: BackendKind) {
    for case in 0..3 {
        let (mut a, mut b) = pair(kind);
        let (mem, key) = register(&mut b, 4096);
        let base = mem.as_ptr() as u64;
        let target = match case {
            0 => PutTarget {
                key,
                addr: base + 4000,
            },
            1 => PutTarget {
                key: key + (7 << 32),
                addr: base,
            },
            _ => {
                b.deregister_region(key).unwrap();
                PutTarget { key, addr: base }
            }
        };
        let fails = failures(&mut b);
        let got = Rc::new(RefCell::new(0));
        let g = got.clone();
        b.register(Tag(2), move |_, _| *g.borrow_mut() += 1)
            .unwrap();
        // A message first, so that the connection is up and the put is no handshake error.
        a.send(PeerId(1), Tag(2), &[Bytes::from_static(b"x")], 0)
            .unwrap();
        a.put(PeerId(1), target, &[Bytes::from(vec![0xEE; 200])], 1)
            .unwrap();
        a.send(PeerId(1), Tag(2), &[Bytes::from_static(b"y")], 2)
            .unwrap();
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(10),
            "protocol error",
            || !fails.borrow().is_empty(),
        );
        let f = fails.borrow();
        assert_eq!(f.len(), 1, "case {case}: {f:?}");
        assert!(
            matches!(
                &f[0].1,
                FailReason::Protocol {
                    err: ProtoError::Wire(WireError::PutOutsideRegions { key: k, addr, len: 200 }),
                    ..
                } if *k == target.key && *addr == target.addr
            ),
            "case {case}: {:?}",
            f[0]
        );
        assert_eq!(
            *got.borrow(),
            1,
            "case {case}: only the message before the put"
        );
        assert!(
            mem.iter().all(|&x| x == 0),
            "case {case}: a byte was written"
        );
        drop((a, b));
        drop(mem);
    }
}
