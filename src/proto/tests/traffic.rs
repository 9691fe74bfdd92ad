//! Pair tests: random traffic at random splits, in both receive modes.

use super::*;

// ----- 2. random traffic, random splits ------------------------------------------------------

fn random_traffic(seed: u64, nodes: usize) -> Net {
    random_traffic_in(seed, nodes, false)
}

/// Random traffic between `nodes` nodes, receiving with one read per
/// [`Action::Receive`], or (`multishot`) with provided buffers of up to
/// [`PROVIDED_BUF`] bytes cut at random points.
fn random_traffic_in(seed: u64, nodes: usize, multishot: bool) -> Net {
    let mut cfgs: Vec<CoreConfig> = (0..nodes as u32).map(cfg).collect();
    let mut rng = Rng::new(seed ^ 0xabcd);
    for c in &mut cfgs {
        c.multishot = multishot;
        if seed.is_multiple_of(3) {
            c.recv_cache = 4096;
        }
        if rng.chance(1, 3) {
            c.coalesce_bytes = 1 + rng.below(16 * 1024);
            c.max_iov = 8 + rng.below(24);
        }
        if rng.chance(1, 3) {
            c.inline_limit = rng.below(4096);
        }
    }
    let mut net = Net::new(seed, cfgs);
    let bursts = 1 + net.rng.below(5);
    for _ in 0..bursts {
        for from in 0..nodes {
            for to in (0..nodes).filter(|&t| t != from) {
                let k = net.rng.below(12);
                for _ in 0..k {
                    net.send_random(from, to as u32).unwrap();
                }
            }
        }
        let k = net.rng.below(200);
        net.steps(k);
    }
    net.drive();
    net
}

#[test]
fn random_frames_both_ways_arrive_in_order_once() {
    for seed in 0..120 {
        check_random_pair(seed, random_traffic(seed, 2));
    }
}

/// The same with multishot receive: frames wholly inside a provided buffer are
/// delivered in place, cut ones reassembled, and large payloads either finished from
/// provided buffers or read straight into their buffer after a pause.
#[test]
fn multishot_random_frames_both_ways_arrive_in_order_once() {
    let mut direct = 0;
    for seed in 0..120 {
        let net = random_traffic_in(seed, 2, true);
        direct += net.nodes[0].core.counters().recv_direct;
        direct += net.nodes[1].core.counters().recv_direct;
        check_random_pair(seed, net);
    }
    assert!(direct > 0, "no large payload was ever read directly");
}

fn check_random_pair(seed: u64, net: Net) {
    for (a, b) in [(0, 1), (1, 0)] {
        net.assert_all_delivered(a, b);
        assert!(
            net.completions(a).values().all(Result::is_ok),
            "seed {seed}"
        );
        assert!(net.failed_events(a).is_empty(), "seed {seed}");
    }
    // Whatever the interleaving, one connection per pair survives (if any was needed).
    let (s0, s1) = (net.open_socks(0), net.open_socks(1));
    if net.nodes[0].sent.is_empty() && net.nodes[1].sent.is_empty() {
        assert!(
            s0.is_empty() && s1.is_empty(),
            "seed {seed}: a connection nobody needed"
        );
        return;
    }
    assert_eq!((s0.len(), s1.len()), (1, 1), "seed {seed}");
    assert_eq!(net.socks[s0[0]].other, Some(s1[0]), "seed {seed}");
}

/// Multishot receive and a payload far larger than the cache: the engine pauses the
/// multishot receive, reads the rest straight into the payload's buffer, then arms the
/// multishot receive again for the frames that follow.
#[test]
fn multishot_large_payload_is_read_straight_into_its_buffer() {
    for seed in 0..40 {
        let mut c = [cfg(0), cfg(1)];
        for c in &mut c {
            c.multishot = true;
        }
        let mut net = Net::new(seed, c.to_vec());
        connect_pair(&mut net);
        let big = net.rng.bytes(1 << 20);
        net.send(0, 1, 7, b"before".to_vec()).unwrap();
        net.send(0, 1, 8, big).unwrap();
        net.send(0, 1, 9, b"after".to_vec()).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
        assert!(
            net.completions(0).values().all(Result::is_ok),
            "seed {seed}"
        );
        assert_eq!(
            net.nodes[1].core.counters().recv_direct,
            1,
            "seed {seed}: the 1 MiB payload is read directly, once"
        );
        let s1 = net.open_socks(1);
        assert_eq!(s1.len(), 1, "seed {seed}");
        let sock = &net.socks[s1[0]];
        assert!(
            sock.provided && sock.rx.is_none() && !sock.pausing,
            "seed {seed}: multishot armed again after the direct read"
        );
        // Frames after it still arrive through provided buffers.
        net.send(0, 1, 10, b"later".to_vec()).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
    }
}

/// Multishot receive, and a payload larger than the cache that misses less than a cache's
/// worth once its start arrived: no pause, the provided buffers finish it.
#[test]
fn multishot_payload_just_above_the_cache_needs_no_pause() {
    for seed in 0..40 {
        let mut c = [cfg(0), cfg(1)];
        for c in &mut c {
            c.multishot = true;
            c.recv_cache = 4096;
        }
        let mut net = Net::new(seed, c.to_vec());
        net.knobs.split = false;
        connect_pair(&mut net);
        // Without split reads a provided buffer holds PROVIDED_BUF bytes: the header and
        // the first PROVIDED_BUF - 8 payload bytes; the rest is less than the cache.
        let p = net.rng.bytes(PROVIDED_BUF + 100);
        net.send(0, 1, 3, p).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
        assert_eq!(net.nodes[1].core.counters().recv_direct, 0, "seed {seed}");
    }
}

#[test]
fn three_nodes_all_to_all() {
    for seed in 0..40 {
        let net = random_traffic(seed, 3);
        for a in 0..3 {
            for b in (0..3).filter(|&b| b != a) {
                net.assert_all_delivered(a, b);
            }
            assert!(
                net.completions(a).values().all(Result::is_ok),
                "seed {seed}"
            );
            assert!(net.failed_events(a).is_empty(), "seed {seed}");
            let needed = (0..3)
                .filter(|&b| b != a)
                .filter(|&b| !net.sent(a, b).is_empty() || !net.sent(b, a).is_empty())
                .count();
            assert_eq!(
                net.open_socks(a).len(),
                needed,
                "seed {seed}: node {a}: one conn per peer"
            );
        }
    }
}
