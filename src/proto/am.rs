//! The active-message table: 256 handler slots indexed by the frame's `u8` tag, as the
//! BTL's `active_message_trigger` array. The table only stores and hands out handlers;
//! the driver calls them (so a handler can borrow the driver mutably while it runs: it is
//! taken out of its slot for the call and put back after). No I/O here.

use crate::wire::Tag;

/// Number of slots: one per `u8` tag.
pub const AM_SLOTS: usize = 256;

/// Tag-indexed handler slots.
///
/// Every `Tag` indexes a slot of the fixed-size array: no lookup is bounds-checked at run
/// time or allocates.
#[derive(Debug)]
pub struct AmTable<H> {
    slots: Box<[Option<H>; AM_SLOTS]>,
    /// Per tag: [`LENT`] from the take of its handler for a call (kept after the call
    /// until the next take), plus [`REMOVED`] once unregistered after that take: a
    /// handler removed during its call is then not put back.
    flags: [u8; AM_SLOTS],
    unknown: u64,
    /// Registrations and unregistrations so far ([`changes`](Self::changes)).
    changes: u64,
}

/// The tag's handler is out for its call.
const LENT: u8 = 1;
/// The tag's handler was removed during its call.
const REMOVED: u8 = 2;

impl<H> Default for AmTable<H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<H> AmTable<H> {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            slots: Box::new(std::array::from_fn(|_| None)),
            flags: [0; AM_SLOTS],
            unknown: 0,
            changes: 0,
        }
    }

    /// Installs `h` for `tag`; a taken tag is an error that gives the handler back. A
    /// handler registered while the tag's handler is out for its call replaces it.
    pub fn register(&mut self, tag: Tag, h: H) -> Result<(), H> {
        let slot = &mut self.slots[tag.0 as usize];
        if slot.is_some() {
            return Err(h);
        }
        *slot = Some(h);
        self.changes += 1;
        Ok(())
    }

    /// Removes the handler of `tag` and returns it. A handler out for its call is not
    /// returned (the caller holds it) but is marked so that it is not put back.
    pub fn unregister(&mut self, tag: Tag) -> Option<H> {
        let flags = &mut self.flags[tag.0 as usize];
        if *flags & LENT != 0 {
            *flags |= REMOVED;
        }
        self.changes += 1;
        self.slots[tag.0 as usize].take()
    }

    /// Removes the handler of `tag`, also one that is out for its call (it then ends its
    /// call and is not put back). True if there was one.
    pub fn remove(&mut self, tag: Tag) -> bool {
        let running = self.flags[tag.0 as usize] == LENT;
        self.unregister(tag).is_some() || running
    }

    /// Takes the handler of `tag` out for a call; `None` (and the message is counted as
    /// unknown) when the tag has none.
    #[inline]
    pub fn take(&mut self, tag: Tag) -> Option<H> {
        let h = self.slots[tag.0 as usize].take();
        if h.is_some() {
            self.flags[tag.0 as usize] = LENT;
        } else {
            self.unknown += 1;
        }
        h
    }

    /// Puts a handler back after its call, unless the call removed it or registered a
    /// new one for the same tag (which then wins).
    #[inline]
    pub fn restore(&mut self, tag: Tag, h: H) {
        // The flags keep `LENT` after the call: the next `take` sets them afresh, and a
        // `REMOVED` seen here was set during this call.
        if self.flags[tag.0 as usize] == LENT {
            let slot = &mut self.slots[tag.0 as usize];
            if slot.is_none() {
                *slot = Some(h);
            }
        }
    }

    /// How many times a handler was registered or unregistered: a driver delivering
    /// several messages of one tag in a row keeps the handler out of its slot meanwhile,
    /// as long as this does not change (no call removed it or registered another one),
    /// and [`restore`](Self::restore)s it at the end.
    #[inline]
    pub fn changes(&self) -> u64 {
        self.changes
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

    #[test]
    fn changes_count_registrations_and_removals_only() {
        let mut t: AmTable<u32> = AmTable::new();
        t.register(Tag(1), 1).unwrap();
        let c = t.changes();
        let h = t.take(Tag(1)).unwrap();
        t.restore(Tag(1), h);
        assert_eq!(t.take(Tag(2)), None);
        assert_eq!(t.changes(), c, "a call's take and restore change nothing");
        assert_eq!(t.register(Tag(1), 2), Err(2));
        assert_eq!(t.changes(), c, "a refused registration changes nothing");
        t.register(Tag(2), 2).unwrap();
        assert_eq!(t.changes(), c + 1);
        assert!(t.remove(Tag(2)));
        assert_eq!(t.changes(), c + 2);
    }

    /// A handler that removes its own tag during its call is not put back.
    #[test]
    fn a_handler_removes_its_own_tag() {
        let mut t: AmTable<u32> = AmTable::new();
        t.register(Tag(3), 1).unwrap();
        let h = t.take(Tag(3)).unwrap();
        assert!(t.remove(Tag(3)), "the running handler counts as registered");
        assert!(!t.remove(Tag(3)), "removed once");
        t.restore(Tag(3), h);
        assert_eq!(t.take(Tag(3)), None, "not put back after the call");
        assert_eq!(t.unknown(), 1);
        // Removed, then registered again during the call: the new one stays.
        t.register(Tag(4), 1).unwrap();
        let h = t.take(Tag(4)).unwrap();
        assert!(t.remove(Tag(4)));
        t.register(Tag(4), 2).unwrap();
        t.restore(Tag(4), h);
        assert_eq!(t.unregister(Tag(4)), Some(2));
        // Replaced, then removed during the call: nothing is left.
        t.register(Tag(5), 1).unwrap();
        let h = t.take(Tag(5)).unwrap();
        t.register(Tag(5), 2).unwrap();
        assert!(t.remove(Tag(5)));
        t.restore(Tag(5), h);
        assert_eq!(t.unregister(Tag(5)), None);
    }
}
