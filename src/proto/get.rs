//! Gets: one-sided reads of a peer's registered memory. No I/O here.
//!
//! The requester checks that the destination lies inside a region of its own, queues a
//! GET frame (a [`GetRequest`]) and remembers the get ([`PendingGet`]) in order. The peer
//! checks the source against its readable regions and queues a REPLY: a frame shaped as
//! a PUT whose target is the GET's destination and whose payload borrows the region's
//! bytes (no copy; the region stays in use until the reply is written, or confirmed with
//! a standby link). Frames keep their order, so REPLYs come back in the order of the
//! GETs: each one read completes the oldest pending get, once its data is in place, after
//! checking that it lands where and with the length that get asked for.
//!
//! Bounds. The requester refuses a get ([`SendError::WouldBlock`]) while its gets in
//! progress to that peer already ask for `max_queued_bytes` (one get is always taken, as
//! one send is). The peer counts its replies in the queue's bytes (so its own sends wait
//! behind them), and takes a GET that arrives while those bytes reach four times
//! `max_queued_bytes + max_frame` for a protocol error: an honest requester's gets pin at
//! most one limit and one frame, the peer's own sends as much, and replies the requester
//! has read while their sends' completion is not yet counted here at most as much again.
//! So a peer's gets pin a bounded amount of memory, and an honest one never meets the
//! bound.
//!
//! A get fails, once, with the endpoint (every pending get, with its reason), and when the
//! peer's FIN arrives before its reply (a peer that closes answers nothing more).

use bytes::Bytes;

use crate::error::{FailReason, ProtoError, SendError};
use crate::proto::core::{Core, CoreEvent};
use crate::wire::PUT_TARGET_LEN;
use crate::wire::{FrameKind, GetRequest, Header, PeerId, PutTarget, Tag, WireError};

/// A get of ours waiting for its REPLY.
#[derive(Debug)]
pub(super) struct PendingGet {
    /// Where its data goes.
    to: PutTarget,
    /// Bytes asked for.
    len: u32,
    cookie: u64,
}

impl PendingGet {
    /// What it counts against the limit of gets in progress: its reply's wire bytes.
    fn weight(&self) -> u64 {
        (Header::LEN + PUT_TARGET_LEN) as u64 + u64::from(self.len)
    }
}

impl Core {
    /// Queues a get: `len` bytes of `peer`'s readable region at `from` are to land at
    /// `to`, in a region of ours. Completes with `cookie` once they are in place.
    pub fn get(
        &mut self,
        peer: PeerId,
        from: PutTarget,
        len: u32,
        to: PutTarget,
        cookie: u64,
    ) -> Result<(), SendError> {
        let pending = PendingGet { to, len, cookie };
        let max = self.cfg.max_frame as usize;
        if len as usize + PUT_TARGET_LEN > max {
            return Err(SendError::TooLarge {
                len: len as usize + PUT_TARGET_LEN,
                max,
            });
        }
        // Checked now, so that a REPLY is never refused for our own mistake.
        self.regions.claim(to.key, to.addr, len as usize, false)?;
        let cap = self.cfg.max_queued_bytes;
        let ep = self.ep(peer).ok_or(SendError::UnknownPeer(peer))?;
        if !ep.gets.is_empty() && ep.get_bytes + pending.weight() > cap {
            return Err(SendError::WouldBlock(peer));
        }
        let hdr = Header {
            kind: FrameKind::Get,
            tag: Tag(0),
            len: 0,
            ack: false,
            line: 0,
        };
        let req = GetRequest { from, len, to };
        let body = Bytes::copy_from_slice(&req.to_bytes());
        self.enqueue(peer, hdr, None, &[body], None)?;
        let ep = self.ep_mut(peer).expect("queued to it");
        ep.get_bytes += pending.weight();
        ep.gets.push_back(pending);
        Ok(())
    }

    /// A GET from `peer`: queues its REPLY. False when the GET broke the protocol (the
    /// endpoint failed).
    pub(super) fn on_get(&mut self, peer: PeerId, req: Result<GetRequest, WireError>) -> bool {
        let req = match req {
            Ok(r) => r,
            Err(e) => {
                self.fail_protocol(peer, e.into());
                return false;
            }
        };
        let data = match self
            .regions
            .lend(req.from.key, req.from.addr, req.len as usize)
        {
            Ok(d) => d,
            Err(e) => {
                self.fail_protocol(peer, ProtoError::GetOutsideRegions(e));
                return false;
            }
        };
        let bound = self
            .cfg
            .max_queued_bytes
            .saturating_add(u64::from(self.cfg.max_frame))
            .saturating_mul(4);
        if self.ep(peer).is_some_and(|e| e.queued_bytes >= bound) {
            self.fail_protocol(peer, ProtoError::TooManyGets);
            return false;
        }
        let hdr = Header {
            kind: FrameKind::Reply,
            tag: Tag(0),
            len: PUT_TARGET_LEN as u32,
            ack: false,
            line: 0,
        };
        // Refused only once we sent our FIN or are shutting down: the peer then fails the
        // get when our FIN arrives.
        let _ = self.enqueue(peer, hdr, Some(req.to.to_bytes()), &[data], None);
        self.counters.gets_answered += 1;
        true
    }

    /// A REPLY from `peer` whose data (`len` bytes) was placed at `at`: completes the
    /// oldest pending get. False when it answers none, or not as asked (the endpoint
    /// failed).
    pub(super) fn on_reply(&mut self, peer: PeerId, at: Option<PutTarget>, len: usize) -> bool {
        let Some(ep) = self.ep_mut(peer) else {
            return false;
        };
        let matches = ep
            .gets
            .front()
            .is_some_and(|g| Some(g.to) == at && g.len as usize == len);
        if !matches {
            self.fail_protocol(peer, ProtoError::UnexpectedReply);
            return false;
        }
        let g = ep.gets.pop_front().expect("checked");
        ep.get_bytes -= g.weight();
        self.counters.gets_completed += 1;
        self.events.push_back(CoreEvent::Completed {
            peer,
            cookie: g.cookie,
            result: Ok(()),
        });
        true
    }

    /// Every pending get of `peer` fails with `reason`.
    pub(super) fn fail_gets(&mut self, peer: PeerId, reason: &FailReason) {
        let Some(ep) = self.ep_mut(peer) else { return };
        ep.get_bytes = 0;
        let gets: Vec<PendingGet> = ep.gets.drain(..).collect();
        for g in gets {
            self.events.push_back(CoreEvent::Completed {
                peer,
                cookie: g.cookie,
                result: Err(reason.clone()),
            });
        }
    }
}
