//! The control channel between rank 0 and the rank 1 it started: text lines on the
//! child's stdin (rank 0 -> rank 1) and stdout (rank 1 -> rank 0). The child's stderr is
//! inherited.
//!
//! | rank 1 -> rank 0            | rank 0 -> rank 1                   |
//! |-----------------------------|------------------------------------|
//! | `ADDR <i> <ip:port> <name>` | `PEER <i> <ip:port>`               |
//! | `READY`                     | `BASE <ip:port>` (baseline socket) |
//! | `SYNCED`                    | `SYNC`                             |
//! | `OK`, then `DONE`           | `RUN ring <i> <size> <count>`      |
//! |                             | `RUN socket <size> <count>`        |
//! | `BYE`                       | `QUIT`                             |
//! | `ERR <message>` (any time)  |                                    |

use std::io::{self, BufRead, BufReader, Write};
use std::process::{Child as Proc, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};

use ringbtl::BackendKind;

use crate::{sys, SETUP_TIMEOUT};

/// Rank 0's handle on rank 1: killed and reaped on drop unless it exited cleanly.
pub(crate) struct PeerProc {
    proc: Option<Proc>,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

/// The plain-socket baseline's listener, when a baseline runs: on the address of the
/// first transport's listener `first` (the address the peer reaches this side by),
/// loopback without one.
pub(crate) fn baseline_listener(
    baseline: bool,
    first: Option<SocketAddr>,
) -> Result<Option<TcpListener>, String> {
    if !baseline {
        return Ok(None);
    }
    let ip = first.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
    TcpListener::bind(SocketAddr::new(ip, 0))
        .map(Some)
        .map_err(|e| format!("baseline: listening on {ip}: {e}"))
}

/// Accepts the baseline's one connection on `l` (rank 1 connects after the address
/// exchange), in blocking mode; an error when it has not come within `wait`.
pub(crate) fn accept_baseline(l: &TcpListener, wait: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + wait;
    l.set_nonblocking(true)
        .map_err(|e| format!("baseline listener: {e}"))?;
    let sock = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err("baseline: the peer never connected".into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("baseline: accept: {e}")),
        }
    };
    sock.set_nonblocking(false)
        .map_err(|e| format!("baseline socket: {e}"))?;
    Ok(sock)
}

/// Connects the baseline's socket to rank 0's `addr`.
pub(crate) fn connect_baseline(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, String> {
    TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("baseline: connecting to {addr}: {e}"))
}

impl PeerProc {
    /// Ends a measured phase: on success waits for rank 1's `DONE` (it has served and
    /// completed every message); on failure adds rank 1's own report, which usually says
    /// more (it may have died first). `label` names the series in the error.
    pub(crate) fn end_phase<T>(
        &mut self,
        label: &str,
        measured: Result<T, String>,
        timeout: Duration,
    ) -> Result<T, String> {
        let t = match measured {
            Ok(t) => t,
            Err(e) => {
                let theirs = self.expect(Duration::from_secs(1)).err();
                return Err(match theirs {
                    Some(t) if t.starts_with("rank 1") => format!("{label}: {e}; {t}"),
                    _ => format!("{label}: {e}"),
                });
            }
        };
        self.expect_exact("DONE", timeout + SETUP_TIMEOUT)
            .map_err(|e| format!("{label}: {e}"))?;
        Ok(t)
    }

    /// Ends a run on rank 0: tells rank 1 to quit, shuts every one of `transports` down with
    /// `shutdown` (all of them, the last error wins), waits for rank 1's `BYE` and its exit.
    pub(crate) fn end_run<T>(
        mut self,
        transports: &mut [T],
        mut shutdown: impl FnMut(&mut T) -> Result<(), String>,
    ) -> Result<(), String> {
        self.send("QUIT")?;
        let mut shut = Ok(());
        for t in transports {
            if let Err(e) = shutdown(t) {
                shut = Err(e);
            }
        }
        self.expect_exact("BYE", SETUP_TIMEOUT)?;
        self.finish(SETUP_TIMEOUT)?;
        shut
    }

    /// The start-up exchange with a freshly spawned rank 1: learns its transports'
    /// addresses (`ADDR <index> <ip:port> <backend>` lines until `READY`), tells it those
    /// of `rings` (`PEER <index> <ip:port>`) and the baseline listener's
    /// (`BASE <ip:port>`), then synchronises (`SYNC` / `SYNCED`). Each of `rings` then
    /// has rank 1's transport of the same index as its peer.
    pub(crate) fn exchange<R: BenchTransport>(
        &mut self,
        rings: &mut [R],
        base: Option<&TcpListener>,
    ) -> Result<(), String> {
        let ours: Vec<SocketAddr> = rings.iter().map(|r| r.local_addr()).collect();
        let base = match base {
            Some(l) => Some(
                l.local_addr()
                    .map_err(|e| format!("baseline listener: {e}"))?,
            ),
            None => None,
        };
        let mut theirs = Vec::new();
        loop {
            let line = self.expect(SETUP_TIMEOUT)?;
            let mut w = line.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("READY"), None, None) => break,
                (Some("ADDR"), Some(_), Some(a)) => theirs.push(
                    a.parse::<SocketAddr>()
                        .map_err(|e| format!("rank 1 sent a bad address {a:?}: {e}"))?,
                ),
                _ => return Err(format!("rank 1 sent an unexpected line: {line:?}")),
            }
        }
        if theirs.len() != ours.len() {
            return Err(format!(
                "rank 1 created {} transports, rank 0 {}",
                theirs.len(),
                ours.len()
            ));
        }
        for (i, a) in ours.iter().enumerate() {
            self.send(&format!("PEER {i} {a}"))?;
        }
        if let Some(a) = base {
            self.send(&format!("BASE {a}"))?;
        }
        self.send("SYNC")?;
        self.expect_exact("SYNCED", SETUP_TIMEOUT)?;
        for (r, a) in rings.iter_mut().zip(theirs) {
            r.add_peer(a)?;
        }
        Ok(())
    }

    /// Re-executes this binary with the same arguments plus `--internal-peer <our pid>`,
    /// through the command `prefix` (`--peer-cmd`) when there is one.
    pub(crate) fn spawn(prefix: Option<&str>) -> Result<Self, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this executable to start the peer: {e}"))?;
        let mut words = prefix.unwrap_or("").split_whitespace();
        let mut cmd = match words.next() {
            Some(first) => {
                let mut c = Command::new(first);
                c.args(words).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(std::env::args_os().skip(1))
            .arg("--internal-peer")
            .arg(std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let set = |v: &str| std::env::var(v).is_ok_and(|x| !x.trim().is_empty());
        if !set("RINGBTL_JOB_KEY") && !set("RINGBTL_JOB_KEY_FILE") {
            // Rank 0's key (see `cli::transport`), not configured: hand it over.
            cmd.env("RINGBTL_JOB_KEY", crate::cli::run_key()?.to_hex());
        }
        let mut proc = cmd
            .spawn()
            .map_err(|e| format!("starting the peer process {}: {e}", exe.display()))?;
        let stdin = proc.stdin.take();
        let stdout = proc.stdout.take();
        let (tx, lines) = mpsc::channel();
        if let Some(out) = stdout {
            std::thread::Builder::new()
                .name("peer-stdout".into())
                .spawn(move || {
                    for line in BufReader::new(out).lines() {
                        let Ok(l) = line else { break };
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| format!("starting the control thread: {e}"))?;
        }
        Ok(Self {
            proc: Some(proc),
            stdin,
            lines,
        })
    }

    /// Sends one command line.
    pub(crate) fn send(&mut self, line: &str) -> Result<(), String> {
        let res = match self.stdin.as_mut() {
            Some(w) => writeln!(w, "{line}").and_then(|()| w.flush()),
            None => return Err("the control channel is closed".into()),
        };
        res.map_err(|_| self.gone())
    }

    /// Next line from rank 1; `ERR` lines, exit and silence become errors.
    pub(crate) fn expect(&mut self, timeout: Duration) -> Result<String, String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => match l.strip_prefix("ERR ") {
                Some(e) => Err(format!("rank 1: {e}")),
                None => Ok(l),
            },
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "rank 1 did not answer within {} s",
                timeout.as_secs_f64()
            )),
            Err(RecvTimeoutError::Disconnected) => Err(self.gone()),
        }
    }

    /// Expects exactly `word`.
    pub(crate) fn expect_exact(&mut self, word: &str, timeout: Duration) -> Result<(), String> {
        let l = self.expect(timeout)?;
        if l == word {
            Ok(())
        } else {
            Err(format!("rank 1 said {l:?}, expected {word:?}"))
        }
    }

    /// Describes how rank 1 went away (its exit status if it exits within a second).
    fn gone(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(1);
        if let Some(p) = self.proc.as_mut() {
            loop {
                match p.try_wait() {
                    Ok(Some(st)) => {
                        self.proc = None;
                        return format!("rank 1 (the peer process) exited: {st}");
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => break,
                }
            }
        }
        "rank 1 (the peer process) closed the control channel".into()
    }

    /// Closes rank 1's stdin and waits for it to exit, killing it after `timeout`.
    pub(crate) fn finish(mut self, timeout: Duration) -> Result<(), String> {
        self.stdin = None;
        let Some(mut p) = self.proc.take() else {
            return Ok(());
        };
        let deadline = Instant::now() + timeout;
        loop {
            match p.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => return Err(format!("rank 1 exited with {st}")),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    let _ = p.kill();
                    let _ = p.wait();
                    return Err(format!(
                        "rank 1 did not exit within {} s and was killed",
                        timeout.as_secs_f64()
                    ));
                }
                Err(e) => return Err(format!("waiting for rank 1: {e}")),
            }
        }
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        self.stdin = None;
        if let Some(mut p) = self.proc.take() {
            if let Ok(None) = p.try_wait() {
                let _ = p.kill();
            }
            let _ = p.wait();
        }
    }
}

/// Rank 1's end of the channel.
pub(crate) struct Child {
    input: BufReader<io::Stdin>,
    line: String,
}

impl Child {
    /// Arranges to die with the parent `ppid` and opens stdin / stdout.
    pub(crate) fn open(ppid: u32) -> Result<Self, String> {
        sys::die_with_parent().map_err(|e| format!("PR_SET_PDEATHSIG: {e}"))?;
        // The parent may have died before the line above took effect.
        if std::os::unix::process::parent_id() != ppid {
            return Err("the parent process is gone".into());
        }
        Ok(Self {
            input: BufReader::new(io::stdin()),
            line: String::new(),
        })
    }

    /// Next command; EOF (rank 0 went away) is an error.
    pub(crate) fn recv(&mut self) -> Result<String, String> {
        self.line.clear();
        match self.input.read_line(&mut self.line) {
            Ok(0) => Err("rank 0 closed the control channel".into()),
            Ok(_) => Ok(self.line.trim_end().to_string()),
            Err(e) => Err(format!("reading commands: {e}")),
        }
    }

    /// Sends one line to rank 0.
    pub(crate) fn send(&mut self, line: &str) -> Result<(), String> {
        let mut out = io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("writing to rank 0: {e}"))
    }
}

/// What the transports of the two-rank benchmarks (latency's `Ring`, bw's and rate's
/// `Streamer`) have in common, as either rank and the control channel use them.
pub(crate) trait BenchTransport {
    /// The listening address to give the peer.
    fn local_addr(&self) -> SocketAddr;
    /// "uring" or "epoll": the backend the transport runs.
    fn backend_name(&self) -> &'static str;
    /// Makes the other rank known at `addr`.
    fn add_peer(&mut self, addr: SocketAddr) -> Result<(), String>;
    /// FIN to the peer, drain, close.
    fn shutdown(&mut self) -> Result<(), String>;
}

/// Rank 1's transports, and its answers to the commands that every two-rank benchmark
/// answers alike: `ADDR` and `READY` at the start, `PEER`, `SYNC` and `QUIT`. The
/// benchmark answers `BASE` and `RUN` itself, as [`next`](Self::next) hands them over.
pub(crate) struct Rank1<R> {
    /// One transport per backend, in the order announced.
    pub(crate) rings: Vec<R>,
}

impl<R: BenchTransport> Rank1<R> {
    /// Makes one transport per backend of `kinds` with `make`, announces each to rank 0
    /// (`ADDR <i> <ip:port> <name>`), then says `READY`.
    pub(crate) fn start(
        ctl: &mut Child,
        kinds: &[BackendKind],
        mut make: impl FnMut(BackendKind) -> Result<R, String>,
    ) -> Result<Self, String> {
        let mut rings = Vec::new();
        for &k in kinds {
            rings.push(make(k)?);
        }
        for (i, r) in rings.iter().enumerate() {
            ctl.send(&format!("ADDR {i} {} {}", r.local_addr(), r.backend_name()))?;
        }
        ctl.send("READY")?;
        Ok(Self { rings })
    }

    /// The next command that the benchmark answers itself, after answering `PEER` and
    /// `SYNC` on the way. `None` once `QUIT` is answered: every transport shut down, then
    /// `BYE` (a failed shutdown is the error, after `BYE`).
    pub(crate) fn next(&mut self, ctl: &mut Child) -> Result<Option<String>, String> {
        loop {
            let line = ctl.recv()?;
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["PEER", i, addr] => {
                    let i: usize = crate::parse(i, &line)?;
                    let addr: SocketAddr = crate::parse(addr, &line)?;
                    self.ring(i)?.add_peer(addr)?;
                }
                ["SYNC"] => ctl.send("SYNCED")?,
                ["QUIT"] => {
                    let mut res = Ok(None);
                    for r in &mut self.rings {
                        if let Err(e) = r.shutdown() {
                            res = Err(e);
                        }
                    }
                    ctl.send("BYE")?;
                    return res;
                }
                _ => return Ok(Some(line)),
            }
        }
    }

    /// Transport `i`, as a command names it.
    pub(crate) fn ring(&mut self, i: usize) -> Result<&mut R, String> {
        self.rings
            .get_mut(i)
            .ok_or_else(|| format!("no transport {i}"))
    }
}
