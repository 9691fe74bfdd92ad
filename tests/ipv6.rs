//! The data path over IPv6, on the loopback `[::1]`, once per backend and receive mode: a
//! checked stream both ways, puts, and the wire-up (`tcp://[::1]:port` URIs, the
//! authenticated handshake, the route to a peer that publishes both families). Each test
//! is skipped, saying so, where the machine has no IPv6 loopback.

mod common;

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::ipv6::{established, proc_addr};
use common::{completions, drive, pattern, PATTERN_LEN};
use ringbtl::auth::JobKey;
use ringbtl::proto::core::EndpointState;
use ringbtl::wireup::parse_uri_list;
use ringbtl::{BackendKind, Config, PeerId, PutTarget, Tag, Transport};

backend_tests!(
    stream_checked_both_ways,
    puts_land_in_the_region,
    wireup_publishes_and_dials_ipv6,
);

/// Sizes of the stream's messages, none a power of two: small ones, some around the
/// 64 KiB receive cache, some above the 128 KiB from which a payload is lent, and a few
/// MiB (read straight into their own buffer).
const SIZES: [usize; 12] = [
    1, 7, 100, 1_000, 4_099, 65_000, 65_537, 100_003, 300_007, 1_000_001, 3_000_017, 4_999_999,
];
/// Times the stream goes through [`SIZES`].
const ROUNDS: usize = 3;

/// The body of message `seq` in direction `dir`: a slice of the shared pattern.
fn body(dir: usize, seq: usize, pat: &Bytes) -> Bytes {
    let len = SIZES[seq % SIZES.len()];
    let off = (seq * 4099 + dir * 7919) % (PATTERN_LEN - len);
    pat.slice(off..off + len)
}

/// `b` cut in three segments (sent as iovecs).
fn segments(b: &Bytes) -> [Bytes; 3] {
    let (x, y) = (b.len() / 3, b.len() * 2 / 3);
    [b.slice(..x), b.slice(x..y), b.slice(y..)]
}

/// [`ROUNDS`] times [`SIZES`] each way at once over `[::1]`, all queued before the first
/// progress: every message arrives whole, checked byte by byte, in order, and every send
/// completes once, in order. Both sides lent pages of the payloads above 128 KiB, and
/// with multishot receive the large payloads were read straight into their buffers.
fn stream_checked_both_ways(kind: BackendKind) {
    if !common::ipv6::usable() {
        return;
    }
    let (mut a, mut b) = common::ipv6::pair(kind);
    let pat = pattern();
    let n = SIZES.len() * ROUNDS;
    // Direction 0 is a to b, 1 is b to a; each receiver checks its direction.
    let mut seen = Vec::new();
    for (t, dir) in [(&mut b, 0usize), (&mut a, 1usize)] {
        let count = Rc::new(Cell::new(0usize));
        let (c, pat) = (count.clone(), pat.clone());
        t.register(Tag(3), move |_, am| {
            let seq = c.get();
            let want = body(dir, seq, &pat);
            assert!(
                am.payload == &want[..],
                "direction {dir}: message {seq} ({} bytes) arrived as {} different bytes",
                want.len(),
                am.payload.len()
            );
            c.set(seq + 1);
        })
        .unwrap();
        seen.push(count);
    }
    let (ca, cb) = (completions(&mut a), completions(&mut b));
    for seq in 0..n {
        let cookie = seq as u64;
        a.send(PeerId(1), Tag(3), &segments(&body(0, seq, &pat)), cookie)
            .unwrap();
        b.send(PeerId(0), Tag(3), &segments(&body(1, seq, &pat)), cookie)
            .unwrap();
    }
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(120),
        "stream over IPv6",
        || seen.iter().all(|s| s.get() == n) && ca.borrow().len() == n && cb.borrow().len() == n,
    );
    common::assert_all_ok_in_order(&ca.borrow(), n);
    common::assert_all_ok_in_order(&cb.borrow(), n);
    for (who, t) in [("a", &a), ("b", &b)] {
        let st = t.stats();
        assert!(st.spliced_bytes > 0, "{kind:?}: {who} lent no page: {st:?}");
        if common::multishot() && kind == BackendKind::Uring && t.backend_note().is_none() {
            assert!(
                st.recv_direct >= ROUNDS as u64,
                "{kind:?}: {who} received few large payloads directly: {st:?}"
            );
        }
    }
}

/// Puts of 1,000 B to 3 MB (none a power of two, in one to three segments) into a region
/// `b` registered, over `[::1]`, each followed by a message: at each message the region
/// holds exactly the bytes of the puts before it; every put and send completes once, in
/// order.
fn puts_land_in_the_region(kind: BackendKind) {
    if !common::ipv6::usable() {
        return;
    }
    const LEN: usize = 4_000_037;
    let (mut a, mut b) = common::ipv6::pair(kind);
    let mut mem = vec![0u8; LEN].into_boxed_slice();
    let base = NonNull::new(mem.as_mut_ptr()).expect("boxed slice");
    // SAFETY: `mem` outlives both transports (dropped last, below) and is read only from
    // the handler of the message that follows each put, when no put into it is left.
    #[allow(unsafe_code)]
    let key = unsafe { b.register_region(base, LEN, ringbtl::RegionAccess::Write) };
    // (offset, length, segments)
    let puts = [
        (3usize, 1_000usize, 1usize),
        (70_001, 65_537, 2),
        (900_001, 3_000_017, 3),
        (LEN - 7, 7, 1),
    ];
    let seen = Rc::new(RefCell::new(Vec::new()));
    {
        let (seen, region) = (seen.clone(), base.as_ptr() as usize);
        b.register(Tag(2), move |_, am| {
            // SAFETY: the region outlives the transports; the puts before this message
            // were placed before it was delivered, and none after it has started.
            #[allow(unsafe_code)]
            let now = unsafe { std::slice::from_raw_parts(region as *const u8, LEN) };
            seen.borrow_mut().push((am.payload[0], now.to_vec()));
        })
        .unwrap();
    }
    let comp = completions(&mut a);
    let mut model = vec![0u8; LEN];
    let mut expect = Vec::new();
    let mut cookie = 0u64;
    for (i, &(off, n, nsegs)) in puts.iter().enumerate() {
        let data: Vec<u8> = (0..n).map(|j| (i * 131 + j * 7 + j / 4093) as u8).collect();
        model[off..off + n].copy_from_slice(&data);
        let data = Bytes::from(data);
        let cut = n / nsegs;
        let segs: Vec<Bytes> = (0..nsegs)
            .map(|s| data.slice(s * cut..if s + 1 == nsegs { n } else { (s + 1) * cut }))
            .collect();
        let target = PutTarget {
            key,
            addr: base.as_ptr() as u64 + off as u64,
        };
        a.put(PeerId(1), target, &segs, cookie).unwrap();
        a.send(PeerId(1), Tag(2), &[Bytes::from(vec![i as u8])], cookie + 1)
            .unwrap();
        cookie += 2;
        expect.push((i as u8, model.clone()));
    }
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(60),
        "puts over IPv6",
        || seen.borrow().len() == puts.len() && comp.borrow().len() == cookie as usize,
    );
    common::assert_all_ok_in_order(&comp.borrow(), cookie as usize);
    for ((i, got), (j, want)) in seen.borrow().iter().zip(&expect) {
        assert_eq!(i, j, "messages in order");
        let first_diff = got.iter().zip(want).position(|(x, y)| x != y);
        assert_eq!(
            first_diff, None,
            "{kind:?}: region at the message after put {i}"
        );
    }
    assert_eq!(b.stats().puts_placed, puts.len() as u64);
    b.deregister_region(key).unwrap();
    drop((a, b));
    drop(mem);
}

/// A configuration with interface selection restricted to `list`
/// (`RINGBTL_LISTEN=auto`, `RINGBTL_IF_INCLUDE=list`).
fn selecting(pid: u32, kind: BackendKind, list: &str) -> Config {
    let mut c = common::cfg(pid, kind);
    c.wireup.listen = None;
    c.wireup.if_include = list.split(',').map(|m| m.parse().unwrap()).collect();
    c
}

/// Wire-up over IPv6. Transports restricted to `::1/128` listen there and publish exactly
/// `tcp://[::1]:port`; a transport on `lo` publishes both families on one port. With a
/// job key, the first (0) adds the others by their URIs and pings each with five sizes;
/// they answer from their handlers: every answer arrives intact, every handshake passed
/// authentication, and the connections are IPv6 in the kernel's table (both ends on the
/// peers' `[::1]` ports), none IPv4, although peer 2 also listens on `127.0.0.1`: from
/// IPv6 only, its IPv4 address is no route.
fn wireup_publishes_and_dials_ipv6(kind: BackendKind) {
    if !common::ipv6::usable() {
        return;
    }
    let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let mut a = Transport::new(selecting(0, kind, "::1/128")).unwrap();
    let mut b = Transport::new(selecting(1, kind, "::1/128")).unwrap();
    for t in [&a, &b] {
        let port = t.local_addr().port();
        assert_eq!(t.local_addr(), SocketAddr::new(lo6, port));
        assert_eq!(t.uris(), format!("tcp://[::1]:{port}"));
        let ifs = t.interfaces().unwrap();
        assert!(ifs.iter().all(|i| i.addr == lo6), "{ifs:?}");
    }
    let mut c = Transport::new(selecting(2, kind, "lo")).unwrap();
    let pc = c.local_addr().port();
    let mut published = parse_uri_list(&c.uris()).unwrap();
    published.sort();
    let v4c = SocketAddr::from(([127, 0, 0, 1], pc));
    let v6c = SocketAddr::new(lo6, pc);
    assert_eq!(published, [v4c, v6c], "{}", c.uris());

    let key = JobKey::from_bytes([0x36; 32]);
    for t in [&mut a, &mut b, &mut c] {
        t.set_job_key(key.clone());
    }
    a.add_peer_uris(PeerId(1), &b.uris()).unwrap();
    a.add_peer_uris(PeerId(2), &c.uris()).unwrap();
    b.add_peer_uris(PeerId(0), &a.uris()).unwrap();
    c.add_peer_uris(PeerId(0), &a.uris()).unwrap();
    for t in [&mut b, &mut c] {
        t.register(Tag(7), |t, am| {
            let echo = Bytes::copy_from_slice(am.payload);
            t.send(am.src, Tag(8), &[echo], 0).unwrap();
        })
        .unwrap();
    }
    let answers = Rc::new(RefCell::new(Vec::new()));
    let got = answers.clone();
    a.register(Tag(8), move |_, am| {
        got.borrow_mut().push((am.src, am.payload.to_vec()))
    })
    .unwrap();
    let pings: Vec<Bytes> = [1usize, 999, 65_001, 300_007, 2_000_003]
        .iter()
        .map(|&n| Bytes::from((0..n).map(|j| (j * 13 + n) as u8).collect::<Vec<u8>>()))
        .collect();
    for p in &pings {
        for peer in [PeerId(1), PeerId(2)] {
            a.send(peer, Tag(7), std::slice::from_ref(p), 0).unwrap();
        }
    }
    let want = 2 * pings.len();
    drive(
        &mut [&mut a, &mut b, &mut c],
        Duration::from_secs(30),
        "answers over IPv6",
        || answers.borrow().len() == want,
    );
    let answers = answers.borrow();
    for peer in [PeerId(1), PeerId(2)] {
        let from: Vec<&Vec<u8>> = answers
            .iter()
            .filter(|(src, _)| *src == peer)
            .map(|(_, p)| p)
            .collect();
        assert_eq!(from.len(), pings.len(), "{peer}'s answers");
        for (p, q) in pings.iter().zip(from) {
            assert!(
                p[..] == q[..],
                "{peer}: the answer of {} bytes differs",
                p.len()
            );
        }
        assert_eq!(a.peer_state(peer), Some(EndpointState::Connected));
    }
    for (who, t) in [("0", &a), ("1", &b), ("2", &c)] {
        assert!(t.authenticated(), "{who} runs unauthenticated");
        assert_eq!(t.stats().auth_failed, 0, "{who}");
    }
    // Each connection, both its ends, on the listening peer's [::1] port.
    let b6 = b.local_addr();
    assert!(established(b6) >= 2, "no IPv6 connection to {b6}");
    assert!(established(v6c) >= 2, "no IPv6 connection to {v6c}");
    assert_eq!(established(v4c), 0, "an IPv4 connection to {v4c}");
}

#[test]
fn proc_net_tcp_addresses_parse() {
    let (v4, v6) = if cfg!(target_endian = "little") {
        ("0100007F:1F90", "00000000000000000000000001000000:0050")
    } else {
        ("7F000001:1F90", "00000000000000000000000000000001:0050")
    };
    assert_eq!(proc_addr(v4), Some("127.0.0.1:8080".parse().unwrap()));
    assert_eq!(proc_addr(v6), Some("[::1]:80".parse().unwrap()));
    assert_eq!(proc_addr("0100007F"), None);
    assert_eq!(proc_addr("01007F:1F90"), None);
}
