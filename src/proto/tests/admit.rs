//! Admission and connect deadlines: connections that have not finished their handshake
//! ("strangers") cannot lock a legitimate peer out, and a dialer whose connection is
//! closed during the handshake retries until its connect deadline.

use super::*;
use crate::error::Cause;
use crate::proto::endpoint::MAX_RETRY_DELAY;

/// A node with few half-open slots.
fn small(pid: u32, all: usize, per_source: usize) -> CoreConfig {
    CoreConfig {
        max_half_open: all,
        max_half_open_per_source: per_source,
        first_bytes_timeout: Duration::from_secs(1),
        ..cfg(pid)
    }
}

fn src(i: usize) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(
        192,
        168,
        (i / 250) as u8,
        (i % 250) as u8 + 1,
    ))
}

/// Connections that never send a byte hold every half-open slot of node 1 (and more keep
/// coming) while node 0 dials it: the newcomer is admitted, the oldest stranger is closed
/// instead, node 0's messages arrive, and the silent connections are closed at the
/// first-bytes deadline, well before the handshake deadline.
#[test]
fn a_peer_gets_in_while_silent_strangers_hold_every_slot() {
    for seed in 0..40 {
        let mut net = Net::new(seed, vec![small(0, 16, 16), small(1, 16, 16)]);
        let ctx = format!("seed {seed}");
        let mut flood: Vec<usize> = (0..16).map(|i| net.raw_dial_from(1, src(i))).collect();
        net.run(false);
        assert_eq!(net.core(1).counters().accept_overload, 0, "{ctx}");
        for _ in 0..5 {
            net.send_random(0, 1).unwrap();
        }
        // More strangers arrive during the peer's handshake.
        for i in 0..8 {
            flood.push(net.raw_dial_from(1, src(100 + i)));
            let k = net.rng.below(4);
            net.steps(k);
        }
        // Until every stranger is closed; then the rest.
        let mut closed_at = None;
        for _ in 0..1000 {
            net.run(false);
            if flood.iter().all(|&r| net.raw_eof(r)) {
                closed_at = Some(net.offset);
                break;
            }
            let Some(t) = net.nodes[1].core.poll_timeout() else {
                break;
            };
            net.offset = net.offset.max(t - net.base);
            net.fire_due_timers();
        }
        net.drive();
        net.assert_all_delivered(0, 1);
        assert!(net.completions(0).values().all(Result::is_ok), "{ctx}");
        assert!(net.failed_events(0).is_empty(), "{ctx}");
        let evicted = net.core(1).counters().accept_overload;
        assert!(evicted >= 8, "{ctx}: {evicted} evicted");
        let closed_at = closed_at.unwrap_or_else(|| panic!("{ctx}: a stranger lives on"));
        let silent = net.count_events(1, |e| {
            *e == CoreEvent::Refused {
                why: ProtoError::FirstBytesTimeout,
            }
        });
        let gone = net.count_events(1, |e| {
            *e == CoreEvent::Refused {
                why: ProtoError::Evicted,
            }
        });
        assert_eq!(silent + gone, flood.len(), "{ctx}");
        assert_eq!(gone as u64, evicted, "{ctx}");
        let c = small(1, 16, 16);
        assert!(
            closed_at >= c.first_bytes_timeout && closed_at < c.handshake_timeout,
            "{ctx}: strangers closed after {closed_at:?}"
        );
    }
}

/// One source cannot evict the strangers of another: past its own limit, a source's
/// newcomer closes that source's oldest stranger.
#[test]
fn a_source_over_its_limit_evicts_only_its_own() {
    for seed in 0..20 {
        let mut net = Net::new(seed, vec![cfg(0), small(1, 16, 4)]);
        let ctx = format!("seed {seed}");
        let other = net.raw_dial_from(1, src(1));
        net.run(false);
        let flood: Vec<usize> = (0..10).map(|_| net.raw_dial_from(1, src(2))).collect();
        net.run(false);
        assert!(
            !net.raw_eof(other),
            "{ctx}: another source's stranger was evicted"
        );
        let closed = flood.iter().filter(|&&r| net.raw_eof(r)).count();
        assert_eq!(closed, 6, "{ctx}");
        assert_eq!(net.core(1).counters().accept_overload, 6, "{ctx}");
    }
}

/// A stranger that sends nothing is closed at the first-bytes deadline; one that sends a
/// byte and then stalls, at the handshake deadline counted from its accept.
#[test]
fn first_bytes_then_handshake_deadline() {
    let mut c1 = cfg(1);
    c1.first_bytes_timeout = Duration::from_millis(300);
    c1.handshake_timeout = Duration::from_millis(2000);
    let mut net = Net::new(7, vec![cfg(0), c1.clone()]);
    net.knobs.jitter = false;
    let silent = net.raw_dial(1);
    let slow = net.raw_dial(1);
    net.run(false);
    net.raw_write(slow, &[0x52]);
    net.run(false);
    let step = |net: &mut Net| {
        let t = net.nodes[1]
            .core
            .poll_timeout()
            .expect("a deadline is armed");
        net.offset = t - net.base;
        net.fire_due_timers();
        net.run(false);
    };
    step(&mut net);
    assert_eq!(net.offset, c1.first_bytes_timeout);
    assert!(net.raw_eof(silent) && !net.raw_eof(slow));
    step(&mut net);
    assert_eq!(net.offset, c1.handshake_timeout);
    assert!(net.raw_eof(slow));
    let why = |e: &CoreEvent| match e {
        CoreEvent::Refused { why } => Some(why.clone()),
        _ => None,
    };
    let seen: Vec<ProtoError> = net.nodes[1].events.iter().filter_map(why).collect();
    assert_eq!(
        seen,
        [ProtoError::FirstBytesTimeout, ProtoError::HandshakeTimeout]
    );
}

/// An acceptor that closes every connection before answering (as a flooded acceptor
/// closes its oldest strangers): the dialer retries past `connect_retries`, with a delay
/// that doubles up to [`MAX_RETRY_DELAY`], until the connect deadline; then the endpoint
/// fails once and every queued send completes once with the error.
#[test]
fn closed_during_handshake_is_retried_until_the_connect_deadline() {
    let mut c0 = cfg(0);
    c0.connect_timeout = Duration::from_secs(4);
    let mut net = Net::new(11, vec![c0.clone(), cfg(1)]);
    net.knobs.jitter = false;
    net.listeners.insert(addr(1), Listener::Raw);
    let cookies: Vec<u64> = (0..3).map(|_| net.send_random(0, 1).unwrap()).collect();
    let mut dial_times = Vec::new();
    let mut closed = 0;
    for _ in 0..1000 {
        net.run(false);
        while dial_times.len() < net.nodes[0].dials.len() {
            dial_times.push(net.offset);
        }
        for &r in &net.raw_accepted[closed..].to_vec() {
            net.raw_close(r);
        }
        closed = net.raw_accepted.len();
        net.run(false);
        let Some(t) = net.nodes[0].core.poll_timeout() else {
            break;
        };
        net.offset = net.offset.max(t - net.base);
        net.fire_due_timers();
    }
    let dials = dial_times.len();
    assert!(
        dials > c0.connect_retries as usize,
        "{dials} attempts: gave up after the retry count"
    );
    // The delays double from retry_delay, capped; the last attempt starts within the
    // deadline (counted from the first failure, at the first dial's time here).
    for (i, w) in dial_times.windows(2).enumerate() {
        let want = (c0.retry_delay * (1 << i.min(10))).min(MAX_RETRY_DELAY);
        assert_eq!(w[1] - w[0], want, "delay before attempt {}", i + 2);
    }
    assert!(*dial_times.last().unwrap() <= c0.connect_timeout);
    let failed = net.failed_events(0);
    assert_eq!(failed.len(), 1);
    assert!(
        matches!(
            &failed[0].1,
            FailReason::ConnectFailed { attempts, cause: Cause::ClosedInHandshake, .. }
                if *attempts as usize == dials
        ),
        "{:?}",
        failed[0].1
    );
    let done = net.completions(0);
    assert_eq!(done.len(), cookies.len());
    assert!(done
        .values()
        .all(|r| matches!(r, Err(FailReason::ConnectFailed { .. }))));
    assert_eq!(
        net.send(0, 1, 0, vec![]),
        Err(SendError::Unreachable(PeerId(1)))
    );
}

/// A frame whose bytes stop arriving fails its connection after `frame_stall` (a clear
/// cause, every send completes once); one whose bytes keep coming, however slowly, does
/// not.
#[test]
fn a_stalled_frame_fails_its_connection() {
    for trickle in [false, true] {
        let mut net = Net::pair(21);
        net.knobs.jitter = false;
        let stall = cfg(0).frame_stall;
        let r = raw_peer(&mut net, 1);
        let payload = vec![7u8; 200_000];
        let f = frame(FrameKind::Send, 1, &payload);
        net.raw_write(r, &f[..1000]);
        net.run(false);
        let mut at = 1000;
        if trickle {
            // A byte every half deadline, then the rest: the frame arrives.
            for _ in 0..5 {
                net.offset += stall / 2;
                net.fire_due_timers();
                net.raw_write(r, &f[at..at + 1]);
                at += 1;
                net.run(false);
            }
            net.raw_write(r, &f[at..]);
            net.drive();
            assert_eq!(net.received(0, 1).len(), 1);
            assert!(net.failed_events(0).is_empty());
            continue;
        }
        let last = net.offset;
        net.drive();
        let failed = net.failed_events(0);
        assert_eq!(failed.len(), 1);
        assert!(
            matches!(
                &failed[0].1,
                FailReason::ConnectionLost { cause: Cause::FrameStalled(d), .. } if *d == stall
            ),
            "{:?}",
            failed[0].1
        );
        assert_eq!(net.offset - last, stall);
        assert!(net.raw_eof(r));
        assert!(net.received(0, 1).is_empty());
    }
}

/// A peer that stops reading: once `max_queued_bytes` wait for it, a send returns
/// would-block and is not accepted (no completion); the queue stays within the cap; once
/// the peer reads again, every accepted message arrives in order and completes once, and
/// sending works again.
#[test]
fn a_peer_that_stops_reading_cannot_grow_the_queue() {
    for seed in 0..20 {
        let cap = 1u64 << 20;
        let mut c0 = cfg(0);
        c0.max_queued_bytes = cap;
        let mut net = Net::new(seed, vec![c0, cfg(1)]);
        let ctx = format!("seed {seed}");
        connect_pair(&mut net);
        net.knobs.stall = Some(0);
        let (mut accepted, mut blocked) = (0, 0);
        for i in 0..200 {
            let len = 1000 + net.rng.below(100_000);
            match net.send(0, 1, 2, vec![i as u8; len]) {
                Ok(_) => accepted += 1,
                Err(SendError::WouldBlock(p)) => {
                    assert_eq!(p, PeerId(1), "{ctx}");
                    blocked += 1;
                }
                Err(e) => panic!("{ctx}: {e:?}"),
            }
            net.run(false);
            let ep = net.core(0).ep(PeerId(1)).unwrap();
            assert!(ep.queued_bytes <= cap, "{ctx}: {} queued", ep.queued_bytes);
            let sum: u64 = ep
                .queue
                .iter()
                .filter(|f| f.cookie.is_some())
                .map(|f| f.wire_len() as u64)
                .sum();
            assert_eq!(sum, ep.queued_bytes, "{ctx}: queue accounting");
        }
        assert!(
            blocked > 100 && accepted > 5,
            "{ctx}: {accepted} / {blocked}"
        );
        // The peer reads again.
        net.knobs.stall = None;
        net.drive();
        net.assert_all_delivered(0, 1);
        let done = net.completions(0);
        assert_eq!(
            done.len(),
            accepted + 1,
            "{ctx}: the connecting message and the rest"
        );
        assert!(done.values().all(Result::is_ok), "{ctx}");
        assert_eq!(net.core(0).ep(PeerId(1)).unwrap().queued_bytes, 0, "{ctx}");
        net.send(0, 1, 3, b"and more".to_vec()).unwrap();
        net.drive();
        net.assert_all_delivered(0, 1);
    }
}

/// The process has no descriptor left for the next connection: each time, one stranger
/// (the oldest, as admission picks it) is closed and counted, whatever its source, and a
/// connected peer never is; with no stranger left there is nothing to close.
#[test]
fn out_of_descriptors_closes_the_oldest_stranger() {
    let mut net = Net::new(7, vec![small(0, 64, 64), small(1, 64, 64)]);
    for _ in 0..3 {
        net.send_random(0, 1).unwrap();
    }
    net.drive();
    net.assert_all_delivered(0, 1);
    let flood: Vec<usize> = (0..4).map(|i| net.raw_dial_from(1, src(i))).collect();
    net.run(false);
    for n in 1..=flood.len() {
        assert!(net.nodes[1].core.handle_accept_exhausted(), "stranger {n}");
        net.run(false);
        let closed = flood.iter().filter(|&&r| net.raw_eof(r)).count();
        assert_eq!(closed, n, "one stranger closed per call");
    }
    assert!(
        !net.nodes[1].core.handle_accept_exhausted(),
        "no stranger left"
    );
    assert_eq!(net.core(1).counters().accept_overload, 4);
    // The peer's connection is still up: its messages still flow.
    net.send_random(0, 1).unwrap();
    net.drive();
    net.assert_all_delivered(0, 1);
    assert!(net.failed_events(0).is_empty());
}
