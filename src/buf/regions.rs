//! Registered regions: memory of the caller's that peers may write into (one-sided
//! puts) or read (gets), [`Regions`], the [`Claim`] a receive holds on a part of one, and
//! the bytes a get's reply lends from one ([`Regions::lend`]). No I/O here.

use std::ptr::NonNull;
use std::sync::Arc;

use bytes::Bytes;

/// Memory of the caller's that peers may write into (one-sided puts): each region is
/// named by a key, an index and a generation, so a key outlives nothing: once its region
/// is deregistered, the key (and every later user of its slot with an older key) is
/// refused. Only [`register`](Self::register) is unsafe; every write a peer asks for is
/// checked against the region here ([`claim`](Self::claim)).
#[derive(Debug, Default)]
pub struct Regions {
    slots: Vec<Region>,
    free: Vec<u32>,
    live: usize,
}

#[derive(Debug, Default)]
struct Region {
    base: usize,
    len: usize,
    generation: u32,
    live: bool,
    /// What peers may do with it.
    access: Access,
    /// Cloned into every claim and every lent reply: while a clone lives, a receive may
    /// write to the region or a send read from it. Kept with the slot, so reusing a slot
    /// allocates nothing.
    lease: Arc<()>,
}

/// What peers may do with a registered region. The replies of our own gets may land in
/// a region of any access (each one checked against the get that asked for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Nothing: it only receives the replies of our own gets.
    #[default]
    Local,
    /// Peers may write into it (their puts).
    Write,
    /// Peers may read it (their gets).
    Read,
    /// Peers may read it and write into it.
    ReadWrite,
}

impl Access {
    fn peer_reads(self) -> bool {
        matches!(self, Self::Read | Self::ReadWrite)
    }

    fn peer_writes(self) -> bool {
        matches!(self, Self::Write | Self::ReadWrite)
    }
}

/// Why a region operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// The key names no live region (never handed out, or deregistered).
    #[error("no registered region has key {0:#x}")]
    UnknownKey(u64),
    /// The bytes do not lie inside the region.
    #[error("{len} bytes at {addr:#x} do not lie inside region {key:#x}")]
    OutOfBounds {
        /// The region's key.
        key: u64,
        /// First byte asked for.
        addr: u64,
        /// Bytes asked for.
        len: u64,
    },
    /// A receive is still writing into the region, or a peer's get still reading it: it
    /// may not be taken back yet.
    #[error("region {0:#x} is being written by a receive or read by a get in progress")]
    InUse(u64),
    /// A peer asked to read a region that peers may not read.
    #[error("region {0:#x} may not be read by peers")]
    NotReadable(u64),
    /// A peer asked to write into a region that peers may not write into.
    #[error("region {0:#x} may not be written by peers")]
    NotWritable(u64),
}

impl Regions {
    /// Registers `len` bytes at `base` and returns the key peers name them by; `access`
    /// says what peers may do with them.
    ///
    /// # Safety
    ///
    /// The memory must stay valid for reads and writes, and must not be read or written by
    /// anyone else while a peer may write it, nor written while a peer may read it: from
    /// this call until [`deregister`](Self::deregister) returns `Ok` for the key, or the
    /// `Regions` (and every receive buffer placed in it, and every reply lent from it) is
    /// dropped. Within that time, what arrives for it may change it at any point during
    /// [`progress`-like](crate::Transport::progress) calls of its owner.
    #[allow(unsafe_code)]
    pub unsafe fn register(&mut self, base: NonNull<u8>, len: usize, access: Access) -> u64 {
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.slots.push(Region::default());
                self.slots.len() - 1
            }
        };
        let r = &mut self.slots[i];
        r.base = base.as_ptr() as usize;
        r.len = len;
        r.live = true;
        r.access = access;
        self.live += 1;
        key(i, r.generation)
    }

    /// Takes a region back. Refused while a receive is still writing into it or a reply
    /// lent from it is still being sent (the caller keeps the memory valid and tries again
    /// after a progress call).
    pub fn deregister(&mut self, key: u64) -> Result<(), RegionError> {
        let (i, r) = self.find(key)?;
        if Arc::strong_count(&r.lease) > 1 {
            return Err(RegionError::InUse(key));
        }
        let r = &mut self.slots[i];
        r.live = false;
        r.generation = r.generation.wrapping_add(1);
        self.free.push(i as u32);
        self.live -= 1;
        Ok(())
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when no region is registered.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Checks that `len` bytes at `addr` lie inside the region of `key` (and, for a
    /// peer's put, `by_peer`, that peers may write it) and claims them for one receive
    /// ([`RxBuf::split_placed`](super::RxBuf::split_placed)).
    pub fn claim(
        &self,
        key: u64,
        addr: u64,
        len: usize,
        by_peer: bool,
    ) -> Result<Claim, RegionError> {
        let (ptr, r) = self.locate(key, addr, len)?;
        if by_peer && !r.access.peer_writes() {
            return Err(RegionError::NotWritable(key));
        }
        Ok(Claim {
            ptr,
            len,
            _lease: Lease::Region(r.lease.clone()),
        })
    }

    /// Checks that `len` bytes at `addr` lie inside the region of `key` and that peers
    /// may read it, and returns them as bytes that borrow the region (no copy): the region
    /// is in use until the bytes, and every clone of them, are dropped.
    pub fn lend(&self, key: u64, addr: u64, len: usize) -> Result<Bytes, RegionError> {
        let (ptr, r) = self.locate(key, addr, len)?;
        if !r.access.peer_reads() {
            return Err(RegionError::NotReadable(key));
        }
        Ok(Bytes::from_owner(Loan {
            ptr,
            len,
            _lease: r.lease.clone(),
        }))
    }

    /// The first of `len` bytes at `addr` inside the region of `key`, and the region.
    fn locate(
        &self,
        key: u64,
        addr: u64,
        len: usize,
    ) -> Result<(NonNull<u8>, &Region), RegionError> {
        let (_, r) = self.find(key)?;
        let oob = RegionError::OutOfBounds {
            key,
            addr,
            len: len as u64,
        };
        let off = addr.checked_sub(r.base as u64).ok_or(oob)?;
        let end = off.checked_add(len as u64).ok_or(oob)?;
        if end > r.len as u64 {
            return Err(oob);
        }
        let ptr = NonNull::new((r.base + off as usize) as *mut u8).ok_or(oob)?;
        Ok((ptr, r))
    }

    fn find(&self, key: u64) -> Result<(usize, &Region), RegionError> {
        let (i, generation) = ((key >> 32) as usize, key as u32);
        match self.slots.get(i) {
            Some(r) if r.live && r.generation == generation => Ok((i, r)),
            _ => Err(RegionError::UnknownKey(key)),
        }
    }
}

fn key(index: usize, generation: u32) -> u64 {
    ((index as u64) << 32) | u64::from(generation)
}

/// Bytes of a registered region, checked and claimed for one receive
/// ([`Regions::claim`]); the region is in use while the claim lives. Or the whole of
/// memory the engine owns ([`Claim::owned`]), kept alive while the claim lives.
#[derive(Debug)]
pub struct Claim {
    ptr: NonNull<u8>,
    pub(super) len: usize,
    _lease: Lease,
}

/// What keeps a claim's memory valid: held for its drop, never read.
#[derive(Debug)]
#[allow(dead_code)]
enum Lease {
    /// A registered region's lease: `deregister` refuses while it lives.
    Region(Arc<()>),
    /// The memory itself.
    Owned(Arc<OwnedMem>),
}

/// Memory of the engine's own that receives write into through claims
/// ([`Claim::owned`]): a message assembled from the pieces it was cut into. Zeroed when
/// made, freed when the last holder drops it.
#[derive(Debug)]
pub struct OwnedMem {
    ptr: NonNull<u8>,
    len: usize,
}

impl OwnedMem {
    /// `len` zeroed bytes.
    pub fn zeroed(len: usize) -> Arc<Self> {
        let b = vec![0u8; len].into_boxed_slice();
        let len = b.len();
        let ptr = NonNull::new(Box::into_raw(b).cast::<u8>()).expect("a box is never null");
        Arc::new(Self { ptr, len })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Memory of the same length whose first `n` bytes are a copy of these. The caller
    /// knows that no claim writes below `n` meanwhile.
    #[allow(unsafe_code)]
    pub fn copy_prefix(&self, n: usize) -> Arc<Self> {
        let n = n.min(self.len);
        let copy = Self::zeroed(self.len);
        // SAFETY: both ranges lie inside live allocations of at least `n` bytes (`copy` is
        // new and not shared yet); the caller guarantees that nothing writes the first
        // `n` bytes of `self` during the copy.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), copy.ptr.as_ptr(), n) };
        copy
    }
}

impl Drop for OwnedMem {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are those of the boxed slice `zeroed` leaked; this is the
        // only place that takes it back, once, when the last holder goes.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        });
    }
}

// SAFETY: the memory is plain bytes owned by this value; it is written only through a
// claim's `mem_mut` (one receive at a time, see `Claim::owned`) and read through
// `mem`, from whichever thread holds the claim.
#[allow(unsafe_code)]
unsafe impl Send for OwnedMem {}
// SAFETY: as for `Send`: shared holders only keep the memory alive.
#[allow(unsafe_code)]
unsafe impl Sync for OwnedMem {}

/// The owner of the bytes [`Regions::lend`] returns: a readable part of a region, in use
/// while this lives.
struct Loan {
    ptr: NonNull<u8>,
    len: usize,
    _lease: Arc<()>,
}

// SAFETY: a `Loan` only reads `ptr .. ptr + len`, which lies inside a region registered
// with `Regions::register`, whose contract keeps the memory valid and unwritten by anyone
// while a lease on the region lives (`deregister` refuses meanwhile), from whichever
// thread the bytes end up on.
#[allow(unsafe_code)]
unsafe impl Send for Loan {}

impl AsRef<[u8]> for Loan {
    #[allow(unsafe_code)]
    fn as_ref(&self) -> &[u8] {
        // SAFETY: as for `Send` above: the bytes lie inside a live registered region that
        // nobody writes while this lease lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Claim {
    /// The whole of `mem`, for one receive. The caller hands claims of one memory to one
    /// receive at a time (`proto::part::Parts`: the next piece of a message is claimed
    /// only once the one before was taken).
    pub fn owned(mem: &Arc<OwnedMem>) -> Self {
        Self {
            ptr: mem.ptr,
            len: mem.len,
            _lease: Lease::Owned(mem.clone()),
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it claims no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[allow(unsafe_code)]
    pub(crate) fn mem(&self) -> &[u8] {
        // SAFETY: `ptr .. ptr + len` lies inside a region registered with
        // `Regions::register`, whose contract keeps it valid and untouched by others while
        // a claim on it lives (`deregister` refuses meanwhile), or is the whole of an
        // `OwnedMem` the claim keeps alive.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    #[allow(unsafe_code)]
    pub(crate) fn mem_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `mem`; `&mut self` makes this the only borrow through the claim,
        // and claims of one region (or owned memory) are handed to one receive at a time
        // per connection.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::RxBuf;

    /// A region is in use while a buffer placed in it lives; a key dies with its
    /// registration, also when the slot is reused.
    #[test]
    #[allow(unsafe_code)]
    fn regions_check_claims_and_keys() {
        let mut mem = vec![0u8; 64].into_boxed_slice();
        let base = NonNull::new(mem.as_mut_ptr()).unwrap();
        let addr = base.as_ptr() as u64;
        let mut regions = Regions::default();
        // SAFETY: `mem` outlives `regions` and every buffer placed in it here.
        let k = unsafe { regions.register(base, 64, Access::Write) };
        assert_eq!(regions.len(), 1);
        assert!(regions.claim(k, addr + 60, 5, true).is_err());
        let mut cache = RxBuf::cache(16);
        cache.append_upto(b"abc", 3);
        let claim = regions.claim(k, addr + 8, 10, true).unwrap();
        let mut placed = cache.split_placed(0, claim, RxBuf::empty_large());
        assert!(placed.is_placed() && placed.wants_all());
        assert_eq!(placed.missing(), 7);
        assert_eq!(regions.deregister(k), Err(RegionError::InUse(k)));
        // Reset, the buffer keeps its box for the next put and ends its claim.
        placed.reset_whole();
        assert!(!placed.is_placed() && !placed.wants_all());
        assert_eq!(&mem[8..11], b"abc");
        regions.deregister(k).unwrap();
        assert!(regions.is_empty());
        assert_eq!(regions.deregister(k), Err(RegionError::UnknownKey(k)));
        // SAFETY: as above.
        let k2 = unsafe { regions.register(base, 64, Access::Write) };
        assert_ne!(k, k2, "a reused slot gets a new key");
        assert!(matches!(
            regions.claim(k, addr, 1, true),
            Err(RegionError::UnknownKey(_))
        ));
        assert!(regions.claim(k2, addr, 64, true).is_ok());
    }
}
