//! `Transport::prepare_wait`, on every compiled backend: a caller that waits outside the
//! transport, in `poll(2)` on the descriptor it returns, sleeps while nothing comes and
//! wakes when a message arrives, also after a spinning progress loop made the epoll
//! backend take its sockets out of the epoll set (its "quiet sockets").

mod common;

use std::cell::Cell;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::cfg;
use ringbtl::{BackendKind, PeerId, Tag, Transport};

backend_tests!(the_descriptor_wakes_for_each_message);

const TAG: Tag = Tag(3);
const ROUNDS: u32 = 20;

/// `poll(2)` on `fd` for reading, up to `ms`: whether it is readable.
fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd for the call; the descriptor stays the transport's
    // and open (the transport lives past the call).
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1 && p.revents & libc::POLLIN != 0
}

/// Passes of `t` until `done` holds, for at most 5 s.
fn progress_until(t: &mut Transport, what: &str, mut done: impl FnMut(&Transport) -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    while !done(t) {
        assert!(Instant::now() < end, "{what}: not within 5 s");
        t.progress().unwrap();
    }
}

fn the_descriptor_wakes_for_each_message(kind: BackendKind) {
    let mut a = Transport::new(cfg(0, kind)).unwrap();
    let mut b = Transport::new(cfg(1, kind)).unwrap();
    a.add_peer(PeerId(1), vec![b.local_addr()]).unwrap();
    b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    let got = Rc::new(Cell::new(0u32));
    let g = got.clone();
    a.register(TAG, move |_, am| {
        assert_eq!(am.payload, g.get().to_be_bytes());
        g.set(g.get() + 1);
    })
    .unwrap();
    let sent = Rc::new(Cell::new(0u32));
    let s = sent.clone();
    b.on_complete(move |c| {
        assert!(c.result.is_ok(), "send {} failed", c.cookie);
        s.set(s.get() + 1);
    });
    // The connection: both sides progress until a first message is in.
    b.send(
        PeerId(0),
        TAG,
        &[Bytes::copy_from_slice(&0u32.to_be_bytes())],
        0,
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while got.get() == 0 {
        assert!(Instant::now() < end, "{kind:?}: no connection within 5 s");
        a.progress().unwrap();
        b.progress().unwrap();
    }
    progress_until(&mut b, "the first send", |_| sent.get() == 1);
    for round in 1..ROUNDS {
        // `a` spins as a polling loop does (long enough for the epoll backend to take its
        // sockets out of the epoll set), then readies itself for a wait.
        for _ in 0..2_000 {
            a.progress().unwrap();
        }
        let fd = wait_fd(&mut a, kind, round);
        // The message comes while `a` waits outside it: the descriptor wakes.
        b.send(
            PeerId(0),
            TAG,
            &[Bytes::copy_from_slice(&round.to_be_bytes())],
            0,
        )
        .unwrap();
        progress_until(&mut b, "the send", |_| sent.get() == round + 1);
        assert!(
            readable(fd, 5_000),
            "{kind:?}: round {round}: the descriptor stayed quiet with a message waiting"
        );
        progress_until(&mut a, "the delivery", |_| got.get() == round + 1);
    }
    // Nothing more comes: after the last delivery the descriptor stays quiet.
    for _ in 0..2_000 {
        a.progress().unwrap();
    }
    let fd = wait_fd(&mut a, kind, ROUNDS);
    assert!(
        !readable(fd, 20),
        "{kind:?}: the descriptor woke with nothing to collect"
    );
}

/// `t`'s descriptor to wait on, after the passes that collect what it has (at most 5 s).
fn wait_fd(t: &mut Transport, kind: BackendKind, round: u32) -> RawFd {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(
            Instant::now() < end,
            "{kind:?}: round {round}: never ready to wait"
        );
        match t.prepare_wait().unwrap() {
            Some(fd) => return fd,
            None => {
                t.progress().unwrap();
            }
        }
    }
}
