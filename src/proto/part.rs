//! The receiver's side of messages cut into PART frames (see "Parts" in `wire.rs`): the
//! message an endpoint is assembling, and where each piece goes. No I/O here.
//!
//! A piece is placed as a PUT's data is: once its header and head are in, the walk's
//! buffer becomes a whole buffer over the message's memory ([`Claim::owned`]), at the
//! piece's offset, and the kernel reads the piece straight there. The pieces of a message
//! are consecutive counted frames of the peer's stream, and the stream is taken in order
//! (a link held for a later run reads no PART ahead), so one piece at a time is claimed:
//! the next only once the one before was taken. A piece whose frame the walk will drop (a
//! run of an older epoch, sent again after a failover) goes to memory of its own.

use std::sync::Arc;

use crate::buf::{Claim, OwnedMem};
use crate::wire::{PartHead, Tag, WireError};

/// The message an endpoint is assembling from its peer's PART frames, if any.
#[derive(Debug, Default)]
pub struct Parts {
    asm: Option<Assembly>,
    /// The memory of the last message assembled, for the next (up to [`SPARE_KEEP`]): a
    /// stream of cut messages reuses one buffer rather than faulting in fresh pages for
    /// each. Reused once the receive that handed the last one out let go of it.
    spare: Option<Arc<OwnedMem>>,
    /// The next frame the walk hands out will be dropped ([`Parts::claim`]).
    dropping: bool,
}

/// The largest memory kept for the next message (as the deframer keeps its large
/// buffers): one per endpoint that receives cut messages.
const SPARE_KEEP: usize = 16 << 20;

/// A message being assembled.
#[derive(Debug)]
struct Assembly {
    tag: Tag,
    /// At least `total` bytes; the message is the first `total`.
    mem: Arc<OwnedMem>,
    total: usize,
    /// Bytes of the pieces taken so far: the next piece starts here.
    taken: usize,
}

impl Parts {
    /// Says whether the next frame the walk hands out will be dropped, so that a PART
    /// among them is placed aside.
    pub(crate) fn set_dropping(&mut self, dropping: bool) {
        self.dropping = dropping;
    }

    /// Where the piece of a PART frame of `tag` goes: `len` bytes after its head `head`.
    /// Returns the claim (the whole message's memory) and where in it the piece starts.
    /// The first piece, at offset 0, starts a message of `head.total` bytes (at most
    /// `max`); each next one must start where the pieces taken so far end, with the same
    /// tag and total. Anything else is [`WireError::BadPart`]. A piece the walk will drop
    /// gets memory of its own, unchecked.
    pub fn claim(
        &mut self,
        tag: Tag,
        head: PartHead,
        len: usize,
        max: u32,
    ) -> Result<(Claim, usize), WireError> {
        if self.dropping {
            return Ok((Claim::owned(&OwnedMem::zeroed(len)), 0));
        }
        let bad = WireError::BadPart {
            total: head.total,
            offset: head.offset,
            len: len as u64,
        };
        let fits = head
            .offset
            .checked_add(len as u64)
            .is_some_and(|end| len > 0 && end <= head.total && head.total <= u64::from(max));
        if !fits {
            return Err(bad);
        }
        let total = head.total as usize;
        match &self.asm {
            None if head.offset == 0 => {
                let mem = match self.spare.take() {
                    Some(m) if m.len() >= total && Arc::strong_count(&m) == 1 => m,
                    _ => OwnedMem::zeroed(total),
                };
                self.asm = Some(Assembly {
                    tag,
                    mem,
                    total,
                    taken: 0,
                });
            }
            Some(a) if a.tag == tag && a.total == total && a.taken as u64 == head.offset => {}
            _ => return Err(bad),
        }
        let a = self.asm.as_ref().expect("assembling");
        Ok((Claim::owned(&a.mem), head.offset as usize))
    }

    /// The stream starts a new epoch (this side writes a RESUME). A piece claimed and not
    /// taken may still be read, by a receive of the old epoch whose frame will be
    /// dropped, into the message's memory, where the same piece sent again is placed
    /// next: while any claim is out, the pieces taken so far move to memory of their own
    /// (a copy, once per failover), and that receive writes where nothing reads.
    pub(crate) fn new_epoch(&mut self) {
        if let Some(a) = self.asm.as_mut() {
            if Arc::strong_count(&a.mem) > 1 {
                // Claims write from the piece after those taken on: the copied bytes are
                // still.
                a.mem = a.mem.copy_prefix(a.taken);
            }
        }
    }

    /// The piece of `len` bytes claimed last was taken: true when it was the message's
    /// last, which is then assembled (its memory lives on in the claim of the buffer
    /// that placed the piece, until the message is handed out, and is kept for the next).
    pub(crate) fn took(&mut self, len: usize) -> bool {
        let Some(a) = self.asm.as_mut() else {
            return false;
        };
        a.taken += len;
        if a.taken < a.total {
            return false;
        }
        if let Some(a) = self.asm.take() {
            if a.mem.len() <= SPARE_KEEP {
                self.spare = Some(a.mem);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(total: u64, offset: u64) -> PartHead {
        PartHead { total, offset }
    }

    #[test]
    fn pieces_are_claimed_in_order_and_complete_once() {
        let mut p = Parts::default();
        let (c, at) = p.claim(Tag(3), head(10, 0), 4, 64).unwrap();
        assert_eq!((c.len(), at), (10, 0));
        // Claimed again before it was taken (its link failed): the same place.
        assert_eq!(p.claim(Tag(3), head(10, 0), 4, 64).unwrap().1, 0);
        assert!(!p.took(4));
        assert_eq!(p.claim(Tag(3), head(10, 4), 6, 64).unwrap().1, 4);
        assert!(p.took(6));
        // A new message may start; it reuses the memory once the last claim of the
        // message before is gone.
        let first = c.mem().as_ptr();
        drop(c);
        let (c2, _) = p.claim(Tag(4), head(5, 0), 5, 64).unwrap();
        assert_eq!(c2.mem().as_ptr(), first, "reused");
        assert!(p.took(5));
        let (c3, _) = p.claim(Tag(5), head(8, 0), 8, 64).unwrap();
        assert_ne!(c3.mem().as_ptr(), c2.mem().as_ptr(), "in use: not reused");
    }

    #[test]
    fn a_piece_that_does_not_continue_the_message_is_an_error() {
        let mut p = Parts::default();
        let bad = |p: &mut Parts, tag, total, off, len| {
            matches!(
                p.claim(Tag(tag), head(total, off), len, 64),
                Err(WireError::BadPart { .. })
            )
        };
        assert!(bad(&mut p, 1, 10, 4, 6), "no message started at 0");
        assert!(bad(&mut p, 1, 100, 0, 10), "total above the largest frame");
        assert!(bad(&mut p, 1, 10, 0, 11), "past its total");
        assert!(bad(&mut p, 1, 10, 0, 0), "empty");
        assert!(bad(&mut p, 1, u64::MAX, u64::MAX, 1), "overflow");
        p.claim(Tag(1), head(10, 0), 4, 64).unwrap();
        p.took(4);
        assert!(bad(&mut p, 2, 10, 4, 6), "another tag");
        assert!(bad(&mut p, 1, 12, 4, 6), "another total");
        assert!(bad(&mut p, 1, 10, 5, 5), "a gap");
        assert!(
            bad(&mut p, 1, 10, 0, 4),
            "a new message before this one ended"
        );
    }

    #[test]
    fn a_new_epoch_moves_the_pieces_taken_away_from_a_claim_still_out() {
        let mut p = Parts::default();
        let (mut first, _) = p.claim(Tag(1), head(8, 0), 4, 64).unwrap();
        first.mem_mut()[..4].copy_from_slice(b"abcd");
        drop(first);
        p.took(4);
        let (mut stale, at) = p.claim(Tag(1), head(8, 4), 4, 64).unwrap();
        p.new_epoch();
        let (mut again, at2) = p.claim(Tag(1), head(8, 4), 4, 64).unwrap();
        assert_eq!((at, at2), (4, 4));
        stale.mem_mut()[4..].copy_from_slice(b"XXXX");
        again.mem_mut()[4..].copy_from_slice(b"efgh");
        assert!(p.took(4));
        assert_eq!(again.mem(), b"abcdefgh");
    }

    #[test]
    fn a_dropped_piece_is_placed_aside() {
        let mut p = Parts::default();
        p.set_dropping(true);
        let (c, at) = p.claim(Tag(1), head(1 << 40, 77), 8, 64).unwrap();
        assert_eq!((c.len(), at), (8, 0));
        p.set_dropping(false);
        assert!(p.asm.is_none());
    }
}
