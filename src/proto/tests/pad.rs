//! Padding (`FLAG_PAD`): a copied payload whose largest segment is a page or more is
//! preceded by the padding that puts that segment, in the kernel's socket pages, at most 7
//! bytes before its own offset in a line; the receiver hands out the payload behind it.

use super::*;
use crate::wire::{FLAG_PAD, LINE};

/// The engine configuration of these tests: payloads are copied, never lent.
fn copying(pid: u32) -> CoreConfig {
    CoreConfig {
        splice_min: None,
        ..cfg(pid)
    }
}

#[test]
fn a_copied_payload_is_padded_to_its_place_in_the_line() {
    let mem = Bytes::from((0..9000u32).map(|i| i as u8).collect::<Vec<u8>>());
    for off in [0usize, 1, 7, 8, 13, 24, 40, 63] {
        let mut net = Net::new(off as u64, vec![copying(0), copying(1)]);
        let r = confirmed_raw_peer(&mut net);
        let head = Bytes::from_static(&[1; 24]);
        let data = mem.slice(off..off + 8192);
        let src = data.as_ptr() as usize;
        let now = net.now();
        let core = &mut net.nodes[0].core;
        let segs = [head.clone(), data.clone()];
        core.send(now, PeerId(1), Tag(2), &segs, 1).unwrap();
        net.run(false);
        // The next write starts with this frame: header, padding, head, data.
        let bytes = net.raw_read(r);
        let fs = frames(&bytes);
        let [(h, body)] = &fs[..] else {
            panic!("offset {off}: one frame, got {}", fs.len())
        };
        let pad = h.pad();
        assert!(pad % 8 == 0 && pad < LINE, "offset {off}: padding {pad}");
        assert_eq!(
            h.line != 0,
            u16::from_be_bytes(bytes[2..4].try_into().unwrap()) & FLAG_PAD != 0
        );
        let lands = Header::LEN + pad + head.len();
        let ahead = src.wrapping_sub(lands) % LINE;
        assert!(
            ahead < 8,
            "offset {off}: data lands {ahead} bytes before its place"
        );
        assert_eq!(&body[pad..pad + 24], &head[..]);
        assert_eq!(&body[pad + 24..], &data[..], "offset {off}");
        assert_eq!(h.len as usize, pad + 24 + 8192);
    }
}

/// Small payloads, and payloads of small segments only, go unpadded; a frame behind
/// others in the same write counts their bytes.
#[test]
fn padding_is_for_large_segments_and_counts_the_frames_before() {
    let mut net = Net::new(3, vec![copying(0), copying(1)]);
    let r = confirmed_raw_peer(&mut net);
    let mem = Bytes::from(vec![5u8; 20_000]);
    let now = net.now();
    let core = &mut net.nodes[0].core;
    // A write of three frames: a small one, one of many small segments, a large one.
    let small = [mem.slice(3..103)];
    let pieces: Vec<Bytes> = (0..5)
        .map(|i| mem.slice(i * 2000 + 1..(i + 1) * 2000))
        .collect();
    let large = [mem.slice(11..11 + 9000)];
    core.send(now, PeerId(1), Tag(1), &small, 1).unwrap();
    core.send(now, PeerId(1), Tag(2), &pieces, 2).unwrap();
    core.send(now, PeerId(1), Tag(3), &large, 3).unwrap();
    net.run(false);
    let bytes = net.raw_read(r);
    let fs = frames(&bytes);
    let pads: Vec<usize> = fs.iter().map(|(h, _)| h.pad()).collect();
    assert_eq!(&pads[..2], [0, 0], "small payloads are not padded");
    let at = fs[..2]
        .iter()
        .map(|(h, _)| Header::LEN + h.len as usize)
        .sum::<usize>();
    let src = large[0].as_ptr() as usize;
    let lands = at + Header::LEN + pads[2];
    assert!(
        src.wrapping_sub(lands) % LINE < 8,
        "the large payload lands in place behind {at} bytes (padding {})",
        pads[2]
    );
    assert_eq!(fs[2].1[pads[2]..], large[0][..]);
}

/// Padded frames from the peer, in every size class (in the cache, larger than it, cut
/// anywhere), with the receive cache and with provided buffers: each handler gets the
/// payload without its padding.
#[test]
fn the_receiver_hands_out_the_payload_behind_the_padding() {
    for multishot in [false, true] {
        for seed in 0..6u64 {
            let mut net = Net::new(
                seed,
                vec![
                    CoreConfig {
                        multishot,
                        ..copying(0)
                    },
                    copying(1),
                ],
            );
            let r = confirmed_raw_peer(&mut net);
            let mut stream = Vec::new();
            let mut want = vec![(9u8, b"hi".to_vec())];
            for (i, (len, pad)) in [(100usize, 8usize), (5000, 56), (70_000, 16), (300, 0)]
                .into_iter()
                .enumerate()
            {
                let payload: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
                let h = Header {
                    kind: FrameKind::Send,
                    tag: Tag(i as u8),
                    len: (pad + len) as u32,
                    ack: false,
                    line: pad as u8,
                };
                stream.extend_from_slice(&h.to_bytes());
                stream.extend(std::iter::repeat_n(0xee, pad));
                stream.extend_from_slice(&payload);
                want.push((i as u8, payload));
            }
            let mut rng = Rng::new(seed);
            let mut at = 0;
            while at < stream.len() {
                let n = (1 + rng.below(40_000)).min(stream.len() - at);
                net.raw_write(r, &stream[at..at + n]);
                net.run(false);
                at += n;
            }
            net.drive();
            assert_eq!(
                net.received(0, 1),
                want,
                "multishot {multishot}, seed {seed}: {:?}",
                net.failed_events(0)
            );
        }
    }
}

/// Engine to engine, copied payloads of every size and segment layout arrive whole.
#[test]
fn padded_traffic_between_engines_arrives_whole() {
    for seed in 0..10u64 {
        let mut net = Net::new(seed, vec![copying(0), copying(1)]);
        connect_pair(&mut net);
        for i in 0..30 {
            let len = [10, 4096, 5000, 65_000, 70_000, 200_000][i % 6];
            let payload: Vec<u8> = (0..len).map(|j| (j + i) as u8).collect();
            net.send_segs(0, 1, i as u8, payload.clone(), 1 + i % 3)
                .unwrap();
            net.send_segs(1, 0, i as u8, payload, 1 + i % 2).unwrap();
            if i % 4 == 0 {
                net.drive();
            }
        }
        net.drive();
        net.assert_all_delivered(0, 1);
        net.assert_all_delivered(1, 0);
    }
}
