//! `Transport::wait_until` in every progress mode, on every compiled backend: the same
//! ping-pong completes, a condition that never holds ends at the deadline with `false`,
//! and a handler cannot re-enter it. Functional only: no time budget is asserted.

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::cfg;
use ringbtl::{BackendKind, Error, PeerId, ProgressMode, Tag, Transport};

backend_tests!(
    every_mode_ping_pongs,
    deadline_ends_the_wait,
    handlers_cannot_wait
);

const TAG: Tag = Tag(9);
const ROUNDS: u64 = 200;

fn modes() -> [ProgressMode; 4] {
    [
        ProgressMode::Poll,
        ProgressMode::Block,
        ProgressMode::SpinThenBlock(Duration::from_micros(20)),
        ProgressMode::SpinThenBlock(Duration::ZERO),
    ]
}

fn transport(pid: u32, kind: BackendKind, mode: ProgressMode) -> Transport {
    let mut c = cfg(pid, kind);
    c.progress = mode;
    Transport::new(c).unwrap()
}

/// Rank 1 in its own thread echoes `ROUNDS` messages; rank 0 waits for each echo.
fn every_mode_ping_pongs(kind: BackendKind) {
    for mode in modes() {
        let (addr_tx, addr_rx) = mpsc::channel();
        let (back_tx, back_rx) = mpsc::channel();
        let echo = std::thread::spawn(move || {
            let mut t = transport(1, kind, mode);
            addr_tx.send(t.local_addr()).unwrap();
            t.add_peer(PeerId(0), vec![back_rx.recv().unwrap()])
                .unwrap();
            let seen = Rc::new(Cell::new(0u64));
            let s = seen.clone();
            t.register(TAG, move |t, am| {
                s.set(s.get() + 1);
                let reply = [Bytes::copy_from_slice(am.payload)];
                t.send(am.src, TAG, &reply, s.get()).unwrap();
            })
            .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let done = t
                .wait_until(deadline, |t| {
                    seen.get() == ROUNDS && t.pending(PeerId(0)) == 0
                })
                .unwrap();
            assert!(done, "{mode}: rank 1 echoed {} of {ROUNDS}", seen.get());
            t.shutdown(Duration::from_secs(2)).unwrap();
        });
        let mut t = transport(0, kind, mode);
        back_tx.send(t.local_addr()).unwrap();
        t.add_peer(PeerId(1), vec![addr_rx.recv().unwrap()])
            .unwrap();
        let got = Rc::new(Cell::new(0u64));
        let g = got.clone();
        t.register(TAG, move |_, am| {
            assert_eq!(am.payload, g.get().to_be_bytes());
            g.set(g.get() + 1);
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        for i in 0..ROUNDS {
            t.send(
                PeerId(1),
                TAG,
                &[Bytes::copy_from_slice(&i.to_be_bytes())],
                i,
            )
            .unwrap();
            let ok = t.wait_until(deadline, |_| got.get() == i + 1).unwrap();
            assert!(ok, "{mode} on {kind:?}: no echo of message {i}");
        }
        t.shutdown(Duration::from_secs(2)).unwrap();
        echo.join().unwrap();
    }
}

/// Nothing arrives: the wait returns `false`, and not before the deadline.
fn deadline_ends_the_wait(kind: BackendKind) {
    for mode in modes() {
        let mut t = transport(0, kind, mode);
        let start = Instant::now();
        let deadline = start + Duration::from_millis(30);
        let mut checks = 0u64;
        let met = t
            .wait_until(deadline, |_| {
                checks += 1;
                false
            })
            .unwrap();
        assert!(!met, "{mode}");
        assert!(Instant::now() >= deadline, "{mode}: returned early");
        assert!(checks >= 1, "{mode}: the condition was never checked");
        // A condition that already holds returns at once, whatever the deadline.
        assert!(t.wait_until(start, |_| true).unwrap(), "{mode}");
    }
}

/// `wait_until` from inside a handler is refused, like `progress`.
fn handlers_cannot_wait(kind: BackendKind) {
    let mut a = transport(0, kind, ProgressMode::Poll);
    let mut b = transport(1, kind, ProgressMode::Poll);
    a.add_peer(PeerId(1), vec![b.local_addr()]).unwrap();
    b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    let refused = Rc::new(Cell::new(false));
    let r = refused.clone();
    b.register(TAG, move |t, _| {
        let e = t.wait_until(Instant::now(), |_| true);
        r.set(matches!(e, Err(Error::Reentrant(_))));
    })
    .unwrap();
    a.send(PeerId(1), TAG, &[Bytes::from_static(b"x")], 0)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !refused.get() && Instant::now() < deadline {
        a.progress().unwrap();
        b.progress().unwrap();
    }
    assert!(refused.get(), "wait_until inside a handler was not refused");
}
