//! The handshake's challenge-response (the exchange is drawn in [`wire`](crate::wire)):
//! HELLO, CHALLENGE, AUTH, then the acceptor's decision. Each side proves that it holds
//! the job key with a MAC over both fresh nonces and both process ids
//! ([`auth::handshake_mac`]). Nothing about an endpoint changes before the peer's MAC
//! verified: the acceptor keeps the claimed process id on the connection only, and takes
//! its decision ([`Core::adopt_or_refuse`]) after AUTH. No I/O here: the nonces come from
//! the [`NonceSource`] the engine was built with.

use std::fmt;
use std::mem;
use std::time::Instant;

use crate::auth::{self, Side, Transcript};
use crate::error::{Cause, FailReason, ProtoError};
use crate::proto::conn::Stage;
use crate::proto::core::{slot, ConnKey, Core, CoreEvent};
use crate::wire::{FrameKind, Hello, HelloKind, PeerId, RejectReason, NONCE_LEN};

/// Where the handshake's nonces come from. The transport uses the operating system's
/// random numbers ([`NonceSource::os`]); tests inject their own to stay deterministic.
pub struct NonceSource(Box<dyn FnMut() -> Option<[u8; NONCE_LEN]> + Send>);

impl NonceSource {
    /// The operating system's random numbers (`getrandom`).
    pub fn os() -> Self {
        Self(Box::new(auth::os_nonce))
    }

    /// Nonces from `f` (`None`: none available, the handshake fails).
    pub fn new(f: impl FnMut() -> Option<[u8; NONCE_LEN]> + Send + 'static) -> Self {
        Self(Box::new(f))
    }

    pub(super) fn next(&mut self) -> Option<[u8; NONCE_LEN]> {
        (self.0)()
    }
}

impl fmt::Debug for NonceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NonceSource")
    }
}

/// A connection's handshake state: the nonces so far and, on the acceptor, the process
/// id the dialer claims (not trusted before its AUTH verifies).
#[derive(Debug)]
pub(super) struct Handshake {
    pub(super) nonce_d: [u8; NONCE_LEN],
    pub(super) nonce_a: [u8; NONCE_LEN],
    /// The dialer's process id within its job.
    pub(super) claimed: PeerId,
    /// The dialer's job.
    pub(super) job: u64,
    /// The link the dial is to be (from the dialer's HELLO).
    pub(super) link: u8,
}

impl Core {
    /// Dialer: the connect finished; the HELLO record (our nonce) to send, or `None`
    /// without a nonce.
    pub(super) fn hello_for(&mut self, conn: ConnKey, peer: PeerId) -> Option<Hello> {
        let nonce = self.nonces.next()?;
        let job = self.cfg.token;
        let c = self.conn_mut(conn)?;
        let link = c.link;
        c.hs = Some(Box::new(Handshake {
            nonce_d: nonce,
            nonce_a: [0; NONCE_LEN],
            claimed: peer,
            job,
            link,
        }));
        let mut h = self.record(HelloKind::Hello);
        (h.to_job, h.to) = self.wire_name(peer);
        h.nonce = nonce;
        h.link = link;
        Some(h)
    }

    /// Refuses an incoming connection: count, tell, answer, close.
    pub(super) fn refuse_incoming(&mut self, conn: ConnKey, reason: RejectReason, why: ProtoError) {
        self.counters.refused += 1;
        self.events.push_back(CoreEvent::Refused { why });
        self.reject(conn, reason);
    }

    /// Acceptor: the first record of an incoming connection. A probe is answered
    /// "alive" (with our id, nothing else); a HELLO gets our CHALLENGE.
    pub(super) fn on_hello(&mut self, conn: ConnKey, h: Hello) {
        match h.kind {
            HelloKind::Probe => {
                // "Is a ringbtl process listening here?": our id, then close.
                self.answer_and_close(conn, HelloKind::ProbeAck);
                return;
            }
            HelloKind::Hello => {}
            _ => {
                return self.handshake_garbage(
                    conn,
                    ProtoError::UnexpectedHello {
                        state: "ExpectHello",
                    },
                )
            }
        }
        let Some(key) = self.key_of_job(h.job).cloned() else {
            // A job we do not talk to (yet): nothing to prove, nothing to learn.
            return self.refuse_incoming(
                conn,
                RejectReason::UnknownJob,
                ProtoError::Rejected(RejectReason::UnknownJob),
            );
        };
        let Some(nonce_a) = self.nonces.next() else {
            // No nonce, no challenge: the dialer retries.
            self.kill_conn(conn);
            return;
        };
        let t = Transcript {
            job_d: h.job,
            job_a: self.cfg.token,
            nonce_d: &h.nonce,
            nonce_a: &nonce_a,
            pid_d: h.pid,
            pid_a: self.cfg.pid,
            link: h.link,
        };
        let mut rec = self.record(HelloKind::Challenge);
        rec.to = h.pid;
        rec.to_job = h.job;
        rec.nonce = nonce_a;
        rec.link = h.link;
        rec.mac = auth::handshake_mac(&key, Side::Acceptor, &t);
        let Some(c) = self.conn_mut(conn) else { return };
        c.stage = Stage::ExpectAuth;
        c.hs = Some(Box::new(Handshake {
            nonce_d: h.nonce,
            nonce_a,
            claimed: h.pid,
            job: h.job,
            link: h.link,
        }));
        c.write_record(&rec);
        self.submit_tx(conn);
    }

    /// Acceptor: the dialer's AUTH. Only once its MAC verifies does the claimed process id
    /// count, and the connection is adopted or refused.
    pub(super) fn on_auth(&mut self, conn: ConnKey, h: Hello) {
        let Some(c) = self.conn_mut(conn) else { return };
        let Some(hs) = c.hs.take() else {
            return self.handshake_garbage(
                conn,
                ProtoError::UnexpectedHello {
                    state: "ExpectAuth",
                },
            );
        };
        match h.kind {
            HelloKind::Auth => {}
            _ => {
                return self.handshake_garbage(
                    conn,
                    ProtoError::UnexpectedHello {
                        state: "ExpectAuth",
                    },
                )
            }
        }
        let t = Transcript {
            job_d: hs.job,
            job_a: self.cfg.token,
            nonce_d: &hs.nonce_d,
            nonce_a: &hs.nonce_a,
            pid_d: hs.claimed,
            pid_a: self.cfg.pid,
            link: hs.link,
        };
        if h.pid != hs.claimed
            || h.job != hs.job
            || h.link != hs.link
            || !self
                .key_of_job(hs.job)
                .is_some_and(|k| auth::verify_handshake(k, Side::Dialer, &t, &h.mac))
        {
            self.counters.auth_failed += 1;
            return self.refuse_incoming(conn, RejectReason::AuthFailed, ProtoError::AuthFailed);
        }
        if let Some(c) = self.conn_mut(conn) {
            c.link = hs.link;
        }
        // A process of another job proved the pair key; it is known here once the driver
        // added it (the two jobs add each other at about the same time: it retries).
        let Some(peer) = self.local_id(hs.job, hs.claimed) else {
            return self.refuse_incoming(
                conn,
                RejectReason::UnknownJob,
                ProtoError::Rejected(RejectReason::UnknownJob),
            );
        };
        self.adopt_or_refuse(conn, peer);
    }

    /// Dialer: the acceptor's CHALLENGE (or an early REJECT). Nothing is sent before its
    /// MAC verifies; then our AUTH, with our first frames right behind it when the rule of
    /// [`send_early`](Self::send_early) allows.
    pub(super) fn on_challenge(&mut self, now: Instant, conn: ConnKey, h: Hello) {
        let Some(c) = self.conn_mut(conn) else { return };
        let peer = c.peer.expect("dialer knows its peer");
        let hs = c.hs.take();
        let (job_a, pid_a) = self.wire_name(peer);
        let err = match (h.kind, hs) {
            (HelloKind::Reject(_), _) => return self.on_accept_record(now, conn, h),
            (HelloKind::Challenge, _) if (h.job, h.pid) != (job_a, pid_a) => {
                ProtoError::WrongPeer {
                    expected: peer,
                    got: h.pid,
                }
            }
            (HelloKind::Challenge, Some(hs)) => {
                let t = Transcript {
                    job_d: self.cfg.token,
                    job_a,
                    nonce_d: &hs.nonce_d,
                    nonce_a: &h.nonce,
                    pid_d: self.cfg.pid,
                    pid_a,
                    link: hs.link,
                };
                let key = self.key_of(peer).cloned();
                if let Some(key) = key.filter(|k| {
                    h.link == hs.link && auth::verify_handshake(k, Side::Acceptor, &t, &h.mac)
                }) {
                    let mut rec = self.record(HelloKind::Auth);
                    (rec.to_job, rec.to) = (job_a, pid_a);
                    rec.link = hs.link;
                    rec.mac = auth::handshake_mac(&key, Side::Dialer, &t);
                    let c = self.conn_mut(conn).expect("conn exists");
                    c.stage = Stage::ExpectAccept;
                    c.write_record(&rec);
                    self.send_early(peer, conn);
                    self.submit_tx(conn);
                    return;
                }
                self.counters.auth_failed += 1;
                ProtoError::AuthFailed
            }
            _ => ProtoError::UnexpectedHello {
                state: "ExpectChallenge",
            },
        };
        if self.is_link(conn) {
            return self.link_lost(now, conn);
        }
        self.kill_conn(conn);
        if self.ep_dialing_on(peer, conn) {
            self.fail_endpoint(peer, FailReason::Protocol { peer, err });
        }
    }

    /// Dialer: writes the frames queued for `peer` right behind our AUTH on `conn`, so
    /// that they reach the acceptor one round trip before its ACCEPT would let them
    /// leave. The acceptor reads them only once our AUTH verified and it adopted the
    /// connection (a connection it refuses is closed with them unread); so they stay at
    /// the front of the queue, counted in `Conn::early`, until the answer:
    /// ACCEPT completes them ([`early_accepted`](Self::early_accepted)), a REJECT, a close
    /// or a failed send leaves them queued for the next connection, where they go once.
    ///
    /// Only a dialer whose dial wins a simultaneous connect sends early (our id below the
    /// peer's): the acceptor then never refuses this dial in favour of its own, and we
    /// never abandon it for the peer's (`claim`), so frames written on it are never
    /// written again on another connection the acceptor also adopts. Only frames copied
    /// into the batch (at most `inline_limit` bytes of payload, within the batch budget)
    /// go early: the batch then holds no memory of the caller's, and the frames may
    /// complete (or fail) before it comes back.
    pub(super) fn send_early(&mut self, peer: PeerId, conn: ConnKey) {
        if self.below_me(peer) || !self.ep_dialing_on(peer, conn) {
            return;
        }
        let (budget, max_iov, inline) = (
            self.cfg.coalesce_bytes,
            self.cfg.max_iov,
            self.cfg.inline_limit,
        );
        let (Some(c), Some(ep)) = (
            slot(&mut self.conns, conn.0),
            slot(&mut self.endpoints, peer.0),
        ) else {
            return;
        };
        // The batch is out (our HELLO's send has not come back): the AUTH waits in
        // `held`, and the frames wait for the ACCEPT as they always did.
        let Some(batch) = c.tx.as_mut() else { return };
        let (mut n, mut seg) = (0u32, 0usize);
        for f in ep.queue.iter() {
            let small = f.hdr.len as usize <= inline;
            let fits = batch.len() + f.wire_len() <= budget && batch.parts() + 2 <= max_iov;
            if f.hdr.kind != FrameKind::Send || f.cookie.is_none() || !small || !fits {
                break;
            }
            if f.nsegs == 0 {
                batch.push_small(&f.wire, f.wire_len());
            } else {
                // Its segments are the next ones of the endpoint's segment queue; they
                // stay there (copied here) until the answer.
                batch.push_copy(&f.wire[..f.head as usize]);
                for s in ep.segs.iter().skip(seg).take(f.nsegs as usize) {
                    batch.push_copy(s);
                }
                seg += f.nsegs as usize;
            }
            batch.add_frame();
            n += 1;
        }
        c.early = n;
        if n > 0 {
            self.counters.batches += 1;
            self.counters.frames += u64::from(n);
        }
    }

    /// Dialer: the ACCEPT of `conn`, which carried `Conn::early` frames behind our AUTH:
    /// the acceptor delivered them, so they leave the queue for the in-flight list, and
    /// complete now if their batch is back (else when it comes back, as any batch's).
    pub(super) fn early_accepted(&mut self, peer: PeerId, conn: ConnKey) {
        let Some(c) = slot(&mut self.conns, conn.0) else {
            return;
        };
        let n = mem::take(&mut c.early) as usize;
        let back = c.tx.is_some();
        let Some(ep) = slot(&mut self.endpoints, peer.0) else {
            return;
        };
        for _ in 0..n {
            let Some(f) = ep.queue.pop_front() else { break };
            ep.segs.drain(..(f.nsegs as usize).min(ep.segs.len()));
            if f.queued() {
                ep.queued_bytes -= f.wire_len() as u64;
            }
            ep.inflight.push(f.cookie);
        }
        if back {
            let done = n.min(ep.inflight.len());
            ep.head_seq += done as u64;
            for cookie in ep.inflight.drain(..done).flatten() {
                self.events.push_back(CoreEvent::Completed {
                    peer,
                    cookie,
                    result: Ok(()),
                });
            }
        }
    }

    /// A record of another protocol version arrived: the acceptor answers
    /// `REJECT(Version)` (its magic and version sit where every version reads them), the
    /// dialer fails the endpoint; both say which versions met.
    pub(super) fn version_mismatch(&mut self, conn: ConnKey, stage: Stage, why: ProtoError) {
        if stage == Stage::ExpectHello {
            self.refuse_incoming(conn, RejectReason::Version, why);
        } else {
            self.handshake_garbage(conn, why);
        }
    }

    /// The connect finished but no nonce could be drawn: this attempt fails.
    pub(super) fn no_nonce(&mut self, now: Instant, conn: ConnKey, peer: PeerId) {
        self.kill_conn(conn);
        if self.ep_dialing_on(peer, conn) {
            self.retry_or_fail(Some(now), peer, Cause::NoNonce);
        }
    }
}
