//! Running out of descriptors while a peer connects: accepting fails with `EMFILE`, and
//! each backend pauses accepting instead of spinning on the failure (a blocking wait of
//! 300 ms makes a bounded number of passes and uses a bounded share of a core), then
//! accepts the waiting peer once descriptors are free again; and when one of the
//! transport's own connections closes during a long pause, it accepts at once rather than
//! at the end of the pause.
//!
//! A test binary of its own: it lowers the process's `RLIMIT_NOFILE` (soft and hard, so
//! that the transport's raise to the hard limit cannot undo it) and fills the descriptor
//! table, which no other test may share. Backends run one after the other in one test.

mod common;

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringbtl::proto::core::EndpointState;
use ringbtl::{BackendKind, PeerId, ProgressMode, Tag, Transport};

/// Descriptors the test process may have open.
const LIMIT: u64 = 256;
/// How long the starved acceptor waits.
const STARVED: Duration = Duration::from_millis(300);

#[test]
fn accept_backs_off_on_emfile_and_resumes() {
    lower_nofile(LIMIT).expect("setrlimit(RLIMIT_NOFILE)");
    let mut kinds = Vec::new();
    #[cfg(feature = "uring")]
    if common::usable(BackendKind::Uring) {
        kinds.push(BackendKind::Uring);
    }
    #[cfg(feature = "epoll")]
    kinds.push(BackendKind::Epoll);
    for kind in kinds {
        starve_and_resume(kind);
        resume_early_when_own_socket_closes(kind);
    }
}

/// Starved for 700 ms, the acceptor's pauses have doubled from 10 ms to 500 ms: the
/// current one began at 630 ms and ends at 1,130 ms. A connection of its own closes at
/// 700 ms (its peer goes away): the waiting peer must be accepted well before 1,130 ms.
fn resume_early_when_own_socket_closes(kind: BackendKind) {
    const LONG_STARVED: Duration = Duration::from_millis(700);
    let mut a = Transport::new(common::cfg(0, kind)).unwrap();
    let mut b = Transport::new(common::cfg(1, kind)).unwrap();
    let mut c = Transport::new(common::cfg(2, kind)).unwrap();
    for (id, t) in [(1, &b), (2, &c)] {
        a.add_peer(PeerId(id), vec![t.local_addr()]).unwrap();
    }
    b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    c.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    let got = Rc::new(Cell::new(0));
    let g = got.clone();
    a.register(Tag(1), move |_, _| g.set(g.get() + 1)).unwrap();

    // c connects to a and is heard: a holds a connection of its own.
    c.send(PeerId(0), Tag(1), &[Bytes::from_static(b"c")], 1)
        .unwrap();
    common::drive(
        &mut [&mut a, &mut c],
        Duration::from_secs(10),
        "c to a",
        || got.get() == 1,
    );
    // b dials; its connection waits in a's backlog.
    b.send(PeerId(0), Tag(1), &[Bytes::from_static(b"b")], 2)
        .unwrap();
    wait_in_backlog(&mut b, kind);

    let filler = fill_descriptors();
    let errors_before = a.stats().accept_errors;
    let t0 = Instant::now();
    a.wait_until(t0 + LONG_STARVED, |_| false).unwrap();
    assert!(
        a.stats().accept_errors > errors_before,
        "{kind:?}: accept never failed: the test starved nothing"
    );

    // c goes away: a sees its connection end and closes it, which ends the pause.
    drop(c);
    let closed = Instant::now();
    common::drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(20),
        "accepting after a connection of a's closed",
        || got.get() == 2,
    );
    let took = closed.elapsed();
    eprintln!("{kind:?}: accepted {took:?} after a's connection to c closed");
    assert!(
        took < Duration::from_millis(250),
        "{kind:?}: accepted {took:?} after a socket of a's closed, the pause's end: the \
         close did not end the pause"
    );
    drop(filler);
}

fn starve_and_resume(kind: BackendKind) {
    let mut ca = common::cfg(0, kind);
    ca.progress = ProgressMode::Block;
    let mut a = Transport::new(ca).unwrap();
    let mut b = Transport::new(common::cfg(1, kind)).unwrap();
    a.add_peer(PeerId(1), vec![b.local_addr()]).unwrap();
    b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
    let got = Rc::new(Cell::new(0));
    let g = got.clone();
    a.register(Tag(1), move |_, m| {
        assert_eq!(m.payload, b"after the drought");
        g.set(g.get() + 1);
    })
    .unwrap();
    let done = common::completions(&mut b);

    // b dials and says its part of the handshake; a has not accepted yet (the connection
    // waits in a's backlog).
    b.send(
        PeerId(0),
        Tag(1),
        &[Bytes::from_static(b"after the drought")],
        7,
    )
    .unwrap();
    wait_in_backlog(&mut b, kind);

    // Every descriptor taken: a's accept fails with EMFILE.
    let filler = fill_descriptors();
    assert!(!filler.is_empty());
    let errors_before = a.stats().accept_errors;
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    let mut passes = 0u64;
    a.wait_until(t0 + STARVED, |_| {
        passes += 1;
        false
    })
    .unwrap();
    let (wall, cpu) = (t0.elapsed(), thread_cpu() - cpu0);
    let errors = a.stats().accept_errors - errors_before;
    eprintln!(
        "{kind:?}: out of descriptors for {wall:?}: {passes} passes, {errors} accept errors, \
         {cpu:?} of CPU"
    );
    assert!(
        errors >= 1,
        "{kind:?}: accept never failed: the test starved nothing"
    );
    // A pause doubles from 10 ms: about 6 pauses in 300 ms. A spinning loop makes
    // hundreds of thousands of passes and uses the whole wall time.
    assert!(passes <= 100, "{kind:?}: {passes} passes while starved");
    assert!(
        errors <= 50,
        "{kind:?}: {errors} accept errors while starved"
    );
    assert!(cpu < wall / 3, "{kind:?}: {cpu:?} of CPU in {wall:?}");

    // Descriptors free again: the waiting peer is accepted and its message arrives.
    drop(filler);
    common::drive(
        &mut [&mut a, &mut b],
        Duration::from_secs(20),
        "accepting again after EMFILE",
        || got.get() == 1 && done.borrow().len() == 1,
    );
    assert_eq!(done.borrow()[0].result, Ok(()));
    assert_eq!(a.peer_state(PeerId(1)), Some(EndpointState::Connected));
}

/// Progresses `b` alone until its dial to peer 0 is connected and its part of the
/// handshake written: the connection waits in the acceptor's backlog.
fn wait_in_backlog(b: &mut Transport, kind: BackendKind) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.peer_state(PeerId(0)) != Some(EndpointState::ConnectAck) {
        assert!(Instant::now() < deadline, "{kind:?}: b never connected");
        b.progress().unwrap();
    }
}

/// Sets the soft and hard `RLIMIT_NOFILE` of this process to `n`.
fn lower_nofile(n: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: `lim` is a valid rlimit, read by the kernel during the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens `/dev/null` until the process runs out of descriptors; the files close when
/// dropped.
fn fill_descriptors() -> Vec<File> {
    let mut v = Vec::new();
    for _ in 0..=LIMIT {
        match File::open("/dev/null") {
            Ok(f) => v.push(f),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => return v,
            Err(e) => panic!("open /dev/null: {e}"),
        }
    }
    panic!("more than {LIMIT} descriptors opened under RLIMIT_NOFILE = {LIMIT}");
}

/// CPU time used by the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime: {}", io::Error::last_os_error());
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
