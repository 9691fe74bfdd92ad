//! The operations a connection runs, each described once for both backends (the idea of
//! monoio's `OpAble`): the memory the kernel reads or writes, how the io_uring backend
//! turns it into an SQE (`sqe`), how the epoll backend performs it with a non-blocking
//! call (`try_now`), and what a result means. A backend supplies only submission (push
//! the SQE, or call `try_now` when the socket is ready) and completion (reap the CQE).
//!
//! Ownership: an op owns its buffer from the moment it starts until it completes, and a
//! connection's slot owns its ops. [`SendOp`] is boxed once per connection, so its iovec
//! array and `msghdr` keep their address while the slot table grows; the bytes they point
//! at belong to the [`TxBatch`] inside it, which is not touched until the send completes.
//!
//! Also here: the answer to misuse ([`Misuse`], one errno per case for every backend).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "uring")]
use io_uring::{opcode, squeue, types};

use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};

use super::lend::LendJudge;
use super::{sys, RxBuf, TxBatch};
use crate::buf::DIRECT_PIECES;

/// The most bytes one send call of a connection hands to the kernel (`usize::MAX`: no
/// limit), for copied bytes and for lent pages (`splice`), as the socket options chose
/// them for its peer (`SockOpts::send_chunks_for`). Each is rounded down to whole
/// segments of the connection when used ([`whole_segments`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunks {
    /// Bytes copied by one `sendmsg` / `send`.
    pub(crate) copy: usize,
    /// Lent bytes moved by one `splice`.
    pub(crate) splice: usize,
    /// Most bytes of whole `copy` calls that may follow a run's remainder, which then
    /// goes first (see [`next_call`]); 0: the remainder goes last.
    pub(crate) lead: usize,
}

impl Chunks {
    /// No limit: whole batches, whole pipe-fulls.
    pub(crate) const WHOLE: Self = Self {
        copy: usize::MAX,
        splice: usize::MAX,
        lead: 0,
    };
}

/// The most bytes one call hands to the kernel on a connection of segments of `mss`
/// bytes: `chunk` (`usize::MAX`: no limit) rounded down to whole segments, at least one.
///
/// A call that ends inside a segment leaves that segment short, and the kernel sends it
/// short: the ACKs that arrive meanwhile push it out (`MSG_MORE` only holds it at the end
/// of the call itself). Calls of whole segments keep such short segments out of the
/// stream, and stream large messages markedly faster under BBR (see
/// docs/design/large-messages.md).
fn whole_segments(mss: usize, chunk: usize) -> usize {
    if chunk == usize::MAX {
        return chunk;
    }
    let mss = mss.max(1);
    (chunk / mss).max(1) * mss
}

/// The bytes the next call takes of a run of `run` unwritten bytes sent in calls of at
/// most `chunks.copy` bytes (`usize::MAX`: no limit): the whole run when it fits; else,
/// when the whole calls after the run's remainder (`run % copy`, not zero) hold at most
/// `chunks.lead` bytes, that remainder first; else a whole call (the remainder last).
///
/// Where the congestion control paces (BBR), each buffer the kernel sends delays the next
/// one by its pacing time, so the bytes after a full call wait for it: a 64 KiB message
/// written as 65,160 + 384 bytes (45 segments of 1,448, then a short one) keeps its last
/// 384 bytes back for the pacing time of the 65,160 before them, where 384 + 65,160 leave
/// at once, the pacing time then falling after the message. Longer runs keep their
/// remainder last (with it first they took longer);
/// `SockOpts::send_chunks_for` says where, and how far, the remainder goes first (see
/// docs/design/pacing.md).
#[inline]
fn next_call(run: usize, chunks: Chunks) -> usize {
    let chunk = chunks.copy;
    if run <= chunk {
        return run;
    }
    match run % chunk {
        0 => chunk,
        rest if run - rest > chunks.lead => chunk,
        rest => rest,
    }
}

/// At most this many iovecs per `sendmsg` (Linux `UIO_MAXIOV` / `IOV_MAX`); the rest of
/// a batch follows in the next call.
pub(crate) const MAX_IOV: usize = 1024;

/// A gathered send of one [`TxBatch`], resumed after short writes until every byte is out.
///
/// Lent segments ([`TxBatch::push_lent`]) are not copied into the socket: their pages go
/// into a pipe (one of [`SendShared`]'s, held while bytes are in it; `vmsplice`, by
/// reference) and from there into the socket (`splice`), so the kernel reads the caller's
/// pages until the peer has read them; the protocol completes such a frame only on the
/// peer's ACK. Where a pipe cannot be had or `vmsplice` refuses the memory, the segment is
/// copied like any other.
pub(crate) struct SendOp {
    /// The batch being sent; `Some` exactly while the send is in progress.
    batch: Option<TxBatch>,
    /// iovecs of the current call, pointing into `batch`.
    iov: Vec<libc::iovec>,
    /// The header of the current call, pointing at `iov`.
    msg: libc::msghdr,
    /// The pipe lent pages pass through: taken from the backend's spares (or made) for the
    /// first lent segment, given back once empty ([`try_now`](Self::try_now)).
    pipe: Option<Pipe>,
    /// Lent segments are copied instead (no pipe could be made, or `vmsplice` failed).
    no_splice: bool,
    /// Bytes of the batch in the pipe, not yet in the socket (they come first).
    piped: usize,
    /// The calls that lend the pipe-full in progress (its header's `send`, `vmsplice`,
    /// `splice`): their time so far, and the bytes of the `vmsplice`, for the
    /// [`LendJudge`] once the pipe is drained.
    lend_took: Duration,
    lend_bytes: usize,
    /// io_uring: the SQE in flight waits for the socket to be writable (`POLL_ADD`), and
    /// the op resumes with [`try_now`](Self::try_now), rather than a send of bytes.
    polling: bool,
    /// The connection's chunks cut at whole segments ([`whole_segments`]), worked out at
    /// its first send call: a backend hands the same chunks for a connection every time.
    chunks: Option<Chunks>,
}

/// What a backend's send ops share: what they count (see `Counters`), and the spare pipes
/// for lent pages.
#[derive(Debug, Default)]
pub(crate) struct SendShared {
    /// Send calls made with a non-blocking call (`sendmsg`, `send`, `splice`).
    pub(crate) calls: u64,
    /// Bytes that left through a pipe (`splice`, lent pages) rather than copied.
    pub(crate) spliced: u64,
    /// Pipes made for lent pages.
    pub(crate) pipes_made: u64,
    /// Pipes made and not yet closed (held by a send op, or spare): each pipe counts
    /// itself out when it is dropped, wherever that happens.
    open: Arc<AtomicU64>,
    /// Empty pipes, for the next lent pages of any connection.
    spare: Vec<Pipe>,
    /// The cost of the large send calls, lent and copied: whether lending pays here.
    pub(crate) judge: LendJudge,
}

/// Empty pipes kept for reuse; more are closed as they empty.
const SPARE_PIPES: usize = 2;

impl SendShared {
    /// An empty pipe: a spare one, else a new one.
    fn pipe(&mut self) -> io::Result<Pipe> {
        if let Some(p) = self.spare.pop() {
            return Ok(p);
        }
        let p = Pipe::new(&self.open)?;
        self.pipes_made += 1;
        Ok(p)
    }

    /// Pipes open now: held by send ops while their bytes are in them, or spare.
    pub(crate) fn pipes_open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Takes back a pipe its send op emptied, unless enough are spare or the pipe, asked,
    /// does not say it is empty: its next bytes may belong to any connection.
    fn give_back(&mut self, p: Pipe) {
        if self.spare.len() < SPARE_PIPES && p.is_empty() {
            self.spare.push(p);
        }
    }
}

/// A pipe for lending pages to a socket. A connection holds one only while bytes of its
/// sends are in it ([`SendOp`]); empty, it goes back to the backend's spares
/// ([`SendShared`]), so that a process with many peers holds a few pipes, not two
/// descriptors per connection.
#[derive(Debug)]
struct Pipe {
    rd: OwnedFd,
    wr: OwnedFd,
    /// Bytes one `vmsplice` may move into it (its size).
    cap: usize,
    /// [`SendShared`]'s count of open pipes, which this one is part of until dropped.
    open: Arc<AtomicU64>,
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A lent segment's last bytes, when no more than this is left after a pipe-full, are
/// copied by a `send` rather than lent by another `vmsplice` and `splice` pair. A pipe
/// holds whole pages: a 1 MiB payload that starts 16 bytes into a page (a `malloc` block
/// above the mmap threshold) leaves 16 bytes over.
const LENT_TAIL_COPY: usize = 64 * 1024;

/// The bytes of a lent segment (`seg`, in the caller's memory) that pass through a pipe
/// of this system's size: pipe-fulls of whole pages, the rest after them copied when it
/// is at most [`LENT_TAIL_COPY`] (see [`SendOp`]). For tests' expectations.
#[cfg(test)]
pub(crate) fn piped_bytes(seg: &[u8]) -> usize {
    // SAFETY: sysconf only reads a system constant.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let cap = SendShared::default().pipe().map_or(0, |p| p.cap) / page * page;
    let first = cap.saturating_sub(seg.as_ptr() as usize % page);
    if seg.len() <= first || first == 0 {
        return seg.len().min(first);
    }
    let (mut piped, mut rest) = (first, seg.len() - first);
    while rest > LENT_TAIL_COPY {
        let n = rest.min(cap);
        piped += n;
        rest -= n;
    }
    piped
}

/// Size asked for a lending pipe (`F_SETPIPE_SZ`; 1 MiB is the default
/// `/proc/sys/fs/pipe-max-size`): the bytes one `vmsplice` and `splice` pair moves.
const PIPE_SIZE: usize = 1 << 20;

impl Pipe {
    /// A pipe (close-on-exec) of [`PIPE_SIZE`] where the system allows it, else of the
    /// size it gets. Every call on it says `SPLICE_F_NONBLOCK`, so it never blocks.
    fn new(open: &Arc<AtomicU64>) -> io::Result<Self> {
        let (rd, wr) = io::pipe()?;
        let (rd, wr) = (OwnedFd::from(rd), OwnedFd::from(wr));
        // SAFETY: fcntl on an fd we own; F_SETPIPE_SZ and F_GETPIPE_SZ take an int.
        let cap = unsafe {
            libc::fcntl(wr.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE as libc::c_int);
            libc::fcntl(wr.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        if cap <= 0 {
            return Err(io::Error::last_os_error());
        }
        open.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            rd,
            wr,
            cap: cap as usize,
            open: Arc::clone(open),
        })
    }

    /// Whether the kernel says that nothing is in the pipe (`FIONREAD`).
    fn is_empty(&self) -> bool {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD on an fd we own writes one int through the valid pointer.
        let r = unsafe { libc::ioctl(self.rd.as_raw_fd(), libc::FIONREAD, &mut n) };
        r == 0 && n == 0
    }
}

/// What one attempt at an operation came to.
#[derive(Debug)]
pub(crate) enum Attempt<T> {
    /// The operation is over, with this result.
    Done(io::Result<T>),
    /// The socket cannot take (or give) more now; the op keeps its progress and waits.
    Blocked,
}

/// What [`RecvOp::try_now`] came to.
#[derive(Debug)]
pub(crate) struct Tried {
    /// The receive's outcome, or `Blocked` while it waits for data.
    pub(crate) attempt: Attempt<usize>,
    /// The socket was found drained (`EAGAIN`, or a read shorter than asked): the next
    /// data brings a new readiness edge.
    #[cfg_attr(not(feature = "epoll"), allow(dead_code))]
    pub(crate) drained: bool,
    /// The read met end of stream (sticky: every later read returns 0 at once).
    #[cfg_attr(not(feature = "epoll"), allow(dead_code))]
    pub(crate) eof: bool,
}

/// How the io_uring backend may send a batch.
#[cfg(feature = "uring")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendFlavor {
    /// `SENDMSG_ZC` (the kernel pins the pages; a notification CQE follows the result).
    pub(crate) zerocopy: bool,
    /// The kernel has `IORING_OP_SEND`, used for a batch that is one piece.
    pub(crate) send_op: bool,
}

impl SendOp {
    /// An idle send op, boxed so that its `msghdr` and iovec array keep their address.
    pub(crate) fn boxed() -> Box<Self> {
        Box::new(Self {
            batch: None,
            iov: Vec::new(),
            // SAFETY: `msghdr` is a plain C struct for which all-zero bytes is the valid
            // "no name, no iovecs, no control data" value.
            msg: unsafe { std::mem::zeroed() },
            pipe: None,
            no_splice: false,
            piped: 0,
            lend_took: Duration::ZERO,
            lend_bytes: 0,
            polling: false,
            chunks: None,
        })
    }

    /// `given` (the backend's chunks for this connection) cut at whole segments of the
    /// connection on `fd` (`TCP_MAXSEG`, asked once; uncut where the kernel does not say).
    pub(crate) fn chunks(&mut self, fd: RawFd, given: Chunks) -> Chunks {
        *self.chunks.get_or_insert_with(|| {
            if given == Chunks::WHOLE {
                return given;
            }
            let mss = sys::tcp_mss(fd).unwrap_or(1);
            Chunks {
                copy: whole_segments(mss, given.copy),
                splice: whole_segments(mss, given.splice),
                lead: given.lead,
            }
        })
    }

    /// Whether the next bytes to write go through the pipe: some wait in it, or the next
    /// unwritten byte is in a lent segment (and splicing works here).
    #[inline]
    pub(crate) fn splice_next(&self) -> bool {
        self.piped > 0
            || (!self.no_splice
                && self
                    .batch
                    .as_ref()
                    .is_some_and(|b| b.has_lent() && b.lent_unsent().is_some()))
    }

    /// io_uring: the SQE that just completed was a wait for writability; clears the mark.
    #[cfg(feature = "uring")]
    pub(crate) fn take_polling(&mut self) -> bool {
        std::mem::take(&mut self.polling)
    }

    /// The short rest of a lent segment that the next call copies rather than lends (see
    /// [`LENT_TAIL_COPY`]); `None` while bytes wait in the pipe.
    fn copied_tail(&self) -> Option<&[u8]> {
        if self.piped > 0 || self.no_splice {
            return None;
        }
        self.batch.as_ref()?.lent_tail(LENT_TAIL_COPY)
    }

    /// Moves the next lent bytes into the pipe (by reference; a spare pipe of `shared` or a
    /// new one): true when some went in; false when splicing is off here now (no pipe, or
    /// `vmsplice` refused the memory: the segment is then copied).
    fn lend(&mut self, shared: &mut SendShared) -> bool {
        if self.pipe.is_none() {
            match shared.pipe() {
                Ok(p) => self.pipe = Some(p),
                Err(e) => {
                    tracing::debug!("no pipe for lent pages ({e}): copying them");
                    self.no_splice = true;
                    return false;
                }
            }
        }
        let (Some(pipe), Some(lent)) = (
            self.pipe.as_ref(),
            self.batch.as_ref().and_then(TxBatch::lent_unsent),
        ) else {
            return false;
        };
        let iov = libc::iovec {
            iov_base: lent.as_ptr().cast_mut().cast(),
            iov_len: lent.len().min(pipe.cap),
        };
        let t0 = Instant::now();
        // SAFETY: `iov` covers bytes of a lent segment of the batch, which this op owns
        // and keeps unmodified until the send completes; vmsplice takes references to
        // their pages (it never writes them), and the protocol keeps the caller's buffer
        // until the peer acknowledged reading the bytes.
        let n = unsafe { libc::vmsplice(pipe.wr.as_raw_fd(), &iov, 1, libc::SPLICE_F_NONBLOCK) };
        self.lend_took += t0.elapsed();
        if n > 0 {
            self.piped = n as usize;
            self.lend_bytes = self.piped;
            return true;
        }
        let e = io::Error::last_os_error();
        tracing::debug!("vmsplice refused lent pages ({e}): copying them");
        self.no_splice = true;
        false
    }

    /// Moves the piped bytes into the socket: `Some` with the attempt's end when the
    /// socket is full or fails, `None` when the pipe is empty.
    fn drain_pipe(
        &mut self,
        fd: RawFd,
        chunk: usize,
        counts: &mut SendShared,
    ) -> Option<Attempt<()>> {
        while self.piped > 0 {
            let pipe = self.pipe.as_ref()?;
            // At most `chunk` bytes per call (the connection's chunk for lent pages).
            let want = self.piped.min(chunk.max(1));
            let more = self.batch.as_ref().is_some_and(|b| b.remaining() > want);
            let flags = libc::SPLICE_F_MOVE
                | libc::SPLICE_F_NONBLOCK
                | if more { libc::SPLICE_F_MORE } else { 0 };
            let t0 = Instant::now();
            // SAFETY: plain fds owned by this op and by the connection; no memory passes.
            let n = unsafe {
                libc::splice(
                    pipe.rd.as_raw_fd(),
                    std::ptr::null_mut(),
                    fd,
                    std::ptr::null_mut(),
                    want,
                    flags,
                )
            };
            counts.calls += 1;
            let t1 = Instant::now();
            self.lend_took += t1 - t0;
            if n > 0 {
                let n = n as usize;
                self.piped -= n;
                if self.piped == 0 {
                    self.judge_lent(t1, &mut counts.judge);
                }
                counts.spliced += n as u64;
                self.advance(n);
                continue;
            }
            if n == 0 {
                return Some(Attempt::Done(Err(io::ErrorKind::WriteZero.into())));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => return Some(Attempt::Blocked),
                _ => {
                    return Some(Attempt::Done(Err(e)));
                }
            }
        }
        None
    }

    /// The pipe-full just drained: its calls' time goes to the judge (when it was long
    /// enough to count), and the next one starts from nothing.
    fn judge_lent(&mut self, now: Instant, judge: &mut LendJudge) {
        if LendJudge::times(self.lend_bytes) {
            judge.lent(self.lend_bytes, self.lend_took, now);
        }
        self.lend_took = Duration::ZERO;
        self.lend_bytes = 0;
    }

    /// Whether a send is in progress.
    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.batch.is_some()
    }

    /// Whether nothing of this connection's sends is left in the op: no batch, no bytes
    /// in the pipe. Only then may bytes go to the socket outside a batch
    /// ([`write_now`]).
    #[inline]
    pub(crate) fn idle(&self) -> bool {
        self.batch.is_none() && self.piped == 0
    }

    /// The batch in progress.
    #[inline]
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) fn batch(&self) -> Option<&TxBatch> {
        self.batch.as_ref()
    }

    /// Starts sending `batch` (the caller checked that no send is in progress).
    #[inline]
    pub(crate) fn start(&mut self, batch: TxBatch) {
        debug_assert!(
            self.batch.is_none(),
            "two sends in flight on one connection"
        );
        self.batch = Some(batch);
    }

    /// Ends the send and hands the batch back.
    #[inline]
    pub(crate) fn take(&mut self) -> Option<TxBatch> {
        self.iov.clear();
        self.polling = false;
        if self.piped > 0 {
            // The send ended (failed) with bytes in the pipe: they must never reach the
            // socket, so the pipe goes with them.
            self.piped = 0;
            self.pipe = None;
        }
        self.lend_took = Duration::ZERO;
        self.lend_bytes = 0;
        self.batch.take()
    }

    /// Builds the iovecs of the next call: the unsent part of the batch, at most
    /// [`MAX_IOV`] pieces and `chunks.copy` bytes, a long run's remainder first where
    /// [`next_call`] says so. Returns the bytes offered.
    ///
    /// This is the one iovec builder of the reactor.
    fn prepare(&mut self, chunks: Chunks) -> usize {
        // Both callers come here with the pipe drained (`write_some` after `drain_pipe`,
        // `sqe` only when nothing is to be spliced): piped bytes go first.
        debug_assert_eq!(self.piped, 0, "iovecs built with bytes in the pipe");
        self.iov.clear();
        let mut offered = 0;
        if let Some(batch) = self.batch.as_ref() {
            let iov = &mut self.iov;
            let mut add = |s: &[u8]| {
                if iov.len() < MAX_IOV {
                    iov.push(libc::iovec {
                        iov_base: s.as_ptr().cast_mut().cast(),
                        iov_len: s.len(),
                    });
                    offered += s.len();
                }
            };
            // A batch longer than a call may send its remainder first (see `next_call`);
            // without a lead it never does, and its run is not measured.
            let lead = chunks.lead > 0 && chunks.copy < batch.remaining();
            if self.no_splice {
                let limit = if lead {
                    next_call(batch.remaining(), chunks)
                } else {
                    chunks.copy
                };
                batch.for_each_unsent_upto(limit, add);
            } else if let Some(tail) = batch.lent_tail(LENT_TAIL_COPY) {
                // The short rest of a lent segment, copied (see `copied_tail`).
                add(tail);
            } else {
                // Up to the next lent segment, which goes through the pipe.
                let limit = if lead {
                    next_call(batch.copied_run(), chunks)
                } else {
                    chunks.copy
                };
                batch.for_each_copied_upto(limit, &mut add);
            }
        }
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len() as _;
        offered
    }

    /// Records that a call wrote `n` bytes. Returns true when the whole batch is out.
    #[inline]
    pub(crate) fn advance(&mut self, n: usize) -> bool {
        match self.batch.as_mut() {
            Some(b) => {
                b.advance(n);
                b.remaining() == 0
            }
            None => true,
        }
    }

    /// The SQE for the next piece of the batch on `fd` (`SENDMSG`, `SEND` for one piece,
    /// or `SENDMSG_ZC`), always `MSG_WAITALL | MSG_NOSIGNAL`.
    ///
    /// The entry points into this op (its `msghdr` and iovec array) and into the batch:
    /// the caller must keep the op in its slot, unmodified, until the entry's completion.
    #[cfg(feature = "uring")]
    pub(crate) fn sqe(&mut self, fd: RawFd, chunks: Chunks, how: SendFlavor) -> squeue::Entry {
        if self.splice_next() {
            // Splicing is done with direct calls (the ring's SPLICE would run in a worker
            // thread): wait for room in the socket, then resume with `try_now`.
            self.polling = true;
            return opcode::PollAdd::new(types::Fd(fd), libc::POLLOUT as u32).build();
        }
        let chunks = self.chunks(fd, chunks);
        self.prepare(chunks);
        let msg: *const libc::msghdr = &self.msg;
        let flags = (libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32;
        if how.zerocopy {
            // The kernel pins the pages instead of copying them; the buffers stay in the
            // slot until its notification CQE (IORING_CQE_F_NOTIF) says it is done.
            // IORING_SEND_ZC_REPORT_USAGE: that notification says whether it copied.
            opcode::SendMsgZc::new(types::Fd(fd), msg)
                .flags(flags)
                .ioprio(SEND_ZC_REPORT_USAGE)
                .build()
        } else if how.send_op && self.iov.len() == 1 && self.iov[0].iov_len <= u32::MAX as usize {
            // One contiguous piece (a run of small frames copied next to their headers):
            // SEND spares the kernel the msghdr and iovec import of SENDMSG.
            let one = self.iov[0];
            opcode::Send::new(types::Fd(fd), one.iov_base as *const u8, one.iov_len as u32)
                .flags(flags as i32)
                .build()
        } else {
            opcode::SendMsg::new(types::Fd(fd), msg)
                .flags(flags)
                .build()
        }
    }

    /// Writes as much of the batch as the socket takes now (`sendmsg`, gathered, or `send`
    /// for one piece; at most `chunk` bytes per call, `MSG_NOSIGNAL | MSG_DONTWAIT`),
    /// counting calls and spliced bytes in `counts`.
    /// `Blocked` once the socket is full (a short write or `EAGAIN`).
    ///
    /// The epoll backend's send, and the io_uring backend's first attempt (see
    /// `Uring::send`).
    ///
    /// A pipe this op emptied goes back to `shared` before it returns.
    pub(crate) fn try_now(
        &mut self,
        fd: RawFd,
        chunks: Chunks,
        shared: &mut SendShared,
    ) -> Attempt<()> {
        let chunks = self.chunks(fd, chunks);
        let attempt = self.write_some(fd, chunks, shared);
        if self.piped == 0 {
            if let Some(p) = self.pipe.take() {
                shared.give_back(p);
            }
        }
        attempt
    }

    /// [`try_now`](Self::try_now) but for the pipe's return.
    fn write_some(&mut self, fd: RawFd, chunks: Chunks, counts: &mut SendShared) -> Attempt<()> {
        loop {
            if let Some(end) = self.drain_pipe(fd, chunks.splice, counts) {
                return end;
            }
            if self.batch.as_ref().is_none_or(|b| b.remaining() == 0) {
                return Attempt::Done(Ok(()));
            }
            if self.splice_next() && self.copied_tail().is_none() && self.lend(counts) {
                continue;
            }
            let offered = self.prepare(chunks);
            // Bytes before a lent segment: more follows at once (no segment of its own).
            let more = !self.no_splice
                && self
                    .batch
                    .as_ref()
                    .is_some_and(|b| b.has_lent() && b.remaining() > offered);
            // Timed for the judge: a large copy, or bytes before lent pages.
            let t0 = (more || LendJudge::times(offered)).then(Instant::now);
            let res = if let [one] = self.iov[..] {
                // One contiguous piece (a run of small frames copied next to their
                // headers): `send` spares the kernel the msghdr and iovec import.
                let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
                let flags = if more { flags | SendFlags::MORE } else { flags };
                // SAFETY: `one` points into the batch, owned by `self` and unmoved for
                // the call; send only reads `iov_len` bytes there and keeps no pointer.
                // The caller keeps `fd` open for the call.
                unsafe { sys::send(fd, one.iov_base.cast(), one.iov_len, flags) }
            } else {
                let flags =
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | if more { libc::MSG_MORE } else { 0 };
                // SAFETY: `msg` points at `iov`, whose entries point into the batch; all
                // are owned by `self` and unmoved for the call. sendmsg only reads them
                // and keeps no pointer after it returns.
                let res = unsafe { libc::sendmsg(fd, &self.msg, flags) };
                usize::try_from(res).map_err(|_| sys::last_errno())
            };
            counts.calls += 1;
            self.iov.clear();
            match res {
                Ok(n) => {
                    if let Some(t0) = t0 {
                        if LendJudge::times(n) {
                            counts.judge.copied(n, t0, Instant::now());
                        } else if more {
                            // Bytes before lent pages (their header): part of lending them.
                            self.lend_took += t0.elapsed();
                        }
                    }
                    if !self.advance(n) && n < offered {
                        // Short write: the send buffer is full; resume when it drains.
                        return Attempt::Blocked;
                    }
                }
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => return Attempt::Blocked,
                Err(e) => return Attempt::Done(Err(e.into())),
            }
        }
    }
}

/// Non-blocking writes of `pieces`, in order, on `fd` (`send` for one piece, `sendmsg`
/// for several; `MSG_NOSIGNAL | MSG_DONTWAIT`), counted in `counts`: the bytes the socket
/// took, 0 when it took none or the call failed (the caller's own send of the same bytes
/// then meets the error). The backends' `write_now`, for the head of a connection's next
/// batch (see `Backend::write_now`). Pieces beyond [`DIRECT_PIECES`] are not written.
/// One call, except where [`next_call`] puts the remainder of the pieces, for the
/// connection's `chunks` (cut at whole segments), first: then it goes in a call of its
/// own, and the rest in a second one.
#[inline]
pub(crate) fn write_now(
    fd: RawFd,
    pieces: &[&[u8]],
    chunks: Chunks,
    counts: &mut SendShared,
) -> usize {
    if chunks.lead > 0 {
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let lead = next_call(total, chunks);
        if lead < chunks.copy && lead < total {
            let mut cut: [&[u8]; DIRECT_PIECES] = [&[]; DIRECT_PIECES];
            let n = cut_pieces(pieces, 0, lead, &mut cut);
            let w = write_once(fd, &cut[..n], counts);
            if w < lead {
                return w;
            }
            let n = cut_pieces(pieces, lead, total - lead, &mut cut);
            return w + write_once(fd, &cut[..n], counts);
        }
    }
    write_once(fd, pieces, counts)
}

/// One call of [`write_now`].
#[inline]
fn write_once(fd: RawFd, pieces: &[&[u8]], counts: &mut SendShared) -> usize {
    let t0 = LendJudge::times(pieces.iter().map(|p| p.len()).sum()).then(Instant::now);
    let n = write_call(fd, pieces, counts);
    if let Some(t0) = t0.filter(|_| LendJudge::times(n)) {
        counts.judge.copied(n, t0, Instant::now());
    }
    n
}

/// The call of [`write_once`].
#[inline]
fn write_call(fd: RawFd, pieces: &[&[u8]], counts: &mut SendShared) -> usize {
    counts.calls += 1;
    if let [one] = pieces {
        let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
        // SAFETY: `one` is a live borrowed slice for the call; `send` only reads its
        // `len()` bytes and keeps no pointer. The caller keeps `fd` open for the call.
        return unsafe { sys::send(fd, one.as_ptr(), one.len(), flags) }.unwrap_or(0);
    }
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; DIRECT_PIECES];
    let n = pieces.len().min(DIRECT_PIECES);
    for (v, p) in iov.iter_mut().zip(pieces) {
        *v = libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        };
    }
    // SAFETY: `msghdr` is a plain C struct for which all-zero bytes is the valid empty
    // value (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: `msg` points at `iov`, whose first `n` entries point into the borrowed
    // `pieces`; all live on this frame for the call. sendmsg only reads them and keeps no
    // pointer after it returns.
    let res = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    usize::try_from(res).unwrap_or(0)
}

/// `len` bytes of `pieces` from byte `skip` on (at most [`DIRECT_PIECES`] slices) as
/// slices in `out`; returns how many.
fn cut_pieces<'a>(
    pieces: &[&'a [u8]],
    mut skip: usize,
    len: usize,
    out: &mut [&'a [u8]; DIRECT_PIECES],
) -> usize {
    let mut left = len;
    let mut n = 0;
    for p in pieces {
        if left == 0 || n == DIRECT_PIECES {
            break;
        }
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        let p = &p[skip..];
        skip = 0;
        let take = p.len().min(left);
        out[n] = &p[..take];
        left -= take;
        n += 1;
    }
    n
}

/// A receive into an [`RxBuf`]: one read into its spare region, or, for a buffer that
/// [`wants_all`](RxBuf::wants_all) of its bytes, as many reads as it takes to fill it.
/// It completes with the bytes it committed: the whole spare region for such a buffer
/// (fewer at end of stream, and from io_uring while the low-water mark is raised, when
/// the kernel's read stops short of the record's end: see [`LowWater`]), else whatever
/// one read brought (0 = end of stream).
#[derive(Default)]
pub(crate) struct RecvOp {
    /// The buffer being filled; `Some` exactly while the receive is in progress.
    rx: Option<RxBuf>,
    /// Bytes this receive committed so far (a buffer that wants all spans several reads).
    done: usize,
    /// Position in the connection table's direct set while the receive is there
    /// (see [`Slots::join_direct`](super::slots::Slots::join_direct)).
    pub(crate) direct_at: Option<usize>,
    /// The socket's receive low-water mark while large records arrive.
    low: LowWater,
}

/// The receive low-water mark (`SO_RCVLOWAT`) of a connection's socket while a large
/// record arrives (`SockOpts::rcvlowat_for`): raised to `raise` bytes while more than
/// that many of the record are still to come, back to the default (1) before the rest.
///
/// Why: the kernel acknowledges received data at once, rather than when a read frees
/// room in the window, while fewer than the mark of unread bytes wait in the socket
/// (`__tcp_ack_snd_check`). A paced congestion control (BBR) measures the bandwidth from
/// how fast its data is acknowledged, and a large message that the peer acknowledges
/// as it arrives rather than as it reads it leaves markedly faster between hosts (see
/// docs/design/large-messages.md).
///
/// Invariant, so that no wait can outlast the record: while the mark is raised, at least
/// that many of the record's bytes are still to come after every read in progress (a
/// socket with fewer unread bytes than the mark is not readable). Reads the kernel
/// continues on its own (io_uring's `MSG_WAITALL`) stop that many bytes short of the
/// record's end ([`RecvOp::sqe`]); reads made here lower the mark before a wait and before
/// the record completes ([`RecvOp::try_now`]).
#[derive(Debug, Default, Clone, Copy)]
struct LowWater {
    /// The mark while a record arrives (0: never raised).
    raise: usize,
    /// The mark the socket has now (1: the kernel's default).
    now: usize,
}

impl RecvOp {
    /// Whether a receive is in progress.
    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.rx.is_some()
    }

    /// Starts a receive into `rx` (the caller checked that none is in progress and that
    /// `rx` has spare room).
    #[inline]
    pub(crate) fn start(&mut self, rx: RxBuf) {
        debug_assert!(
            self.rx.is_none(),
            "two receives in flight on one connection"
        );
        self.rx = Some(rx);
        self.done = 0;
    }

    /// The low-water mark of large records on this connection (`None`: the kernel's
    /// default throughout); the socket is new and has the default now.
    pub(crate) fn set_low_water(&mut self, raise: Option<usize>) {
        self.low = LowWater {
            raise: raise.unwrap_or(0),
            now: 1,
        };
    }

    /// Sets the socket's low-water mark for what the receive in progress still expects:
    /// raised while more of the record's bytes are missing than the mark, else the
    /// default. Returns the mark in force. A socket that refuses the mark keeps the
    /// default for good (best effort: it only costs the early ACKs).
    fn pace_acks(&mut self, fd: RawFd) -> usize {
        if self.low.raise == 0 {
            return 1;
        }
        let missing = self.rx.as_ref().map_or(0, RxBuf::missing);
        let want = if missing > self.low.raise {
            self.low.raise
        } else {
            1
        };
        if want != self.low.now {
            match sys::set_rcvlowat(fd, want) {
                Ok(()) => self.low.now = want,
                Err(e) => {
                    tracing::debug!("SO_RCVLOWAT {want} failed: {e}");
                    // Lowering failed: the socket is going (closed, reset); raising
                    // failed: the default stays, and so does the invariant.
                    self.low.raise = 0;
                    if want == 1 {
                        self.low.now = 1;
                    }
                }
            }
        }
        self.low.now
    }

    /// Ends the receive and hands the buffer back.
    #[inline]
    pub(crate) fn take(&mut self) -> Option<RxBuf> {
        self.done = 0;
        self.rx.take()
    }

    /// The result of a receive that ended after committing what it did so far.
    #[inline]
    fn finish(&mut self, result: io::Result<()>) -> io::Result<usize> {
        result.map(|()| self.done)
    }

    /// Tries the receive now with non-blocking `recv` calls on `fd` (`MSG_DONTWAIT`).
    /// `eof_seen` says the socket already reported the peer's hang-up, so a short read is
    /// not the end of the data for now.
    pub(crate) fn try_now(&mut self, fd: RawFd, eof_seen: bool) -> Tried {
        let tried = |attempt, drained, eof| Tried {
            attempt,
            drained,
            eof,
        };
        self.pace_acks(fd);
        let Some(rx) = self.rx.as_mut() else {
            return tried(Attempt::Done(Ok(0)), false, false);
        };
        let wants_all = rx.fills();
        let raised = self.low.now > 1;
        let res = loop {
            let spare = rx.spare_mut();
            let want = spare.len();
            if want == 0 {
                break tried(Attempt::Done(Ok(self.done)), false, false);
            }
            // SAFETY: `spare` is a live, exclusively borrowed region of the RxBuf's heap
            // buffer; `recv` writes at most `want` bytes into it and keeps no pointer. The
            // caller keeps `fd` open for the call.
            let res = unsafe { sys::recv(fd, spare.as_mut_ptr(), want, RecvFlags::DONTWAIT) };
            let n = match res {
                // End of stream: whatever was gathered now, 0 on the next receive.
                Ok(0) => break tried(Attempt::Done(Ok(self.done)), false, true),
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => break tried(Attempt::Blocked, true, false),
                Err(e) => break tried(Attempt::Done(self.finish(Err(e.into()))), false, false),
            };
            rx.commit(n);
            self.done += n;
            let drained = n < want;
            if !wants_all || n == want {
                break tried(Attempt::Done(Ok(self.done)), drained, false);
            }
            if drained && !eof_seen {
                // Part of a buffer that wants all: keep it, wait for more data.
                break tried(Attempt::Blocked, true, false);
            }
        };
        if raised {
            // Bytes came: before a wait, or the record's end, the mark follows them.
            self.pace_acks(fd);
        }
        res
    }

    /// The SQE that reads the rest of the receive (`RECV` into the spare region, with
    /// `MSG_WAITALL` for a buffer that wants all of it).
    ///
    /// The entry points into the buffer's heap memory: the caller must keep this op in
    /// its slot, with the buffer, until the entry's completion.
    #[cfg(feature = "uring")]
    pub(crate) fn sqe(&mut self, fd: RawFd) -> Option<squeue::Entry> {
        let mark = self.pace_acks(fd);
        let rx = self.rx.as_mut()?;
        let flags = if rx.fills() { libc::MSG_WAITALL } else { 0 };
        // With the mark raised, the kernel's read stops that many bytes short of the
        // record's end (`LowWater`); the rest is read after it is lowered.
        let short = if mark > 1 {
            rx.missing() - mark
        } else {
            usize::MAX
        };
        let spare = rx.spare_mut();
        let len = spare.len().min(short).min(i32::MAX as usize);
        let ptr = spare.as_mut_ptr();
        Some(
            opcode::Recv::new(types::Fd(fd), ptr, len as u32)
                .flags(flags)
                .build(),
        )
    }

    /// The completion of the SQE from [`sqe`](Self::sqe): `res` bytes (or `-errno`).
    /// Returns the receive's result and hands the buffer back.
    #[cfg(feature = "uring")]
    pub(crate) fn complete(&mut self, res: i32) -> Option<(RxBuf, io::Result<usize>)> {
        let result = if res < 0 {
            self.finish(Err(io::Error::from_raw_os_error(-res)))
        } else {
            if let Some(rx) = self.rx.as_mut() {
                rx.commit(res as usize);
            }
            self.done += res as usize;
            Ok(self.done)
        };
        Some((self.take()?, result))
    }
}

/// `IORING_SEND_ZC_REPORT_USAGE` (in the SQE's `ioprio`): the notification's result
/// tells whether the kernel fell back to copying.
#[cfg(feature = "uring")]
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;

/// A request the backend refuses. Every backend answers it the same way: the operation
/// completes (through the next `poll`, never at once) with the buffer and this errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misuse {
    /// The connection id names no open connection (never opened, or already `Closed`).
    NoConnection,
    /// The connection is closing: `close` cancels what is pending and refuses what comes.
    Closing,
    /// A send (or receive) is already in progress on the connection.
    Busy,
    /// The receive buffer has no spare room: a zero-length read would look like end of
    /// stream.
    NoRoom,
}

impl Misuse {
    /// The errno of the answer: `ENOTCONN`, `ECANCELED`, `EBUSY`, `EINVAL`.
    pub(crate) fn errno(self) -> i32 {
        match self {
            Self::NoConnection => libc::ENOTCONN,
            Self::Closing => libc::ECANCELED,
            Self::Busy => libc::EBUSY,
            Self::NoRoom => libc::EINVAL,
        }
    }

    /// The error an operation refused this way completes with.
    pub(crate) fn error(self) -> io::Error {
        io::Error::from_raw_os_error(self.errno())
    }
}

/// The result of an operation cut short by `close` (or by the backend shutting down).
pub(crate) fn cancelled<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::ECANCELED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    /// Sends `batch` with direct calls over a loopback connection, a thread reading the
    /// other end; returns the bytes read and the op's counts.
    fn send_over_loopback(batch: TxBatch) -> (Vec<u8>, SendShared) {
        send_over_loopback_in(batch, Chunks::WHOLE)
    }

    /// [`send_over_loopback`] in send calls of at most `chunks`.
    fn send_over_loopback_in(batch: TxBatch, chunks: Chunks) -> (Vec<u8>, SendShared) {
        let total = batch.remaining();
        let l = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
        let tx = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
        let (mut rx, _) = l.accept().expect("accept");
        tx.set_nonblocking(true).unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; total];
            rx.read_exact(&mut got).map(|()| got)
        });
        let mut op = SendOp::boxed();
        let mut shared = SendShared::default();
        op.start(batch);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match op.try_now(tx.as_raw_fd(), chunks, &mut shared) {
                Attempt::Done(r) => break r.expect("the send"),
                Attempt::Blocked => {
                    assert!(Instant::now() < deadline, "the send stalled");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let got = reader.join().unwrap().expect("the reader's bytes");
        (got, shared)
    }

    /// A lent segment that starts inside a page fills the pipe's pages but for its last
    /// bytes: a short rest is copied by one `send` (not lent by a second `vmsplice` and
    /// `splice`), a longer one goes through the pipe again. Every byte arrives, in order.
    #[test]
    fn short_rest_of_a_lent_segment_is_copied() {
        // SAFETY: sysconf only reads a system constant.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let cap = {
            let mut shared = SendShared::default();
            shared.pipe().expect("a pipe").cap
        };
        // What one pipe-full holds of a segment that starts 16 bytes into a page.
        let fits = cap / page * page - 16;
        for (rest, lent_rest) in [(100, false), (LENT_TAIL_COPY + 1, true)] {
            let len = fits + rest;
            let mut mem = vec![0u8; len + 2 * page];
            let start = (page - mem.as_ptr() as usize % page) % page + 16;
            for (i, b) in mem[start..start + len].iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let seg = Bytes::from(mem).slice(start..start + len);
            assert_eq!(seg.as_ptr() as usize % page, 16);
            let mut batch = TxBatch::with_capacity(64, 4);
            batch.push_copy(b"header!!");
            batch.push_lent(seg.clone());
            let (got, shared) = send_over_loopback(batch);
            assert_eq!(got[..8], *b"header!!");
            assert!(
                got[8..] == seg[..],
                "the lent bytes arrived whole, in order"
            );
            let spliced = if lent_rest { len } else { fits };
            assert_eq!(
                shared.spliced, spliced as u64,
                "bytes through the pipe, rest {rest}"
            );
            assert_eq!(spliced, piped_bytes(&seg), "the tests' expectation agrees");
        }
    }

    /// A limited send call is cut at whole segments of its connection (`TCP_MAXSEG`), at
    /// least one; no limit stays none. A batch sent in such calls, copied and lent,
    /// arrives whole and in order.
    #[test]
    fn send_calls_are_cut_at_whole_segments() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
        let tx = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
        let mss = sys::tcp_mss(tx.as_raw_fd()).expect("the connection's MSS");
        assert!(mss > 500, "an MSS of {mss}");
        assert_eq!(whole_segments(mss, 2 * mss + 106), 2 * mss);
        assert_eq!(whole_segments(mss, 3 * mss), 3 * mss);
        assert_eq!(whole_segments(mss, mss / 2), mss, "at least one segment");
        assert_eq!(whole_segments(mss, usize::MAX), usize::MAX);
        drop((tx, l));

        // SAFETY: sysconf only reads a system constant.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let len = 3 << 20;
        let mut mem = vec![0u8; len + page];
        let start = (page - mem.as_ptr() as usize % page) % page;
        for (i, b) in mem[start..start + len].iter_mut().enumerate() {
            *b = (i % 253) as u8;
        }
        let lent = Bytes::from(mem).slice(start..start + len);
        let copied: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
        let mut batch = TxBatch::with_capacity(64, 4);
        batch.push_copy(b"header!!");
        batch.push_ext(Bytes::from(copied.clone()));
        batch.push_lent(lent.clone());
        let chunks = Chunks {
            copy: 100_000,
            splice: 300_000,
            lead: 0,
        };
        let (got, shared) = send_over_loopback_in(batch, chunks);
        assert_eq!(got[..8], *b"header!!");
        assert!(got[8..8 + len] == copied[..], "the copied bytes, whole");
        assert!(got[8 + len..] == lent[..], "the lent bytes, whole");
        assert!(shared.spliced > 0, "some bytes went through the pipe");
    }

    /// A run longer than a call: its remainder first where the whole calls after it fit
    /// in `lead`, else whole calls first; a run of whole calls, or one that fits, as is.
    #[test]
    fn a_short_runs_remainder_goes_first() {
        let c = |lead| Chunks {
            copy: 1000,
            splice: usize::MAX,
            lead,
        };
        assert_eq!(next_call(700, c(1000)), 700, "fits");
        assert_eq!(next_call(1000, c(1000)), 1000, "fits exactly");
        assert_eq!(next_call(1384, c(1000)), 384, "one call and a remainder");
        assert_eq!(next_call(3000, c(4000)), 1000, "whole calls");
        assert_eq!(next_call(4384, c(4000)), 384, "four calls fit in the lead");
        assert_eq!(next_call(5384, c(4000)), 1000, "five do not");
        assert_eq!(next_call(1384, c(0)), 1000, "no lead: remainder last");
        let whole = Chunks::WHOLE;
        assert_eq!(next_call(usize::MAX - 1, whole), usize::MAX - 1);
    }

    /// A batch's calls follow `next_call`: a 64 KiB message behind its header leaves as
    /// its remainder and one whole call with a lead, as one whole call and the remainder
    /// without.
    #[test]
    fn batch_calls_put_the_remainder_first_within_the_lead() {
        let chunk = 45 * 1448;
        for (lead, want) in [(chunk, [384, chunk]), (0, [chunk, 384])] {
            let mut batch = TxBatch::with_capacity(64, 4);
            batch.push_copy(b"header!!");
            batch.push_ext(Bytes::from(vec![7u8; 65536]));
            let mut op = SendOp::boxed();
            op.start(batch);
            let chunks = Chunks {
                copy: chunk,
                splice: usize::MAX,
                lead,
            };
            let mut calls = Vec::new();
            for _ in 0..4 {
                let n = op.prepare(chunks);
                let iov: usize = op.iov.iter().map(|v| v.iov_len).sum();
                assert_eq!(n, iov, "offered what the iovecs cover");
                calls.push(n);
                if op.advance(n) {
                    break;
                }
            }
            assert_eq!(calls, want, "lead {lead}");
        }
    }

    /// `write_now` of pieces longer than a call: with a lead, the remainder and the rest
    /// in two calls; without, one call. The peer gets every byte, in order.
    #[test]
    fn write_now_sends_the_remainder_first_within_the_lead() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
        let tx = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
        let (mut rx, _) = l.accept().expect("accept");
        // Room for the whole message in one non-blocking call whatever the defaults.
        socket2::SockRef::from(&tx)
            .set_send_buffer_size(1 << 20)
            .expect("SO_SNDBUF");
        let payload: Vec<u8> = (0..65536).map(|i| (i % 251) as u8).collect();
        let want: Vec<u8> = b"header!!".iter().chain(&payload).copied().collect();
        let chunk = 45 * 1448;
        for (lead, calls) in [(chunk, 2), (0, 1)] {
            let chunks = Chunks {
                copy: chunk,
                splice: usize::MAX,
                lead,
            };
            let mut counts = SendShared::default();
            let pieces: [&[u8]; 2] = [b"header!!", &payload];
            let n = write_now(tx.as_raw_fd(), &pieces, chunks, &mut counts);
            assert_eq!(n, want.len(), "the socket took it all (lead {lead})");
            assert_eq!(counts.calls, calls, "lead {lead}");
            let mut got = vec![0u8; want.len()];
            rx.read_exact(&mut got).expect("the bytes");
            assert!(got == want, "in order (lead {lead})");
        }
    }

    /// A pipe goes back to the spares only empty, and only up to `SPARE_PIPES` of them;
    /// a spare one is handed out before a new one is made.
    #[test]
    fn only_empty_pipes_are_shared() {
        let mut shared = SendShared::default();
        let p = shared.pipe().expect("a pipe");
        assert_eq!(shared.pipes_made, 1);
        // One byte left in it: closed, not kept for another connection.
        // SAFETY: a one-byte write from a live local into a pipe we own.
        let n = unsafe { libc::write(p.wr.as_raw_fd(), [7u8].as_ptr().cast(), 1) };
        assert_eq!(n, 1);
        assert!(!p.is_empty());
        shared.give_back(p);
        assert!(shared.spare.is_empty(), "a pipe with a byte in it was kept");
        let pipes: Vec<Pipe> = (0..SPARE_PIPES + 1)
            .map(|_| shared.pipe().expect("a pipe"))
            .collect();
        assert_eq!(shared.pipes_made, 1 + SPARE_PIPES as u64 + 1);
        for p in pipes {
            assert!(p.is_empty());
            shared.give_back(p);
        }
        assert_eq!(shared.spare.len(), SPARE_PIPES);
        assert_eq!(
            shared.pipes_open(),
            SPARE_PIPES as u64,
            "the pipe with a byte and the one beyond the spares were closed"
        );
        let _again = shared.pipe().expect("a spare pipe");
        assert_eq!(
            shared.pipes_made,
            1 + SPARE_PIPES as u64 + 1,
            "a spare one was reused"
        );
    }
}
