//! Lent frames: a payload of at least `splice_min` bytes asks the peer for an ACK
//! (`FLAG_ACK`), and its send completes on that ACK, not when it is written.

use super::*;
use crate::error::Cause;
use crate::proto::config::{IDLE_COPY_MIN, IDLE_COPY_PACED_MAX};
use crate::proto::core::{IdleCopy, Lending};
use crate::wire::{FLAG_ACK, LINE};

/// Node `n`'s completions so far, in the order they were reported.
fn done(net: &Net, n: usize) -> Vec<(u64, bool)> {
    net.nodes[n]
        .events
        .iter()
        .filter_map(|e| match e {
            CoreEvent::Completed { cookie, result, .. } => Some((*cookie, result.is_ok())),
            _ => None,
        })
        .collect()
}

/// The frame headers in `bytes` (a whole number of frames).
fn headers(bytes: &[u8]) -> Vec<Header> {
    frames(bytes).into_iter().map(|(h, _)| h).collect()
}

/// Node 0 failed peer 1 once, for breaking the protocol with `err`.
fn assert_failed_with(net: &Net, err: &ProtoError) {
    let failed = net.failed_events(0);
    assert!(
        matches!(&failed[..], [(PeerId(1), FailReason::Protocol { err: e, .. })] if e == err),
        "{failed:?}"
    );
}

fn ack() -> Vec<u8> {
    frame(FrameKind::Ack, 0, &[])
}

#[test]
fn lent_frame_completes_on_the_peers_ack_and_frames_behind_it_wait() {
    for seed in 0..20 {
        let mut net = Net::pair(seed);
        let r = confirmed_raw_peer(&mut net);
        let before = net.send(0, 1, 1, vec![1; 100]).unwrap();
        let big = net.send(0, 1, 2, vec![2; 8192]).unwrap();
        let after = net.send(0, 1, 3, vec![3; 100]).unwrap();
        // No timers: the ACK deadline (`frame_stall`) would fire.
        net.run(false);
        let hs = headers(&net.raw_read(r));
        let flags: Vec<bool> = hs.iter().map(|h| h.ack).collect();
        assert_eq!(
            flags,
            [false, true, false],
            "seed {seed}: only the large frame asks"
        );
        assert_eq!(
            done(&net, 0),
            [(before, true)],
            "seed {seed}: written is not done"
        );
        assert_eq!(net.core(0).unacked(PeerId(1)), 2);
        net.raw_write(r, &ack());
        net.drive();
        assert_eq!(
            done(&net, 0),
            [(before, true), (big, true), (after, true)],
            "seed {seed}: the ACK completes the lent frame, then the one behind it"
        );
        assert!(net.failed_events(0).is_empty());
    }
}

/// A lent frame's header says where its payload starts in a line of the sender's memory
/// (its largest segment's place, counted back to the payload's first byte), so that the
/// receiver can put it at the same place.
#[test]
fn lent_frame_carries_its_payloads_place_in_the_line() {
    let mem = Bytes::from(vec![7u8; 9000]);
    for off in [0usize, 1, 8, 13, 40, 63] {
        let mut net = Net::pair(off as u64);
        let r = confirmed_raw_peer(&mut net);
        let head = Bytes::from_static(&[1; 24]);
        let data = mem.slice(off..off + 8192);
        let want = ((data.as_ptr() as usize + LINE - 24) % LINE) as u8;
        let now = net.now();
        let core = &mut net.nodes[0].core;
        core.send(now, PeerId(1), Tag(2), &[head, data], 1).unwrap();
        core.send(now, PeerId(1), Tag(3), &[mem.slice(off..off + 100)], 2)
            .unwrap();
        net.run(false);
        let hs: Vec<(bool, u8)> = headers(&net.raw_read(r))
            .iter()
            .map(|h| (h.ack, h.line))
            .collect();
        assert_eq!(hs, [(true, want), (false, 0)], "offset {off}");
    }
}

#[test]
fn receiver_answers_each_frame_that_asks_once_read_whole() {
    for seed in 0..20 {
        let mut net = Net::pair(seed);
        let r = confirmed_raw_peer(&mut net);
        let mut asks = frame(FrameKind::Send, 4, &[9; 5000]);
        asks[2..4].copy_from_slice(&FLAG_ACK.to_be_bytes());
        // Cut in two: the ACK goes only once the whole frame is read.
        net.raw_write(r, &asks[..3000]);
        // No timers: a frame cut in half for long stalls its connection.
        net.run(false);
        assert!(
            net.raw_read(r).is_empty(),
            "seed {seed}: no ACK for half a frame"
        );
        net.raw_write(r, &asks[3000..]);
        net.raw_write(r, &frame(FrameKind::Send, 5, &[8; 5000]));
        net.raw_write(r, &asks);
        net.drive();
        let got: Vec<u8> = net.received(0, 1).iter().map(|m| m.0).collect();
        assert_eq!(got, [9, 4, 5, 4], "seed {seed}: {:?}", net.failed_events(0));
        let hs = headers(&net.raw_read(r));
        assert!(
            hs.len() == 2 && hs.iter().all(|h| h.kind == FrameKind::Ack),
            "seed {seed}: one ACK per frame that asked: {hs:?}"
        );
    }
}

#[test]
fn an_ack_for_nothing_fails_the_endpoint() {
    let mut net = Net::pair(1);
    let r = confirmed_raw_peer(&mut net);
    let small = net.send(0, 1, 1, vec![1; 100]).unwrap();
    net.drive();
    net.raw_write(r, &ack());
    net.drive();
    assert_failed_with(&net, &ProtoError::UnexpectedAck);
    assert_eq!(done(&net, 0), [(small, true)]);
    assert!(net.raw_eof(r));
}

/// A RUN that starts before where the stream stands (two frames were consumed outside
/// runs) fails the endpoint, and the messages before it were delivered.
#[test]
fn a_run_behind_the_stream_fails_the_endpoint() {
    let mut net = Net::pair(1);
    let r = confirmed_raw_peer(&mut net);
    net.raw_write(r, &frame(FrameKind::Send, 4, b"before"));
    let run = crate::wire::RunFrame {
        offset: 0,
        epoch: 0,
        len: 1,
    };
    net.raw_write(r, &run.to_bytes());
    net.raw_write(r, &frame(FrameKind::Send, 5, b"after"));
    net.drive();
    assert_failed_with(&net, &ProtoError::RunOutOfOrder);
    assert_eq!(
        net.received(0, 1),
        [(9, b"hi".to_vec()), (4, b"before".to_vec())]
    );
    assert!(net.raw_eof(r));
}

#[test]
fn acks_may_follow_a_fin_and_nothing_else_may() {
    for then_data in [false, true] {
        let mut net = Net::pair(2);
        let r = confirmed_raw_peer(&mut net);
        let big = net.send(0, 1, 2, vec![2; 8192]).unwrap();
        net.run(false);
        net.raw_read(r);
        net.raw_write(r, &frame(FrameKind::Fin, 0, &[]));
        net.raw_write(r, &ack());
        if then_data {
            net.raw_write(r, &frame(FrameKind::Send, 1, b"late"));
        }
        net.drive();
        assert_eq!(done(&net, 0), [(big, true)], "then_data {then_data}");
        let failed = net.failed_events(0);
        if then_data {
            assert_failed_with(&net, &ProtoError::DataAfterFin);
        } else {
            assert!(failed.is_empty(), "{failed:?}");
            // Our FIN answered theirs; both done, the connection closes cleanly.
            let hs = headers(&net.raw_read(r));
            assert_eq!(hs.last().map(|h| h.kind), Some(FrameKind::Fin));
            assert!(net.raw_eof(r));
        }
    }
}

#[test]
fn a_peer_that_leaves_without_its_acks_fails_the_lent_sends() {
    let mut net = Net::pair(3);
    let r = confirmed_raw_peer(&mut net);
    let big = net.send(0, 1, 2, vec![2; 8192]).unwrap();
    net.drive();
    net.raw_write(r, &frame(FrameKind::Fin, 0, &[]));
    net.drive();
    net.raw_close(r);
    net.drive();
    assert_eq!(done(&net, 0), [(big, false)]);
    assert_eq!(net.failed_events(0).len(), 1);
}

#[test]
fn lent_frames_both_ways_deliver_and_complete_with_fins() {
    for seed in 0..100 {
        let mut net = Net::pair(seed);
        connect_pair(&mut net);
        for _ in 0..1 + net.rng.below(6) {
            let len = 4096 + net.rng.below(100_000);
            let p = net.rng.bytes(len);
            net.send(0, 1, 1, p).unwrap();
            let len = net.rng.below(20_000);
            let p = net.rng.bytes(len);
            net.send(1, 0, 2, p).unwrap();
        }
        let k = net.rng.below(30);
        net.steps(k);
        net.core(0).shutdown();
        if net.rng.chance(1, 2) {
            net.core(1).shutdown();
        }
        net.drive();
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        assert!(
            net.completions(0).values().all(Result::is_ok),
            "seed {seed}"
        );
        assert!(
            net.completions(1).values().all(Result::is_ok),
            "seed {seed}"
        );
        assert!(net.failed_events(0).is_empty() && net.failed_events(1).is_empty());
        assert!(
            net.nodes[0].keys.is_empty() && net.nodes[1].keys.is_empty(),
            "seed {seed}"
        );
    }
}

/// Memory that says when it is dropped.
struct Watched(Vec<u8>, std::sync::Arc<std::sync::atomic::AtomicBool>);

impl AsRef<[u8]> for Watched {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The kernel reads lent pages until the peer has read them: the caller's memory lives
/// until the ACK, past the batch that wrote it (and goes at a failure).
#[test]
fn lent_memory_lives_until_the_ack() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    for fail in [false, true] {
        let mut net = Net::pair(4);
        let r = confirmed_raw_peer(&mut net);
        let gone = Arc::new(AtomicBool::new(false));
        let b = Bytes::from_owner(Watched(vec![5; 10_000], gone.clone()));
        let now = net.now();
        net.core(0).send(now, PeerId(1), Tag(1), &[b], 77).unwrap();
        net.run(false);
        assert_eq!(headers(&net.raw_read(r)).len(), 1);
        assert!(done(&net, 0).is_empty());
        assert!(
            !gone.load(Ordering::SeqCst),
            "memory dropped before the ACK"
        );
        if fail {
            // Garbage: the endpoint fails, the lent send with it.
            net.raw_write(r, &[0x7f; 8]);
        } else {
            net.raw_write(r, &ack());
        }
        net.drive();
        assert_eq!(done(&net, 0), [(77, !fail)], "fail {fail}");
        assert!(
            gone.load(Ordering::SeqCst),
            "memory kept after the ACK (fail {fail})"
        );
        let node_end = net.socks[r].other.expect("the node's end");
        assert_eq!(
            net.socks[node_end].reset, fail,
            "a failure with lent pages out resets the connection (fail {fail})"
        );
    }
}

/// A peer that reads lent frames but never answers holds the sender's memory at most
/// `frame_stall`: then the endpoint fails, the send with it, and the connection is reset.
#[test]
fn lent_frames_without_an_ack_fail_after_the_stall_deadline() {
    let mut net = Net::pair(5);
    let r = confirmed_raw_peer(&mut net);
    let big = net.send(0, 1, 2, vec![2; 8192]).unwrap();
    net.run(false);
    assert_eq!(headers(&net.raw_read(r)).len(), 1);
    let stall = cfg(0).frame_stall;
    net.offset += stall / 2;
    net.fire_due_timers();
    net.run(false);
    assert!(done(&net, 0).is_empty(), "failed before the deadline");
    net.drive();
    assert_eq!(done(&net, 0), [(big, false)]);
    let failed = net.failed_events(0);
    assert!(
        matches!(
            &failed[..],
            [(PeerId(1), FailReason::ConnectionLost { cause: Cause::AckStalled(d), .. })] if *d == stall
        ),
        "{failed:?}"
    );
    let node_end = net.socks[r].other.expect("the node's end");
    assert!(net.socks[node_end].reset);
}

/// A payload long enough to lend that finds its peer idle (the first message of its
/// batch, nothing queued behind it, none of the peer's lent pages unacknowledged) is
/// copied: it asks for no ACK and completes once written. Of three sent together, the
/// first leaves from the send call itself, alone (the connection's last batch held one
/// frame), so it is copied too; the second has the third behind it, the third the
/// second's pages out: both lent.
#[test]
fn a_payload_that_finds_its_peer_idle_is_copied_and_a_stream_is_lent() {
    const BIG: usize = IDLE_COPY_MIN + 4096;
    for seed in 0..10 {
        let mut net = Net::pair(seed);
        let r = confirmed_raw_peer(&mut net);
        let alone = net.send(0, 1, 2, vec![2; BIG]).unwrap();
        net.run(false);
        let got = net.raw_read(r);
        let fs = frames(&got);
        assert!(
            matches!(&fs[..], [(h, p)] if !h.ack && p.len() >= BIG && p.ends_with(&[2; BIG])),
            "seed {seed}: one copied frame, no ACK asked"
        );
        assert_eq!(
            done(&net, 0),
            [(alone, true)],
            "seed {seed}: done when written"
        );
        assert_eq!(net.core(0).counters().idle_copies, 1, "seed {seed}");

        let first = net.send(0, 1, 3, vec![3; BIG]).unwrap();
        let second = net.send(0, 1, 4, vec![4; BIG]).unwrap();
        let third = net.send(0, 1, 5, vec![5; BIG]).unwrap();
        net.run(false);
        let asks: Vec<bool> = headers(&net.raw_read(r)).iter().map(|h| h.ack).collect();
        assert_eq!(
            asks,
            [false, true, true],
            "seed {seed}: the stream behind is lent"
        );
        assert_eq!(
            done(&net, 0),
            [(alone, true), (first, true)],
            "seed {seed}: lent, not done"
        );
        net.raw_write(r, &ack());
        net.raw_write(r, &ack());
        net.drive();
        assert_eq!(
            done(&net, 0),
            [(alone, true), (first, true), (second, true), (third, true)],
            "seed {seed}"
        );
        assert_eq!(net.core(0).counters().idle_copies, 2, "seed {seed}");
        assert!(net.failed_events(0).is_empty(), "seed {seed}");
    }
}

/// Node 0 and a confirmed raw peer, both configured as [`cfg`] changed by `f`: the net
/// and the raw peer's socket.
fn raw_pair_with(seed: u64, f: impl Fn(&mut CoreConfig)) -> (Net, usize) {
    let cfgs = (0..2)
        .map(|n| {
            let mut c = cfg(n);
            f(&mut c);
            c
        })
        .collect();
    let mut net = Net::new(seed, cfgs);
    let r = confirmed_raw_peer(&mut net);
    (net, r)
}

/// Node 0 with `splice_idle` and a confirmed raw peer, whose connection copies the idle
/// payloads `idle_copy` says: the net, the raw peer's socket and node 0's connection.
fn idle_copy_raw_pair(
    seed: u64,
    splice_idle: Option<usize>,
    idle_copy: IdleCopy,
) -> (Net, usize, ConnKey) {
    let (mut net, r) = raw_pair_with(seed, |c| c.splice_idle = splice_idle);
    let conn = net.socks[r].other.and_then(|s| net.socks[s].key).unwrap();
    net.core(0).set_idle_copy(conn, idle_copy);
    (net, r, conn)
}

/// The idle copy has its bounds: a payload below `IDLE_COPY_MIN` (but with
/// [`IdleCopy::Paced`]) or above `splice_idle` (or, with [`IdleCopy::Paced`], above
/// `IDLE_COPY_PACED_MAX`), or any payload with `splice_idle` off or [`IdleCopy::Off`], is
/// lent even when it finds its peer idle; one too short to lend is neither.
#[test]
fn an_idle_payload_outside_the_copy_range_is_lent() {
    /// Whether an idle payload of `len` bytes asked for an ACK (was lent), and the idle
    /// copies counted.
    fn lent(splice_idle: Option<usize>, mode: IdleCopy, len: usize) -> (bool, u64) {
        let (mut net, r, _) = idle_copy_raw_pair(7, splice_idle, mode);
        net.send(0, 1, 2, vec![2; len]).unwrap();
        net.run(false);
        let hs = headers(&net.raw_read(r));
        assert_eq!(hs.len(), 1, "{splice_idle:?}, {mode:?}, {len}");
        (hs[0].ack, net.core(0).counters().idle_copies)
    }
    let (min, paced_max) = (IDLE_COPY_MIN, IDLE_COPY_PACED_MAX);
    let top = Some(paced_max + 8192);
    let (full, paced, off) = (IdleCopy::Full, IdleCopy::Paced, IdleCopy::Off);
    assert_eq!(
        lent(top, full, paced_max + 8192),
        (false, 1),
        "the top of the range"
    );
    assert_eq!(lent(top, full, min - 8192), (true, 0), "below it");
    assert_eq!(lent(top, full, paced_max + 16384), (true, 0), "above it");
    assert_eq!(lent(None, full, min + 8192), (true, 0), "splice_idle off");
    assert_eq!(
        lent(top, paced, paced_max),
        (false, 1),
        "paced: the top of its range"
    );
    assert_eq!(
        lent(top, paced, paced_max + 8192),
        (true, 0),
        "paced: above it"
    );
    assert_eq!(lent(top, paced, min), (false, 1), "paced: IDLE_COPY_MIN");
    let splice_min = cfg(0).splice_min.expect("lending on");
    assert_eq!(
        lent(top, paced, splice_min),
        (false, 1),
        "paced: below IDLE_COPY_MIN, from what is lent"
    );
    assert_eq!(
        lent(top, paced, splice_min - 8),
        (false, 0),
        "paced: too short to lend"
    );
    assert_eq!(
        lent(top, full, splice_min),
        (true, 0),
        "full: from IDLE_COPY_MIN"
    );
    for len in [min, paced_max, paced_max + 8192] {
        assert_eq!(lent(top, off, len), (true, 0), "no idle copy: {len} B lent");
    }
}

/// The driver's verdict on lending (`Core::set_lend_judged`) comes over every rule: with
/// lending judged dearer, a payload the rules would lend is copied (asks for no ACK) and
/// completes once written; judged cheaper again, the next one is lent.
#[test]
fn a_payload_is_copied_while_the_driver_judges_lending_dearer() {
    let mut net = Net::pair(7);
    let r = confirmed_raw_peer(&mut net);
    net.nodes[0].core.set_lend_judged(false);
    let copied = net.send(0, 1, 1, vec![1; 8192]).unwrap();
    net.run(false);
    let asks: Vec<bool> = headers(&net.raw_read(r)).iter().map(|h| h.ack).collect();
    assert_eq!(asks, [false], "judged dearer: copied");
    assert!(done(&net, 0).contains(&(copied, true)), "done once written");
    net.nodes[0].core.set_lend_judged(true);
    lent_alone(&mut net, r, 8192, "judged cheaper again");
}

/// Node 0 sends one payload of `len` bytes to its raw peer `r`, which it finds idle: the
/// payload is lent (asks for an ACK), completes on the ACK, and nothing fails.
fn lent_alone(net: &mut Net, r: usize, len: usize, what: &str) {
    let alone = net.send(0, 1, 5, vec![5; len]).unwrap();
    net.run(false);
    let asks: Vec<bool> = headers(&net.raw_read(r)).iter().map(|h| h.ack).collect();
    assert_eq!(asks, [true], "{what}: alone");
    net.raw_write(r, &ack());
    net.drive();
    assert!(
        done(net, 0).contains(&(alone, true)),
        "{what}: alone, done on its ACK"
    );
    assert!(net.failed_events(0).is_empty(), "{what}");
}

/// A stream's payload longer than `splice_max` is not lent: it asks for no ACK and
/// completes once written, while one of exactly `splice_max` bytes is lent and completes
/// on the peer's ACK, with the written frame behind it. Without the bound all three are
/// lent. One that finds its peer idle is lent above the bound too.
#[test]
fn a_payload_above_splice_max_is_copied_and_completes_when_written() {
    const MAX: usize = 64 * 1024;
    for (seed, splice_max) in (0..6).map(|s| (s, (s % 3 != 2).then_some(MAX))) {
        let (mut net, r) = raw_pair_with(seed, |c| c.splice_max = splice_max);
        let over = net.send(0, 1, 2, vec![2; MAX + 8]).unwrap();
        let at = net.send(0, 1, 3, vec![3; MAX]).unwrap();
        let behind = net.send(0, 1, 4, vec![4; MAX + 8]).unwrap();
        net.run(false);
        let got = net.raw_read(r);
        let fs = frames(&got);
        let asks: Vec<bool> = fs.iter().map(|(h, _)| h.ack).collect();
        let bounded = splice_max.is_some();
        assert_eq!(
            asks,
            [!bounded, true, !bounded],
            "seed {seed}, {splice_max:?}: ACKs asked for"
        );
        for ((_, p), (len, byte)) in fs.iter().zip([(MAX + 8, 2), (MAX, 3), (MAX + 8, 4)]) {
            assert!(
                p.len() >= len && p.ends_with(&vec![byte; len]),
                "seed {seed}: payload {byte}"
            );
        }
        let first = if bounded { vec![(over, true)] } else { vec![] };
        assert_eq!(done(&net, 0), first, "seed {seed}: before any ACK");
        for _ in 0..asks.iter().filter(|&&a| a).count() {
            net.raw_write(r, &ack());
        }
        net.drive();
        let mut all = done(&net, 0);
        all.sort_unstable();
        assert_eq!(
            all,
            [(over, true), (at, true), (behind, true)],
            "seed {seed}, {splice_max:?}: all done after the ACKs"
        );
        // Alone, finding its peer idle: lent above the bound too.
        lent_alone(
            &mut net,
            r,
            MAX + 8,
            &format!("seed {seed}, {splice_max:?}"),
        );
    }
}

/// What a connection lends follows `Core::set_lending`: with `Streams` (the default) a
/// stream's payloads up to `splice_max` and an idle one of any size; with `Idle` only the
/// idle one; with `IdleWithinMax` only an idle one within `splice_max`. A copied payload
/// asks for no ACK and completes once written; a lent one completes on the peer's ACK.
#[test]
fn a_connection_lends_what_set_lending_says() {
    const MAX: usize = 64 * 1024;
    let modes = [
        None,
        Some(Lending::Streams),
        Some(Lending::Idle),
        Some(Lending::IdleWithinMax),
    ];
    for (seed, mode) in (0..8u64).map(|s| (s, modes[s as usize % 4])) {
        let (mut net, r) = raw_pair_with(seed, |c| c.splice_max = Some(MAX));
        let conn = net.socks[r].other.and_then(|s| net.socks[s].key).unwrap();
        if let Some(m) = mode {
            net.core(0).set_lending(conn, m);
        }
        let streams = matches!(mode, None | Some(Lending::Streams));
        let what = format!("seed {seed}, {mode:?}");
        let ids: Vec<u64> = (2..5u8)
            .map(|b| net.send(0, 1, b, vec![b; MAX]).unwrap())
            .collect();
        net.run(false);
        let got = net.raw_read(r);
        let fs = frames(&got);
        let asks: Vec<bool> = fs.iter().map(|(h, _)| h.ack).collect();
        assert_eq!(asks, [streams; 3], "{what}: ACKs asked for");
        for ((_, p), byte) in fs.iter().zip(2..5u8) {
            assert!(
                p.len() >= MAX && p.ends_with(&[byte; MAX]),
                "{what}: payload {byte}"
            );
        }
        if streams {
            assert!(done(&net, 0).is_empty(), "{what}: lent, done on ACKs");
            for _ in 0..3 {
                net.raw_write(r, &ack());
            }
            net.drive();
        }
        let mut all = done(&net, 0);
        all.sort_unstable();
        let want: Vec<(u64, bool)> = ids.iter().map(|&i| (i, true)).collect();
        assert_eq!(all, want, "{what}: all done");
        // Alone, finding its peer idle: lent within the bound whatever the mode.
        lent_alone(&mut net, r, MAX, &what);
        // Above it: lent unless only those within it are.
        let over = net.send(0, 1, 6, vec![6; MAX + 8]).unwrap();
        net.run(false);
        let asks: Vec<bool> = headers(&net.raw_read(r)).iter().map(|h| h.ack).collect();
        let within = mode == Some(Lending::IdleWithinMax);
        assert_eq!(asks, [!within], "{what}: alone, above the bound");
        if !within {
            net.raw_write(r, &ack());
            net.drive();
        }
        assert!(done(&net, 0).contains(&(over, true)), "{what}: above, done");
        assert!(net.failed_events(0).is_empty(), "{what}");
    }
}

/// With quick ACKs asked for (`Core::set_quick_ack`, with [`IdleCopy::Full`] as the
/// transport sets them), a connection copies an idle payload up to `splice_idle` (not
/// `IDLE_COPY_PACED_MAX`, as a paced one without them does), and once that batch is back
/// the engine asks for the socket to acknowledge at once, once; a lent payload (above
/// `splice_idle`, below `IDLE_COPY_MIN`, or without the setting) asks for nothing.
#[test]
fn an_idle_copy_on_a_quick_ack_connection_asks_for_quick_acks() {
    /// Node 0 sends idle payloads of `lens` to a raw peer, each acknowledged if lent
    /// before the next: whether each was lent, and the quick ACKs asked for.
    fn run(quick: bool, lens: &[usize]) -> (Vec<bool>, usize) {
        let mode = if quick {
            IdleCopy::Full
        } else {
            IdleCopy::Paced
        };
        let (mut net, r, conn) = idle_copy_raw_pair(11, Some(TOP), mode);
        net.core(0).set_quick_ack(conn, quick);
        let mut lent = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            net.send(0, 1, 2, vec![i as u8; len]).unwrap();
            net.run(false);
            let hs = headers(&net.raw_read(r));
            assert_eq!(hs.len(), 1, "{quick} {len}");
            if hs[0].ack {
                net.raw_write(r, &ack());
                net.drive();
            }
            lent.push(hs[0].ack);
        }
        assert!(net.failed_events(0).is_empty());
        let asked = net.nodes[0]
            .quick_acks
            .iter()
            .filter(|&&k| k == conn)
            .count();
        (lent, asked)
    }
    /// `splice_idle`, above the paced bound.
    const TOP: usize = IDLE_COPY_PACED_MAX + 65536;
    assert_eq!(
        run(true, &[TOP, TOP]),
        (vec![false, false], 2),
        "copied, a quick ACK after each"
    );
    assert_eq!(
        run(false, &[TOP]),
        (vec![true], 0),
        "without the setting: lent above the paced bound, no quick ACK"
    );
    assert_eq!(
        run(true, &[TOP + 8192]),
        (vec![true], 0),
        "above splice_idle: lent, no quick ACK"
    );
    assert_eq!(
        run(true, &[IDLE_COPY_MIN - 8192]),
        (vec![true], 0),
        "below the idle copy: lent, no quick ACK"
    );
}

/// What a connection lends and copies follows what the driver knows of it: paced
/// connections that copy streams lend only idle payloads (within one trip through the
/// pipe towards loopback peers), others lend streams; idle payloads are copied on paced
/// connections towards other hosts (every one in range with quick ACKs, on any paced
/// connection), lent everywhere else.
#[test]
fn lending_and_idle_copies_follow_the_path() {
    use crate::proto::core::{IdleCopy, Lending};
    for loopback in [false, true] {
        for copy in [false, true] {
            assert_eq!(Lending::for_path(false, loopback, copy), Lending::Streams);
        }
        assert_eq!(Lending::for_path(true, loopback, false), Lending::Streams);
        for quick in [false, true] {
            assert_eq!(IdleCopy::for_path(false, loopback, quick), IdleCopy::Off);
        }
        assert_eq!(IdleCopy::for_path(true, loopback, true), IdleCopy::Full);
    }
    assert_eq!(Lending::for_path(true, false, true), Lending::Idle);
    assert_eq!(Lending::for_path(true, true, true), Lending::IdleWithinMax);
    assert_eq!(IdleCopy::for_path(true, false, false), IdleCopy::Paced);
    assert_eq!(IdleCopy::for_path(true, true, false), IdleCopy::Off);
}
