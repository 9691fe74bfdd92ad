//! Links: the connections of an endpoint beyond its first. No I/O here.
//!
//! An endpoint's first connection (link 0) is opened, raced and adopted as the state
//! machine in [`core`](super::core) says. Once it is adopted, the process with the lower
//! id dials the endpoint's other links, one per route the driver planned
//! ([`Core::set_link_routes`]), each with the same challenge-response as the first, its
//! number in the records and in both MACs ([`Hello::link`](crate::wire::Hello::link)).
//! The acceptor adopts such a *join* only into an endpoint that has its first connection
//! and is not closing (else `REJECT(NoLink)`); a join for a link it holds already replaces
//! that connection (the dialer gave up on it).
//!
//! Only the lower id dials links, so two processes never race for one. A process that
//! reads with the multishot receive takes no links (`REJECT(LinksOff)`, after which the
//! dialer dials none to it) and dials none. A link that fails
//! (refused, reset, closed, its deadline) is closed alone: the endpoint stays connected,
//! and the dialer tries the link again after the connect retry delay, doubling up to
//! [`MAX_LINK_RETRY`] and without an end while the endpoint is connected, so that an
//! interface that comes back is used again. When the endpoint closes or fails, its links
//! close with it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::error::ProtoError;
use crate::proto::conn::{Conn, Stage};
use crate::proto::core::{slot, ConnKey, Core, CoreEvent, Todo};
use crate::proto::endpoint::EpState;
use crate::wire::{Hello, HelloKind, PeerId, RejectReason, HELLO_LEN, MAX_LINKS};

/// Longest delay between two attempts to dial a link.
pub(super) const MAX_LINK_RETRY: Duration = Duration::from_secs(1);

/// Where a link is dialed: the peer's address, and the local address to dial it from
/// (`None`: the kernel chooses).
pub type LinkRoute = (SocketAddr, Option<SocketAddr>);

/// One link of an endpoint beyond its first (link `i + 1` at index `i` of
/// `Endpoint::links`).
#[derive(Debug, Default)]
pub(super) struct Link {
    /// Dialer: where the link goes (`None` on the side that does not dial it).
    pub(super) route: Option<LinkRoute>,
    /// Its connection, while one is dialing or open.
    pub(super) conn: Option<ConnKey>,
    /// The connection is open (handshake done on both sides).
    pub(super) open: bool,
    /// Failed attempts since it was last open.
    pub(super) attempts: u32,
    /// The next attempt, when one is scheduled.
    pub(super) retry_at: Option<Instant>,
}

impl Core {
    /// The routes of `peer`'s links beyond its first (at most [`MAX_LINKS`]` - 1`; more
    /// are ignored). They are dialed, by the process with the lower id, once the first
    /// connection is adopted. Replaces the plan of earlier calls; links already open stay.
    pub fn set_link_routes(&mut self, peer: PeerId, routes: Vec<LinkRoute>) {
        if self.cfg.multishot {
            // The multishot receive reads every connection at once; a standby link must
            // not be read until it carries the stream (see `failover.rs`).
            return;
        }
        let Some(ep) = self.ep_mut(peer) else { return };
        let n = routes.len().min(MAX_LINKS - 1);
        if ep.links.len() < n {
            ep.links.resize_with(n, Link::default);
        }
        for (l, r) in ep.links.iter_mut().zip(routes.into_iter().take(n)) {
            l.route = Some(r);
        }
    }

    /// Connections of `peer`'s endpoint that are open: its first, and its open links
    /// (0 when it is not connected).
    pub fn links_open(&self, peer: PeerId) -> usize {
        self.ep(peer).map_or(0, |ep| match ep.state {
            EpState::Connected { .. } => 1 + ep.links.iter().filter(|l| l.open).count(),
            _ => 0,
        })
    }

    /// Whether links of `peer` may be dialed or adopted now: connected, and no FIN either
    /// way.
    fn links_wanted(&self, peer: PeerId) -> bool {
        !self.shutting_down
            && self.ep(peer).is_some_and(|ep| {
                matches!(ep.state, EpState::Connected { .. }) && !ep.fin_sent && !ep.fin_rcvd
            })
    }

    /// The first connection of `peer` was adopted: the lower id dials every planned link
    /// that has no connection.
    pub(super) fn dial_links(&mut self, peer: PeerId) {
        if self.below_me(peer) || !self.links_wanted(peer) {
            return;
        }
        let Some(ep) = self.ep_mut(peer) else { return };
        let mut dials = Vec::new();
        for (i, l) in ep.links.iter_mut().enumerate() {
            if let (Some((addr, bind)), None, None) = (l.route, l.conn, l.retry_at) {
                dials.push(Todo::Dial {
                    peer,
                    link: (i + 1) as u8,
                    addr,
                    bind,
                });
            }
        }
        self.todo.extend(dials);
    }

    /// The driver opened the socket of a link's dial (see [`Core::dial_started`]).
    pub(super) fn link_dial_started(&mut self, peer: PeerId, link: u8, conn: ConnKey) {
        let own_cache = !self.cfg.multishot;
        let mut c = Conn::new(Stage::Connecting, Some(peer), HELLO_LEN, own_cache);
        c.link = link;
        self.put_conn(conn, c);
        let wanted = self.links_wanted(peer);
        match self.link_mut(peer, link) {
            Some(l) if wanted && l.conn.is_none() => l.conn = Some(conn),
            _ => self.kill_conn(conn),
        }
    }

    /// A link's dial could not even create its socket.
    pub(super) fn link_dial_failed(&mut self, now: Instant, peer: PeerId, link: u8) {
        self.schedule_link(now, peer, link);
    }

    /// Acceptor: the dialer of a join proved the key: adopt the link or refuse it.
    pub(super) fn claim_link(&mut self, conn: ConnKey, peer: PeerId, link: u8) {
        if self.cfg.multishot {
            self.counters.refused += 1;
            return self.reject(conn, RejectReason::LinksOff);
        }
        if !self.links_wanted(peer) {
            self.counters.refused += 1;
            self.events.push_back(CoreEvent::Refused {
                why: ProtoError::Rejected(RejectReason::NoLink),
            });
            return self.reject(conn, RejectReason::NoLink);
        }
        let i = usize::from(link) - 1;
        let ep = self.ep_mut(peer).expect("claimed for a known peer");
        if ep.links.len() <= i {
            ep.links.resize_with(i + 1, Link::default);
        }
        let old = ep.links[i].conn.replace(conn);
        ep.links[i].open = true;
        ep.links[i].attempts = 0;
        if let Some(old) = old.filter(|&o| o != conn) {
            self.kill_conn(old);
        }
        let accept = self.record(HelloKind::Accept);
        let c = self.conn_mut(conn).expect("conn exists");
        c.stage = Stage::Open;
        c.peer = Some(peer);
        c.deadline = None;
        c.write_record(&accept);
        self.counters.links_joined += 1;
        self.submit_tx(conn);
        self.links_changed(peer);
    }

    /// Dialer: the acceptor answered a join.
    pub(super) fn on_link_answer(&mut self, now: Instant, conn: ConnKey, h: Hello) {
        let c = self.conn_mut(conn).expect("conn exists");
        let (peer, link) = (c.peer.expect("dialer knows its peer"), c.link);
        let ours = self
            .link_mut(peer, link)
            .is_some_and(|l| l.conn == Some(conn));
        match h.kind {
            HelloKind::Accept
                if (h.job, h.pid) == self.wire_name(peer) && ours && self.links_wanted(peer) =>
            {
                let c = self.conn_mut(conn).expect("conn exists");
                c.stage = Stage::Open;
                c.deadline = None;
                let l = self.link_mut(peer, link).expect("checked above");
                l.open = true;
                l.attempts = 0;
                self.counters.links_joined += 1;
                self.links_changed(peer);
            }
            HelloKind::Reject(RejectReason::LinksOff) => {
                // The peer takes no links: dial none to it.
                self.kill_conn(conn);
                if let Some(ep) = self.ep_mut(peer) {
                    for l in &mut ep.links {
                        l.route = None;
                        l.retry_at = None;
                        if l.conn == Some(conn) {
                            l.conn = None;
                        }
                    }
                }
            }
            _ => self.link_lost(now, conn),
        }
    }

    /// A link's connection failed or ended (at any stage): it is closed, and the dialer
    /// tries the link again later while the endpoint is connected.
    ///
    /// A link lost while the stream goes in runs (either way) may take frames with it:
    /// the endpoint starts a failover on its primary (a RESUME that asks, see
    /// `failover.rs`), after which each side sends again what the other did not consume.
    pub(super) fn link_lost(&mut self, now: Instant, conn: ConnKey) {
        let Some(c) = self.conn_mut(conn) else { return };
        let (peer, link, open) = (c.peer, c.link, c.stage == Stage::Open);
        let batch_out = open && c.tx.is_none() && !c.failed_over;
        if let Some(p) = peer.filter(|_| open) {
            // What was consumed on it stays counted.
            self.fold_rx(p);
        }
        if open {
            // A path that failed: no FIN to wait for.
            self.reset_conn(conn);
        } else {
            self.kill_conn(conn);
        }
        let Some(peer) = peer else { return };
        // After a FIN either way the links end with their endpoint: no loss.
        let lost = open && self.links_wanted(peer);
        let Some(l) = self.link_mut(peer, link).filter(|l| l.conn == Some(conn)) else {
            return;
        };
        l.conn = None;
        l.open = false;
        let ep = self.ep_mut(peer).expect("a link's endpoint exists");
        ep.fo.rx_order.link_lost(usize::from(link));
        // (Once our FIN is written the peer may close its links at its clean end, having
        // consumed all of ours: an end or a reset then says nothing of a loss.)
        let runs = matches!(ep.state, EpState::Connected { .. })
            && ep.fo.on
            && (ep.fo.tx_runs || ep.fo.rx_spread)
            && !ep.fin_sent
            && !ep.fin_rcvd;
        if lost {
            self.counters.links_lost += 1;
            if runs {
                if batch_out {
                    // Its bytes may still be read by the kernel: no send completes
                    // before the batch is back.
                    if let Some(c) = self.conn_mut(conn) {
                        c.failed_over = true;
                    }
                    if let Some(ep) = self.ep_mut(peer) {
                        ep.fo.dead_batches += 1;
                    }
                }
                if !self.ask_resume(now, peer) {
                    return;
                }
            }
        }
        self.links_changed(peer);
        self.schedule_link(now, peer, link);
    }

    /// Dials `peer`'s `link` again after the retry delay (the dialer side only).
    pub(super) fn link_dial_later(&mut self, now: Instant, peer: PeerId, link: u8) {
        if !self.below_me(peer) {
            self.schedule_link(now, peer, link);
        }
    }

    /// The next attempt at a link, after the doubling delay (dialer side only).
    fn schedule_link(&mut self, now: Instant, peer: PeerId, link: u8) {
        let base = self.cfg.retry_delay;
        let Some(l) = self.link_mut(peer, link) else {
            return;
        };
        if l.route.is_none() {
            return;
        }
        let delay = base
            .saturating_mul(1u32 << l.attempts.min(10))
            .min(MAX_LINK_RETRY);
        l.attempts = l.attempts.saturating_add(1);
        let at = now + delay;
        l.retry_at = Some(at);
        self.arm_timer(at);
    }

    /// Timers of `peer`'s links: a scheduled attempt that is due dials (while the
    /// endpoint is connected; otherwise it is dropped, and the next adoption dials).
    ///
    /// No link is dialed while a RESUME of ours waits for its answer: after we moved the
    /// stream to a link, the peer may still hold that connection as the link's, and a
    /// join for the slot would make it close the connection that is now our primary.
    /// Its answer comes once it read our RESUME there and moved the stream too.
    pub(super) fn link_timers(&mut self, now: Instant, peer: PeerId) {
        let wanted = self.links_wanted(peer) && !self.below_me(peer);
        let recheck = now + self.cfg.retry_delay;
        let Some(ep) = self.ep_mut(peer) else { return };
        let unanswered = ep.fo.awaiting.is_some();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (i, l) in ep.links.iter_mut().enumerate() {
            let Some(t) = l.retry_at else { continue };
            if !wanted {
                l.retry_at = None;
            } else if t <= now && unanswered {
                next = Some(next.map_or(recheck, |n| n.min(recheck)));
            } else if t <= now {
                l.retry_at = None;
                if let (Some((addr, bind)), None) = (l.route, l.conn) {
                    due.push(Todo::Dial {
                        peer,
                        link: (i + 1) as u8,
                        addr,
                        bind,
                    });
                }
            } else {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        self.todo.extend(due);
        if let Some(t) = next {
            self.arm_timer(t);
        }
    }

    /// Closes every link of `peer` (its endpoint closes or fails) and forgets their
    /// schedules; the plan stays for the next adoption.
    pub(super) fn close_links(&mut self, peer: PeerId) {
        let Some(ep) = self.ep_mut(peer) else { return };
        let conns: Vec<ConnKey> = ep
            .links
            .iter_mut()
            .filter_map(|l| {
                l.open = false;
                l.attempts = 0;
                l.retry_at = None;
                l.conn.take()
            })
            .collect();
        for k in conns {
            self.kill_conn(k);
        }
        self.links_changed(peer);
    }

    /// Whether `conn` is a link beyond its endpoint's first.
    #[inline]
    pub(super) fn is_link(&mut self, conn: ConnKey) -> bool {
        self.conn_mut(conn).is_some_and(|c| c.link > 0)
    }

    fn link_mut(&mut self, peer: PeerId, link: u8) -> Option<&mut Link> {
        let i = usize::from(link).checked_sub(1)?;
        slot(&mut self.endpoints, peer.0)?.links.get_mut(i)
    }
}
