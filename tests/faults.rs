//! The fault matrix on loopback, once per compiled backend: a checked stream both ways
//! between this process and a peer process, and a fault in the middle of it.
//!
//! - `sigkill_mid_stream_fails_each_send_once`: the peer is killed (`SIGKILL`)
//!   mid-stream: the connection fails at once, every pending send completes exactly once
//!   with an error, and what arrived before was intact and in order.
//! - `sigstop_within_user_timeout_resumes`: the peer is stopped (`SIGSTOP`) until the
//!   stream has stalled, for less than `TCP_USER_TIMEOUT`, then continued (`SIGCONT`):
//!   the stream resumes and completes, every message intact, in order, once.
//! - `sigstop_past_user_timeout_fails_each_send_once`: the peer stays stopped until the
//!   kernel aborts the connection (`TCP_USER_TIMEOUT` of 1 s): every pending send
//!   completes exactly once with an error; continued, the peer fails the same way.
//! - `rst_mid_stream_fails_each_send_once`: in a network namespace of its own, an
//!   nftables rule (`reject with tcp reset`) resets the connection mid-stream: both sides
//!   fail, every send completes exactly once.
//! - `link_down_fails_each_send_once`: the two processes in two namespaces joined by a
//!   veth pair; the peer's end goes down mid-stream: with `TCP_USER_TIMEOUT` at 1 s both
//!   sides fail (timed out, or unreachable on the side whose route went with the link),
//!   every send completes exactly once.
//!
//! The last two need root, `ip` and `nft`; skipped with the reason otherwise (a failure
//! with `RINGBTL_REQUIRE_ALL=1`).
//!
//! In every case each send `send()` accepted completes exactly once (counted by cookie),
//! the completions that succeeded come first in send order, and every message delivered
//! was checked (content, order, count). `multiprocess.rs` kills a peer that stopped
//! reading; packet loss between hosts, and a link going down under `ringbtl-bench`, are
//! in `bench/tests/netns.rs`.
//!
//! The test binary re-executes itself as the peer (`RINGBTL_FAULT_CHILD` set), so it has
//! its own `main` (harness = false). Arguments that are not options select the cases
//! whose name contains one of them.

mod common;

use std::cell::RefCell;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::rc::Rc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::{completions, failures, pattern, Stream};
use ringbtl::{BackendKind, Cause, Completion, FailReason, PeerId, Tag, Transport};

/// Messages each way.
const N: u64 = 4000;
/// One message in this many is large (64 KiB..4 MiB).
const LARGE_EVERY: u64 = 100;
/// Sends outstanding at most, per side.
const WINDOW: u64 = 128;
/// The fault is injected once this many messages have arrived and left.
const FAULT_AT: u64 = N / 3;
/// Time any one phase of a case may take before the case fails.
const PHASE_LIMIT: Duration = Duration::from_secs(30);
/// The peer's own limit on its whole run.
const CHILD_LIMIT: Duration = Duration::from_secs(90);
/// `TCP_USER_TIMEOUT` when the peer is stopped for less than it.
const LONG_USER_TIMEOUT: Duration = Duration::from_secs(20);
/// `TCP_USER_TIMEOUT` when the peer is stopped for longer.
const SHORT_USER_TIMEOUT: Duration = Duration::from_secs(1);
/// Socket buffers on both sides, far smaller than the rest of a stream when the fault
/// comes (about 60 MB), so that sends are still pending then.
const SOCKET_BUF: usize = 256 << 10;
/// The stream counts as stalled when nothing moved for this long.
const STALL: Duration = Duration::from_secs(1);
/// The job key of both sides: the connections are authenticated, as in a real job.
const JOB_KEY: &str = "6661756c74732d6d61747269782d6a6f622d6b65792d666f722d74657374732e";

/// A case: its name, and its body, which returns whether it ran (not skipped).
type Case = (&'static str, fn(BackendKind) -> bool);

fn main() {
    if std::env::var_os("RINGBTL_FAULT_CHILD").is_some() {
        child();
        return;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut kinds = Vec::new();
    if cfg!(feature = "uring") {
        kinds.push(BackendKind::Uring);
    }
    if cfg!(feature = "epoll") {
        kinds.push(BackendKind::Epoll);
    }
    let cases: [Case; 5] = [
        (
            "sigkill_mid_stream_fails_each_send_once",
            sigkill_mid_stream_fails_each_send_once,
        ),
        (
            "sigstop_within_user_timeout_resumes",
            sigstop_within_user_timeout_resumes,
        ),
        (
            "sigstop_past_user_timeout_fails_each_send_once",
            sigstop_past_user_timeout_fails_each_send_once,
        ),
        (
            "rst_mid_stream_fails_each_send_once",
            rst_mid_stream_fails_each_send_once,
        ),
        (
            "link_down_fails_each_send_once",
            link_down_fails_each_send_once,
        ),
    ];
    let (mut passed, mut skipped, mut failed) = (0, 0, 0);
    for kind in kinds {
        if !common::usable(kind) {
            continue;
        }
        let backend = kind.to_string();
        for (name, f) in cases {
            let full = format!("{backend}::{name}");
            if !filters.is_empty() && !filters.iter().any(|f| full.contains(f.as_str())) {
                continue;
            }
            let start = Instant::now();
            // On a thread named for the case, which a skip names.
            let r = thread::Builder::new()
                .name(full.clone())
                .spawn(move || f(kind))
                .expect("thread")
                .join();
            let took = start.elapsed().as_secs_f64();
            if let Ok(ran) = r {
                let how = if ran { "ok" } else { "skipped" };
                println!("test {full} ... {how} ({took:.2} s)");
                if ran {
                    passed += 1;
                } else {
                    skipped += 1;
                }
            } else {
                println!("test {full} ... FAILED ({took:.2} s)");
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {skipped} skipped, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
/// What the peer printed at the end of its run.
#[derive(Debug, Default, PartialEq, Eq)]
struct Report {
    /// Sends accepted.
    sent: u64,
    /// Completions seen, and how many distinct cookies they carried.
    completed: u64,
    distinct: u64,
    ok: u64,
    /// Whether some completion succeeded after one in front of it (in send order) failed.
    ok_after_err: bool,
    /// Messages received and checked.
    got: u64,
    /// Peer failures reported (`on_error`).
    failures: u64,
}

impl Report {
    fn line(&self) -> String {
        format!(
            "RESULT sent={} completed={} distinct={} ok={} ok_after_err={} got={} failures={}",
            self.sent,
            self.completed,
            self.distinct,
            self.ok,
            u64::from(self.ok_after_err),
            self.got,
            self.failures
        )
    }

    fn parse(out: &str) -> Option<Self> {
        let line = out.lines().find_map(|l| l.strip_prefix("RESULT "))?;
        let mut r = Self::default();
        for kv in line.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            let v: u64 = v.parse().ok()?;
            match k {
                "sent" => r.sent = v,
                "completed" => r.completed = v,
                "distinct" => r.distinct = v,
                "ok" => r.ok = v,
                "ok_after_err" => r.ok_after_err = v != 0,
                "got" => r.got = v,
                "failures" => r.failures = v,
                _ => return None,
            }
        }
        Some(r)
    }

    fn of(sent: u64, comp: &[Completion], got: u64, failures: u64) -> Self {
        let mut cookies: Vec<u64> = comp.iter().map(|c| c.cookie).collect();
        cookies.sort_unstable();
        cookies.dedup();
        let mut by_cookie: Vec<&Completion> = comp.iter().collect();
        by_cookie.sort_by_key(|c| c.cookie);
        let first_err = by_cookie.iter().position(|c| c.result.is_err());
        let ok_after_err =
            first_err.is_some_and(|i| by_cookie[i..].iter().any(|c| c.result.is_ok()));
        Self {
            sent,
            completed: comp.len() as u64,
            distinct: cookies.len() as u64,
            ok: comp.iter().filter(|c| c.result.is_ok()).count() as u64,
            ok_after_err,
            got,
            failures,
        }
    }

    /// Every accepted send completed exactly once; no send succeeded behind a failed one.
    fn assert_exactly_once(&self, who: &str) {
        assert_eq!(
            (self.completed, self.distinct),
            (self.sent, self.sent),
            "{who}: {self:?}: every accepted send completes exactly once"
        );
        assert!(
            !self.ok_after_err,
            "{who}: {self:?}: a send succeeded after an earlier one failed"
        );
    }
}

/// The peer: streams to the parent and checks the parent's stream until both are done
/// or its connection failed and every accepted send completed; then prints a
/// [`Report`]. `TCP_USER_TIMEOUT` and the backend come from the environment.
fn child() {
    let c = ringbtl::Config::new(PeerId(1)).from_env().unwrap();
    let mut t = Transport::new(c).unwrap();
    println!("ADDR {}", t.local_addr());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    t.add_peer(PeerId(0), vec![line.trim().parse().unwrap()])
        .unwrap();
    let (got, _) = common::register_checker(&mut t, 1, LARGE_EVERY, pattern());
    let comp = completions(&mut t);
    let fails = failures(&mut t);
    let mut s = Stream::new(2, pattern());
    let mut sent = 0;
    let deadline = Instant::now() + CHILD_LIMIT;
    loop {
        let done = comp.borrow().len() as u64;
        let failed = !fails.borrow().is_empty();
        if (got.get() >= N && done >= N) || (failed && done >= sent) {
            break;
        }
        while !failed && sent < N && sent - (comp.borrow().len() as u64) < WINDOW {
            let m = s.next(LARGE_EVERY);
            if t.send(PeerId(0), Tag(m.tag), &m.segs, m.seq).is_err() {
                break;
            }
            sent += 1;
        }
        t.progress().unwrap();
        if Instant::now() > deadline {
            eprintln!("peer: still running after {CHILD_LIMIT:?}");
            break;
        }
    }
    // Nothing completes twice later on.
    let settle = Instant::now() + Duration::from_millis(100);
    while Instant::now() < settle {
        t.progress().unwrap();
    }
    let r = Report::of(sent, &comp.borrow(), got.get(), fails.borrow().len() as u64);
    println!("{}", r.line());
    for (p, why) in fails.borrow().iter() {
        println!("FAILURE {p}: {why}");
    }
    std::io::stdout().flush().unwrap();
    let _ = t.shutdown(Duration::from_secs(2));
}

/// The peer process; killed (and continued first, were it stopped) on drop.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    addr: std::net::SocketAddr,
    out: Option<JoinHandle<String>>,
}

impl Peer {
    fn spawn(kind: BackendKind, user_timeout: Duration) -> Self {
        Self::spawn_in(kind, user_timeout, None)
    }

    /// The peer in network namespace `ns` (with its listen address), if given.
    fn spawn_in(kind: BackendKind, user_timeout: Duration, ns: Option<(&str, &str)>) -> Self {
        let ms = user_timeout.as_millis().to_string();
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match ns {
            // `ip netns exec` execs the program: the child's pid is the peer's.
            Some((ns, listen)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(exe);
                c.env("RINGBTL_LISTEN", listen);
                c
            }
            None => Command::new(exe),
        };
        let mut child = cmd
            .env("RINGBTL_FAULT_CHILD", "1")
            .env("RINGBTL_BACKEND", kind.to_string())
            .env("RINGBTL_TCP_USER_TIMEOUT_MS", &ms)
            .env("RINGBTL_RECV_MULTISHOT", "0")
            .env("RINGBTL_JOB_KEY", JOB_KEY)
            .env("RINGBTL_SNDBUF", SOCKET_BUF.to_string())
            .env("RINGBTL_RCVBUF", SOCKET_BUF.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn peer");
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("ADDR ")
            .unwrap_or_else(|| panic!("peer address line: {line:?}"))
            .parse()
            .unwrap();
        let out = thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Self {
            child,
            stdin,
            addr,
            out: Some(out),
        }
    }

    fn tell(&mut self, addr: std::net::SocketAddr) {
        let mut stdin = self.stdin.take().unwrap();
        writeln!(stdin, "{addr}").unwrap();
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill has no memory preconditions; the pid is our own unreaped child.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {sig}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// Waits (bounded) for the peer to exit; returns its report and whole output.
    fn finish(mut self) -> (Report, String) {
        let deadline = Instant::now() + PHASE_LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "peer process did not exit");
            thread::sleep(Duration::from_millis(10));
        };
        let out = self.out.take().unwrap().join().unwrap();
        assert!(status.success(), "peer exited with {status}: {out}");
        let r = Report::parse(&out).unwrap_or_else(|| panic!("no report from the peer: {out}"));
        (r, out)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// This side of a case: the transport, its stream, its checker and its logs.
struct Side {
    t: Transport,
    s: Stream,
    sent: u64,
    /// Messages sent at most for now (the whole stream once the fault is in).
    cap: u64,
    got: Rc<std::cell::Cell<u64>>,
    comp: Rc<RefCell<Vec<Completion>>>,
    fails: Rc<RefCell<Vec<(PeerId, FailReason)>>>,
}

impl Side {
    fn new(kind: BackendKind, user_timeout: Duration, peer: &mut Peer) -> Self {
        Self::listening(kind, user_timeout, peer, None)
    }

    /// This side, listening on `listen` if given.
    fn listening(
        kind: BackendKind,
        user_timeout: Duration,
        peer: &mut Peer,
        listen: Option<std::net::SocketAddr>,
    ) -> Self {
        let mut c = common::cfg(0, kind);
        if listen.is_some() {
            c.wireup.listen = listen;
        }
        c.socket.recv_multishot = false;
        c.set("RINGBTL_JOB_KEY", JOB_KEY).unwrap();
        c.socket.tcp_user_timeout = Some(user_timeout);
        c.socket.sndbuf = Some(SOCKET_BUF);
        c.socket.rcvbuf = Some(SOCKET_BUF);
        let mut t = Transport::new(c).unwrap();
        peer.tell(t.local_addr());
        t.add_peer(PeerId(1), vec![peer.addr]).unwrap();
        let (got, _) = common::register_checker(&mut t, 2, LARGE_EVERY, pattern());
        let comp = completions(&mut t);
        let fails = failures(&mut t);
        Self {
            t,
            s: Stream::new(1, pattern()),
            sent: 0,
            cap: FAULT_AT,
            got,
            comp,
            fails,
        }
    }

    /// Streams until [`FAULT_AT`] messages have left and arrived, sending no further
    /// meanwhile: this side then has far more left to send than the socket buffers hold,
    /// and the fault catches sends pending.
    fn midway(&mut self) {
        self.until("before the fault", |s| {
            s.got.get() >= FAULT_AT && s.completed() >= FAULT_AT
        });
        self.cap = N;
    }

    fn completed(&self) -> u64 {
        self.comp.borrow().len() as u64
    }

    fn failed(&self) -> bool {
        !self.fails.borrow().is_empty()
    }

    /// Keeps the window full (until the stream is sent or the peer failed), one pass.
    fn pass(&mut self) {
        while !self.failed() && self.sent < self.cap && self.sent - self.completed() < WINDOW {
            let m = self.s.next(LARGE_EVERY);
            match self.t.send(PeerId(1), Tag(m.tag), &m.segs, m.seq) {
                Ok(()) => self.sent += 1,
                Err(e) => {
                    assert!(self.failed(), "send refused while the peer is up: {e}");
                    break;
                }
            }
        }
        self.t.progress().unwrap();
    }

    /// Streams until `done`, failing the case past [`PHASE_LIMIT`].
    fn until(&mut self, what: &str, mut done: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + PHASE_LIMIT;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "timed out {what}: sent {}, completed {}, received {}, failures {:?}",
                self.sent,
                self.completed(),
                self.got.get(),
                self.fails.borrow()
            );
            self.pass();
        }
    }

    /// Streams until nothing moved (no completion, no message) for [`STALL`].
    fn until_stalled(&mut self) -> Duration {
        let start = Instant::now();
        let mut last = (self.completed(), self.got.get());
        let mut moved = Instant::now();
        self.until("waiting for the stream to stall", |s| {
            let now = (s.completed(), s.got.get());
            if now != last {
                last = now;
                moved = Instant::now();
            }
            moved.elapsed() >= STALL
        });
        start.elapsed()
    }

    fn report(&mut self) -> Report {
        // Nothing completes twice later on.
        let settle = Instant::now() + Duration::from_millis(100);
        while Instant::now() < settle {
            self.t.progress().unwrap();
        }
        Report::of(
            self.sent,
            &self.comp.borrow(),
            self.got.get(),
            self.fails.borrow().len() as u64,
        )
    }

    /// After a fault (`what`, injected `since` ago): this side's connection failed with
    /// one of the OS errors `errno`, every send completed exactly once and some were still
    /// pending; then the peer's own account: exactly once, one failure. Returns the peer's
    /// report and output.
    fn assert_failed_by(
        &mut self,
        peer: Peer,
        what: &str,
        since: Duration,
        errno: &[i32],
    ) -> (Report, String) {
        let mine = self.report();
        println!(
            "  failed {:.2} s after {what}: {} of {} sends ok, {} failed, {} messages received",
            since.as_secs_f64(),
            mine.ok,
            mine.sent,
            mine.sent - mine.ok,
            mine.got
        );
        mine.assert_exactly_once("here");
        assert!(
            mine.ok < mine.sent,
            "no send was pending at {what}: {mine:?}"
        );
        self.assert_lost_with(errno);
        let (theirs, out) = peer.finish();
        print!(
            "{}",
            out.lines()
                .filter(|l| l.starts_with("FAILURE"))
                .map(|l| format!("  peer: {l}\n"))
                .collect::<String>()
        );
        theirs.assert_exactly_once("peer");
        assert_eq!(theirs.failures, 1, "{out}");
        (theirs, out)
    }

    /// The connection failed with the OS error `errno` (on reading or writing).
    fn assert_lost_with(&self, errno: &[i32]) {
        let fails = self.fails.borrow();
        assert_eq!(fails.len(), 1, "{fails:?}");
        let code = match &fails[0].1 {
            FailReason::ConnectionLost {
                cause: Cause::Os(e) | Cause::SendFailed(e),
                ..
            } => e.0,
            other => panic!("failed with {other}, not a lost connection"),
        };
        assert!(
            errno.contains(&code),
            "failed with {}, expected one of the errors {errno:?}",
            fails[0].1
        );
    }
}

fn sigkill_mid_stream_fails_each_send_once(kind: BackendKind) -> bool {
    let mut peer = Peer::spawn(kind, LONG_USER_TIMEOUT);
    let mut me = Side::new(kind, LONG_USER_TIMEOUT, &mut peer);
    me.midway();
    peer.child.kill().unwrap(); // SIGKILL
    peer.child.wait().unwrap();
    let killed = Instant::now();
    me.until("for the connection to fail", |s| {
        s.failed() && s.completed() >= s.sent
    });
    let failed_after = killed.elapsed();
    let mine = me.report();
    println!(
        "  failed {:.2} s after SIGKILL: {} of {} sends ok, {} failed, {} messages received",
        failed_after.as_secs_f64(),
        mine.ok,
        mine.sent,
        mine.sent - mine.ok,
        mine.got
    );
    mine.assert_exactly_once("here");
    assert!(
        mine.ok < mine.sent,
        "no send was pending at the kill: {mine:?}"
    );
    let fails = me.fails.borrow();
    assert_eq!(fails.len(), 1, "{fails:?}");
    assert!(
        matches!(fails[0].1, FailReason::ConnectionLost { .. }),
        "failed with {}, not a lost connection",
        fails[0].1
    );
    true
}

fn sigstop_within_user_timeout_resumes(kind: BackendKind) -> bool {
    let mut peer = Peer::spawn(kind, LONG_USER_TIMEOUT);
    let mut me = Side::new(kind, LONG_USER_TIMEOUT, &mut peer);
    me.midway();
    peer.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let stall = me.until_stalled();
    peer.signal(libc::SIGCONT);
    let held = stopped.elapsed();
    println!(
        "  peer stopped for {:.2} s (stalled after {:.2} s), TCP_USER_TIMEOUT {:?}",
        held.as_secs_f64(),
        stall.as_secs_f64(),
        LONG_USER_TIMEOUT
    );
    assert!(held < LONG_USER_TIMEOUT, "stopped for {held:?}");
    me.until("after SIGCONT", |s| s.got.get() >= N && s.completed() >= N);
    let mine = me.report();
    mine.assert_exactly_once("here");
    assert_eq!((mine.ok, mine.got, mine.failures), (N, N, 0), "{mine:?}");
    common::assert_all_ok_in_order(&me.comp.borrow(), N as usize);
    me.t.shutdown(Duration::from_secs(10)).unwrap();
    let (theirs, out) = peer.finish();
    theirs.assert_exactly_once("peer");
    assert_eq!((theirs.ok, theirs.got, theirs.failures), (N, N, 0), "{out}");
    true
}

fn sigstop_past_user_timeout_fails_each_send_once(kind: BackendKind) -> bool {
    let mut peer = Peer::spawn(kind, SHORT_USER_TIMEOUT);
    let mut me = Side::new(kind, SHORT_USER_TIMEOUT, &mut peer);
    me.midway();
    peer.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    me.until("for the connection to time out", |s| {
        s.failed() && s.completed() >= s.sent
    });
    let failed_after = stopped.elapsed();
    // Send after the failure: refused at once, not accepted.
    let refused = me.t.send(
        PeerId(1),
        Tag(1),
        &[bytes::Bytes::from_static(b"late")],
        u64::MAX,
    );
    assert!(refused.is_err(), "a send to the failed peer was accepted");
    peer.signal(libc::SIGCONT);
    me.assert_failed_by(peer, "SIGSTOP", failed_after, &[libc::ETIMEDOUT]);
    true
}

fn rst_mid_stream_fails_each_send_once(kind: BackendKind) -> bool {
    let Some(ns) = Netns::new() else {
        return false;
    };
    // The case runs on a thread that enters the namespace; the peer process and `nft`
    // are started from it and so live there too.
    let probe = ip(&[
        "netns", "exec", &ns.name, "nft", "add", "table", "inet", "rbtlf",
    ]);
    if !probe.0 {
        common::skip(format_args!(
            "the kernel refuses an nftables table: {}",
            probe.1
        ));
        return false;
    }
    let name = ns.name.clone();
    let r = thread::spawn(move || {
        ns_enter(&name);
        rst_in_namespace(kind, &name);
    })
    .join();
    drop(ns);
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
    true
}

fn rst_in_namespace(kind: BackendKind, ns: &str) {
    let mut peer = Peer::spawn(kind, LONG_USER_TIMEOUT);
    let mut me = Side::new(kind, LONG_USER_TIMEOUT, &mut peer);
    me.midway();
    // Every TCP segment but a reset is answered with a reset: both ends lose the
    // connection at their next segment.
    nft(
        ns,
        "table inet rbtlf {\n\
         \tchain out {\n\
         \t\ttype filter hook output priority 0;\n\
         \t\tmeta l4proto tcp tcp flags & rst == 0 counter reject with tcp reset\n\
         \t}\n\
         }\n",
    );
    let injected = Instant::now();
    me.until("for the reset to fail the connection", |s| {
        s.failed() && s.completed() >= s.sent
    });
    let failed_after = injected.elapsed();
    let (theirs, out) = me.assert_failed_by(
        peer,
        "the rule",
        failed_after,
        &[libc::ECONNRESET, libc::EPIPE],
    );
    assert!(
        theirs.got < N,
        "the peer received everything despite the reset: {out}"
    );
    let rules = Command::new("nft")
        .args(["list", "table", "inet", "rbtlf"])
        .output()
        .expect("nft list");
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(
        !rules.contains("counter packets 0 "),
        "the rule reset nothing: {rules}"
    );
}

fn link_down_fails_each_send_once(kind: BackendKind) -> bool {
    let Some(here) = Netns::new() else {
        return false;
    };
    let Some(there) = Netns::new() else {
        return false;
    };
    // here: rf0 10.231.9.1/24 <-> there: rf1 10.231.9.2/24.
    for args in [
        &[
            "-n",
            &here.name,
            "link",
            "add",
            "rf0",
            "type",
            "veth",
            "peer",
            "name",
            "rf1",
            "netns",
            &there.name,
        ][..],
        &[
            "-n",
            &here.name,
            "addr",
            "add",
            "10.231.9.1/24",
            "dev",
            "rf0",
        ],
        &[
            "-n",
            &there.name,
            "addr",
            "add",
            "10.231.9.2/24",
            "dev",
            "rf1",
        ],
        &["-n", &here.name, "link", "set", "rf0", "up"],
        &["-n", &there.name, "link", "set", "rf1", "up"],
    ] {
        let o = ip(args);
        assert!(o.0, "ip {args:?}: {}", o.1);
    }
    let (name, far) = (here.name.clone(), there.name.clone());
    let r = thread::spawn(move || {
        ns_enter(&name);
        link_down_across(kind, &far);
    })
    .join();
    drop((here, there));
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
    true
}

fn link_down_across(kind: BackendKind, far: &str) {
    let mut peer = Peer::spawn_in(kind, SHORT_USER_TIMEOUT, Some((far, "10.231.9.2:0")));
    let listen = "10.231.9.1:0".parse().unwrap();
    let mut me = Side::listening(kind, SHORT_USER_TIMEOUT, &mut peer, Some(listen));
    me.midway();
    let o = ip(&["-n", far, "link", "set", "rf1", "down"]);
    assert!(o.0, "link down: {}", o.1);
    let down = Instant::now();
    me.until("for the connection to time out", |s| {
        s.failed() && s.completed() >= s.sent
    });
    let failed_after = down.elapsed();
    let (_, out) =
        me.assert_failed_by(peer, "the link went down", failed_after, &[libc::ETIMEDOUT]);
    assert!(
        ["timed out", "unreachable"].iter().any(|w| out.contains(w)),
        "the peer failed for another reason: {out}"
    );
}

/// Loads `rules` into the namespace the calling thread is in.
fn nft(ns: &str, rules: &str) {
    let mut c = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nft");
    c.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "nft in {ns}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Moves the calling thread into the named network namespace.
fn ns_enter(name: &str) {
    let f = std::fs::File::open(format!("/run/netns/{name}")).expect("namespace file");
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is open for the duration of the call; setns changes only this
    // thread's network namespace (allowed in a multi-threaded process).
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {name}: {}", std::io::Error::last_os_error());
}

/// A network namespace with only `lo` (up), deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    /// Makes one, or says why it cannot ([`common::skip`]) and returns `None`.
    fn new() -> Option<Self> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            common::skip("needs root (network namespace, nftables)");
            return None;
        }
        for (tool, version) in [("ip", "-V"), ("nft", "--version")] {
            match Command::new(tool).arg(version).output() {
                Ok(o) if o.status.success() => {}
                _ => {
                    common::skip(format_args!("`{tool}` is not installed"));
                    return None;
                }
            }
        }
        common::netns::remove_stale();
        let ns = Self {
            name: common::netns::fresh_name(),
        };
        let add = ip(&["netns", "add", &ns.name]);
        if !add.0 {
            common::skip(format_args!(
                "cannot create a network namespace here: {}",
                add.1
            ));
            return None;
        }
        let lo = ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        assert!(lo.0, "lo up in {}: {}", ns.name, lo.1);
        Some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let o = ip(&["netns", "delete", &self.name]);
        if !o.0 {
            eprintln!("ip netns delete {}: {}", self.name, o.1);
        }
    }
}

/// Runs `ip args`: (success, stderr).
fn ip(args: &[&str]) -> (bool, String) {
    let o = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).trim().to_owned(),
    )
}
