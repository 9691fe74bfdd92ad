//! Dials the dialer gave up on before reading our ACCEPT: its HELLO waited in our accept
//! queue past its handshake deadline (a rank that starts late, or is not scheduled, on
//! an oversubscribed node). The acceptor adopts such a connection, but holds its frames
//! until the dialer's first bytes; when the connection ends first, that is a failed
//! handshake, not a lost peer: nothing is failed, nothing is lost, the pair connects again.

use super::*;

/// Node 0's ACCEPT, alone, is what `got` holds.
fn only_accept(got: &[u8]) -> bool {
    got.len() == HELLO_LEN && Hello::parse(got).is_ok_and(|h| h.kind == HelloKind::Accept)
}

#[test]
fn dial_abandoned_before_the_accept_is_not_a_lost_peer() {
    for seed in 0..30 {
        let ctx = format!("seed {seed}");
        let mut net = Net::pair(seed);
        // Process 1's dial reaches node 0, proves the key, and node 0 adopts it and answers.
        let r = net.raw_dial(0);
        net.raw_join(r, 1);
        net.run(false);
        assert_eq!(
            net.core(0).state(PeerId(1)),
            Some(EndpointState::Connected),
            "{ctx}"
        );
        // A message for process 1 waits for the dialer's first bytes: only the ACCEPT
        // went out on the connection.
        let payload = b"after the abandoned dial".to_vec();
        net.send(0, 1, 3, payload.clone()).unwrap();
        net.run(false);
        let got = net.raw_read(r);
        assert!(only_accept(&got), "{ctx}: {got:?}");
        assert_eq!(net.core(0).pending(PeerId(1)), 1, "{ctx}");
        // The dialer had given up on that dial: it closes without a byte more.
        net.raw_close(r);
        net.drive();
        assert!(
            net.failed_events(0).is_empty(),
            "{ctx}: {:?}",
            net.failed_events(0)
        );
        assert_eq!(net.core(0).counters().abandoned_handshakes, 1, "{ctx}");
        // The message reached process 1 on the next connection, once.
        assert_eq!(net.received(1, 0), vec![(3, payload)], "{ctx}");
        assert!(net.completions(0).values().all(Result::is_ok), "{ctx}");
        assert_eq!(
            net.core(0).state(PeerId(1)),
            Some(EndpointState::Connected),
            "{ctx}"
        );
        net.send(1, 0, 4, b"and back".to_vec()).unwrap();
        net.drive();
        assert_eq!(net.received(0, 1), vec![(4, b"and back".to_vec())], "{ctx}");
        assert!(net.failed_events(1).is_empty(), "{ctx}");
    }
}

#[test]
fn held_frames_leave_with_the_dialers_first_bytes() {
    let mut net = Net::pair(7);
    let r = net.raw_dial(0);
    net.raw_join(r, 1);
    net.run(false);
    net.send(0, 1, 3, b"held".to_vec()).unwrap();
    net.run(false);
    let got = net.raw_read(r);
    assert!(only_accept(&got), "{got:?}");
    // The dialer took the connection: its first frame releases ours.
    net.raw_write(r, &frame(FrameKind::Send, 5, b"hi"));
    net.drive();
    assert_eq!(net.raw_read(r), frame(FrameKind::Send, 3, b"held"));
    assert!(net.completions(0).values().all(Result::is_ok));
    assert_eq!(net.core(0).counters().abandoned_handshakes, 0);
    assert!(net.failed_events(0).is_empty());
}
