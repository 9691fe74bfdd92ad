//! Backend selection when io_uring is unavailable (as with `kernel.io_uring_disabled`, a
//! seccomp profile or a memlock limit): `auto` falls back to epoll and works; forcing
//! io_uring is a clear error. The probe failure is simulated with the crate's test hook
//! `ringbtl::testing::make_uring_unavailable` (cargo feature `testing`, on for the crate's
//! own tests only), which holds for the whole process: so this file is its own test binary
//! and the failure never leaks into other tests.

use std::time::Duration;

use bytes::Bytes;
use ringbtl::{BackendKind, Config, Error, PeerId, Tag, Transport};

fn cfg(pid: u32, kind: BackendKind) -> Config {
    let mut c = Config::new(PeerId(pid));
    c.socket.backend = kind;
    c
}

#[test]
fn uring_probe_failure_selects_epoll_or_fails_clearly() {
    ringbtl::testing::make_uring_unavailable();

    // Forcing io_uring where it cannot run is an error, not a silent fallback.
    match Transport::new(cfg(0, BackendKind::Uring)) {
        Err(Error::NoBackend(why)) => assert!(why.contains("io_uring"), "{why}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(t) => panic!(
            "io_uring was forced unavailable but {} runs",
            t.backend_name()
        ),
    }

    let auto = Transport::new(cfg(0, BackendKind::Auto));
    if cfg!(feature = "epoll") {
        // `auto` falls back to epoll, says why, and works end to end.
        let mut a = auto.expect("auto falls back to epoll");
        assert_eq!(a.backend_name(), "epoll");
        if cfg!(feature = "uring") {
            let note = a.backend_note().expect("the fallback is explained");
            assert!(note.contains("io_uring unavailable"), "{note}");
        } else {
            assert_eq!(
                a.backend_note(),
                None,
                "no io_uring built in: nothing to explain"
            );
        }
        let mut b = Transport::new(cfg(1, BackendKind::Auto)).unwrap();
        assert_eq!(b.backend_name(), "epoll");
        a.add_peer(PeerId(1), vec![b.local_addr()]).unwrap();
        b.add_peer(PeerId(0), vec![a.local_addr()]).unwrap();
        let got = std::rc::Rc::new(std::cell::Cell::new(0));
        let g = got.clone();
        b.register(Tag(1), move |_, am| {
            assert_eq!(am.payload, b"over epoll");
            g.set(g.get() + 1);
        })
        .unwrap();
        for _ in 0..10 {
            a.send(PeerId(1), Tag(1), &[Bytes::from_static(b"over epoll")], 0)
                .unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while got.get() < 10 {
            a.progress().unwrap();
            b.progress().unwrap();
            assert!(
                std::time::Instant::now() < deadline,
                "no delivery over epoll"
            );
        }
    } else {
        // Only io_uring compiled in: nothing to fall back to.
        match auto {
            Err(Error::NoBackend(why)) => {
                assert!(why.contains("not compiled in"), "{why}")
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(t) => panic!("no backend should run, but {} does", t.backend_name()),
        }
    }
}

#[test]
fn backend_variable_is_validated() {
    let e = Config::new(PeerId(0))
        .with_vars(|k| (k == "RINGBTL_BACKEND").then(|| "kqueue".to_string()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("RINGBTL_BACKEND") && e.contains("uring"), "{e}");
}
