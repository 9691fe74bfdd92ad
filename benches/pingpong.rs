//! Loopback ping-pong through the public API, once per compiled backend, two transports
//! driven by one thread (so it measures the software path: submission, completion,
//! parsing, dispatch; the cross-core wake-up is what `ringbtl-bench latency` measures).
//!
//! `plain` is the same loop over two connected non-blocking sockets (`send` and `recv`
//! spun until the whole message has moved, as the busy-poll floor of `ringbtl-bench
//! latency --baseline`): the difference per round trip is what ringbtl adds. For counts
//! that do not depend on the machine's load, run it under callgrind and divide by the
//! round trips (see "Where the time goes" in the README):
//! `valgrind --tool=callgrind target/release/deps/pingpong-* --bench --profile-time 5 'pingpong/plain/8'`.

use std::cell::Cell;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ringbtl::{BackendKind, Config, PeerId, Tag, Transport};

fn pair(kind: BackendKind) -> Option<(Transport, Transport)> {
    let mk = |pid| {
        let mut c = Config::new(PeerId(pid));
        c.socket.backend = kind;
        Transport::new(c)
    };
    let (mut a, mut b) = (mk(0).ok()?, mk(1).ok()?);
    a.add_peer(PeerId(1), vec![b.local_addr()]).ok()?;
    b.add_peer(PeerId(0), vec![a.local_addr()]).ok()?;
    Some((a, b))
}

/// Two connected non-blocking loopback sockets with TCP_NODELAY.
fn plain_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    for s in [&a, &b] {
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
    }
    Ok((a, b))
}

/// Writes all of `buf` to a non-blocking socket, spinning on `WouldBlock`.
fn spin_write(mut s: &TcpStream, buf: &[u8]) {
    let mut at = 0;
    while at < buf.len() {
        match s.write(&buf[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("plain send: {e}"),
        }
    }
}

/// Reads exactly `buf.len()` bytes from a non-blocking socket, spinning on `WouldBlock`.
fn spin_read(mut s: &TcpStream, buf: &mut [u8]) {
    let mut at = 0;
    while at < buf.len() {
        match s.read(&mut buf[at..]) {
            Ok(0) => panic!("plain recv: end of stream"),
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("plain recv: {e}"),
        }
    }
}

/// Prints how many round trips a benchmark made (warm-up included), so that a run under
/// callgrind can be divided into instructions per round trip.
fn report_rounds(name: &str, size: usize, n: u64) {
    if n > 100 {
        eprintln!("pingpong/{name}/{size}: {n} round trips");
    }
}

fn pingpong(c: &mut Criterion) {
    let mut kinds = Vec::new();
    if cfg!(feature = "uring") {
        kinds.push(("uring", BackendKind::Uring));
    }
    if cfg!(feature = "epoll") {
        kinds.push(("epoll", BackendKind::Epoll));
    }
    let mut g = c.benchmark_group("pingpong");
    g.measurement_time(Duration::from_secs(3));
    for size in [8usize, 4096, 65536] {
        let (a, b) = plain_pair().expect("loopback socket pair");
        let out = vec![1u8; size];
        let (mut at_b, mut at_a) = (vec![0u8; size], vec![0u8; size]);
        let rounds = Cell::new(0u64);
        let mut round = || {
            rounds.set(rounds.get() + 1);
            spin_write(&a, &out);
            spin_read(&b, &mut at_b);
            spin_write(&b, &at_b);
            spin_read(&a, &mut at_a);
        };
        g.bench_with_input(BenchmarkId::new("plain", size), &size, |x, _| {
            // Warm-up here, so that a filtered-out size costs nothing (callgrind counts).
            if rounds.get() == 0 {
                for _ in 0..100 {
                    round();
                }
            }
            x.iter(&mut round)
        });
        report_rounds("plain", size, rounds.get());
    }
    for (name, kind) in kinds {
        for size in [8usize, 4096, 65536] {
            let Some((mut a, mut b)) = pair(kind) else {
                eprintln!("skipped: backend {name} unavailable here");
                continue;
            };
            let payload = Bytes::from(vec![1u8; size]);
            let reply = payload.clone();
            b.register(Tag(1), move |t, am| {
                let _ = t.send(am.src, Tag(2), std::slice::from_ref(&reply), 0);
            })
            .expect("fresh tag");
            let got = Rc::new(Cell::new(0u64));
            let g2 = got.clone();
            a.register(Tag(2), move |_, _| g2.set(g2.get() + 1))
                .expect("fresh tag");
            let rounds = Cell::new(0u64);
            let mut round = |n: u64| {
                for _ in 0..n {
                    rounds.set(rounds.get() + 1);
                    let want = got.get() + 1;
                    a.send(PeerId(1), Tag(1), std::slice::from_ref(&payload), 0)
                        .expect("send");
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while got.get() < want {
                        a.progress().expect("progress");
                        b.progress().expect("progress");
                        assert!(Instant::now() < deadline, "ping-pong stalled");
                    }
                }
            };
            g.bench_with_input(BenchmarkId::new(name, size), &size, |x, _| {
                if rounds.get() == 0 {
                    round(100); // connect and warm up
                }
                x.iter(|| round(1))
            });
            report_rounds(name, size, rounds.get());
        }
    }
    g.finish();
}

/// Messages per window of [`window`].
const WINDOW: u64 = 64;

/// Message rate in one thread (osu_mbw_mr's loop without the wake-ups): `a` queues a window
/// of 64 messages of 8 B, `b` answers the 64th with one message, both driven by one thread.
/// Per message, it measures what ringbtl does for a small message: queue, coalesce,
/// submit, receive, parse and dispatch. Under callgrind, instructions per message =
/// total / (64 x windows printed).
fn window(c: &mut Criterion) {
    let mut kinds = Vec::new();
    if cfg!(feature = "uring") {
        kinds.push(("uring", BackendKind::Uring));
    }
    if cfg!(feature = "epoll") {
        kinds.push(("epoll", BackendKind::Epoll));
    }
    let mut g = c.benchmark_group("window");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(criterion::Throughput::Elements(WINDOW));
    for (name, kind) in kinds {
        let Some((mut a, mut b)) = pair(kind) else {
            eprintln!("skipped: backend {name} unavailable here");
            continue;
        };
        let payload = Bytes::from(vec![1u8; 8]);
        let seen = Rc::new(Cell::new(0u64));
        let s2 = seen.clone();
        let ack = payload.clone();
        b.register(Tag(1), move |t, am| {
            s2.set(s2.get() + 1);
            if s2.get().is_multiple_of(WINDOW) {
                let _ = t.send(am.src, Tag(2), std::slice::from_ref(&ack), 0);
            }
        })
        .expect("fresh tag");
        let acks = Rc::new(Cell::new(0u64));
        let a2 = acks.clone();
        a.register(Tag(2), move |_, _| a2.set(a2.get() + 1))
            .expect("fresh tag");
        let windows = Cell::new(0u64);
        let mut one = || {
            windows.set(windows.get() + 1);
            let want = acks.get() + 1;
            for _ in 0..WINDOW {
                a.send(PeerId(1), Tag(1), std::slice::from_ref(&payload), 0)
                    .expect("send");
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while acks.get() < want {
                a.progress().expect("progress");
                b.progress().expect("progress");
                assert!(Instant::now() < deadline, "window stalled");
            }
        };
        g.bench_function(BenchmarkId::new(name, 8), |x| {
            if windows.get() == 0 {
                for _ in 0..100 {
                    one(); // connect and warm up
                }
            }
            x.iter(&mut one)
        });
        if windows.get() > 100 {
            eprintln!("window/{name}/8: {} windows of {WINDOW}", windows.get());
        }
    }
    g.finish();
}

/// One idle progress pass of a connected transport (nothing arrives, nothing is queued):
/// what a busy-polling rank spends between two looks at its sockets, so half of it is, on
/// average, added to the latency of every message that arrives. Under callgrind,
/// instructions per pass = total / passes printed.
fn idle(c: &mut Criterion) {
    let mut kinds = Vec::new();
    if cfg!(feature = "uring") {
        kinds.push(("uring", BackendKind::Uring));
    }
    if cfg!(feature = "epoll") {
        kinds.push(("epoll", BackendKind::Epoll));
    }
    let mut g = c.benchmark_group("idle");
    g.measurement_time(Duration::from_secs(3));
    for (name, kind) in kinds {
        let Some((mut a, mut b)) = pair(kind) else {
            eprintln!("skipped: backend {name} unavailable here");
            continue;
        };
        let got = Rc::new(Cell::new(0u64));
        let g2 = got.clone();
        b.register(Tag(1), move |_, _| g2.set(g2.get() + 1))
            .expect("fresh tag");
        let payload = Bytes::from(vec![1u8; 8]);
        let passes = Cell::new(0u64);
        g.bench_function(BenchmarkId::new(name, 0), |x| {
            if passes.get() == 0 {
                // Connect both ways (each side's first message), then stay idle.
                a.send(PeerId(1), Tag(1), std::slice::from_ref(&payload), 0)
                    .expect("send");
                let deadline = Instant::now() + Duration::from_secs(10);
                while got.get() < 1 {
                    a.progress().expect("progress");
                    b.progress().expect("progress");
                    assert!(Instant::now() < deadline, "connect stalled");
                }
                for _ in 0..100 {
                    a.progress().expect("progress");
                    b.progress().expect("progress");
                }
            }
            x.iter(|| {
                passes.set(passes.get() + 1);
                b.progress().expect("progress")
            })
        });
        if passes.get() > 100 {
            eprintln!("idle/{name}/0: {} passes", passes.get());
        }
    }
    g.finish();
}

// criterion_group! generates an undocumented function.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group!(benches, pingpong, window, idle);
}
use group::benches;
criterion_main!(benches);
