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
