//! Links beyond an endpoint's first: planned, dialed by the lower id, authenticated with
//! their number, lost alone and dialed again, closed with their endpoint.

use super::*;

/// `links` more connections from node `n` to node `peer`, all to its one address.
fn plan(net: &mut Net, n: usize, peer: usize, links: usize) {
    let routes = (0..links).map(|_| (addr(peer), None)).collect();
    net.core(n).set_link_routes(PeerId(peer as u32), routes);
}

/// Sends `k` random messages each way and checks that all arrived, in order, once.
fn traffic_both_ways(net: &mut Net, k: usize) {
    for _ in 0..k {
        net.send_random(0, 1).unwrap();
        net.send_random(1, 0).unwrap();
    }
    net.drive();
    net.assert_all_delivered(0, 1);
    net.assert_all_delivered(1, 0);
}

#[test]
fn the_lower_id_dials_its_planned_links_once_connected() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 2);
        // The higher id plans links too, and dials none of them.
        plan(&mut net, 1, 0, 2);
        let from = (seed % 2) as usize;
        net.send(from, (1 - from) as u32, 1, b"hi".to_vec())
            .unwrap();
        net.drive();
        for (n, p) in [(0, 1), (1, 0)] {
            assert_eq!(
                net.core(n).links_open(PeerId(p)),
                3,
                "seed {seed}: node {n}"
            );
            assert_eq!(
                net.core(n).counters().links_joined,
                2,
                "seed {seed}: node {n}"
            );
            assert_eq!(net.open_socks(n).len(), 3, "seed {seed}: node {n}");
            let c = net.count_events(n, |e| *e == CoreEvent::Connected(PeerId(p)));
            assert_eq!(c, 1, "seed {seed}: node {n}: links raise no Connected");
        }
        let first = usize::from(from == 0);
        assert_eq!(net.nodes[0].dials.len(), first + 2, "seed {seed}");
        assert_eq!(net.nodes[1].dials.len(), 1 - first, "seed {seed}");
        // Frames keep flowing on the first connection, in order.
        traffic_both_ways(&mut net, 20);
        assert!(
            net.completions(0).values().all(Result::is_ok),
            "seed {seed}"
        );
    }
}

#[test]
fn links_planned_by_the_higher_id_alone_are_never_dialed() {
    for seed in 0..20 {
        let mut net = Net::pair(seed);
        plan(&mut net, 1, 0, 3);
        net.send(1, 0, 1, b"hi".to_vec()).unwrap();
        net.drive();
        assert_eq!(net.core(1).links_open(PeerId(0)), 1, "seed {seed}");
        assert_eq!(
            net.nodes[1].dials.len(),
            1,
            "seed {seed}: the first connection only"
        );
        assert!(net.nodes[0].dials.is_empty(), "seed {seed}");
    }
}

#[test]
fn a_lost_link_leaves_the_endpoint_connected_and_is_dialed_again() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        assert_eq!(net.core(0).links_open(PeerId(1)), 2, "seed {seed}");
        // The link's connection ends under node 0 (a reset on the way, an interface
        // gone): its first socket is the endpoint's connection, its second the link.
        let link = net.open_socks(0)[1];
        net.socks[link].peer_closed = true;
        net.steps(50);
        traffic_both_ways(&mut net, 10);
        for (n, p) in [(0, 1), (1, 0)] {
            assert!(
                connected(&net, n, p),
                "seed {seed}: node {n} stays connected"
            );
            assert!(net.failed_events(n).is_empty(), "seed {seed}: node {n}");
        }
        assert_eq!(net.core(0).counters().links_lost, 1, "seed {seed}");
        // The retry came (drive advances the clock to it), and the link is back.
        assert_eq!(net.core(0).links_open(PeerId(1)), 2, "seed {seed}");
        assert_eq!(net.core(1).links_open(PeerId(0)), 2, "seed {seed}");
        assert_eq!(
            net.nodes[0].dials.len(),
            3,
            "seed {seed}: the link dialed twice"
        );
        assert!(
            net.completions(0).values().all(Result::is_ok),
            "seed {seed}"
        );
    }
}

#[test]
fn links_close_with_their_endpoint_and_are_not_dialed_after() {
    for seed in 0..50 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 2);
        connect_pair(&mut net);
        net.crash(1);
        net.drive();
        assert_eq!(
            net.core(0).state(PeerId(1)),
            Some(EndpointState::Failed),
            "seed {seed}"
        );
        assert_eq!(net.core(0).links_open(PeerId(1)), 0, "seed {seed}");
        assert!(
            net.open_socks(0).is_empty(),
            "seed {seed}: every link closed"
        );
        assert_eq!(
            net.nodes[0].dials.len(),
            3,
            "seed {seed}: no dial after the failure"
        );
        assert_eq!(net.failed_events(0).len(), 1, "seed {seed}: one failure");
    }
}

#[test]
fn a_join_without_a_first_connection_is_refused() {
    let mut net = Net::pair(1);
    let r = net.raw_dial(0);
    net.raw_hello_link(r, 1, 1);
    net.raw_send_auth_link(r, 1, &JobKey::from_bytes(KEY), TOKEN, 1, 1);
    net.run(false);
    let ans = Hello::parse(&net.raw_read(r)).expect("an answer");
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::NoLink));
    assert!(net.raw_eof(r));
    assert_eq!(net.core(0).state(PeerId(1)), Some(EndpointState::Closed));
}

#[test]
fn the_link_number_is_part_of_the_proof() {
    let mut net = Net::new(2, vec![cfg(0), cfg(1)]);
    let _first = raw_peer(&mut net, 1);
    let r = net.raw_dial(0);
    net.raw_hello_link(r, 1, 2);
    // An AUTH whose MAC covers another link than its HELLO named.
    net.raw_send_auth_link(r, 1, &JobKey::from_bytes(KEY), TOKEN, 2, 1);
    net.run(false);
    let ans = Hello::parse(&net.raw_read(r)).expect("an answer");
    assert_eq!(ans.kind, HelloKind::Reject(RejectReason::AuthFailed));
    assert_eq!(net.core(0).counters().auth_failed, 1);
    assert_eq!(net.core(0).links_open(PeerId(1)), 1);
}

#[test]
fn a_join_is_adopted_and_a_frame_on_it_ends_the_link_alone() {
    let mut net = Net::new(3, vec![cfg(0), cfg(1)]);
    let first = raw_peer(&mut net, 1);
    let r = net.raw_dial(0);
    net.raw_hello_link(r, 1, 1);
    let ans = net.raw_auth_link(r, 1, 1).expect("an answer to the join");
    assert_eq!(ans.kind, HelloKind::Accept);
    assert_eq!(net.core(0).links_open(PeerId(1)), 2);
    // A link carries no frame: one ends the link, not the endpoint.
    net.raw_write(r, &frame(FrameKind::Send, 9, b"hi"));
    net.run(false);
    assert!(net.raw_eof(r), "the link is closed");
    assert_eq!(net.core(0).links_open(PeerId(1)), 1);
    assert_eq!(net.core(0).counters().links_lost, 1);
    assert!(connected(&net, 0, 1));
    let refused = net.count_events(0, |e| {
        *e == CoreEvent::Refused {
            why: ProtoError::FrameOnLink,
        }
    });
    assert_eq!(refused, 1);
    // The first connection still carries frames both ways.
    net.raw_write(first, &frame(FrameKind::Send, 9, b"still"));
    net.run(false);
    assert_eq!(
        net.nodes[0].got.last().map(|g| g.2.as_slice()),
        Some(&b"still"[..])
    );
    // A second join for the same link replaces nothing that is gone, and is adopted.
    let again = net.raw_dial(0);
    net.raw_hello_link(again, 1, 1);
    let ans = net.raw_auth_link(again, 1, 1).expect("an answer");
    assert_eq!(ans.kind, HelloKind::Accept);
    assert_eq!(net.core(0).links_open(PeerId(1)), 2);
}

/// The connection between nodes 0 and 1 that node 0's socket `s` is one end of breaks:
/// what was on the way is lost, and both ends see it end (as a reset, or an interface
/// gone until a timeout says so).
fn break_conn(net: &mut Net, s: usize) {
    let o = net.socks[s].other.expect("a connected socket");
    for k in [s, o] {
        net.socks[k].inbox.clear();
        net.socks[k].peer_closed = true;
        net.socks[k].peer_dead = true;
        // Nothing written from now on arrives.
        net.socks[k].other = None;
    }
}

/// Random messages both ways, `k` from each side, with some steps of progress between.
fn churn(net: &mut Net, k: usize) {
    for _ in 0..k {
        net.send_random(0, 1).unwrap();
        net.send_random(1, 0).unwrap();
        let n = net.rng.below(6);
        net.steps(n);
    }
}

#[test]
fn a_failed_primary_moves_the_stream_to_a_link_and_loses_nothing() {
    for seed in 0..300 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        assert_eq!(net.core(0).links_open(PeerId(1)), 2, "seed {seed}");
        let primary = net.open_socks(0)[0];
        // Traffic both ways, part of it on the way when the primary breaks.
        churn(&mut net, 10);
        break_conn(&mut net, primary);
        churn(&mut net, 10);
        net.drive();
        for (n, p) in [(0, 1), (1, 0)] {
            assert!(
                connected(&net, n, p),
                "seed {seed}: node {n} stays connected"
            );
            assert!(
                net.failed_events(n).is_empty(),
                "seed {seed}: node {n} saw a failure"
            );
        }
        // Nothing lost, nothing twice, in order; every send completed once, without error.
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        for n in 0..2 {
            assert!(
                net.completions(n).values().all(Result::is_ok),
                "seed {seed}: node {n}"
            );
            assert_eq!(net.core(n).pending(PeerId(1 - n as u32)), 0, "seed {seed}");
        }
        let moved = net.core(0).counters().failovers + net.core(1).counters().failovers;
        assert!(moved >= 2, "seed {seed}: both sides moved ({moved})");
        // Each side's RESUMEs named a new epoch of the stream it receives, one each.
        let epochs = |net: &Net| {
            [0usize, 1].map(|n| {
                net.nodes[n]
                    .core
                    .ep(PeerId(1 - n as u32))
                    .unwrap()
                    .fo
                    .rx_epoch()
            })
        };
        let first = epochs(&net);
        for (n, &epoch) in first.iter().enumerate() {
            // A RESUME per failover, and one more when two crossed (each is answered).
            let moves = net.core(n).counters().failovers;
            assert!(
                (1..=2 * moves).contains(&u64::from(epoch)),
                "seed {seed}: node {n}: epoch {epoch} after {moves} failovers"
            );
        }
        // The failed route is dialed again as a link (drive ran the retry timer).
        assert_eq!(net.core(0).links_open(PeerId(1)), 2, "seed {seed}");
        assert_eq!(net.core(1).links_open(PeerId(0)), 2, "seed {seed}");
        // And a second failure is survived as the first.
        let primary = first_carrying(&net);
        break_conn(&mut net, primary);
        churn(&mut net, 10);
        net.drive();
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        assert!(
            net.failed_events(0).is_empty() && net.failed_events(1).is_empty(),
            "seed {seed}"
        );
        let second = epochs(&net);
        assert!(
            second[0] > first[0] && second[1] > first[1],
            "seed {seed}: epochs {first:?} then {second:?}"
        );
    }
}

#[test]
fn with_two_standby_links_two_failures_in_a_row_lose_nothing() {
    for seed in 0..150 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 2);
        connect_pair(&mut net);
        assert_eq!(net.core(0).links_open(PeerId(1)), 3, "seed {seed}");
        churn(&mut net, 6);
        // The primary breaks, and the link the stream moves to breaks before the
        // retries ran: the stream moves on to the third connection.
        let primary = first_carrying(&net);
        break_conn(&mut net, primary);
        let k = net.rng.below(40);
        net.steps(k);
        let next = first_carrying(&net);
        if next != primary {
            break_conn(&mut net, next);
        }
        churn(&mut net, 6);
        net.drive();
        all_arrived(&net, seed);
    }
}

/// As [`break_conn`], silently: neither end sees an end, nothing written arrives, and
/// the kernel's retransmission timer fires on an end whose bytes were lost (on the way
/// now, or written from now on), as under an interface down.
fn cut_conn(net: &mut Net, s: usize) {
    let o = net.socks[s].other.expect("a connected socket");
    for (k, from) in [(s, o), (o, s)] {
        net.socks[from].unacked |= !net.socks[k].inbox.is_empty();
        net.socks[k].inbox.clear();
        net.socks[k].other = None;
        net.socks[k].silent = true;
    }
}

#[test]
fn a_primary_cut_without_a_word_is_found_by_its_retransmissions() {
    for seed in 0..300 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        churn(&mut net, 6);
        let primary = first_carrying(&net);
        cut_conn(&mut net, primary);
        churn(&mut net, 6);
        net.drive();
        all_arrived(&net, seed);
        let stalls = net.core(0).counters().stalls + net.core(1).counters().stalls;
        assert!(stalls >= 1, "seed {seed}: found by a probe");
    }
}

/// Nodes 0 and 1 connected, with one link beside the first connection.
fn pair_with_link(seed: u64) -> Net {
    let mut net = Net::pair(seed);
    plan(&mut net, 0, 1, 1);
    connect_pair(&mut net);
    net
}

/// `k` random messages from node 1 to node 0, with a few steps of progress between.
fn one_way(net: &mut Net, k: usize) {
    for _ in 0..k {
        net.send_random(1, 0).unwrap();
        let n = net.rng.below(3);
        net.steps(n);
    }
}

/// A stream one way only, spread over the primary and a link, and the primary cut
/// without a word: the receiver, which wrote nothing since, finds nothing wrong with its
/// own path, and may hold the link for a run whose predecessor went with the primary,
/// with the sender's RESUME behind it. Either side's watch recovers: nothing lost,
/// duplicated or reordered, every send completes once, within a bound of time.
#[test]
fn a_primary_cut_under_a_one_way_stream_is_found_by_either_side() {
    let mut watched = 0;
    for seed in 0..200 {
        let mut net = pair_with_link(seed);
        // Both ways first, so that a failover already put the stream in runs in some.
        churn(&mut net, 4);
        net.drive();
        one_way(&mut net, 20);
        let t0 = net.now();
        let primary = first_carrying(&net);
        cut_conn(&mut net, primary);
        one_way(&mut net, 10);
        let bound = t0 + Duration::from_secs(3);
        let arrived = net.drive_until(bound, |n| n.received(0, 1).len() == n.sent(1, 0).len());
        assert!(arrived, "seed {seed}: the stream stood still for 3 s");
        net.drive();
        all_arrived(&net, seed);
        watched += usize::from(net.core(0).counters().stalls > 0);
    }
    assert!(watched > 0, "the receiver's watch never asked");
}

/// The primary is cut without a word, and the link the stream moved to is cut in turn
/// a few steps later, often before the RESUMEs of the first failover were read: the
/// stream moves to the first path, dialed again meanwhile, within a bound of time, and
/// nothing is lost, duplicated or reordered.
#[test]
fn a_second_cut_during_a_failover_moves_the_stream_again() {
    let mut moved = 0;
    for seed in 0..200 {
        let mut net = pair_with_link(seed);
        churn(&mut net, 6);
        let first = first_carrying(&net);
        cut_conn(&mut net, first);
        // Until the stream moved to the link and the first path joined again.
        let t0 = net.now();
        let bound = t0 + Duration::from_secs(3);
        let rejoined = net.drive_until(bound, |n| {
            n.open_socks(0).len() == 2 && !n.open_socks(0).contains(&first)
        });
        assert!(rejoined, "seed {seed}: the cut path was not dialed again");
        churn(&mut net, 2);
        let second = first_carrying(&net);
        cut_conn(&mut net, second);
        churn(&mut net, 4);
        let t1 = net.now();
        let bound = t1 + Duration::from_secs(3);
        let arrived = net.drive_until(bound, |n| {
            n.received(0, 1).len() == n.sent(1, 0).len()
                && n.received(1, 0).len() == n.sent(0, 1).len()
        });
        assert!(arrived, "seed {seed}: the stream stood still for 3 s");
        net.drive();
        all_arrived(&net, seed);
        moved += usize::from(first_carrying(&net) != second);
    }
    assert!(
        moved >= 100,
        "the stream moved off the second cut in {moved} of 200"
    );
}

#[test]
fn the_last_link_failing_fails_every_send_once() {
    for seed in 0..200 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        churn(&mut net, 8);
        // Both connections break at once: no link is left to move to.
        for s in net.open_socks(0) {
            break_conn(&mut net, s);
        }
        churn_unchecked(&mut net, 5);
        net.drive();
        for (n, p) in [(0usize, 1usize), (1, 0)] {
            assert_eq!(
                net.core(n).state(PeerId(p as u32)),
                Some(EndpointState::Failed),
                "seed {seed}: node {n}"
            );
            assert_eq!(
                net.failed_events(n).len(),
                1,
                "seed {seed}: node {n}: one failure"
            );
            // Each accepted send completed once (`completions` checks); what arrived is
            // a prefix of what was sent, and holds every send kept by reference that
            // completed without error (one that arrived may still fail: its confirmation
            // was lost). A send kept as a copy completed at its write, as without links,
            // and may be lost with the last link.
            net.assert_prefix_delivered(n, p);
            let done = net.completions(n);
            let got = net.received(p, n).len();
            let lost_ok = net
                .sent(n, p)
                .iter()
                .skip(got)
                .filter(|(c, (_, b))| done[c].is_ok() && b.len() > crate::wire::KEEP_COPY_MAX)
                .count();
            assert_eq!(lost_ok, 0, "seed {seed}: {n} -> {p}: {got} arrived");
        }
    }
}

/// As [`churn`], where sends may be refused (the endpoint failed).
fn churn_unchecked(net: &mut Net, k: usize) {
    for _ in 0..k {
        let _ = net.send_random(0, 1);
        let _ = net.send_random(1, 0);
        let n = net.rng.below(6);
        net.steps(n);
    }
}

/// Node 0's socket of the connection that carries the stream now: the one whose peer
/// end node 1's engine reads frames from (found as the socket a fresh message lands on).
fn first_carrying(net: &Net) -> usize {
    // The primary is the open socket that is not a standby: after a failover it is the
    // link promoted, so the oldest open socket may be either; the engine knows.
    let socks = net.open_socks(0);
    *socks
        .iter()
        .find(|&&s| {
            net.socks[s]
                .key
                .is_some_and(|k| net.nodes[0].core.is_primary(PeerId(1), k))
        })
        .expect("a primary socket")
}

#[test]
fn a_process_reading_with_multishot_takes_no_links_and_is_asked_once() {
    for seed in 0..20 {
        let mut c1 = cfg(1);
        c1.multishot = true;
        let mut net = Net::new(seed, vec![cfg(0), c1]);
        plan(&mut net, 0, 1, 2);
        connect_pair(&mut net);
        traffic_both_ways(&mut net, 5);
        assert_eq!(net.core(0).links_open(PeerId(1)), 1, "seed {seed}");
        assert_eq!(
            net.core(1).counters().refused,
            2,
            "seed {seed}: both joins refused"
        );
        // One attempt per link, none after the refusal (drive ran every timer).
        assert_eq!(net.nodes[0].dials.len(), 3, "seed {seed}");
        assert_eq!(net.core(0).counters().links_lost, 0, "seed {seed}");
    }
}

/// A peer that reads every frame and confirms none cannot make the kept frames grow: they
/// count against `max_queued_bytes` as queued ones do, sends then return would-block; its
/// CONFIRM at last completes them all, and the count goes back to zero.
#[test]
fn kept_frames_count_against_the_queue_cap() {
    let cap = 1u64 << 20;
    let mut c0 = cfg(0);
    c0.max_queued_bytes = cap;
    let mut net = Net::new(7, vec![c0, cfg(1)]);
    let first = raw_peer_with_link(&mut net);
    let mut frames_read = 0u64;
    let (mut accepted, mut blocked) = (0u64, 0u64);
    for i in 0..400 {
        // Kept by reference: each send waits for its confirmation.
        let len = crate::wire::KEEP_COPY_MAX + 1 + net.rng.below(50_000);
        match net.send(0, 1, 2, vec![i as u8; len]) {
            Ok(_) => accepted += 1,
            Err(SendError::WouldBlock(_)) => blocked += 1,
            Err(e) => panic!("{e:?}"),
        }
        net.run(false);
        // The peer reads everything, and confirms nothing.
        let bytes = net.raw_read(first);
        frames_read += frames(&bytes)
            .iter()
            .filter(|(h, _)| h.kind.counted())
            .count() as u64;
        let ep = net.core(0).ep(PeerId(1)).unwrap();
        assert!(
            ep.queued_bytes <= cap + 51_000,
            "{} queued",
            ep.queued_bytes
        );
        let kept: u64 = ep
            .fo
            .kept
            .iter()
            .filter(|f| f.cookie.is_some())
            .map(|f| f.wire_len() as u64)
            .sum();
        let queued: u64 = ep
            .queue
            .iter()
            .filter(|f| f.cookie.is_some())
            .map(|f| f.wire_len() as u64)
            .sum();
        assert_eq!(kept + queued, ep.queued_bytes, "accounting");
    }
    assert!(
        blocked > 300 && accepted > 10,
        "{accepted} accepted, {blocked} blocked"
    );
    // Nothing completed: every accepted send waits for its confirmation.
    assert_eq!(net.core(0).pending(PeerId(1)) as u64, accepted);
    // The CONFIRM of everything read: every accepted send completes, the count drains.
    let confirm = crate::proto::failover::count_frame(FrameKind::Confirm, frames_read);
    net.raw_write(first, &confirm);
    net.run(false);
    let done = net.completions(0);
    assert_eq!(done.len() as u64, accepted, "all completed");
    assert!(done.values().all(Result::is_ok));
    assert_eq!(net.core(0).ep(PeerId(1)).unwrap().queued_bytes, 0);
}

/// A CONFIRM beyond what was sent, and a RESUME on the primary, are protocol errors: the
/// endpoint fails with the reason, nothing else happens.
#[test]
fn a_count_that_makes_no_sense_fails_the_endpoint() {
    use crate::proto::failover::count_frame;
    // An answer to a RESUME never written.
    let resume = crate::wire::ResumeFrame {
        count: 0,
        epoch: 1,
        asks: false,
    };
    let bad_flag = {
        let mut b = resume.to_bytes();
        b[b.len() - 1] = 2;
        b
    };
    for (frame, why) in [
        (
            count_frame(FrameKind::Confirm, 1000).to_vec(),
            ProtoError::CountBeyondSent,
        ),
        (resume.to_bytes().to_vec(), ProtoError::UnexpectedResume),
        (
            bad_flag.to_vec(),
            ProtoError::Wire(WireError::BadCount { len: 16, tag: 0 }),
        ),
    ] {
        let mut net = Net::new(9, vec![cfg(0), cfg(1)]);
        let first = confirmed_raw_peer(&mut net);
        let r = net.raw_dial(0);
        net.raw_hello_link(r, 1, 1);
        assert_eq!(
            net.raw_auth_link(r, 1, 1).map(|h| h.kind),
            Some(HelloKind::Accept)
        );
        net.raw_write(first, &frame);
        net.run(false);
        let failed = net.failed_events(0);
        assert_eq!(failed.len(), 1, "{why:?}");
        assert_eq!(
            failed[0].1,
            FailReason::Protocol {
                peer: PeerId(1),
                err: why.clone()
            }
        );
        assert!(
            net.raw_eof(first) && net.raw_eof(r),
            "{why:?}: both connections closed"
        );
    }
}

/// Gets of several sizes (1 B to 70,001 B, in a readable region of node 1) into a region
/// of node 0, with messages the other way, while the primary breaks: the REPLYs the peer
/// kept go again on the link, and each get completes once, without error, with its bytes
/// in place; nothing else is lost or repeated.
#[test]
fn gets_across_a_failover_complete_once_with_their_bytes() {
    use crate::buf::Access;
    use crate::wire::PutTarget;
    use std::ptr::NonNull;
    const SIZES: [usize; 4] = [1, 777, 3000, 70_001];
    const GETS: usize = 12;
    const BASE: u64 = 1 << 40;
    let slot = SIZES.iter().max().copied().unwrap_or(0);
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        let mut src: Box<[u8]> = (0..slot * GETS + 8)
            .map(|i| (i * 7 + i / 251 + seed as usize) as u8)
            .collect();
        let mut dst = vec![0u8; slot * GETS].into_boxed_slice();
        let (src_at, dst_at) = (src.as_ptr() as u64, dst.as_ptr() as u64);
        // SAFETY: `src` and `dst` outlive `net` (dropped first below), and nothing reads or
        // writes them while it lives but the engines' gets.
        #[allow(unsafe_code)]
        let (sk, dk) = unsafe {
            let s = NonNull::new(src.as_mut_ptr()).expect("boxed");
            let d = NonNull::new(dst.as_mut_ptr()).expect("boxed");
            (
                net.core(1)
                    .regions_mut()
                    .register(s, src.len(), Access::Read),
                net.core(0)
                    .regions_mut()
                    .register(d, dst.len(), Access::Local),
            )
        };
        let primary = net.open_socks(0)[0];
        let mut want = vec![0u8; slot * GETS];
        for i in 0..GETS {
            let len = SIZES[i % SIZES.len()];
            let (from, to) = (i * slot + i % 5, i * slot);
            want[to..to + len].copy_from_slice(&src[from..from + len]);
            let f = PutTarget {
                key: sk,
                addr: src_at + from as u64,
            };
            let t = PutTarget {
                key: dk,
                addr: dst_at + to as u64,
            };
            net.core(0)
                .get(PeerId(1), f, len as u32, t, BASE + i as u64)
                .unwrap();
            net.send_random(1, 0).unwrap();
            if i == GETS / 2 {
                break_conn(&mut net, primary);
            }
            let n = net.rng.below(6);
            net.steps(n);
        }
        net.drive();
        let mut done: Vec<u64> = Vec::new();
        for e in &net.nodes[0].events {
            if let CoreEvent::Completed { cookie, result, .. } = e {
                assert!(result.is_ok(), "seed {seed}: {cookie}: {result:?}");
                if *cookie >= BASE {
                    done.push(*cookie);
                }
            }
        }
        let expect: Vec<u64> = (0..GETS as u64).map(|i| BASE + i).collect();
        assert_eq!(done, expect, "seed {seed}: each get once, in order");
        net.assert_all_delivered(1, 0);
        assert!(
            net.failed_events(0).is_empty() && net.failed_events(1).is_empty(),
            "seed {seed}"
        );
        assert_eq!(net.core(0).pending(PeerId(1)), 0, "seed {seed}");
        let moved = net.core(0).counters().failovers + net.core(1).counters().failovers;
        assert!(moved >= 2, "seed {seed}: both sides moved ({moved})");
        drop(net);
        let diff = dst.iter().zip(&want).position(|(x, y)| x != y);
        assert_eq!(diff, None, "seed {seed}: node 0's region");
    }
}

/// Node 1 listening on a second address too, and node 0's link to it: the first
/// connection goes to node 1's first address, the link to `second`.
fn two_routes(net: &mut Net) -> SocketAddr {
    let second = SocketAddr::from(([10, 0, 1, 2], 7000));
    net.listeners.insert(second, Listener::Node(1));
    net.core(0).set_link_routes(PeerId(1), vec![(second, None)]);
    second
}

/// Each failed primary's own route is dialed again: after the first failover the first
/// address (the first connection's), after the second the second address (the link's
/// that had become the primary), not the first one twice.
#[test]
fn each_failed_primarys_own_route_is_dialed_again() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        let second = two_routes(&mut net);
        connect_pair(&mut net);
        assert_eq!(net.core(0).links_open(PeerId(1)), 2, "seed {seed}");
        for (round, lost) in [(0, addr(1)), (1, second)] {
            let primary = first_carrying(&net);
            let dials = net.nodes[0].dials.len();
            churn(&mut net, 5);
            break_conn(&mut net, primary);
            churn(&mut net, 5);
            net.drive();
            net.assert_all_delivered(0, 1);
            net.assert_all_delivered(1, 0);
            let again: Vec<SocketAddr> = net.nodes[0].dials[dials..]
                .iter()
                .map(|&(_, a)| a)
                .collect();
            assert!(
                !again.is_empty() && again.iter().all(|&a| a == lost),
                "seed {seed}: round {round}: dialed {again:?} after losing {lost}"
            );
            assert_eq!(
                net.core(0).links_open(PeerId(1)),
                2,
                "seed {seed}: round {round}"
            );
        }
        assert!(
            net.failed_events(0).is_empty() && net.failed_events(1).is_empty(),
            "seed {seed}"
        );
    }
}

/// With a standby link open, a send of at most `KEEP_COPY_MAX` bytes completes at its
/// write and stays kept, as a copy, until confirmed; a longer one completes at its
/// confirmation, and the short ones behind it with it. The peer's CONFIRMs drain both.
#[test]
fn a_short_send_completes_at_its_write_and_stays_kept() {
    let mut net = Net::new(3, vec![cfg(0), cfg(1)]);
    let first = raw_peer_with_link(&mut net);
    let _ = net.raw_read(first);
    let max = crate::wire::KEEP_COPY_MAX;
    let mut cookies = Vec::new();
    for len in [8, 100, max, max + 1, 8, 3000] {
        cookies.push(net.send(0, 1, 2, vec![len as u8; len]).unwrap());
        net.run(false);
    }
    // The first three at their write; the fourth waits, and so do those behind it.
    let done = net.completed_ok(0);
    assert_eq!(done, cookies[..3]);
    let ep = net.core(0).ep(PeerId(1)).unwrap();
    assert_eq!(ep.fo.kept.len(), 6, "every frame kept until confirmed");
    assert_eq!(ep.fo.kept_borrowed, 1);
    // The frames arrived whole, in order, the copied ones as sent.
    let bytes = net.raw_read(first);
    let got = frames(&bytes);
    let lens: Vec<usize> = got
        .iter()
        .filter(|(h, _)| h.kind == FrameKind::Send)
        .map(|(h, _)| h.len as usize - h.pad())
        .collect();
    assert_eq!(lens, [8, 100, max, max + 1, 8, 3000]);
    // The count of the first four: the fourth completes, and the two copies behind it.
    let confirm = crate::proto::failover::count_frame(FrameKind::Confirm, 4);
    net.raw_write(first, &confirm);
    net.run(false);
    let done = net.completions(0);
    assert_eq!(done.len(), 6);
    assert!(done.values().all(Result::is_ok));
    let ep = net.core(0).ep(PeerId(1)).unwrap();
    assert_eq!((ep.fo.kept.len(), ep.fo.kept_borrowed), (2, 0));
    net.raw_write(
        first,
        &crate::proto::failover::count_frame(FrameKind::Confirm, 6),
    );
    net.run(false);
    let ep = net.core(0).ep(PeerId(1)).unwrap();
    assert_eq!((ep.fo.kept.len(), ep.queued_bytes), (0, 0));
}

/// A ping-pong of short messages with a standby link open writes one batch per message
/// on each side: the count of what a side read goes with its answer, not in a write of
/// its own. Once the exchange stops, the counts owed leave within `CONFIRM_LAZY` and
/// nothing stays kept.
#[test]
fn a_ping_pong_with_a_standby_link_writes_one_batch_per_message() {
    for seed in 0..20 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        net.drive();
        assert_eq!(net.core(0).links_open(PeerId(1)), 2, "seed {seed}");
        let before = [0, 1].map(|n| net.core(n).counters().batches);
        let rounds = 50;
        for i in 0..rounds {
            let len = [8, 64, 1000, 4000][i % 4];
            net.send(0, 1, 1, vec![1; len]).unwrap();
            net.run(false);
            net.send(1, 0, 1, vec![2; len]).unwrap();
            net.run(false);
        }
        for (n, b) in before.into_iter().enumerate() {
            let batches = net.core(n).counters().batches - b;
            assert!(
                batches <= rounds as u64 + 2,
                "seed {seed}: node {n}: {batches} batches for {rounds} messages"
            );
        }
        // The last count owed leaves by its deadline: nothing waits after it.
        net.offset += crate::proto::failover::CONFIRM_LAZY;
        net.fire_due_timers();
        net.run(false);
        for (n, p) in [(0, 1), (1, 0)] {
            net.assert_all_delivered(n, p);
            assert!(
                net.completions(n).values().all(Result::is_ok),
                "seed {seed}"
            );
            let ep = net.core(n).ep(PeerId(p as u32)).unwrap();
            assert_eq!(
                (ep.fo.kept.len(), ep.inflight.len()),
                (0, 0),
                "seed {seed}: node {n}"
            );
        }
    }
}

/// Node 0 and a confirmed raw peer (its first connection, returned) that joined link 1:
/// node 0 then keeps and confirms as with a standby link.
fn raw_peer_with_link(net: &mut Net) -> usize {
    raw_peer_and_link(net).0
}

/// [`raw_peer_with_link`], and the raw end of its link.
fn raw_peer_and_link(net: &mut Net) -> (usize, usize) {
    let first = confirmed_raw_peer(net);
    let r = net.raw_dial(0);
    net.raw_hello_link(r, 1, 1);
    let ans = net.raw_auth_link(r, 1, 1).expect("an answer to the join");
    assert_eq!(ans.kind, HelloKind::Accept);
    net.run(false);
    (first, r)
}

/// Both still connected, nothing failed, every message arrived once and in order both
/// ways, every send completed without error.
fn all_arrived(net: &Net, seed: u64) {
    for (n, p) in [(0, 1), (1, 0)] {
        assert!(connected(net, n, p), "seed {seed}: node {n}");
        assert!(net.failed_events(n).is_empty(), "seed {seed}: node {n}");
    }
    net.assert_all_delivered(0, 1);
    net.assert_all_delivered(1, 0);
    for n in 0..2 {
        assert!(
            net.completions(n).values().all(Result::is_ok),
            "seed {seed}: node {n}"
        );
    }
}

/// Node 1's sockets, but for its end of the primary.
fn links_of_node_1(net: &Net) -> Vec<usize> {
    net.open_socks(1)
        .into_iter()
        .filter(|&s| {
            net.socks[s]
                .key
                .is_some_and(|k| !net.nodes[1].core.is_primary(PeerId(0), k))
        })
        .collect()
}

/// With links open, a stream whose primary is busy goes in runs over every link: each
/// link carries frames, and every message arrives once, in order, both ways.
#[test]
fn a_stream_spreads_over_the_links_in_order() {
    let mut carried = [0usize; 2];
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 2);
        connect_pair(&mut net);
        assert_eq!(net.core(0).links_open(PeerId(1)), 3, "seed {seed}");
        let before: Vec<usize> = links_of_node_1(&net)
            .iter()
            .map(|&s| net.socks[s].read_bytes)
            .collect();
        churn(&mut net, 40);
        net.drive();
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        for n in 0..2 {
            assert!(
                net.completions(n).values().all(Result::is_ok),
                "seed {seed}: node {n}"
            );
            let c = net.core(n).counters();
            assert_eq!(c.spread_streams, 1, "seed {seed}: node {n}");
            assert!(c.run_frames_in > 0, "seed {seed}: node {n}: {c:?}");
            assert_eq!(c.failovers, 0, "seed {seed}: node {n}: {c:?}");
        }
        assert_eq!(net.core(0).pending(PeerId(1)), 0, "seed {seed}");
        for (i, s) in links_of_node_1(&net).into_iter().enumerate() {
            carried[i] += usize::from(net.socks[s].read_bytes > before[i]);
        }
    }
    // Each link carried frames in most runs (a seed's timing may leave one idle).
    assert!(carried.iter().all(|&c| c >= 50), "{carried:?}");
}

/// Frames of a run are taken only when the stream reaches its offset: a run read first
/// on the primary waits for the run before it on the link.
#[test]
fn a_run_waits_for_the_run_before_it_on_another_link() {
    let mut net = Net::pair(5);
    let (first, link) = raw_peer_and_link(&mut net);
    // Frame 0 ("hi") was consumed outside runs.
    let mut later = run_head(3, 1).to_vec();
    later.extend(frame(FrameKind::Send, 3, b"c"));
    net.raw_write(first, &later);
    net.run(false);
    assert_eq!(net.received(0, 1), [(9, b"hi".to_vec())]);
    the_run_before(&mut net, link, &[(3, b"c".to_vec())]);
}

/// Writes, on `link`, the run of frames 1 and 2 ("a", "b") the tests above hold a later
/// run for; then every message has come in order, `later` after them.
fn the_run_before(net: &mut Net, link: usize, later: &[Msg]) {
    let mut earlier = run_head(1, 2).to_vec();
    earlier.extend(frame(FrameKind::Send, 1, b"a"));
    earlier.extend(frame(FrameKind::Send, 2, b"b"));
    net.raw_write(link, &earlier);
    net.run(false);
    let mut want = vec![(9, b"hi".to_vec()), (1, b"a".to_vec()), (2, b"b".to_vec())];
    want.extend_from_slice(later);
    assert_eq!(net.received(0, 1), want);
    assert!(net.failed_events(0).is_empty());
}

/// The first frame of a run further in the stream than the position is read ahead,
/// whole, when it is larger than the receive cache (its sender does not wait for the
/// reader to come to it), and handed out only in its turn.
#[test]
fn a_held_run_reads_its_large_first_frame_ahead() {
    let mut net = Net::pair(11);
    let (first, link) = raw_peer_and_link(&mut net);
    let big: Vec<u8> = (0..200_003).map(|i| (i % 253) as u8).collect();
    let mut later = run_head(3, 2).to_vec();
    later.extend(frame(FrameKind::Send, 3, &big));
    later.extend(frame(FrameKind::Send, 4, b"d"));
    net.raw_write(first, &later);
    net.run(false);
    let end = net.socks[first].other.expect("the node's end");
    assert_eq!(net.received(0, 1), [(9, b"hi".to_vec())]);
    // Read up to the end of the large frame; the small one behind it may wait.
    assert!(
        net.socks[end].read_bytes >= later.len() - crate::wire::HEADER_LEN - 1,
        "read {} of {}",
        net.socks[end].read_bytes,
        later.len()
    );
    assert_eq!(net.core(0).counters().read_ahead, 1);
    the_run_before(&mut net, link, &[(3, big), (4, b"d".to_vec())]);
}

/// A held run whose first frame is a PUT is not read past its header: its data is
/// placed only in its turn, after the frames before it.
#[test]
fn a_held_run_places_no_put_ahead_of_its_turn() {
    use crate::wire::PutTarget;
    const LEN: usize = 150_000;
    let mut net = Net::pair(12);
    let (first, link) = raw_peer_and_link(&mut net);
    let (dst, key, at) = region_on(&mut net, 0, LEN);
    let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 | 1).collect();
    let mut put = PutTarget { key, addr: at }.to_bytes().to_vec();
    put.extend_from_slice(&data);
    let mut later = run_head(3, 1).to_vec();
    later.extend(frame(FrameKind::Put, 0, &put));
    net.raw_write(first, &later);
    net.run(false);
    let end = net.socks[first].other.expect("the node's end");
    assert!(
        net.socks[end].read_bytes < later.len() - LEN / 2,
        "read {} of {}",
        net.socks[end].read_bytes,
        later.len()
    );
    assert!(dst.iter().all(|&b| b == 0), "placed ahead of its turn");
    assert_eq!(net.core(0).counters().read_ahead, 0);
    the_run_before(&mut net, link, &[]);
    assert_eq!(net.core(0).counters().puts_placed, 1);
    drop(net);
    assert!(dst[..] == data[..], "region");
}

/// A RUN frame's bytes: `len` frames from `offset` of epoch 0.
fn run_head(offset: u64, len: u32) -> [u8; crate::wire::HEADER_LEN + crate::wire::RUN_LEN] {
    crate::wire::RunFrame {
        offset,
        epoch: 0,
        len,
    }
    .to_bytes()
}

/// A RUN may come before the receiver saw the link beside it open (the acceptor of a
/// link spreads once it answered the join): it is taken in order all the same.
#[test]
fn a_run_before_a_link_is_open_is_taken_in_order() {
    let mut net = Net::pair(7);
    let first = confirmed_raw_peer(&mut net);
    let mut bytes = crate::wire::RunFrame {
        offset: 1,
        epoch: 0,
        len: 2,
    }
    .to_bytes()
    .to_vec();
    bytes.extend(frame(FrameKind::Send, 1, b"a"));
    bytes.extend(frame(FrameKind::Send, 2, b"b"));
    net.raw_write(first, &bytes);
    net.run(false);
    assert_eq!(
        net.received(0, 1),
        [(9, b"hi".to_vec()), (1, b"a".to_vec()), (2, b"b".to_vec())]
    );
    assert!(net.failed_events(0).is_empty());
}

/// A run that overlaps another link's, or starts before the stream's position, fails
/// the endpoint: no honest sender writes it.
#[test]
fn a_run_out_of_order_fails_the_endpoint() {
    for (first_run, link_run) in [((2, 2), (3, 1)), ((0, 1), (5, 1))] {
        let mut net = Net::pair(6);
        let (first, link) = raw_peer_and_link(&mut net);
        let run = |(offset, len): (u64, u32)| {
            crate::wire::RunFrame {
                offset,
                epoch: 0,
                len,
            }
            .to_bytes()
        };
        net.raw_write(link, &run(link_run));
        net.run(false);
        net.raw_write(first, &run(first_run));
        net.run(false);
        let failed = net.failed_events(0);
        assert_eq!(failed.len(), 1, "{first_run:?} {link_run:?}");
        let err = ProtoError::RunOutOfOrder;
        let peer = PeerId(1);
        assert_eq!(failed[0].1, FailReason::Protocol { peer, err });
    }
}

/// A link that carried runs breaks (not the primary): the side that sees it asks for a
/// RESUME on the primary, each side sends again what the other did not consume, and
/// nothing is lost, duplicated or reordered.
#[test]
fn a_link_that_carried_runs_breaks_and_nothing_is_lost() {
    let mut resumed = 0;
    for seed in 0..150 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 2);
        connect_pair(&mut net);
        churn(&mut net, 10);
        let links = links_of_node_1(&net);
        let victim = links[net.rng.below(links.len())];
        break_conn(&mut net, victim);
        churn(&mut net, 10);
        net.drive();
        all_arrived(&net, seed);
        assert_eq!(net.core(0).pending(PeerId(1)), 0, "seed {seed}");
        assert_eq!(net.core(1).pending(PeerId(0)), 0, "seed {seed}");
        resumed +=
            usize::from(net.core(0).counters().failovers + net.core(1).counters().failovers > 0);
        // The link is dialed again and used again.
        assert_eq!(net.core(0).links_open(PeerId(1)), 3, "seed {seed}");
    }
    assert!(
        resumed >= 75,
        "a RESUME followed most breaks ({resumed} of 150)"
    );
}

/// A link that carried runs goes silent (an interface down): the probes of every link
/// find it, and the stream resumes without it.
#[test]
fn a_link_cut_without_a_word_is_found_by_its_probes() {
    let mut found = 0;
    for seed in 0..150 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        churn(&mut net, 10);
        let link = links_of_node_1(&net)[0];
        cut_conn(&mut net, link);
        churn(&mut net, 10);
        net.drive();
        all_arrived(&net, seed);
        found += usize::from(net.core(0).counters().stalls + net.core(1).counters().stalls > 0);
    }
    assert!(found >= 75, "found by a probe in {found} of 150 runs");
}

/// Large messages back and forth with a link open, some behind a short one: each arrives
/// and every send completes without any timer (no count waits for the lazy deadline).
#[test]
fn large_messages_both_ways_need_no_timer_with_a_link() {
    for seed in 0..20 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        for i in 0..30 {
            let (a, b) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            net.send(a, b as u32, 1, vec![i as u8; 262144]).unwrap();
            if i % 3 == 0 {
                net.send(a, b as u32, 1, vec![i as u8; 300]).unwrap();
                net.send(a, b as u32, 1, vec![i as u8; 100000]).unwrap();
            }
            net.run(false);
            let got = net.received(b, a).len();
            let sent = net.sent(a, b).len();
            assert_eq!(got, sent, "seed {seed} round {i}: {a}->{b}");
        }
        for n in 0..2 {
            let pending = net.core(n).pending(PeerId(1 - n as u32));
            assert_eq!(pending, 0, "seed {seed}: node {n} pending without timers");
        }
    }
}

/// A region of `len` zero bytes registered for writing with node 1's engine: the
/// buffer (to be dropped after `net`), its key and its address.
fn region(net: &mut Net, len: usize) -> (Box<[u8]>, u64, u64) {
    region_on(net, 1, len)
}

/// [`region`] of node `n`.
fn region_on(net: &mut Net, n: usize, len: usize) -> (Box<[u8]>, u64, u64) {
    let mut dst = vec![0u8; len].into_boxed_slice();
    let at = dst.as_ptr() as u64;
    // SAFETY: the caller drops `dst` after `net`, and nothing reads or writes it while
    // `net` lives but node 1's engine placing puts.
    #[allow(unsafe_code)]
    let key = unsafe {
        let d = std::ptr::NonNull::new(dst.as_mut_ptr()).expect("boxed");
        net.core(n)
            .regions_mut()
            .register(d, len, crate::buf::Access::Write)
    };
    (dst, key, at)
}

/// Puts of 256 KiB, each followed by a message, with a link open: they spread, land in
/// the region, and complete without any timer, in rounds.
#[test]
fn puts_over_links_land_and_complete_without_timers() {
    use crate::wire::PutTarget;
    use bytes::Bytes;
    const CHUNK: usize = 262_144;
    const N: usize = 8;
    for seed in 0..20 {
        let mut net = Net::pair(seed);
        plan(&mut net, 0, 1, 1);
        connect_pair(&mut net);
        let (dst, key, dst_at) = region(&mut net, CHUNK * N);
        let src: Vec<u8> = (0..CHUNK * N)
            .map(|i| (i * 13 + seed as usize) as u8)
            .collect();
        let base = net.nodes[1]
            .got
            .iter()
            .filter(|(p, _, _)| *p == PeerId(0))
            .count();
        for round in 0..3 {
            for i in 0..N {
                let seg = Bytes::copy_from_slice(&src[i * CHUNK..(i + 1) * CHUNK]);
                let target = PutTarget {
                    key,
                    addr: dst_at + (i * CHUNK) as u64,
                };
                net.core(0)
                    .put(PeerId(1), target, &[seg], 1000 + (round * N + i) as u64)
                    .unwrap();
                net.send(0, 1, 3, vec![i as u8; 8]).unwrap();
                let k = net.rng.below(4);
                net.steps(k);
            }
            net.run(false);
            let puts = net.nodes[0]
                .events
                .iter()
                .filter(|e| matches!(e, CoreEvent::Completed { cookie, result: Ok(()), .. } if (1000..2000).contains(cookie)))
                .count();
            assert_eq!(
                puts,
                (round + 1) * N,
                "seed {seed} round {round}: puts completed without timers"
            );
            let got = net.nodes[1]
                .got
                .iter()
                .filter(|(p, _, _)| *p == PeerId(0))
                .count();
            assert_eq!(got, base + (round + 1) * N, "seed {seed}");
        }
        drop(net);
        assert!(dst[..] == src[..], "seed {seed}: region");
    }
}

/// A put larger than a piece, from segments of odd sizes, with a link open: it goes as
/// several PUT frames that spread over both connections, lands whole in the region, and
/// completes exactly once, before the message sent after it arrives. In half the seeds
/// the link breaks while the pieces are in flight: nothing is lost or placed twice.
/// [`pair_with_link`] whose frames may be 4 MiB.
fn big_pair_with_link(seed: u64) -> Net {
    let big = |pid| CoreConfig {
        max_frame: 4 << 20,
        ..cfg(pid)
    };
    let mut net = Net::new(seed, vec![big(0), big(1)]);
    plan(&mut net, 0, 1, 1);
    connect_pair(&mut net);
    net
}

#[test]
fn a_large_put_is_cut_into_pieces_that_spread_over_the_links() {
    use crate::proto::endpoint::PIECE;
    use crate::wire::PutTarget;
    use bytes::Bytes;
    const LEN: usize = 3 * PIECE + 5;
    const COOKIE: u64 = 7777;
    let mut on_link = 0;
    for seed in 0..40 {
        let mut net = big_pair_with_link(seed);
        let (dst, key, dst_at) = region(&mut net, LEN);
        let src: Vec<u8> = (0..LEN).map(|i| (i * 7 + seed as usize) as u8).collect();
        let src_b = Bytes::from(src.clone());
        let segs = [
            src_b.slice(..1_000_003),
            src_b.slice(1_000_003..3_000_000),
            src_b.slice(3_000_000..),
        ];
        let link = links_of_node_1(&net)[0];
        let before = net.socks[link].read_bytes;
        let target = PutTarget { key, addr: dst_at };
        net.core(0).put(PeerId(1), target, &segs, COOKIE).unwrap();
        net.send(0, 1, 3, vec![9; 8]).unwrap();
        let broke = seed % 2 == 1;
        if broke {
            let k = net.rng.below(8);
            net.steps(k);
            break_conn(&mut net, link);
        }
        net.drive();
        let done = net.count_events(0, |e| {
            matches!(
                e,
                CoreEvent::Completed {
                    cookie: COOKIE,
                    result: Ok(()),
                    ..
                }
            )
        });
        assert_eq!(done, 1, "seed {seed}: the put completed {done} times");
        for (n, p) in [(0, 1), (1, 0)] {
            assert!(connected(&net, n, p), "seed {seed}: node {n}");
            assert!(net.failed_events(n).is_empty(), "seed {seed}: node {n}");
        }
        net.assert_all_delivered(0, 1);
        assert_eq!(net.core(0).pending(PeerId(1)), 0, "seed {seed}");
        if !broke {
            on_link += usize::from(net.socks[link].read_bytes - before >= PIECE);
        }
        drop(net);
        assert!(dst[..] == src[..], "seed {seed}: region");
    }
    // The link carried at least a piece in most unbroken runs.
    assert!(
        on_link >= 15,
        "a piece went on the link in {on_link} of 20 runs"
    );
}

/// Messages larger than a piece, from segments of odd sizes, with a link open, among
/// small ones both ways: each goes as PART frames that spread over both connections, and
/// arrives whole, once, in order, handed out as one message; each send completes once.
/// In half the seeds a connection breaks while pieces are in flight (the stream moves,
/// the pieces are sent again): nothing is lost, duplicated or assembled wrong.
#[test]
fn a_large_message_is_cut_into_parts_that_spread_and_arrive_whole() {
    use crate::proto::endpoint::PIECE;
    let mut on_link = 0;
    for seed in 0..40 {
        let mut net = big_pair_with_link(seed);
        let link = links_of_node_1(&net)[0];
        let before = net.socks[link].read_bytes;
        let broke = seed % 2 == 1;
        for k in 0..3 {
            let len = [3 * PIECE + 5, PIECE + 1, 2 * PIECE - 3][k];
            let msg: Vec<u8> = (0..len)
                .map(|i| (i * 7 + k + seed as usize) as u8)
                .collect();
            net.send_segs(0, 1, 40 + k as u8, msg, 3).unwrap();
            net.send(0, 1, 3, vec![k as u8; 8]).unwrap();
            net.send_random(1, 0).unwrap();
            let n = net.rng.below(6);
            net.steps(n);
        }
        if broke {
            let k = net.rng.below(8);
            net.steps(k);
            let victim = if net.rng.chance(1, 2) {
                link
            } else {
                first_carrying(&net)
            };
            break_conn(&mut net, victim);
        }
        net.drive();
        all_arrived(&net, seed);
        let done = net.completed_ok(0).len();
        assert_eq!(done, net.sent(0, 1).len(), "seed {seed}: completions");
        assert_eq!(net.core(1).counters().parts_assembled, 3, "seed {seed}");
        assert_eq!(net.core(0).pending(PeerId(1)), 0, "seed {seed}");
        if !broke {
            on_link += usize::from(net.socks[link].read_bytes - before >= PIECE);
        }
    }
    // The link carried at least a piece in most unbroken runs.
    assert!(
        on_link >= 15,
        "a piece went on the link in {on_link} of 20 runs"
    );
}

/// A cut put is checked against the queue cap whole: behind another, it is refused
/// whole (nothing of it queued), and taken once the queue drained.
#[test]
fn a_cut_put_is_refused_or_taken_whole_at_the_queue_cap() {
    use crate::proto::endpoint::PIECE;
    use crate::wire::PutTarget;
    use bytes::Bytes;
    const LEN: usize = PIECE + PIECE / 2;
    let small = |pid| CoreConfig {
        max_frame: 4 << 20,
        max_queued_bytes: 2 << 20,
        ..cfg(pid)
    };
    let mut net = Net::new(3, vec![small(0), small(1)]);
    plan(&mut net, 0, 1, 1);
    connect_pair(&mut net);
    let (dst, key, at) = region(&mut net, 2 * LEN);
    let src: Vec<u8> = (0..2 * LEN).map(|i| (i % 251) as u8).collect();
    let seg = |k: usize| [Bytes::copy_from_slice(&src[k * LEN..(k + 1) * LEN])];
    let to = |k: usize| PutTarget {
        key,
        addr: at + (k * LEN) as u64,
    };
    let queue = |net: &mut Net| net.core(0).ep(PeerId(1)).map_or(0, |e| e.queue.len());
    let before = queue(&mut net);
    net.core(0).put(PeerId(1), to(0), &seg(0), 9001).unwrap();
    let queued = queue(&mut net);
    assert_eq!(queued, before + 2, "two pieces queued");
    let refused = net.core(0).put(PeerId(1), to(1), &seg(1), 9002);
    assert!(
        matches!(refused, Err(SendError::WouldBlock(_))),
        "{refused:?}"
    );
    assert_eq!(queue(&mut net), queued, "nothing of the refused put queued");
    assert_eq!(net.core(0).pending(PeerId(1)), 1);
    net.drive();
    net.core(0).put(PeerId(1), to(1), &seg(1), 9002).unwrap();
    net.drive();
    for c in [9001, 9002] {
        let done = net.count_events(
            0,
            |e| matches!(e, CoreEvent::Completed { cookie, result: Ok(()), .. } if *cookie == c),
        );
        assert_eq!(done, 1, "put {c} completed {done} times");
    }
    assert_eq!(net.core(0).pending(PeerId(1)), 0);
    drop(net);
    assert!(dst[..] == src[..], "region");
}
