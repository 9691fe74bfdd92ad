//! The io_uring backend: every socket operation is one SQE, every result one CQE, with
//! two fast paths that skip the ring while the caller spins: a send first tries a direct
//! non-blocking `sendmsg` (only what the socket does not take becomes a `SendMsg` SQE),
//! and a receive is first *parked* and tried with a direct `recv` (below).
//!
//! What it owns: the ring, the listeners, and the connection table (`slots`, shared with
//! the epoll backend; the slot index is the [`ConnId`]). Each slot owns, while its
//! operations are in flight, every byte the kernel may read or write: the send op with
//! its batch, iovec array and `msghdr`, the receive op with its [`RxBuf`], the `sockaddr`
//! of a connect. The operations themselves (their memory and SQEs) are described once in
//! `op`; this backend pushes their SQEs and routes their CQEs. Memory the kernel sees is
//! heap-stable (a `Box`, or a buffer that is not touched while in flight), so the table
//! may grow and move slots without moving anything the kernel points at.
//!
//! Ring set-up: `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG` where the kernel accepts it
//! (6.1+), else `COOP_TASKRUN | TASKRUN_FLAG` (5.19+), else a plain ring. With deferred
//! task work, completions are only posted by an `io_uring_enter` carrying `GETEVENTS`, so
//! [`Backend::poll`] reads the SQ flags word in user space and enters the kernel only
//! when it pushed SQEs, when the kernel raised `IORING_SQ_TASKRUN` or `IORING_SQ_CQ_OVERFLOW`,
//! or when asked to wait. A progress loop spinning on `poll(None)` with nothing pending
//! therefore makes no system call at all.
//!
//! The ring must be driven from the thread that created it (`SINGLE_ISSUER`); the kernel
//! refuses an enter from another task with `EEXIST`.
//!
//! Receives come in two modes. By default each receive is one `Recv` into the
//! connection's own cache (an [`RxBuf`] rented from the engine). While the table's
//! direct set has room, a receive is first *parked* there: tried with a direct
//! non-blocking `recv` on every non-blocking `poll` (the latency floor), and handed to the
//! kernel as a `Recv` SQE only before the backend waits in the kernel. A parked receive
//! keeps the contract: a buffer that wants all of its bytes stays parked until it is full,
//! and its SQE reads only the rest. With
//! [`ProvidedRecv::provide_buffers`](super::ProvidedRecv::provide_buffers) (opt-in,
//! kernel 6.0+), one ring of provided buffers (buffer group 0) serves every connection:
//! each connection has one `RecvMulti` armed, each CQE lends a filled buffer to the caller
//! as a [`ProvidedBuf`](super::ProvidedBuf), and the caller gives it back after parsing. A multishot receive
//! that ends without `IORING_CQE_F_MORE` is re-armed; one that ends with `ENOBUFS` (the
//! ring ran empty) waits in `starved` until a buffer comes back, then is re-armed, the
//! unread bytes waiting in the socket meanwhile. Receive memory is then shared instead of
//! one cache per connection, at the price of the direct-`recv` fast path.
//!
//! `user_data` is a token of the table (slot index, generation) whose kind is the
//! operation. A connection has at most one op of each kind in flight, so the token names
//! one SQE exactly and `AsyncCancel` can target it; a completion that outlived its slot
//! carries an old generation and is dropped.

use std::collections::VecDeque;
use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, EnterFlags, IoUring, Probe};
use socket2::SockAddr;

use super::bufring::BufPool;
use super::listen::AcceptBackoff;
use super::op::{cancelled, Attempt, Chunks, SendFlavor, SendShared};
use super::slots::{token, untoken, Slot, Slots};
use super::{sys, Backend, ConnId, Counters, Event, RxBuf, SockOpts, TxBatch};

mod accept;
mod provided;

/// The io_uring completion-ring backend.
pub(crate) struct Uring {
    ring: IoUring,
    mode: RingMode,
    opts: SockOpts,
    slots: Slots<Io>,
    listeners: Vec<Listener>,
    /// SQEs that did not fit in the SQ, pushed in order before any newer one.
    backlog: VecDeque<squeue::Entry>,
    /// Reused scratch space for reaped CQEs (`user_data`, `res`, `flags`).
    cqes: Vec<(u64, i32, u32)>,
    /// Set by `Drop`: accepts are not re-armed and sends not resumed.
    shutting_down: bool,
    /// Number of `io_uring_enter` calls made (for the no-syscall spin test and tools).
    enters: u64,
    /// Number of sends resubmitted after a short write or the iovec cap.
    resumes: u64,
    /// Operations submitted again after the kernel ended them with their submitting
    /// thread (see `submit_again`).
    resubmits: u64,
    /// SendMsg / SendMsgZc SQEs pushed.
    send_sqes: u64,
    /// Direct non-blocking send calls (before any SQE, for writes at once, and to resume
    /// lent pages), and the spare pipes of lent pages.
    send_direct: SendShared,
    /// Zero-copy sends whose notification arrived, and how many of them the kernel
    /// copied after all (loopback always does).
    zc_sends: u64,
    zc_copied: u64,
    /// The kernel has `IORING_OP_SENDMSG_ZC` (6.1+).
    zc_supported: bool,
    /// The kernel has `IORING_OP_SEND`: single-buffer batches skip the msghdr.
    send_op: bool,
    /// The provided-buffer ring (buffer group [`BGID`]), when receives are multishot.
    /// Declared after `ring`; the kernel's registration is removed in `shutdown`, after
    /// every receive selecting from it completed.
    pool: Option<Rc<BufPool>>,
    /// Slots whose multishot receive stopped with `ENOBUFS`, to re-arm once a buffer is
    /// back in the ring.
    starved: Vec<usize>,
    /// Number of `ENOBUFS` completions seen.
    starvations: u64,
    /// Accepts are not re-armed while paused after `EMFILE` and the like.
    accept_pause: AcceptBackoff,
    /// An eventfd registered with the ring once someone waits for it from outside
    /// ([`Backend::prepare_wait`]): with `DEFER_TASKRUN` a completion is task work that
    /// runs only when this thread enters the kernel, and the ring's descriptor does not
    /// poll readable for it; the kernel signals the eventfd when such work is queued.
    wake: Option<OwnedFd>,
}

/// Which set-up flags the kernel accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingMode {
    /// `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG`.
    DeferTaskrun,
    /// `COOP_TASKRUN | TASKRUN_FLAG`.
    CoopTaskrun,
    /// No task-run flags.
    Plain,
}

/// This backend's part of a connection (the send and receive ops are in the slot).
///
/// The slot's send op is in flight exactly while it holds a batch (unless only
/// zero-copy notifications are outstanding); its receive op is in flight while it holds
/// a buffer and is not parked in the direct set (a parked receive is never seen by the
/// kernel).
struct Io {
    fd: RawFd,
    /// Destination of the connect in flight (read by the kernel until the CQE).
    connect: Option<Box<SockAddr>>,
    /// The connect in flight is a `PollAdd` for writability that watches the socket's own
    /// connect, whose `Connect` SQE the kernel ended with its submitting thread.
    connect_polled: bool,
    /// A multishot `RecvMulti` on the provided buffers is queued or in flight.
    mshot: bool,
    /// The multishot receive stopped because the ring was empty; it is in `starved`.
    starved: bool,
    /// `pause_provided` asked to stop the multishot receive; `ProvidedPaused` is due when
    /// its last CQE arrives.
    pausing: bool,
    /// Sends to this peer may use `SENDMSG_ZC` (configured, and not a loopback peer).
    zc: bool,
    /// Most bytes per send call (`SockOpts::send_chunks_for`).
    chunk: Chunks,
    /// Zero-copy notifications still to come: until then the kernel may read the
    /// batch's buffers, so the batch stays in the slot.
    zc_notifs: u32,
    /// The send finished (all written, or failed) but notifications are outstanding:
    /// `Sent` is delivered with this result when the last one arrives.
    zc_result: Option<io::Result<()>>,
    /// `AsyncCancel` SQEs whose own CQE has not arrived yet.
    cancels: u32,
    /// The fd is closed and `Closed` is deferred; the slot goes when it is delivered.
    closed: bool,
}

impl Io {
    fn new(fd: RawFd) -> Self {
        Self {
            fd,
            connect: None,
            connect_polled: false,
            mshot: false,
            starved: false,
            pausing: false,
            zc: false,
            chunk: Chunks::WHOLE,
            zc_notifs: 0,
            zc_result: None,
            cancels: 0,
            closed: false,
        }
    }
}

struct Listener {
    fd: RawFd,
    /// Multishot accept is used until the kernel refuses it once with `EINVAL`.
    multishot: bool,
    /// An accept SQE is queued or in flight.
    armed: bool,
    /// Not re-armed until the backend's accept pause is over.
    paused: bool,
}

/// `IORING_NOTIF_USAGE_ZC_COPIED` in a notification's result.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

const KIND_ACCEPT: u8 = 1;
const KIND_CONNECT: u8 = 2;
const KIND_SEND: u8 = 3;
const KIND_RECV: u8 = 4;
const KIND_CANCEL: u8 = 5;
/// Cancellation of a listener's accept (only in `Drop`); its CQE is ignored.
const KIND_CANCEL_ACCEPT: u8 = 6;
/// Multishot receive on the provided buffers.
const KIND_RECV_MULTI: u8 = 7;

/// Buffer group id of the provided-buffer ring.
const BGID: u16 = 0;

const SQ_ENTRIES: u32 = 256;

/// How long `Drop` waits for cancelled operations before leaking their buffers.
const DROP_DRAIN: Duration = Duration::from_secs(1);

fn errno(res: i32) -> io::Error {
    io::Error::from_raw_os_error(-res)
}
/// Creates a ring with the fastest set-up flags the kernel accepts, starting the search
/// at `first` (tests start lower to exercise the fallbacks).
fn build_ring(first: RingMode) -> io::Result<(IoUring, RingMode)> {
    let attempts = [
        RingMode::DeferTaskrun,
        RingMode::CoopTaskrun,
        RingMode::Plain,
    ];
    let mut last = io::Error::from_raw_os_error(libc::EINVAL);
    for mode in attempts.into_iter().skip_while(|m| *m != first) {
        let mut b = IoUring::builder();
        b.setup_cqsize(SQ_ENTRIES * 2);
        match mode {
            RingMode::DeferTaskrun => {
                b.setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_taskrun_flag();
            }
            RingMode::CoopTaskrun => {
                b.setup_coop_taskrun().setup_taskrun_flag();
            }
            RingMode::Plain => {}
        }
        match b.build(SQ_ENTRIES) {
            Ok(ring) => return Ok((ring, mode)),
            // An older kernel rejects flags it does not know with EINVAL: try fewer.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = e,
            // EPERM (io_uring disabled by sysctl or seccomp), ENOSYS, ENOMEM (memlock):
            // the caller falls back to epoll.
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// Checks that the ring supports every opcode this backend uses.
fn check_opcodes(ring: &IoUring) -> io::Result<()> {
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    let needed = [
        (opcode::SendMsg::CODE, "SendMsg"),
        (opcode::Recv::CODE, "Recv"),
        (opcode::Connect::CODE, "Connect"),
        (opcode::Accept::CODE, "Accept"),
        (opcode::AsyncCancel::CODE, "AsyncCancel"),
        (opcode::Close::CODE, "Close"),
    ];
    for (code, name) in needed {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring opcode {name} is not supported by this kernel"),
            ));
        }
    }
    if !ring.params().is_feature_ext_arg() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "io_uring lacks IORING_FEAT_EXT_ARG (kernel 5.11+) needed for timed waits",
        ));
    }
    Ok(())
}

/// Whether the kernel supports `code` (false when it cannot even say).
fn supports(ring: &IoUring, code: u8) -> bool {
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe).is_ok() && probe.is_supported(code)
}

impl Uring {
    /// Creates the backend: ring set-up with the best flags the kernel accepts, then a
    /// probe of the opcodes used. The error (EPERM, ENOSYS, ENOMEM, Unsupported) tells
    /// the caller to fall back to epoll.
    ///
    /// With [`SockOpts::threads`], the ring has no task-run flags
    /// ([`RingMode::Plain`]): any thread may submit to it and wait on it.
    pub(crate) fn new(opts: SockOpts) -> io::Result<Self> {
        let first = match opts.threads {
            true => RingMode::Plain,
            false => RingMode::DeferTaskrun,
        };
        Self::with_mode(opts, first)
    }

    /// Like [`Uring::new`], trying set-up flags from `first` downwards.
    fn with_mode(opts: SockOpts, first: RingMode) -> io::Result<Self> {
        let (ring, mode) = build_ring(first)?;
        check_opcodes(&ring)?;
        let zc_supported = supports(&ring, opcode::SendMsgZc::CODE);
        let send_op = supports(&ring, opcode::Send::CODE);
        if opts.zerocopy_min.is_some() && !zc_supported {
            tracing::warn!("zero-copy sends requested but SENDMSG_ZC is unsupported here");
        }
        tracing::debug!(?mode, "io_uring ring ready");
        Ok(Self {
            ring,
            mode,
            opts,
            slots: Slots::new(),
            listeners: Vec::new(),
            backlog: VecDeque::new(),
            cqes: Vec::with_capacity(SQ_ENTRIES as usize * 2),
            shutting_down: false,
            enters: 0,
            resumes: 0,
            resubmits: 0,
            send_sqes: 0,
            send_direct: SendShared::default(),
            zc_sends: 0,
            zc_copied: 0,
            zc_supported,
            send_op,
            pool: None,
            starved: Vec::new(),
            starvations: 0,
            accept_pause: AcceptBackoff::new(),
            wake: None,
        })
    }

    /// The set-up flags the kernel accepted.
    #[cfg(test)]
    pub(crate) fn mode(&self) -> RingMode {
        self.mode
    }

    /// How many times the backend entered the kernel through `io_uring_enter`.
    #[cfg(test)]
    pub(crate) fn enters(&self) -> u64 {
        self.enters
    }

    /// How many sends were resumed after a short write or the iovec cap.
    #[cfg(test)]
    pub(crate) fn resumes(&self) -> u64 {
        self.resumes
    }

    /// Queues an SQE: straight into the SQ when it has room and nothing older waits,
    /// else at the end of the backlog.
    ///
    /// # Safety
    /// Every pointer in `entry` must stay valid until its CQE is reaped; the callers
    /// guarantee it by keeping the memory in the slot (see each call site).
    unsafe fn push(&mut self, entry: squeue::Entry) {
        if self.backlog.is_empty() {
            let mut sq = self.ring.submission();
            // SAFETY: forwarded from this function's contract.
            if unsafe { sq.push(&entry) }.is_ok() {
                return;
            }
        }
        self.backlog.push_back(entry);
    }

    /// Moves backlog SQEs into the SQ while it has room.
    fn flush_backlog(&mut self) {
        if self.backlog.is_empty() {
            return;
        }
        let mut sq = self.ring.submission();
        while let Some(e) = self.backlog.front() {
            // SAFETY: backlog entries were queued by `push`, whose callers keep their
            // memory in a slot until the CQE (the op counts as in flight from queuing).
            if unsafe { sq.push(e) }.is_err() {
                break;
            }
            self.backlog.pop_front();
        }
    }

    /// Queues the `SendMsg` (or `Send`, `SendMsgZc`) for the unsent part of the slot's
    /// batch.
    fn submit_send(&mut self, idx: usize) {
        let Some(s) = self.slots.get_mut(idx) else {
            return;
        };
        let Some(left) = s.send.batch().map(TxBatch::remaining) else {
            return;
        };
        let how = SendFlavor {
            zerocopy: s.io.zc && self.opts.zerocopy_min.is_some_and(|m| left >= m),
            send_op: self.send_op,
        };
        let chunk = s.io.chunk;
        let entry = s
            .send
            .sqe(s.io.fd, chunk, how)
            .user_data(token(KIND_SEND, idx, s.gen));
        self.send_sqes += 1;
        // SAFETY: the entry points into the slot's boxed send op (its `msghdr` and iovec
        // array, not modified again until this SQE's CQE: only `submit_send` rebuilds
        // them, and only while no send of the slot is in flight) and into its batch's
        // arena and `Bytes` parts, heap memory that stays in the slot unmodified until the
        // CQE. The slot is freed only after all its CQEs arrived (or leaked in Drop).
        unsafe { self.push(entry) };
    }

    /// Whether sends to `peer` may use `SENDMSG_ZC`: configured, supported by this
    /// kernel, and not a loopback peer (where the kernel copies the pages anyway).
    fn zerocopy_for(&self, peer: &SocketAddr) -> bool {
        self.zc_supported
            && self.opts.zerocopy_min.is_some()
            && (self.opts.zerocopy_loopback || !peer.ip().is_loopback())
    }

    /// Tries every parked receive with a direct non-blocking `recv`; completes those
    /// that are done (data, a full buffer that wants all, end of stream, an error) and
    /// keeps the rest parked.
    fn try_parked(&mut self, out: &mut Vec<Event>) {
        let mut k = 0;
        while let Some(&idx) = self.slots.direct().get(k) {
            let s = &mut self.slots[idx];
            let tried = s.recv.try_now(s.io.fd, false);
            let Attempt::Done(result) = tried.attempt else {
                k += 1;
                continue;
            };
            let rx = s.recv.take();
            // Moves the last member to position `k`, which is tried next.
            self.slots.leave_direct(idx);
            if let Some(rx) = rx {
                out.push(Event::Recv {
                    conn: ConnId(idx as u32),
                    rx,
                    result,
                });
            }
        }
    }

    /// Hands every parked receive to the kernel as a `Recv` SQE.
    fn arm_parked(&mut self) {
        while let Some(&idx) = self.slots.direct().last() {
            self.slots.leave_direct(idx);
            self.arm_recv(idx);
        }
    }

    /// Queues a `Recv` SQE for the rest of the slot's receive; the slot owns the buffer
    /// until the CQE.
    fn arm_recv(&mut self, idx: usize) {
        // Invariant: callers pass an existing, non-closing slot with a receive.
        let Some(s) = self.slots.get_mut(idx) else {
            return;
        };
        let Some(entry) = s.recv.sqe(s.io.fd) else {
            return;
        };
        let entry = entry.user_data(token(KIND_RECV, idx, s.gen));
        // SAFETY: the entry points into the spare region of the RxBuf's heap buffer. The
        // RxBuf is owned by the slot's receive op and not touched until this Recv's CQE
        // is reaped; moving the op or the slot does not move the heap data. The slot is
        // freed only after the CQE (or leaked by Drop).
        unsafe { self.push(entry) };
    }

    /// Submits again an operation of slot `idx` that the kernel ended with `ECANCELED`
    /// though this backend cancelled nothing: its submitting thread exited before it
    /// completed, and its task work had no task left to run in. With a ring any thread
    /// may drive (`SockOpts::threads`: MPI_THREAD_MULTIPLE, a progress thread), a thread
    /// of the program may submit and then end. Such an operation moved nothing (a partial
    /// transfer is reported as its count), so the receive, the send (from where it
    /// stood) and the multishot receive are queued again. A connect, which the socket
    /// carries on by itself, is watched with a `PollAdd` for writability instead, then
    /// read from `SO_ERROR`.
    fn submit_again(&mut self, kind: u8, idx: usize) {
        self.resubmits += 1;
        tracing::debug!(
            idx,
            kind,
            "operation ended with its submitting thread: again"
        );
        let Some(s) = self.slots.get_mut(idx) else {
            return;
        };
        match kind {
            KIND_RECV => self.arm_recv(idx),
            KIND_SEND => {
                s.send.take_polling();
                self.submit_send(idx);
            }
            KIND_CONNECT => {
                s.io.connect_polled = true;
                let e = opcode::PollAdd::new(types::Fd(s.io.fd), libc::POLLOUT as u32)
                    .build()
                    .user_data(token(KIND_CONNECT, idx, s.gen));
                // SAFETY: PollAdd carries no user memory. The fd stays open until the
                // slot's last CQE: `io.connect` is still set, so this poll counts in
                // `in_flight` and a close cancels it under the connect's token.
                unsafe { self.push(e) };
            }
            KIND_RECV_MULTI => {
                s.io.mshot = false;
                self.arm_recv_multi(idx);
            }
            _ => {}
        }
    }

    /// Starts `AsyncCancel` for every op of the slot that is in flight.
    fn cancel_ops(&mut self, idx: usize) {
        let Some(s) = self.slots.get_mut(idx) else {
            return;
        };
        let gen = s.gen;
        let mut targets = [0u64; 4];
        let mut n = 0;
        for (busy, kind) in [
            (s.io.connect.is_some(), KIND_CONNECT),
            (s.send.busy(), KIND_SEND),
            (recv_in_flight(s), KIND_RECV),
            (s.io.mshot, KIND_RECV_MULTI),
        ] {
            if busy {
                targets[n] = token(kind, idx, gen);
                n += 1;
            }
        }
        s.io.cancels += n as u32;
        for &t in &targets[..n] {
            self.push_cancel(t, token(KIND_CANCEL, idx, gen));
        }
    }

    /// Queues an `AsyncCancel` of the operation with user_data `target`; its own CQE
    /// carries `ud`.
    fn push_cancel(&mut self, target: u64, ud: u64) {
        let e = opcode::AsyncCancel::new(target).build().user_data(ud);
        // SAFETY: AsyncCancel carries only a user_data value, no pointer.
        unsafe { self.push(e) };
    }

    /// Closes a closing slot's fd once nothing of it is in flight, emits `Closed` and
    /// releases the slot (the caller hears of it in the same `poll`).
    fn maybe_finish_close(&mut self, idx: usize, out: &mut Vec<Event>) {
        let Some(s) = self.slots.get_mut(idx) else {
            return;
        };
        if !s.closing || s.io.closed {
            return;
        }
        let left = in_flight(s);
        if left > 0 {
            if left == s.io.zc_notifs as usize && s.io.fd >= 0 {
                // Only zero-copy notifications are left: they come when the socket lets
                // go of the pages, which closing it makes it do (unsent data is dropped).
                // The batch stays in the slot until then.
                sys::close_fd(s.io.fd);
                s.io.fd = -1;
                self.accept_pause.descriptor_freed();
            }
            return;
        }
        sys::close_fd(s.io.fd);
        self.accept_pause.descriptor_freed();
        self.slots.release(idx, out);
    }

    /// Enters the kernel: submits `to_submit` SQEs and, with `wait`, waits up to that
    /// long for one completion. Retryable errors (EINTR, EBUSY, EAGAIN, ETIME) are Ok.
    fn enter(&mut self, wait: Option<Duration>) -> io::Result<()> {
        self.enters += 1;
        let res = match wait {
            None => {
                let to_submit = self.ring.submission().len() as u32;
                // SAFETY: no extended argument is passed (`None`), so the kernel reads no
                // user memory besides the SQ ring, whose entries' memory is owned by slots.
                unsafe {
                    self.ring.submitter().enter::<libc::sigset_t>(
                        to_submit,
                        0,
                        EnterFlags::GETEVENTS.bits(),
                        None,
                    )
                }
            }
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match res {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR | libc::EBUSY | libc::EAGAIN | libc::ETIME) => Ok(()),
                _ => Err(e),
            },
        }
    }

    /// One non-blocking pass: deliver deferred events, submit, run task work if the
    /// kernel asks, reap the CQ, try the parked receives.
    fn pass(&mut self, out: &mut Vec<Event>) -> io::Result<()> {
        self.slots.deliver(out);
        self.rearm_starved();
        if self.accept_pause.until().is_some() {
            self.rearm_accepts();
        }
        self.flush_backlog();
        let sq = self.ring.submission();
        // All read in user space, no syscall: SQEs waiting to be submitted; the TASKRUN
        // flag, set by the kernel when completions wait as deferred task work for an
        // enter with GETEVENTS; CQ_OVERFLOW, set when CQEs wait in its overflow list.
        let must_enter = !sq.is_empty() || sq.taskrun() || sq.cq_overflow();
        drop(sq);
        if must_enter {
            self.enter(None)?;
        }
        self.reap(out);
        // After the submit, so that a send queued by the last pass leaves first.
        self.try_parked(out);
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<Event>) {
        let mut buf = mem::take(&mut self.cqes);
        buf.clear();
        buf.extend(
            self.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(ud, res, flags) in &buf {
            self.complete(ud, res, flags, out);
        }
        self.cqes = buf;
        // Completions may have queued SQEs (resumed sends, re-armed accepts): let them
        // into the SQ now, they go out with the next enter.
        self.flush_backlog();
    }

    fn complete(&mut self, ud: u64, res: i32, flags: u32, out: &mut Vec<Event>) {
        let (kind, idx, gen) = untoken(ud);
        match kind {
            KIND_ACCEPT => return self.complete_accept(idx, res, flags, out),
            KIND_CANCEL_ACCEPT => return,
            _ => {}
        }
        let Some(s) = self.slots.tagged(idx, gen) else {
            // A slot is freed only after its multishot receive's final CQE, so no
            // buffer is expected here; if one comes, it goes back to the ring.
            if let (Some(pool), Some(bid)) = (self.pool.as_ref(), cqueue::buffer_select(flags)) {
                pool.give_back(bid);
            }
            tracing::debug!(ud, res, "completion for a free or reused slot ignored");
            return;
        };
        if res == -libc::ECANCELED
            && !s.closing
            && !self.shutting_down
            && !cqueue::more(flags)
            && !cqueue::notif(flags)
        {
            let again = match kind {
                KIND_RECV => recv_in_flight(s),
                KIND_SEND => s.send.busy() && s.io.zc_result.is_none(),
                KIND_CONNECT => s.io.connect.is_some(),
                KIND_RECV_MULTI => s.io.mshot && !s.io.pausing,
                _ => false,
            };
            if again {
                return self.submit_again(kind, idx);
            }
        }
        let conn = ConnId(idx as u32);
        match kind {
            KIND_RECV_MULTI => return self.complete_recv_multi(idx, res, flags, out),
            KIND_CONNECT => {
                s.io.connect = None;
                let polled = mem::take(&mut s.io.connect_polled);
                let result = if res < 0 {
                    Err(errno(res))
                } else if polled {
                    sys::socket_error(s.io.fd)
                } else {
                    Ok(())
                };
                out.push(Event::Connected { conn, result });
            }
            KIND_RECV => {
                // Invariant: a Recv CQE with this slot's generation means the receive op
                // holds the buffer it was queued with; a missing one is a bookkeeping bug.
                let Some((rx, result)) = s.recv.complete(res) else {
                    debug_assert!(false, "Recv completion without a buffer");
                    return;
                };
                out.push(Event::Recv { conn, rx, result });
            }
            KIND_SEND if cqueue::notif(flags) => {
                // A zero-copy notification: the kernel no longer reads the buffers.
                s.io.zc_notifs = s.io.zc_notifs.saturating_sub(1);
                self.zc_sends += 1;
                if res as u32 & NOTIF_USAGE_ZC_COPIED != 0 {
                    self.zc_copied += 1;
                }
                if s.io.zc_notifs == 0 {
                    if let Some(result) = s.io.zc_result.take() {
                        // Invariant: `zc_result` is set only while the batch is held.
                        if let Some(batch) = s.send.take() {
                            out.push(Event::Sent {
                                conn,
                                batch,
                                result,
                            });
                        }
                    }
                }
            }
            KIND_SEND => {
                if cqueue::more(flags) {
                    // SENDMSG_ZC: a notification follows this result.
                    s.io.zc_notifs += 1;
                }
                if !s.send.busy() {
                    debug_assert!(false, "SendMsg completion without a batch");
                    return;
                }
                let polled = s.send.take_polling();
                let result = if res < 0 {
                    Err(errno(res))
                } else if polled && !s.closing && !self.shutting_down {
                    // The socket has room for what goes through the pipe.
                    match s.send.try_now(s.io.fd, s.io.chunk, &mut self.send_direct) {
                        Attempt::Done(result) => result,
                        Attempt::Blocked => {
                            self.submit_send(idx);
                            return;
                        }
                    }
                } else if polled {
                    cancelled()
                } else if s.send.advance(res as usize) {
                    Ok(())
                } else if s.closing || self.shutting_down {
                    cancelled()
                } else if res == 0 {
                    Err(io::Error::from(io::ErrorKind::WriteZero))
                } else {
                    // Short write, or the batch was offered in pieces (more than
                    // MAX_IOV parts, or more bytes than `send_chunk`): resume after
                    // what the kernel took, keeping the batch in the slot.
                    self.resumes += 1;
                    self.submit_send(idx);
                    return;
                };
                if s.io.zc_notifs > 0 {
                    // The kernel may still read the pages: hold the batch until the
                    // notifications are in.
                    s.io.zc_result = Some(result);
                } else if let Some(batch) = s.send.take() {
                    out.push(Event::Sent {
                        conn,
                        batch,
                        result,
                    });
                }
            }
            KIND_CANCEL => {
                s.io.cancels = s.io.cancels.saturating_sub(1);
            }
            _ => {
                tracing::debug!(ud, res, "completion of unknown kind ignored");
                return;
            }
        }
        self.maybe_finish_close(idx, out);
    }

    /// Cancels every operation, waits (at most [`DROP_DRAIN`]) for their completions,
    /// closes every fd and forgets every slot. Buffers of operations that did not
    /// complete in time are leaked, never freed, since the kernel may still write them.
    /// Returns how many operations were left in flight. Called by `Drop`; idempotent.
    fn shutdown(&mut self) -> usize {
        self.shutting_down = true;
        for i in 0..self.listeners.len() {
            if self.listeners[i].armed {
                self.push_cancel(token(KIND_ACCEPT, i, 0), token(KIND_CANCEL_ACCEPT, i, 0));
            }
        }
        for i in self.slots.ids() {
            if self.slots[i].recv.direct_at.is_some() {
                // A parked receive was never seen by the kernel: its buffer goes now.
                self.slots.leave_direct(i);
                drop(self.slots[i].recv.take());
            }
            if let Some(s) = self.slots.get_mut(i) {
                if !s.closing {
                    s.closing = true;
                    self.cancel_ops(i);
                }
            }
        }
        let deadline = Instant::now() + DROP_DRAIN;
        let mut sink = Vec::new();
        while self.total_in_flight() > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.flush_backlog();
            let waited = self
                .enter(Some((deadline - now).min(Duration::from_millis(50))))
                .and_then(|()| self.pass(&mut sink));
            if let Err(e) = waited {
                tracing::warn!(error = %e, "io_uring drain failed");
                break;
            }
            sink.clear();
        }
        let leaked = self.total_in_flight();
        if let Some(pool) = self.pool.take() {
            if leaked == 0 {
                // No receive may select a buffer any more.
                if let Err(e) = self.ring.submitter().unregister_buf_ring(BGID) {
                    tracing::debug!(error = %e, "unregistering the buffer ring failed");
                }
            } else {
                // A receive may still write into the buffers: never unmap them.
                mem::forget(Rc::clone(&pool));
            }
            // Buffers still lent to the caller keep the memory mapped until returned.
            drop(pool);
        }
        self.starved.clear();
        for s in self.slots.drain() {
            let (fd, closed) = (s.io.fd, s.io.closed);
            if in_flight(&s) > 0 {
                // The kernel may still read or write this slot's memory (its ops'
                // buffers, iovecs, sockaddr): never free it.
                mem::forget(s);
            }
            if !closed {
                sys::close_fd(fd);
            }
        }
        for l in self.listeners.drain(..) {
            sys::close_fd(l.fd);
        }
        self.backlog.clear();
        if leaked > 0 {
            tracing::warn!(
                leaked,
                "io_uring ops still in flight at drop; buffers leaked"
            );
        }
        leaked
    }

    fn total_in_flight(&self) -> usize {
        let conns: usize = self.slots.iter().map(in_flight).sum();
        conns + self.listeners.iter().filter(|l| l.armed).count()
    }
}

/// Operations of the slot the kernel may still complete.
fn in_flight(s: &Slot<Io>) -> usize {
    s.io.zc_notifs as usize
        + usize::from(s.io.mshot)
        + usize::from(s.io.connect.is_some())
        // A batch whose send finished but whose zero-copy notifications are outstanding
        // is counted by `zc_notifs`.
        + usize::from(s.send.busy() && s.io.zc_result.is_none())
        + usize::from(recv_in_flight(s))
        + s.io.cancels as usize
}

/// Whether the slot's receive is in the kernel's hands (held, and not parked).
fn recv_in_flight(s: &Slot<Io>) -> bool {
    s.recv.busy() && s.recv.direct_at.is_none()
}

impl Backend for Uring {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn describe(&self) -> String {
        let flags = match self.mode {
            RingMode::DeferTaskrun => "SINGLE_ISSUER|DEFER_TASKRUN|TASKRUN_FLAG",
            RingMode::CoopTaskrun => "COOP_TASKRUN|TASKRUN_FLAG",
            RingMode::Plain => "no task-run flags",
        };
        match self.pool.as_ref().map(|p| p.geometry()) {
            Some(g) => format!(
                "io_uring ring {flags}; multishot receive on {} provided buffers of {} B",
                g.count, g.size
            ),
            None => format!("io_uring ring {flags}"),
        }
    }

    fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let (fd, local) = sys::listener(addr)?;
        self.listeners.push(Listener {
            fd,
            multishot: true,
            armed: false,
            paused: false,
        });
        self.arm_accept(self.listeners.len() - 1);
        Ok(local)
    }

    fn connect(&mut self, addr: SocketAddr, bind: Option<SocketAddr>) -> io::Result<ConnId> {
        let fd = sys::stream_socket(&addr, bind, &self.opts)?;
        let zc = self.zerocopy_for(&addr);
        let sa = Box::new(SockAddr::from(addr));
        let (ptr, len) = (sa.as_ptr().cast::<libc::sockaddr>(), sa.len());
        let idx = self.slots.insert(
            Io {
                zc,
                chunk: self.opts.send_chunks_for(&addr),
                connect: Some(sa),
                ..Io::new(fd)
            },
            self.opts.rcvlowat_for(&addr),
        );
        let entry = opcode::Connect::new(types::Fd(fd), ptr, len)
            .build()
            .user_data(self.slots.token(KIND_CONNECT, idx));
        // SAFETY: `ptr` points into the boxed `SockAddr` now held in the slot's
        // `io.connect`, which is only dropped when this connect's CQE is reaped (or leaked
        // by Drop); moving the box into the slot did not move the address it holds.
        unsafe { self.push(entry) };
        Ok(ConnId(idx as u32))
    }

    #[inline]
    fn send(&mut self, conn: ConnId, batch: TxBatch) {
        let Some((idx, batch)) = self.slots.admit_send(conn, batch) else {
            return;
        };
        let s = &mut self.slots[idx];
        s.send.start(batch);
        // A connected socket with no send of its own in flight (the slot was just admitted)
        // is written at once with a non-blocking `sendmsg`, as the epoll backend does: on
        // the latency path the socket takes it all, with no SQE, no CQE, and the bytes on
        // their way before this returns (not at the next enter). What the socket does not
        // take goes to the ring as a `SendMsg` for the rest (MSG_WAITALL), so ordering
        // holds: at most one send per socket is ever in progress. Zero-copy sends always
        // go through the ring (their completion is the kernel's notification).
        let zerocopy = s.io.zc
            && self
                .opts
                .zerocopy_min
                .is_some_and(|m| s.send.batch().is_some_and(|b| b.remaining() >= m));
        if s.io.connect.is_some() || zerocopy || s.io.fd < 0 {
            self.submit_send(idx);
            return;
        }
        let chunk = s.io.chunk;
        match s.send.try_now(s.io.fd, chunk, &mut self.send_direct) {
            Attempt::Done(result) => {
                // Invariant: the batch was started above.
                if let Some(batch) = s.send.take() {
                    self.slots.defer(Event::Sent {
                        conn,
                        batch,
                        result,
                    });
                }
            }
            Attempt::Blocked => self.submit_send(idx),
        }
    }

    #[inline]
    fn write_now(&mut self, conn: ConnId, pieces: &[&[u8]]) -> usize {
        match self.slots.get_mut(conn.0 as usize) {
            Some(s)
                if s.send.idle()
                    && !s.closing
                    && !self.shutting_down
                    && s.io.connect.is_none()
                    && s.io.fd >= 0 =>
            {
                let chunks = s.send.chunks(s.io.fd, s.io.chunk);
                super::op::write_now(s.io.fd, pieces, chunks, &mut self.send_direct)
            }
            _ => 0,
        }
    }

    #[inline]
    fn recv(&mut self, conn: ConnId, rx: RxBuf) {
        let Some((idx, rx)) = self.slots.admit_recv(conn, rx) else {
            return;
        };
        self.slots[idx].recv.start(rx);
        if self.slots.direct_has_room() {
            // Parked: tried directly while the caller spins, armed before a wait.
            self.slots.join_direct(idx);
        } else {
            self.arm_recv(idx);
        }
    }

    fn reset(&mut self, conn: ConnId) {
        if let Some(io) = self.slots.open_io(conn).filter(|io| io.fd >= 0) {
            sys::linger_zero(io.fd);
        }
        self.close(conn);
    }

    fn close(&mut self, conn: ConnId) {
        let Some((idx, s)) = self.slots.start_close(conn) else {
            return;
        };
        // A starved receive is not in flight: nothing to cancel.
        s.io.starved = false;
        if s.recv.direct_at.is_some() {
            // A parked receive was never seen by the kernel: it ends now.
            let rx = s.recv.take();
            self.slots.leave_direct(idx);
            if let Some(rx) = rx {
                self.slots.defer(Event::Recv {
                    conn,
                    rx,
                    result: cancelled(),
                });
            }
        }
        // Invariant: the slot exists (looked up above and nothing removed it since).
        let s = &mut self.slots[idx];
        if in_flight(s) == 0 {
            sys::close_fd(s.io.fd);
            s.io.fd = -1;
            s.io.closed = true;
            self.slots.defer_closed(idx);
            self.accept_pause.descriptor_freed();
        } else {
            self.cancel_ops(idx);
        }
    }

    fn poll(&mut self, timeout: Option<Duration>, out: &mut Vec<Event>) -> io::Result<()> {
        let start_len = out.len();
        self.pass(out)?;
        let Some(t) = timeout else {
            return Ok(());
        };
        if out.len() > start_len || t.is_zero() {
            return Ok(());
        }
        let deadline = Instant::now() + t;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            // About to sleep: the parked receives must be watched by the kernel now.
            self.arm_parked();
            self.flush_backlog();
            // Not past a pause of accepting, so that accepting resumes on time.
            let wake = self
                .accept_pause
                .until()
                .map_or(deadline, |p| p.min(deadline));
            self.enter(Some(wake.saturating_duration_since(now)))?;
            self.pass(out)?;
            if out.len() > start_len {
                return Ok(());
            }
        }
    }

    fn submit(&mut self) -> io::Result<()> {
        self.flush_backlog();
        if self.ring.submission().is_empty() {
            return Ok(());
        }
        self.enters += 1;
        // An enter without GETEVENTS: the kernel issues each new SQE (a send to a writable
        // socket is written during this call) and runs no deferred completion work, so
        // nothing is reaped and no completion is missed: they wait for the next `poll`.
        match self.ring.submit() {
            Ok(_) => Ok(()),
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR | libc::EBUSY | libc::EAGAIN) => Ok(()),
                _ => Err(e),
            },
        }
    }

    fn collect(&mut self, out: &mut Vec<Event>) -> io::Result<()> {
        self.slots.deliver(out);
        let sq = self.ring.submission();
        // Completions may wait as deferred task work (TASKRUN) or in the overflow list:
        // only then is the kernel entered (which also submits what the SQ holds).
        let must_enter = sq.taskrun() || sq.cq_overflow();
        drop(sq);
        if must_enter {
            self.enter(None)?;
        }
        self.reap(out);
        Ok(())
    }

    fn end_cause(&self, conn: ConnId) -> Option<io::Error> {
        let s = self.slots.get(conn.0 as usize)?;
        if s.io.closed {
            return None;
        }
        sys::timeout_abort(s.io.fd)
    }

    fn open_fd(&self, conn: ConnId) -> Option<RawFd> {
        let s = self.slots.get(conn.0 as usize)?;
        (!s.closing && !s.io.closed && s.io.fd >= 0).then_some(s.io.fd)
    }

    fn prepare_wait(&mut self) -> io::Result<Option<RawFd>> {
        let wake = match &self.wake {
            Some(fd) => fd,
            None => {
                let fd = sys::eventfd()?;
                self.ring.submitter().register_eventfd(fd.as_raw_fd())?;
                self.wake.insert(fd)
            }
        };
        // Reset first: work queued from here on signals it again.
        sys::drain_eventfd(wake.as_fd());
        let wake = wake.as_raw_fd();
        // As before a sleep in `poll`: the parked receives are handed to the kernel.
        self.arm_parked();
        self.submit()?;
        let ready = !self.ring.completion().is_empty()
            || self.ring.submission().taskrun()
            || self.slots.has_deferred();
        Ok((!ready).then_some(wake))
    }

    fn counters(&self) -> Counters {
        Counters {
            send_calls: self.send_sqes + self.send_direct.calls,
            spliced_bytes: self.send_direct.spliced,
            lend_pipes: self.send_direct.pipes_made,
            lend_pipes_open: self.send_direct.pipes_open(),
            zerocopy_sends: self.zc_sends,
            zerocopy_copied: self.zc_copied,
            recv_starved: self.starvations,
            lend: self.send_direct.judge.costs(),
        }
    }

    #[inline]
    fn lend_wanted(&self) -> bool {
        self.send_direct.judge.wanted()
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests;
