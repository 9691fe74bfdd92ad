//! Sending under flow control. [`Transport::send`] refuses a message with
//! [`SendError::WouldBlock`] while too many bytes already wait for that peer
//! (`RINGBTL_MAX_QUEUED_BYTES`: the peer reads slower than we send). The message was not
//! accepted (no completion will come for it), so it is sent again once the queue has
//! drained:
//!
//! - a loop that sends ([`send`]) makes progress and tries again;
//! - a handler, which may not make progress, leaves its reply in a [`Deferred`] queue,
//!   and the loop that waits for the phase to end ([`wait_until`]) sends it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringbtl::{PeerId, SendError, Tag, Transport};

/// How often a wait looks at deferred replies again while they meet a full queue.
const RETRY_TICK: Duration = Duration::from_millis(1);

/// Sends from a loop (not from a handler): on a full queue, makes progress (as the
/// transport's progress mode says) until some of the peer's sends completed, then tries
/// again, until `deadline`. The accepted send is all that runs inline: the measured loops
/// of `rate` and `bw` pay nothing more per message than the call itself.
#[inline(always)]
pub(crate) fn send(
    tr: &mut Transport,
    peer: PeerId,
    tag: Tag,
    segs: &[Bytes],
    cookie: u64,
    deadline: Instant,
) -> Result<(), String> {
    match tr.send(peer, tag, segs, cookie) {
        Ok(()) => Ok(()),
        Err(e) => send_refused(tr, (peer, tag, segs, cookie), deadline, e),
    }
}

/// [`send`] of `msg` (its peer, tag, segments and cookie) after the transport refused it
/// with `first`.
#[cold]
#[inline(never)]
fn send_refused(
    tr: &mut Transport,
    msg: (PeerId, Tag, &[Bytes], u64),
    deadline: Instant,
    first: SendError,
) -> Result<(), String> {
    let (peer, tag, segs, cookie) = msg;
    let mut refused = first;
    loop {
        match refused {
            SendError::WouldBlock(_) => {
                let before = tr.pending(peer);
                let drained = tr
                    .wait_until(deadline, |t| t.pending(peer) < before)
                    .map_err(|e| format!("progress: {e}"))?;
                if !drained {
                    return Err(format!(
                        "send to {peer}: its queue stayed full (RINGBTL_MAX_QUEUED_BYTES) \
                         until the deadline"
                    ));
                }
            }
            e => return Err(format!("send to {peer}: {e}")),
        }
        match tr.send(peer, tag, segs, cookie) {
            Ok(()) => return Ok(()),
            Err(e) => refused = e,
        }
    }
}

/// Replies that handlers could not send because the peer's queue was full, in order.
#[derive(Debug, Default)]
pub(crate) struct Deferred {
    queue: VecDeque<(PeerId, Tag, Vec<Bytes>, u64)>,
}

impl Deferred {
    /// Sends now, or keeps the message for [`flush`](Self::flush) when the queue is full
    /// (or earlier replies still wait, so that replies leave in order). Other errors are
    /// returned.
    pub(crate) fn send(
        &mut self,
        tr: &mut Transport,
        peer: PeerId,
        tag: Tag,
        segs: &[Bytes],
        cookie: u64,
    ) -> Result<(), SendError> {
        if self.queue.is_empty() {
            match tr.send(peer, tag, segs, cookie) {
                Err(SendError::WouldBlock(_)) => {}
                r => return r,
            }
        }
        self.queue.push_back((peer, tag, segs.to_vec(), cookie));
        Ok(())
    }

    /// True when no reply waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Sends the waiting replies in order until one meets a full queue again.
    pub(crate) fn flush(&mut self, tr: &mut Transport) -> Result<(), SendError> {
        while let Some((peer, tag, segs, cookie)) = self.queue.front() {
            match tr.send(*peer, *tag, segs, *cookie) {
                Ok(()) => {}
                Err(SendError::WouldBlock(_)) => return Ok(()),
                Err(e) => {
                    self.queue.pop_front();
                    return Err(e);
                }
            }
            self.queue.pop_front();
        }
        Ok(())
    }
}

/// [`Transport::wait_until`] that also sends the replies handlers deferred: returns
/// `Ok(true)` once `done()` holds and no reply waits, `Ok(false)` at `deadline`.
pub(crate) fn wait_until(
    tr: &mut Transport,
    deferred: &RefCell<Deferred>,
    deadline: Instant,
    mut done: impl FnMut() -> bool,
) -> Result<bool, String> {
    loop {
        let waiting = !deferred.borrow().is_empty();
        // While replies wait for room, look again every tick.
        let until = if waiting {
            deadline.min(Instant::now() + RETRY_TICK)
        } else {
            deadline
        };
        // While replies wait, progress for the whole tick, then try them again.
        tr.wait_until(until, |_| {
            !waiting && (done() || !deferred.borrow().is_empty())
        })
        .map_err(|e| format!("progress: {e}"))?;
        if !deferred.borrow().is_empty() {
            deferred
                .borrow_mut()
                .flush(tr)
                .map_err(|e| format!("deferred reply: {e}"))?;
        }
        if done() && deferred.borrow().is_empty() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
    }
}
