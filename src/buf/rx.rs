//! Receive buffers: [`RxBuf`], a cache that a read may bring any number of records into,
//! or a whole buffer for one record (its own memory, growing as the bytes arrive, or a
//! registered region's). No I/O here.

use std::ops::Range;

use super::regions::Claim;

/// A receive buffer: the kernel writes into [`spare_mut`](Self::spare_mut), the owner
/// consumes received bytes from the front.
///
/// Two shapes: a *cache* (a read may bring any number of records; the unconsumed tail is
/// moved to the front by [`compact`](Self::compact)), and a *whole* buffer for one record
/// of `target` bytes, that a read may fill completely ([`wants_all`](Self::wants_all),
/// `MSG_WAITALL`). A whole buffer's memory grows as the record's bytes arrive, not on the
/// word of its header: its read window (`limit`) starts at most [`WHOLE_FIRST`] bytes
/// (or what a reused buffer already holds) and doubles, up to `target`, each time it is
/// filled ([`grow_whole`](Self::grow_whole)), so a record costs at most about twice the
/// bytes that actually arrived.
///
/// A whole buffer may also be *placed*: its memory is a registered region of the
/// caller's, not its own ([`split_placed`](Self::split_placed)), so the kernel writes the
/// record straight where the caller wants it.
///
/// An idle whole buffer may serve as a cache of the size of the record it last held
/// ([`reuse_as_cache`](Self::reuse_as_cache)), so that the next record of that size comes
/// in with its header, by one read, and is consumed where it lies; a record that turns out
/// larger becomes, in place, a whole buffer whose record starts behind its header
/// ([`cache_into_whole`](Self::cache_into_whole)).
///
/// Invariants: `pos <= filled <= limit <= ` the memory's length; for a whole buffer
/// `base <= pos` and `limit <= base + target` (its record lies at `base..base + target`);
/// bytes `pos..filled` are received but not yet consumed. Nothing here allocates except
/// [`cache`](Self::cache) and [`empty_large`](Self::empty_large) (the box),
/// [`grow`](Self::grow), [`split_whole`](Self::split_whole),
/// [`grow_whole`](Self::grow_whole), [`reuse_as_cache`](Self::reuse_as_cache) and
/// [`cache_into_whole`](Self::cache_into_whole) growing a reused buffer to a larger record
/// than it held before.
///
/// The buffer is a box around its state, so that handing it between the engine, the
/// backend and the events (every receive does, several times) moves a pointer.
#[derive(Debug)]
pub struct RxBuf(Box<RxState>);

/// What an [`RxBuf`] holds.
#[derive(Debug)]
struct RxState {
    data: Vec<u8>,
    /// Memory of a registered region, claimed for one record (then `data` is empty).
    placed: Option<Claim>,
    pos: usize,
    filled: usize,
    limit: usize,
    /// For a whole buffer: the record's length.
    target: usize,
    /// For a whole buffer: where its record starts (0 unless it was a cache,
    /// [`cache_into_whole`](RxBuf::cache_into_whole), or the record has a place in the line).
    base: usize,
    /// For a whole buffer: the address its record starts at, modulo [`LINE`], if the
    /// owner asked for one (kept when the memory grows).
    at: Option<usize>,
    /// For a cache: where its reads start when it holds nothing (0 unless the owner asked
    /// for records at a place in the line, [`reuse_as_cache`](RxBuf::reuse_as_cache)).
    origin: usize,
    /// The next read may fill the spare region completely ([`fill_next_read`](RxBuf::fill_next_read)).
    fill: bool,
    /// For a whole buffer: the owner's note on what it holds (opaque here).
    whole: Option<u64>,
    /// The next read brings at most this many bytes ([`cap_next_read`](RxBuf::cap_next_read));
    /// cleared by the [`commit`](RxBuf::commit) of that read.
    read_cap: Option<usize>,
}

impl RxState {
    /// No memory, no record: an idle buffer.
    const IDLE: Self = Self {
        data: Vec::new(),
        placed: None,
        pos: 0,
        filled: 0,
        limit: 0,
        target: 0,
        base: 0,
        at: None,
        origin: 0,
        fill: false,
        whole: None,
        read_cap: None,
    };
}

impl RxBuf {
    /// A cache of `capacity` bytes (zeroed once, here).
    pub fn cache(capacity: usize) -> Self {
        Self(Box::new(RxState {
            data: vec![0; capacity],
            limit: capacity,
            ..RxState::IDLE
        }))
    }

    /// An empty buffer for whole records (grows on first use, then is reused).
    pub fn empty_large() -> Self {
        Self(Box::new(RxState::IDLE))
    }

    /// The region the next read may fill. Empty only when a whole buffer is full.
    #[inline]
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let end = match self.0.read_cap {
            Some(n) => (self.0.filled + n).min(self.0.limit),
            None => self.0.limit,
        };
        let filled = self.0.filled;
        &mut self.mem_mut()[filled..end]
    }

    /// Records that a read wrote `n` bytes at the start of [`spare_mut`](Self::spare_mut).
    #[inline]
    pub fn commit(&mut self, n: usize) {
        self.0.filled = (self.0.filled + n).min(self.0.limit);
        self.0.read_cap = None;
    }

    /// Makes the next read (only that one) bring at most `n` bytes (at least 1): a cache
    /// whose owner expects a record too large for it reads that record's header alone,
    /// and its payload then goes straight into a buffer of its own rather than through
    /// the cache and a copy.
    #[inline]
    pub fn cap_next_read(&mut self, n: usize) {
        self.0.read_cap = Some(n.max(1));
    }

    /// True for a whole buffer: the reactor may ask the kernel to fill it completely
    /// (`MSG_WAITALL`), since no other record shares it.
    #[inline]
    pub fn wants_all(&self) -> bool {
        self.0.whole.is_some()
    }

    /// Whether the reactor may fill the spare region completely with one receive
    /// (`MSG_WAITALL`): a whole buffer, or a cache whose owner said that its spare region
    /// belongs to one record ([`fill_next_read`](Self::fill_next_read)).
    #[inline]
    pub fn fills(&self) -> bool {
        self.0.whole.is_some() || self.0.fill
    }

    /// Lets the reads fill the spare region completely until the record in progress is
    /// consumed: the owner knows that every byte up to the end of the region belongs to
    /// that record (once [`compact`](Self::compact)ed to the front).
    #[inline]
    pub fn fill_next_read(&mut self) {
        self.0.fill = true;
    }

    /// For a whole buffer: bytes still to arrive (0 for a cache).
    pub fn missing(&self) -> usize {
        if self.0.whole.is_some() {
            self.0.base + self.0.target - self.0.filled
        } else {
            0
        }
    }

    /// How many bytes the buffer can hold at once: its read window (for a cache, the
    /// longest record it can hold).
    #[inline]
    pub fn room(&self) -> usize {
        self.0.limit - self.0.origin
    }

    /// Where the unconsumed bytes start, counted from where the buffer's reads start when it
    /// holds nothing (0: they are at its front).
    #[inline]
    pub fn unread_at(&self) -> usize {
        self.0.pos - self.0.origin
    }

    /// Received bytes not yet consumed.
    #[inline]
    pub fn pending(&self) -> usize {
        self.0.filled - self.0.pos
    }

    /// The received bytes not yet consumed.
    #[inline]
    pub fn unread(&self) -> &[u8] {
        &self.mem()[self.0.pos..self.0.filled]
    }

    /// Consumes `n` unread bytes (at most [`pending`](Self::pending)) and returns where
    /// they lie, for [`bytes`](Self::bytes).
    #[inline]
    pub fn consume(&mut self, n: usize) -> Range<usize> {
        let start = self.0.pos;
        self.0.pos += n.min(self.pending());
        self.0.fill = false;
        start..self.0.pos
    }

    /// Bytes of a range handed out by [`consume`](Self::consume) (valid until the next
    /// call that mutates).
    #[inline]
    pub fn bytes(&self, r: Range<usize>) -> &[u8] {
        &self.mem()[r]
    }

    /// Capacity of the buffer (from where its reads start).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.mem().len() - self.0.origin
    }

    /// The buffer's memory: its own, or the registered region it was placed in.
    #[inline]
    fn mem(&self) -> &[u8] {
        match &self.0.placed {
            None => &self.0.data,
            Some(c) => c.mem(),
        }
    }

    #[inline]
    fn mem_mut(&mut self) -> &mut [u8] {
        match &mut self.0.placed {
            None => &mut self.0.data,
            Some(c) => c.mem_mut(),
        }
    }

    /// Reassembly: copies bytes from `src` until `want` bytes are pending (or `src` or
    /// the spare room runs out) and returns how many were taken. Starts from the front
    /// when nothing is pending, so a record of up to [`capacity`](Self::capacity) bytes
    /// always fits.
    pub fn append_upto(&mut self, src: &[u8], want: usize) -> usize {
        if self.0.pos == self.0.filled && self.0.whole.is_none() {
            self.0.pos = self.0.origin;
            self.0.filled = self.0.origin;
        }
        let n = want
            .saturating_sub(self.pending())
            .min(src.len())
            .min(self.0.limit - self.0.filled);
        let f = self.0.filled;
        self.mem_mut()[f..f + n].copy_from_slice(&src[..n]);
        self.0.filled += n;
        n
    }

    /// Reassembly into a whole buffer: copies as much of `src` as it still misses;
    /// returns how many bytes were taken.
    pub fn append(&mut self, src: &[u8]) -> usize {
        let n = src.len().min(self.0.limit - self.0.filled);
        let f = self.0.filled;
        self.mem_mut()[f..f + n].copy_from_slice(&src[..n]);
        self.0.filled += n;
        n
    }

    /// Moves unconsumed bytes to the front so the next read has the most room. Called
    /// once per read, after every complete record was taken.
    pub fn compact(&mut self) {
        let origin = self.0.origin;
        if self.0.pos == self.0.filled {
            self.0.pos = origin;
            self.0.filled = origin;
        } else if self.0.pos > origin {
            self.0.data.copy_within(self.0.pos..self.0.filled, origin);
            self.0.filled -= self.0.pos - origin;
            self.0.pos = origin;
        }
    }

    /// Starts a record of `len` bytes that continues in a whole buffer of its own:
    /// consumes up to `len` unread bytes of this cache into `large` (a reused buffer) and
    /// returns `large`, marked with `note` and ready to be rented to the reactor. Its
    /// first read window is what `large` already holds, or [`WHOLE_FIRST`] bytes (at most
    /// `len`); [`grow_whole`](Self::grow_whole) widens it as bytes arrive. With `at`, the
    /// record starts at an address that is `at` modulo [`LINE`] (a multiple of
    /// [`RECORD_ALIGN`]), now and after the memory grows.
    pub fn split_whole(
        &mut self,
        len: usize,
        note: u64,
        mut large: Self,
        at: Option<usize>,
    ) -> Self {
        let have = self.pending().min(len);
        let slack = if at.is_some() { LINE } else { 0 };
        let window = first_window(len, have, large.0.data.len());
        if large.0.data.len() < window + slack {
            large.0.data = vec![0; window + slack];
        }
        let base = at.map_or(0, |at| large.line_offset(0, at));
        large.0.data[base..base + have]
            .copy_from_slice(&self.0.data[self.0.pos..self.0.pos + have]);
        self.0.pos += have;
        large.0.pos = base;
        large.0.filled = base + have;
        large.0.limit = base + window;
        large.0.target = len;
        large.0.base = base;
        large.0.at = at;
        large.0.whole = Some(note);
        large.0.read_cap = None;
        large
    }

    /// The first offset at or after `from` whose address is `at` modulo [`LINE`].
    fn line_offset(&self, from: usize, at: usize) -> usize {
        let addr = self.0.data.as_ptr() as usize + from;
        from + (at + LINE - addr % LINE) % LINE
    }

    /// Like [`split_whole`](Self::split_whole), but the record goes to the memory of a
    /// registered region ([`Regions::claim`](super::Regions::claim)) rather than to a buffer of ours: consumes
    /// up to the claim's length of unread bytes of this cache into it and returns a whole
    /// buffer over it, marked with `note`, whose reads the kernel writes straight there.
    /// The buffer holds the claim until it is dropped or [`reset_whole`](Self::reset_whole),
    /// so the region is in use meanwhile ([`Regions::deregister`](super::Regions::deregister) refuses). `spare` is an idle
    /// buffer whose box is reused (its memory, if any, is freed).
    pub fn split_placed(&mut self, note: u64, claim: Claim, spare: Self) -> Self {
        let len = claim.len;
        self.split_placed_at(note, claim, 0, len, spare)
    }

    /// [`split_placed`](Self::split_placed) of a record that fills `from .. end` of the
    /// claim's memory, whose first `from` bytes are there already: the buffer's bytes are
    /// the claim's `..end` ([`whole_complete`](Self::whole_complete) gives them all once
    /// the record is in).
    pub fn split_placed_at(
        &mut self,
        note: u64,
        claim: Claim,
        from: usize,
        end: usize,
        mut spare: Self,
    ) -> Self {
        debug_assert!(from <= end && end <= claim.len);
        let have = self.pending().min(end - from);
        *spare.0 = RxState {
            placed: Some(claim),
            limit: end,
            target: end,
            whole: Some(note),
            ..RxState::IDLE
        };
        let mut placed = spare;
        placed.mem_mut()[from..from + have]
            .copy_from_slice(&self.0.data[self.0.pos..self.0.pos + have]);
        self.0.pos += have;
        placed.0.filled = from + have;
        placed
    }

    /// For a whole buffer: the length of its record.
    #[inline]
    pub fn record_len(&self) -> usize {
        self.0.target
    }

    /// For a whole buffer: where its record starts in [`bytes`](Self::bytes) (0 unless it
    /// was made by [`cache_into_whole`](Self::cache_into_whole)).
    #[inline]
    pub fn record_start(&self) -> usize {
        self.0.base
    }

    /// True for a buffer over a registered region ([`split_placed`](Self::split_placed)):
    /// once done with, it is reset (its claim ends) and only its box is reused, by the next
    /// `split_placed`.
    pub fn is_placed(&self) -> bool {
        self.0.placed.is_some()
    }

    /// For a whole buffer whose read window is full before its record is: doubles the
    /// window (at most to the record's length), growing the memory to exactly that, and
    /// returns true. Otherwise changes nothing and returns false.
    pub fn grow_whole(&mut self) -> bool {
        let end = self.0.base + self.0.target;
        if self.0.whole.is_none() || self.0.filled < self.0.limit || self.0.limit >= end {
            return false;
        }
        let grown = self
            .0
            .target
            .min(((self.0.limit - self.0.base) * 2).max(WHOLE_FIRST));
        let slack = if self.0.at.is_some() { LINE } else { 0 };
        if self.0.data.len() < self.0.base + grown {
            // Exactly the window: a doubling reserve could hold twice the record.
            let size = (self.0.base + grown).max(grown + slack);
            self.0.data.reserve_exact(size - self.0.data.len());
            self.0.data.resize(size, 0);
            if let Some(at) = self.0.at {
                // The memory moved: the record moves back to its place in the line.
                let base = self.line_offset(0, at);
                if base != self.0.base {
                    let (old, have) = (self.0.base, self.0.filled - self.0.base);
                    self.0.data.copy_within(old..old + have, base);
                    self.0.base = base;
                    self.0.pos = base;
                    self.0.filled = base + have;
                }
            }
        }
        self.0.limit = self.0.base + grown;
        true
    }

    /// For a whole buffer: its note and its bytes once every byte has arrived.
    #[inline]
    pub fn whole_complete(&self) -> Option<(u64, &[u8])> {
        let (base, end) = (self.0.base, self.0.base + self.0.target);
        match self.0.whole {
            Some(note) if self.0.filled == end => Some((note, &self.mem()[base..end])),
            _ => None,
        }
    }

    /// Turns an idle whole buffer (after [`reset_whole`](Self::reset_whole)) into a cache
    /// of exactly `len` bytes, keeping whatever memory it holds beyond them for later
    /// records. False (and nothing changed) for a buffer holding no memory.
    ///
    /// With `(lead, at)`, the cache's reads start where the byte `lead` bytes into them
    /// lies at an address that is `at` modulo [`LINE`]: a record read behind a `lead`-byte
    /// header then starts at that place in the line.
    pub fn reuse_as_cache(&mut self, len: usize, place: Option<(usize, usize)>) -> bool {
        debug_assert!(self.0.whole.is_none() && self.0.placed.is_none() && self.0.filled == 0);
        if self.0.data.is_empty() {
            return false;
        }
        let slack = if place.is_some() { LINE } else { 0 };
        if self.0.data.len() < len + slack {
            // Exactly: a doubling reserve could hold twice the frame.
            self.0.data.reserve_exact(len + slack - self.0.data.len());
            self.0.data.resize(len + slack, 0);
        }
        let origin = place.map_or(0, |(lead, at)| self.line_offset(lead, at) - lead);
        self.0.origin = origin;
        self.0.pos = origin;
        self.0.filled = origin;
        self.0.limit = origin + len;
        self.0.read_cap = None;
        true
    }

    /// A cache whose unread bytes are a `hdr`-byte header and the start of a record of
    /// `len` bytes longer than the cache becomes, in place, the whole buffer for that
    /// record (marked with `note`): the header is consumed, the record lies right behind
    /// it (moved forward by up to 7 bytes when that is not 8-byte aligned, as a whole
    /// buffer's record always is), and the read window grows as in
    /// [`split_whole`](Self::split_whole) (at first what the memory holds, or
    /// [`WHOLE_FIRST`] bytes, at most the record).
    pub fn cache_into_whole(&mut self, hdr: usize, len: usize, note: u64, at: Option<usize>) {
        debug_assert!(self.0.whole.is_none() && self.pending() >= hdr);
        let start = self.0.pos + hdr;
        debug_assert!(self.0.filled - start < len, "bytes past the record");
        let have = (self.0.filled - start).min(len);
        // Where the record goes, or at most a line past the start (the place in the line
        // is taken once the memory is as large as it gets here).
        let most = match at {
            Some(_) => start + LINE,
            None => start.next_multiple_of(RECORD_ALIGN),
        };
        let window = first_window(len, have, self.0.data.len().saturating_sub(most));
        if self.0.data.len() < most + window {
            self.0.data.reserve_exact(most + window - self.0.data.len());
            self.0.data.resize(most + window, 0);
        }
        let base = match at {
            Some(at) => self.line_offset(start, at),
            None => start.next_multiple_of(RECORD_ALIGN),
        };
        if base != start {
            self.0.data.copy_within(start..start + have, base);
        }
        self.0.filled = base + have;
        self.0.pos = base;
        self.0.base = base;
        self.0.at = at;
        self.0.origin = 0;
        self.0.limit = base + window;
        self.0.target = len;
        self.0.whole = Some(note);
        self.0.read_cap = None;
        self.0.fill = false;
    }

    /// Turns a consumed whole buffer back into an idle spare (a placed one gives its
    /// region back).
    pub fn reset_whole(&mut self) {
        self.0.placed = None;
        self.0.whole = None;
        self.0.pos = 0;
        self.0.filled = 0;
        self.0.limit = 0;
        self.0.target = 0;
        self.0.base = 0;
        self.0.at = None;
        self.0.origin = 0;
        self.0.fill = false;
    }

    /// Grows a cache to `capacity` bytes, keeping the unconsumed bytes (moved to the
    /// front). Connections start with a small buffer and grow once adopted, so half-open
    /// connections cost little memory.
    pub fn grow(&mut self, capacity: usize) {
        if self.0.whole.is_some() || capacity <= self.0.data.len() {
            return;
        }
        let mut data = vec![0; capacity];
        let n = self.pending();
        data[..n].copy_from_slice(&self.0.data[self.0.pos..self.0.filled]);
        self.0.data = data;
        self.0.pos = 0;
        self.0.filled = n;
        self.0.limit = capacity;
        self.0.origin = 0;
    }

    /// Bytes of the buffer kept allocated (for memory accounting).
    pub fn allocated(&self) -> usize {
        self.0.data.capacity()
    }

    /// Shrinks an idle whole buffer above `keep` bytes back to nothing.
    pub fn trim(&mut self, keep: usize) {
        if self.0.whole.is_none() && self.0.data.len() > keep {
            self.0.data = Vec::new();
        }
    }
}

/// The first read window of a whole buffer that has none this large already (a record's
/// memory grows from here as its bytes arrive).
pub const WHOLE_FIRST: usize = 256 << 10;

/// The first read window of a whole buffer for a record of `len` bytes of which `have`
/// are in, over memory that already holds `held` bytes: what it holds, or
/// [`WHOLE_FIRST`] bytes, at most the record.
fn first_window(len: usize, have: usize, held: usize) -> usize {
    len.min(have.max(WHOLE_FIRST).max(held))
}

/// Where a whole buffer's record starts is a multiple of this (its memory's start is at
/// least as aligned): readers may take 8-byte fields of a record where it lies. A place in
/// the line asked for is one too.
pub const RECORD_ALIGN: usize = 8;

/// The line a record's place is given in ([`RxBuf::split_whole`]): a cache line, and the
/// unit of the wire's [`Header::line`](crate::wire::Header::line).
///
/// Where a record lies modulo 4 KiB matters to the kernel's copy into it: `rep movsb`, which
/// the kernel copies with, runs several times slower on x86 when the destination lies 1 to
/// 32 bytes past the source modulo 4 KiB. A record whose pages the sender lent lies at the
/// place of its source ([`Header::line`](crate::wire::Header::line)); any other was copied by
/// the sender's kernel into socket pages, where in a ping-pong the frame's header starts a
/// fresh page, so a record of its own buffer is placed one header past the start of a line.
pub const LINE: usize = crate::wire::LINE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_buffer_takes_the_cached_start_and_the_rest_exactly() {
        let mut c = RxBuf::cache(16);
        c.spare_mut()[..10].copy_from_slice(b"0123456789");
        c.commit(10);
        let r = c.consume(2);
        assert_eq!(c.bytes(r), b"01");
        let mut w = c.split_whole(12, 7, RxBuf::empty_large(), None);
        assert_eq!(c.pending(), 0, "the cached start moved to the whole buffer");
        assert!(w.wants_all() && w.missing() == 4 && w.whole_complete().is_none());
        assert_eq!(w.append(b"abcdef"), 4, "takes exactly what it misses");
        let (note, bytes) = w.whole_complete().expect("complete");
        assert_eq!((note, bytes), (7, &b"23456789abcd"[..]));
        w.reset_whole();
        assert!(!w.wants_all() && w.allocated() == 12);
    }

    /// Fills a whole buffer's record by reads of at most `step` bytes of `byte(i)`, growing
    /// its window as it fills, and checks after every step that the record's first byte
    /// stays at `at` modulo the line.
    fn fill_whole(w: &mut RxBuf, from: usize, step: usize, at: usize, byte: impl Fn(usize) -> u8) {
        let place = |w: &RxBuf| (w.mem().as_ptr() as usize + w.record_start()) % LINE;
        let mut i = from;
        for _ in 0..100_000 {
            if w.missing() == 0 {
                return;
            }
            if w.spare_mut().is_empty() {
                assert!(w.grow_whole(), "a full window grows");
            }
            let spare = w.spare_mut();
            let n = spare.len().min(step);
            for (k, b) in spare[..n].iter_mut().enumerate() {
                *b = byte(i + k);
            }
            w.commit(n);
            i += n;
            assert_eq!(place(w), at, "the record keeps its place after {i} bytes");
        }
        panic!(
            "a record of {} bytes not filled in 100,000 reads",
            w.record_len()
        );
    }

    /// A record asked for at a place in the line starts there, whatever the buffer's
    /// address, and keeps it while its memory grows (and may move); the bytes received
    /// before the buffer was made come first.
    #[test]
    fn whole_buffer_keeps_its_place_in_the_line() {
        let byte = |i: usize| (i % 251) as u8;
        for at in (0..LINE).step_by(RECORD_ALIGN) {
            let mut c = RxBuf::cache(64);
            let head: Vec<u8> = (0..40).map(byte).collect();
            c.append_upto(&head, head.len());
            let len = 3 * WHOLE_FIRST + 5;
            let mut w = c.split_whole(len, 9, RxBuf::empty_large(), Some(at));
            assert_eq!(c.pending(), 0);
            fill_whole(&mut w, head.len(), 100_000, at, byte);
            let (note, bytes) = w.whole_complete().expect("complete");
            assert_eq!(note, 9);
            assert_eq!(bytes.as_ptr() as usize % LINE, at);
            assert!(bytes.iter().enumerate().all(|(i, b)| *b == byte(i)));
            // Reused for a record at another place: it moves there.
            w.reset_whole();
            let other = (at + 24) % LINE;
            let mut w = RxBuf::cache(16).split_whole(1000, 1, w, Some(other));
            fill_whole(&mut w, 0, 300, other, byte);
            let (_, bytes) = w.whole_complete().expect("complete");
            assert_eq!(bytes.as_ptr() as usize % LINE, other);
        }
    }

    /// A cache asked to read records behind a header at a place in the line starts its
    /// reads there, after every compaction too; a cache turned into a whole buffer moves
    /// its record to the place asked for, its bytes intact.
    #[test]
    fn cache_reads_put_records_at_their_place_in_the_line() {
        let hdr = 8;
        for at in (0..LINE).step_by(RECORD_ALIGN) {
            let mut w = RxBuf::cache(16).split_whole(100, 0, RxBuf::empty_large(), None);
            w.append(&[7; 100]);
            w.reset_whole();
            assert!(w.reuse_as_cache(hdr + 100, Some((hdr, at))));
            assert_eq!(w.room(), hdr + 100);
            for round in 0..3u8 {
                let spare = w.spare_mut();
                assert!(spare.len() >= hdr + 100, "room for a whole frame");
                assert_eq!((spare.as_ptr() as usize + hdr) % LINE, at, "round {round}");
                spare[..hdr + 100].fill(round);
                w.commit(hdr + 100);
                let r = w.consume(hdr + 100);
                let rec = &w.bytes(r)[hdr..];
                assert_eq!((rec.as_ptr() as usize % LINE, rec.len()), (at, 100));
                w.compact();
            }
            // Half a frame in, then a record larger than the cache: in place, moved to
            // its place in the line.
            let spare = w.spare_mut();
            spare[..hdr].fill(0xee);
            for (i, b) in spare[hdr..hdr + 50].iter_mut().enumerate() {
                *b = i as u8;
            }
            w.commit(hdr + 50);
            let to = (at + 40) % LINE;
            w.cache_into_whole(hdr, 500, 3, Some(to));
            assert_eq!(w.missing(), 450);
            fill_whole(&mut w, 50, 64, to, |i| i as u8);
            let (_, bytes) = w.whole_complete().expect("complete");
            assert_eq!(bytes.as_ptr() as usize % LINE, to);
            assert!(bytes.iter().enumerate().all(|(i, b)| *b == i as u8));
        }
    }
}
