//! The ringbtl ping-pong: rank 0 sends `size` bytes on [`TAG`], rank 1's handler sends the
//! same number of bytes back from inside the handler, rank 0's handler counts the reply.
//! Or, with `--exchange`, both ranks send each iteration's message at once and wait for
//! the other's (no reply from a handler). With `--fresh` every iteration sends another
//! slice of an arena ([`cli::fresh_slots`]); the receiver's buffers are ringbtl's own.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use ringbtl::{BackendKind, PeerId, ProgressMode, Tag, Transport};

use crate::cli::{self, Pattern};
use crate::control::BenchTransport;
use crate::flow::{self, Deferred};
use crate::report::Recorder;
use crate::SHUTDOWN_TIMEOUT;

/// The active-message tag of the ping-pong (both directions).
pub(crate) const TAG: Tag = Tag(42);

/// One Transport and the state its callbacks share with the loops.
pub(crate) struct Ring {
    tr: Transport,
    rank: u32,
    /// Ping-pong messages received on [`TAG`] (cumulative).
    received: Rc<Cell<u64>>,
    /// Sends that completed successfully (cumulative).
    completed: Rc<Cell<u64>>,
    /// First failure reported by a callback; ends the run.
    failure: Rc<RefCell<Option<String>>>,
    /// The current size's payloads (rank 1 replies with them).
    payload: Rc<RefCell<Slots>>,
    /// Length every received message must have.
    expect: Rc<Cell<usize>>,
    /// Replies that met a full send queue, sent by [`wait_for`](Self::wait_for).
    deferred: Rc<RefCell<Deferred>>,
    /// `--exchange`: both ranks send, no handler replies.
    exchange: bool,
    /// `--fresh`: iterations cycle through an arena.
    fresh: bool,
}

/// The payloads of the current size: one pre-built segment every iteration sends, or
/// with `--fresh` an arena of [`cli::fresh_slots`] messages that iteration `i` takes
/// slice `i % count` of.
#[derive(Debug, Default)]
struct Slots {
    one: Vec<Bytes>,
    arena: Bytes,
    size: usize,
    count: usize,
}

impl Slots {
    fn new(size: usize, fresh: bool) -> Self {
        let count = if fresh && size > 0 {
            cli::fresh_slots(size)
        } else {
            1
        };
        let arena = if size == 0 {
            Bytes::new()
        } else {
            Bytes::from(vec![0xa5u8; size * count])
        };
        Self {
            one: vec![arena.slice(..size)],
            arena,
            size,
            count,
        }
    }

    /// Calls `f` with the segments of iteration `i`.
    #[inline]
    fn with_segs<R>(&self, i: u64, f: impl FnOnce(&[Bytes]) -> R) -> R {
        if self.count <= 1 {
            return f(&self.one);
        }
        let at = (i % self.count as u64) as usize * self.size;
        f(&[self.arena.slice(at..at + self.size)])
    }
}

impl Ring {
    /// Creates rank `rank`'s Transport for `backend` and registers the handlers (rank 1's
    /// replies, unless `exchange`).
    pub(crate) fn new(
        rank: u32,
        backend: BackendKind,
        mode: ProgressMode,
        pat: Pattern,
    ) -> Result<Self, String> {
        let Pattern { exchange, fresh } = pat;
        let mut tr = cli::transport(rank, backend, mode)?;
        let received: Rc<Cell<u64>> = Rc::default();
        let completed: Rc<Cell<u64>> = Rc::default();
        let failure: Rc<RefCell<Option<String>>> = Rc::default();
        let payload: Rc<RefCell<Slots>> = Rc::default();
        let expect: Rc<Cell<usize>> = Rc::default();
        let deferred: Rc<RefCell<Deferred>> = Rc::default();

        let (rx, fail, pay, exp, def) = (
            received.clone(),
            failure.clone(),
            payload.clone(),
            expect.clone(),
            deferred.clone(),
        );
        let reply = rank == 1 && !exchange;
        tr.register(TAG, move |t: &mut Transport, am| {
            if am.payload.len() != exp.get() {
                fail.borrow_mut().get_or_insert_with(|| {
                    format!(
                        "received {} bytes from {}, expected {}",
                        am.payload.len(),
                        am.src,
                        exp.get()
                    )
                });
                return;
            }
            rx.set(rx.get() + 1);
            if reply {
                let n = rx.get();
                let sent = pay
                    .borrow()
                    .with_segs(n, |segs| def.borrow_mut().send(t, am.src, TAG, segs, n));
                if let Err(e) = sent {
                    fail.borrow_mut()
                        .get_or_insert_with(|| format!("reply to {}: {e}", am.src));
                }
            }
        })
        .map_err(|e| format!("registering tag {}: {e}", TAG.0))?;

        let (done, fail) = (completed.clone(), failure.clone());
        tr.on_complete(move |c| match c.result {
            Ok(()) => done.set(done.get() + 1),
            Err(e) => {
                fail.borrow_mut()
                    .get_or_insert_with(|| format!("send to {} failed: {e}", c.peer));
            }
        });
        let fail = failure.clone();
        tr.on_error(move |peer, why| {
            fail.borrow_mut()
                .get_or_insert_with(|| format!("{peer} failed: {why}"));
        });
        Ok(Self {
            tr,
            rank,
            received,
            completed,
            failure,
            payload,
            expect,
            deferred,
            exchange,
            fresh,
        })
    }

    /// Builds the payloads of `size` bytes once (the arena with `--fresh`).
    fn set_size(&mut self, size: usize) {
        *self.payload.borrow_mut() = Slots::new(size, self.fresh);
        self.expect.set(size);
    }

    /// Drives progress in the transport's mode until `received >= rx` and
    /// `completed >= done`; fails on a callback's failure or past `deadline`.
    #[inline]
    fn wait_for(&mut self, rx: u64, done: u64, deadline: Instant) -> Result<(), String> {
        let (received, completed, failure) = (&self.received, &self.completed, &self.failure);
        let met = flow::wait_until(&mut self.tr, &self.deferred, deadline, || {
            (received.get() >= rx && completed.get() >= done) || failure.borrow().is_some()
        })?;
        if let Some(f) = self.failure.borrow().as_ref() {
            return Err(f.clone());
        }
        if !met {
            return Err(self.timeout());
        }
        Ok(())
    }

    fn timeout(&self) -> String {
        format!(
            "timed out (rank {}: {} messages received, {} sends completed)",
            self.rank,
            self.received.get(),
            self.completed.get()
        )
    }

    /// Rank 0: `warmup + iters` round trips of `size` bytes (exchanges, with `exchange`),
    /// the last `iters` timed into `rec`.
    pub(crate) fn ping(
        &mut self,
        size: usize,
        warmup: u64,
        iters: u64,
        deadline: Instant,
        rec: &mut Recorder,
    ) -> Result<(), String> {
        self.set_size(size);
        let peer = PeerId(1);
        let rx0 = self.received.get();
        let done0 = self.completed.get();
        for i in 0..warmup + iters {
            let t0 = Instant::now();
            let tr = &mut self.tr;
            self.payload
                .borrow()
                .with_segs(i, |segs| flow::send(tr, peer, TAG, segs, i, deadline))?;
            // The reply to message i is the (i + 1)-th message received in this phase.
            self.wait_for(rx0 + i + 1, 0, deadline)?;
            let rtt = t0.elapsed();
            if i >= warmup {
                // The recorder halves round trips; an exchange is reported whole.
                rec.record(if self.exchange { rtt * 2 } else { rtt });
            }
        }
        // Every send of the phase has completed before the next phase starts.
        self.wait_for(0, done0 + warmup + iters, deadline)
    }

    /// Rank 1: answers `count` messages of `size` bytes (the handler replies), or, with
    /// `exchange`, sends its own message of each iteration and waits for rank 0's; then
    /// waits until every send has completed.
    pub(crate) fn pong(
        &mut self,
        size: usize,
        count: u64,
        deadline: Instant,
    ) -> Result<(), String> {
        self.set_size(size);
        let rx0 = self.received.get();
        let done0 = self.completed.get();
        if self.exchange {
            for i in 0..count {
                let tr = &mut self.tr;
                self.payload
                    .borrow()
                    .with_segs(i, |segs| flow::send(tr, PeerId(0), TAG, segs, i, deadline))?;
                self.wait_for(rx0 + i + 1, 0, deadline)?;
            }
        }
        self.wait_for(rx0 + count, done0 + count, deadline)
    }
}

impl BenchTransport for Ring {
    fn local_addr(&self) -> SocketAddr {
        self.tr.local_addr()
    }

    fn backend_name(&self) -> &'static str {
        self.tr.backend_name()
    }

    fn add_peer(&mut self, addr: SocketAddr) -> Result<(), String> {
        let peer = PeerId(1 - self.rank);
        self.tr
            .add_peer(peer, vec![addr])
            .map_err(|e| format!("adding {peer} at {addr}: {e}"))
    }

    fn shutdown(&mut self) -> Result<(), String> {
        self.tr
            .shutdown(SHUTDOWN_TIMEOUT)
            .map_err(|e| format!("shutdown: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fresh: consecutive iterations send disjoint slices, the arena is cycled whole;
    /// otherwise every iteration sends the one segment.
    #[test]
    fn fresh_slots_cycle_disjoint_slices() {
        let size = 1_000_000;
        let s = Slots::new(size, true);
        let n = cli::fresh_slots(size) as u64;
        assert_eq!(n, 67);
        let at = |i: u64| {
            s.with_segs(i, |segs| {
                (segs.len(), segs[0].as_ptr() as usize, segs[0].len())
            })
        };
        let base = at(0).1;
        for i in 0..2 * n {
            let (count, ptr, len) = at(i);
            assert_eq!((count, len), (1, size));
            assert_eq!(ptr - base, (i % n) as usize * size, "iteration {i}");
        }
        let same = Slots::new(size, false);
        let p0 = same.with_segs(0, |segs| segs[0].as_ptr());
        assert!((0..5).all(|i| same.with_segs(i, |segs| segs[0].as_ptr()) == p0));
        assert_eq!(cli::fresh_slots(32 << 20), 8);
        assert_eq!(Slots::new(0, true).with_segs(3, |segs| segs[0].len()), 0);
    }
}
