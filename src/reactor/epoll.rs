//! The epoll backend: performs each reactor operation with a non-blocking syscall once the
//! socket is ready, and reports it as the same completion [`Event`] the io_uring backend
//! produces. Nothing above the reactor can tell the two apart.
//!
//! # Readiness model
//!
//! Every socket is registered once, edge-triggered, for `EPOLLIN | EPOLLOUT | EPOLLRDHUP`,
//! and each connection keeps its own `readable` / `writable` bits. An edge sets a bit; a
//! syscall that returns `EAGAIN` (or a short transfer, which on a stream socket means the
//! kernel buffer was drained or filled at that instant) clears it. The steady state therefore
//! costs exactly the data syscalls (`sendmsg`, `recv`) plus the `epoll_wait` that discovers
//! new data, and no `epoll_ctl` (but see "Quiet sockets"). Level-triggered registration
//! with `EPOLLOUT` added only while a send is blocked would cost two `epoll_ctl` per
//! blocked send, and would keep reporting a socket whose data waits for the caller to
//! re-arm its receive.
//!
//! One exception, while a receive is spun (below): a socket registered with epoll costs
//! its *sender* an epoll wake-up callback for every segment that arrives (the callback
//! runs in the sending thread's softirq on loopback), which adds to every message's
//! latency (see docs/design/receive.md).
//!
//! Peer hang-up (`EPOLLRDHUP`), `EPOLLHUP` and `EPOLLERR` are sticky: no further edge comes
//! after them, so the socket stays "readable" until a `recv` returns 0 or the error.
//!
//! # Operations
//!
//! Each operation's memory and its non-blocking call are described once, in `op`
//! ([`SendOp::try_now`](super::op::SendOp::try_now), [`RecvOp::try_now`](super::op::RecvOp::try_now)); this backend
//! decides when to call them.
//!
//! - `send`: written directly from [`Backend::send`] (one gathered `sendmsg`,
//!   `MSG_NOSIGNAL`); a short write is resumed on the next `EPOLLOUT` edge. Completion is
//!   queued and delivered by [`Backend::poll`], like every other event.
//! - `recv`: `recv` into [`RxBuf::spare_mut`]; a buffer that [`RxBuf::wants_all`] is
//!   filled completely before it completes, resumed across edges.
//! - `connect`: `EINPROGRESS`, then `SO_ERROR` on the first `EPOLLOUT`/`EPOLLERR` edge.
//! - `accept`: `accept4` in bounded batches while the listener is readable; paused
//!   without spinning when descriptors run out ([`AcceptBackoff`]): the wait is bounded
//!   by the pause, and closing one of our sockets ends it early.
//! - `close`: cancels pending operations with `ECANCELED`, closes the socket at once (the
//!   kernel holds no pointer into our buffers between syscalls), and frees the slot when
//!   [`Event::Closed`] is delivered.
//!
//! # Polling fast path
//!
//! `poll(None)` is spun by a latency-mode progress loop. Every armed receive is in the
//! connection table's direct set; with at most
//! [`DIRECT_RECV_MAX`] of them, it tries each with a
//! non-blocking `recv` (the spun `recv` is the latency floor) and calls `epoll_wait(0)`
//! only every [`EPOLL_EVERY`] passes, or on every pass while a connect or a blocked send
//! waits for an edge. With more receives armed, one `epoll_wait(0)` per pass is cheaper
//! than a `recv` per connection.
//!
//! The direct path saves one `epoll_wait` per pass, which pays while the receives it
//! tries cost less than that call; their cost grows with their number, so the threshold
//! sits below the number where the two cross (see docs/design/receive.md).
//!
//! # Quiet sockets
//!
//! After [`QUIET_AFTER`] consecutive `poll(None)` calls (a busy-polling progress loop, not
//! one that waits), each connection whose receive is in the direct set, with no connect
//! and no blocked send, leaves the epoll set (`EPOLL_CTL_DEL`): its spun `recv` sees data
//! and hang-ups anyway, and its peer no longer pays the wake-up callback. It goes back
//! (`EPOLL_CTL_ADD`, which reports what is already ready, so no edge is lost) before any
//! wait in the kernel, when the direct path is left, and when a send on it blocks (its
//! `EPOLLOUT` edge is then needed). A blocking progress mode never spins that long, so it
//! makes no `epoll_ctl` call at all; a spin-then-block one pays two per spun connection
//! per switch to waiting.
//!
//! # Ownership
//!
//! The kernel reads or writes our memory only during a syscall, so a connection's slot
//! owns its [`TxBatch`] and [`RxBuf`] until the operation completes and returns them in its
//! event; dropping the backend closes every socket and drops every pending buffer.

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};
use std::{io, ptr};

use socket2::SockRef;

use super::listen::AcceptBackoff;
use super::op::{cancelled, Attempt, Chunks, SendShared};
use super::slots::{untoken, Slot, Slots, DIRECT_RECV_MAX};
use super::sys::{self, syscall};
use super::{Backend, ConnId, Counters, Event, RxBuf, SockOpts, TxBatch};

/// The epoll readiness backend. See the module documentation.
///
/// Every socket is an [`OwnedFd`], so dropping the backend closes them all (and the epoll
/// instance); buffers of operations still pending are dropped with their slots.
pub(crate) struct Epoll {
    epfd: OwnedFd,
    opts: SockOpts,
    slots: Slots<Io>,
    listeners: Vec<Listener>,
    /// `epoll_wait` output, allocated once.
    events: Vec<libc::epoll_event>,
    /// Connections to try this pass (deduplicated by `Io::queued`).
    run: Vec<usize>,
    /// Send calls made (including those that found the socket full), and the spare
    /// pipes of lent pages.
    send_calls: SendShared,
    /// Sends stored and not yet completed (blocked on `EPOLLOUT` or on a connect).
    tx_waiting: usize,
    /// Connects in progress.
    connecting: usize,
    passes: u32,
    /// Consecutive `poll(None)` calls since the last wait in the kernel.
    spins: u32,
    /// Connections taken out of the epoll set while spun (see "Quiet sockets").
    quiet: Vec<usize>,
    /// Accepting paused after `EMFILE` and the like.
    accept_pause: AcceptBackoff,
}

impl Epoll {
    /// Creates the epoll instance (`epoll_create1(EPOLL_CLOEXEC)`).
    pub(crate) fn new(opts: SockOpts) -> io::Result<Self> {
        // SAFETY: no pointer arguments; the flag is a valid epoll_create1 flag.
        let raw = syscall!(epoll_create1(libc::EPOLL_CLOEXEC))?;
        // SAFETY: epoll_create1 succeeded, so `raw` is a new descriptor nothing else owns.
        let epfd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self {
            epfd,
            opts,
            slots: Slots::new(),
            listeners: Vec::new(),
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_MAX],
            run: Vec::new(),
            send_calls: SendShared::default(),
            accept_pause: AcceptBackoff::new(),
            tx_waiting: 0,
            connecting: 0,
            passes: 0,
            spins: 0,
            quiet: Vec::with_capacity(DIRECT_RECV_MAX),
        })
    }

    /// Registers `fd` edge-triggered for input, output and peer hang-up.
    fn register(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event on our stack; the kernel copies it.
        syscall!(epoll_ctl(
            self.epfd.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            &mut ev
        ))?;
        Ok(())
    }

    /// Takes connection `idx` out of the epoll set (`EPOLL_CTL_DEL`) while its receive is
    /// spun directly: a registered socket costs its sender an epoll wake-up callback on
    /// every segment that arrives. Only an idle, connected socket with its receive in the
    /// direct set goes quiet.
    fn hush(&mut self, idx: usize) {
        let epfd = self.epfd.as_raw_fd();
        let Some(s) = self.slots.get_mut(idx) else {
            return;
        };
        if s.io.quiet || s.closing || s.io.connecting || s.send.busy() || !s.recv.busy() {
            return;
        }
        let Some(fd) = s.io.fd.as_ref().map(AsRawFd::as_raw_fd) else {
            return;
        };
        // SAFETY: both descriptors are open; a null event is allowed for EPOLL_CTL_DEL.
        if syscall!(epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, ptr::null_mut())).is_ok() {
            s.io.quiet = true;
            self.quiet.push(idx);
        }
    }

    /// Puts a quiet connection back in the epoll set. The kernel checks the socket as it
    /// adds it (edge-triggered registration reports what is already ready), so nothing
    /// that happened meanwhile is missed; its receive is also marked readable, to be tried
    /// at once.
    fn wake(&mut self, idx: usize) -> io::Result<()> {
        let Some(k) = self.quiet.iter().position(|&q| q == idx) else {
            return Ok(());
        };
        self.quiet.swap_remove(k);
        let token = self.slots.token(KIND_CONN, idx);
        let Some(s) = self.slots.get_mut(idx) else {
            return Ok(());
        };
        s.io.quiet = false;
        s.io.readable = true;
        let Some(fd) = s.io.fd.as_ref().map(AsRawFd::as_raw_fd) else {
            return Ok(());
        };
        self.register(fd, token)?;
        self.enqueue(idx);
        Ok(())
    }

    /// Puts every quiet connection back in the epoll set (before a wait in the kernel, or
    /// when the direct path is left).
    fn wake_all(&mut self) -> io::Result<()> {
        self.spins = 0;
        while let Some(&idx) = self.quiet.last() {
            self.wake(idx)?;
        }
        Ok(())
    }

    /// Puts a new socket in a slot and registers it. On failure the socket is closed.
    fn insert(&mut self, fd: OwnedFd, connecting: bool, peer: &SocketAddr) -> io::Result<ConnId> {
        let raw = fd.as_raw_fd();
        let chunk = self.opts.send_chunks_for(peer);
        let idx = self.slots.insert(
            Io {
                chunk,
                ..Io::new(fd, connecting)
            },
            self.opts.rcvlowat_for(peer),
        );
        if let Err(e) = self.register(raw, self.slots.token(KIND_CONN, idx)) {
            self.slots.remove(idx);
            return Err(e);
        }
        if connecting {
            self.connecting += 1;
        }
        Ok(ConnId(idx as u32))
    }

    /// Adds `idx` to this pass's run list once.
    fn enqueue(&mut self, idx: usize) {
        if let Some(s) = self.slots.get_mut(idx) {
            if !s.io.queued {
                s.io.queued = true;
                self.run.push(idx);
            }
        }
    }

    /// Records the readiness reported by one `epoll_wait` entry.
    fn on_readiness(&mut self, token: u64, flags: u32) {
        let (kind, idx, gen) = untoken(token);
        if kind == KIND_LISTENER {
            if let Some(l) = self.listeners.get_mut(idx) {
                l.readable = true;
            }
            return;
        }
        // Readiness for an earlier socket of a reused slot, or for a closing one: ignored.
        let Some(s) = self.slots.tagged(idx, gen).filter(|s| !s.closing) else {
            return;
        };
        s.io.readable |= flags & READ_EVENTS != 0;
        s.io.writable |= flags & WRITE_EVENTS != 0;
        s.io.hup |= flags & HANGUP_EVENTS != 0;
        if has_work(s) {
            self.enqueue(idx);
        }
    }

    /// Performs whatever the queued connections are ready for.
    fn run_queued(&mut self, out: &mut Vec<Event>) {
        let mut run = std::mem::take(&mut self.run);
        for idx in run.drain(..) {
            let Some(s) = self.slots.get_mut(idx) else {
                continue;
            };
            s.io.queued = false;
            if s.closing {
                continue;
            }
            let conn = ConnId(idx as u32);
            if s.io.connecting {
                if !s.io.writable {
                    continue;
                }
                s.io.connecting = false;
                self.connecting -= 1;
                let result = s.io.take_connect_result();
                if result.is_err() {
                    s.io.fail();
                }
                out.push(Event::Connected { conn, result });
            }
            if s.send.busy() && s.io.writable {
                if let Some(ev) = try_send(s, conn, &mut self.send_calls) {
                    out.push(ev);
                    self.tx_waiting -= 1;
                }
            }
            if s.recv.busy() && s.io.readable {
                if let Some(ev) = try_recv(s, conn) {
                    out.push(ev);
                    self.slots.leave_direct(idx);
                }
            }
        }
        self.run = run;
    }

    /// Accepts up to [`ACCEPT_BATCH`] connections from each readable listener.
    fn accept_ready(&mut self, out: &mut Vec<Event>) {
        if self.listeners.iter().all(|l| !l.readable) || self.accept_pause.paused() {
            return;
        }
        for li in 0..self.listeners.len() {
            if !self.listeners[li].readable {
                continue;
            }
            for _ in 0..ACCEPT_BATCH {
                match sys::accept(self.listeners[li].fd.as_fd()) {
                    Ok((fd, peer)) => {
                        self.accept_pause.accepted();
                        let made = sys::apply_opts(&SockRef::from(&fd), &self.opts, &peer)
                            .and_then(|()| self.insert(fd, false, &peer));
                        out.push(match made {
                            Ok(conn) => Event::Accepted { conn, peer },
                            Err(e) => Event::AcceptError(e),
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.listeners[li].readable = false;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // The connection died in the backlog; the next one may be fine.
                    Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
                        out.push(Event::AcceptError(e));
                    }
                    // Out of descriptors or memory: report it, and pause accepting
                    // (the listener stays readable and is tried again after the pause).
                    Err(e) if AcceptBackoff::is_exhaustion(&e) => {
                        out.push(Event::AcceptError(e));
                        self.accept_pause.pause(Instant::now());
                        return;
                    }
                    Err(e) => {
                        out.push(Event::AcceptError(e));
                        break;
                    }
                }
            }
        }
    }

    /// One `epoll_wait`; records readiness. `timeout_ms` of 0 never blocks.
    fn wait(&mut self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: `events` is an initialised buffer of `events.len()` entries that we own
        // exclusively for the call; the kernel writes at most that many.
        let n = match syscall!(epoll_wait(
            self.epfd.as_raw_fd(),
            self.events.as_mut_ptr(),
            self.events.len() as i32,
            timeout_ms
        )) {
            Ok(n) => n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        for i in 0..n {
            // Copy out: `epoll_event` is packed on x86-64, so no references into it.
            let (token, flags) = (self.events[i].u64, self.events[i].events);
            self.on_readiness(token, flags);
        }
        Ok(())
    }

    /// True while something can only make progress after an epoll edge.
    fn needs_edges(&self) -> bool {
        self.connecting > 0 || self.tx_waiting > 0
    }

    /// True on the passes where the direct fast path still collects epoll edges (accepts,
    /// and receives beyond those tried directly).
    fn passes_due(&self) -> bool {
        self.passes.is_multiple_of(EPOLL_EVERY)
    }
}

impl Backend for Epoll {
    fn name(&self) -> &'static str {
        "epoll"
    }

    fn describe(&self) -> String {
        format!(
            "epoll edge-triggered, direct recv for up to {} armed receives",
            self.slots.direct_max
        )
    }

    fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let (raw, local) = sys::listener(addr)?;
        // SAFETY: `sys::listener` returns a descriptor that the caller owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let idx = self.listeners.len();
        self.register(fd.as_raw_fd(), super::slots::token(KIND_LISTENER, idx, 0))?;
        self.listeners.push(Listener {
            fd,
            readable: false,
        });
        Ok(local)
    }

    fn connect(&mut self, addr: SocketAddr, bind: Option<SocketAddr>) -> io::Result<ConnId> {
        let raw = sys::stream_socket(&addr, bind, &self.opts)?;
        // SAFETY: `sys::stream_socket` returns a descriptor that the caller owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let started = SockRef::from(&fd).connect(&addr.into());
        match started {
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => self.insert(fd, true, &addr),
            // Loopback may finish (or refuse) at once; report it through poll like any other
            // completion, so the caller has one code path.
            result => {
                let conn = self.insert(fd, false, &addr)?;
                if result.is_err() {
                    self.slots[conn.0 as usize].io.fail();
                }
                self.slots.defer(Event::Connected { conn, result });
                Ok(conn)
            }
        }
    }

    fn send(&mut self, conn: ConnId, batch: TxBatch) {
        let Some((idx, batch)) = self.slots.admit_send(conn, batch) else {
            return;
        };
        let s = &mut self.slots[idx];
        s.send.start(batch);
        // Write at once: on the latency path the socket is almost always writable, and the
        // completion still reaches the caller through `poll`.
        let done = if !s.io.connecting && s.io.writable {
            try_send(s, conn, &mut self.send_calls)
        } else {
            None
        };
        match done {
            Some(ev) => self.slots.defer(ev),
            None => {
                self.tx_waiting += 1;
                // The rest goes on the next EPOLLOUT edge, which only a registered
                // socket gets.
                if let Err(e) = self.wake(idx) {
                    tracing::warn!("epoll: registering a socket again failed: {e}");
                }
            }
        }
    }

    #[inline]
    fn write_now(&mut self, conn: ConnId, pieces: &[&[u8]]) -> usize {
        match self.slots.get_mut(conn.0 as usize) {
            Some(s) if s.send.idle() && !s.closing && !s.io.connecting && s.io.writable => {
                let fd = s.io.raw_fd();
                let chunks = s.send.chunks(fd, s.io.chunk);
                super::op::write_now(fd, pieces, chunks, &mut self.send_calls)
            }
            _ => 0,
        }
    }

    fn recv(&mut self, conn: ConnId, rx: RxBuf) {
        let Some((idx, rx)) = self.slots.admit_recv(conn, rx) else {
            return;
        };
        let s = &mut self.slots[idx];
        s.recv.start(rx);
        let ready = s.io.readable && !s.io.connecting;
        self.slots.join_direct(idx);
        if ready {
            self.enqueue(idx);
        }
    }

    fn reset(&mut self, conn: ConnId) {
        if let Some(fd) = self.slots.open_io(conn).and_then(|io| io.fd.as_ref()) {
            sys::linger_zero(fd.as_raw_fd());
        }
        self.close(conn);
    }

    fn close(&mut self, conn: ConnId) {
        let Some((idx, s)) = self.slots.start_close(conn) else {
            return;
        };
        if std::mem::take(&mut s.io.quiet) {
            self.quiet.retain(|&q| q != idx);
        }
        if let Some(fd) = s.io.fd.take() {
            self.accept_pause.descriptor_freed();
            // Deregister explicitly: a forked child may still hold the socket open, and
            // epoll follows the open file, not the descriptor.
            // SAFETY: both descriptors are open; a null event is allowed for EPOLL_CTL_DEL.
            let _ = syscall!(epoll_ctl(
                self.epfd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                ptr::null_mut()
            ));
            drop(fd);
        }
        // The kernel holds no pointer into our buffers between calls: every pending
        // operation ends now, cancelled, then `Closed`.
        let connecting = std::mem::take(&mut s.io.connecting);
        let batch = s.send.take();
        let rx = s.recv.take();
        if connecting {
            self.connecting -= 1;
            self.slots.defer(Event::Connected {
                conn,
                result: cancelled(),
            });
        }
        if let Some(batch) = batch {
            self.tx_waiting -= 1;
            self.slots.defer(Event::Sent {
                conn,
                batch,
                result: cancelled(),
            });
        }
        if let Some(rx) = rx {
            self.slots.defer(Event::Recv {
                conn,
                rx,
                result: cancelled(),
            });
        }
        self.slots.defer_closed(idx);
    }

    fn submit(&mut self) -> io::Result<()> {
        // Nothing waits in user space: `send` wrote what the socket took at once, and the
        // rest waits for the socket to become writable, which only `poll` can learn.
        Ok(())
    }

    fn collect(&mut self, out: &mut Vec<Event>) -> io::Result<()> {
        // A send that `send` finished at once waits here as a deferred event; anything
        // else needs readiness, which is `poll`'s to learn.
        self.slots.deliver(out);
        Ok(())
    }

    fn poll(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let before = out.len();
        self.passes = self.passes.wrapping_add(1);
        self.slots.deliver(out);

        let direct = !self.slots.direct().is_empty() && self.slots.direct_within_limit();
        if direct && timeout.is_none() {
            self.spins = self.spins.saturating_add(1);
        } else {
            // Waits in the kernel (or does not try receives directly): every socket
            // must be seen by epoll again.
            self.wake_all()?;
        }
        let hush = self.spins >= QUIET_AFTER;
        if direct {
            // Treat every armed receive as possibly readable: a `recv` that finds nothing
            // costs about as much as an `epoll_wait` that finds nothing.
            for k in 0..self.slots.direct().len() {
                let idx = self.slots.direct()[k];
                let s = &mut self.slots[idx];
                if !s.io.connecting {
                    s.io.readable = true;
                    let quiet = s.io.quiet;
                    if !s.io.queued {
                        s.io.queued = true;
                        self.run.push(idx);
                    }
                    if hush && !quiet {
                        self.hush(idx);
                    }
                }
            }
        }
        self.run_queued(out);
        self.accept_ready(out);

        if direct && timeout.is_none() && !self.needs_edges() && !self.passes_due() {
            return Ok(());
        }
        loop {
            let idle = out.len() == before && self.run.is_empty();
            // A pause of accepting ends the wait early, so accepting resumes on time.
            let wake = match (deadline, self.accept_pause.until()) {
                (Some(d), Some(p)) => Some(d.min(p)),
                (d, _) => d,
            };
            let timeout_ms = match wake {
                Some(d) if idle => ceil_ms(d.saturating_duration_since(Instant::now())),
                _ => 0,
            };
            self.wait(timeout_ms)?;
            self.run_queued(out);
            self.accept_ready(out);
            // A wake-up may carry only stale edges; keep waiting until the deadline.
            if timeout_ms == 0
                || out.len() > before
                || deadline.is_some_and(|d| Instant::now() >= d)
            {
                return Ok(());
            }
        }
    }

    fn end_cause(&self, conn: ConnId) -> Option<io::Error> {
        let s = self.slots.get(conn.0 as usize)?;
        sys::timeout_abort(s.io.fd.as_ref()?.as_raw_fd())
    }

    fn open_fd(&self, conn: ConnId) -> Option<RawFd> {
        let s = self.slots.get(conn.0 as usize)?;
        (!s.closing).then(|| s.io.fd.as_ref().map(AsRawFd::as_raw_fd))?
    }

    fn prepare_wait(&mut self) -> io::Result<Option<RawFd>> {
        // Quiet sockets back in the set, and the edges it holds recorded: what they make
        // ready is work now, and the instance polls readable only for newer edges.
        self.wake_all()?;
        self.wait(0)?;
        let ready = !self.run.is_empty()
            || self.slots.has_deferred()
            || (self.listeners.iter().any(|l| l.readable) && !self.accept_pause.paused());
        Ok((!ready).then(|| self.epfd.as_raw_fd()))
    }

    fn counters(&self) -> Counters {
        Counters {
            send_calls: self.send_calls.calls,
            spliced_bytes: self.send_calls.spliced,
            lend_pipes: self.send_calls.pipes_made,
            lend_pipes_open: self.send_calls.pipes_open(),
            lend: self.send_calls.judge.costs(),
            ..Counters::default()
        }
    }

    #[inline]
    fn lend_wanted(&self) -> bool {
        self.send_calls.judge.wanted()
    }
}

/// This backend's part of a connection: its socket and readiness.
struct Io {
    /// `None` once closed (the slot lives on until `Closed` is delivered).
    fd: Option<OwnedFd>,
    readable: bool,
    writable: bool,
    /// Peer hang-up or socket error seen: no further edge will come.
    hup: bool,
    connecting: bool,
    /// In `Epoll::run`.
    queued: bool,
    /// Out of the epoll set while its receive is spun (`Epoll::hush`).
    quiet: bool,
    /// Most bytes per send call (`SockOpts::send_chunks_for`).
    chunk: Chunks,
}

impl Io {
    fn new(fd: OwnedFd, connecting: bool) -> Self {
        Self {
            fd: Some(fd),
            readable: false,
            // A connected socket starts with an empty send buffer; `EAGAIN` corrects this.
            writable: !connecting,
            hup: false,
            connecting,
            queued: false,
            quiet: false,
            chunk: Chunks::WHOLE,
        }
    }

    /// After a failed connect no edge will come: let later operations run (and fail) at once.
    fn fail(&mut self) {
        self.hup = true;
        self.readable = true;
        self.writable = true;
    }

    fn raw_fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |fd| fd.as_raw_fd())
    }

    /// The outcome of a non-blocking connect once the socket reported writable or error.
    fn take_connect_result(&self) -> io::Result<()> {
        let Some(fd) = self.fd.as_ref() else {
            return cancelled();
        };
        sys::socket_error(fd.as_raw_fd())
    }
}

fn has_work(s: &Slot<Io>) -> bool {
    if s.io.connecting {
        s.io.writable
    } else {
        (s.send.busy() && s.io.writable) || (s.recv.busy() && s.io.readable)
    }
}

/// Writes as much of the pending batch as the socket takes ([`SendOp::try_now`](super::op::SendOp::try_now)).
/// Returns the completion when the send is over.
fn try_send(s: &mut Slot<Io>, conn: ConnId, calls: &mut SendShared) -> Option<Event> {
    match s.send.try_now(s.io.raw_fd(), s.io.chunk, calls) {
        Attempt::Blocked => {
            s.io.writable = false;
            None
        }
        Attempt::Done(result) => s.send.take().map(|batch| Event::Sent {
            conn,
            batch,
            result,
        }),
    }
}

/// Reads into the pending receive buffer ([`RecvOp::try_now`](super::op::RecvOp::try_now)).
/// Returns the completion when the receive is over.
fn try_recv(s: &mut Slot<Io>, conn: ConnId) -> Option<Event> {
    let tried = s.recv.try_now(s.io.raw_fd(), s.io.hup);
    s.io.hup |= tried.eof;
    if tried.drained && !s.io.hup {
        // The socket is empty: the next data brings an edge.
        s.io.readable = false;
    }
    match tried.attempt {
        Attempt::Blocked => None,
        Attempt::Done(result) => s.recv.take().map(|rx| Event::Recv { conn, rx, result }),
    }
}

/// A listening socket.
struct Listener {
    fd: OwnedFd,
    /// Edge seen and backlog not yet drained.
    readable: bool,
}

/// `epoll_wait` returns at most this many events per call.
const EVENTS_MAX: usize = 256;
/// Connections accepted per listener per pass, so a connection storm cannot starve I/O.
const ACCEPT_BATCH: usize = 64;
/// Consecutive `poll(None)` calls after which the spun sockets leave the epoll set.
pub(crate) const QUIET_AFTER: u32 = 1024;
/// In the direct fast path, collect epoll edges (accepts, hang-ups) every this many passes.
pub(crate) const EPOLL_EVERY: u32 = 16;
/// Edges after which a `recv` makes progress (data, end of stream, or the error).
const READ_EVENTS: u32 =
    (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;
/// Edges after which a `sendmsg` or a pending connect makes progress.
const WRITE_EVENTS: u32 = (libc::EPOLLOUT | libc::EPOLLHUP | libc::EPOLLERR) as u32;
/// Edges after which no further edge is guaranteed: readiness stays set.
const HANGUP_EVENTS: u32 = (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;
/// Token kind of a connection's socket (the token carries slot and generation).
const KIND_CONN: u8 = 1;
/// Token kind of a listener (the token carries its index).
const KIND_LISTENER: u8 = 2;

/// Milliseconds for epoll_wait, rounded up so a short timeout does not become a spin.
fn ceil_ms(d: Duration) -> i32 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    i32::try_from(ms).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io::{Read, Write};
    use std::mem;
    use std::net::{TcpListener, TcpStream};
    use std::thread;

    use bytes::Bytes;

    use super::*;
    use crate::reactor::slots::DIRECT_RECV_MAX;
    use crate::reactor::AnyBackend;

    /// Upper bound on any wait in these tests; reaching it is a failure, never a pass.
    const LIMIT: Duration = Duration::from_secs(20);

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    fn opts() -> SockOpts {
        SockOpts {
            nodelay: true,
            ..SockOpts::default()
        }
    }

    fn errno<T: std::fmt::Debug>(r: &io::Result<T>) -> Option<i32> {
        r.as_ref().err().and_then(io::Error::raw_os_error)
    }

    #[test]
    fn conformance() {
        crate::reactor::conformance::run_all(&|opts| {
            AnyBackend::Epoll(Epoll::new(opts).expect("epoll instance"))
        });
    }

    /// A backend plus the events it produced that no one has taken yet.
    struct Driver<B> {
        b: B,
        queue: VecDeque<Event>,
    }

    impl<B: Backend> Driver<B> {
        fn new(b: B) -> Self {
            Self {
                b,
                queue: VecDeque::new(),
            }
        }

        fn fill(&mut self) {
            let mut out = Vec::new();
            self.b
                .poll(Some(Duration::from_millis(10)), &mut out)
                .unwrap();
            for ev in out {
                if let Event::AcceptError(e) = ev {
                    panic!("accept failed: {e}");
                }
                self.queue.push_back(ev);
            }
        }

        /// The next event, in delivery order.
        fn next(&mut self) -> Event {
            let deadline = Instant::now() + LIMIT;
            loop {
                if let Some(ev) = self.queue.pop_front() {
                    return ev;
                }
                assert!(Instant::now() < deadline, "no event within {LIMIT:?}");
                self.fill();
            }
        }

        /// The first event `pick` accepts; the others stay queued in order.
        fn take<T>(&mut self, mut pick: impl FnMut(&Event) -> Option<T>) -> (T, Event) {
            let deadline = Instant::now() + LIMIT;
            loop {
                if let Some(i) = self.queue.iter().position(|e| pick(e).is_some()) {
                    let ev = self.queue.remove(i).unwrap();
                    return (pick(&ev).unwrap(), ev);
                }
                assert!(Instant::now() < deadline, "expected event did not come");
                self.fill();
            }
        }

        /// Asserts that nothing arrives for `d`.
        fn quiet(&mut self, d: Duration) {
            let end = Instant::now() + d;
            while Instant::now() < end {
                self.fill();
            }
            assert!(self.queue.is_empty(), "unexpected {:?}", self.queue);
        }

        /// Listens, connects to itself, and returns (client, server) once both are up.
        fn pair(&mut self) -> (ConnId, ConnId) {
            let addr = self.b.listen(loopback()).unwrap();
            let client = self.b.connect(addr, None).unwrap();
            let (server, _) = self.take(|e| match e {
                Event::Accepted { conn, .. } => Some(*conn),
                _ => None,
            });
            self.connected(client).unwrap();
            (client, server)
        }

        fn connected(&mut self, c: ConnId) -> io::Result<()> {
            match self
                .take(|e| matches!(e, Event::Connected { conn, .. } if *conn == c).then_some(()))
            {
                (_, Event::Connected { result, .. }) => result,
                _ => unreachable!(),
            }
        }

        fn sent(&mut self, c: ConnId) -> (TxBatch, io::Result<()>) {
            match self.take(|e| matches!(e, Event::Sent { conn, .. } if *conn == c).then_some(())) {
                (_, Event::Sent { batch, result, .. }) => (batch, result),
                _ => unreachable!(),
            }
        }

        fn received(&mut self, c: ConnId) -> (RxBuf, io::Result<usize>) {
            match self.take(|e| matches!(e, Event::Recv { conn, .. } if *conn == c).then_some(())) {
                (_, Event::Recv { rx, result, .. }) => (rx, result),
                _ => unreachable!(),
            }
        }

        fn closed(&mut self, c: ConnId) {
            self.take(|e| matches!(e, Event::Closed { conn } if *conn == c).then_some(()));
        }

        /// Receives on `c` until `len` bytes came (or end of stream); returns them.
        fn read_exact(&mut self, c: ConnId, len: usize) -> Vec<u8> {
            let mut got = Vec::with_capacity(len);
            while got.len() < len {
                self.b.recv(c, RxBuf::cache(64 * 1024));
                let (rx, result) = self.received(c);
                let n = result.unwrap();
                if n == 0 {
                    break;
                }
                assert_eq!(rx.pending(), n);
                got.extend_from_slice(rx.bytes(0..n));
            }
            got
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// A batch of `len` bytes as copied headers and referenced segments, as the endpoint
    /// builds it. Returns the batch and the bytes it must put on the wire.
    fn batch_of(len: usize, seed: u8, segment: usize) -> (TxBatch, Vec<u8>) {
        let wire = pattern(len, seed);
        let mut b = TxBatch::with_capacity(1024, 64);
        for (i, chunk) in wire.chunks(segment).enumerate() {
            if i % 2 == 0 {
                b.push_copy(chunk);
            } else {
                b.push_ext(Bytes::copy_from_slice(chunk));
            }
        }
        (b, wire)
    }

    #[test]
    fn listen_connect_accept() {
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        assert_eq!(d.b.name(), "epoll");
        let addr = d.b.listen(loopback()).unwrap();
        let client = d.b.connect(addr, None).unwrap();
        let (peer, _) = d.take(|e| match e {
            Event::Accepted { peer, .. } => Some(*peer),
            _ => None,
        });
        assert!(peer.ip().is_loopback());
        d.connected(client).unwrap();
        d.b.close(client);
        d.closed(client);
        d.quiet(Duration::from_millis(20));
    }

    #[test]
    fn gathered_batch_arrives_whole_and_in_order() {
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        let (client, server) = d.pair();
        let (batch, wire) = batch_of(10_000, 7, 333);
        assert!(batch.parts() > 20);
        d.b.send(client, batch);
        let (back, result) = d.sent(client);
        result.unwrap();
        assert_eq!(back.remaining(), 0);
        assert_eq!(d.read_exact(server, wire.len()), wire);
    }

    #[test]
    fn large_batch_resumes_short_writes_to_slow_reader() {
        const LEN: usize = 8 << 20;
        let peer = TcpListener::bind(loopback()).unwrap();
        let addr = peer.local_addr().unwrap();
        let reader = thread::spawn(move || {
            let (mut s, _) = peer.accept().unwrap();
            let mut got = Vec::with_capacity(LEN);
            let mut buf = vec![0; 32 * 1024];
            for i in 0.. {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                if i % 8 == 0 {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            got
        });
        // A send buffer far below the 4 MiB one sendmsg offers, so nearly every write is
        // short. (Much smaller buffers only add loopback delayed-ACK stalls of 40 ms.)
        let small = SockOpts {
            sndbuf: Some(64 * 1024),
            ..opts()
        };
        let mut d = Driver::new(Epoll::new(small).unwrap());
        let client = d.b.connect(addr, None).unwrap();
        d.connected(client).unwrap();
        // More than IOV_MAX pieces, so one sendmsg can never take the whole batch.
        let (batch, wire) = batch_of(LEN, 3, 4 * 1024);
        assert!(batch.parts() > crate::reactor::op::MAX_IOV);
        d.b.send(client, batch);
        let (back, result) = d.sent(client);
        result.unwrap();
        assert_eq!(back.remaining(), 0);
        d.b.close(client);
        d.closed(client);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), wire.len());
        assert!(got == wire, "bytes differ");
    }

    #[test]
    fn end_of_stream_after_data() {
        let peer = TcpListener::bind(loopback()).unwrap();
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        let client = d.b.connect(peer.local_addr().unwrap(), None).unwrap();
        let (mut s, _) = peer.accept().unwrap();
        d.connected(client).unwrap();
        s.write_all(b"last words").unwrap();
        drop(s);
        assert_eq!(d.read_exact(client, 10), b"last words");
        d.b.recv(client, RxBuf::cache(64));
        assert_eq!(d.received(client).1.unwrap(), 0);
        // End of stream is sticky: a further receive sees it again, without a new edge.
        d.b.recv(client, RxBuf::cache(64));
        assert_eq!(d.received(client).1.unwrap(), 0);
    }

    #[test]
    fn closed_peer_is_end_of_stream_and_send_fails_without_sigpipe() {
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        let (client, server) = d.pair();
        d.b.recv(server, RxBuf::cache(64));
        d.b.close(client);
        d.closed(client);
        assert_eq!(d.received(server).1.unwrap(), 0);
        // The peer is gone: writing must fail with EPIPE/ECONNRESET, never raise SIGPIPE.
        let mut failed = false;
        for _ in 0..100 {
            let (batch, _) = batch_of(4096, 1, 4096);
            d.b.send(server, batch);
            let (_, result) = d.sent(server);
            if let Err(e) = result {
                assert!(matches!(
                    errno(&Err::<(), _>(e)),
                    Some(libc::EPIPE | libc::ECONNRESET)
                ));
                failed = true;
                break;
            }
        }
        assert!(failed, "writes to a closed peer kept succeeding");
    }

    #[test]
    fn refused_connect_completes_with_error() {
        let addr = {
            let l = TcpListener::bind(loopback()).unwrap();
            l.local_addr().unwrap()
        };
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        let conn = d.b.connect(addr, None).unwrap();
        let err = d.connected(conn).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        d.b.close(conn);
        d.closed(conn);
        d.quiet(Duration::from_millis(20));
    }

    #[test]
    fn close_cancels_pending_operations_then_one_closed() {
        let tiny = SockOpts {
            sndbuf: Some(4096),
            rcvbuf: Some(4096),
            ..opts()
        };
        let mut d = Driver::new(Epoll::new(tiny).unwrap());
        let (client, _server) = d.pair();
        // The server never reads, so this send stays blocked on a full socket.
        let (batch, _) = batch_of(8 << 20, 9, 64 * 1024);
        d.b.send(client, batch);
        d.b.recv(client, RxBuf::cache(1024));
        d.quiet(Duration::from_millis(30));
        d.b.close(client);
        d.b.close(client);
        let mut order = Vec::new();
        for _ in 0..3 {
            match d.next() {
                Event::Sent {
                    conn,
                    batch,
                    result,
                } => {
                    assert_eq!(conn, client);
                    assert_eq!(errno(&result), Some(libc::ECANCELED));
                    assert!(batch.remaining() > 0 && batch.len() == 8 << 20);
                    order.push("sent");
                }
                Event::Recv { conn, rx, result } => {
                    assert_eq!(conn, client);
                    assert_eq!(errno(&result), Some(libc::ECANCELED));
                    assert_eq!(rx.capacity(), 1024);
                    order.push("recv");
                }
                Event::Closed { conn } => {
                    assert_eq!(conn, client);
                    order.push("closed");
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(order.last(), Some(&"closed"));
        d.quiet(Duration::from_millis(30));
    }

    #[test]
    fn operations_on_a_closing_connection_still_complete() {
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        let (client, _server) = d.pair();
        d.b.close(client);
        let (batch, _) = batch_of(100, 0, 100);
        d.b.send(client, batch);
        d.b.recv(client, RxBuf::cache(64));
        let mut seen = (false, false, false);
        for _ in 0..3 {
            match d.next() {
                Event::Closed { .. } => seen.0 = true,
                Event::Sent { result, .. } => seen.1 = result.is_err(),
                Event::Recv { result, .. } => seen.2 = result.is_err(),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(seen, (true, true, true));
    }

    #[test]
    fn timed_poll_with_nothing_ready_returns_empty() {
        let mut b = Epoll::new(opts()).unwrap();
        let mut out = Vec::new();
        let t = Instant::now();
        b.poll(Some(Duration::from_millis(50)), &mut out).unwrap();
        assert!(out.is_empty());
        // It did wait (rather than spin back at once); no upper bound is asserted.
        assert!(t.elapsed() >= Duration::from_millis(40));
        // Same with idle connections and armed receives.
        let mut d = Driver::new(b);
        let (client, server) = d.pair();
        d.b.recv(client, RxBuf::cache(64));
        d.b.recv(server, RxBuf::cache(64));
        d.b.poll(Some(Duration::from_millis(50)), &mut out).unwrap();
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn reused_slot_ignores_readiness_of_its_previous_socket() {
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        let (client, server) = d.pair();
        d.b.close(client);
        d.closed(client);
        let addr = d.b.listen(loopback()).unwrap();
        let again = d.b.connect(addr, None).unwrap();
        assert_eq!(again, client, "slab reuses the freed slot");
        d.connected(again).unwrap();
        let (accepted, _) = d.take(|e| match e {
            Event::Accepted { conn, .. } => Some(*conn),
            _ => None,
        });
        d.b.recv(server, RxBuf::cache(64));
        assert_eq!(d.received(server).1.unwrap(), 0);
        let (batch, wire) = batch_of(1000, 5, 100);
        d.b.send(again, batch);
        d.sent(again).1.unwrap();
        assert_eq!(d.read_exact(accepted, wire.len()), wire);
    }

    #[test]
    fn drop_closes_every_socket() {
        let peer = TcpListener::bind(loopback()).unwrap();
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        let client = d.b.connect(peer.local_addr().unwrap(), None).unwrap();
        let (mut s, _) = peer.accept().unwrap();
        d.connected(client).unwrap();
        // Pending operations are dropped with the backend; the kernel holds no pointer.
        d.b.recv(client, RxBuf::cache(64));
        let listening = d.b.listen(loopback()).unwrap();
        drop(d);
        s.set_read_timeout(Some(LIMIT)).unwrap();
        assert_eq!(s.read(&mut [0; 8]).unwrap(), 0, "socket left open");
        assert!(TcpStream::connect(listening).is_err(), "listener left open");
    }

    #[test]
    fn fifty_connections() {
        const N: usize = 50;
        let mut d = Driver::new(Epoll::new(opts()).unwrap());
        let addr = d.b.listen(loopback()).unwrap();
        let clients: Vec<ConnId> = (0..N).map(|_| d.b.connect(addr, None).unwrap()).collect();
        let mut servers = Vec::new();
        while servers.len() < N {
            match d.next() {
                Event::Accepted { conn, .. } => servers.push(conn),
                Event::Connected { result, .. } => result.unwrap(),
                other => panic!("unexpected {other:?}"),
            }
        }
        // Each client announces its index, so the server side can check what it got.
        for (i, &c) in clients.iter().enumerate() {
            let mut b = TxBatch::with_capacity(2048, 2);
            b.push_copy(&[i as u8]);
            b.push_copy(&pattern(1023, i as u8));
            d.b.send(c, b);
        }
        for &c in &clients {
            d.sent(c).1.unwrap();
        }
        let mut seen = [false; N];
        for &s in &servers {
            let got = d.read_exact(s, 1024);
            let i = got[0] as usize;
            assert_eq!(got[1..], pattern(1023, i as u8)[..]);
            assert!(!mem::replace(&mut seen[i], true));
        }
        // Fifty receives armed at once (epoll path), completed by end of stream in whatever
        // order the clients go away.
        for &s in &servers {
            d.b.recv(s, RxBuf::cache(64));
        }
        for &c in clients.iter().rev() {
            d.b.close(c);
        }
        for &s in &servers {
            assert_eq!(d.received(s).1.unwrap(), 0);
        }
        for &c in &servers {
            d.b.close(c);
        }
        for &c in clients.iter().chain(&servers) {
            d.closed(c);
        }
        d.quiet(Duration::from_millis(20));
    }

    #[test]
    fn spun_poll_delivers_with_and_without_fast_path() {
        for direct_max in [0, DIRECT_RECV_MAX] {
            let mut b = Epoll::new(opts()).unwrap();
            b.slots.direct_max = direct_max;
            let addr = b.listen(loopback()).unwrap();
            let client = b.connect(addr, None).unwrap();
            // Only `poll(None)` from here on: accepts and connects must still arrive.
            let mut out = Vec::new();
            let mut server = None;
            let mut up = false;
            let deadline = Instant::now() + LIMIT;
            while server.is_none() || !up {
                assert!(Instant::now() < deadline, "no accept/connect when spinning");
                b.poll(None, &mut out).unwrap();
                for e in out.drain(..) {
                    match e {
                        Event::Accepted { conn, .. } => server = Some(conn),
                        Event::Connected { result, .. } => up = result.is_ok(),
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
            let server = server.unwrap();
            let (mut rc, mut rs) = (RxBuf::cache(4096), RxBuf::cache(4096));
            for _ in 0..200 {
                b.send(client, frame_batch());
                rs = spin_recv(&mut b, &mut out, server, rs);
                b.send(server, frame_batch());
                rc = spin_recv(&mut b, &mut out, client, rc);
            }
        }
    }

    /// Connects a client to a listener of `b` with `poll(None)` only.
    fn spun_pair(b: &mut Epoll, out: &mut Vec<Event>) -> (ConnId, ConnId) {
        let addr = b.listen(loopback()).unwrap();
        let client = b.connect(addr, None).unwrap();
        let (mut server, mut up) = (None, false);
        let deadline = Instant::now() + LIMIT;
        while server.is_none() || !up {
            assert!(Instant::now() < deadline, "no accept/connect");
            b.poll(None, out).unwrap();
            for e in out.drain(..) {
                match e {
                    Event::Accepted { conn, .. } => server = Some(conn),
                    Event::Connected { result, .. } => up = result.is_ok(),
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        (client, server.unwrap())
    }

    fn is_quiet(b: &Epoll, c: ConnId) -> bool {
        let quiet = b.slots.get(c.0 as usize).is_some_and(|s| s.io.quiet);
        assert_eq!(
            quiet,
            b.quiet.contains(&(c.0 as usize)),
            "flag and list agree"
        );
        quiet
    }

    #[test]
    fn spun_sockets_leave_the_epoll_set_and_return_for_a_wait() {
        let mut b = Epoll::new(opts()).unwrap();
        let mut out = Vec::new();
        let (client, server) = spun_pair(&mut b, &mut out);
        // Spun long enough, a socket whose receive is tried directly leaves the set.
        b.recv(server, RxBuf::cache(4096));
        for _ in 0..QUIET_AFTER + 8 {
            b.poll(None, &mut out).unwrap();
        }
        assert!(out.is_empty(), "unexpected {out:?}");
        assert!(is_quiet(&b, server), "spun receive still registered");
        // Data that comes while it is out is found by the spun recv.
        b.send(client, frame_batch());
        let deadline = Instant::now() + LIMIT;
        let mut rx = loop {
            assert!(Instant::now() < deadline, "the spun recv missed the data");
            b.poll(None, &mut out).unwrap();
            if let Some(i) = out
                .iter()
                .position(|e| matches!(e, Event::Recv { conn, .. } if *conn == server))
            {
                match out.swap_remove(i) {
                    Event::Recv { rx, result, .. } => {
                        assert!(result.unwrap() > 0);
                        break rx;
                    }
                    _ => unreachable!(),
                }
            }
        };
        out.retain(|e| !matches!(e, Event::Sent { .. }));
        assert!(out.is_empty(), "unexpected {out:?}");
        // A wait in the kernel puts it back first, and misses nothing: the data sent
        // before the wait wakes it.
        let r = rx.consume(rx.pending());
        assert!(!r.is_empty());
        rx.compact();
        b.recv(server, rx);
        for _ in 0..QUIET_AFTER + 8 {
            b.poll(None, &mut out).unwrap();
        }
        assert!(is_quiet(&b, server));
        b.send(client, frame_batch());
        let deadline = Instant::now() + LIMIT;
        let got = loop {
            assert!(Instant::now() < deadline, "the wait missed the data");
            b.poll(Some(LIMIT), &mut out).unwrap();
            assert!(
                !is_quiet(&b, server),
                "waited with the socket out of the set"
            );
            if let Some(i) = out
                .iter()
                .position(|e| matches!(e, Event::Recv { conn, .. } if *conn == server))
            {
                match out.swap_remove(i) {
                    Event::Recv { result, .. } => break result.unwrap(),
                    _ => unreachable!(),
                }
            }
        };
        assert!(got > 0);
    }

    #[test]
    fn a_quiet_socket_whose_send_blocks_gets_its_writable_edge() {
        const LEN: usize = 4 << 20;
        let small = SockOpts {
            sndbuf: Some(64 * 1024),
            ..opts()
        };
        let mut b = Epoll::new(small).unwrap();
        let mut out = Vec::new();
        let (client, server) = spun_pair(&mut b, &mut out);
        b.recv(client, RxBuf::cache(4096));
        for _ in 0..QUIET_AFTER + 8 {
            b.poll(None, &mut out).unwrap();
        }
        assert!(is_quiet(&b, client));
        // Far more than the socket buffers hold: the send blocks at once and resumes
        // only on EPOLLOUT edges, while the server reads (spun, never waiting).
        let (batch, wire) = batch_of(LEN, 9, 64 * 1024);
        b.send(client, batch);
        assert!(!is_quiet(&b, client), "a blocked send needs its edges");
        let (mut got, mut sent) = (Vec::with_capacity(LEN), false);
        b.recv(server, RxBuf::cache(256 * 1024));
        let deadline = Instant::now() + LIMIT;
        while !sent || got.len() < LEN {
            assert!(Instant::now() < deadline, "blocked send never finished");
            b.poll(None, &mut out).unwrap();
            for e in out.drain(..) {
                match e {
                    Event::Sent { conn, result, .. } if conn == client => {
                        result.unwrap();
                        sent = true;
                    }
                    Event::Recv { conn, rx, result } if conn == server => {
                        let n = result.unwrap();
                        assert!(n > 0, "end of stream");
                        let mut rx = rx;
                        let r = rx.consume(rx.pending());
                        got.extend_from_slice(rx.bytes(r));
                        rx.compact();
                        b.recv(server, rx);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        assert!(got == wire, "bytes differ");
    }

    const MSG: usize = 64;

    /// Waits (spinning `poll(None)`) for the receive on `conn` to gather `MSG` bytes,
    /// re-arming it after partial reads. Returns the buffer, emptied for reuse.
    fn spin_recv(b: &mut Epoll, out: &mut Vec<Event>, conn: ConnId, mut rx: RxBuf) -> RxBuf {
        loop {
            b.recv(conn, rx);
            let deadline = Instant::now() + LIMIT;
            rx = loop {
                assert!(Instant::now() < deadline, "receive never completed");
                b.poll(None, out).unwrap();
                if let Some(i) = out
                    .iter()
                    .position(|e| matches!(e, Event::Recv { conn: c, .. } if *c == conn))
                {
                    match out.swap_remove(i) {
                        Event::Recv { rx, result, .. } => {
                            assert!(result.unwrap() > 0, "peer closed");
                            break rx;
                        }
                        _ => unreachable!(),
                    }
                }
                out.retain(|e| !matches!(e, Event::Sent { .. }));
            };
            if rx.pending() >= MSG {
                let got = rx.consume(MSG);
                assert!(rx.bytes(got).iter().all(|&b| b == 0x5a), "bytes differ");
                rx.compact();
                return rx;
            }
        }
    }

    /// `MSG` bytes of a pattern, in two pieces as a header and its payload would be (the
    /// reactor moves bytes; what they mean is not its business).
    fn frame_batch() -> TxBatch {
        let mut b = TxBatch::with_capacity(MSG, 2);
        b.push_copy(&[0x5a; 8]);
        b.push_copy(&[0x5a; MSG - 8]);
        b
    }
}
