//! [`Core::input_step`](crate::proto::core::Core::input_step): frames walked in inputs the connection does not own (provided
//! buffers), with the connection's cache used only for records cut between two inputs.

use std::time::Instant;

use proptest::prelude::*;

use super::{KEY, RAW_NONCE, TOKEN};
use crate::auth::{handshake_mac, JobKey, Side, Transcript};
use crate::proto::core::{
    Action, ConnKey, Core, CoreConfig, CoreEvent, InputStep, NonceSource, Source,
};
use crate::wire::{FrameKind, Header, Hello, HelloKind, PeerId, Tag, HEADER_LEN, NONCE_LEN};

/// The acceptor's nonce in these tests: known in advance, so that the peer's stream can
/// hold its AUTH right behind its HELLO.
const NONCE_A: [u8; NONCE_LEN] = [0x11; NONCE_LEN];

fn core(cache: usize) -> Core {
    let mut c = Core::with_nonces(
        CoreConfig {
            recv_cache: cache,
            multishot: true,
            ..super::cfg(0)
        },
        NonceSource::new(|| Some(NONCE_A)),
    );
    c.add_peer(PeerId(1), vec!["10.0.0.2:7000".parse().unwrap()])
        .unwrap();
    c
}

/// One frame of a test stream: tag, payload, and the payload's offset in the stream.
type Sent = (u8, Vec<u8>, usize);

/// A peer's byte stream: its HELLO and AUTH, then the frames. Returns the stream and its
/// frames.
fn stream(sizes: &[usize]) -> (Vec<u8>, Vec<Sent>) {
    let mut hello = Hello::new(HelloKind::Hello, PeerId(1));
    hello.to = PeerId(0);
    hello.nonce = RAW_NONCE;
    let mut auth = Hello::new(HelloKind::Auth, PeerId(1));
    auth.to = PeerId(0);
    let t = Transcript {
        job_d: TOKEN,
        job_a: TOKEN,
        nonce_d: &RAW_NONCE,
        nonce_a: &NONCE_A,
        pid_d: PeerId(1),
        pid_a: PeerId(0),
        link: 0,
    };
    auth.mac = handshake_mac(&JobKey::from_bytes(KEY), Side::Dialer, &t);
    let mut s = hello.to_bytes().to_vec();
    s.extend_from_slice(&auth.to_bytes());
    let mut frames = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let p: Vec<u8> = (0..n).map(|j| (i * 131 + j * 7) as u8).collect();
        s.extend_from_slice(
            &Header {
                kind: FrameKind::Send,
                tag: Tag(i as u8),
                len: n as u32,
                ack: false,
                line: 0,
            }
            .to_bytes(),
        );
        frames.push((i as u8, p.clone(), s.len()));
        s.extend_from_slice(&p);
    }
    (s, frames)
}

/// What one delivery looked like: tag, payload, and where it was taken from (`Some(off)`:
/// in place, at stream offset `off`; `None`: from the reassembly buffer).
type Seen = (u8, Vec<u8>, Option<usize>);

/// Accepts a connection, feeds `s` cut at `cuts` (sizes of consecutive inputs) through
/// `input_step`, and returns every delivery.
fn feed(cache: usize, s: &[u8], cuts: &[usize]) -> Vec<Seen> {
    let now = Instant::now();
    let k = ConnKey(3);
    let mut c = core(cache);
    c.handle_accepted(now, k);
    assert!(matches!(c.poll_action(), Some(Action::ArmProvided(x)) if x == k));
    let mut seen = Vec::new();
    let mut off = 0;
    let mut ci = 0;
    while off < s.len() {
        let n = cuts.get(ci).copied().unwrap_or(usize::MAX).max(1);
        ci += 1;
        let input = &s[off..off + n.min(s.len() - off)];
        let mut rx = c.input_begin(k).expect("the cache stays with the engine");
        let mut at = 0;
        loop {
            match c.input_step(now, k, &mut rx, input, &mut at) {
                InputStep::Deliver { tag, src, .. } => match src {
                    Source::Input(r) => {
                        seen.push((tag.0, input[r.clone()].to_vec(), Some(off + r.start)))
                    }
                    Source::Cache(r) => seen.push((tag.0, rx.bytes(r).to_vec(), None)),
                },
                InputStep::Done => {
                    c.input_done(k, rx);
                    break;
                }
                InputStep::Drop => panic!("connection dropped"),
            }
        }
        assert_eq!(at, input.len(), "every byte of an input is consumed");
        off += input.len();
    }
    // The HELLO was accepted and no receive was ever requested again.
    let mut connected = false;
    while let Some(e) = c.poll_event() {
        connected |= e == CoreEvent::Connected(PeerId(1));
    }
    assert!(connected);
    while let Some(a) = c.poll_action() {
        assert!(!matches!(a, Action::Receive { .. }), "{a:?}");
    }
    seen
}

/// Checks `seen` against the frames, and that every frame lying wholly inside one input
/// was delivered in place.
fn check(s_len: usize, frames: &[Sent], cuts: &[usize], seen: &[Seen]) {
    assert_eq!(seen.len(), frames.len());
    // Input boundaries as stream offsets.
    let mut bounds = vec![0];
    let mut off = 0;
    for &n in cuts {
        if off >= s_len {
            break;
        }
        off += n.max(1).min(s_len - off);
        bounds.push(off);
    }
    if off < s_len {
        bounds.push(s_len);
    }
    let input_of = |x: usize| bounds.partition_point(|&b| b <= x);
    for ((tag, p, at), (stag, sp, sat)) in frames.iter().zip(seen) {
        assert_eq!((tag, p), (stag, sp));
        let head = at - HEADER_LEN;
        let end = at + p.len();
        // The frame lies in one input when its first and last bytes do.
        let whole = input_of(head) == input_of(end.max(head + HEADER_LEN) - 1);
        if whole {
            assert_eq!(*sat, Some(*at), "frame {tag} should be delivered in place");
        }
    }
}

#[test]
fn whole_inputs_are_zero_copy() {
    let (s, frames) = stream(&[0, 1, 100, 3000, 17]);
    let seen = feed(256, &s, &[usize::MAX]);
    check(s.len(), &frames, &[usize::MAX], &seen);
    assert!(seen.iter().all(|x| x.2.is_some()));
}

#[test]
fn byte_by_byte_and_large_payloads() {
    let (s, frames) = stream(&[5, 70_000, 0, 300, 1 << 20]);
    let cuts = vec![1; s.len()];
    let seen = feed(256, &s, &cuts);
    check(s.len(), &frames, &cuts, &seen);
    // Inputs of 16 KiB, as with the default ring: the 1 MiB payload is reassembled.
    let cuts = vec![16 * 1024; s.len() / (16 * 1024) + 1];
    let seen = feed(64 * 1024, &s, &cuts);
    check(s.len(), &frames, &cuts, &seen);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// However the stream is cut into inputs, the same frames come out in order, and
    /// every frame wholly inside one input is delivered as a range of it (zero copy).
    #[test]
    fn any_cut_yields_same_frames(
        sizes in proptest::collection::vec(
            prop_oneof![4 => 0usize..300, 1 => 300usize..5000],
            1..40,
        ),
        cuts in proptest::collection::vec(1usize..2000, 0..300),
        cache in 32usize..2048,
    ) {
        let (s, frames) = stream(&sizes);
        let seen = feed(cache, &s, &cuts);
        check(s.len(), &frames, &cuts, &seen);
    }
}
