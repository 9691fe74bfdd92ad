//! The io_uring backend's accepts: one (multishot where the kernel has it) `Accept` per
//! listener, re-armed when it ends, and paused instead of re-armed when descriptors run
//! out ([`AcceptBackoff`]): re-armed at once it would fail at once, and spin. The accept
//! SQE carries no user memory.

use std::time::Instant;

use io_uring::{cqueue, opcode, types};

use super::{errno, token, Io, Uring, KIND_ACCEPT, KIND_CANCEL_ACCEPT};
use crate::reactor::listen::AcceptBackoff;
use crate::reactor::{sys, ConnId, Event};

impl Uring {
    /// Arms an accept on listener `i`.
    pub(super) fn arm_accept(&mut self, i: usize) {
        // Invariant: callers pass the index of an existing listener (never removed
        // before `shutdown`).
        let l = &mut self.listeners[i];
        l.armed = true;
        let fd = types::Fd(l.fd);
        let ud = token(KIND_ACCEPT, i, 0);
        // Non-blocking like a dialed socket: the direct calls (`sendmsg`, `recv`, and
        // `splice`, whose only way not to block on a socket is the socket's own flag)
        // must never wait.
        let flags = libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
        let entry = if l.multishot {
            opcode::AcceptMulti::new(fd).flags(flags).build()
        } else {
            // No address buffers: the peer address is read with getpeername afterwards.
            opcode::Accept::new(fd, std::ptr::null_mut(), std::ptr::null_mut())
                .flags(flags)
                .build()
        };
        // SAFETY: the accept SQE carries no user memory (null address pointers); the
        // listener fd stays open until `Drop`, which drains or leaks before closing it.
        unsafe { self.push(entry.user_data(ud)) };
    }

    pub(super) fn complete_accept(&mut self, i: usize, res: i32, flags: u32, out: &mut Vec<Event>) {
        let Some(l) = self.listeners.get_mut(i) else {
            return;
        };
        let more = l.multishot && cqueue::more(flags);
        if !more {
            l.armed = false;
        }
        if res == -libc::EINVAL && l.multishot {
            // A kernel without multishot accept (before 5.19) rejects the flag: fall back.
            l.multishot = false;
        } else if res == -libc::ECANCELED && (self.shutting_down || l.paused) {
            return;
        } else if res < 0 {
            let e = errno(res);
            if AcceptBackoff::is_exhaustion(&e) {
                // Re-armed at once it would fail at once: pause (see `rearm_accepts`).
                l.paused = true;
                self.accept_pause.pause(Instant::now());
                if more {
                    self.push_cancel(token(KIND_ACCEPT, i, 0), token(KIND_CANCEL_ACCEPT, i, 0));
                }
            }
            out.push(Event::AcceptError(e));
        } else {
            self.accept_pause.accepted();
            let fd = res;
            let setup = sys::peer_addr_fd(fd)
                .and_then(|peer| sys::apply_opts_fd(fd, &self.opts, &peer).map(|()| peer));
            match setup {
                Ok(peer) => {
                    let zc = self.zerocopy_for(&peer);
                    let idx = self.slots.insert(
                        Io {
                            zc,
                            chunk: self.opts.send_chunks_for(&peer),
                            ..Io::new(fd)
                        },
                        self.opts.rcvlowat_for(&peer),
                    );
                    out.push(Event::Accepted {
                        conn: ConnId(idx as u32),
                        peer,
                    });
                }
                Err(e) => {
                    sys::close_fd(fd);
                    out.push(Event::AcceptError(e));
                }
            }
        }
        // Invariant: `i` was found by `get_mut` above and listeners are never removed.
        if !self.listeners[i].armed && !self.listeners[i].paused && !self.shutting_down {
            self.arm_accept(i);
        }
    }

    /// Re-arms the accepts paused after running out of descriptors, once the pause is
    /// over (or one of our descriptors closed).
    pub(super) fn rearm_accepts(&mut self) {
        if self.accept_pause.paused() || self.shutting_down {
            return;
        }
        for i in 0..self.listeners.len() {
            let l = &mut self.listeners[i];
            if l.paused && !l.armed {
                l.paused = false;
                self.arm_accept(i);
            }
        }
    }
}
