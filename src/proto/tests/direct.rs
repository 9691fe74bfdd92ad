//! A small message on a connection whose last batch held one frame (a ping-pong) is
//! offered to the driver from the send call itself (`Core::direct_pieces`); a stream's
//! messages are gathered at the flush. `Net::send` writes what is offered, as
//! `Transport::send` does, so these tests see the bytes on the wire before the network
//! runs.

use super::*;

fn written_at_once(net: &Net) -> u64 {
    net.nodes[0].core.counters().written_at_once
}

/// Node 0 and a confirmed raw peer, after one message from node 0 left alone in its
/// batch.
fn solo_pair(seed: u64) -> (Net, usize) {
    solo_pair_with(seed, cfg)
}

fn solo_pair_with(seed: u64, cfg: impl Fn(u32) -> CoreConfig) -> (Net, usize) {
    let mut net = Net::new(seed, vec![cfg(0), cfg(1)]);
    let r = confirmed_raw_peer(&mut net);
    net.knobs.at_once = Some(usize::MAX);
    net.send(0, 1, 3, b"first".to_vec()).unwrap();
    net.run(false);
    let fs = net.raw_read(r);
    assert_eq!(frames(&fs).len(), 1);
    (net, r)
}

#[test]
fn a_ping_pong_message_is_on_the_wire_when_send_returns() {
    let (mut net, r) = solo_pair(1);
    for i in 0..5u8 {
        let before = written_at_once(&net);
        let cookie = net.send(0, 1, 4, vec![i; 8]).unwrap();
        // Not run: the frame left from the send itself.
        let wire = net.raw_read(r);
        let fs = frames(&wire);
        let [(h, body)] = &fs[..] else {
            panic!("message {i}: one frame at once, got {}", fs.len())
        };
        assert_eq!((h.tag, *body), (Tag(4), &[i; 8][..]));
        assert_eq!(written_at_once(&net), before + 1);
        // The batch's own send brings nothing more and completes the message.
        net.run(false);
        assert!(net.raw_read(r).is_empty(), "message {i} sent twice");
        let done = net.completions(0);
        assert_eq!(done.get(&cookie), Some(&Ok(())), "message {i}");
        // The peer answers, as in a ping-pong.
        net.raw_write(r, &frame(FrameKind::Send, 5, &[i]));
        net.run(false);
    }
}

#[test]
fn a_stream_is_gathered_and_only_a_lone_message_leaves_at_once() {
    let (mut net, r) = solo_pair(2);
    // What reached the peer: the first payload byte of each frame, in order.
    let mut order = Vec::new();
    let mut read = |net: &mut Net| {
        let wire = net.raw_read(r);
        let fs = frames(&wire);
        order.extend(fs.iter().map(|(_, body)| body[0]));
        fs.len()
    };
    // Three in a row: the first finds the batch empty and leaves at once; the two others
    // are gathered.
    for i in 0..3u8 {
        net.send(0, 1, 4, vec![i; 8]).unwrap();
    }
    assert_eq!(read(&mut net), 1);
    assert_eq!(written_at_once(&net), 1);
    net.run(false);
    assert_eq!(read(&mut net), 2, "the two others in one batch");
    // The last batch held two frames: the next message waits for the flush ...
    net.send(0, 1, 4, vec![3; 8]).unwrap();
    assert_eq!(read(&mut net), 0, "a stream's message left at once");
    net.run(false);
    assert_eq!(read(&mut net), 1);
    // ... and, its batch holding it alone, the one after it leaves at once.
    net.send(0, 1, 4, vec![4; 8]).unwrap();
    assert_eq!(read(&mut net), 1);
    assert_eq!(written_at_once(&net), 2);
    net.run(false);
    assert_eq!(read(&mut net), 0);
    assert_eq!(order, [0, 1, 2, 3, 4]);
    assert!(net.completions(0).values().all(Result::is_ok));
}

/// A message too large to be copied next to its header (its segments go by reference)
/// leaves at once too, gathered: the queued frame is moved into the batch first.
#[test]
fn a_larger_message_in_a_ping_pong_leaves_at_once_gathered() {
    let copying = |pid| CoreConfig {
        splice_min: None,
        ..cfg(pid)
    };
    let (mut net, r) = solo_pair_with(3, copying);
    for (i, len) in [100usize, 1000, 9000, 60_000].into_iter().enumerate() {
        let payload: Vec<u8> = (0..len).map(|j| (i * 7 + j) as u8).collect();
        let before = written_at_once(&net);
        let cookie = net.send_segs(0, 1, 4, payload.clone(), 3).unwrap();
        let wire = net.raw_read(r);
        let fs = frames(&wire);
        let [(h, body)] = &fs[..] else {
            panic!("{len} B: one frame at once, got {}", fs.len())
        };
        assert_eq!(&body[h.pad()..], &payload[..], "{len} B");
        assert_eq!(written_at_once(&net), before + 1, "{len} B");
        net.run(false);
        assert!(net.raw_read(r).is_empty(), "{len} B sent twice");
        assert_eq!(net.completions(0).get(&cookie), Some(&Ok(())), "{len} B");
        net.raw_write(r, &frame(FrameKind::Send, 5, &[i as u8]));
        net.run(false);
    }
}

/// A payload whose pages are lent (spliced) is never written at once: it waits for the
/// flush, which sends it through the pipe.
#[test]
fn lent_pages_wait_for_the_flush() {
    let (mut net, r) = solo_pair(4);
    let len = SPLICE_MIN.expect("lending on") + 100;
    let before = written_at_once(&net);
    let cookie = net.send(0, 1, 4, vec![9; len]).unwrap();
    assert!(net.raw_read(r).is_empty(), "lent pages written at once");
    assert_eq!(written_at_once(&net), before);
    net.run(false);
    let wire = net.raw_read(r);
    let fs = frames(&wire);
    assert!(matches!(&fs[..], [(h, body)] if h.ack && body.len() == len));
    // Its ACK completes it.
    net.raw_write(r, &frame(FrameKind::Ack, 0, &[]));
    net.run(false);
    assert_eq!(net.completions(0).get(&cookie), Some(&Ok(())));
}

/// A socket that takes part of the frame, or none of it: the batch's send brings the
/// rest, and the peer reads the frame whole.
#[test]
fn what_the_socket_does_not_take_at_once_leaves_with_the_batch() {
    for take in [0usize, 1, 3, 8, 15] {
        let (mut net, r) = solo_pair(10 + take as u64);
        net.knobs.at_once = Some(take);
        let before = written_at_once(&net);
        let cookie = net.send(0, 1, 6, vec![0xab; 8]).unwrap();
        assert_eq!(net.raw_read(r).len(), take, "take {take}");
        assert_eq!(written_at_once(&net), before + u64::from(take > 0));
        let mut wire = frame(FrameKind::Send, 6, &[0xab; 8]);
        net.run(false);
        let rest = net.raw_read(r);
        assert_eq!(rest[..], wire.split_off(take)[..], "take {take}");
        assert_eq!(net.completions(0).get(&cookie), Some(&Ok(())));
    }
}

/// Two engines in a ping-pong of small and large messages, each socket taking all, part
/// or none of what is written at once: every message arrives, in order, and completes.
#[test]
fn ping_pong_through_partial_writes_delivers_everything() {
    for seed in 0..8u64 {
        let mut net = Net::pair(seed);
        net.knobs.split = seed % 2 == 0;
        for i in 0..60u32 {
            let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            let len = match i % 7 {
                0 => 20_000,
                1 => 0,
                2 => 100 + 37 * i as usize,
                _ => 1 + (i as usize % 32),
            };
            net.send(from, to as u32, 2, vec![i as u8; len]).unwrap();
            net.run(false);
        }
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
        assert!(net.completions(0).values().all(Result::is_ok));
        assert!(net.completions(1).values().all(Result::is_ok));
        let at_once = written_at_once(&net) + net.nodes[1].core.counters().written_at_once;
        assert!(at_once > 0, "seed {seed}: nothing written at once");
    }
}

/// A small message to a connected peer with an idle batch takes the batch's fast path
/// (`Core::send_small`); every case it must not take is decided as for any message: too
/// many segments, larger than the maximum frame (below the inline size here), an unknown
/// peer, after shutdown. Nothing of them reaches the wire, and the fast path still works
/// after each.
#[test]
fn a_small_send_refuses_what_any_send_refuses() {
    let (mut net, r) = solo_pair_with(7, |pid| CoreConfig {
        max_frame: 16,
        ..cfg(pid)
    });
    let now = net.now();
    let nine: Vec<Bytes> = (0..9).map(|i| Bytes::from(vec![i; 1])).collect();
    let core = &mut net.nodes[0].core;
    assert_eq!(
        core.send(now, PeerId(1), Tag(1), &nine, 90),
        Err(SendError::TooManySegments { got: 9, max: 8 })
    );
    assert_eq!(
        core.send(now, PeerId(1), Tag(1), &[Bytes::from(vec![0; 17])], 91),
        Err(SendError::TooLarge { len: 17, max: 16 })
    );
    assert_eq!(
        core.send(now, PeerId(9), Tag(1), &[Bytes::from_static(b"x")], 92),
        Err(SendError::UnknownPeer(PeerId(9)))
    );
    net.run(false);
    assert!(
        net.raw_read(r).is_empty(),
        "a refused message reached the wire"
    );
    // Within the maximum, the same peer's message leaves.
    net.send(0, 1, 2, vec![5; 16]).unwrap();
    net.run(false);
    let wire = net.raw_read(r);
    let fs = frames(&wire);
    assert_eq!(fs.len(), 1);
    assert_eq!((fs[0].0.tag, fs[0].1), (Tag(2), &[5u8; 16][..]));
    net.nodes[0].core.shutdown();
    assert_eq!(net.send(0, 1, 2, vec![1]), Err(SendError::ShuttingDown));
}

/// The configured inline limit bounds the small-send fast path too: a payload above it
/// goes by reference (the batch holds the caller's `Bytes`), one within it is copied.
#[test]
fn a_small_send_copies_only_within_the_inline_limit() {
    let (mut net, r) = solo_pair_with(8, |pid| CoreConfig {
        inline_limit: 4,
        ..cfg(pid)
    });
    let now = net.now();
    let core = &mut net.nodes[0].core;
    let (small, large) = (Bytes::from(vec![1u8; 4]), Bytes::from(vec![2u8; 16]));
    core.send(now, PeerId(1), Tag(1), std::slice::from_ref(&small), 80)
        .unwrap();
    core.send(now, PeerId(1), Tag(1), std::slice::from_ref(&large), 81)
        .unwrap();
    assert!(small.is_unique(), "4 bytes, within the limit: copied");
    assert!(
        !large.is_unique(),
        "16 bytes, above the limit: by reference"
    );
    net.run(false);
    let wire = net.raw_read(r);
    let fs = frames(&wire);
    assert_eq!(fs.len(), 2);
    assert_eq!((fs[0].1, fs[1].1), (&[1u8; 4][..], &[2u8; 16][..]));
}

/// A ping-pong's small message that the socket takes whole (`Core::send_with`, as
/// `Transport::send` calls it) has completed when the send returns: no batch carries it,
/// so the flush after it hands nothing to the driver.
#[test]
fn a_ping_pong_message_taken_whole_completes_without_a_batch() {
    let (mut net, r) = solo_pair(20);
    for i in 0..3u8 {
        let batches = net.nodes[0].core.counters().batches;
        let cookie = net.send(0, 1, 4, vec![i; 8]).unwrap();
        assert_eq!(frames(&net.raw_read(r)).len(), 1, "message {i}");
        assert!(
            net.nodes[0].core.has_events(),
            "message {i}: no completion yet"
        );
        net.nodes[0].core.flush();
        assert!(
            !net.nodes[0].core.has_actions(),
            "message {i}: a batch went to the driver for a frame already written"
        );
        net.run(false);
        assert_eq!(
            net.completions(0).get(&cookie),
            Some(&Ok(())),
            "message {i}"
        );
        assert_eq!(net.nodes[0].core.counters().batches, batches + 1);
        net.raw_write(r, &frame(FrameKind::Send, 5, &[i]));
        net.run(false);
    }
}

/// A message written at once behind a frame whose lent pages wait for the peer's ACK
/// completes after that frame, when the ACK comes: completions keep the send order.
#[test]
fn a_message_written_at_once_completes_after_the_lent_frame_before_it() {
    let (mut net, r) = solo_pair(21);
    let len = SPLICE_MIN.expect("lending on") + 100;
    let lent = net.send(0, 1, 4, vec![9; len]).unwrap();
    net.run(false);
    let wire = net.raw_read(r);
    assert!(matches!(&frames(&wire)[..], [(h, _)] if h.ack));
    let small = net.send(0, 1, 5, vec![1; 8]).unwrap();
    let wire = net.raw_read(r);
    assert!(
        matches!(&frames(&wire)[..], [(h, body)] if h.tag == Tag(5) && body == &[1; 8]),
        "the small message was not written at once"
    );
    let done = |net: &Net| -> Vec<u64> {
        let mine = net.completed_ok(0).into_iter();
        mine.filter(|c| [lent, small].contains(c)).collect()
    };
    net.run(false);
    assert_eq!(done(&net), [], "completed before the lent frame's ACK");
    net.raw_write(r, &frame(FrameKind::Ack, 0, &[]));
    net.run(false);
    assert_eq!(done(&net), [lent, small]);
}

/// `Core::gather_small`, which `Transport::send` (and `Net::send`) tries first, takes a
/// small message only behind another one gathered since the last flush, and then as
/// `send_with` would have: into the connection's batch, nothing written or offered at
/// once, the frames in send order at the flush, each completing once. Anything else it
/// leaves, changing nothing.
#[test]
fn a_small_message_is_gathered_only_behind_another() {
    let (mut net, r) = solo_pair(21);
    let eight = Bytes::from(vec![8u8; 8]);
    let core = &mut net.nodes[0].core;
    // The first since the last flush: for `send_with` (a ping-pong's message leaves now).
    assert!(!core.gather_small(PeerId(1), Tag(4), std::slice::from_ref(&eight), 90));
    assert_eq!(core.pending(PeerId(1)), 0, "refused, yet queued");
    let first = net.send(0, 1, 4, vec![1u8; 8]).unwrap();
    assert_eq!(
        frames(&net.raw_read(r)).len(),
        1,
        "a ping-pong's message left at once"
    );
    let at_once = written_at_once(&net);
    // Behind it, gathered: one segment of 8 bytes (taken here by `gather_small` itself,
    // recorded as `Net::send` records it), three segments, an empty payload.
    let node = &mut net.nodes[0];
    let cookie = node.next_cookie;
    assert!(node
        .core
        .gather_small(PeerId(1), Tag(5), std::slice::from_ref(&eight), cookie));
    node.next_cookie += 1;
    node.sent.insert(cookie, (PeerId(1), 5, eight.to_vec()));
    let gathered = [
        cookie,
        net.send_segs(0, 1, 6, b"abcdefgh".to_vec(), 3).unwrap(),
        net.send(0, 1, 7, Vec::new()).unwrap(),
    ];
    assert_eq!(
        written_at_once(&net),
        at_once,
        "a gathered message was written at once"
    );
    let core = &mut net.nodes[0].core;
    assert!(!core.has_direct(), "a gathered message was offered at once");
    assert_eq!(core.pending(PeerId(1)), 3);
    // Above the inline size, and to a peer that does not exist: left alone.
    let large = Bytes::from(vec![9u8; 64]);
    assert!(!core.gather_small(PeerId(1), Tag(8), std::slice::from_ref(&large), 94));
    assert!(large.is_unique(), "a refused payload was kept");
    assert!(!core.gather_small(PeerId(7), Tag(8), std::slice::from_ref(&eight), 95));
    assert_eq!(core.pending(PeerId(1)), 3, "a refused message was queued");
    assert!(
        frames(&net.raw_read(r)).is_empty(),
        "gathered frames wait for the flush"
    );
    net.run(false);
    let wire = net.raw_read(r);
    let fs: Vec<(u8, &[u8])> = frames(&wire)
        .into_iter()
        .map(|(h, b)| (h.tag.0, b))
        .collect();
    assert_eq!(
        fs,
        [(5, &[8u8; 8][..]), (6, &b"abcdefgh"[..]), (7, &[][..])],
        "the gathered frames, in send order"
    );
    let done = net.completions(0);
    for cookie in gathered.into_iter().chain([first]) {
        assert_eq!(done.get(&cookie), Some(&Ok(())), "cookie {cookie}");
    }
    // After the flush the next message is again the first of its batch.
    let core = &mut net.nodes[0].core;
    assert!(!core.gather_small(PeerId(1), Tag(4), std::slice::from_ref(&eight), 96));
}
