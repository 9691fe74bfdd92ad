//! Pair tests: lazy connect, the handshake and its checks, simultaneous connect,
//! refused connects.

use super::*;

// ----- 1. lazy connect and handshake ---------------------------------------------------------

#[test]
fn lazy_connect_queues_until_connected() {
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        net.send(0, 1, 7, b"first".to_vec()).unwrap();
        assert_eq!(
            net.core(0).state(PeerId(1)),
            Some(EndpointState::Connecting),
            "the first send dials"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), 1);
        // More frames while the connect and handshake are in progress.
        let k = net.rng.below(12);
        net.steps(k);
        let more = net.rng.below(20);
        for i in 0..more {
            let p = net.rng.bytes(i * 13);
            net.send(0, 1, i as u8, p).unwrap();
        }
        net.drive();
        assert!(
            connected(&net, 0, 1) && connected(&net, 1, 0),
            "seed {seed}"
        );
        assert_eq!(net.nodes[0].dials.len(), 1, "seed {seed}: one dial");
        assert_eq!(net.nodes[0].dials[0], (PeerId(1), addr(1)));
        assert!(
            net.nodes[1].dials.is_empty(),
            "seed {seed}: the acceptor never dials"
        );
        for (n, p) in [(0, 1), (1, 0)] {
            let c = net.count_events(n, |e| *e == CoreEvent::Connected(PeerId(p)));
            assert_eq!(c, 1, "seed {seed}: node {n}: one Connected event");
        }
        net.assert_all_delivered(0, 1);
        assert!(
            net.completions(0).values().all(Result::is_ok),
            "seed {seed}"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), 0);
        assert_eq!(net.open_socks(0).len(), 1);
        assert_eq!(net.open_socks(1).len(), 1);
        assert_eq!(net.core(1).counters().refused, 0);
        assert_eq!(net.core(0).counters().simultaneous, 0);
    }
}

// ----- 3. simultaneous connect ---------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Order {
    ZeroFirst,
    OneFirst,
    AtOnce,
}

fn simultaneous(seed: u64, order: Order) {
    let mut net = Net::pair(seed);
    let (first, second) = match order {
        Order::ZeroFirst | Order::AtOnce => (0, 1),
        Order::OneFirst => (1, 0),
    };
    let n1 = 1 + net.rng.below(5);
    for _ in 0..n1 {
        net.send_random(first, second as u32).unwrap();
    }
    let lead = match order {
        Order::AtOnce => 0,
        _ => net.rng.below(10),
    };
    net.steps(lead);
    let n2 = 1 + net.rng.below(5);
    for _ in 0..n2 {
        net.send_random(second, first as u32).unwrap();
    }
    if matches!(order, Order::AtOnce) {
        // Both dials exist before either side hears anything.
        net.pump_all();
        assert_eq!(net.nodes[0].dials.len(), 1);
        assert_eq!(net.nodes[1].dials.len(), 1);
    }
    // More traffic while the race is being resolved.
    let k = net.rng.below(30);
    net.steps(k);
    for _ in 0..net.rng.below(4) {
        net.send_random(0, 1).unwrap();
        net.send_random(1, 0).unwrap();
    }
    net.drive();

    let ctx = format!("seed {seed} {order:?}");
    assert!(connected(&net, 0, 1) && connected(&net, 1, 0), "{ctx}");
    for (a, b) in [(0, 1), (1, 0)] {
        net.assert_all_delivered(a, b);
        assert!(net.completions(a).values().all(Result::is_ok), "{ctx}");
        assert!(net.failed_events(a).is_empty(), "{ctx}");
        let c = net.count_events(a, |e| *e == CoreEvent::Connected(PeerId(b as u32)));
        assert_eq!(c, 1, "{ctx}: node {a}: one Connected event");
    }
    // Exactly one connection survives, the same one on both sides.
    let (s0, s1) = (net.open_socks(0), net.open_socks(1));
    assert_eq!((s0.len(), s1.len()), (1, 1), "{ctx}: surviving sockets");
    assert_eq!(
        net.socks[s0[0]].other,
        Some(s1[0]),
        "{ctx}: both keep the same connection"
    );
    let winner = if net.socks[s0[0]].dialer {
        s0[0]
    } else {
        s1[0]
    };
    // No acceptor ever said ACCEPT on a connection that did not survive: nobody adopted a
    // dead socket. The losing dials were refused as simultaneous (or duplicate), or
    // closed before any answer.
    for s in 0..net.socks.len() {
        let k = &net.socks[s];
        if k.dialer {
            continue;
        }
        let dial = k.other.expect("acceptor has a dialer");
        if dial == winner {
            assert_eq!(
                k.first_record().map(|h| h.kind),
                Some(HelloKind::Accept),
                "{ctx}"
            );
            continue;
        }
        match k.first_record().map(|h| h.kind) {
            None
            | Some(HelloKind::Reject(RejectReason::Simultaneous))
            | Some(HelloKind::Reject(RejectReason::Duplicate)) => {}
            other => panic!("{ctx}: a losing dial was answered with {other:?}"),
        }
    }
    let sim = net.core(0).counters().simultaneous + net.core(1).counters().simultaneous;
    let dials = net.nodes[0].dials.len() + net.nodes[1].dials.len();
    if matches!(order, Order::AtOnce) {
        assert!(sim > 0, "{ctx}: the dials crossed");
        assert_eq!(dials, 2, "{ctx}: nobody redials");
    }
    if dials == 1 {
        assert_eq!(sim, 0, "{ctx}");
    }
}

#[test]
fn simultaneous_connect_zero_first() {
    for seed in 0..200 {
        simultaneous(seed, Order::ZeroFirst);
    }
}

#[test]
fn simultaneous_connect_one_first() {
    for seed in 0..200 {
        simultaneous(seed, Order::OneFirst);
    }
}

#[test]
fn simultaneous_connect_at_once() {
    for seed in 0..200 {
        simultaneous(seed, Order::AtOnce);
    }
}

#[test]
fn simultaneous_connect_without_split_reads() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        net.knobs.split = false;
        net.knobs.jitter = false;
        net.send(0, 1, 1, b"a".to_vec()).unwrap();
        net.send(1, 0, 2, b"b".to_vec()).unwrap();
        net.drive();
        assert!(
            connected(&net, 0, 1) && connected(&net, 1, 0),
            "seed {seed}"
        );
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        assert!(net.core(0).counters().simultaneous + net.core(1).counters().simultaneous > 0);
    }
}

// ----- 6. connect refused --------------------------------------------------------------------

#[test]
fn connect_refused_fails_after_retries() {
    for seed in 0..50 {
        let mut net = Net::pair(seed);
        net.listeners.remove(&addr(1));
        let retries = cfg(0).connect_retries;
        let delay = cfg(0).retry_delay;
        let n = 1 + net.rng.below(5);
        for _ in 0..n {
            net.send_random(0, 1).unwrap();
        }
        net.drive();
        let ctx = format!("seed {seed}");
        assert_eq!(
            net.nodes[0].dials.len(),
            retries as usize,
            "{ctx}: dial attempts"
        );
        let failed = net.failed_events(0);
        assert_eq!(failed.len(), 1, "{ctx}");
        match &failed[0].1 {
            FailReason::ConnectFailed {
                peer,
                attempts,
                cause,
            } => {
                assert_eq!((*peer, *attempts), (PeerId(1), retries), "{ctx}");
                assert_eq!(
                    cause.errno(),
                    Some(Errno::ECONNREFUSED),
                    "{ctx}: the OS code"
                );
            }
            r => panic!("{ctx}: {r:?}"),
        }
        let done = net.completions(0);
        assert_eq!(done.len(), n);
        assert!(done
            .values()
            .all(|r| matches!(r, Err(FailReason::ConnectFailed { .. }))));
        assert_eq!(
            net.core(0).counters().connect_retries,
            u64::from(retries - 1)
        );
        // The backoff waited delay * (1 + 2 + 4 ...).
        let waited: Duration = (0..retries - 1).map(|i| delay * (1 << i)).sum();
        assert!(net.offset >= waited, "{ctx}: {:?} < {waited:?}", net.offset);
        assert_eq!(
            net.send(0, 1, 0, vec![]),
            Err(SendError::Unreachable(PeerId(1)))
        );
        assert!(
            net.nodes[0].keys.is_empty(),
            "{ctx}: every dial socket closed"
        );
    }
}

#[test]
fn connect_succeeds_when_peer_starts_listening_during_retries() {
    for seed in 0..50 {
        let mut net = Net::pair(seed);
        net.listeners.remove(&addr(1));
        net.send(0, 1, 1, b"x".to_vec()).unwrap();
        net.run(false);
        assert_eq!(net.nodes[0].dials.len(), 1);
        net.listeners.insert(addr(1), Listener::Node(1));
        net.drive();
        assert!(connected(&net, 0, 1), "seed {seed}");
        assert_eq!(net.nodes[0].dials.len(), 2);
        net.assert_all_delivered(0, 1);
        assert!(net.failed_events(0).is_empty());
    }
}

// ----- 7. handshake checks -------------------------------------------------------------------

#[test]
fn bad_magic_drops_only_that_connection() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        for _ in 0..net.rng.below(6) {
            net.send_random(0, 1).unwrap();
            net.send_random(1, 0).unwrap();
        }
        let r = net.raw_dial(0);
        net.raw_write(r, b"GET / HTTP/1.1\r\nHost: example\r\n\r\n");
        net.drive();
        let ctx = format!("seed {seed}");
        assert_eq!(net.core(0).counters().bad_magic, 1, "{ctx}");
        assert!(net.raw_eof(r), "{ctx}: the stranger's socket is closed");
        assert!(net.raw_read(r).is_empty(), "{ctx}: no answer to a stranger");
        let why = ProtoError::Wire(WireError::BadMagic);
        assert_eq!(
            net.count_events(0, |e| *e == CoreEvent::Refused { why: why.clone() }),
            1
        );
        for (a, b) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(a, b);
            assert!(net.completions(a).values().all(Result::is_ok));
            assert!(net.failed_events(a).is_empty(), "{ctx}");
        }
        assert_eq!(net.core(1).state(PeerId(0)), net.core(0).state(PeerId(1)));
    }
}

#[test]
fn unknown_process_is_refused() {
    let mut net = Net::pair(1);
    let key = JobKey::from_bytes(KEY);
    let r = net.raw_dial(0);
    net.raw_hello(r, 99);
    let ans = net.raw_auth(r, 99, &key, TOKEN).unwrap();
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::UnknownPeer));
    assert!(net.raw_eof(r));
    assert_eq!(net.core(0).counters().refused, 1);
    assert!(net.nodes[0].keys.is_empty());
    // Our own pid, a wrong version: refused too.
    let r = net.raw_dial(0);
    net.raw_hello(r, 0);
    let ans = net.raw_auth(r, 0, &key, TOKEN).unwrap();
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::UnknownPeer));
    let r = net.raw_dial(0);
    let mut h = Hello::new(HelloKind::Hello, PeerId(1)).to_bytes();
    h[8..10].copy_from_slice(&(VERSION + 1).to_be_bytes());
    net.raw_write(r, &h);
    net.drive();
    let ans = Hello::parse(&net.raw_read(r)).unwrap();
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::Version));
    assert_eq!(net.core(0).counters().refused, 3);
    // An ACCEPT where a HELLO belongs is garbage: dropped without an answer.
    let r = net.raw_dial(0);
    h[10] = 2;
    h[8..10].copy_from_slice(&VERSION.to_be_bytes());
    net.raw_write(r, &h);
    net.drive();
    assert!(net.raw_read(r).is_empty());
    assert!(net.raw_eof(r));
    assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
    assert!(net.failed_events(0).is_empty());
}

#[test]
fn second_connection_from_a_connected_peer_is_a_duplicate() {
    for seed in 0..30 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        let r = net.raw_dial(0);
        net.raw_hello(r, 1);
        let ans = net.raw_auth(r, 1, &JobKey::from_bytes(KEY), TOKEN).unwrap();
        assert_eq!(ans.kind, HelloKind::Reject(RejectReason::Duplicate));
        // The real connection is untouched.
        net.send(0, 1, 5, b"still here".to_vec()).unwrap();
        net.send(1, 0, 5, b"me too".to_vec()).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        assert!(net.failed_events(0).is_empty() && net.failed_events(1).is_empty());
    }
}

#[test]
fn silent_accepted_connection_times_out() {
    for partial in [0usize, 10, 23] {
        let mut net = Net::pair(partial as u64);
        let r = net.raw_dial(0);
        let h = Hello::new(HelloKind::Hello, PeerId(1)).to_bytes();
        net.raw_write(r, &h[..partial]);
        net.run(false);
        assert!(!net.raw_eof(r), "closed before the deadline");
        net.drive();
        assert!(net.raw_eof(r), "closed at the deadline");
        assert!(net.offset >= cfg(0).handshake_timeout);
        assert_eq!(
            net.count_events(0, |e| *e
                == CoreEvent::Refused {
                    why: ProtoError::HandshakeTimeout
                }),
            1
        );
        assert!(net.nodes[0].keys.is_empty());
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
        // Node 0 still works.
        net.send(0, 1, 1, vec![1, 2, 3]).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
    }
}

#[test]
fn dialer_times_out_when_the_acceptor_never_answers() {
    let mut net = Net::pair(3);
    net.listeners.insert(addr(1), Listener::Raw);
    net.send(0, 1, 1, b"x".to_vec()).unwrap();
    net.drive();
    let c = cfg(0);
    assert_eq!(net.nodes[0].dials.len(), c.connect_retries as usize);
    assert_eq!(net.raw_accepted.len(), c.connect_retries as usize);
    let failed = net.failed_events(0);
    assert_eq!(failed.len(), 1);
    assert!(
        matches!(failed[0].1, FailReason::ConnectFailed { attempts, .. } if attempts == c.connect_retries)
    );
    assert!(net.completions(0).values().all(Result::is_err));
    assert!(net.nodes[0].keys.is_empty());
}

#[test]
fn simultaneous_loser_redials_when_the_winner_never_comes() {
    let mut net = Net::pair(5);
    // Whoever listens at node 0's address answers "simultaneous" and then nothing more.
    net.listeners.insert(addr(0), Listener::Raw);
    net.send(1, 0, 1, b"x".to_vec()).unwrap();
    net.run(false);
    let r = net.raw_accepted[0];
    let hello = Hello::parse(&net.raw_read(r)).unwrap();
    assert_eq!((hello.kind, hello.pid), (HelloKind::Hello, PeerId(1)));
    let rej = Hello::new(HelloKind::Reject(RejectReason::Simultaneous), PeerId(0));
    net.raw_write(r, &rej.to_bytes());
    net.run(false);
    // The loser closed its dial and waits for the winner's.
    assert!(net.raw_eof(r));
    assert_eq!(
        net.core(1).state(PeerId(0)),
        Some(EndpointState::ConnectAck)
    );
    assert_eq!(net.core(1).pending(PeerId(0)), 1);
    assert!(net.nodes[1].keys.is_empty());
    // The winner's dial does not come: after the handshake timeout, dial again.
    net.drive();
    let c = cfg(1);
    assert!(net.offset >= c.handshake_timeout);
    assert_eq!(net.nodes[1].dials.len(), c.connect_retries as usize);
    let failed = net.failed_events(1);
    assert_eq!(failed.len(), 1);
    assert!(matches!(failed[0].1, FailReason::ConnectFailed { .. }));
    assert_eq!(
        net.completions(1).values().filter(|r| r.is_err()).count(),
        1
    );
}
