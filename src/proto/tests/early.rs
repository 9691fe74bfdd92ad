//! Frames behind the AUTH: a dialer whose id is below its peer's writes its first frames
//! right behind its AUTH, one round trip before the ACCEPT; they complete on the ACCEPT,
//! go again exactly once on the next connection when the acceptor refuses or drops the
//! dial, and an acceptor reads them only after the AUTH verified and it adopted the
//! connection.

use super::*;

/// Node 1's part played by a raw acceptor: reads node 0's HELLO on `r` and answers a
/// CHALLENGE made with the nodes' key.
fn raw_challenge(net: &mut Net, r: usize) {
    let hello = Hello::parse(&net.raw_read(r)).expect("a HELLO");
    assert_eq!((hello.kind, hello.pid), (HelloKind::Hello, PeerId(0)));
    let nonce_a = [0x5a; NONCE_LEN];
    let t = Transcript {
        job_d: TOKEN,
        job_a: TOKEN,
        nonce_d: &hello.nonce,
        nonce_a: &nonce_a,
        pid_d: PeerId(0),
        pid_a: PeerId(1),
        link: 0,
    };
    let mut ch = Hello::new(HelloKind::Challenge, PeerId(1));
    ch.to = PeerId(0);
    ch.nonce = nonce_a;
    ch.mac = auth::handshake_mac(&JobKey::from_bytes(KEY), Side::Acceptor, &t);
    net.raw_write(r, &ch.to_bytes());
    net.run(false);
}

/// What node 0 wrote on `r` after its AUTH, checked to start with an AUTH.
fn after_auth(net: &mut Net, r: usize) -> Vec<u8> {
    let got = net.raw_read(r);
    let auth = Hello::parse(&got).expect("an AUTH");
    assert_eq!((auth.kind, auth.to), (HelloKind::Auth, PeerId(1)));
    got[HELLO_LEN..].to_vec()
}

fn frames(msgs: &[(u8, &[u8])]) -> Vec<u8> {
    msgs.iter()
        .flat_map(|(t, p)| frame(FrameKind::Send, *t, p))
        .collect()
}

fn completed(net: &Net, n: usize) -> usize {
    net.count_events(n, |e| matches!(e, CoreEvent::Completed { .. }))
}

#[test]
fn frames_behind_the_auth_complete_once_on_accept() {
    let mut net = Net::pair(31);
    net.listeners.insert(addr(1), Listener::Raw);
    net.send(0, 1, 1, b"first".to_vec()).unwrap();
    net.send(0, 1, 2, b"second".to_vec()).unwrap();
    net.run(false);
    let r = net.raw_accepted[0];
    raw_challenge(&mut net, r);
    // Both frames ride behind the AUTH, in order; neither is complete before the answer.
    assert_eq!(
        after_auth(&mut net, r),
        frames(&[(1, b"first"), (2, b"second")])
    );
    assert_eq!(completed(&net, 0), 0);
    assert_eq!(net.core(0).pending(PeerId(1)), 2);
    net.raw_write(r, &Hello::new(HelloKind::Accept, PeerId(1)).to_bytes());
    net.run(false);
    // Completed once, written once: nothing goes again after the ACCEPT.
    assert!(net.completions(0).values().all(Result::is_ok));
    assert_eq!(completed(&net, 0), 2);
    assert!(net.raw_read(r).is_empty());
    assert!(connected(&net, 0, 1));
    // Later frames follow on the connection as usual.
    net.send(0, 1, 3, b"third".to_vec()).unwrap();
    net.run(false);
    assert_eq!(net.raw_read(r), frames(&[(3, b"third")]));
    assert_eq!(completed(&net, 0), 3);
    assert!(net.completions(0).values().all(Result::is_ok));
    assert_eq!(net.core(0).pending(PeerId(1)), 0);
}

/// A refusal (or a close before any answer) leaves the frames queued: they go once on
/// the next connection, and complete once, in their order, with the frames queued after.
#[test]
fn refused_or_dropped_dial_sends_its_frames_again_once() {
    for answer in ["duplicate", "close"] {
        let mut net = Net::pair(32);
        net.listeners.insert(addr(1), Listener::Raw);
        // "b" is longer than a queued frame holds in place: three segments.
        let b: Vec<u8> = (0..100u8).collect();
        net.send(0, 1, 1, b"a".to_vec()).unwrap();
        net.send_segs(0, 1, 2, b.clone(), 3).unwrap();
        net.run(false);
        let r = net.raw_accepted[0];
        raw_challenge(&mut net, r);
        assert_eq!(after_auth(&mut net, r), frames(&[(1, b"a"), (2, &b)]));
        net.send(0, 1, 3, b"c".to_vec()).unwrap();
        match answer {
            "duplicate" => {
                let rej = Hello::new(HelloKind::Reject(RejectReason::Duplicate), PeerId(1));
                net.raw_write(r, &rej.to_bytes());
            }
            _ => net.raw_close(r),
        }
        net.run(false);
        assert_eq!(completed(&net, 0), 0, "{answer}");
        // The retry (after its delay): a second connection, the same frames behind its
        // AUTH, once.
        net.offset += Duration::from_millis(100);
        net.fire_due_timers();
        net.run(false);
        assert_eq!(net.raw_accepted.len(), 2, "{answer}");
        let r2 = net.raw_accepted[1];
        raw_challenge(&mut net, r2);
        assert_eq!(
            after_auth(&mut net, r2),
            frames(&[(1, b"a"), (2, &b), (3, b"c")]),
            "{answer}"
        );
        net.raw_write(r2, &Hello::new(HelloKind::Accept, PeerId(1)).to_bytes());
        net.run(false);
        assert!(net.raw_read(r2).is_empty(), "{answer}");
        assert_eq!(completed(&net, 0), 3, "{answer}");
        assert!(net.completions(0).values().all(Result::is_ok), "{answer}");
        assert!(net.failed_events(0).is_empty(), "{answer}");
    }
}

/// The dialer with the higher id, whose dial loses a simultaneous connect, sends nothing
/// behind its AUTH: its frames wait for the ACCEPT.
#[test]
fn higher_id_waits_for_the_accept() {
    let mut net = Net::pair(33);
    net.listeners.insert(addr(0), Listener::Raw);
    net.send(1, 0, 1, b"x".to_vec()).unwrap();
    net.run(false);
    let r = net.raw_accepted[0];
    let hello = Hello::parse(&net.raw_read(r)).unwrap();
    let nonce_a = [0x5b; NONCE_LEN];
    let t = Transcript {
        job_d: TOKEN,
        job_a: TOKEN,
        nonce_d: &hello.nonce,
        nonce_a: &nonce_a,
        pid_d: PeerId(1),
        pid_a: PeerId(0),
        link: 0,
    };
    let mut ch = Hello::new(HelloKind::Challenge, PeerId(0));
    ch.to = PeerId(1);
    ch.nonce = nonce_a;
    ch.mac = auth::handshake_mac(&JobKey::from_bytes(KEY), Side::Acceptor, &t);
    net.raw_write(r, &ch.to_bytes());
    net.run(false);
    let got = net.raw_read(r);
    assert_eq!(got.len(), HELLO_LEN, "the AUTH alone");
    assert_eq!(Hello::parse(&got).unwrap().kind, HelloKind::Auth);
    net.raw_write(r, &Hello::new(HelloKind::Accept, PeerId(0)).to_bytes());
    net.run(false);
    assert_eq!(net.raw_read(r), frames(&[(1, b"x")]));
}

/// Past its handshake deadline a dialer whose frames went behind its AUTH keeps waiting
/// for the answer (the acceptor may have delivered them): no close, no retry; the late
/// ACCEPT completes them once.
#[test]
fn early_frames_wait_for_a_late_answer() {
    let mut net = Net::pair(34);
    net.listeners.insert(addr(1), Listener::Raw);
    net.send(0, 1, 1, b"late".to_vec()).unwrap();
    net.run(false);
    let r = net.raw_accepted[0];
    raw_challenge(&mut net, r);
    assert_eq!(after_auth(&mut net, r), frames(&[(1, b"late")]));
    net.offset += cfg(0).handshake_timeout * 3;
    net.fire_due_timers();
    net.run(false);
    assert!(!net.raw_eof(r));
    assert_eq!(net.raw_accepted.len(), 1);
    assert_eq!(completed(&net, 0), 0);
    net.raw_write(r, &Hello::new(HelloKind::Accept, PeerId(1)).to_bytes());
    net.run(false);
    assert_eq!(completed(&net, 0), 1);
    assert!(net.completions(0).values().all(Result::is_ok));
    assert!(net.raw_read(r).is_empty());
}

/// A stranger's frames behind a forged AUTH (another key) or behind the AUTH of a
/// process id nobody added are never read: refused, nothing delivered, nothing claimed.
#[test]
fn frames_behind_a_refused_auth_deliver_nothing() {
    let other = JobKey::from_bytes([0x77; 32]);
    for (pid, key) in [(1, other), (99, JobKey::from_bytes(KEY))] {
        let mut net = Net::pair(35);
        let r = net.raw_dial(0);
        net.raw_hello(r, pid);
        net.raw_send_auth(r, pid, &key, TOKEN);
        net.raw_write(r, &frames(&[(1, b"forged"), (2, b"more")]));
        net.run(false);
        let ans = Hello::parse(&net.raw_read(r)).expect("an answer");
        assert!(matches!(ans.kind, HelloKind::Reject(_)), "{pid}");
        assert!(net.raw_eof(r), "{pid}");
        assert!(net.nodes[0].got.is_empty(), "{pid}");
        assert_eq!(
            net.count_events(0, |e| matches!(e, CoreEvent::Connected(_))),
            0
        );
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
    }
}

/// Between two engines, in every order the network picks, with both sides dialing at
/// once or one after the other: every frame arrives once, in order, and every send
/// completes once.
#[test]
fn both_ways_at_once_deliver_everything_once() {
    let mut races = 0;
    for seed in 0..60 {
        let mut net = Net::pair(seed);
        for i in 0..3u8 {
            net.send(0, 1, i, vec![i; 5]).unwrap();
            net.send(1, 0, i, vec![i; 7]).unwrap();
        }
        net.steps(seed as usize % 7);
        net.send(0, 1, 9, b"after".to_vec()).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        for n in 0..2 {
            assert!(
                net.completions(n).values().all(Result::is_ok),
                "seed {seed}"
            );
        }
        races += net.core(0).counters().simultaneous + net.core(1).counters().simultaneous;
    }
    // Some of these orders were simultaneous connects, lost by node 1's dial.
    assert!(races > 0);
}

/// Reading into its own cache, an adopted connection keeps its handshake-sized buffer
/// while small frames come, and takes the full cache once a frame needs more room or a
/// read fills the small buffer: frames of every size arrive, in order, once.
#[test]
fn the_full_cache_comes_when_needed() {
    for seed in 0..8 {
        let mut net = Net::pair(40 + seed);
        net.send(0, 1, 1, b"hi".to_vec()).unwrap();
        net.drive();
        // The receive buffer of node 1's connection, with the engine or in a read.
        let cap = |net: &Net| {
            let open: Vec<usize> = net.open_socks(1);
            assert_eq!(open.len(), 1, "seed {seed}");
            let k = net.socks[open[0]].key.expect("a node's end");
            let with_core = net.nodes[1].core.conns[k.0 as usize]
                .as_ref()
                .and_then(|c| c.rx.as_ref());
            with_core
                .or(net.socks[open[0]].rx.as_ref())
                .map(RxBuf::capacity)
                .expect("the buffer is somewhere")
        };
        let small = cap(&net);
        assert!(
            small <= crate::proto::recv::HANDSHAKE_READ,
            "seed {seed}: {small}"
        );
        for n in [3, 60, 83, 84, 85, 300, 5000, 70_000, 10] {
            net.send(0, 1, 2, vec![n as u8; n]).unwrap();
        }
        net.drive();
        net.assert_all_delivered(0, 1);
        assert!(net.completions(0).values().all(Result::is_ok));
        assert_eq!(cap(&net), cfg(1).recv_cache, "seed {seed}");
    }
}
