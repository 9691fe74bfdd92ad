//! The connection table both backends keep: generation-tagged slots, the events produced
//! outside `poll` (misuse answers, `Closed`), and the set of receives tried with a direct
//! non-blocking `recv`. No syscalls here.
//!
//! A slot's index is the [`ConnId`]. Each time a slot is reused it gets a new
//! generation, carried in every kernel-facing token (io_uring `user_data`, epoll data),
//! so a completion or readiness edge that outlived its connection is recognised and
//! dropped instead of being taken for the next connection in the same slot.
//!
//! A slot is freed only when its [`Event::Closed`] is handed to the caller, so the id is
//! never reused while the caller may still name the old connection.

use std::collections::VecDeque;

use slab::Slab;

use super::op::{Misuse, RecvOp, SendOp};
use super::{ConnId, Event, RxBuf, TxBatch};

/// Up to this many receives are tried with a direct non-blocking `recv` while the caller
/// spins `poll(None)`: a spun `recv` is the latency floor on loopback (one syscall, no
/// task work, no wake-up), while many idle connections are cheaper to watch through the
/// kernel (the ring, or one `epoll_wait`) than to poll one syscall each. The
/// measurements behind the number are in docs/design/receive.md.
pub(crate) const DIRECT_RECV_MAX: usize = 8;

/// Generations wrap at 24 bits (the width left for them in a token).
pub(crate) const GEN_MASK: u32 = (1 << 24) - 1;

/// Packs a token: bits 0..32 slot index, 32..56 slot generation, 56..64 kind (what the
/// token names: an operation, a listener...; each backend has its own kinds).
#[inline]
pub(crate) fn token(kind: u8, slot: usize, gen: u32) -> u64 {
    (u64::from(kind) << 56) | (u64::from(gen & GEN_MASK) << 32) | (slot as u64 & 0xffff_ffff)
}

/// Unpacks a [`token`]: (kind, slot, generation).
#[inline]
pub(crate) fn untoken(t: u64) -> (u8, usize, u32) {
    (
        (t >> 56) as u8,
        (t & 0xffff_ffff) as usize,
        ((t >> 32) as u32) & GEN_MASK,
    )
}

/// One connection: what both backends keep for it, and the backend's own part `io`.
pub(crate) struct Slot<C> {
    /// Generation of this use of the slot.
    pub(crate) gen: u32,
    /// `close` was called: no new operation starts, pending ones are cancelled.
    pub(crate) closing: bool,
    /// The send in progress, with its kernel-visible iovec array and `msghdr`.
    pub(crate) send: Box<SendOp>,
    /// The receive in progress.
    pub(crate) recv: RecvOp,
    /// The backend's own state (fd, readiness or in-flight bookkeeping).
    pub(crate) io: C,
}

/// The generation-tagged connection table, with the queue of deferred events and the
/// direct-receive set.
pub(crate) struct Slots<C> {
    table: Slab<Slot<C>>,
    next_gen: u32,
    /// Events produced outside `poll`, delivered first by the next `poll`.
    deferred: VecDeque<Event>,
    /// Slots whose receive is in the direct set (`RecvOp::direct_at` indexes it).
    direct: Vec<usize>,
    /// Size of the direct set the backend may use ([`DIRECT_RECV_MAX`]; tests change it).
    pub(crate) direct_max: usize,
}

impl<C> Slots<C> {
    pub(crate) fn new() -> Self {
        Self {
            table: Slab::new(),
            next_gen: 0,
            deferred: VecDeque::new(),
            direct: Vec::with_capacity(DIRECT_RECV_MAX),
            direct_max: DIRECT_RECV_MAX,
        }
    }

    /// Puts a new connection in a free slot with a fresh generation, its receives raising
    /// the socket's low-water mark to `low_water` for large records
    /// (`SockOpts::rcvlowat_for`). Returns its index.
    pub(crate) fn insert(&mut self, io: C, low_water: Option<usize>) -> usize {
        let gen = self.next_gen & GEN_MASK;
        self.next_gen = self.next_gen.wrapping_add(1);
        let mut recv = RecvOp::default();
        recv.set_low_water(low_water);
        self.table.insert(Slot {
            gen,
            closing: false,
            send: SendOp::boxed(),
            recv,
            io,
        })
    }

    /// Removes a slot at once (the caller delivers or drops its `Closed`).
    pub(crate) fn remove(&mut self, idx: usize) -> Option<Slot<C>> {
        self.leave_direct(idx);
        self.table.try_remove(idx)
    }

    #[inline]
    pub(crate) fn get(&self, idx: usize) -> Option<&Slot<C>> {
        self.table.get(idx)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, idx: usize) -> Option<&mut Slot<C>> {
        self.table.get_mut(idx)
    }

    /// The slot `idx` if it still holds generation `gen` (the connection a token named).
    #[inline]
    pub(crate) fn tagged(&mut self, idx: usize, gen: u32) -> Option<&mut Slot<C>> {
        self.table.get_mut(idx).filter(|s| s.gen == gen)
    }

    /// The backend's part of `conn`'s slot while the connection is open (not closing):
    /// where `reset` finds the socket to abort before it closes the connection.
    #[inline]
    pub(crate) fn open_io(&self, conn: ConnId) -> Option<&C> {
        self.table
            .get(conn.0 as usize)
            .filter(|s| !s.closing)
            .map(|s| &s.io)
    }

    /// The start of every backend's `close`: marks `conn`'s slot closing and returns its
    /// index and the slot. `None` when there is no such connection or it is closing
    /// already (`close` is idempotent).
    #[inline]
    pub(crate) fn start_close(&mut self, conn: ConnId) -> Option<(usize, &mut Slot<C>)> {
        let idx = conn.0 as usize;
        let s = self.table.get_mut(idx).filter(|s| !s.closing)?;
        s.closing = true;
        Some((idx, s))
    }

    /// The token of `kind` for the connection in slot `idx` (0 for a free slot).
    #[inline]
    pub(crate) fn token(&self, kind: u8, idx: usize) -> u64 {
        token(kind, idx, self.table.get(idx).map_or(0, |s| s.gen))
    }

    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Indices of every slot in use.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) fn ids(&self) -> Vec<usize> {
        self.table.iter().map(|(i, _)| i).collect()
    }

    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Slot<C>> {
        self.table.iter().map(|(_, s)| s)
    }

    /// Empties the table (backend shutdown), the deferred events and the direct set.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Slot<C>> + '_ {
        self.deferred.clear();
        self.direct.clear();
        self.table.drain()
    }

    // ----- admission: every backend answers misuse the same way ----------------------

    /// The slot a new send on `conn` may use. Otherwise the send completes through the
    /// next `poll`: refused as [`Misuse`] says, or at once `Ok` for an empty batch.
    #[inline]
    pub(crate) fn admit_send(&mut self, conn: ConnId, batch: TxBatch) -> Option<(usize, TxBatch)> {
        let idx = conn.0 as usize;
        let refusal = match self.table.get(idx) {
            None => Some(Misuse::NoConnection),
            Some(s) if s.closing => Some(Misuse::Closing),
            Some(s) if s.send.busy() => {
                debug_assert!(false, "two sends in flight on {conn:?}");
                Some(Misuse::Busy)
            }
            Some(_) if batch.remaining() == 0 => None,
            Some(_) => return Some((idx, batch)),
        };
        let result = refusal.map_or(Ok(()), |m| Err(m.error()));
        self.defer(Event::Sent {
            conn,
            batch,
            result,
        });
        None
    }

    /// The slot a new receive on `conn` may use; otherwise the receive completes through
    /// the next `poll`, refused as [`Misuse`] says.
    #[inline]
    pub(crate) fn admit_recv(&mut self, conn: ConnId, mut rx: RxBuf) -> Option<(usize, RxBuf)> {
        let idx = conn.0 as usize;
        let refusal = match self.table.get(idx) {
            None => Misuse::NoConnection,
            Some(s) if s.closing => Misuse::Closing,
            Some(s) if s.recv.busy() => {
                debug_assert!(false, "two receives in flight on {conn:?}");
                Misuse::Busy
            }
            Some(_) if rx.spare_mut().is_empty() => Misuse::NoRoom,
            Some(_) => return Some((idx, rx)),
        };
        self.defer(Event::Recv {
            conn,
            rx,
            result: Err(refusal.error()),
        });
        None
    }

    // ----- events produced outside poll -----------------------------------------------

    /// Queues an event for the next `poll`.
    #[inline]
    pub(crate) fn defer(&mut self, ev: Event) {
        self.deferred.push_back(ev);
    }

    /// Queues `Closed` for slot `idx`, whose connection has nothing left in flight; the
    /// slot is freed when the event is delivered.
    pub(crate) fn defer_closed(&mut self, idx: usize) {
        self.leave_direct(idx);
        self.defer(Event::Closed {
            conn: ConnId(idx as u32),
        });
    }

    /// Frees slot `idx` now and reports its `Closed` in `out` (from inside `poll`).
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) fn release(&mut self, idx: usize, out: &mut Vec<Event>) {
        if self.remove(idx).is_some() {
            out.push(Event::Closed {
                conn: ConnId(idx as u32),
            });
        }
    }

    /// Whether events wait to be delivered.
    #[inline]
    pub(crate) fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// Moves the deferred events into `out`, first thing in `poll`. A `Closed` frees its
    /// slot now that the caller hears about it.
    #[inline]
    pub(crate) fn deliver(&mut self, out: &mut Vec<Event>) {
        while let Some(ev) = self.deferred.pop_front() {
            if let Event::Closed { conn } = ev {
                self.remove(conn.0 as usize);
            }
            out.push(ev);
        }
    }

    // ----- the direct-receive set ------------------------------------------------------

    /// The slots whose receive is in the direct set.
    #[inline]
    pub(crate) fn direct(&self) -> &[usize] {
        &self.direct
    }

    /// Whether the direct set has room under its limit.
    #[inline]
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) fn direct_has_room(&self) -> bool {
        self.direct.len() < self.direct_max
    }

    /// Whether the direct set is within its limit (so trying each member directly is
    /// cheaper than asking the kernel which are ready).
    #[inline]
    #[cfg_attr(not(feature = "epoll"), allow(dead_code))]
    pub(crate) fn direct_within_limit(&self) -> bool {
        self.direct.len() <= self.direct_max
    }

    /// Adds slot `idx`'s receive to the direct set (once).
    #[inline]
    pub(crate) fn join_direct(&mut self, idx: usize) {
        let at = self.direct.len();
        if let Some(s) = self.table.get_mut(idx) {
            if s.recv.direct_at.is_none() {
                s.recv.direct_at = Some(at);
                self.direct.push(idx);
            }
        }
    }

    /// Takes slot `idx`'s receive out of the direct set (if it is there).
    #[inline]
    pub(crate) fn leave_direct(&mut self, idx: usize) {
        let Some(at) = self
            .table
            .get_mut(idx)
            .and_then(|s| s.recv.direct_at.take())
        else {
            return;
        };
        self.direct.swap_remove(at);
        if let Some(&moved) = self.direct.get(at) {
            if let Some(s) = self.table.get_mut(moved) {
                s.recv.direct_at = Some(at);
            }
        }
    }
}

impl<C> std::ops::Index<usize> for Slots<C> {
    type Output = Slot<C>;
    fn index(&self, idx: usize) -> &Slot<C> {
        &self.table[idx]
    }
}

impl<C> std::ops::IndexMut<usize> for Slots<C> {
    fn index_mut(&mut self, idx: usize) -> &mut Slot<C> {
        &mut self.table[idx]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trip() {
        let t = token(3, 123_456, 0xabcdef);
        assert_eq!(untoken(t), (3, 123_456, 0xabcdef));
        let t = token(5, u32::MAX as usize, GEN_MASK + 5);
        assert_eq!(untoken(t), (5, u32::MAX as usize, 4));
    }

    #[test]
    fn reused_slot_gets_a_new_generation() {
        let mut s: Slots<()> = Slots::new();
        let a = s.insert((), None);
        let gen = s[a].gen;
        s.defer_closed(a);
        let mut out = Vec::new();
        s.deliver(&mut out);
        assert!(matches!(out[..], [Event::Closed { conn }] if conn == ConnId(a as u32)));
        let b = s.insert((), None);
        assert_eq!(a, b, "slab reuses the freed slot");
        assert!(s.tagged(b, gen).is_none(), "stale token accepted");
        assert!(s.tagged(b, s[b].gen).is_some());
    }

    #[test]
    fn direct_set_keeps_positions_when_members_leave() {
        let mut s: Slots<()> = Slots::new();
        let ids: Vec<usize> = (0..5).map(|_| s.insert((), None)).collect();
        for &i in &ids {
            s.join_direct(i);
            s.join_direct(i);
        }
        assert_eq!(s.direct().len(), 5);
        s.leave_direct(ids[1]);
        s.leave_direct(ids[1]);
        for (at, &i) in s.direct().iter().enumerate() {
            assert_eq!(s[i].recv.direct_at, Some(at));
        }
        assert!(!s.direct().contains(&ids[1]));
        s.remove(ids[0]);
        assert_eq!(s.direct().len(), 3);
        for (at, &i) in s.direct().iter().enumerate() {
            assert_eq!(s[i].recv.direct_at, Some(at));
        }
    }

    #[test]
    fn misuse_is_answered_with_one_errno_per_case() {
        let mut s: Slots<()> = Slots::new();
        let idx = s.insert((), None);
        let conn = ConnId(idx as u32);
        let mut b = TxBatch::default();
        b.push_copy(b"x");
        assert!(s.admit_send(ConnId(99), b).is_none());
        s.admit_recv(ConnId(99), RxBuf::cache(64));
        s[idx].closing = true;
        let mut b = TxBatch::default();
        b.push_copy(b"x");
        assert!(s.admit_send(conn, b).is_none());
        let mut out = Vec::new();
        s.deliver(&mut out);
        let errnos: Vec<i32> = out
            .iter()
            .map(|e| match e {
                Event::Sent { result, .. } => result.as_ref().unwrap_err().raw_os_error(),
                Event::Recv { result, .. } => result.as_ref().unwrap_err().raw_os_error(),
                other => panic!("unexpected {other:?}"),
            })
            .map(Option::unwrap)
            .collect();
        assert_eq!(errnos, [libc::ENOTCONN, libc::ENOTCONN, libc::ECANCELED]);
    }
}
