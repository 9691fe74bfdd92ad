//! A peer's reading held and resumed (`Transport::hold_reading`, a test hook of the
//! feature `testing`), two transports over loopback, once per compiled backend: while
//! held, nothing is delivered; once resumed, the bytes read before the hold are walked
//! and the rest read, every message arrives once, in order, intact, and every send
//! completes once. The multishot receive holds nothing (it takes no links), which the
//! hook says.

mod common;

use std::time::{Duration, Instant};

use common::{completions, drive, failures, multishot, pair, pattern, register_checker, Msg};
use ringbtl::{BackendKind, PeerId, SendError, Tag, Transport};

backend_tests!(held_reading_delivers_nothing_then_everything_in_order);

const SEED: u64 = 0x401d;
/// One message in this many is large (64 KiB to 4 MiB).
const LARGE_EVERY: u64 = 16;
const ROUNDS: u64 = 3;
/// Messages offered per round (fewer leave while the queue is full).
const PER_ROUND: u64 = 150;
/// How long each hold lasts.
const HOLD: Duration = Duration::from_millis(200);

fn held_reading_delivers_nothing_then_everything_in_order(kind: BackendKind) {
    let (mut a, mut b) = pair(kind);
    let pat = pattern();
    let (got, large) = register_checker(&mut b, SEED, LARGE_EVERY, pat.clone());
    let done = completions(&mut a);
    let (fa, fb) = (failures(&mut a), failures(&mut b));
    let mut stream = common::Stream::new(SEED, pat);
    let mut next: Option<Msg> = None;
    // Connected: the first message arrived.
    offer(&mut a, &mut stream, &mut next, 1);
    drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "connect",
        || got.get() == 1,
    );
    let mut held_rounds = 0;
    for round in 0..ROUNDS {
        let held = b.hold_reading(PeerId(0), true);
        assert_eq!(held, !multishot(), "round {round}: held");
        let before = got.get();
        let target = stream.seq + PER_ROUND;
        let until = Instant::now() + HOLD;
        while Instant::now() < until {
            offer(&mut a, &mut stream, &mut next, target);
            a.progress().unwrap();
            b.progress().unwrap();
        }
        if held {
            assert_eq!(got.get(), before, "round {round}: delivered while held");
            held_rounds += 1;
        }
        b.hold_reading(PeerId(0), false);
        // The round's messages all leave, arrive and complete.
        while next.is_some() || stream.seq < target {
            offer(&mut a, &mut stream, &mut next, target);
            a.progress().unwrap();
            b.progress().unwrap();
        }
        let want = stream.seq;
        drive(
            &mut [&mut a, &mut b],
            Duration::from_secs(60),
            "the held messages",
            || got.get() == want && done.borrow().len() as u64 == want,
        );
    }
    assert!(
        done.borrow().iter().all(|c| c.result.is_ok()),
        "a send failed"
    );
    assert!(fa.borrow().is_empty() && fb.borrow().is_empty());
    assert!(large.get() > 0, "no large message");
    if !multishot() {
        assert_eq!(held_rounds, ROUNDS);
    }
}

/// Sends the next message of `stream` from `a` (to peer 1) while fewer than `target` were
/// generated; a message the queue refused waits in `next` for the next call.
fn offer(a: &mut Transport, stream: &mut common::Stream, next: &mut Option<Msg>, target: u64) {
    loop {
        if next.is_none() {
            if stream.seq >= target {
                return;
            }
            *next = Some(stream.next(LARGE_EVERY));
        }
        let m = next.as_ref().expect("a message");
        match a.send(PeerId(1), Tag(m.tag), &m.segs, m.seq) {
            Ok(()) => *next = None,
            Err(SendError::WouldBlock(_)) => return,
            Err(e) => panic!("send {}: {e}", m.seq),
        }
    }
}
