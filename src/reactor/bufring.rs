//! Provided buffers: the memory of an io_uring buffer ring (`IORING_REGISTER_PBUF_RING`)
//! and the [`ProvidedBuf`] handle through which a filled buffer is lent to the caller.
//!
//! Layout (the kernel's `struct io_uring_buf_ring`): an array of `entries` 16-byte
//! descriptors `{ addr: u64, len: u32, bid: u16, resv: u16 }`, where the `resv` field of
//! descriptor 0 (byte offset 14) is the ring's *tail*. User space owns the tail and writes
//! descriptors at `tail & mask`; the kernel keeps the head to itself and consumes one
//! descriptor per buffer it fills, reporting the buffer id in the CQE.
//!
//! Ownership protocol, which every `unsafe` below relies on:
//! - there are exactly as many buffers as ring slots, so publishing a buffer at the tail
//!   never overwrites a descriptor the kernel has not consumed yet;
//! - a buffer id the kernel reported in a CQE is not in the ring: the kernel does not
//!   touch that buffer again until user space adds it back. The backend wraps each such id
//!   in one [`ProvidedBuf`] (unique, neither `Clone` nor `Send`), and only that handle's
//!   `Drop` adds it back. So while a `ProvidedBuf` lives, its bytes are stable and shared
//!   with nobody;
//! - both mappings (descriptors and buffers) are owned by [`BufPool`], which every
//!   `ProvidedBuf` keeps alive through an `Rc`: the memory is unmapped only when the
//!   backend *and* every outstanding buffer are gone. The backend unregisters the ring
//!   after draining every receive that may select from it, and leaks the pool if that
//!   drain timed out.
//!
//! Both mappings are anonymous, page-aligned (`mmap`) and marked `MADV_DONTFORK`, so a
//! `fork` in the application (a launcher spawning child processes) does not make the parent's
//! pages copy-on-write under the kernel's feet. The kernel pins the descriptor page while
//! the ring is registered (`RLIMIT_MEMLOCK` accounting on kernels before 5.12); the data
//! buffers are ordinary memory written with `copy_to_user`, not pinned.

#![allow(unsafe_code)]
// Only the io_uring backend lends provided buffers; an epoll-only build keeps the types
// (they appear in the shared `Event`) but never creates a pool.
#![cfg_attr(not(feature = "uring"), allow(dead_code))]

use std::cell::Cell;
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};

/// Size of one ring descriptor (`struct io_uring_buf`).
const DESC_LEN: usize = 16;
/// Byte offset of the tail inside descriptor 0.
const TAIL_OFFSET: usize = 14;

/// Geometry of the provided-buffer ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingGeometry {
    /// Number of buffers: a power of two in `1..=32768` (the kernel's limit).
    pub(crate) count: u16,
    /// Bytes per buffer.
    pub(crate) size: u32,
}

impl RingGeometry {
    /// Checks the limits the kernel enforces, with a message naming the bad value.
    pub(crate) fn check(&self) -> io::Result<()> {
        if self.count == 0 || !self.count.is_power_of_two() || self.count > 32768 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "provided-buffer count {} must be a power of two in 1..=32768",
                    self.count
                ),
            ));
        }
        if self.size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "provided-buffer size must not be zero",
            ));
        }
        Ok(())
    }
}

/// An anonymous private mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// Maps `len` zeroed, page-aligned bytes excluded from `fork`.
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing
        // aliases no existing memory; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(io::Error::other("mmap returned a null mapping"));
        };
        let m = Self { ptr, len };
        // SAFETY: `ptr..ptr+len` is the mapping created just above and owned by `m`.
        if unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(m)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `Mapping::new` with this length and nothing
        // refers to it any more: its owner (`BufPool`) is dropped only when the backend
        // and every `ProvidedBuf` are gone, after the ring was unregistered (or never,
        // when the backend leaks the pool because a receive did not drain).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The descriptor ring and the buffers it hands to the kernel.
pub(crate) struct BufPool {
    ring: Mapping,
    bufs: Mapping,
    geo: RingGeometry,
    /// User space's copy of the tail (the kernel only reads the shared one).
    tail: Cell<u16>,
    /// Buffers currently lent to the caller as [`ProvidedBuf`]s.
    out: Cell<u32>,
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("geo", &self.geo)
            .field("out", &self.out.get())
            .finish_non_exhaustive()
    }
}

impl BufPool {
    /// Maps the descriptor ring and the buffers and publishes every buffer. The caller
    /// registers [`ring_addr`](Self::ring_addr) with the kernel.
    pub(crate) fn new(geo: RingGeometry) -> io::Result<Rc<Self>> {
        geo.check()?;
        let ring = Mapping::new(usize::from(geo.count) * DESC_LEN)?;
        let total = usize::from(geo.count)
            .checked_mul(geo.size as usize)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "ring too large"))?;
        let bufs = Mapping::new(total)?;
        let pool = Self {
            ring,
            bufs,
            geo,
            tail: Cell::new(0),
            out: Cell::new(0),
        };
        for bid in 0..geo.count {
            pool.publish(bid);
        }
        Ok(Rc::new(pool))
    }

    /// Address of the descriptor ring, for `IORING_REGISTER_PBUF_RING`.
    pub(crate) fn ring_addr(&self) -> u64 {
        self.ring.ptr.as_ptr() as u64
    }

    /// The ring's geometry.
    pub(crate) fn geometry(&self) -> RingGeometry {
        self.geo
    }

    /// Buffers lent to the caller and not returned yet.
    #[cfg(test)]
    pub(crate) fn lent(&self) -> u32 {
        self.out.get()
    }

    /// Whether at least one buffer is not lent out (it is in the ring, or on its way back
    /// in a CQE not reaped yet): a receive that ran out of buffers may be re-armed.
    pub(crate) fn has_spare(&self) -> bool {
        self.out.get() < u32::from(self.geo.count)
    }

    /// Wraps buffer `bid`, just reported filled with `len` bytes by a CQE, for the
    /// caller. `None` if the kernel reported an id or length outside the ring (never
    /// expected; the buffer is then not touched).
    pub(crate) fn lend(self: &Rc<Self>, bid: u16, len: usize) -> Option<ProvidedBuf> {
        if bid >= self.geo.count || len > self.geo.size as usize {
            return None;
        }
        self.out.set(self.out.get() + 1);
        // Invariant: `bid < count`, so the offset is inside the buffer mapping.
        let off = usize::from(bid) * self.geo.size as usize;
        // SAFETY: `off + size <= bufs.len` (checked just above), so the pointer stays in
        // the mapping and is not null.
        let ptr = unsafe { NonNull::new_unchecked(self.bufs.ptr.as_ptr().add(off)) };
        Some(ProvidedBuf {
            pool: Rc::clone(self),
            bid,
            ptr,
            len,
        })
    }

    /// Returns a buffer the kernel consumed without it reaching the caller (a completion
    /// for a connection being closed).
    pub(crate) fn give_back(&self, bid: u16) {
        if bid < self.geo.count {
            self.publish(bid);
        }
    }

    /// Writes buffer `bid`'s descriptor at the tail slot and publishes the new tail.
    fn publish(&self, bid: u16) {
        let tail = self.tail.get();
        let slot = usize::from(tail & (self.geo.count - 1));
        let addr = self.bufs.ptr.as_ptr() as u64 + u64::from(bid) * u64::from(self.geo.size);
        let base = self.ring.ptr.as_ptr();
        // SAFETY: `slot < count`, so the descriptor lies inside the ring mapping. The slot
        // is free: the ring holds `count` slots and `count` buffers, and `bid` is not in
        // the ring (it was just lent or never published), so at most `count - 1`
        // descriptors are unconsumed and the kernel reads none past the old tail. Only the
        // `addr`, `len` and `bid` fields are written; `resv` of slot 0 is the tail, written
        // below as an atomic.
        unsafe {
            let d = base.add(slot * DESC_LEN);
            d.cast::<u64>().write(addr);
            d.add(8).cast::<u32>().write(self.geo.size);
            d.add(12).cast::<u16>().write(bid);
        }
        let tail = tail.wrapping_add(1);
        self.tail.set(tail);
        // SAFETY: offset 14 of the page-aligned ring mapping is 2-byte aligned and inside
        // it; the kernel reads the tail with an acquire load, so the release store orders
        // the descriptor writes above before it (liburing's `io_uring_buf_ring_advance`).
        let shared = unsafe { &*base.add(TAIL_OFFSET).cast::<AtomicU16>() };
        shared.store(tail, Ordering::Release);
    }
}

/// A filled provided buffer, lent to the caller by [`Event::RecvProvided`](super::Event).
///
/// The bytes stay valid and unchanged while the handle lives: the kernel does not write
/// into a buffer until it is back in the ring, and only this handle puts it back, when it
/// is dropped: giving a buffer back is dropping it. Holding many buffers starves the
/// ring, and the connections waiting for buffers resume once some come back.
pub(crate) struct ProvidedBuf {
    pool: Rc<BufPool>,
    bid: u16,
    ptr: NonNull<u8>,
    len: usize,
}

impl ProvidedBuf {
    /// The received bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies inside the pool's buffer mapping (checked in
        // `lend`), which `self.pool` keeps mapped. The kernel wrote these bytes before
        // posting the CQE that was reaped (the CQ tail is read with acquire ordering) and
        // will not write buffer `bid` again until `Drop` below adds it back to the ring,
        // which cannot happen while this borrow of `self` lives. Nothing else in user
        // space writes it: this handle is the only one for `bid`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer id reported by the kernel.
    #[cfg(test)]
    pub(crate) fn id(&self) -> u16 {
        self.bid
    }

    /// Number of bytes received.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ProvidedBuf {
    fn drop(&mut self) {
        self.pool.out.set(self.pool.out.get().saturating_sub(1));
        self.pool.publish(self.bid);
    }
}

impl fmt::Debug for ProvidedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProvidedBuf")
            .field("bid", &self.bid)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(p: &BufPool) -> u16 {
        // SAFETY: test-only read of the tail inside the live ring mapping.
        unsafe { &*p.ring.ptr.as_ptr().add(TAIL_OFFSET).cast::<AtomicU16>() }
            .load(Ordering::Acquire)
    }

    #[test]
    fn geometry_limits() {
        assert!(RingGeometry {
            count: 3,
            size: 4096
        }
        .check()
        .is_err());
        assert!(RingGeometry {
            count: 0,
            size: 4096
        }
        .check()
        .is_err());
        assert!(RingGeometry { count: 4, size: 0 }.check().is_err());
        assert!(RingGeometry {
            count: 4,
            size: 4096
        }
        .check()
        .is_ok());
    }

    /// Lending and dropping keeps the count and advances the tail once per return; the
    /// descriptors name the right buffers.
    #[test]
    fn lend_and_return() {
        let p = BufPool::new(RingGeometry {
            count: 4,
            size: 4096,
        })
        .unwrap();
        assert_eq!(tail(&p), 4);
        assert_eq!(p.ring_addr() % 4096, 0);
        let b = p.lend(2, 100).unwrap();
        assert_eq!((b.id(), b.len(), b.bytes().len()), (2, 100, 100));
        assert_eq!(p.lent(), 1);
        assert!(p.lend(4, 1).is_none());
        assert!(p.lend(0, 4097).is_none());
        drop(b);
        assert_eq!(p.lent(), 0);
        assert_eq!(tail(&p), 5);
        // SAFETY: test-only read of descriptor 0 (slot of tail 4) in the live mapping.
        let (addr, bid) = unsafe {
            let d = p.ring.ptr.as_ptr();
            (d.cast::<u64>().read(), d.add(12).cast::<u16>().read())
        };
        assert_eq!(bid, 2);
        assert_eq!(addr, p.bufs.ptr.as_ptr() as u64 + 2 * 4096);
        assert!(p.has_spare());
    }

    /// A lent buffer keeps the memory mapped after the pool's other owner is gone.
    #[test]
    fn buffer_outlives_pool_handle() {
        let p = BufPool::new(RingGeometry { count: 2, size: 64 }).unwrap();
        let b = p.lend(1, 64).unwrap();
        drop(p);
        assert_eq!(b.bytes(), &[0u8; 64][..]);
    }
}
