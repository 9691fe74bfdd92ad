//! Links beyond a peer's first connection (`RINGBTL_LINKS`) through the public API, two
//! transports in one process over loopback, once per compiled backend.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{completions, drive, failures, pair_with};
use ringbtl::proto::core::EndpointState;
use ringbtl::{BackendKind, PeerId, SendError, Tag, Transport};

backend_tests!(
    links_join_and_messages_keep_their_order,
    links_close_with_a_clean_shutdown,
    a_stream_in_both_directions_spreads_over_every_link,
    messages_larger_than_a_piece_go_in_parts_over_the_links,
);

const LINKS: u32 = 3;
const MESSAGES: u64 = 2_000;

/// With `RINGBTL_LINKS=3` both sides end up with three connections to each other (the
/// lower id dials the two links once the first is adopted), and messages both ways still
/// arrive in order, each once, whichever side spoke first.
fn links_join_and_messages_keep_their_order(kind: BackendKind) {
    for first in [0u32, 1] {
        let (mut a, mut b) = pair_with(kind, |c| c.wireup.links = LINKS);
        let got = [checker(&mut a), checker(&mut b)];
        let done = [completions(&mut a), completions(&mut b)];
        let (from, to) = if first == 0 { (&mut a, 1) } else { (&mut b, 0) };
        from.send(PeerId(to), Tag(5), &[payload(0)], 0).unwrap();
        open_links(&mut a, &mut b);
        for seq in 1..MESSAGES {
            send_retrying(&mut a, &mut b, PeerId(1), seq);
            send_retrying(&mut b, &mut a, PeerId(0), seq);
            a.progress().unwrap();
            b.progress().unwrap();
        }
        // Side `first` sent one more message (cookie 0) than the other.
        let want = |side: u32| MESSAGES - 1 + u64::from(side == first);
        // (A short send completes at its write: its delivery may come after.)
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(30),
            "messages",
            || {
                done[0].borrow().len() as u64 == want(0)
                    && done[1].borrow().len() as u64 == want(1)
                    && got[1].borrow().len() as u64 == want(0)
                    && got[0].borrow().len() as u64 == want(1)
            },
        );
        for (side, t) in [(0usize, &a), (1, &b)] {
            assert!(
                done[side].borrow().iter().all(|c| c.result.is_ok()),
                "side {side}"
            );
            let s = t.stats();
            assert_eq!(s.links_joined as usize, links_wanted() - 1, "side {side}");
            assert_eq!(s.links_lost, 0, "side {side}");
        }
        // Each side saw the other's sequence numbers in order, none twice.
        for (side, g) in got.iter().enumerate() {
            let g = g.borrow();
            let sender = 1 - side as u32;
            let start = u64::from(sender != first);
            let expect: Vec<u64> = (start..MESSAGES).collect();
            assert_eq!(*g, expect, "side {side} (first speaker {first})");
        }
    }
}

/// Streams of large messages both ways at once go in runs over every link (frames are
/// read on the links, not on the first connection alone), and arrive in order, every
/// byte checked. (With the multishot receive, which takes no links, the same streams go
/// on the first connection alone.)
fn a_stream_in_both_directions_spreads_over_every_link(kind: BackendKind) {
    stream_both_ways(kind, 96 * 1024 + 13, 400);
}

/// Messages of 3 MiB, more than a piece (1 MiB), both ways at once: each is cut into
/// PART frames that go over the links and is handed out whole, every byte checked.
fn messages_larger_than_a_piece_go_in_parts_over_the_links(kind: BackendKind) {
    const COUNT: u64 = 24;
    let stats = stream_both_ways(kind, (3 << 20) + 13, COUNT);
    // Each side sent COUNT - 1 messages once the links were open (side 0 one more,
    // whole, before): all of those came in parts (none with the multishot receive,
    // which takes no links).
    let want = if common::multishot() { 0 } else { COUNT - 1 };
    for (side, s) in stats.iter().enumerate() {
        assert_eq!(s.parts_assembled, want, "side {side}: messages in parts");
    }
}

/// `count` messages of `size` bytes from side 0 and `count - 1` from side 1, at once;
/// checks that they spread over the links and arrive in order, every byte checked.
/// Returns each side's statistics.
fn stream_both_ways(kind: BackendKind, size: usize, count: u64) -> [ringbtl::Stats; 2] {
    let (mut a, mut b) = pair_with(kind, |c| c.wireup.links = LINKS);
    let got = [big_checker(&mut a, size), big_checker(&mut b, size)];
    let done = [completions(&mut a), completions(&mut b)];
    a.send(PeerId(1), Tag(6), &[big(0, size)], 0).unwrap();
    open_links(&mut a, &mut b);
    for seq in 1..count {
        send_big(&mut a, &mut b, PeerId(1), seq, size);
        send_big(&mut b, &mut a, PeerId(0), seq, size);
    }
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(60),
        "large messages",
        || {
            done[0].borrow().len() as u64 == count
                && done[1].borrow().len() as u64 == count - 1
                && got[1].borrow().len() as u64 == count
                && got[0].borrow().len() as u64 == count - 1
        },
    );
    let stats = [a.stats(), b.stats()];
    for (side, t) in [(0usize, &a), (1, &b)] {
        assert!(
            done[side].borrow().iter().all(|c| c.result.is_ok()),
            "side {side}"
        );
        let s = t.stats();
        let spread = s.run_frames_in > 0 && s.spread_streams > 0;
        assert_eq!(
            spread,
            !common::multishot(),
            "side {side}: frames read on links {}, spread {}",
            s.run_frames_in,
            s.spread_streams
        );
        assert_eq!((s.links_lost, s.failovers), (0, 0), "side {side}");
    }
    let want = |from: u64| (from..count).collect::<Vec<u64>>();
    assert_eq!(*got[1].borrow(), want(0), "side 1 read side 0's stream");
    assert_eq!(*got[0].borrow(), want(1), "side 0 read side 1's stream");
    stats
}

/// `size` bytes that follow from `seq`, its first eight `seq` itself.
fn big(seq: u64, size: usize) -> Bytes {
    let mut v: Vec<u8> = (0..size).map(|i| (seq as usize * 31 + i) as u8).collect();
    v[..8].copy_from_slice(&seq.to_be_bytes());
    Bytes::from(v)
}

/// Records the sequence numbers of the large messages on tag 6, each checked whole. The
/// handler flushes, as Open MPI's handlers do: a held link read again meanwhile must not
/// run a handler inside it.
fn big_checker(t: &mut Transport, size: usize) -> std::rc::Rc<std::cell::RefCell<Vec<u64>>> {
    let got = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let g = got.clone();
    let depth = std::rc::Rc::new(std::cell::Cell::new(0u32));
    t.register(Tag(6), move |t, m| {
        depth.set(depth.get() + 1);
        assert_eq!(depth.get(), 1, "a handler ran inside a handler");
        let seq = u64::from_be_bytes(m.payload[..8].try_into().expect("8 bytes"));
        assert!(
            m.payload[..] == big(seq, size)[..],
            "message {seq}: bytes differ"
        );
        g.borrow_mut().push(seq);
        t.flush().unwrap();
        depth.set(depth.get() - 1);
    })
    .unwrap();
    got
}

/// Sends large message `seq` from `t` (tag 6), as [`send_retrying`] does.
fn send_big(t: &mut Transport, other: &mut Transport, peer: PeerId, seq: u64, size: usize) {
    send_until_taken(t, other, (peer, Tag(6)), big(seq, size), seq);
}

/// A clean shutdown closes the links with their endpoint: the peer sees the FIN and
/// closes, nobody fails, no link is reported lost.
fn links_close_with_a_clean_shutdown(kind: BackendKind) {
    use std::sync::mpsc;
    let (addr_tx, addr_rx) = mpsc::channel();
    let (a_addr_tx, a_addr_rx) = mpsc::channel();
    let peer = std::thread::spawn(move || {
        let mut c = common::cfg(1, kind);
        c.wireup.links = LINKS;
        let mut b = Transport::new(c).unwrap();
        addr_tx.send(b.local_addr()).unwrap();
        b.add_peer(PeerId(0), vec![a_addr_rx.recv().unwrap()])
            .unwrap();
        b.register(Tag(5), |_, _| {}).unwrap();
        let fb = failures(&mut b);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut most = 0;
        loop {
            b.progress().unwrap();
            most = most.max(b.links_open(PeerId(0)));
            if most > 0 && b.peer_state(PeerId(0)) == Some(EndpointState::Closed) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no FIN seen");
        }
        let failed = fb.borrow().len();
        (most, failed, b.links_open(PeerId(0)), b.stats().links_lost)
    });
    let mut c = common::cfg(0, kind);
    c.wireup.links = LINKS;
    let mut a = Transport::new(c).unwrap();
    a_addr_tx.send(a.local_addr()).unwrap();
    a.add_peer(PeerId(1), vec![addr_rx.recv().unwrap()])
        .unwrap();
    let fa = failures(&mut a);
    a.send(PeerId(1), Tag(5), &[payload(0)], 0).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while a.links_open(PeerId(1)) < links_wanted() {
        a.progress().unwrap();
        assert!(std::time::Instant::now() < deadline, "links never opened");
    }
    a.shutdown(Duration::from_secs(10)).unwrap();
    let (most, failed, open, lost) = peer.join().unwrap();
    assert_eq!(most, links_wanted(), "the peer had every link");
    assert_eq!(
        (failed, open, lost),
        (0, 0, 0),
        "peer: failures, links open, lost"
    );
    assert!(fa.borrow().is_empty());
    assert_eq!(a.links_open(PeerId(1)), 0);
    assert_eq!(a.stats().links_lost, 0);
}

/// Connections each side ends up with: every link, but only the first with the multishot
/// receive, which takes no links.
fn links_wanted() -> usize {
    if common::multishot() {
        1
    } else {
        LINKS as usize
    }
}

/// Progresses both until each has every link open to the other.
fn open_links(a: &mut Transport, b: &mut Transport) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let want = links_wanted();
    while a.links_open(PeerId(1)) < want || b.links_open(PeerId(0)) < want {
        assert!(std::time::Instant::now() < deadline, "links never opened");
        a.progress().unwrap();
        b.progress().unwrap();
    }
}

/// Eight bytes: the message's sequence number.
fn payload(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

/// Records the sequence numbers that arrive on tag 5.
fn checker(t: &mut Transport) -> std::rc::Rc<std::cell::RefCell<Vec<u64>>> {
    let got = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let g = got.clone();
    t.register(Tag(5), move |_, m| {
        let b: [u8; 8] = m.payload.try_into().expect("8 bytes");
        g.borrow_mut().push(u64::from_be_bytes(b));
    })
    .unwrap();
    got
}

/// Sends message `seq` from `t` (tag 5), progressing both sides while the peer's queue
/// is full.
fn send_retrying(t: &mut Transport, other: &mut Transport, peer: PeerId, seq: u64) {
    send_until_taken(t, other, (peer, Tag(5)), payload(seq), seq);
}

/// Sends `m` to `to` (peer, tag) from `t` with cookie `seq`, progressing both sides while
/// the queue is full.
fn send_until_taken(
    t: &mut Transport,
    other: &mut Transport,
    (peer, tag): (PeerId, Tag),
    m: Bytes,
    seq: u64,
) {
    for _ in 0..100_000 {
        match t.send(peer, tag, std::slice::from_ref(&m), seq) {
            Ok(()) => return,
            Err(SendError::WouldBlock(_)) => {
                t.progress().unwrap();
                other.progress().unwrap();
            }
            Err(e) => panic!("send {seq}: {e}"),
        }
    }
    panic!("send {seq}: the queue never drained");
}
