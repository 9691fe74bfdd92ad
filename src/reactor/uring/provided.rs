//! The io_uring backend's provided-buffer receive, the [`ProvidedRecv`] extension: one
//! ring of provided buffers (buffer group [`BGID`]) shared by every connection, one
//! multishot `RecvMulti` per connection, its re-arming after `ENOBUFS`, and pausing it
//! so that a large payload is read straight into its own buffer. What the kernel may
//! write is the ring's memory, owned by the pool (see `bufring`), never a slot's.

use std::io;
use std::mem;

use io_uring::{cqueue, opcode, types};

use super::{errno, token, BufPool, Uring, BGID, KIND_CANCEL, KIND_RECV_MULTI};
use crate::reactor::op::Misuse;
use crate::reactor::{ConnId, Event, ProvidedRecv, RingGeometry};

impl Uring {
    /// A CQE of a connection's multishot receive: lend the buffer, re-arm when the kernel
    /// ended the receive, park the connection when the ring ran empty.
    pub(super) fn complete_recv_multi(
        &mut self,
        idx: usize,
        res: i32,
        flags: u32,
        out: &mut Vec<Event>,
    ) {
        let conn = ConnId(idx as u32);
        // Invariant: `complete` found the slot with the right generation.
        let Some(c) = self.slots.get_mut(idx) else {
            return;
        };
        let more = cqueue::more(flags);
        if !more {
            c.io.mshot = false;
        }
        let paused = !more && c.io.pausing;
        if paused {
            c.io.pausing = false;
        }
        let bid = cqueue::buffer_select(flags);
        let Some(pool) = self.pool.as_ref() else {
            debug_assert!(false, "multishot receive without a buffer ring");
            return;
        };
        if c.closing || self.shutting_down {
            // Nobody waits for these bytes any more.
            if let Some(bid) = bid {
                pool.give_back(bid);
            }
            self.maybe_finish_close(idx, out);
            return;
        }
        let (data, result) = if res > 0 {
            match bid.and_then(|b| pool.lend(b, res as usize)) {
                Some(buf) => (Some(buf), Ok(res as usize)),
                None => {
                    if let Some(b) = bid {
                        pool.give_back(b);
                    }
                    debug_assert!(false, "receive CQE without a valid buffer");
                    (None, Err(io::Error::from_raw_os_error(libc::EIO)))
                }
            }
        } else {
            if let Some(b) = bid {
                pool.give_back(b);
            }
            if paused && (res == -libc::ECANCELED || res == -libc::ENOBUFS) {
                // Ended by our cancel, or by an empty ring just before it: the socket
                // keeps the rest for the caller's own receive. (End of stream and errors
                // are reported below as usual: the connection is over anyway.)
                out.push(Event::ProvidedPaused { conn });
                return;
            }
            if res == -libc::ENOBUFS {
                // The ring is empty: the kernel stopped this receive. The bytes stay in
                // the socket; re-armed by `rearm_starved` once a buffer is back.
                self.starvations += 1;
                if !c.io.starved {
                    c.io.starved = true;
                    self.starved.push(idx);
                }
                return;
            }
            if res == 0 {
                (None, Ok(0))
            } else {
                (None, Err(errno(res)))
            }
        };
        let got_data = matches!(result, Ok(n) if n > 0);
        let rearm = !more && !paused && got_data;
        out.push(Event::RecvProvided { conn, data, result });
        if paused && got_data {
            out.push(Event::ProvidedPaused { conn });
        } else if rearm {
            // The kernel ended the multishot after data (for example on CQ pressure):
            // the connection keeps receiving.
            self.arm_recv_multi(idx);
        }
    }

    /// Queues the connection's multishot receive on the provided buffers.
    pub(super) fn arm_recv_multi(&mut self, idx: usize) {
        // Invariant: callers pass an existing, non-closing slot.
        let Some(c) = self.slots.get_mut(idx) else {
            return;
        };
        if c.io.mshot || c.closing {
            return;
        }
        c.io.mshot = true;
        let entry = opcode::RecvMulti::new(types::Fd(c.io.fd), BGID)
            .build()
            .user_data(token(KIND_RECV_MULTI, idx, c.gen));
        // SAFETY: the SQE carries no user pointer: the kernel picks each destination
        // buffer from the registered ring of group BGID, whose memory `self.pool` keeps
        // mapped, and which is unregistered only after every receive completed (see
        // `shutdown`). The fd stays open until the slot's last CQE (`c.io.mshot` counts in
        // `in_flight`).
        unsafe { self.push(entry) };
    }

    /// Re-arms the receives stopped by `ENOBUFS` when buffers came back to the ring.
    pub(super) fn rearm_starved(&mut self) {
        if self.starved.is_empty() || !self.pool.as_ref().is_some_and(|p| p.has_spare()) {
            return;
        }
        let mut starved = mem::take(&mut self.starved);
        for idx in starved.drain(..) {
            let Some(c) = self.slots.get_mut(idx) else {
                continue;
            };
            // A slot freed and reused meanwhile has `starved == false`.
            if c.io.starved {
                c.io.starved = false;
                self.arm_recv_multi(idx);
            }
        }
        self.starved = starved;
    }
}

impl ProvidedRecv for Uring {
    fn provide_buffers(&mut self, geo: RingGeometry) -> io::Result<()> {
        if self.pool.is_some() {
            return Ok(());
        }
        if !self.slots.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "provided buffers must be set up before any connection exists",
            ));
        }
        if !kernel_at_least(6, 0) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "multishot receive needs Linux 6.0 or newer",
            ));
        }
        let pool = BufPool::new(geo)?;
        // SAFETY: the ring memory (`count` descriptors, page-aligned) is owned by `pool`,
        // which this backend keeps until `shutdown` unregisters the group after draining
        // every receive (or leaks it); buffers lent out keep it alive beyond that.
        unsafe {
            self.ring.submitter().register_buf_ring_with_flags(
                pool.ring_addr(),
                geo.count,
                BGID,
                0,
            )?;
        }
        tracing::debug!(?geo, "provided-buffer ring registered");
        self.pool = Some(pool);
        Ok(())
    }

    #[inline]
    fn recv_provided(&mut self, conn: ConnId) -> bool {
        if self.pool.is_none() {
            return false;
        }
        let idx = conn.0 as usize;
        match self.slots.get(idx) {
            None => self.slots.defer(Event::RecvProvided {
                conn,
                data: None,
                result: Err(Misuse::NoConnection.error()),
            }),
            // Closing: the close completes without it.
            Some(s) if s.closing || s.io.mshot || s.io.starved => {}
            Some(_) => self.arm_recv_multi(idx),
        }
        true
    }

    fn pause_provided(&mut self, conn: ConnId) {
        let idx = conn.0 as usize;
        let Some(s) = self.slots.get_mut(idx) else {
            return;
        };
        if s.closing || s.io.pausing {
            return;
        }
        if s.io.mshot {
            s.io.pausing = true;
            s.io.cancels += 1;
            let gen = s.gen;
            self.push_cancel(
                token(KIND_RECV_MULTI, idx, gen),
                token(KIND_CANCEL, idx, gen),
            );
        } else {
            // Not in flight (starved, or never armed): paused already. A starved slot
            // stays in `starved` with the flag cleared, which `rearm_starved` skips.
            s.io.starved = false;
            self.slots.defer(Event::ProvidedPaused { conn });
        }
    }
}

/// Whether the running kernel's release is at least `major.minor` (from `uname`).
fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: `utsname` is plain C data for which all-zero bytes are valid.
    let mut u: libc::utsname = unsafe { mem::zeroed() };
    // SAFETY: `uname` writes a NUL-terminated release string into `u`, a live local.
    if unsafe { libc::uname(&mut u) } != 0 {
        return false;
    }
    let release: String = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (maj, min) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (maj, min) >= (major, minor)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::tests::{make, poll_until, std_peer};
    use super::*;
    use crate::reactor::{Backend, ProvidedBuf, RxBuf};

    /// Polls until `got` holds `len` bytes taken from provided buffers, then gives the
    /// buffers back.
    fn collect_provided(u: &mut Uring, got: &mut Vec<u8>, len: usize) {
        let mut held: Vec<ProvidedBuf> = Vec::new();
        poll_until(u, false, |ev| match ev {
            Event::RecvProvided {
                data: Some(buf), ..
            } => {
                got.extend_from_slice(buf.bytes());
                held.push(buf);
                got.len() >= len
            }
            other => panic!("unexpected {other:?}"),
        });
        for b in held {
            drop(b);
        }
    }

    /// A server connection on a ring with provided buffers of `geo`, and its plain-socket
    /// peer; `None` (the test is skipped) when the kernel has no multishot receive.
    fn provided_pair(count: u16, size: u32) -> Option<(Uring, ConnId, std::net::TcpStream)> {
        let geo = RingGeometry { count, size };
        let mut u = make()?;
        if let Err(e) = u.provide_buffers(geo) {
            crate::skip::skip(format_args!("provided-buffer ring unavailable here: {e}"));
            return None;
        }
        let addr = u.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let (peer, server) = std_peer(&mut u, addr);
        assert!(u.recv_provided(server));
        assert!(u.recv_provided(server), "arming twice is a no-op");
        Some((u, server, peer))
    }

    /// Two buffers of 4 KiB and a peer writing 4 MiB: while the caller holds both
    /// buffers the kernel stops the receive with ENOBUFS; once they are back it is
    /// re-armed, and every byte arrives, in order. Closing drains the multishot receive.
    #[test]
    fn multishot_recovers_when_the_ring_runs_empty() {
        use std::io::Write;
        let Some((mut u, server, mut peer)) = provided_pair(2, 4096) else {
            return;
        };
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 + (i >> 13)) as u8).collect();
        let want = data.clone();
        let writer = std::thread::spawn(move || {
            peer.write_all(&data).unwrap();
            peer
        });
        let mut got = Vec::with_capacity(want.len());
        let mut held: Vec<ProvidedBuf> = Vec::new();
        let mut holds = 0;
        while got.len() < want.len() {
            poll_until(&mut u, false, |ev| match ev {
                Event::RecvProvided {
                    conn,
                    data: Some(buf),
                    result,
                } => {
                    assert_eq!(conn, server);
                    assert_eq!(result.unwrap(), buf.bytes().len());
                    assert!(buf.bytes().len() <= 4096);
                    got.extend_from_slice(buf.bytes());
                    held.push(buf);
                    true
                }
                other => panic!("unexpected {other:?}"),
            });
            if held.len() == 2 && holds < 20 {
                // Both buffers are out: the ring is empty while more data waits.
                holds += 1;
                let mut out = Vec::new();
                u.poll(Some(Duration::from_millis(2)), &mut out).unwrap();
                assert!(out.is_empty(), "{out:?}");
            }
            for b in held.drain(..) {
                drop(b);
            }
        }
        assert_eq!(got, want, "bytes lost or reordered");
        assert!(u.counters().recv_starved > 0, "the ring never ran empty");
        assert_eq!(u.pool.as_ref().unwrap().lent(), 0);
        close_and_shut_down(u, server, writer.join().unwrap());
    }

    /// Pausing an armed multishot receive: the bytes already in provided buffers come
    /// first, then `ProvidedPaused`; the rest of the stream is read with a plain `Recv`
    /// into the caller's buffer (nothing arrives through the ring meanwhile); resuming
    /// brings the ring back. Every byte arrives once, in order.
    #[test]
    fn pause_then_direct_receive_then_resume() {
        use std::io::Write;
        let Some((mut u, server, mut peer)) = provided_pair(4, 4096) else {
            return;
        };
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i * 13 + (i >> 11)) as u8)
            .collect();
        peer.write_all(&data[..1000]).unwrap();
        let mut got = Vec::new();
        collect_provided(&mut u, &mut got, 1000);
        u.pause_provided(server);
        u.pause_provided(server); // idempotent
        let writer = {
            let rest = data[1000..].to_vec();
            std::thread::spawn(move || {
                peer.write_all(&rest).unwrap();
                peer
            })
        };
        let mut paused = 0;
        let mut held: Vec<ProvidedBuf> = Vec::new();
        poll_until(&mut u, false, |ev| match ev {
            Event::RecvProvided {
                data: Some(buf), ..
            } => {
                assert_eq!(paused, 0, "ring data after ProvidedPaused");
                got.extend_from_slice(buf.bytes());
                held.push(buf);
                false
            }
            Event::ProvidedPaused { conn } => {
                assert_eq!(conn, server);
                paused += 1;
                true
            }
            other => panic!("unexpected {other:?}"),
        });
        for b in held.drain(..) {
            drop(b);
        }
        // The rest, minus a tail left for the resumed ring, goes through plain receives.
        let direct_end = data.len() - 500;
        while got.len() < direct_end {
            let mut rx = RxBuf::cache(direct_end - got.len());
            rx.commit(0);
            u.recv(server, rx);
            poll_until(&mut u, false, |ev| match ev {
                Event::Recv { rx, result, .. } => {
                    let n = result.unwrap();
                    assert!(n > 0);
                    got.extend_from_slice(rx.bytes(0..n));
                    true
                }
                other => panic!("unexpected {other:?}"),
            });
        }
        assert!(u.recv_provided(server));
        collect_provided(&mut u, &mut got, data.len());
        assert!(got == data, "bytes lost, duplicated or reordered");
        close_and_shut_down(u, server, writer.join().unwrap());
    }

    /// A connection whose receive stopped for lack of buffers closes at once (nothing of
    /// it is in flight) and is not re-armed when the held buffer comes back.
    #[test]
    fn close_while_starved() {
        use std::io::Write;
        let Some((mut u, server, mut peer)) = provided_pair(1, 1024) else {
            return;
        };
        peer.write_all(&[1u8; 1024]).unwrap();
        let mut held = None;
        poll_until(&mut u, false, |ev| match ev {
            Event::RecvProvided {
                data: Some(buf), ..
            } => {
                held = Some(buf);
                true
            }
            other => panic!("unexpected {other:?}"),
        });
        peer.write_all(&[2u8; 100]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut out = Vec::new();
        while u.starvations == 0 {
            assert!(Instant::now() < deadline, "no ENOBUFS");
            u.poll(Some(Duration::from_millis(5)), &mut out).unwrap();
            assert!(out.is_empty(), "{out:?}");
        }
        assert!(u.slots[server.0 as usize].io.starved);
        u.close(server);
        poll_until(
            &mut u,
            false,
            |ev| matches!(ev, Event::Closed { conn } if conn == server),
        );
        drop(held.take());
        u.poll(Some(Duration::from_millis(5)), &mut out).unwrap();
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(u.shutdown(), 0);
    }

    /// End of stream arrives as `RecvProvided` with `Ok(0)` and no buffer; a buffer still
    /// held when the backend is dropped stays readable.
    #[test]
    fn multishot_end_of_stream_and_buffer_outliving_backend() {
        use std::io::Write;
        let Some((mut u, server, mut peer)) = provided_pair(4, 1024) else {
            return;
        };
        peer.write_all(b"hello").unwrap();
        drop(peer);
        let mut kept = None;
        let mut eof = false;
        poll_until(&mut u, false, |ev| match ev {
            Event::RecvProvided {
                conn,
                data: Some(buf),
                result: Ok(n),
            } => {
                assert_eq!(conn, server);
                assert_eq!(buf.bytes(), &b"hello"[..n]);
                kept = Some(buf);
                false
            }
            Event::RecvProvided {
                data: None,
                result: Ok(0),
                ..
            } => {
                eof = true;
                true
            }
            other => panic!("unexpected {other:?}"),
        });
        assert!(eof);
        assert_eq!(u.shutdown(), 0);
        drop(u);
        assert_eq!(kept.unwrap().bytes(), b"hello");
    }

    /// Closes `server`, waits for its `Closed`, then shuts down with no op leaked.
    fn close_and_shut_down(mut u: Uring, server: ConnId, peer: std::net::TcpStream) {
        u.close(server);
        poll_until(&mut u, false, |ev| matches!(ev, Event::Closed { .. }));
        drop(peer);
        assert_eq!(u.shutdown(), 0, "ops leaked");
    }
}
