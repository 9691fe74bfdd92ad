//! Send batches: [`TxBatch`], the bytes of one gathered send (copied headers and small
//! payloads, the caller's segments by reference). No I/O here.

use std::mem;

use bytes::Bytes;

/// The most slices the head of a batch is written from at once: the `N` that a caller
/// gives [`TxBatch::unsent_pieces`] for such a write, and the most pieces the reactor's
/// immediate write takes (it writes no piece beyond them). A frame that the protocol
/// writes at once (its header, its padding or inline payload and its payload segments)
/// fits in this many.
pub const DIRECT_PIECES: usize = 12;

/// One piece of a batch, in wire order.
#[derive(Debug)]
enum Part {
    /// Bytes `start..start + len` of the arena (headers, inlined payloads).
    Arena { start: usize, len: usize },
    /// A payload segment sent from the caller's buffer without copying.
    Ext(Bytes),
    /// A payload segment whose pages are lent to the kernel (spliced, not copied into
    /// the socket) until the peer acknowledges the frame.
    Lent(Bytes),
}

impl Part {
    fn lent(&self) -> bool {
        matches!(self, Part::Lent(_))
    }
}

/// The bytes of one gathered send, owned by whoever currently holds it.
///
/// Filled by the protocol (headers and small payloads copied into its arena, larger
/// payload segments kept as [`Bytes`] without copying), then *moved* to the reactor,
/// which owns it until the kernel has written every byte. The reactor turns it into an
/// iovec array with [`for_each_unsent`](Self::for_each_unsent) and records partial
/// writes with [`advance`](Self::advance).
///
/// Invariant: `parts` covers exactly `total` bytes; `sent <= total`; bytes before `sent`
/// have been written to the socket and are never looked at again.
#[derive(Debug, Default)]
pub struct TxBatch {
    arena: Vec<u8>,
    parts: Vec<Part>,
    total: usize,
    sent: usize,
    frames: usize,
    /// A lent segment was pushed.
    lent: bool,
}

impl TxBatch {
    /// An empty batch with room for `arena` bytes of headers and inlined payloads.
    pub fn with_capacity(arena: usize, parts: usize) -> Self {
        Self {
            arena: Vec::with_capacity(arena),
            parts: Vec::with_capacity(parts),
            total: 0,
            sent: 0,
            frames: 0,
            lent: false,
        }
    }

    /// Forget every frame while keeping the allocated capacity (no allocation on reuse).
    pub fn clear(&mut self) {
        self.arena.clear();
        self.parts.clear();
        self.total = 0;
        self.sent = 0;
        self.frames = 0;
        self.lent = false;
    }

    /// Appends bytes that are copied into the arena (a header or a small payload).
    #[inline]
    pub fn push_copy(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let start = self.arena.len();
        self.arena.extend_from_slice(bytes);
        self.note_arena(start, bytes.len());
    }

    /// Bytes in the arena so far: where the next [`push_copy`](Self::push_copy) lands,
    /// for a later [`patch`](Self::patch).
    #[inline]
    pub fn arena_len(&self) -> usize {
        self.arena.len()
    }

    /// Overwrites arena bytes `at..at + bytes.len()`, pushed earlier, after whatever part
    /// of the batch was written (a frame whose header is completed once what follows it
    /// is known).
    ///
    /// # Panics
    ///
    /// When the range is not in the arena.
    #[inline]
    pub fn patch(&mut self, at: usize, bytes: &[u8]) {
        self.arena[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Records `n` bytes appended to the arena at `start` as the batch's next piece.
    #[inline]
    fn note_arena(&mut self, start: usize, n: usize) {
        match self.parts.last_mut() {
            // Contiguous with the previous arena piece (a last piece of the arena always
            // ends where the arena does: every append notes its bytes here at once), so one
            // iovec covers both.
            Some(Part::Arena { start: s, len }) => {
                debug_assert_eq!(*s + *len, start, "the arena's last piece ends the arena");
                *len += n;
            }
            _ => self.parts.push(Part::Arena { start, len: n }),
        }
        self.total += n;
    }

    /// Appends the first `len` bytes of `wire` (a header and a small payload) to the
    /// arena, as [`push_copy`](Self::push_copy) does, with one copy of fixed size (no
    /// call to `memcpy` for a few bytes).
    #[inline]
    pub fn push_small<const N: usize>(&mut self, wire: &[u8; N], len: usize) {
        let len = len.min(N);
        let start = self.arena.len();
        self.arena.extend_from_slice(wire);
        self.arena.truncate(start + len);
        self.note_arena(start, len);
    }

    /// Appends a frame of an 8-byte header and an 8-byte payload (the common small
    /// message) to the arena, as [`push_frame`](Self::push_frame) does: one capacity check
    /// and one copy of 16 bytes.
    ///
    /// Written into the arena's spare capacity rather than with `extend_from_slice`,
    /// whose generic body the compiler does not always inline into a caller's send loop
    /// (a call and a `memcpy` for 16 bytes).
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn push_frame16(&mut self, head: &[u8; 8], payload: &[u8; 8]) {
        let start = self.arena.len();
        let mut w = [0u8; 16];
        w[..8].copy_from_slice(head);
        w[8..].copy_from_slice(payload);
        self.arena.reserve(16);
        // SAFETY: `reserve` left at least 16 bytes of capacity after the arena's `start`
        // initialized bytes, so the 16 written from there lie inside its allocation (an
        // unaligned write: the array's alignment is 1 anyway); `set_len` then covers only
        // bytes initialized before or by that write.
        unsafe {
            self.arena
                .as_mut_ptr()
                .add(start)
                .cast::<[u8; 16]>()
                .write_unaligned(w);
            self.arena.set_len(start + 16);
        }
        self.note_arena(start, 16);
    }

    /// Appends one small frame to the arena: its encoded header, then the segments of its
    /// payload (together at most `MAX` bytes), each copied. A segment of 8 bytes (the
    /// common small message) is copied with a fixed-size copy, not a call to `memcpy`.
    #[inline]
    pub fn push_frame<const H: usize, const MAX: usize>(&mut self, head: &[u8; H], segs: &[Bytes]) {
        let start = self.arena.len();
        self.arena.reserve(H + MAX);
        self.arena.extend_from_slice(head);
        for s in segs {
            match <&[u8; 8]>::try_from(&s[..]) {
                Ok(eight) => self.arena.extend_from_slice(eight),
                Err(_) => self.arena.extend_from_slice(s),
            }
        }
        self.note_arena(start, self.arena.len() - start);
    }

    /// Appends a payload segment by reference (no copy of its bytes).
    #[inline]
    pub fn push_ext(&mut self, seg: Bytes) {
        if seg.is_empty() {
            return;
        }
        self.total += seg.len();
        self.parts.push(Part::Ext(seg));
    }

    /// Appends a payload segment whose pages the sender lends to the kernel (see
    /// [`lent_unsent`](Self::lent_unsent)); the frame completes on the peer's ACK.
    #[inline]
    pub fn push_lent(&mut self, seg: Bytes) {
        if seg.is_empty() {
            return;
        }
        self.total += seg.len();
        self.lent = true;
        self.parts.push(Part::Lent(seg));
    }

    /// The unsent bytes of the batch, in order, as at most `N` slices into `out` (its
    /// arena's pieces and the caller's segments), for one gathered write. Returns how
    /// many; `None` when nothing is unsent, when they take more than `N` slices, or when a
    /// lent segment is among them (its pages go through a pipe, see
    /// [`push_lent`](Self::push_lent)).
    pub fn unsent_pieces<'a, const N: usize>(&'a self, out: &mut [&'a [u8]; N]) -> Option<usize> {
        if self.lent {
            return None;
        }
        let mut skip = self.sent;
        let mut n = 0;
        for part in &self.parts {
            let s = self.part_bytes(part);
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            *out.get_mut(n)? = &s[skip..];
            skip = 0;
            n += 1;
        }
        (n > 0).then_some(n)
    }

    /// Hands `f` every lent segment, in order, leaving empty ones in their place: the
    /// protocol keeps the caller's memory alive until the peer's ACK, past the batch.
    pub fn take_lent(&mut self, mut f: impl FnMut(Bytes)) {
        for part in &mut self.parts {
            if let Part::Lent(b) = part {
                f(mem::take(b));
            }
        }
    }

    /// Whether the batch holds a lent segment.
    #[inline]
    pub fn has_lent(&self) -> bool {
        self.lent
    }

    /// The unwritten rest of the lent segment the next unwritten byte belongs to; `None`
    /// when that byte is not in a lent segment (or everything is written).
    pub fn lent_unsent(&self) -> Option<&[u8]> {
        self.lent_rest().map(|(rest, _)| rest)
    }

    /// The tail of a lent segment that is partly written already, when the tail is at most
    /// `max` bytes: what a pipe-full left over (a pipe holds whole pages, so a segment that
    /// does not start on a page boundary leaves its last bytes for another pair of calls).
    pub fn lent_tail(&self, max: usize) -> Option<&[u8]> {
        self.lent_rest()
            .filter(|&(rest, started)| started && rest.len() <= max)
            .map(|(rest, _)| rest)
    }

    /// [`lent_unsent`](Self::lent_unsent), and whether bytes of that segment are written.
    fn lent_rest(&self) -> Option<(&[u8], bool)> {
        let mut skip = self.sent;
        for part in &self.parts {
            let s = self.part_bytes(part);
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            return part.lent().then(|| (&s[skip..], skip > 0));
        }
        None
    }

    fn part_bytes<'a>(&'a self, part: &'a Part) -> &'a [u8] {
        match part {
            Part::Arena { start, len } => &self.arena[*start..*start + *len],
            Part::Ext(b) | Part::Lent(b) => b,
        }
    }

    /// Counts one more complete record (frame) in the batch.
    #[inline]
    pub fn add_frame(&mut self) {
        self.frames += 1;
    }

    /// Number of records (frames) in the batch.
    #[inline]
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Number of pieces (an upper bound on the iovecs needed).
    #[inline]
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Total bytes in the batch.
    #[inline]
    pub fn len(&self) -> usize {
        self.total
    }

    /// True when the batch holds no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Bytes not yet written.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.total - self.sent
    }

    /// Records that `n` more bytes were written (a short write leaves the rest).
    ///
    /// `n` larger than [`remaining`](Self::remaining) is clamped: the kernel never reports
    /// more than it was given, so this only guards against a caller's mistake.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.total);
    }

    /// Calls `f` with each unwritten slice, in wire order (what an iovec array must cover).
    pub fn for_each_unsent(&self, f: impl FnMut(&[u8])) {
        self.for_each_unsent_upto(usize::MAX, f);
    }

    /// As [`for_each_unsent`](Self::for_each_unsent), but stops after `limit` bytes (the
    /// last slice cut short): the slices one send call of at most `limit` bytes covers.
    pub fn for_each_unsent_upto(&self, limit: usize, f: impl FnMut(&[u8])) {
        self.walk_unsent(limit, false, f);
    }

    /// As [`for_each_unsent_upto`](Self::for_each_unsent_upto), but stops before the next
    /// lent segment: what may be copied into the socket before that segment is spliced.
    pub fn for_each_copied_upto(&self, limit: usize, f: impl FnMut(&[u8])) {
        self.walk_unsent(limit, true, f);
    }

    /// The unwritten bytes before the next lent segment (all of them when none follows):
    /// what [`for_each_copied_upto`](Self::for_each_copied_upto) covers without a limit.
    pub fn copied_run(&self) -> usize {
        let mut n = 0;
        self.walk_unsent(usize::MAX, true, |s| n += s.len());
        n
    }

    fn walk_unsent(&self, limit: usize, stop_at_lent: bool, mut f: impl FnMut(&[u8])) {
        let mut skip = self.sent;
        let mut left = limit;
        for part in &self.parts {
            if left == 0 {
                return;
            }
            let s = self.part_bytes(part);
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            if stop_at_lent && part.lent() {
                return;
            }
            let s = &s[skip..];
            let s = &s[..s.len().min(left)];
            left -= s.len();
            f(s);
            skip = 0;
        }
    }

    /// Copies the unwritten bytes out (tests and the sans-IO harness).
    pub fn unsent_to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.remaining());
        self.for_each_unsent(|s| v.extend_from_slice(s));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsent_pieces_are_the_unwritten_rest_in_order() {
        fn pieces<const N: usize>(b: &TxBatch) -> Option<Vec<Vec<u8>>> {
            let mut out: [&[u8]; N] = [&[]; N];
            let n = b.unsent_pieces(&mut out)?;
            Some(out[..n].iter().map(|p| p.to_vec()).collect())
        }
        let mut b = TxBatch::with_capacity(64, 4);
        assert_eq!(pieces::<3>(&b), None, "nothing to write");
        b.push_copy(b"header");
        b.push_ext(Bytes::from_static(b"payload"));
        b.push_copy(b"tail");
        let want: [&[u8]; 3] = [b"header", b"payload", b"tail"];
        assert_eq!(pieces::<3>(&b).unwrap(), want);
        b.advance(8);
        let want: [&[u8]; 2] = [b"yload", b"tail"];
        assert_eq!(pieces::<3>(&b).unwrap(), want);
        // More pieces than room: none.
        b.push_ext(Bytes::from_static(b"more"));
        assert_eq!(pieces::<2>(&b), None);
        b.advance(b.remaining());
        assert_eq!(pieces::<3>(&b), None, "all written");
        // Lent pages go through a pipe, never in such a write.
        let mut lent = TxBatch::with_capacity(64, 4);
        lent.push_copy(b"h");
        lent.push_lent(Bytes::from_static(b"pages"));
        assert_eq!(pieces::<3>(&lent), None);
    }

    #[test]
    fn merges_contiguous_copies_and_tracks_partial_writes() {
        let mut b = TxBatch::with_capacity(64, 4);
        b.push_copy(b"head");
        b.push_copy(b"er");
        b.push_ext(Bytes::from_static(b"payload"));
        b.push_copy(b"tail");
        assert_eq!(b.parts(), 3);
        assert_eq!(b.len(), 17);
        assert_eq!(b.unsent_to_vec(), b"headerpayloadtail");
        b.advance(8);
        assert_eq!(b.unsent_to_vec(), b"yloadtail");
        let mut n = 0;
        b.for_each_unsent(|_| n += 1);
        assert_eq!(n, 2);
        let mut cut = Vec::new();
        b.for_each_unsent_upto(6, |s| cut.extend_from_slice(s));
        assert_eq!(cut, b"yloadt");
        cut.clear();
        b.for_each_unsent_upto(0, |s| cut.extend_from_slice(s));
        assert!(cut.is_empty());
        b.advance(100);
        assert_eq!(b.remaining(), 0);
        assert!(b.unsent_to_vec().is_empty());
        b.clear();
        assert!(b.is_empty());
    }
}
