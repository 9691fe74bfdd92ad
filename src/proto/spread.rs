//! The receiver's order over a stream spread over an endpoint's links ([`RunOrder`]).
//! No I/O here.
//!
//! A *run* is a range of consecutive counted frames of one epoch's stream written on one
//! link, opened by a RUN frame ([`RunFrame`]: its offset in the epoch's stream, in
//! frames, the epoch, how many frames). The sender's batches are its runs: a link takes
//! the next queued frames each time its batch comes back (`Core::spread` in `tx.rs`), so
//! each link carries a share in proportion to what it moves. The receiver consumes only
//! the link whose run starts at the position the stream reached; a link whose run starts
//! further waits once it has read the run's first frame whole (its further bytes stay in
//! its socket, flow control holds its sender), and the frames of a run of an older epoch
//! are dropped. So frames are taken once, in stream
//! order, without a reorder buffer.
//!
//! Epochs: each direction's epoch is chosen by its *receiver*. It starts a new epoch
//! ([`RunOrder::start_epoch`]) when it writes its RESUME ([`ResumeFrame`]), whose count
//! (frames it consumed) and new epoch tell the sender where, and in which epoch, to send
//! again. The sender writes the new epoch's runs only after reading that RESUME, so a run
//! of an epoch newer than the receiver's is a protocol error, and every run of an older
//! one was written before the sender knew the count: its frames may repeat frames the new
//! epoch carries, and are dropped. A frame whose bytes were partly read when the epoch
//! started is not in the count: the new epoch carries it again whole. A sender ignores a
//! RESUME whose epoch is not newer than its own (overtaken). A side that sees a link fail
//! writes a RESUME that asks for one, answered by the peer's (also when two cross): so
//! frames of the current epoch lost with a link are found by whichever side sees the
//! loss, and a side that writes a RESUME reads its held links again, to drop their runs
//! and reach what follows them.
//!
//! [`ResumeFrame`]: crate::wire::ResumeFrame

use crate::error::ProtoError;
use crate::wire::{RunFrame, MAX_LINKS};

/// Where a link's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cur {
    /// Between runs: its next frame is a RUN (or a CONFIRM or RESUME, written only
    /// between runs).
    Between,
    /// Inside a run: `left` frames of it remain, the next at `offset` of epoch `epoch`.
    In { offset: u64, epoch: u32, left: u32 },
}

/// What a link's next frame is, for the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Take {
    /// A frame outside every run: a RUN, CONFIRM or RESUME.
    Frame,
    /// This many frames of the stream, at its position: consume them.
    Stream(u32),
    /// This many frames of a run of an older epoch: drop them.
    Drop(u32),
    /// A run further in the stream: read its first frame ahead, then leave the link
    /// unread until the position reaches it.
    Hold,
}

/// The receiver's side: the position of its peer's stream, and each link's run.
#[derive(Debug)]
pub(super) struct RunOrder {
    /// The epoch runs are taken from.
    epoch: u32,
    /// Frames of the epoch's stream consumed.
    at: u64,
    links: [Cur; MAX_LINKS],
}

impl Default for RunOrder {
    fn default() -> Self {
        Self {
            epoch: 0,
            at: 0,
            links: [Cur::Between; MAX_LINKS],
        }
    }
}

impl RunOrder {
    /// The epoch and the offset the stream reached in it.
    pub(super) fn position(&self) -> (u32, u64) {
        (self.epoch, self.at)
    }

    /// Whether the frame a link is at (`take`) is dropped once read: one of a run of an
    /// older epoch, or one outside every run after a failover (epoch 0's, sent again).
    pub(super) fn drops(&self, take: Take) -> bool {
        match take {
            Take::Drop(_) => true,
            Take::Frame => self.epoch > 0,
            Take::Stream(_) | Take::Hold => false,
        }
    }

    /// A RUN frame `r` was read on `link` (below [`MAX_LINKS`]). A run inside a run, one
    /// of a newer epoch than ours, one starting before the position or overlapping
    /// another link's run of our epoch is [`ProtoError::RunOutOfOrder`]: no honest
    /// sender writes it.
    pub(super) fn on_run(&mut self, link: usize, r: RunFrame) -> Result<(), ProtoError> {
        let bad = Err(ProtoError::RunOutOfOrder);
        if self.links.get(link) != Some(&Cur::Between) || r.len == 0 || r.epoch > self.epoch {
            return bad;
        }
        let end = r.offset.checked_add(u64::from(r.len));
        if r.epoch == self.epoch {
            let Some(end) = end.filter(|_| r.offset >= self.at) else {
                return bad;
            };
            let overlaps = self.links.iter().any(|c| match *c {
                Cur::In {
                    offset,
                    epoch,
                    left,
                } => epoch == self.epoch && offset < end && r.offset < offset + u64::from(left),
                Cur::Between => false,
            });
            if overlaps {
                return bad;
            }
        }
        self.links[link] = Cur::In {
            offset: r.offset,
            epoch: r.epoch,
            left: r.len,
        };
        Ok(())
    }

    /// What `link`'s next frame is.
    pub(super) fn next(&self, link: usize) -> Take {
        match self.links[link] {
            Cur::Between => Take::Frame,
            Cur::In { epoch, left, .. } if epoch < self.epoch => Take::Drop(left),
            Cur::In { offset, left, .. } if offset == self.at => Take::Stream(left),
            Cur::In { .. } => Take::Hold,
        }
    }

    /// `n` frames of `link`'s run were consumed (or dropped), as [`RunOrder::next`] said
    /// (at most what it said). Returns true when the stream's position moved: a held link
    /// may now be [`RunOrder::ready`].
    pub(super) fn took(&mut self, link: usize, n: u32) -> bool {
        let Cur::In {
            offset,
            epoch,
            left,
        } = self.links[link]
        else {
            debug_assert!(n == 0, "frames taken outside a run");
            return false;
        };
        let n = n.min(left);
        let moves = epoch == self.epoch && offset == self.at;
        debug_assert!(epoch < self.epoch || moves, "frames taken from a held run");
        if moves {
            self.at += u64::from(n);
        }
        self.links[link] = if n == left {
            Cur::Between
        } else {
            Cur::In {
                offset: offset + u64::from(n),
                epoch,
                left: left - n,
            }
        };
        moves && n > 0
    }

    /// The link whose run starts at the position, if one was read (a held link to read
    /// again).
    pub(super) fn ready(&self) -> Option<usize> {
        self.links.iter().position(|c| {
            matches!(*c, Cur::In { offset, epoch, .. } if epoch == self.epoch && offset == self.at)
        })
    }

    /// Whether the stream is owed frames: a RUN of the epoch was read on some link and
    /// its frames have not all come (at the position, or further on, held). The link that
    /// should bring the frames at the position may be slow, or lost without this side
    /// seeing it, and a RESUME of the peer may wait behind a held run: see
    /// `Core::owed_timer`.
    pub(super) fn waiting(&self) -> bool {
        self.links
            .iter()
            .any(|c| matches!(*c, Cur::In { epoch, .. } if epoch == self.epoch))
    }

    /// Writing a RESUME: a new epoch starts at offset 0, and every run read or in flight
    /// so far belongs to an older one (dropped whole). Returns the new epoch, to put in
    /// the RESUME, or `None` when the epochs are exhausted (the endpoint must fail).
    pub(super) fn start_epoch(&mut self) -> Option<u32> {
        self.epoch = self.epoch.checked_add(1)?;
        self.at = 0;
        Some(self.epoch)
    }

    /// The stream's position is `at` frames into the epoch: frames consumed outside runs
    /// (before the first RUN of epoch 0) moved it without [`RunOrder::took`].
    pub(super) fn sync(&mut self, at: u64) {
        self.at = at;
    }

    /// A frame outside every run was consumed (epoch 0, before the sender's first RUN).
    pub(super) fn took_bare(&mut self) {
        self.at += 1;
    }

    /// The connection read as link `from` is read as link `to` from now on (a link
    /// became the primary); `to`'s connection is gone.
    pub(super) fn moved(&mut self, from: usize, to: usize) {
        if from < MAX_LINKS && to < MAX_LINKS {
            self.links[to] = std::mem::replace(&mut self.links[from], Cur::Between);
        }
    }

    /// `link`'s connection is gone: what it was reading is forgotten, and a connection
    /// that takes its place starts between runs.
    pub(super) fn link_lost(&mut self, link: usize) {
        if let Some(c) = self.links.get_mut(link) {
            *c = Cur::Between;
        }
    }
}

#[cfg(test)]
mod tests;
