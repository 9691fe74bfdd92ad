//! Spreading one stream over an endpoint's links: the sender's cut of the stream into
//! runs ([`Spreader`]) and the receiver's order over them ([`RunOrder`]). No I/O here.
//!
//! The engine does not use these yet: an endpoint's stream goes on its primary alone and
//! a RUN frame fails it (see "Spreading the stream" in `docs/design/links.md`, which says
//! what is left to join them to the send queue, the walk and failover).
//!
//! A *run* is a range of consecutive bytes of one epoch's stream written on one link,
//! opened by a RUN frame ([`RunFrame`]: its offset in the epoch's stream, the epoch, its
//! length). The sender places each message whole on the least-queued link when it is at
//! most a threshold long, and cuts a longer one into runs over the links so that each
//! would empty its queue at the same moment at the rate it moves. The receiver consumes
//! only the link whose run starts at the position the stream reached; a link whose run
//! starts further waits (its bytes stay in its socket), and a run of an older epoch is
//! dropped whole. So bytes are taken once, in stream order, without a reorder buffer.
//!
//! Epochs: each direction's epoch is chosen by its *receiver*. It starts a new epoch
//! ([`RunOrder::start_epoch`]) when it writes its RESUME ([`ResumeFrame`]), whose count
//! (frames it consumed whole) and new epoch tell the sender where, and in which epoch,
//! to send again ([`Spreader::new_epoch`]). The sender writes the new epoch's runs only
//! after reading that RESUME, so a run of an epoch newer than the receiver's is a
//! protocol error, and every run of an older one was written before the sender knew the
//! count: its bytes may repeat frames the new epoch carries, and are dropped unread. A
//! frame the receiver had begun (part of its bytes consumed when the epoch started) is
//! not in the count: the new epoch carries it again whole, and the begun part is
//! discarded. A sender ignores a RESUME whose epoch is not newer than its own
//! (overtaken on another link). A side that sees a link fail writes a RESUME that asks
//! for one, answered by the peer's: so runs of the current epoch lost with a link are
//! found by whichever side sees the loss. That RESUME may wait on its link behind a run
//! the receiver holds, and the receiver may wait for the bytes of a run announced on a
//! link that failed without its seeing it: a receiver owed bytes
//! ([`RunOrder::waiting`]) whose position does not move for the frame-stall deadline
//! starts a new epoch itself, which makes every run read so far one to drop and so
//! reaches the RESUME too.
//!
//! [`ResumeFrame`]: crate::wire::ResumeFrame

// Not used by the engine yet (see above); its tests exercise all of it.
#![cfg_attr(not(test), allow(dead_code))]

use crate::error::ProtoError;
use crate::wire::{RunFrame, MAX_LINKS};

/// What the sender knows of one open link when it places bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct LinkLoad {
    /// Bytes placed on the link and not yet written.
    pub(super) queued: u64,
    /// What the link moves lately while it has bytes to write, in any unit of bytes per
    /// time, the same for every link (0: not known yet).
    pub(super) rate: u64,
}

/// One run to write: the index of its link (in the loads given to [`Spreader::place`])
/// and the RUN frame that opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    pub(super) link: usize,
    pub(super) run: RunFrame,
}

/// The sender's side: where each byte of its stream goes.
#[derive(Debug)]
pub(super) struct Spreader {
    /// The epoch runs are placed in.
    epoch: u32,
    /// Where the next byte placed sits in the epoch's stream.
    next: u64,
    /// Messages of at most this many bytes go whole on one link.
    whole_up_to: u64,
    /// No run of a cut message is shorter than this, but the only one.
    min_run: u64,
}

impl Spreader {
    /// A stream starting at epoch 0, offset 0. Messages of at most `whole_up_to` bytes go
    /// whole on one link; no run of a longer one is shorter than `min_run` (at least 1).
    pub(super) fn new(whole_up_to: u64, min_run: u64) -> Self {
        Self {
            epoch: 0,
            next: 0,
            whole_up_to,
            min_run: min_run.max(1),
        }
    }

    /// The epoch and offset the next byte is placed at.
    pub(super) fn position(&self) -> (u32, u64) {
        (self.epoch, self.next)
    }

    /// The peer's RESUME named `epoch`: the stream starts again at offset 0 of it (the
    /// first frame the peer did not consume whole).
    pub(super) fn new_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
        self.next = 0;
    }

    /// Places the next `len` bytes of the stream (one message) on the links described by
    /// `loads`, appending its runs to `out` in stream order and adding each run's bytes
    /// to its link's `queued`. A message of at most the threshold goes whole on the link
    /// with the least queued (the first of equals). A longer one is cut so that every
    /// link taking a part would empty its queue at the same moment at its rate (with
    /// equal queues, in proportion to the rates; a link whose queue alone lasts longer
    /// takes none), each rate counted at least an eighth of an even share so that an
    /// idle link is measured too; the earliest bytes go on the link that empties first,
    /// and a part below the minimum run goes to the largest part. Runs are at most
    /// `u32::MAX` bytes. Nothing is placed for `len` 0 or no link.
    pub(super) fn place(&mut self, len: u64, loads: &mut [LinkLoad], out: &mut Vec<Piece>) {
        if len == 0 || loads.is_empty() {
            return;
        }
        let n = loads.len().min(MAX_LINKS);
        if len <= self.whole_up_to || n == 1 {
            let i = (0..n).min_by_key(|&i| (loads[i].queued, i)).unwrap_or(0);
            self.put(i, len, loads, out);
            return;
        }
        let total: u128 = loads[..n].iter().map(|l| u128::from(l.rate)).sum();
        let floor = (total / (8 * n as u128)).max(1);
        let rate = |i: usize| u128::from(loads[i].rate).max(floor);
        // Links in the order they empty their queues.
        let mut order: [usize; MAX_LINKS] = [0; MAX_LINKS];
        for (i, o) in order.iter_mut().enumerate().take(n) {
            *o = i;
        }
        let order = &mut order[..n];
        order.sort_by(|&a, &b| {
            let (qa, qb) = (u128::from(loads[a].queued), u128::from(loads[b].queued));
            (qa * rate(b)).cmp(&(qb * rate(a))).then(a.cmp(&b))
        });
        // The moment `t` (in queue bytes per unit of rate) at which the first `k` links,
        // given the message, would all be empty; a link that empties later takes none.
        let (mut sum_q, mut sum_r, mut k, mut t) = (0u128, 0u128, 0usize, 0f64);
        while k < n {
            let i = order[k];
            sum_q += u128::from(loads[i].queued);
            sum_r += rate(i);
            k += 1;
            t = (u128::from(len) + sum_q) as f64 / sum_r as f64;
            let next_empties = order
                .get(k)
                .map(|&j| loads[j].queued as f64 / rate(j) as f64);
            if next_empties.is_none_or(|e| t <= e) {
                break;
            }
        }
        let mut parts = [0u64; MAX_LINKS];
        let mut left = len;
        for (x, &i) in order[..k].iter().enumerate() {
            let want = (t * rate(i) as f64 - loads[i].queued as f64).max(0.0) as u64;
            let p = if x + 1 == k { left } else { want.min(left) };
            if p >= self.min_run {
                parts[x] = p;
                left -= p;
            }
        }
        if left > 0 {
            // Parts below the minimum: the largest part takes them (the link that empties
            // first everything, when no part reached the minimum).
            let x = (0..k)
                .max_by_key(|&x| (parts[x], usize::MAX - x))
                .unwrap_or(0);
            parts[x] += left;
        }
        for (x, &i) in order[..k].iter().enumerate() {
            if parts[x] > 0 {
                self.put(i, parts[x], loads, out);
            }
        }
    }

    /// Places `len` bytes on link `i`, in runs of at most `u32::MAX` bytes.
    fn put(&mut self, i: usize, mut len: u64, loads: &mut [LinkLoad], out: &mut Vec<Piece>) {
        loads[i].queued += len;
        while len > 0 {
            let l = len.min(u64::from(u32::MAX));
            out.push(Piece {
                link: i,
                run: RunFrame {
                    offset: self.next,
                    epoch: self.epoch,
                    len: l as u32,
                },
            });
            self.next += l;
            len -= l;
        }
    }
}

/// Where a link's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cur {
    /// Between runs: its next frame is a RUN (or a CONFIRM or RESUME, written only
    /// between runs).
    Between,
    /// Inside a run: `left` bytes of it remain, the next at `offset` of epoch `epoch`.
    In { offset: u64, epoch: u32, left: u32 },
}

/// What a link's next bytes are, for the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Take {
    /// A frame outside every run: a RUN, CONFIRM or RESUME.
    Frame,
    /// Up to this many bytes of the stream, at its position: consume them.
    Stream(u32),
    /// This many bytes of a run of an older epoch: drop them unread.
    Drop(u32),
    /// A run further in the stream: leave the link unread until the position reaches it.
    Hold,
}

/// The receiver's side: the position of its peer's stream, and each link's run.
#[derive(Debug)]
pub(super) struct RunOrder {
    /// The epoch runs are taken from.
    epoch: u32,
    /// Bytes of the epoch's stream consumed.
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

    /// What `link`'s next bytes are.
    pub(super) fn next(&self, link: usize) -> Take {
        match self.links[link] {
            Cur::Between => Take::Frame,
            Cur::In { epoch, left, .. } if epoch < self.epoch => Take::Drop(left),
            Cur::In { offset, left, .. } if offset == self.at => Take::Stream(left),
            Cur::In { .. } => Take::Hold,
        }
    }

    /// `n` bytes of `link`'s run were consumed (or dropped), as [`RunOrder::next`] said
    /// (at most what it said). Returns true when the stream's position moved: a held link
    /// may now be [`RunOrder::ready`].
    pub(super) fn took(&mut self, link: usize, n: u32) -> bool {
        let Cur::In {
            offset,
            epoch,
            left,
        } = self.links[link]
        else {
            debug_assert!(n == 0, "bytes taken outside a run");
            return false;
        };
        let n = n.min(left);
        let moves = epoch == self.epoch && offset == self.at;
        debug_assert!(epoch < self.epoch || moves, "bytes taken from a held run");
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

    /// Whether the stream owes bytes: a RUN of the epoch was read on some link and its
    /// bytes have not all come (at the position, or further on, held). The link that
    /// should bring the bytes at the position may be slow, or lost without this side
    /// seeing it: a receiver whose position does not move for the frame-stall deadline
    /// while it is owed bytes starts a new epoch (an asking RESUME), which also lets it
    /// read past the held runs to a RESUME waiting behind them.
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
