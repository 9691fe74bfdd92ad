//! Outgoing byte batches: the frames of one gathered send.
//!
//! A [`TxBatch`] is filled by the endpoint (headers and small payloads copied into its
//! arena, larger payload segments kept as [`Bytes`] without copying) and then *moved* to
//! the reactor, which owns it until the kernel has written every byte. The reactor turns it
//! into an iovec array with [`TxBatch::for_each_unsent`] and records partial writes with
//! [`TxBatch::advance`]. No I/O here.

use bytes::Bytes;

/// One piece of a batch, in wire order.
#[derive(Debug)]
enum Part {
    /// Bytes `start..start + len` of the arena (headers, inlined payloads).
    Arena { start: usize, len: usize },
    /// A payload segment sent from the caller's buffer without copying.
    Ext(Bytes),
}

/// The bytes of one gathered send, owned by whoever currently holds it.
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
        }
    }

    /// Forget every frame while keeping the allocated capacity (no allocation on reuse).
    pub fn clear(&mut self) {
        self.arena.clear();
        self.parts.clear();
        self.total = 0;
        self.sent = 0;
        self.frames = 0;
    }

    /// Appends bytes that are copied into the arena (a header or a small payload).
    pub fn push_copy(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let start = self.arena.len();
        self.arena.extend_from_slice(bytes);
        match self.parts.last_mut() {
            // Contiguous with the previous arena piece: one iovec covers both.
            Some(Part::Arena { start: s, len }) if *s + *len == start => *len += bytes.len(),
            _ => self.parts.push(Part::Arena {
                start,
                len: bytes.len(),
            }),
        }
        self.total += bytes.len();
    }

    /// Appends a payload segment by reference (no copy of its bytes).
    pub fn push_ext(&mut self, seg: Bytes) {
        if seg.is_empty() {
            return;
        }
        self.total += seg.len();
        self.parts.push(Part::Ext(seg));
    }

    /// Counts one more complete frame in the batch.
    pub(crate) fn add_frame(&mut self) {
        self.frames += 1;
    }

    /// Number of frames in the batch.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Number of pieces (an upper bound on the iovecs needed).
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Arena bytes used so far.
    pub fn arena_len(&self) -> usize {
        self.arena.len()
    }

    /// Total bytes in the batch.
    pub fn len(&self) -> usize {
        self.total
    }

    /// True when the batch holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Bytes not yet written.
    pub fn remaining(&self) -> usize {
        self.total - self.sent
    }

    /// Records that `n` more bytes were written (a short write leaves the rest).
    ///
    /// `n` larger than [`remaining`](Self::remaining) is clamped: the kernel never reports
    /// more than it was given, so this only guards against a caller's mistake.
    pub fn advance(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.total);
    }

    /// Calls `f` with each unwritten slice, in wire order (what an iovec array must cover).
    pub fn for_each_unsent(&self, f: impl FnMut(&[u8])) {
        self.for_each_unsent_upto(usize::MAX, f);
    }

    /// As [`for_each_unsent`](Self::for_each_unsent), but stops after `limit` bytes (the
    /// last slice cut short): the slices one send call of at most `limit` bytes covers.
    pub fn for_each_unsent_upto(&self, limit: usize, mut f: impl FnMut(&[u8])) {
        let mut skip = self.sent;
        let mut left = limit;
        for part in &self.parts {
            if left == 0 {
                return;
            }
            let s: &[u8] = match part {
                Part::Arena { start, len } => &self.arena[*start..*start + *len],
                Part::Ext(b) => b,
            };
            if skip >= s.len() {
                skip -= s.len();
                continue;
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
