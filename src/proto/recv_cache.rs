//! The receive cache: one buffer per connection that a single read fills with as many
//! frames as the socket holds, from which every complete frame is handed out in place.
//!
//! Ownership follows the "rent" model: the connection lends its [`RxBuf`] to the reactor
//! for one read (the kernel writes into [`RxBuf::spare_mut`]), gets it back with the byte
//! count, and parses frames out of it without copying. Only the bytes of a frame that is
//! still incomplete at the end of a read are moved, to the front of the buffer
//! ([`RxBuf::compact`]). A payload that cannot fit in the cache is read straight into a
//! buffer of its own ([`RxBuf::into_large`]), so it is copied once, by the kernel.
//!
//! The same buffer also serves as a *reassembly* buffer when the bytes arrive in buffers
//! the connection does not own (provided buffers of a multishot receive, see
//! [`Core::input_step`](crate::proto::core::Core::input_step)): frames wholly inside
//! such an input are parsed where they lie, and only a record cut by the end of an input
//! is copied here, exactly up to its end ([`RxBuf::append_upto`], [`RxBuf::append`]).
//!
//! Invariants: `pos <= filled <= limit <= data.len()`; bytes `pos..filled` are received
//! but not yet consumed; nothing here allocates except [`RxBuf::into_large`] growing a
//! reused buffer to a larger payload than it held before. No I/O here.

use std::ops::Range;

use crate::error::WireError;
use crate::wire::{Header, Hello, HEADER_LEN, HELLO_LEN};

/// A receive buffer, owned by a connection or rented to the reactor for one read.
#[derive(Debug)]
pub struct RxBuf {
    data: Vec<u8>,
    pos: usize,
    filled: usize,
    limit: usize,
    large: Option<Header>,
}

/// What the next bytes of the cache hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// A complete frame: the payload is `buf.bytes(range)`.
    Frame(Header, Range<usize>),
    /// A frame whose payload cannot fit in the cache: continue with
    /// [`RxBuf::into_large`].
    Large(Header),
    /// Not enough bytes yet.
    NeedMore,
}

impl RxBuf {
    /// A cache of `capacity` bytes (zeroed once, here).
    pub fn cache(capacity: usize) -> Self {
        let capacity = capacity.max(HEADER_LEN.max(HELLO_LEN));
        Self {
            data: vec![0; capacity],
            pos: 0,
            filled: 0,
            limit: capacity,
            large: None,
        }
    }

    /// An empty large-payload buffer (grows on first use, then is reused).
    pub fn empty_large() -> Self {
        Self {
            data: Vec::new(),
            pos: 0,
            filled: 0,
            limit: 0,
            large: None,
        }
    }

    /// The region the next read may fill. Empty only when a large payload is complete.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        &mut self.data[self.filled..self.limit]
    }

    /// Records that a read wrote `n` bytes at the start of [`spare_mut`](Self::spare_mut).
    pub fn commit(&mut self, n: usize) {
        self.filled = (self.filled + n).min(self.limit);
    }

    /// True for a large-payload buffer: the reactor may ask the kernel to fill it whole
    /// (`MSG_WAITALL`), since no other frame shares it.
    pub fn wants_all(&self) -> bool {
        self.large.is_some()
    }

    /// For a large-payload buffer: payload bytes still to arrive (0 for a cache).
    pub fn missing(&self) -> usize {
        if self.large.is_some() {
            self.limit - self.filled
        } else {
            0
        }
    }

    /// Received bytes not yet consumed.
    pub fn pending(&self) -> usize {
        self.filled - self.pos
    }

    /// Bytes of a range handed out by [`next_frame`](Self::next_frame).
    pub fn bytes(&self, r: Range<usize>) -> &[u8] {
        &self.data[r]
    }

    /// Capacity of the cache.
    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    /// Takes a handshake record if one is complete.
    pub fn next_hello(&mut self) -> Result<Option<Hello>, WireError> {
        if self.pending() < HELLO_LEN {
            return Ok(None);
        }
        let h = Hello::parse(&self.data[self.pos..self.filled])?;
        self.pos += HELLO_LEN;
        Ok(Some(h))
    }

    /// Parses the next frame. A complete frame is consumed; the caller reads its payload
    /// with [`bytes`](Self::bytes) before the next call to anything that mutates.
    pub fn next_frame(&mut self, max_len: u32) -> Result<Next, WireError> {
        if self.pending() < HEADER_LEN {
            return Ok(Next::NeedMore);
        }
        let hdr = Header::parse(&self.data[self.pos..self.filled], max_len)?;
        let need = HEADER_LEN + hdr.len as usize;
        if self.pending() >= need {
            let start = self.pos + HEADER_LEN;
            self.pos += need;
            return Ok(Next::Frame(hdr, start..start + hdr.len as usize));
        }
        if need > self.data.len() {
            return Ok(Next::Large(hdr));
        }
        Ok(Next::NeedMore)
    }

    /// Reassembly: copies bytes from `src` until `want` bytes are pending (or `src` or
    /// the spare room runs out) and returns how many were taken. Starts from the front
    /// when nothing is pending, so a record of up to [`capacity`](Self::capacity) bytes
    /// always fits.
    pub fn append_upto(&mut self, src: &[u8], want: usize) -> usize {
        if self.pos == self.filled && self.large.is_none() {
            self.pos = 0;
            self.filled = 0;
        }
        let n = want
            .saturating_sub(self.pending())
            .min(src.len())
            .min(self.limit - self.filled);
        self.data[self.filled..self.filled + n].copy_from_slice(&src[..n]);
        self.filled += n;
        n
    }

    /// Reassembly into a large-payload buffer: copies as much of `src` as the payload
    /// still misses; returns how many bytes were taken.
    pub fn append(&mut self, src: &[u8]) -> usize {
        let n = src.len().min(self.limit - self.filled);
        self.data[self.filled..self.filled + n].copy_from_slice(&src[..n]);
        self.filled += n;
        n
    }

    /// The header of the pending frame, without consuming it (`None` if incomplete).
    pub fn peek_header(&self, max_len: u32) -> Result<Option<Header>, WireError> {
        if self.pending() < HEADER_LEN {
            return Ok(None);
        }
        Header::parse(&self.data[self.pos..self.filled], max_len).map(Some)
    }

    /// Moves unconsumed bytes to the front so the next read has the most room. Called
    /// once per read, after every complete frame was taken.
    pub fn compact(&mut self) {
        if self.pos == self.filled {
            self.pos = 0;
            self.filled = 0;
        } else if self.pos > 0 {
            self.data.copy_within(self.pos..self.filled, 0);
            self.filled -= self.pos;
            self.pos = 0;
        }
    }

    /// After [`Next::Large`]: consumes the header and the payload bytes already in this
    /// cache, and prepares `large` (a reused buffer) to receive the payload straight from
    /// the socket. Returns `large`, ready to be rented to the reactor.
    pub fn into_large(&mut self, hdr: Header, mut large: Self) -> Self {
        let len = hdr.len as usize;
        self.pos += HEADER_LEN;
        let have = self.pending().min(len);
        if large.data.len() < len {
            // Grows once per new maximum size, to exactly that size (a doubling `resize`
            // could hold twice the maximum frame); reused afterwards.
            large.data = vec![0; len];
        }
        large.data[..have].copy_from_slice(&self.data[self.pos..self.pos + have]);
        self.pos += have;
        large.pos = 0;
        large.filled = have;
        large.limit = len;
        large.large = Some(hdr);
        large
    }

    /// For a large buffer: the header and payload once every byte has arrived.
    pub fn large_complete(&self) -> Option<(Header, &[u8])> {
        match self.large {
            Some(h) if self.filled == self.limit => Some((h, &self.data[..self.limit])),
            _ => None,
        }
    }

    /// Turns a consumed large buffer back into an idle spare.
    pub fn reset_large(&mut self) {
        self.large = None;
        self.pos = 0;
        self.filled = 0;
        self.limit = 0;
    }

    /// Grows a cache to `capacity` bytes, keeping the unconsumed bytes (moved to the
    /// front). Connections start with a small buffer for the handshake and grow once
    /// adopted, so half-open connections cost little memory.
    pub fn grow(&mut self, capacity: usize) {
        if self.large.is_some() || capacity <= self.data.len() {
            return;
        }
        let mut data = vec![0; capacity];
        let n = self.pending();
        data[..n].copy_from_slice(&self.data[self.pos..self.filled]);
        self.data = data;
        self.pos = 0;
        self.filled = n;
        self.limit = capacity;
    }

    /// Bytes of the buffer kept allocated (for memory accounting).
    pub fn allocated(&self) -> usize {
        self.data.capacity()
    }

    /// Shrinks an idle large buffer above `keep` bytes back to nothing.
    pub fn trim(&mut self, keep: usize) {
        if self.large.is_none() && self.data.len() > keep {
            self.data = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameKind, Tag};
    use proptest::prelude::*;

    fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = Header {
            kind: FrameKind::Send,
            tag: Tag(tag),
            len: payload.len() as u32,
        }
        .to_bytes()
        .to_vec();
        v.extend_from_slice(payload);
        v
    }

    /// Feeds `stream` in reads of the given sizes; returns the frames seen.
    fn feed(cap: usize, stream: &[u8], cuts: &[usize]) -> Vec<(u8, Vec<u8>)> {
        let mut rx = RxBuf::cache(cap);
        let mut spare_large = RxBuf::empty_large();
        let mut large: Option<RxBuf> = None;
        let mut out = Vec::new();
        let mut off = 0;
        let mut ci = 0;
        let mut guard = 0;
        while off < stream.len() {
            guard += 1;
            assert!(guard < 1_000_000, "no progress");
            let want = cuts.get(ci).copied().unwrap_or(usize::MAX).max(1);
            ci += 1;
            let target = large.as_mut().unwrap_or(&mut rx);
            let spare = target.spare_mut();
            let n = want.min(spare.len()).min(stream.len() - off);
            spare[..n].copy_from_slice(&stream[off..off + n]);
            target.commit(n);
            off += n;
            if let Some(l) = large.as_mut() {
                if let Some((h, p)) = l.large_complete() {
                    out.push((h.tag.0, p.to_vec()));
                    let mut l = large.take().unwrap();
                    l.reset_large();
                    spare_large = l;
                } else {
                    continue;
                }
            }
            loop {
                match rx.next_frame(1 << 24).unwrap() {
                    Next::Frame(h, r) => out.push((h.tag.0, rx.bytes(r).to_vec())),
                    Next::Large(h) => {
                        let l = rx.into_large(
                            h,
                            std::mem::replace(&mut spare_large, RxBuf::empty_large()),
                        );
                        if let Some((h, p)) = l.large_complete() {
                            out.push((h.tag.0, p.to_vec()));
                            let mut l = l;
                            l.reset_large();
                            spare_large = l;
                            continue;
                        }
                        large = Some(l);
                        break;
                    }
                    Next::NeedMore => break,
                }
            }
            rx.compact();
        }
        out
    }

    #[test]
    fn many_frames_per_read_and_straddling() {
        let mut s = Vec::new();
        let mut want = Vec::new();
        for i in 0..50u8 {
            let p = vec![i; i as usize * 3];
            s.extend(frame(i, &p));
            want.push((i, p));
        }
        assert_eq!(feed(64, &s, &[usize::MAX]), want);
        assert_eq!(feed(64, &s, &[1; 100_000]), want);
        assert_eq!(feed(4096, &s, &[usize::MAX]), want);
    }

    #[test]
    fn payload_larger_than_cache_goes_to_its_own_buffer() {
        let big: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut s = frame(1, b"a");
        s.extend(frame(2, &big));
        s.extend(frame(3, b"z"));
        let got = feed(256, &s, &[100, 7, 3000, 1, 10_000]);
        assert_eq!(got, vec![(1, b"a".to_vec()), (2, big), (3, b"z".to_vec())]);
    }

    /// A reused large-payload buffer grows to exactly the new frame, never to twice the
    /// previous one (a peer must not make a connection hold more than the maximum frame).
    #[test]
    fn large_buffer_never_exceeds_the_largest_frame() {
        let max = 64_511usize;
        let mut spare = RxBuf::empty_large();
        for len in [53_721usize, max] {
            let mut rx = RxBuf::cache(68);
            let h = Header {
                kind: FrameKind::Send,
                tag: Tag(0),
                len: len as u32,
            }
            .to_bytes();
            rx.spare_mut()[..8].copy_from_slice(&h);
            rx.commit(8);
            let Next::Large(h) = rx.next_frame(max as u32).unwrap() else {
                panic!("expected a large frame");
            };
            let mut l = rx.into_large(h, spare);
            assert!(l.allocated() <= max, "{} > {max}", l.allocated());
            l.reset_large();
            spare = l;
        }
    }

    #[test]
    fn oversize_length_is_an_error_not_an_allocation() {
        let mut rx = RxBuf::cache(64);
        let h = Header {
            kind: FrameKind::Send,
            tag: Tag(0),
            len: u32::MAX,
        }
        .to_bytes();
        rx.spare_mut()[..8].copy_from_slice(&h);
        rx.commit(8);
        assert!(matches!(
            rx.next_frame(1 << 20),
            Err(WireError::FrameTooLarge { .. })
        ));
        assert_eq!(rx.allocated(), 64);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// However the stream is cut into reads, the same frames come out in order.
        #[test]
        fn any_split_yields_same_frames(
            sizes in proptest::collection::vec(0usize..700, 1..40),
            cuts in proptest::collection::vec(1usize..900, 0..200),
            cap in 32usize..1024,
        ) {
            let mut s = Vec::new();
            let mut want = Vec::new();
            for (i, n) in sizes.iter().enumerate() {
                let p: Vec<u8> = (0..*n).map(|j| (i * 31 + j) as u8).collect();
                s.extend(frame(i as u8, &p));
                want.push((i as u8, p));
            }
            prop_assert_eq!(feed(cap, &s, &cuts), want);
        }
    }
}
