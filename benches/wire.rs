//! Micro-benchmarks of the sans-IO hot paths: header codec, receive-cache parsing of a
//! 64 KiB read full of small frames, active-message dispatch of those frames, and
//! coalescing 64 queued frames into one batch.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringbtl::buf::{RxBuf, TxBatch};
use ringbtl::proto::am::AmTable;
use ringbtl::proto::deframe::{Frames, Next};
use ringbtl::wire::{FrameKind, Header, Tag};

fn header(c: &mut Criterion) {
    let h = Header {
        kind: FrameKind::Send,
        tag: Tag(9),
        len: 4096,
        ack: false,
        line: 0,
    };
    let b = h.to_bytes();
    c.bench_function("header/encode", |x| {
        x.iter(|| black_box(black_box(h).to_bytes()))
    });
    c.bench_function("header/parse", |x| {
        x.iter(|| Header::parse(black_box(&b), 1 << 20).unwrap())
    });
}

/// 64 KiB of frames with 8-byte payloads (their sequence numbers), tags cycling over
/// 1..=`tags`; returns the bytes and the number of frames.
fn small_frames(tags: u64) -> (Vec<u8>, u64) {
    let mut stream = Vec::new();
    let mut frames = 0u64;
    while stream.len() + 16 <= 64 * 1024 {
        stream.extend_from_slice(
            &Header {
                kind: FrameKind::Send,
                tag: Tag(1 + (frames % tags) as u8),
                len: 8,
                ack: false,
                line: 0,
            }
            .to_bytes(),
        );
        stream.extend_from_slice(&frames.to_le_bytes());
        frames += 1;
    }
    (stream, frames)
}

fn recv_cache(c: &mut Criterion) {
    // 64 KiB of 8-byte-payload frames, as one read would bring them.
    let (stream, frames) = small_frames(1);
    let mut g = c.benchmark_group("recv_cache");
    g.throughput(Throughput::Elements(frames));
    let mut rx = RxBuf::cache(64 * 1024);
    g.bench_function("parse_64KiB_of_8B_frames", |x| {
        x.iter(|| {
            let spare = rx.spare_mut();
            spare[..stream.len()].copy_from_slice(&stream);
            rx.commit(stream.len());
            let mut sum = 0u64;
            while let Next::Frame(_, r) = rx.next_frame(1 << 20).unwrap() {
                sum += rx.bytes(r)[0] as u64;
            }
            rx.compact();
            black_box(sum)
        })
    });
    g.finish();
}

/// Parse a 64 KiB read of 8-byte-payload frames on four tags and hand every payload to
/// its handler through the AM table (taken out for the call, put back after), as the
/// transport does.
fn am_dispatch(c: &mut Criterion) {
    let (stream, frames) = small_frames(4);
    type H = Box<dyn FnMut(&[u8], &mut u64)>;
    let mut table: AmTable<H> = AmTable::new();
    for t in 1..=4u8 {
        table
            .register(
                Tag(t),
                Box::new(|p: &[u8], acc: &mut u64| *acc += p[0] as u64),
            )
            .ok()
            .expect("fresh tag");
    }
    let mut g = c.benchmark_group("am");
    g.throughput(Throughput::Elements(frames));
    let mut rx = RxBuf::cache(64 * 1024);
    g.bench_function("parse_and_dispatch_64KiB_of_8B_frames", |x| {
        x.iter(|| {
            let spare = rx.spare_mut();
            spare[..stream.len()].copy_from_slice(&stream);
            rx.commit(stream.len());
            let mut acc = 0u64;
            while let Next::Frame(h, r) = rx.next_frame(1 << 20).unwrap() {
                if let Some(mut f) = table.take(h.tag) {
                    f(rx.bytes(r), &mut acc);
                    table.restore(h.tag, f);
                }
            }
            rx.compact();
            black_box(acc)
        })
    });
    g.finish();
}

fn coalesce(c: &mut Criterion) {
    let small = Bytes::from_static(&[7u8; 8]);
    let big = Bytes::from(vec![1u8; 16 * 1024]);
    let mut b = TxBatch::with_capacity(64 * 1024, 256);
    let hdr = Header {
        kind: FrameKind::Send,
        tag: Tag(1),
        len: 8,
        ack: false,
        line: 0,
    }
    .to_bytes();
    let mut g = c.benchmark_group("coalesce");
    g.throughput(Throughput::Elements(64));
    g.bench_function("64_small_frames_into_one_batch", |x| {
        x.iter(|| {
            b.clear();
            for _ in 0..64 {
                b.push_copy(&hdr);
                b.push_copy(&small);
            }
            let mut iov = 0;
            b.for_each_unsent(|_| iov += 1);
            black_box(iov)
        })
    });
    g.bench_function("64_16KiB_frames_by_reference", |x| {
        x.iter(|| {
            b.clear();
            for _ in 0..64 {
                b.push_copy(&hdr);
                b.push_ext(big.clone());
            }
            let mut iov = 0;
            b.for_each_unsent(|_| iov += 1);
            black_box(iov)
        })
    });
    g.finish();
}

// criterion_group! generates an undocumented function.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group!(benches, header, recv_cache, am_dispatch, coalesce);
}
use group::benches;
criterion_main!(benches);
