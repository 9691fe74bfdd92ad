//! The active-message table: 256 handler slots indexed by the frame's `u8` tag, as the
//! BTL's `active_message_trigger` array. The table only stores and hands out handlers;
//! the driver calls them (so a handler can borrow the driver mutably while it runs: it is
//! taken out of its slot for the call and put back after). No I/O here.

use crate::wire::Tag;

/// Number of slots: one per `u8` tag.
pub const AM_SLOTS: usize = 256;

/// Tag-indexed handler slots.
///
/// Invariant: `slots.len() == AM_SLOTS`, so every `Tag` indexes a slot (no bounds check
/// can fail and no lookup allocates).
#[derive(Debug)]
pub struct AmTable<H> {
    slots: Vec<Option<H>>,
    unknown: u64,
}

impl<H> Default for AmTable<H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<H> AmTable<H> {
    /// An empty table.
    pub fn new() -> Self {
        let mut slots = Vec::with_capacity(AM_SLOTS);
        slots.resize_with(AM_SLOTS, || None);
        Self { slots, unknown: 0 }
    }

    /// Installs `h` for `tag`; a taken tag is an error that gives the handler back.
    pub fn register(&mut self, tag: Tag, h: H) -> Result<(), H> {
        let slot = &mut self.slots[tag.0 as usize];
        if slot.is_some() {
            return Err(h);
        }
        *slot = Some(h);
        Ok(())
    }

    /// Removes the handler of `tag`.
    pub fn unregister(&mut self, tag: Tag) -> Option<H> {
        self.slots[tag.0 as usize].take()
    }

    /// Takes the handler of `tag` out for a call; `None` (and the message is counted as
    /// unknown) when the tag has none.
    #[inline]
    pub fn take(&mut self, tag: Tag) -> Option<H> {
        let h = self.slots[tag.0 as usize].take();
        if h.is_none() {
            self.unknown += 1;
        }
        h
    }

    /// Puts a handler back after its call, unless the call registered a new one for the
    /// same tag (which then wins).
    #[inline]
    pub fn restore(&mut self, tag: Tag, h: H) {
        let slot = &mut self.slots[tag.0 as usize];
        if slot.is_none() {
            *slot = Some(h);
        }
    }

    /// Messages that arrived for a tag without a handler.
    pub fn unknown(&self) -> u64 {
        self.unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_take_restore() {
        let mut t: AmTable<u32> = AmTable::new();
        assert_eq!(t.register(Tag(7), 1), Ok(()));
        assert_eq!(t.register(Tag(7), 2), Err(2), "a taken tag is an error");
        assert_eq!(t.register(Tag(255), 3), Ok(()));
        // Dispatch: taken out for the call, put back after.
        let h = t.take(Tag(7)).unwrap();
        assert_eq!(t.take(Tag(7)), None, "slot is empty during the call");
        t.restore(Tag(7), h);
        assert_eq!(t.unknown(), 1);
        // A handler registered during the call wins over the one put back.
        let h = t.take(Tag(255)).unwrap();
        t.register(Tag(255), 9).unwrap();
        t.restore(Tag(255), h);
        assert_eq!(t.unregister(Tag(255)), Some(9));
        assert_eq!(t.take(Tag(0)), None);
        assert_eq!(t.unknown(), 2);
        assert_eq!(t.unregister(Tag(7)), Some(1));
    }
}
