//! Pair tests: protocol errors and garbage after the handshake.

use super::*;

// ----- 8. protocol errors after connect ------------------------------------------------------

#[test]
fn bad_frame_after_connect_fails_the_endpoint() {
    let bad: [(&str, Vec<u8>); 4] = [
        ("too long", {
            let mut h = frame(FrameKind::Send, 1, &[]);
            h[4..8].copy_from_slice(&((1u32 << 20) + 1).to_be_bytes());
            h
        }),
        ("unknown kind", {
            let mut h = frame(FrameKind::Send, 1, &[]);
            h[0] = 0x7f;
            h
        }),
        ("flags", {
            let mut h = frame(FrameKind::Send, 1, &[]);
            h[2] = 1;
            h
        }),
        (
            "hello after handshake",
            Hello::new(HelloKind::Hello, PeerId(1)).to_bytes().to_vec(),
        ),
    ];
    for (what, bytes) in bad {
        for seed in 0..30 {
            let mut net = Net::pair(seed);
            let r = raw_peer(&mut net, 1);
            // The raw peer never drains its socket: the first batch stays in flight.
            net.knobs.stall = Some(0);
            for _ in 0..1 + net.rng.below(6) {
                net.send_random(0, 1).unwrap();
            }
            let k = net.rng.below(6);
            net.steps(k);
            for _ in 0..1 + net.rng.below(4) {
                net.send_random(0, 1).unwrap();
            }
            net.pump(0);
            net.raw_write(r, &frame(FrameKind::Send, 9, b"fine"));
            net.raw_write(r, &bytes);
            net.drive();
            let ctx = format!("{what}, seed {seed}");
            assert_eq!(net.received(0, 1), vec![(9, b"fine".to_vec())], "{ctx}");
            let failed = net.failed_events(0);
            assert_eq!(failed.len(), 1, "{ctx}");
            assert!(
                matches!(
                    &failed[0].1,
                    FailReason::Protocol {
                        peer: PeerId(1),
                        err: ProtoError::Wire(_)
                    }
                ),
                "{ctx}: {failed:?}"
            );
            let done = net.completions(0);
            assert!(
                done.values().all(|r| *r == Err(failed[0].1.clone())),
                "{ctx}: every pending send fails with the endpoint's reason"
            );
            assert!(net.raw_eof(r), "{ctx}");
            assert!(net.nodes[0].keys.is_empty(), "{ctx}");
            assert_eq!(
                net.send(0, 1, 0, vec![]),
                Err(SendError::Unreachable(PeerId(1)))
            );
        }
    }
}

/// After a valid handshake, the raw peer writes `garbage` in random pieces. Nothing may
/// panic; every send completes once; at most one PeerFailed.
fn garbage_after_handshake(seed: u64, garbage: &[u8], valid_first: bool) {
    let mut c0 = cfg(0);
    c0.recv_cache = 256;
    c0.max_frame = 4096;
    let mut net = Net::new(seed, vec![c0, cfg(1)]);
    let r = raw_peer(&mut net, 1);
    for _ in 0..net.rng.below(5) {
        let len = net.rng.below(3000);
        let p = net.rng.bytes(len);
        net.send(0, 1, 2, p).unwrap();
    }
    if valid_first {
        net.raw_write(r, &frame(FrameKind::Send, 3, &[7; 1000]));
    }
    let mut at = 0;
    while at < garbage.len() {
        let n = 1 + net.rng.below(garbage.len() - at);
        net.raw_write(r, &garbage[at..at + n]);
        at += n;
        let k = net.rng.below(20);
        net.steps(k);
    }
    if net.rng.chance(1, 2) {
        net.raw_close(r);
    }
    net.drive();
    net.completions(0);
    assert!(net.failed_events(0).len() <= 1);
    if net.core(0).state(PeerId(1)) == Some(EndpointState::Failed) {
        assert_eq!(net.core(0).pending(PeerId(1)), 0);
        assert_eq!(net.failed_events(0).len(), 1);
    }
    for (_, _, p) in &net.nodes[0].got {
        assert!(p.len() <= 4096);
    }
}

#[test]
fn garbage_after_handshake_never_panics_seeded() {
    for seed in 0..300 {
        let mut rng = Rng::new(seed);
        let len = rng.below(600);
        let mut g = rng.bytes(len);
        // Often make it look almost right: valid kinds, small lengths.
        if seed.is_multiple_of(2) {
            for i in (0..g.len()).step_by(8) {
                g[i] = [1, 4, 1, 0x7f][rng.below(4)];
                if i + 7 < g.len() {
                    g[i + 2] = 0;
                    g[i + 3] = 0;
                    g[i + 4] = 0;
                    g[i + 5] = 0;
                    g[i + 6] = (rng.below(32)) as u8;
                }
            }
        }
        garbage_after_handshake(seed, &g, seed.is_multiple_of(3));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn garbage_after_handshake_never_panics(
        garbage in proptest::collection::vec(any::<u8>(), 0..400),
        seed in any::<u64>(),
        valid_first in any::<bool>(),
    ) {
        garbage_after_handshake(seed, &garbage, valid_first);
    }

    #[test]
    fn garbage_as_handshake_never_panics(
        garbage in proptest::collection::vec(any::<u8>(), 0..100),
        seed in any::<u64>(),
    ) {
        let mut net = Net::pair(seed);
        let r = net.raw_dial(0);
        net.raw_write(r, &garbage);
        net.drive();
        // Whatever it was, it did not become a connection, and it is gone.
        prop_assert!(net.raw_eof(r));
        prop_assert!(net.nodes[0].keys.is_empty());
        prop_assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        let wrong = garbage.len() >= 8 && garbage[..8] != crate::wire::MAGIC;
        if wrong && garbage.len() >= HELLO_LEN {
            prop_assert_eq!(net.core(0).counters().bad_magic, 1);
        }
    }
}
