//! Lazy add of peers: a dialer that proved the job key and claims a process id the
//! engine was never told about waits for the driver's answer (`resolve_unknown`) when the
//! engine asks about unknown peers, and is refused at once otherwise.

use super::*;
use crate::proto::core::MAX_PEERS;

/// The one `UnknownPeer` event node `n` raised, for `peer`.
fn unknown_event(net: &Net, n: usize, peer: u32) -> ConnKey {
    let asked: Vec<ConnKey> = net.nodes[n]
        .events
        .iter()
        .filter_map(|e| match e {
            CoreEvent::UnknownPeer { conn, peer: p } if *p == PeerId(peer) => Some(*conn),
            _ => None,
        })
        .collect();
    assert_eq!(
        asked.len(),
        1,
        "seed {}: events {:?}",
        net.seed,
        net.nodes[n].events
    );
    asked[0]
}

#[test]
fn unknown_peer_waits_for_the_answer_then_is_adopted() {
    for seed in 0..20 {
        let mut net = Net::pair(seed);
        net.core(0).ask_unknown(true);
        let r = net.raw_dial(0);
        net.raw_join(r, 7);
        net.run(false);
        let conn = unknown_event(&net, 0, 7);
        // No answer yet, nothing refused, the connection stays open.
        assert!(net.raw_read(r).is_empty());
        assert!(!net.raw_eof(r));
        assert_eq!(net.core(0).counters().refused, 0);
        assert_eq!(net.core(0).state(PeerId(7)), None);
        // The driver adds the peer and accepts.
        net.core(0).add_peer(PeerId(7), vec![addr(7)]).unwrap();
        net.core(0).resolve_unknown(conn, true);
        net.drive();
        let h = Hello::parse(&net.raw_read(r)).expect("an answer record");
        assert_eq!(h.kind, HelloKind::Accept, "seed {seed}");
        assert!(connected(&net, 0, 7));
        assert_eq!(
            net.count_events(0, |e| *e == CoreEvent::Connected(PeerId(7))),
            1
        );
        // Frames flow both ways on the adopted connection.
        net.raw_write(r, &frame(FrameKind::Send, 3, b"lazy"));
        net.send(0, 7, 4, b"back".to_vec()).unwrap();
        net.drive();
        assert_eq!(net.received(0, 7), vec![(3, b"lazy".to_vec())]);
        assert_eq!(net.raw_read(r), frame(FrameKind::Send, 4, b"back"));
        assert!(net.completions(0).values().all(Result::is_ok));
        // A late second answer for the same connection changes nothing.
        net.core(0).resolve_unknown(conn, false);
        net.drive();
        assert!(connected(&net, 0, 7));
    }
}

#[test]
fn declined_or_not_added_unknown_peer_is_refused() {
    for (accept, add) in [(false, false), (true, false), (false, true)] {
        let mut net = Net::pair(3);
        net.core(0).ask_unknown(true);
        let r = net.raw_dial(0);
        net.raw_join(r, 9);
        net.run(false);
        let conn = unknown_event(&net, 0, 9);
        if add {
            net.core(0).add_peer(PeerId(9), vec![addr(9)]).unwrap();
        }
        net.core(0).resolve_unknown(conn, accept);
        net.drive();
        let ctx = format!("accept {accept}, add {add}");
        let h = Hello::parse(&net.raw_read(r)).expect("an answer record");
        assert_eq!(
            h.kind,
            HelloKind::Reject(RejectReason::UnknownPeer),
            "{ctx}"
        );
        assert!(net.raw_eof(r), "{ctx}");
        assert_eq!(net.core(0).counters().refused, 1, "{ctx}");
        let why = ProtoError::Rejected(RejectReason::UnknownPeer);
        assert_eq!(
            net.count_events(0, |e| *e == CoreEvent::Refused { why: why.clone() }),
            1,
            "{ctx}"
        );
        assert!(!connected(&net, 0, 9), "{ctx}");
        // The known peer is unaffected.
        net.send(0, 1, 1, b"x".to_vec()).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
    }
}

#[test]
fn unanswered_unknown_peer_times_out_and_a_late_answer_is_ignored() {
    let mut net = Net::pair(5);
    net.core(0).ask_unknown(true);
    let r = net.raw_dial(0);
    net.raw_join(r, 9);
    net.run(false);
    let conn = unknown_event(&net, 0, 9);
    assert!(!net.raw_eof(r));
    net.drive();
    assert!(net.raw_eof(r), "closed at the handshake deadline");
    assert!(net.raw_read(r).is_empty());
    assert!(net.offset >= cfg(0).handshake_timeout);
    let why = ProtoError::HandshakeTimeout;
    assert_eq!(
        net.count_events(0, |e| *e == CoreEvent::Refused { why: why.clone() }),
        1
    );
    assert!(net.nodes[0].keys.is_empty());
    net.core(0).add_peer(PeerId(9), vec![addr(9)]).unwrap();
    net.core(0).resolve_unknown(conn, true);
    net.drive();
    assert_eq!(net.core(0).state(PeerId(9)), Some(EndpointState::Closed));
    assert!(net.nodes[0].keys.is_empty());
}

/// Frames a dialer writes right behind its AUTH (as a dialer does with its first frames)
/// wait unread while the driver decides about the unknown process id: delivered once,
/// after the ACCEPT, when it accepts; never read, and the connection refused, when it
/// declines. With the multishot receive too (the handshake then reads one record at a
/// time).
#[test]
fn frames_behind_the_auth_wait_for_the_answer() {
    for (seed, accept, multishot) in [
        (6, true, false),
        (7, false, false),
        (8, true, true),
        (9, false, true),
    ] {
        let cfg0 = CoreConfig {
            multishot,
            ..cfg(0)
        };
        let mut net = Net::new(seed, vec![cfg0, cfg(1)]);
        net.core(0).ask_unknown(true);
        let r = net.raw_dial(0);
        net.raw_join(r, 9);
        net.raw_write(r, &frame(FrameKind::Send, 1, b"early"));
        net.run(false);
        let conn = unknown_event(&net, 0, 9);
        net.raw_write(r, &frame(FrameKind::Send, 2, b"later"));
        net.run(false);
        // Nothing read, nothing answered, nothing refused yet.
        assert!(!net.raw_eof(r), "seed {seed}");
        assert!(net.raw_read(r).is_empty(), "seed {seed}");
        assert!(net.nodes[0].got.is_empty(), "seed {seed}");
        assert_eq!(net.core(0).counters().refused, 0);
        if accept {
            net.core(0).add_peer(PeerId(9), vec![addr(9)]).unwrap();
        }
        net.core(0).resolve_unknown(conn, accept);
        net.drive();
        let h = Hello::parse(&net.raw_read(r)).expect("an answer record");
        if accept {
            assert_eq!(h.kind, HelloKind::Accept, "seed {seed}");
            assert_eq!(
                net.received(0, 9),
                vec![(1, b"early".to_vec()), (2, b"later".to_vec())],
                "seed {seed}"
            );
            assert!(connected(&net, 0, 9));
        } else {
            assert_eq!(h.kind, HelloKind::Reject(RejectReason::UnknownPeer));
            assert!(net.raw_eof(r), "seed {seed}");
            assert!(net.nodes[0].got.is_empty(), "seed {seed}");
            assert_eq!(net.core(0).state(PeerId(9)), None);
            assert_eq!(net.core(0).counters().refused, 1);
        }
    }
}

#[test]
fn without_asking_an_unknown_peer_is_refused_at_once() {
    let mut net = Net::pair(2);
    net.core(0).ask_unknown(true);
    net.core(0).ask_unknown(false);
    let r = net.raw_dial(0);
    net.raw_join(r, 9);
    net.drive();
    let h = Hello::parse(&net.raw_read(r)).expect("an answer record");
    assert_eq!(h.kind, HelloKind::Reject(RejectReason::UnknownPeer));
    assert_eq!(
        net.count_events(0, |e| matches!(e, CoreEvent::UnknownPeer { .. })),
        0
    );
}

#[test]
fn own_id_and_ids_out_of_range_are_never_asked_about() {
    for pid in [0, MAX_PEERS, u32::MAX] {
        let mut net = Net::pair(4);
        net.core(0).ask_unknown(true);
        let r = net.raw_dial(0);
        net.raw_join(r, pid);
        net.drive();
        let h = Hello::parse(&net.raw_read(r)).expect("an answer record");
        assert_eq!(
            h.kind,
            HelloKind::Reject(RejectReason::UnknownPeer),
            "pid {pid}"
        );
        assert_eq!(
            net.count_events(0, |e| matches!(e, CoreEvent::UnknownPeer { .. })),
            0
        );
    }
}

/// Node `i` knows only the nodes below it (node 0 knows nobody); every node resolves
/// the ones that connect, so lower nodes learn of higher ones when those first dial them;
/// then all send to all.
#[test]
fn peers_added_lazily_exchange_everything_in_order() {
    const N: usize = 4;
    for seed in 0..40 {
        let cfgs = (0..N as u32).map(cfg).collect();
        let mut net = Net::with_known(seed, cfgs, |i, j| j < i);
        for n in 0..N {
            net.nodes[n].lazy = true;
            net.core(n).ask_unknown(true);
        }
        // A node cannot send to a peer it was never told about.
        assert_eq!(
            net.send(0, 3, 1, vec![1]),
            Err(SendError::UnknownPeer(PeerId(3)))
        );
        for i in 0..N {
            for j in 0..i {
                for _ in 0..1 + net.rng.below(3) {
                    net.send_random(i, j as u32).unwrap();
                }
            }
        }
        net.drive();
        for i in 0..N {
            for j in 0..N {
                if i != j {
                    assert!(connected(&net, i, j as u32), "seed {seed}: {i} -> {j}");
                }
            }
        }
        for i in 0..N {
            for j in (0..N).filter(|&j| j != i) {
                net.send_random(i, j as u32).unwrap();
            }
        }
        net.drive();
        for i in 0..N {
            for j in (0..N).filter(|&j| j != i) {
                net.assert_all_delivered(i, j);
            }
            assert!(
                net.completions(i).values().all(Result::is_ok),
                "seed {seed}"
            );
            assert!(net.failed_events(i).is_empty(), "seed {seed}");
            assert_eq!(net.core(i).counters().refused, 0, "seed {seed}");
        }
    }
}
