//! The baseline: a plain TCP socket ping-pong between the same two processes, the floor
//! ringbtl is compared against.
//!
//! - poll mode: `send`/`recv` with `MSG_DONTWAIT`, spun until the whole message has gone
//!   out / come in (no wake-up ever: the receiving core is already running);
//! - block mode: one blocking `send` (the kernel loops until all is queued) and `recv`
//!   with `MSG_WAITALL` (one call per message unless a signal interrupts it), with
//!   `SO_RCVLOWAT` set to the message size so that the reader is woken once per message
//!   rather than once per arriving segment, which takes time off every large message
//!   (see docs/design/receive.md; the kernel caps the mark at half of `tcp_rmem[2]`).
//!   `--baseline-no-lowat` turns it off.
//!
//! Large messages go out in one call; each side receives the whole message before replying.
//! TCP has no empty message, so a 0-byte size moves 1 byte.
//!
//! With `--exchange` both processes send their message of each iteration at once and wait
//! for the other's, as the ringbtl series does: each side sends and receives on the same
//! non-blocking socket in one loop (a blocking send of a message larger than the socket
//! buffers would wait for a reader that is itself blocked sending). Poll mode spins on
//! `send`/`recv` with `MSG_DONTWAIT`; block mode waits in `poll(2)` for whichever of the
//! two can move, without `SO_RCVLOWAT` (a mark above the bytes still to come would leave
//! the last message's tail waiting for bytes that are never sent).
//!
//! With `--fresh` each iteration sends from and receives into another slice of an arena
//! on each side ([`cli::fresh_slots`] messages).
//!
//! With `--baseline-framed` each message is ringbtl's frame: the payload behind a header of
//! [`ringbtl::wire::HEADER_LEN`] bytes, moved in the same calls.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use ringbtl::ProgressMode;

use crate::cli::{self, Pattern};
use crate::report::Recorder;
use crate::{control, sys};

const SPINS_PER_CLOCK: u32 = 4096;
/// SO_RCVTIMEO / SO_SNDTIMEO of the baseline socket.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(1);

/// How the baseline socket moves its messages, beside the pattern.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BaseOpts {
    /// Block mode: SO_RCVLOWAT = message size (not `--baseline-no-lowat`).
    pub(crate) lowat: bool,
    /// Each message carries a frame header (`--baseline-framed`).
    pub(crate) framed: bool,
}

/// One connected socket and the buffers of the current size.
pub(crate) struct Plain {
    sock: TcpStream,
    /// Block mode: SO_RCVLOWAT = message size, one wake-up per message.
    lowat: bool,
    /// Both sides send each message at once (`--exchange`).
    exchange: bool,
    /// Iterations cycle through arenas of messages (`--fresh`).
    fresh: bool,
    /// Bytes moved in front of each payload (`--baseline-framed`: a frame header's).
    header: usize,
    /// The current size, and the arenas' message count (1 without `--fresh`).
    size: usize,
    slots: usize,
    tx: Vec<u8>,
    rx: Vec<u8>,
}

impl Plain {
    fn setup(
        sock: TcpStream,
        timeout: Duration,
        opts: BaseOpts,
        pat: Pattern,
    ) -> Result<Self, String> {
        let Pattern { exchange, fresh } = pat;
        sock.set_nodelay(true)
            .map_err(|e| format!("baseline socket: TCP_NODELAY: {e}"))?;
        sys::congestion_like_ringbtl(&sock)?;
        // Bounds every blocking call (block mode) so that the loops, which turn EAGAIN into
        // a deadline check, overshoot a phase's deadline by at most a second.
        let slice = Some(SOCKET_TIMEOUT.min(timeout));
        sock.set_read_timeout(slice)
            .and_then(|()| sock.set_write_timeout(slice))
            .map_err(|e| format!("baseline socket: timeouts: {e}"))?;
        Ok(Self {
            sock,
            lowat: opts.lowat && !exchange,
            exchange,
            fresh,
            header: if opts.framed {
                ringbtl::wire::HEADER_LEN
            } else {
                0
            },
            size: 0,
            slots: 1,
            tx: Vec::new(),
            rx: Vec::new(),
        })
    }

    /// Rank 1 side: connects to rank 0's listener.
    pub(crate) fn connect(
        addr: SocketAddr,
        timeout: Duration,
        opts: BaseOpts,
        pat: Pattern,
    ) -> Result<Self, String> {
        Self::setup(
            control::connect_baseline(addr, timeout)?,
            timeout,
            opts,
            pat,
        )
    }

    /// Rank 0 side: accepts the one connection of rank 1 (already in the backlog).
    pub(crate) fn accept(
        l: &TcpListener,
        wait: Duration,
        timeout: Duration,
        opts: BaseOpts,
        pat: Pattern,
    ) -> Result<Self, String> {
        Self::setup(control::accept_baseline(l, wait)?, timeout, opts, pat)
    }

    fn set_size(&mut self, size: usize, mode: ProgressMode) -> Result<(), String> {
        // TCP has no empty message: an unframed 0-byte size moves 1 byte.
        let n = if self.header > 0 {
            size + self.header
        } else {
            size.max(1)
        };
        if mode != ProgressMode::Poll && self.lowat {
            sys::set_rcvlowat(self.sock.as_raw_fd(), n).map_err(|e| format!("SO_RCVLOWAT: {e}"))?;
        }
        self.size = n;
        self.slots = if self.fresh { cli::fresh_slots(n) } else { 1 };
        self.tx.clear();
        self.tx.resize(n * self.slots, 0x5a);
        self.rx.clear();
        self.rx.resize(n * self.slots, 0);
        Ok(())
    }

    /// Iteration `i`'s send and receive buffers.
    #[inline]
    fn bufs(&mut self, i: u64) -> (&[u8], &mut [u8]) {
        let at = (i % self.slots as u64) as usize * self.size;
        let n = self.size;
        (&self.tx[at..at + n], &mut self.rx[at..at + n])
    }

    /// Rank 0: `warmup + iters` round trips (exchanges, with `exchange`), the last `iters`
    /// timed into `rec`.
    pub(crate) fn ping(
        &mut self,
        size: usize,
        warmup: u64,
        iters: u64,
        mode: ProgressMode,
        deadline: Instant,
        rec: &mut Recorder,
    ) -> Result<(), String> {
        self.set_size(size, mode)?;
        let fd = self.sock.as_raw_fd();
        let exchanging = self.exchange;
        for i in 0..warmup + iters {
            let t0 = Instant::now();
            let (tx, rx) = self.bufs(i);
            if exchanging {
                exchange(fd, tx, rx, mode, deadline)?;
            } else {
                send_all(fd, tx, mode, deadline)?;
                recv_all(fd, rx, mode, deadline)?;
            }
            let rtt = t0.elapsed();
            if i >= warmup {
                // The recorder halves round trips; an exchange is reported whole.
                rec.record(if exchanging { rtt * 2 } else { rtt });
            }
        }
        Ok(())
    }

    /// Rank 1: receives and returns `count` messages, or exchanges `count` messages with
    /// rank 0 (`exchange`).
    pub(crate) fn pong(
        &mut self,
        size: usize,
        count: u64,
        mode: ProgressMode,
        deadline: Instant,
    ) -> Result<(), String> {
        self.set_size(size, mode)?;
        let fd = self.sock.as_raw_fd();
        let exchanging = self.exchange;
        for i in 0..count {
            let (tx, rx) = self.bufs(i);
            if exchanging {
                exchange(fd, tx, rx, mode, deadline)?;
            } else {
                recv_all(fd, rx, mode, deadline)?;
                send_all(fd, tx, mode, deadline)?;
            }
        }
        Ok(())
    }
}

fn send_all(fd: i32, mut buf: &[u8], mode: ProgressMode, deadline: Instant) -> Result<(), String> {
    let flags = libc::MSG_NOSIGNAL
        | match mode {
            ProgressMode::Poll => libc::MSG_DONTWAIT,
            ProgressMode::Block | ProgressMode::SpinThenBlock(_) => 0,
        };
    let mut spins = 0u32;
    while !buf.is_empty() {
        match sys::send(fd, buf, flags) {
            Ok(n) => buf = &buf[n..],
            Err(e) => again(e, "send", mode, deadline, &mut spins)?,
        }
    }
    Ok(())
}

fn recv_all(fd: i32, buf: &mut [u8], mode: ProgressMode, deadline: Instant) -> Result<(), String> {
    let flags = match mode {
        ProgressMode::Poll => libc::MSG_DONTWAIT,
        ProgressMode::Block | ProgressMode::SpinThenBlock(_) => libc::MSG_WAITALL,
    };
    let mut spins = 0u32;
    let mut got = 0;
    while got < buf.len() {
        match sys::recv(fd, &mut buf[got..], flags) {
            Ok(0) => return Err("the peer closed the connection".into()),
            Ok(n) => got += n,
            Err(e) => again(e, "recv", mode, deadline, &mut spins)?,
        }
    }
    Ok(())
}

/// Sends `tx` and receives `rx.len()` bytes at once on `fd`: every pass moves what the
/// socket takes and what it holds, both without blocking; in block mode a pass that moved
/// nothing waits in `poll(2)` (at most a second, for the deadline check) for either side.
fn exchange(
    fd: i32,
    tx: &[u8],
    rx: &mut [u8],
    mode: ProgressMode,
    deadline: Instant,
) -> Result<(), String> {
    let (mut sent, mut got) = (0, 0);
    let mut spins = 0u32;
    while sent < tx.len() || got < rx.len() {
        let mut moved = false;
        if sent < tx.len() {
            match sys::send(fd, &tx[sent..], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
                Ok(n) => {
                    sent += n;
                    moved |= n > 0;
                }
                Err(e) => again(e, "send", ProgressMode::Poll, deadline, &mut spins)?,
            }
        }
        if got < rx.len() {
            match sys::recv(fd, &mut rx[got..], libc::MSG_DONTWAIT) {
                Ok(0) => return Err("the peer closed the connection".into()),
                Ok(n) => {
                    got += n;
                    moved = true;
                }
                Err(e) => again(e, "recv", ProgressMode::Poll, deadline, &mut spins)?,
            }
        }
        if !moved && mode != ProgressMode::Poll {
            let want_out = sent < tx.len();
            let want_in = got < rx.len();
            sys::wait_fd(fd, want_in, want_out, SOCKET_TIMEOUT)
                .map_err(|e| format!("poll: {e}"))?;
            if Instant::now() >= deadline {
                return Err("exchange timed out".into());
            }
        }
    }
    Ok(())
}

/// EAGAIN (nothing yet, or a socket timeout in block mode) and EINTR retry until the
/// deadline; anything else ends the run.
#[inline]
fn again(
    e: io::Error,
    op: &str,
    mode: ProgressMode,
    deadline: Instant,
    spins: &mut u32,
) -> Result<(), String> {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {
            *spins = spins.wrapping_add(1);
            let check = mode != ProgressMode::Poll || spins.is_multiple_of(SPINS_PER_CLOCK);
            if check && Instant::now() >= deadline {
                return Err(format!("{op} timed out"));
            }
            Ok(())
        }
        _ => Err(format!("{op}: {e}")),
    }
}
