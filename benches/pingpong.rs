//! Loopback ping-pong through the public API, once per compiled backend, two transports
//! driven by one thread (so it measures the software path: submission, completion,
//! parsing, dispatch; the cross-core wake-up is what `ringbtl-bench latency` measures).

use std::cell::Cell;
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
            let mut round = |n: u64| {
                for _ in 0..n {
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
            round(100); // connect and warm up
            g.bench_with_input(BenchmarkId::new(name, size), &size, |x, _| {
                x.iter(|| round(1))
            });
        }
    }
    g.finish();
}

// criterion_group! generates an undocumented function.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group!(benches, pingpong);
}
use group::benches;
criterion_main!(benches);
