//! A flood of idle connections against a job whose process may open 1,024 descriptors (a
//! common hard limit), once per compiled backend. The job (two transports in one process,
//! run under `prlimit --nofile=1024:1024`) listens; 4,500 idle connections from 18
//! loopback source addresses (127.0.0.1 to 127.0.0.18, the job's own among them) reach
//! one of its listeners; then rank 0 sends to rank 1 for the first time, which dials,
//! authenticates and echoes. The job must wire up (the echo back) within 2 s.
//!
//! - `flood_at_the_descriptor_limit`: strangers may hold at most half the descriptors, so
//!   admission closes the oldest of them and accepting never stops;
//! - `flood_with_descriptors_exhausted`: the job's process has also filled all but 32 of
//!   its descriptors with open files, so accepts fail with `EMFILE`: each failure closes
//!   the oldest stranger, and accepting goes on.
//!
//! The binary re-executes itself as the job (`RINGBTL_FD_CHILD` set), so it has its own
//! `main` (harness = false). Needs `prlimit` (util-linux) and, in this process, room for
//! 4,600 descriptors; without them each case fails, saying why.

mod common;

use std::cell::Cell;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringbtl::{BackendKind, PeerId, Tag, Transport};
use socket2::{Domain, Socket, Type};

/// Idle connections of the flood, and the loopback addresses they come from.
const FLOOD: usize = 4_500;
const SOURCES: u8 = 18;
/// The job's descriptor limit (soft and hard).
const LIMIT: u64 = 1024;
/// How long the job may take to wire up once the flood is in.
const WIRE_UP: Duration = Duration::from_secs(2);

fn main() {
    if let Ok(spec) = std::env::var("RINGBTL_FD_CHILD") {
        std::process::exit(child(&spec));
    }
    let mut kinds = Vec::new();
    if cfg!(feature = "uring") {
        kinds.push(BackendKind::Uring);
    }
    if cfg!(feature = "epoll") {
        kinds.push(BackendKind::Epoll);
    }
    let (mut passed, mut failed) = (0, 0);
    for kind in kinds {
        if !common::usable(kind) {
            continue;
        }
        for (name, fill) in [
            ("flood_at_the_descriptor_limit", false),
            ("flood_with_descriptors_exhausted", true),
        ] {
            let full = format!("{kind}::{name}");
            let start = Instant::now();
            let r = flood_while_the_job_wires_up(kind, fill);
            let took = start.elapsed().as_secs_f64();
            match r {
                Ok(detail) => {
                    println!("test {full} ... ok ({took:.2} s): {detail}");
                    passed += 1;
                }
                Err(why) => {
                    println!("test {full} ... FAILED ({took:.2} s): {why}");
                    failed += 1;
                }
            }
        }
    }
    println!("\n{passed} passed, {failed} failed");
    if failed > 0 || passed == 0 {
        std::process::exit(1);
    }
}

/// Starts the job under `prlimit`, floods its listener, tells it to wire up, and checks
/// the time it reports.
fn flood_while_the_job_wires_up(kind: BackendKind, fill: bool) -> Result<String, String> {
    raise_own_limit(FLOOD as u64 + 256)?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut job = Command::new("prlimit")
        .arg(format!("--nofile={LIMIT}:{LIMIT}"))
        .arg("--")
        .arg(exe)
        .env("RINGBTL_FD_CHILD", format!("{kind} {}", u8::from(fill)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("prlimit (util-linux) could not start the job: {e}"))?;
    let mut lines = BufReader::new(job.stdout.take().expect("piped")).lines();
    let mut next_line = || -> Result<String, String> {
        lines
            .next()
            .ok_or("the job ended early")?
            .map_err(|e| format!("reading the job: {e}"))
    };
    let result = (|| {
        let port: u16 = next_line()?
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .ok_or("the job did not say its port")?;
        let flood = flood(port)?;
        let connected = flood.iter().filter(|s| s.peer_addr().is_ok()).count();
        let mut stdin = job.stdin.take().expect("piped");
        writeln!(stdin, "go").map_err(|e| format!("telling the job to go: {e}"))?;
        let report = next_line()?;
        drop(flood);
        let ms: f64 = report
            .strip_prefix("wired up in ")
            .and_then(|r| r.split(' ').next())
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| format!("the job: {report}"))?;
        if ms > WIRE_UP.as_secs_f64() * 1e3 {
            return Err(format!("over {WIRE_UP:?}: {report}"));
        }
        Ok(format!(
            "{connected} of {FLOOD} flooding connections established; {report}"
        ))
    })();
    let _ = job.kill();
    let status = job
        .wait()
        .map_err(|e| format!("waiting for the job: {e}"))?;
    match result {
        Ok(detail) if status.success() || status.code().is_none() => Ok(detail),
        Ok(detail) => Err(format!("the job exited with {status}: {detail}")),
        Err(why) => Err(why),
    }
}

/// `FLOOD` idle connections to 127.0.0.1:`port`, from `SOURCES` loopback addresses in
/// turn, connecting without waiting; waits (up to 5 s) until the last has connected or
/// failed. They send nothing.
fn flood(port: u16) -> Result<Vec<Socket>, String> {
    let to: SocketAddr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).into();
    let mut socks = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        let from = SocketAddrV4::new(
            Ipv4Addr::new(127, 0, 0, 1 + (i % SOURCES as usize) as u8),
            0,
        );
        let s =
            Socket::new(Domain::IPV4, Type::STREAM, None).map_err(|e| format!("socket: {e}"))?;
        s.set_nonblocking(true)
            .map_err(|e| format!("nonblocking: {e}"))?;
        s.bind(&SocketAddr::from(from).into())
            .map_err(|e| format!("bind {from}: {e}"))?;
        match s.connect(&to.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(format!("flood connection {i}: {e}")),
        }
        socks.push(s);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let pending = socks
            .iter()
            .filter(|s| s.peer_addr().is_err() && matches!(s.take_error(), Ok(None)))
            .count();
        if pending == 0 {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(socks)
}

/// Raises this process's soft descriptor limit to at least `want` (up to the hard limit).
#[allow(unsafe_code)]
fn raise_own_limit(want: u64) -> Result<(), String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err("getrlimit failed".into());
    }
    if lim.rlim_cur >= want {
        return Ok(());
    }
    if lim.rlim_max < want {
        return Err(format!(
            "the flood needs {want} descriptors; the hard limit here is {}",
            lim.rlim_max
        ));
    }
    lim.rlim_cur = want;
    // SAFETY: `lim` is a valid rlimit, read during the call only.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err("setrlimit failed".into());
    }
    Ok(())
}

/// The job: ranks 0 and 1 in this process. Says `port P` (rank 1's listener), progresses
/// both until told `go` on stdin, then has rank 0 send to rank 1 and waits for the echo;
/// says `wired up in MS ms ...` (exit 0) or why not (exit 1).
fn child(spec: &str) -> i32 {
    let (kind, fill) = match spec.split_once(' ') {
        Some((k, f)) => (k.parse::<BackendKind>().expect("backend"), f == "1"),
        None => panic!("RINGBTL_FD_CHILD={spec:?}"),
    };
    let (mut a, mut b) = common::pair(kind);
    println!("port {}", b.local_addr().port());
    let _ = std::io::stdout().flush();
    // The rest of the descriptors, but 32, held by open files.
    let mut held: Vec<File> = Vec::new();
    if fill {
        while let Ok(f) = File::open("/dev/null") {
            held.push(f);
        }
        held.truncate(held.len().saturating_sub(32));
    }
    let go = Arc::new(AtomicBool::new(false));
    let g = go.clone();
    thread::spawn(move || {
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line).is_ok() && line.trim() == "go" {
            g.store(true, Ordering::Release);
        }
    });
    let back = Rc::new(Cell::new(false));
    let k = back.clone();
    a.register(Tag(2), move |_, _| k.set(true)).unwrap();
    b.register(Tag(1), |t, m| {
        t.send(m.src, Tag(2), &[Bytes::copy_from_slice(m.payload)], 0)
            .unwrap();
    })
    .unwrap();
    // The flood arrives while both progress.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !go.load(Ordering::Acquire) {
        if Instant::now() > deadline {
            println!("never told to go");
            return 1;
        }
        progress(&mut [&mut a, &mut b]);
    }
    let t0 = Instant::now();
    a.send(PeerId(1), Tag(1), &[Bytes::from_static(b"hello")], 1)
        .unwrap();
    let deadline = t0 + Duration::from_secs(10);
    while !back.get() {
        if Instant::now() > deadline {
            println!("no echo within 10 s: {:?}", b.stats());
            return 1;
        }
        progress(&mut [&mut a, &mut b]);
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let s = b.stats();
    println!(
        "wired up in {ms:.1} ms ({} strangers closed to make room, {} accepts failed, \
         at most {} strangers at once)",
        s.accept_overload,
        s.accept_errors,
        b.config().core.max_half_open
    );
    drop(held);
    0
}

fn progress(ts: &mut [&mut Transport]) {
    for t in ts.iter_mut() {
        t.progress().expect("progress");
    }
}
