//! Pair tests: FIN, abrupt close, crashes, aborts.

use super::*;

// ----- 4. FIN --------------------------------------------------------------------------------

#[test]
fn fin_closes_both_sides_cleanly() {
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        for _ in 0..net.rng.below(10) {
            net.send_random(0, 1).unwrap();
        }
        for _ in 0..net.rng.below(10) {
            net.send_random(1, 0).unwrap();
        }
        let k = net.rng.below(40);
        net.steps(k);
        net.core(0).shutdown();
        assert_eq!(net.send(0, 1, 0, vec![1]), Err(SendError::ShuttingDown));
        let both = net.rng.chance(1, 3);
        let mut late = 0;
        let mut k = net.rng.below(60);
        while net.step() {
            if both && k == 0 {
                net.core(1).shutdown();
            }
            let heard = net.nodes[1]
                .events
                .contains(&CoreEvent::PeerClosed(PeerId(0)));
            if !both && !heard && late < 3 && net.rng.chance(1, 4) {
                // Node 1 keeps sending while the FIN travels.
                match net.send_random(1, 0) {
                    Ok(_) => {}
                    Err(SendError::Unreachable(p)) => assert_eq!(p, PeerId(0)),
                    Err(e) => panic!("seed {seed}: unexpected {e:?}"),
                }
                late += 1;
            }
            k = k.saturating_sub(1);
        }
        if both {
            net.core(1).shutdown();
        }
        net.drive();
        let ctx = format!("seed {seed}");
        // Every frame queued before the FIN arrived; after it, nothing.
        net.assert_all_delivered(0, 1);
        assert!(net.completions(0).values().all(Result::is_ok), "{ctx}");
        let done = net.assert_delivered_iff_ok(1, 0);
        for r in done.values() {
            assert!(
                matches!(r, Ok(()) | Err(FailReason::PeerClosed(PeerId(0)))),
                "{ctx}: {r:?}"
            );
        }
        assert_eq!(
            net.count_events(1, |e| *e == CoreEvent::PeerClosed(PeerId(0))),
            1,
            "{ctx}: the peer hears the FIN once"
        );
        for n in 0..2 {
            assert!(
                net.failed_events(n).is_empty(),
                "{ctx}: node {n}: {:?}",
                net.failed_events(n)
            );
            assert!(
                net.open_socks(n).is_empty(),
                "{ctx}: node {n} keeps a socket"
            );
            assert!(net.core(n).is_quiescent(), "{ctx}: node {n} not quiescent");
            assert_eq!(net.core(n).pending(PeerId(1 - n as u32)), 0);
        }
        assert!(
            net.nodes[0].keys.is_empty() && net.nodes[1].keys.is_empty(),
            "{ctx}: all closed"
        );
    }
}

#[test]
fn fin_while_a_batch_is_still_in_flight() {
    let mut modes = [0usize; 3];
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        let slow = net.rng.below(2);
        let other = 1 - slow;
        for _ in 0..1 + net.rng.below(5) {
            net.send_random(slow, other as u32).unwrap();
        }
        for _ in 0..net.rng.below(5) {
            net.send_random(other, slow as u32).unwrap();
        }
        let mode = net.rng.below(3);
        modes[mode] += 1;
        // With its FIN in the same batch, or queued behind it.
        let fin_in_batch = mode != 1 && net.rng.chance(1, 2);
        if fin_in_batch {
            net.core(slow).shutdown();
        }
        // The slow side's batch is in the kernel and its completion is late.
        net.knobs.stall = Some(slow);
        net.pump_all();
        match mode {
            0 if fin_in_batch => {}
            0 => net.core(slow).shutdown(),
            1 => net.core(other).shutdown(),
            _ => {
                // Both leave.
                if !fin_in_batch {
                    net.core(slow).shutdown();
                }
                let k = net.rng.below(10);
                net.steps(k);
                net.core(other).shutdown();
            }
        }
        net.run(false);
        net.knobs.stall = None;
        net.drive();
        let ctx = format!("seed {seed} mode {mode}");
        for (a, b) in [(0, 1), (1, 0)] {
            let done = net.assert_delivered_iff_ok(a, b);
            for r in done.values() {
                assert!(
                    matches!(r, Ok(()) | Err(FailReason::PeerClosed(_))),
                    "{ctx}: {r:?}"
                );
            }
            assert!(
                net.failed_events(a).is_empty(),
                "{ctx}: {:?}",
                net.failed_events(a)
            );
            assert!(net.core(a).is_quiescent(), "{ctx}: node {a} not quiescent");
            assert!(
                net.nodes[a].keys.is_empty(),
                "{ctx}: node {a} keeps sockets"
            );
        }
        // Whoever shut down first had every frame it accepted delivered.
        let first = if mode == 1 { other } else { slow };
        net.assert_all_delivered(first, 1 - first);
    }
    assert!(modes.iter().all(|&m| m > 0));
}

#[test]
fn fins_crossing_before_either_is_flushed() {
    for seed in 0..50 {
        let mut net = Net::pair(seed);
        net.knobs.split = false;
        connect_pair(&mut net);
        for _ in 0..net.rng.below(4) {
            net.send_random(1, 0).unwrap();
        }
        net.core(0).shutdown();
        net.pump(0);
        // Node 1 shuts down too; its FIN (and frames) are queued, not yet flushed, when
        // its next pass starts with the read that holds node 0's FIN.
        net.core(1).shutdown();
        let read = net
            .ready()
            .into_iter()
            .find(|it| matches!(it, Item::Read(s) if net.socks[*s].owner == Owner::Node(1)))
            .expect("node 0's FIN is waiting for node 1");
        net.exec(read);
        net.drive();
        let ctx = format!("seed {seed}");
        for (a, b) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(a, b);
            assert!(net.completions(a).values().all(Result::is_ok), "{ctx}");
            assert!(
                net.failed_events(a).is_empty(),
                "{ctx}: {:?}",
                net.failed_events(a)
            );
            assert!(net.core(a).is_quiescent(), "{ctx}");
            assert!(net.nodes[a].keys.is_empty(), "{ctx}");
        }
    }
}

#[test]
fn send_after_peer_fin_is_refused_or_fails() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        net.core(0).shutdown();
        net.pump_all();
        if seed.is_multiple_of(2) {
            // Right after the FIN arrived, while the connection is still being closed.
            while !net.nodes[1]
                .events
                .contains(&CoreEvent::PeerClosed(PeerId(0)))
            {
                assert!(net.step(), "seed {seed}: FIN never arrived");
            }
        } else {
            // After both sides closed.
            net.drive();
            assert_eq!(net.core(1).state(PeerId(0)), Some(EndpointState::Closed));
        }
        let retries = net.core(1).counters().connect_retries;
        let dials = net.nodes[1].dials.len();
        match net.send(1, 0, 3, b"late".to_vec()) {
            Err(SendError::Unreachable(_)) => {}
            Ok(c) => {
                net.drive();
                let r = &net.completions(1)[&c];
                assert_eq!(
                    *r,
                    Err(FailReason::PeerClosed(PeerId(0))),
                    "seed {seed}: a send after the peer's FIN"
                );
                assert!(
                    net.nodes[1].dials.len() <= dials + 1,
                    "seed {seed}: redials a peer that is shutting down"
                );
                assert_eq!(
                    net.core(1).counters().connect_retries,
                    retries,
                    "seed {seed}: retried a peer that is shutting down"
                );
            }
            Err(e) => panic!("seed {seed}: {e:?}"),
        }
        net.drive();
        net.completions(1);
        assert!(net.received(0, 1).is_empty(), "seed {seed}");
        assert!(net.nodes[0].keys.is_empty() && net.nodes[1].keys.is_empty());
    }
}

// ----- 5. failure ----------------------------------------------------------------------------

#[test]
fn abrupt_close_fails_every_pending_send_once() {
    let mut saw = [false; 2];
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        let stall = seed.is_multiple_of(2);
        for _ in 0..1 + net.rng.below(10) {
            net.send_random(0, 1).unwrap();
        }
        let k = net.rng.below(20);
        net.steps(k);
        if stall {
            // The peer stops reading: the batch in flight never completes by itself.
            net.knobs.stall = Some(0);
        }
        // Something in flight and something queued behind it.
        for _ in 0..1 + net.rng.below(10) {
            net.send_random(0, 1).unwrap();
        }
        net.pump(0);
        let k = net.rng.below(10);
        net.steps(k);
        for _ in 0..1 + net.rng.below(5) {
            net.send_random(0, 1).unwrap();
        }
        let pending = net.core(0).pending(PeerId(1));
        // Written frames waiting for the peer's ACK of a lent one may still succeed: the
        // peer may have read them, its ACK on the way.
        let unacked = net.core(0).unacked(PeerId(1));
        let inflight = net.inflight_frames(0) + unacked;
        assert!(pending > 0);
        net.crash(1);
        net.drive();
        let ctx = format!("seed {seed}");
        let done = net.completions(0);
        let errs = done.values().filter(|r| r.is_err()).count();
        if stall {
            // Nothing that was pending at the crash can have succeeded, but for frames
            // the peer read before it stalled.
            assert!(
                errs <= pending && errs + unacked >= pending,
                "{ctx}: {errs} of {pending} pending sends failed ({unacked} unacked)"
            );
        } else {
            // Only frames already handed to the kernel may report success.
            assert!(
                errs + inflight >= pending,
                "{ctx}: {errs} failed, {pending} pending"
            );
        }
        saw[usize::from(stall)] |= errs > 0;
        for r in done.values().filter_map(|r| r.as_ref().err()) {
            assert!(
                matches!(
                    r,
                    FailReason::ConnectionLost {
                        peer: PeerId(1),
                        ..
                    }
                ),
                "{ctx}: {r:?}"
            );
        }
        let failed = net.failed_events(0);
        assert_eq!(failed.len(), 1, "{ctx}: one PeerFailed: {failed:?}");
        assert!(matches!(
            failed[0],
            (PeerId(1), FailReason::ConnectionLost { .. })
        ));
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Failed));
        assert_eq!(net.core(0).pending(PeerId(1)), 0);
        net.assert_prefix_delivered(0, 1);
        assert_eq!(
            net.send(0, 1, 0, vec![]),
            Err(SendError::Unreachable(PeerId(1)))
        );
        net.drive();
        assert!(net.open_socks(0).is_empty(), "{ctx}");
        assert!(
            net.nodes[0].keys.is_empty(),
            "{ctx}: node 0 released every socket"
        );
    }
    assert_eq!(saw, [true, true]);
}

#[test]
fn a_batch_in_flight_completes_only_when_it_comes_back() {
    // The peer dies while node 0's batch is with the kernel (the send stalls): the
    // endpoint fails at once, but the sends of that batch complete only when the driver
    // hands it back, since until then the kernel may read their payload memory.
    for seed in 0..50 {
        let ctx = format!("seed {seed}");
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        net.knobs.stall = Some(0);
        let n = 1 + net.rng.below(4);
        for _ in 0..n {
            net.send(0, 1, 1, vec![7; 4096]).unwrap();
        }
        net.pump(0);
        let inflight = net.inflight_frames(0);
        assert_eq!(inflight, n, "{ctx}: one batch carries every send");
        let before = net.count_events(0, |e| matches!(e, CoreEvent::Completed { .. }));
        net.crash(1);
        let eof = net
            .ready()
            .into_iter()
            .find(|i| matches!(i, Item::Eof(_)))
            .expect("node 0 sees the end of the stream");
        net.exec(eof);
        assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Failed));
        assert_eq!(net.failed_events(0).len(), 1, "{ctx}");
        let after = net.count_events(0, |e| matches!(e, CoreEvent::Completed { .. }));
        assert_eq!(
            after, before,
            "{ctx}: completed while the kernel held the batch"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), n, "{ctx}");
        assert_eq!(net.core(0).orphaned(), n, "{ctx}");
        // The close cancels the send: the batch comes back, the sends complete once.
        net.drive();
        let done = net.completions(0);
        let errs: Vec<_> = done.values().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(errs.len(), n, "{ctx}: {done:?}");
        assert!(
            errs.iter().all(|r| matches!(
                r,
                FailReason::ConnectionLost {
                    peer: PeerId(1),
                    ..
                }
            )),
            "{ctx}: {errs:?}"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), 0, "{ctx}");
        assert_eq!(net.core(0).orphaned(), 0, "{ctx}");
    }
}

#[test]
fn abort_all_fails_pending_sends_once() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        for _ in 0..1 + net.rng.below(10) {
            net.send_random(0, 1).unwrap();
        }
        let k = net.rng.below(40);
        net.steps(k);
        net.core(0).abort_all();
        net.drive();
        let done = net.completions(0);
        for r in done.values() {
            assert!(
                matches!(r, Ok(()) | Err(FailReason::Shutdown)),
                "seed {seed}: {r:?}"
            );
        }
        net.assert_prefix_delivered(0, 1);
        assert!(net.open_socks(0).is_empty(), "seed {seed}");
        assert!(net.core(0).is_quiescent());
    }
}

#[test]
fn crash_of_one_peer_does_not_disturb_the_others() {
    for seed in 0..40 {
        let mut net = Net::new(seed, vec![cfg(0), cfg(1), cfg(2)]);
        for _ in 0..3 {
            for a in 0..3 {
                for b in (0..3).filter(|&b| b != a) {
                    for _ in 0..net.rng.below(4) {
                        net.send_random(a, b as u32).unwrap();
                    }
                }
            }
            let k = net.rng.below(100);
            net.steps(k);
        }
        net.crash(2);
        for _ in 0..net.rng.below(4) {
            net.send_random(0, 1).unwrap();
            net.send_random(1, 0).unwrap();
        }
        net.drive();
        let ctx = format!("seed {seed}");
        for (a, b) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(a, b);
            net.assert_prefix_delivered(a, 2);
            let done = net.completions(a);
            for (c, (to, _, _)) in &net.nodes[a].sent {
                if *to == PeerId(b as u32) {
                    assert!(done[c].is_ok(), "{ctx}");
                }
            }
            let failed = net.failed_events(a);
            assert!(failed.len() <= 1, "{ctx}: {failed:?}");
            assert!(failed.iter().all(|(p, _)| *p == PeerId(2)), "{ctx}");
            assert!(connected(&net, a, b as u32), "{ctx}");
        }
    }
}

/// True if `got` is `want` with some elements left out, order kept.
fn is_subsequence(got: &[Msg], want: &[Msg]) -> bool {
    let mut it = want.iter();
    got.iter().all(|g| it.any(|w| w == g))
}

#[test]
fn random_sends_shutdowns_and_crashes_keep_the_invariants() {
    sends_shutdowns_and_crashes(0..300, false);
}

/// The same with multishot receive (cancelled and paused multishot receives included).
#[test]
fn multishot_random_sends_shutdowns_and_crashes_keep_the_invariants() {
    sends_shutdowns_and_crashes(1000..1150, true);
}

fn sends_shutdowns_and_crashes(seeds: std::ops::Range<u64>, multishot: bool) {
    for seed in seeds {
        let mut cfgs = vec![cfg(0), cfg(1), cfg(2)];
        for c in &mut cfgs {
            c.multishot = multishot;
        }
        let mut net = Net::new(seed, cfgs);
        let mut crashed: Option<usize> = None;
        let mut down = [false; 3];
        for _ in 0..5 + net.rng.below(20) {
            match net.rng.below(20) {
                0..=11 => {
                    let a = net.rng.below(3);
                    let b = (a + 1 + net.rng.below(2)) % 3;
                    if crashed == Some(a) {
                        continue;
                    }
                    match net.send_random(a, b as u32) {
                        Ok(_) => {}
                        Err(SendError::Unreachable(p)) => assert_eq!(p, PeerId(b as u32)),
                        Err(SendError::ShuttingDown) => assert!(down[a]),
                        Err(e) => panic!("seed {seed}: {e:?}"),
                    }
                }
                12..=17 => {
                    let k = net.rng.below(60);
                    net.steps(k);
                }
                18 => {
                    let a = net.rng.below(3);
                    if crashed != Some(a) {
                        net.core(a).shutdown();
                        down[a] = true;
                    }
                }
                _ => {
                    if crashed.is_none() {
                        let a = net.rng.below(3);
                        net.crash(a);
                        crashed = Some(a);
                    }
                }
            }
        }
        net.drive();
        let ctx = format!("seed {seed} crashed {crashed:?} down {down:?}");
        for a in (0..3).filter(|&a| crashed != Some(a)) {
            net.completions(a);
            for b in (0..3).filter(|&b| b != a) {
                let failed = net.failed_events(a);
                let n = failed
                    .iter()
                    .filter(|(p, _)| *p == PeerId(b as u32))
                    .count();
                assert!(n <= 1, "{ctx}: node {a}: {failed:?}");
                let broken = n > 0
                    || net
                        .failed_events(b)
                        .iter()
                        .any(|(p, _)| *p == PeerId(a as u32));
                if crashed.is_none() && !broken {
                    // A clean history: delivered exactly when completed Ok.
                    net.assert_delivered_iff_ok(a, b);
                } else {
                    // A send that completed Ok was written, not necessarily read.
                    let want: Vec<Msg> = net.sent(a, b).into_iter().map(|(_, m)| m).collect();
                    assert!(
                        is_subsequence(&net.received(b, a), &want),
                        "{ctx}: {a} -> {b}"
                    );
                }
                assert_eq!(
                    net.core(a).pending(PeerId(b as u32)),
                    0,
                    "{ctx}: {a} -> {b}"
                );
            }
            if down[a] {
                assert!(net.core(a).is_quiescent(), "{ctx}: node {a}");
                assert!(
                    net.nodes[a].keys.is_empty(),
                    "{ctx}: node {a} keeps sockets"
                );
            }
        }
        if let Some(c) = crashed {
            for a in (0..3).filter(|&a| a != c) {
                let want: Vec<Msg> = net.sent(c, a).into_iter().map(|(_, m)| m).collect();
                assert!(
                    is_subsequence(&net.received(a, c), &want),
                    "{ctx}: {c} -> {a}"
                );
            }
        }
    }
}
