//! The deframer: a byte stream in, handshake records and frames out, across reads cut
//! anywhere. One deframer serves both receive modes:
//!
//! - **own cache**: a read fills the connection's [`RxBuf`] (the reactor writes into
//!   [`RxBuf::spare_mut`]), and the deframer is walked with an empty input: every frame is
//!   handed out in place in the cache; only the unfinished tail is moved to the front
//!   ([`RxBuf::compact`]);
//! - **lent input**: the bytes arrive in a buffer the connection does not own (a provided
//!   buffer of a multishot receive), walked as `input: &[u8]`: a record wholly inside the
//!   input is handed out where it lies ([`Source::Input`]); only a record cut by the end of
//!   an input is copied into the cache, exactly up to its end, so the records after it
//!   start again at the front of the next input.
//!
//! In both modes a payload larger than the cache continues in a whole buffer of its own
//! (reused, grown to the largest payload seen), which stands in for the cache until the
//! payload is delivered: with the own cache the reactor reads straight into it, so it is
//! copied once, by the kernel.
//!
//! With the own cache, that buffer then serves as the cache, sized to the frame it just
//! held ([`Deframer::own_cache`]): a next frame of the same size (a ping-pong, a stream)
//! comes in with its header by one read and is handed out where it lies; a smaller one is
//! handed out there too, and the cache proper comes back once what was read is used up; a
//! larger one becomes, in place, a whole buffer behind its header. No byte is copied in
//! any of these cases, and a large frame costs no read of its header alone.
//!
//! A payload whose pages the sender lent is copied by the kernel straight from those pages,
//! and that copy is several times slower when it writes just ahead of where it reads
//! modulo 4 KiB ([`Header::line`]): such a payload is placed in its whole buffer at the
//! line offset its header gives, and a large buffer serving as the cache after one starts
//! its reads where the next payload of that sender lands at the same offset.
//!
//! The framing primitives over an [`RxBuf`] ([`Frames`]) are here too: the buffer itself
//! is a neutral byte container ([`crate::buf`]). No I/O here.

use std::mem;
use std::ops::Range;

use crate::buf::{Regions, RxBuf, LINE, RECORD_ALIGN};
use crate::proto::part::Parts;
use crate::wire::{
    FrameKind, Header, Hello, PartHead, PutTarget, Tag, WireError, HEADER_LEN, HELLO_LEN,
    PUT_TARGET_LEN,
};

/// Whole large-payload buffers above this size are released after use (others are kept).
const LARGE_KEEP: usize = 16 << 20;

// The header of a large payload travels with its buffer as the buffer's 8-byte note.
const _: () = assert!(HEADER_LEN == size_of::<u64>());

/// A receive cache of `capacity` bytes, rounded up so that a handshake record and a
/// frame header always fit.
pub fn cache(capacity: usize) -> RxBuf {
    RxBuf::cache(capacity.max(HEADER_LEN.max(HELLO_LEN)))
}

/// What the next bytes of a cache hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// A complete frame: its bytes after the header are `buf.bytes(range)` (the payload,
    /// behind its [`Header::pad`] padding).
    Frame(Header, Range<usize>),
    /// A frame whose payload cannot fit in the cache: continue with
    /// [`Frames::into_large`].
    Large(Header),
    /// Not enough bytes yet.
    NeedMore,
}

/// Where the payload of a delivered frame lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// In the input slice being walked: `&input[range]` (zero copy).
    Input(Range<usize>),
    /// In the connection's receive buffer: `rx.bytes(range)`.
    Cache(Range<usize>),
}

/// Framing over a receive buffer.
pub trait Frames {
    /// Takes a handshake record if one is complete.
    fn next_hello(&mut self) -> Result<Option<Hello>, WireError>;
    /// Parses the next frame. A complete frame is consumed; the caller reads its payload
    /// with [`RxBuf::bytes`] before the next call to anything that mutates.
    fn next_frame(&mut self, max_len: u32) -> Result<Next, WireError>;
    /// The header of the pending frame, without consuming it (`None` if incomplete).
    fn peek_header(&self, max_len: u32) -> Result<Option<Header>, WireError>;
    /// After [`Next::Large`]: consumes the header and the payload bytes already in this
    /// cache, and prepares `large` (a reused buffer) to receive the rest of the payload
    /// straight from the socket. Returns `large`, ready to be rented to the reactor.
    // The cache turns (part of) itself into the large buffer: `into_` names that, even
    // though the cache stays usable.
    #[allow(clippy::wrong_self_convention)]
    fn into_large(&mut self, hdr: Header, large: RxBuf) -> RxBuf;
    /// For a large-payload buffer: the header and the frame's bytes after it (the payload,
    /// behind its [`Header::pad`] padding) once every byte has arrived.
    fn large_complete(&self) -> Option<(Header, &[u8])>;
    /// Turns a consumed large-payload buffer back into an idle spare.
    fn reset_large(&mut self);
}

impl Frames for RxBuf {
    #[inline]
    fn next_hello(&mut self) -> Result<Option<Hello>, WireError> {
        if self.pending() < HELLO_LEN {
            // Magic and version are checked as soon as they are in: another version's
            // record may be shorter than ours.
            Hello::check_prefix(self.unread())?;
            return Ok(None);
        }
        let h = Hello::parse(self.unread())?;
        self.consume(HELLO_LEN);
        Ok(Some(h))
    }

    #[inline]
    fn next_frame(&mut self, max_len: u32) -> Result<Next, WireError> {
        if self.pending() < HEADER_LEN {
            return Ok(Next::NeedMore);
        }
        let hdr = Header::parse(self.unread(), max_len)?;
        let need = HEADER_LEN + hdr.len as usize;
        if self.pending() >= need {
            let r = self.consume(need);
            return Ok(Next::Frame(hdr, r.start + HEADER_LEN..r.end));
        }
        if need > self.capacity() {
            return Ok(Next::Large(hdr));
        }
        Ok(Next::NeedMore)
    }

    #[inline]
    fn peek_header(&self, max_len: u32) -> Result<Option<Header>, WireError> {
        if self.pending() < HEADER_LEN {
            return Ok(None);
        }
        Header::parse(self.unread(), max_len).map(Some)
    }

    fn into_large(&mut self, hdr: Header, large: RxBuf) -> RxBuf {
        self.consume(HEADER_LEN);
        let note = u64::from_be_bytes(hdr.to_bytes());
        self.split_whole(hdr.len as usize, note, large, place(&hdr))
    }

    #[inline]
    fn large_complete(&self) -> Option<(Header, &[u8])> {
        let (note, payload) = self.whole_complete()?;
        let h = Header::parse(&note.to_be_bytes(), u32::MAX)
            .expect("the note is a header this deframer encoded");
        Some((h, payload))
    }

    fn reset_large(&mut self) {
        self.reset_whole();
    }
}

/// What [`Deframer::next`] found.
enum Found {
    /// A frame handed out: consumed, its payload at the source.
    Frame(Header, Source),
    /// (Reading ahead.) The next frame is whole in its buffer, or it places: unread.
    Whole,
    /// More bytes are needed.
    More,
}

/// Per-connection deframing state beside its receive buffer: the cache parked while a
/// large payload is read into its own buffer, and the reused large-payload buffer.
#[derive(Debug, Default)]
pub struct Deframer {
    /// The cache, parked while a large payload is read into its own buffer.
    parked: Option<RxBuf>,
    /// Reused large-payload buffer.
    spare_large: Option<RxBuf>,
    /// Reused buffer for placing a put's data (its box; the memory is the region's).
    spare_placed: Option<RxBuf>,
    /// The large payload in `rx` was handed out: next, the cache comes back.
    large_delivered: bool,
    /// Own-cache mode: after a large payload, its buffer serves as the cache.
    reuse_large: bool,
    /// The target of the last PUT or REPLY whose data was placed.
    placed_at: Option<PutTarget>,
    /// `rx` (or, under a placed buffer, `parked`) is the last large payload's buffer
    /// serving as the cache; the cache proper waits in `home`.
    big: bool,
    /// The cache proper while `big`.
    home: Option<RxBuf>,
    /// While `big`: the last frame handed out was too large for the cache proper (so the
    /// next one is likely as large: the big cache stays).
    last_large: bool,
}

impl Deframer {
    /// The target of the last PUT or REPLY frame handed out (its data is in place).
    pub fn placed_at(&self) -> Option<PutTarget> {
        self.placed_at
    }

    /// The deframer of a connection that reads into its own cache: a large payload's
    /// buffer then serves as the cache for what follows (see the module's docs).
    pub fn own_cache() -> Self {
        Self {
            reuse_large: true,
            ..Self::default()
        }
    }

    /// The next handshake record of `rx` followed by `input[*at..]`. `Ok(None)`: more
    /// bytes are needed (whatever `input` held is kept in `rx`).
    pub fn hello(
        &mut self,
        rx: &mut RxBuf,
        input: &[u8],
        at: &mut usize,
    ) -> Result<Option<Hello>, WireError> {
        let rest = &input[(*at).min(input.len())..];
        if rx.pending() == 0 && rest.len() >= HELLO_LEN {
            // A whole record inside the input: parsed where it lies.
            *at += HELLO_LEN;
            return Hello::parse(rest).map(Some);
        }
        *at += rx.append_upto(rest, HELLO_LEN);
        rx.next_hello()
    }

    /// The next frame of `rx` followed by `input[*at..]` (an empty `input` in the own-cache
    /// mode). `Ok(None)`: more bytes are needed; the input is used up (its tail is kept in
    /// `rx`), and `rx` may now be a large-payload buffer that wants the rest of its payload.
    ///
    /// A PUT or REPLY frame's data goes to the region of `regions` its target names, whatever its
    /// size: once the header and the target are in, `rx` becomes a whole buffer placed in
    /// the region (the bytes already received are copied there, the rest is read straight
    /// into it), and the frame comes out when its data is complete, as `Source::Cache`
    /// over the region's bytes. A target outside every region is an error. A PART's piece
    /// goes where `parts` says, the same way, and comes out as `Source::Cache` over the
    /// message's bytes up to the piece's end.
    #[inline]
    pub fn frame(
        &mut self,
        rx: &mut RxBuf,
        input: &[u8],
        at: &mut usize,
        max: u32,
        regions: &Regions,
        parts: &mut Parts,
    ) -> Result<Option<(Header, Source)>, WireError> {
        Ok(
            match self.next::<true>(rx, input, at, max, regions, parts)? {
                Found::Frame(h, src) => Some((h, src)),
                Found::Whole | Found::More => None,
            },
        )
    }

    /// Reads the next frame of `rx` (the own-cache mode: no input) without handing it
    /// out: true once it is whole in its buffer, where [`frame`](Self::frame) hands it
    /// out later without another read; false while bytes are missing (read into `rx`
    /// and call again). A PUT, REPLY or PART is not read ahead (its data would be
    /// placed before the frames ahead of it are taken): true as soon as its header is in.
    pub fn read_ahead(&mut self, rx: &mut RxBuf, max: u32) -> Result<bool, WireError> {
        let (mut at, no_regions, mut no_parts) = (0, Regions::default(), Parts::default());
        Ok(
            match self.next::<false>(rx, &[], &mut at, max, &no_regions, &mut no_parts)? {
                Found::Whole => true,
                Found::More => false,
                Found::Frame(..) => unreachable!("a frame read ahead is not handed out"),
            },
        )
    }

    /// [`frame`](Self::frame) (`TAKE`) or [`read_ahead`](Self::read_ahead) (not `TAKE`:
    /// a frame found whole, or a placing frame's header, is [`Found::Whole`] and stays
    /// unread).
    #[inline(always)]
    fn next<const TAKE: bool>(
        &mut self,
        rx: &mut RxBuf,
        input: &[u8],
        at: &mut usize,
        max: u32,
        regions: &Regions,
        parts: &mut Parts,
    ) -> Result<Found, WireError> {
        // The common case first: a whole frame already in the cache (the own-cache mode
        // reads many at once), handed out where it lies.
        if let Some((h, need)) = whole_in_cache(rx, max)? {
            if !TAKE {
                return Ok(Found::Whole);
            }
            if !h.kind.places() {
                let (h, r) = self.take_cached(rx, h, need);
                return Ok(Found::Frame(h, Source::Cache(r)));
            }
        }
        loop {
            let rest = &input[(*at).min(input.len())..];
            if rx.wants_all() {
                // A large payload being received in its own buffer.
                if self.large_delivered {
                    self.back_to_cache(rx);
                    continue;
                }
                *at += rx.append(rest);
                // The buffer grows as the payload arrives: a window filled before the
                // payload is complete doubles (for the rest of this input, or for the
                // next read).
                while rx.grow_whole() {
                    *at += rx.append(&input[(*at).min(input.len())..]);
                }
                let start = rx.record_start();
                return Ok(match rx.large_complete() {
                    Some((h, p)) if TAKE => {
                        self.large_delivered = true;
                        Found::Frame(h, Source::Cache(start + h.pad()..start + p.len()))
                    }
                    Some(_) => Found::Whole,
                    None => Found::More,
                });
            }
            if rx.pending() == 0 {
                if rest.is_empty() {
                    if self.big && !self.last_large {
                        self.leave_big(rx);
                    }
                    return Ok(Found::More);
                }
                // A whole frame inside the input is delivered where it lies.
                if rest.len() >= HEADER_LEN {
                    let h = Header::parse(rest, max)?;
                    let need = HEADER_LEN + h.len as usize;
                    if rest.len() >= need && !h.kind.places() {
                        let start = *at + HEADER_LEN;
                        *at += need;
                        let payload = start + h.pad()..start + h.len as usize;
                        return Ok(Found::Frame(h, Source::Input(payload)));
                    }
                }
            }
            // A frame in the cache, or cut by the end of an input: the header first, then
            // exactly the bytes it still misses, so the next frame starts at the front of
            // the next input.
            *at += rx.append_upto(rest, HEADER_LEN);
            let Some(h) = rx.peek_header(max)? else {
                return Ok(Found::More);
            };
            if !TAKE && h.kind.places() {
                return Ok(Found::Whole);
            }
            if h.kind.places() {
                let rest = &input[(*at).min(input.len())..];
                *at += rx.append_upto(rest, HEADER_LEN + PUT_TARGET_LEN);
                if rx.pending() < HEADER_LEN + PUT_TARGET_LEN {
                    return Ok(Found::More);
                }
                let head = &rx.unread()[HEADER_LEN..];
                let len = h.len as usize - PUT_TARGET_LEN;
                let (claim, from) = if h.kind == FrameKind::Part {
                    parts.claim(h.tag, PartHead::parse(head)?, len, max)?
                } else {
                    let t = PutTarget::parse(head)?;
                    let by_peer = h.kind == FrameKind::Put;
                    let claim = regions.claim(t.key, t.addr, len, by_peer).map_err(|_| {
                        WireError::PutOutsideRegions {
                            key: t.key,
                            addr: t.addr,
                            len: len as u64,
                        }
                    })?;
                    self.placed_at = Some(t);
                    (claim, 0)
                };
                rx.consume(HEADER_LEN + PUT_TARGET_LEN);
                let spare = self.spare_placed.take().unwrap_or_else(RxBuf::empty_large);
                let note = u64::from_be_bytes(h.to_bytes());
                let placed = rx.split_placed_at(note, claim, from, from + len, spare);
                self.parked = Some(mem::replace(rx, placed));
                continue;
            }
            let need = HEADER_LEN + h.len as usize;
            if need > rx.room() {
                if self.big {
                    // Larger than the big cache.
                    self.big_to_whole(rx, h);
                    continue;
                }
                // Larger than the cache: continue in the large-payload buffer.
                let spare = self.spare_large.take().unwrap_or_else(RxBuf::empty_large);
                let large = rx.into_large(h, spare);
                self.parked = Some(mem::replace(rx, large));
                continue;
            }
            let rest = &input[(*at).min(input.len())..];
            *at += rx.append_upto(rest, need);
            if rx.pending() < need {
                if self.big {
                    if rx.unread_at() > 0 && need > self.home.as_ref().map_or(0, RxBuf::room) {
                        // A large frame behind others: its bytes stay where they are
                        // (rather than moved to the front).
                        self.big_to_whole(rx, h);
                        continue;
                    }
                    if need == rx.room() {
                        // A frame of the big cache's size: the rest of the cache is its.
                        rx.fill_next_read();
                    }
                }
                return Ok(Found::More);
            }
            if !TAKE {
                return Ok(Found::Whole);
            }
            let (h, r) = self.take_cached(rx, h, need);
            return Ok(Found::Frame(h, Source::Cache(r)));
        }
    }

    /// The next frame when it is an active message without flags whose bytes are all in
    /// the cache (consumed): its tag and where its payload lies; `None`, consuming
    /// nothing, for anything else (padded and lent payloads among them), which
    /// [`frame`](Self::frame) handles. A header it cannot parse is left to `frame` too,
    /// which reports it.
    #[inline]
    pub fn cached_send(&mut self, rx: &mut RxBuf, max: u32) -> Option<(Tag, Range<usize>)> {
        if rx.wants_all() {
            return None;
        }
        let (tag, need) = plain_at(rx.unread(), max)?;
        let h = Header {
            kind: FrameKind::Send,
            tag,
            len: (need - HEADER_LEN) as u32,
            ack: false,
            line: 0,
        };
        let (_, range) = self.take_cached(rx, h, need);
        Some((tag, range))
    }

    /// Whether a run ([`Run`](crate::proto::core::Run)) may take frames from `rx` on its
    /// own, leaving this deframer as it is: `rx` is the cache (no whole buffer being
    /// filled) and no large payload's buffer stands in for it (whose end
    /// [`cached_send`](Self::cached_send) tracks).
    #[inline]
    pub fn runs(&self, rx: &RxBuf) -> bool {
        !self.big && !rx.wants_all()
    }

    /// Whether the walk of `rx` stands between two frames: no payload is being read
    /// into a whole buffer (or the one read there was handed out already), so the
    /// unread bytes, if any, start with a frame's header.
    #[inline]
    pub fn between_frames(&self, rx: &RxBuf) -> bool {
        !rx.wants_all() || self.large_delivered
    }

    /// Whether `rx` is used up with nothing for [`frame`](Self::frame) to do about it
    /// (it would only answer that more bytes are needed): no byte pending, no payload
    /// being read whole, no big cache to leave.
    #[inline]
    pub fn drained(&self, rx: &RxBuf) -> bool {
        rx.pending() == 0 && !rx.wants_all() && (!self.big || self.last_large)
    }

    /// Consumes the whole frame of header `h` (`need` bytes with it) at the front of the
    /// cache and says where in the cache its payload lies (behind its padding).
    #[inline]
    fn take_cached(&mut self, rx: &mut RxBuf, h: Header, need: usize) -> (Header, Range<usize>) {
        if self.big {
            self.last_large = need > self.home.as_ref().map_or(0, RxBuf::room);
        }
        let r = rx.consume(need);
        (h, r.start + HEADER_LEN + h.pad()..r.end)
    }

    /// A delivered large payload: `rx` is the receive cache parked during the large read
    /// again, and the payload's buffer becomes the reusable spare, or, with the own cache,
    /// the cache itself, sized to the frame it held.
    fn back_to_cache(&mut self, rx: &mut RxBuf) {
        self.large_delivered = false;
        let cache = self
            .parked
            .take()
            .expect("cache parked during a large read");
        let mut large = mem::replace(rx, cache);
        if large.is_placed() {
            // The region's memory goes back to its owner, the buffer's box waits for the
            // next put, and the large spare stays as it was.
            large.reset_whole();
            self.spare_placed = Some(large);
            if !self.big {
                rx.cap_next_read(HEADER_LEN);
            }
            return;
        }
        let frame = HEADER_LEN + large.record_len();
        // The next frame is likely like this one: its payload goes where this one's went.
        let at = large.large_complete().and_then(|(h, _)| place(&h));
        large.reset_large();
        large.trim(LARGE_KEEP);
        if self.reuse_large
            && rx.pending() == 0
            && large.reuse_as_cache(frame, at.map(|at| (HEADER_LEN, at)))
        {
            // A large payload is often followed by another of its size: the next read
            // brings it with its header, into this buffer, where it is handed out.
            self.home = Some(mem::replace(rx, large));
            self.big = true;
            self.last_large = true;
            return;
        }
        // Otherwise the next read takes the header alone, so that a large payload next is
        // read straight into its buffer rather than through the cache and a copy (a small
        // frame next costs one more read).
        rx.cap_next_read(HEADER_LEN);
        self.spare_large = Some(large);
    }

    /// The big cache's pending frame continues as a whole buffer, in place (no byte moves),
    /// and the cache proper comes back after it.
    fn big_to_whole(&mut self, rx: &mut RxBuf, h: Header) {
        let note = u64::from_be_bytes(h.to_bytes());
        rx.cache_into_whole(HEADER_LEN, h.len as usize, note, place(&h));
        self.parked = self.home.take();
        self.big = false;
    }

    /// The big cache is used up by frames the cache proper could hold: the cache proper
    /// comes back, and the big cache is the reusable spare again.
    fn leave_big(&mut self, rx: &mut RxBuf) {
        let home = self.home.take().expect("the cache proper waits while big");
        let mut big = mem::replace(rx, home);
        big.reset_large();
        debug_assert!(self.spare_large.is_none(), "the big cache was the spare");
        self.spare_large = Some(big);
        self.big = false;
    }
}

/// Where a message's payload goes in a line of the receiving buffer
/// ([`RxBuf::split_whole`]), so that the kernel's copy into it does not write just ahead of
/// where it reads (see [`LINE`]): a payload whose pages the sender lent at the line offset
/// its header carries, rounded down to a whole record alignment ([`Header::line`]); any
/// other one header past the start of a line, where it lies in the sender's socket pages
/// when its header starts one. A put's data goes where its target says.
#[inline]
fn place(h: &Header) -> Option<usize> {
    match (h.kind, h.ack) {
        (FrameKind::Send, true) => Some(usize::from(h.line) & !(RECORD_ALIGN - 1)),
        (FrameKind::Send, false) => Some(HEADER_LEN % LINE),
        _ => None,
    }
}

/// The header of a frame whose bytes are all in the cache, and the frame's length with its
/// header.
#[inline]
fn whole_in_cache(rx: &RxBuf, max: u32) -> Result<Option<(Header, usize)>, WireError> {
    if rx.wants_all() || rx.pending() < HEADER_LEN {
        return Ok(None);
    }
    let h = Header::parse(rx.unread(), max)?;
    let need = HEADER_LEN + h.len as usize;
    Ok((need <= rx.pending()).then_some((h, need)))
}

/// The tag and the length with header of the frame at the front of `bytes` when it is a
/// SEND without flags within `max` whose bytes are all in `bytes`; `None` for anything
/// else. ([`Deframer::cached_send`] takes the front of the cache with this, and a run of a
/// read, where [`Deframer::runs`] holds, its frames, with nothing of the deframer's to
/// update.)
#[inline]
pub(crate) fn plain_at(bytes: &[u8], max: u32) -> Option<(Tag, usize)> {
    let head: [u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
    let (tag, len) = Header::plain_send(u64::from_be_bytes(head), max)?;
    let need = HEADER_LEN + len as usize;
    (need <= bytes.len()).then_some((tag, need))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::{LINE, WHOLE_FIRST};
    use crate::wire::{FrameKind, Tag};
    use proptest::prelude::*;
    use std::ptr::NonNull;

    fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = Header {
            kind: FrameKind::Send,
            tag: Tag(tag),
            len: payload.len() as u32,
            ack: false,
            line: 0,
        }
        .to_bytes()
        .to_vec();
        v.extend_from_slice(payload);
        v
    }

    /// Feeds `stream` in reads of the given sizes; returns the frames seen.
    fn feed(cap: usize, stream: &[u8], cuts: &[usize]) -> Vec<(u8, Vec<u8>)> {
        let mut rx = cache(cap);
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
                        let l =
                            rx.into_large(h, mem::replace(&mut spare_large, RxBuf::empty_large()));
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

    /// Feeds `stream` through [`Deframer::frame`], own-cache mode (`lent == false`: reads
    /// into the buffer, empty inputs) or lent-input mode (inputs of the given sizes).
    fn deframe(cap: usize, stream: &[u8], cuts: &[usize], lent: bool) -> Vec<(u8, Vec<u8>)> {
        deframe_into(cap, stream, cuts, lent, &Regions::default()).unwrap()
    }

    /// The deframer of each mode: the own cache's, or the lent inputs'.
    fn deframer(lent: bool) -> Deframer {
        if lent {
            Deframer::default()
        } else {
            Deframer::own_cache()
        }
    }

    /// [`deframe`] with PUT frames placed in `regions` (they yield no entry); the first
    /// error ends the walk.
    fn deframe_into(
        cap: usize,
        stream: &[u8],
        cuts: &[usize],
        lent: bool,
        regions: &Regions,
    ) -> Result<Vec<(u8, Vec<u8>)>, WireError> {
        walk_reads(deframer(lent), cap, stream, cuts, lent, regions).map(|(out, _)| out)
    }

    /// Frames out of a walk: tag and payload.
    type Walked = Vec<(u8, Vec<u8>)>;

    /// A stream of messages of the given payload sizes (tag = index, distinct bytes), and
    /// the frames a walk of it must yield.
    fn stream_of(sizes: &[usize]) -> (Vec<u8>, Walked) {
        let mut s = Vec::new();
        let mut want = Vec::new();
        for (i, n) in sizes.iter().enumerate() {
            let p: Vec<u8> = (0..*n).map(|j| (i * 31 + j) as u8).collect();
            s.extend(frame(i as u8, &p));
            want.push((i as u8, p));
        }
        (s, want)
    }

    /// Walks `stream` with `d` as [`deframe_into`] does; also returns how many reads (or
    /// inputs) it took.
    fn walk_reads(
        mut d: Deframer,
        cap: usize,
        stream: &[u8],
        cuts: &[usize],
        lent: bool,
        regions: &Regions,
    ) -> Result<(Walked, usize), WireError> {
        let mut rx = cache(cap);
        let mut out = Vec::new();
        let (mut off, mut ci) = (0, 0);
        while off < stream.len() {
            let want = cuts.get(ci).copied().unwrap_or(usize::MAX).max(1);
            ci += 1;
            let n = if lent {
                want.min(stream.len() - off)
            } else {
                let spare = rx.spare_mut();
                let n = want.min(spare.len()).min(stream.len() - off);
                spare[..n].copy_from_slice(&stream[off..off + n]);
                rx.commit(n);
                n
            };
            let input = if lent { &stream[off..off + n] } else { &[][..] };
            let mut at = 0;
            while let Some((h, src)) = d.frame(
                &mut rx,
                input,
                &mut at,
                1 << 24,
                regions,
                &mut Parts::default(),
            )? {
                if h.kind == FrameKind::Put {
                    continue;
                }
                let p = match src {
                    Source::Input(r) => input[r].to_vec(),
                    Source::Cache(r) => {
                        let p = rx.bytes(r);
                        // A payload of its own buffer lies 8-byte aligned.
                        assert!(!rx.wants_all() || (p.as_ptr() as usize).is_multiple_of(8));
                        p.to_vec()
                    }
                };
                out.push((h.tag.0, p));
            }
            assert_eq!(at, input.len(), "an input is used up");
            if !rx.wants_all() {
                rx.compact();
            }
            off += n;
        }
        Ok((out, ci))
    }

    fn put_frame(key: u64, addr: u64, data: &[u8]) -> Vec<u8> {
        let mut v = Header {
            kind: FrameKind::Put,
            tag: Tag(0),
            len: (PUT_TARGET_LEN + data.len()) as u32,
            ack: false,
            line: 0,
        }
        .to_bytes()
        .to_vec();
        v.extend_from_slice(&PutTarget { key, addr }.to_bytes());
        v.extend_from_slice(data);
        v
    }

    /// A region over a fresh zeroed buffer (boxed: its address stays put).
    fn region(len: usize) -> (Regions, Box<[u8]>, u64) {
        let mut mem = vec![0u8; len].into_boxed_slice();
        let mut regions = Regions::default();
        let base = NonNull::new(mem.as_mut_ptr()).expect("boxed slice");
        // SAFETY: moving the box does not move its heap memory; every caller keeps `mem`
        // alive past its last walk and touches it only when no placed buffer is left.
        #[allow(unsafe_code)]
        let key = unsafe { regions.register(base, len, crate::buf::Access::Write) };
        (regions, mem, key)
    }

    /// Reads `s` into an own-cache deframer (cache of 256 bytes) at most `max_read` bytes at
    /// a time, as the reactor does, and hands every frame (its header, its cached payload,
    /// the deframer and the cache) to `check`; returns how many frames came.
    fn walk_own_cache(
        s: &[u8],
        max_read: usize,
        mut check: impl FnMut(&Header, &[u8], &Deframer, &RxBuf),
    ) -> usize {
        let (mut d, mut rx, regions) = (Deframer::own_cache(), cache(256), Regions::default());
        let (mut off, mut got) = (0, 0);
        for _ in 0..1000 {
            if off == s.len() {
                break;
            }
            let spare = rx.spare_mut();
            let n = spare.len().min(s.len() - off).min(max_read);
            assert!(n > 0, "room for the next read");
            spare[..n].copy_from_slice(&s[off..off + n]);
            rx.commit(n);
            off += n;
            let mut at = 0;
            while let Some((h, src)) = d
                .frame(
                    &mut rx,
                    &[],
                    &mut at,
                    1 << 24,
                    &regions,
                    &mut Parts::default(),
                )
                .unwrap()
            {
                let Source::Cache(r) = src else {
                    panic!("the own cache hands out cached bytes")
                };
                check(&h, rx.bytes(r), &d, &rx);
                got += 1;
            }
            if !rx.wants_all() {
                rx.compact();
            }
        }
        assert_eq!(off, s.len(), "the whole stream was read");
        got
    }

    /// A payload whose pages the sender lent lands at the line offset its header gives
    /// (rounded down to 8 bytes), one the sender's kernel copied lands a header past the
    /// start of a line: in its own buffer, and in that buffer serving as the cache for the
    /// next ones.
    #[test]
    fn large_payloads_land_at_their_place_in_the_line() {
        let p: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
        for line in [
            None,
            Some(0u8),
            Some(5),
            Some(8),
            Some(24),
            Some(40),
            Some(63),
        ] {
            let mut s = Vec::new();
            for tag in 0..4u8 {
                let mut f = frame(tag, &p);
                if let Some(line) = line {
                    f[2] = line;
                    f[3] = 1; // FLAG_ACK, with the line offset in bits 8-13
                }
                s.extend(f);
            }
            let want = line.map_or(HEADER_LEN, |l| usize::from(l) & !7);
            let mut got = 0u8;
            let n = walk_own_cache(&s, usize::MAX, |h, q, _, _| {
                let lent = line.is_some();
                assert_eq!(
                    (h.tag.0, h.ack, h.line, q),
                    (got, lent, line.unwrap_or(0), &p[..])
                );
                assert_eq!(
                    q.as_ptr() as usize % LINE,
                    want,
                    "frame {got}, line {line:?}"
                );
                got += 1;
            });
            assert_eq!(n, 4);
        }
    }

    /// After a large payload, the next ones of its size come through its buffer serving as
    /// the cache even when each arrives in two reads, and that buffer does not grow: a cache
    /// whose reads start into a line (to place the payload) is not a frame behind others.
    #[test]
    fn the_big_cache_takes_frames_cut_in_two_without_growing() {
        let p: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut s = Vec::new();
        for tag in 0..6u8 {
            s.extend(frame(tag, &p));
        }
        let (mut got, mut held) = (0u8, None);
        let n = walk_own_cache(&s, 1500, |h, q, d, rx| {
            assert_eq!((h.tag.0, q), (got, &p[..]));
            if got > 0 {
                assert!(
                    d.big && !rx.wants_all(),
                    "frame {got} came through the big cache"
                );
                let now = rx.allocated();
                assert_eq!(
                    *held.get_or_insert(now),
                    now,
                    "the big cache grew at frame {got}"
                );
            }
            got += 1;
        });
        assert_eq!(n, 6);
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
        for lent in [false, true] {
            assert_eq!(deframe(64, &s, &[usize::MAX], lent), want);
            assert_eq!(deframe(64, &s, &[1; 100_000], lent), want);
        }
    }

    #[test]
    fn payload_larger_than_cache_goes_to_its_own_buffer() {
        let big: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut s = frame(1, b"a");
        s.extend(frame(2, &big));
        s.extend(frame(3, b"z"));
        let want = vec![(1, b"a".to_vec()), (2, big), (3, b"z".to_vec())];
        let cuts = [100, 7, 3000, 1, 10_000];
        assert_eq!(feed(256, &s, &cuts), want);
        assert_eq!(deframe(256, &s, &cuts, false), want);
        assert_eq!(deframe(256, &s, &cuts, true), want);
    }

    /// With the own cache, after a large payload its buffer is the cache: each next frame
    /// of that size comes in with its header by one read (the header-first reads took
    /// two), and frames of other sizes around them come out unchanged.
    #[test]
    fn after_a_large_payload_the_next_of_its_size_takes_one_read() {
        let same: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 1000]).collect();
        let mut s = Vec::new();
        for (i, p) in same.iter().enumerate() {
            s.extend(frame(i as u8, p));
        }
        let want: Vec<(u8, Vec<u8>)> = same
            .into_iter()
            .enumerate()
            .map(|(i, p)| (i as u8, p))
            .collect();
        let reads = |d| walk_reads(d, 256, &s, &[], false, &Regions::default()).unwrap();
        let (out, n) = reads(Deframer::own_cache());
        assert_eq!(out, want);
        // The first frame: the cache's read and the rest into its buffer; then one each.
        assert_eq!(n, 2 + 4);
        let (out, n) = reads(Deframer::default());
        assert_eq!(out, want);
        assert_eq!(n, 2 + 4 * 2);

        // Smaller, larger and equal frames after a large one, read whole or a byte at a
        // time: all come out, in order.
        let sizes = [
            1000usize, 1000, 5, 0, 3000, 3000, 1000, 7, 250, 1000, 9000, 9000, 3,
        ];
        let (s, want) = stream_of(&sizes);
        for cuts in [vec![], vec![1; s.len()], vec![1009, 3, 2000, 17, 4000]] {
            let (out, _) = walk_reads(
                Deframer::own_cache(),
                256,
                &s,
                &cuts,
                false,
                &Regions::default(),
            )
            .unwrap();
            assert_eq!(out, want, "cuts {:?}", &cuts[..cuts.len().min(5)]);
        }
    }

    /// After a large payload, the next read takes only a header: a second large payload
    /// then goes straight into its own buffer (no byte of it through the cache), and a
    /// small frame next still comes out whole.
    #[test]
    fn after_a_large_payload_the_next_read_is_a_header() {
        let big = vec![7u8; 1000];
        let mut s = frame(1, &big);
        s.extend(frame(2, &big));
        s.extend(frame(3, b"z"));
        let mut d = Deframer::default();
        let mut rx = cache(256);
        let (mut off, mut got, mut header_reads) = (0, Vec::new(), 0);
        while off < s.len() {
            let offered = rx.spare_mut().len();
            if !rx.wants_all() && rx.pending() == 0 && offered == HEADER_LEN {
                header_reads += 1;
            }
            let spare = rx.spare_mut();
            let n = spare.len().min(s.len() - off);
            spare[..n].copy_from_slice(&s[off..off + n]);
            rx.commit(n);
            off += n;
            let mut at = 0;
            while let Some((h, src)) = d
                .frame(
                    &mut rx,
                    &[],
                    &mut at,
                    1 << 24,
                    &Regions::default(),
                    &mut Parts::default(),
                )
                .unwrap()
            {
                let Source::Cache(r) = src else {
                    panic!("no input given")
                };
                got.push((h.tag.0, rx.bytes(r).len()));
            }
            if !rx.wants_all() {
                rx.compact();
            }
        }
        assert_eq!(got, vec![(1, 1000), (2, 1000), (3, 1)]);
        // The reads after the first and the second large payload.
        assert_eq!(header_reads, 2);
    }

    /// A reused large-payload buffer grows to exactly the new frame (and the line its
    /// payload may start into), never to twice the previous one (a peer must not make a
    /// connection hold more than the maximum frame).
    #[test]
    fn large_buffer_never_exceeds_the_largest_frame() {
        let max = 64_511usize;
        let mut spare = RxBuf::empty_large();
        for len in [53_721usize, max] {
            let mut rx = cache(68);
            let h = Header {
                kind: FrameKind::Send,
                tag: Tag(0),
                len: len as u32,
                ack: false,
                line: 0,
            }
            .to_bytes();
            rx.spare_mut()[..8].copy_from_slice(&h);
            rx.commit(8);
            let Next::Large(h) = rx.next_frame(max as u32).unwrap() else {
                panic!("expected a large frame");
            };
            let mut l = rx.into_large(h, spare);
            assert!(l.allocated() <= max + LINE, "{} > {max}", l.allocated());
            l.reset_large();
            spare = l;
        }
    }

    /// A header announcing a huge payload commits memory only as the payload's bytes
    /// arrive: a stalled one costs at most the first window, and the buffer never holds
    /// much more than twice what arrived, in both receive modes.
    #[test]
    fn large_payload_memory_follows_its_bytes() {
        let len = 8 << 20;
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        // Behind a large frame of 5,000 bytes: with the own cache, the huge one starts in
        // the buffer of that one.
        let mut stream = frame(2, &[5; 5000]);
        stream.extend(frame(3, &payload));
        for lent in [false, true] {
            let mut d = deframer(lent);
            let mut rx = cache(4096);
            let (mut off, mut peak) = (0, 0);
            let mut out = None;
            while off < stream.len() {
                let n = if lent {
                    (stream.len() - off).min(100_000)
                } else {
                    let spare = rx.spare_mut();
                    let n = spare.len().min(stream.len() - off).min(100_000);
                    spare[..n].copy_from_slice(&stream[off..off + n]);
                    rx.commit(n);
                    n
                };
                let input = if lent { &stream[off..off + n] } else { &[][..] };
                let mut at = 0;
                while let Some((h, src)) = d
                    .frame(
                        &mut rx,
                        input,
                        &mut at,
                        1 << 30,
                        &Regions::default(),
                        &mut Parts::default(),
                    )
                    .unwrap()
                {
                    if h.tag.0 == 2 {
                        continue;
                    }
                    let Source::Cache(r) = src else {
                        panic!("a large payload is delivered from its buffer");
                    };
                    out = Some((h.tag.0, rx.bytes(r) == &payload[..]));
                }
                assert_eq!(at, input.len());
                off += n;
                let held = rx.allocated();
                peak = peak.max(held);
                // Beyond the bytes: the record may start up to a line into its buffer,
                // which may start up to a line into the cache it was.
                let lines = 2 * LINE;
                assert!(
                    held <= (2 * off).max(WHOLE_FIRST + HEADER_LEN) + lines,
                    "lent {lent}: {held} bytes held after {off} received"
                );
                if off == HEADER_LEN + 1000 || off == n {
                    assert!(
                        held <= WHOLE_FIRST + lines,
                        "a barely started payload holds {held}"
                    );
                }
            }
            assert_eq!(out, Some((3, true)), "lent {lent}");
            // At most the frame, header included (it lies in the buffer behind its header),
            // and the lines above.
            assert!(
                peak <= HEADER_LEN + len + 2 * LINE,
                "lent {lent}: {peak} > {len}"
            );
        }
    }

    #[test]
    fn oversize_length_is_an_error_not_an_allocation() {
        let mut rx = cache(128);
        let h = Header {
            kind: FrameKind::Send,
            tag: Tag(0),
            len: u32::MAX,
            ack: false,
            line: 0,
        }
        .to_bytes();
        rx.spare_mut()[..8].copy_from_slice(&h);
        rx.commit(8);
        assert!(matches!(
            rx.next_frame(1 << 20),
            Err(WireError::FrameTooLarge { .. })
        ));
        assert_eq!(rx.allocated(), 128);
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
            let (s, want) = stream_of(&sizes);
            prop_assert_eq!(&feed(cap, &s, &cuts), &want);
            prop_assert_eq!(&deframe(cap, &s, &cuts, false), &want);
            prop_assert_eq!(&deframe(cap, &s, &cuts, true), &want);
            // The own cache without reusing a large payload's buffer (the header-first
            // read after it, as when that buffer was released).
            let plain = walk_reads(Deframer::default(), cap, &s, &cuts, false, &Regions::default());
            prop_assert_eq!(&plain.unwrap().0, &want);
        }

        /// Puts of any size, between messages, land in their region at their address
        /// however the stream is cut, in both receive modes, and the messages around
        /// them come out unchanged.
        #[test]
        fn puts_land_in_place_across_any_cuts(
            ops in proptest::collection::vec((0usize..3000, 0usize..6000, 0usize..300), 1..20),
            cuts in proptest::collection::vec(1usize..900, 0..200),
            cap in 32usize..1024,
            lent: bool,
        ) {
            const LEN: usize = 9000;
            let (mut regions, mut mem, key) = region(LEN);
            let base = mem.as_ptr() as u64;
            let mut model = vec![0u8; LEN];
            let (mut s, mut want) = (Vec::new(), Vec::new());
            for (i, &(n, at, m)) in ops.iter().enumerate() {
                let at = at.min(LEN - n);
                let data: Vec<u8> = (0..n).map(|j| (i * 131 + j * 7 + 1) as u8).collect();
                model[at..at + n].copy_from_slice(&data);
                s.extend(put_frame(key, base + at as u64, &data));
                let p: Vec<u8> = (0..m).map(|j| (i + j) as u8).collect();
                s.extend(frame(i as u8, &p));
                want.push((i as u8, p));
            }
            prop_assert_eq!(&deframe_into(cap, &s, &cuts, lent, &regions).unwrap(), &want);
            prop_assert!(mem[..] == model[..], "region differs from the model");
            prop_assert!(regions.deregister(key).is_ok(), "no claim outlives its put");
            mem.fill(0);
        }
    }

    /// A put outside every region is an error before any byte is written: beyond the
    /// end, before the start, with a stale or unknown key, and with an address whose
    /// end wraps around.
    #[test]
    fn put_outside_its_region_is_an_error() {
        let (mut regions, mem, key) = region(100);
        let base = mem.as_ptr() as u64;
        let cases = [
            (key, base + 90, 20usize),
            (key, base - 1, 1),
            (key ^ 1, base, 10),
            (key + (1 << 32), base, 10),
            (key, u64::MAX - 4, 10),
        ];
        for (k, addr, n) in cases {
            let s = put_frame(k, addr, &vec![0xAB; n]);
            for lent in [false, true] {
                let r = deframe_into(64, &s, &[usize::MAX], lent, &regions);
                assert_eq!(
                    r,
                    Err(WireError::PutOutsideRegions {
                        key: k,
                        addr,
                        len: n as u64
                    }),
                    "key {k:#x} addr {addr:#x} len {n}"
                );
            }
        }
        assert!(mem.iter().all(|&b| b == 0), "nothing written");
        regions.deregister(key).unwrap();
        let s = put_frame(key, base, &[1]);
        assert!(
            deframe_into(64, &s, &[usize::MAX], false, &regions).is_err(),
            "a deregistered region takes no put"
        );
        assert_eq!(mem[0], 0);
    }
}
