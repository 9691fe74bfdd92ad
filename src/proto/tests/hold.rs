//! Pair tests: a connection's reading held and resumed (`Core::hold_reading`,
//! `Core::resume_reading`) at random moments of random traffic, at random read splits.
//! While held, nothing of it is delivered and no read is armed on it; its kept bytes are
//! walked at the resume; every message arrives once, in order, and every send completes
//! once.

use super::*;

/// What happened over the seeds of one test.
#[derive(Default)]
struct Seen {
    /// Holds that kept unread bytes in the buffer (the resume had something to walk).
    kept: usize,
    /// Buffers walked without a read.
    walks: usize,
    /// Holds under which the network went idle with bytes waiting in the socket.
    waited: usize,
}

/// Node 1's open connection to node 0 (the pair's one connection).
fn conn_of_1(net: &Net) -> (usize, ConnKey) {
    let s = net.open_socks(1);
    assert_eq!(s.len(), 1, "seed {}: one connection", net.seed);
    (s[0], net.socks[s[0]].key.expect("accepted"))
}

/// The receive buffer node 1 keeps for `k` (`None` while a read has it).
fn rx_of(net: &Net, k: ConnKey) -> Option<&RxBuf> {
    net.nodes[1]
        .core
        .conns
        .get(k.0 as usize)
        .and_then(Option::as_ref)
        .and_then(|c| c.rx.as_ref())
}

/// Random traffic both ways (node 0 sends more), node 1's reading held and resumed
/// `holds` times at random steps; while held, the network runs a random number of steps
/// or until idle, and nothing may be delivered to node 1 nor a read armed for it.
fn held_traffic(seed: u64, holds: usize, seen: &mut Seen) {
    let mut c = [cfg(0), cfg(1)];
    let mut rng = Rng::new(seed ^ 0x401d);
    for c in &mut c {
        if seed.is_multiple_of(3) {
            // Payloads larger than the cache are read into their own buffers.
            c.recv_cache = 4096;
        }
        if rng.chance(1, 3) {
            c.coalesce_bytes = 1 + rng.below(16 * 1024);
        }
    }
    let mut net = Net::new(seed, c.to_vec());
    connect_pair(&mut net);
    let (s1, k1) = conn_of_1(&net);
    for _ in 0..holds {
        for _ in 0..net.rng.below(30) {
            net.send_random(0, 1).unwrap();
        }
        for _ in 0..net.rng.below(4) {
            net.send_random(1, 0).unwrap();
        }
        let k = net.rng.below(300);
        net.steps(k);
        // Hold. A payload being read into its own buffer is finished first: the hold
        // begins at the next frame.
        let whole = |rx: Option<&RxBuf>| rx.is_some_and(RxBuf::wants_all);
        let in_frame = whole(net.socks[s1].rx.as_ref()) || whole(rx_of(&net, k1));
        net.nodes[1].core.hold_reading(k1);
        assert!(net.nodes[1].core.reading_held(k1), "seed {seed}");
        let (got, reads) = (net.nodes[1].got.len(), net.socks[s1].reads);
        for _ in 0..net.rng.below(30) {
            net.send_random(0, 1).unwrap();
        }
        if net.rng.chance(1, 2) {
            let k = net.rng.below(500);
            net.steps(k);
        } else {
            net.run(false);
            if !net.socks[s1].inbox.is_empty() {
                // Idle with bytes in the socket: they wait there, no read armed.
                assert!(
                    net.socks[s1].rx.is_none(),
                    "seed {seed}: a read stays armed"
                );
                seen.waited += 1;
            }
        }
        assert!(
            net.nodes[1].got.len() <= got + usize::from(in_frame),
            "seed {seed}: a held connection delivered"
        );
        assert_eq!(
            net.socks[s1].reads, reads,
            "seed {seed}: a read was armed on a held connection"
        );
        // Resume: the kept bytes are walked first, without a read.
        let walks = net.walks;
        let kept = rx_of(&net, k1).is_some_and(|rx| !rx.wants_all() && rx.pending() > 0);
        net.nodes[1].core.resume_reading(k1);
        net.pump(1);
        if kept {
            assert_eq!(net.walks, walks + 1, "seed {seed}: kept bytes not walked");
            seen.kept += 1;
        }
    }
    net.drive();
    seen.walks += net.walks;
    for (a, b) in [(0, 1), (1, 0)] {
        net.assert_all_delivered(a, b);
        assert!(
            net.completions(a).values().all(Result::is_ok),
            "seed {seed}"
        );
        assert!(net.failed_events(a).is_empty(), "seed {seed}");
    }
    let (s, _) = conn_of_1(&net);
    assert_eq!(s, s1, "seed {seed}: the connection survives");
}

#[test]
fn held_reading_delivers_nothing_and_resumes_in_order() {
    let mut seen = Seen::default();
    for seed in 0..150 {
        held_traffic(seed, 1 + (seed as usize % 4), &mut seen);
    }
    // The cases the test is about happened.
    assert!(seen.kept > 20, "{} holds kept bytes", seen.kept);
    assert!(seen.walks > 20, "{} walks", seen.walks);
    assert!(seen.waited > 20, "{} holds waited for bytes", seen.waited);
}

/// A hold and a resume with nothing in between change nothing; a second hold or resume
/// is a no-op.
#[test]
fn hold_and_resume_are_idempotent() {
    for seed in 0..40 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        let (_, k1) = conn_of_1(&net);
        for _ in 0..net.rng.below(20) {
            net.send_random(0, 1).unwrap();
        }
        let k = net.rng.below(100);
        net.steps(k);
        let core = &mut net.nodes[1].core;
        core.hold_reading(k1);
        core.hold_reading(k1);
        core.resume_reading(k1);
        core.resume_reading(k1);
        assert!(!core.reading_held(k1), "seed {seed}");
        net.drive();
        net.assert_all_delivered(0, 1);
        assert!(
            net.completions(0).values().all(Result::is_ok),
            "seed {seed}"
        );
    }
}

/// A held connection that the peer closes is closed cleanly once resumed: the FIN waits
/// behind the held bytes like any frame.
#[test]
fn held_connection_closes_cleanly_after_resume() {
    for seed in 0..40 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        let (_, k1) = conn_of_1(&net);
        net.nodes[1].core.hold_reading(k1);
        for _ in 0..1 + net.rng.below(20) {
            net.send_random(0, 1).unwrap();
        }
        net.nodes[0].core.shutdown();
        net.nodes[1].core.shutdown();
        net.run(false);
        net.nodes[1].core.resume_reading(k1);
        net.drive();
        net.assert_all_delivered(0, 1);
        assert!(
            net.completions(0).values().all(Result::is_ok),
            "seed {seed}"
        );
        assert!(net.failed_events(0).is_empty(), "seed {seed}");
        assert!(net.failed_events(1).is_empty(), "seed {seed}");
        assert!(
            net.nodes[0].core.is_quiescent() && net.nodes[1].core.is_quiescent(),
            "seed {seed}"
        );
    }
}
