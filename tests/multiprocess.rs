//! Two processes over loopback, once per compiled backend: a checked stream both ways,
//! and a peer killed with SIGKILL mid-stream. The test binary re-executes itself as the
//! peer (`RINGBTL_MP_CHILD` set), so it has its own `main` (harness = false).

mod common;

use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::{completions, failures, pattern, Stream};
use ringbtl::{BackendKind, FailReason, PeerId, Tag, Transport};

const N: u64 = 50_000; // per direction
const LARGE_EVERY: u64 = 200;
const WINDOW: u64 = 128;

fn main() {
    if let Ok(mode) = std::env::var("RINGBTL_MP_CHILD") {
        child(&mode);
        return;
    }
    // (backend, multishot receive)
    let mut kinds = Vec::new();
    if cfg!(feature = "uring") {
        kinds.push((BackendKind::Uring, false));
        kinds.push((BackendKind::Uring, true));
    }
    if cfg!(feature = "epoll") {
        kinds.push((BackendKind::Epoll, false));
    }
    type Case = (&'static str, fn(BackendKind));
    let tests: [Case; 2] = [
        ("stream_both_ways_checked", stream_both_ways_checked),
        (
            "sigkill_fails_outstanding_sends_once",
            sigkill_fails_outstanding_sends_once,
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (kind, multishot) in kinds {
        common::set_multishot(multishot);
        let name = if multishot {
            "uring_multishot".to_owned()
        } else {
            kind.to_string()
        };
        if !common::usable(kind) {
            continue;
        }
        for (t, f) in tests {
            let r = std::panic::catch_unwind(|| f(kind));
            match r {
                Ok(()) => {
                    println!("test {name}::{t} ... ok");
                    passed += 1;
                }
                Err(_) => {
                    println!("test {name}::{t} ... FAILED");
                    failed += 1;
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
/// Starts the peer process; returns it, its stdin (to send our address) and its address.
fn spawn_child(
    mode: &str,
    kind: BackendKind,
) -> (Child, std::process::ChildStdin, std::net::SocketAddr) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("RINGBTL_MP_CHILD", mode)
        .env("RINGBTL_BACKEND", kind.to_string())
        .env(
            "RINGBTL_RECV_MULTISHOT",
            if common::multishot() { "1" } else { "0" },
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn peer");
    let stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("ADDR ")
        .expect("peer address line")
        .parse()
        .unwrap();
    (child, stdin, addr)
}

fn wait_child(mut c: Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            panic!("peer process did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The peer: receive-and-check the parent's stream while sending its own.
fn child(mode: &str) {
    let c = ringbtl::Config::new(PeerId(1)).from_env().unwrap();
    let mut t = Transport::new(c).unwrap();
    println!("ADDR {}", t.local_addr());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    t.add_peer(PeerId(0), vec![line.trim().parse().unwrap()])
        .unwrap();
    match mode {
        "stream" => {
            let (got, _) = checker(&mut t, 1);
            let comp = completions(&mut t);
            let mut s = Stream::new(2, pattern());
            let mut sent = 0;
            let deadline = Instant::now() + Duration::from_secs(300);
            while got.get() < N || (comp.borrow().len() as u64) < N {
                while sent < N && sent - (comp.borrow().len() as u64) < WINDOW {
                    let m = s.next(LARGE_EVERY);
                    t.send(PeerId(0), Tag(m.tag), &m.segs, m.seq).unwrap();
                    sent += 1;
                }
                t.progress().unwrap();
                assert!(Instant::now() < deadline, "child timed out");
            }
            assert!(comp.borrow().iter().all(|c| c.result.is_ok()));
            t.shutdown(Duration::from_secs(10)).unwrap();
        }
        "sleep" => {
            // Take the first message, then stop reading (block in the handler) until
            // killed: the parent's later sends stay outstanding.
            t.register(Tag(1), |_, _| std::thread::sleep(Duration::from_secs(60)))
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                t.progress().unwrap();
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// Registers checking handlers for tags 1..=4; returns (count, large count).
fn checker(t: &mut Transport, seed: u64) -> (Rc<Cell<u64>>, Rc<Cell<u64>>) {
    common::register_checker(t, seed, LARGE_EVERY, pattern())
}

fn parent(kind: BackendKind) -> Transport {
    let mut c = common::cfg(0, kind);
    c.core.handshake_timeout = Duration::from_secs(5);
    Transport::new(c).unwrap()
}

fn stream_both_ways_checked(kind: BackendKind) {
    let mut t = parent(kind);
    let (child, mut stdin, addr) = spawn_child("stream", kind);
    writeln!(stdin, "{}", t.local_addr()).unwrap();
    t.add_peer(PeerId(1), vec![addr]).unwrap();
    let (got, large) = checker(&mut t, 2);
    let comp = completions(&mut t);
    let fails = failures(&mut t);
    let mut s = Stream::new(1, pattern());
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    while got.get() < N || (comp.borrow().len() as u64) < N {
        while sent < N && sent - (comp.borrow().len() as u64) < WINDOW {
            let m = s.next(LARGE_EVERY);
            t.send(PeerId(1), Tag(m.tag), &m.segs, m.seq).unwrap();
            sent += 1;
        }
        t.progress().unwrap();
        assert!(
            Instant::now() < deadline,
            "parent timed out at {}",
            got.get()
        );
    }
    common::assert_all_ok_in_order(&comp.borrow(), N as usize);
    assert!(large.get() >= 200, "large messages: {}", large.get());
    t.shutdown(Duration::from_secs(10)).unwrap();
    assert!(fails.borrow().is_empty(), "{:?}", fails.borrow());
    assert!(wait_child(child, Duration::from_secs(30)).success());
    println!(
        "  {} messages each way checked, {} of 64 KiB..4 MiB",
        N,
        large.get()
    );
}

fn sigkill_fails_outstanding_sends_once(kind: BackendKind) {
    let mut t = parent(kind);
    let (mut child, mut stdin, addr) = spawn_child("sleep", kind);
    writeln!(stdin, "{}", t.local_addr()).unwrap();
    t.add_peer(PeerId(1), vec![addr]).unwrap();
    let comp = completions(&mut t);
    let fails = failures(&mut t);
    let big = bytes::Bytes::from(vec![3u8; 1 << 20]);
    const M: u64 = 64;
    for i in 0..M {
        t.send(PeerId(1), Tag(1), std::slice::from_ref(&big), i)
            .unwrap();
    }
    // Let the connection come up and the socket buffers fill.
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        t.progress().unwrap();
    }
    assert!(
        t.pending(PeerId(1)) > 0,
        "sends must be outstanding when the peer dies"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed = Instant::now();
    while (comp.borrow().len() as u64) < M {
        t.progress().unwrap();
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "sends not completed after the kill"
        );
    }
    println!(
        "  all {M} sends completed {:?} after SIGKILL",
        killed.elapsed()
    );
    let c = comp.borrow();
    let mut cookies: Vec<u64> = c.iter().map(|c| c.cookie).collect();
    cookies.sort_unstable();
    cookies.dedup();
    assert_eq!(cookies.len() as u64, M, "exactly once each");
    let lost = c
        .iter()
        .filter(|c| matches!(c.result, Err(FailReason::ConnectionLost { .. })))
        .count();
    assert!(
        lost > 0,
        "{:?}",
        c.iter().map(|c| &c.result).collect::<Vec<_>>()
    );
    println!("  {lost} of {M} sends failed with ConnectionLost, the rest were written before");
    assert_eq!(fails.borrow().len(), 1);
    // Nothing more arrives later.
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        t.progress().unwrap();
    }
    assert_eq!(c.len() as u64, M);
}
