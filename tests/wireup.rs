//! The transport side of wire-up on loopback: listening on the selected interfaces,
//! publishing and adding peers by `tcp://` URI lists, port ranges, and the probe.

mod common;

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::rc::Rc;
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use ringbtl::wireup::{parse_uri_list, IfMatch};
use ringbtl::{BackendKind, Config, Error, PeerId, ProbeError, Tag, Transport};

use common::drive;

const LIMIT: Duration = Duration::from_secs(10);

/// A config that listens on the loopback interface only (never on another interface of
/// the test machine).
fn lo_cfg(pid: u32) -> Config {
    let mut c = common::cfg(pid, BackendKind::Auto);
    c.wireup.listen = None;
    c.wireup.if_include = vec!["lo".parse::<IfMatch>().unwrap()];
    c
}

#[test]
fn selected_interfaces_are_published_and_reachable() {
    let mut a = Transport::new(lo_cfg(0)).unwrap();
    let mut b = Transport::new(lo_cfg(1)).unwrap();
    let ua = a.uris();
    let addrs = parse_uri_list(&ua).unwrap();
    assert!(!addrs.is_empty(), "{ua}");
    let port = addrs[0].port();
    assert!(port != 0);
    for x in &addrs {
        assert!(
            x.ip().is_loopback(),
            "{ua} publishes a non-loopback address"
        );
        assert_eq!(x.port(), port, "{ua}: one port for every address");
    }
    assert!(a.interfaces().unwrap().iter().all(|i| i.name == "lo"));
    assert_eq!(a.local_addr(), addrs[0]);

    a.add_peer_uris(PeerId(1), &b.uris()).unwrap();
    b.add_peer_uris(PeerId(0), &ua).unwrap();
    let got = Rc::new(Cell::new(0u32));
    for t in [&mut a, &mut b] {
        let g = got.clone();
        t.register(Tag(7), move |t2: &mut Transport, am| {
            assert_eq!(am.payload, b"ping");
            g.set(g.get() + 1);
            if am.src == PeerId(0) {
                t2.send(am.src, Tag(7), &[Bytes::from_static(b"ping")], 1)
                    .unwrap();
            }
        })
        .unwrap();
    }
    a.send(PeerId(1), Tag(7), &[Bytes::from_static(b"ping")], 0)
        .unwrap();
    drive(&mut [&mut a, &mut b], LIMIT, "ping and reply", || {
        got.get() == 2
    });
}

#[test]
fn default_listen_keeps_the_given_address() {
    let t = Transport::new(common::cfg(0, BackendKind::Auto)).unwrap();
    assert!(t.local_addr().ip().is_loopback());
    assert_eq!(t.uris(), format!("tcp://{}", t.local_addr()));
    assert!(t.interfaces().is_none());
}

#[test]
fn port_ranges() {
    // A port that was free a moment ago.
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = lo_cfg(0);
    c.wireup.ports = Some((free, free));
    let a = Transport::new(c.clone()).unwrap();
    assert!(parse_uri_list(&a.uris())
        .unwrap()
        .iter()
        .all(|x| x.port() == free));
    // The only port of the range is taken now.
    let e = Transport::new(c).unwrap_err().to_string();
    assert!(e.contains(&format!("{free}-{free}")), "{e}");
}

#[test]
fn bad_peer_uris_are_rejected_with_the_uri() {
    let mut a = Transport::new(lo_cfg(0)).unwrap();
    for bad in [
        "tcp://127.0.0.1",
        "udp://127.0.0.1:5",
        "tcp://127.0.0.1:5;;",
        "",
    ] {
        let e = a.add_peer_uris(PeerId(1), bad).unwrap_err().to_string();
        assert!(!e.is_empty(), "{bad:?} accepted");
    }
    let e = a
        .add_peer_uris(PeerId(1), "tcp://10.9.8.7:5;x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"x\""), "{e}");
    // Only an address no selected interface can reach: a clear error.
    let e = a
        .add_peer_uris(PeerId(1), "tcp://[fe80::1]:5")
        .unwrap_err()
        .to_string();
    assert!(e.contains("reachable") || e.contains("fe80"), "{e}");
}

#[test]
fn include_and_exclude_together_is_an_error() {
    let mut c = lo_cfg(0);
    c.wireup.if_exclude = vec!["eth0".parse().unwrap()];
    let e = Transport::new(c).unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
    let mut c = lo_cfg(0);
    c.wireup.if_include = vec!["no-such-if0".parse().unwrap()];
    let e = Transport::new(c).unwrap_err().to_string();
    assert!(e.contains("no-such-if0") && e.contains("lo"), "{e}");
}

#[test]
fn probe_finds_a_listening_transport() {
    let mut t = Transport::new(common::cfg(42, BackendKind::Auto)).unwrap();
    let addr = t.local_addr();
    let h = thread::spawn(move || ringbtl::wireup::probe(addr, LIMIT));
    while !h.is_finished() {
        t.progress().unwrap();
    }
    assert_eq!(h.join().unwrap().unwrap(), PeerId(42));
    // The probe left no endpoint and no refusal behind.
    assert_eq!(t.stats().refused, 0);
    assert_eq!(t.stats().bad_magic, 0);
}

#[test]
fn probe_nothing_listening() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = ringbtl::wireup::probe(addr, LIMIT).unwrap_err();
    assert!(
        matches!(e, Error::Probe(ProbeError::NothingListens(a)) if a == addr),
        "{e}"
    );
    assert!(e.to_string().contains("nothing listens"), "{e}");
}

/// A server that answers a connection with `answer` (after reading the probe) or holds it
/// open without answering until the prober closes it.
fn fake_server(answer: Option<Vec<u8>>) -> (SocketAddr, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut rec = [0u8; ringbtl::wire::HELLO_LEN];
        s.read_exact(&mut rec).unwrap();
        assert_eq!(&rec[..8], b"RINGBTL\0", "the probe starts with the magic");
        match answer {
            Some(a) => {
                let _ = s.write_all(&a);
            }
            None => {
                // Hold the connection unanswered until the prober gives up and closes it.
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                match s.read(&mut [0u8; 1]) {
                    Ok(0) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                    other => panic!("the prober should close the connection: {other:?}"),
                }
            }
        }
    });
    (addr, h)
}

#[test]
fn probe_something_else() {
    let (addr, h) = fake_server(Some(b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n".to_vec()));
    let e = ringbtl::wireup::probe(addr, LIMIT).unwrap_err();
    assert!(
        matches!(e, Error::Probe(ProbeError::NotRingbtl { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("magic"), "{e}");
    h.join().unwrap();

    let (addr, h) = fake_server(Some(Vec::new()));
    let e = ringbtl::wireup::probe(addr, LIMIT).unwrap_err();
    assert!(
        matches!(e, Error::Probe(ProbeError::NotRingbtl { .. })),
        "{e}"
    );
    h.join().unwrap();
}

#[test]
fn probe_timeout() {
    let (addr, h) = fake_server(None);
    let e = ringbtl::wireup::probe(addr, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, Error::Probe(ProbeError::Timeout { .. })), "{e}");
    assert!(e.to_string().contains("no answer"), "{e}");
    h.join().unwrap();
}
