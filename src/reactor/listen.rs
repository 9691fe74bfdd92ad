//! Listening on the wildcard address of several families on one port, and the plain
//! sockets that reserve such a port; and the pause of accepting when descriptors run
//! out ([`AcceptBackoff`], shared by both backends). The only sockets here are those
//! throw-away ones; every listener is the backend's.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use super::{AnyBackend, Backend};

impl AnyBackend {
    /// Listens on the wildcard address of every family among `addrs` (the local
    /// addresses to publish), all on one port: the first free port of `ports`, else an
    /// ephemeral one. Returns the port.
    ///
    /// With both families the port is chosen by binding plain sockets first (so that a
    /// port taken in one family is skipped before the backend owns anything), then handed
    /// to the backend; a port taken in between is retried with the next one.
    ///
    /// Errors: `AddrInUse` when no candidate port is free in every family (its message
    /// carries the last refusal), else the error of the socket call that failed.
    pub(crate) fn listen_wildcard(
        &mut self,
        addrs: impl IntoIterator<Item = IpAddr>,
        ports: Option<(u16, u16)>,
    ) -> io::Result<u16> {
        let (mut v4, mut v6) = (false, false);
        for a in addrs {
            v4 |= a.is_ipv4();
            v6 |= a.is_ipv6();
        }
        let mut fams: Vec<IpAddr> = Vec::new();
        if v4 {
            fams.push(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        }
        if v6 {
            fams.push(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
        }
        let candidates: Vec<u16> = match ports {
            Some((lo, hi)) => (lo..=hi).collect(),
            None => vec![0],
        };
        let mut last: Option<io::Error> = None;
        for &want in &candidates {
            if let [ip] = fams[..] {
                match self.listen(SocketAddr::new(ip, want)) {
                    Ok(a) => return Ok(a.port()),
                    Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
                    Err(e) => return Err(e),
                }
                continue;
            }
            // Two families: find a port free in both, up to a few times for ephemeral ports.
            for _ in 0..if want == 0 { 16 } else { 1 } {
                let port = match reserve_port(&fams, want) {
                    Ok(p) => p,
                    Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                        last = Some(e);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let mut bound = 0;
                for &ip in &fams {
                    match self.listen(SocketAddr::new(ip, port)) {
                        Ok(_) => bound += 1,
                        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                            last = Some(e);
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
                if bound == fams.len() {
                    return Ok(port);
                }
                // A listener left from a partial success accepts on a port nobody
                // publishes: harmless, as every connection must pass the handshake.
            }
        }
        Err(match last {
            Some(e) => io::Error::new(io::ErrorKind::AddrInUse, e.to_string()),
            None => io::Error::from(io::ErrorKind::AddrInUse),
        })
    }
}

/// Binds a throw-away socket per family to `port` (0: the first family's ephemeral port)
/// and returns the port, or `AddrInUse` when a family has it taken. The sockets close on
/// return: the port is free again for the backend's listeners, which bind it at once.
fn reserve_port(fams: &[IpAddr], port: u16) -> io::Result<u16> {
    let mut held = Vec::with_capacity(fams.len());
    let mut port = port;
    for &ip in fams {
        let a = SocketAddr::new(ip, port);
        let s = Socket::new(Domain::for_address(a), Type::STREAM.cloexec(), None)?;
        s.set_reuse_address(true)?;
        if ip.is_ipv6() {
            s.set_only_v6(true)?;
        }
        s.bind(&a.into())?;
        if port == 0 {
            port = s
                .local_addr()?
                .as_socket()
                .map(|a| a.port())
                .ok_or_else(|| io::Error::other("bound socket has no inet address"))?;
        }
        held.push(s);
    }
    Ok(port)
}

/// Accepting paused because the process or the system ran out of descriptors (or of
/// memory for a socket): `accept` would fail at once again, and retrying it on every pass
/// would spin a core. Both backends stop accepting for a delay that doubles from
/// [`ACCEPT_PAUSE_MIN`] to [`ACCEPT_PAUSE_MAX`] (reset by a successful accept), and
/// resume early when one of their own descriptors closes. Connections keep waiting in the
/// listen backlog meanwhile.
#[derive(Debug)]
pub(crate) struct AcceptBackoff {
    /// Paused until then.
    until: Option<Instant>,
    /// The next pause.
    delay: Duration,
}

impl AcceptBackoff {
    pub(crate) fn new() -> Self {
        Self {
            until: None,
            delay: ACCEPT_PAUSE_MIN,
        }
    }

    /// Whether `e` means "no descriptor or memory for a new socket now": `EMFILE`,
    /// `ENFILE`, `ENOBUFS`, `ENOMEM`.
    pub(crate) fn is_exhaustion(e: &io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        )
    }

    /// Accepting failed with an exhaustion error: pause.
    pub(crate) fn pause(&mut self, now: Instant) {
        self.until = Some(now + self.delay);
        self.delay = (self.delay * 2).min(ACCEPT_PAUSE_MAX);
    }

    /// An accept succeeded: the next pause starts short again.
    #[inline]
    pub(crate) fn accepted(&mut self) {
        self.delay = ACCEPT_PAUSE_MIN;
    }

    /// One of the backend's descriptors closed: resume at the next pass.
    #[inline]
    pub(crate) fn descriptor_freed(&mut self) {
        if self.until.is_some() {
            self.until = Some(Instant::now());
        }
    }

    /// True while paused; lifts the pause once it is over. Reads the clock only while
    /// paused.
    #[inline]
    pub(crate) fn paused(&mut self) -> bool {
        let Some(t) = self.until else {
            return false;
        };
        if t > Instant::now() {
            return true;
        }
        self.until = None;
        false
    }

    /// When the pause ends (a wait should not outlast it).
    pub(crate) fn until(&self) -> Option<Instant> {
        self.until
    }
}

/// The first pause of accepting after running out of descriptors.
pub(crate) const ACCEPT_PAUSE_MIN: Duration = Duration::from_millis(10);
/// The longest pause.
pub(crate) const ACCEPT_PAUSE_MAX: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_pause_doubles_resets_and_ends_when_a_descriptor_closes() {
        let mut b = AcceptBackoff::new();
        assert!(!b.paused() && b.until().is_none());
        let e = io::Error::from_raw_os_error(libc::EMFILE);
        assert!(AcceptBackoff::is_exhaustion(&e));
        assert!(!AcceptBackoff::is_exhaustion(
            &io::Error::from_raw_os_error(libc::ECONNABORTED)
        ));
        let now = Instant::now();
        let mut want = ACCEPT_PAUSE_MIN;
        for _ in 0..10 {
            b.pause(now);
            assert_eq!(b.until(), Some(now + want));
            want = (want * 2).min(ACCEPT_PAUSE_MAX);
        }
        assert_eq!(b.until(), Some(now + ACCEPT_PAUSE_MAX));
        assert!(b.paused());
        // One of our descriptors closed: the pause ends at once.
        b.descriptor_freed();
        assert!(!b.paused());
        assert!(b.until().is_none());
        // Accepting worked again: the next pause is short.
        b.accepted();
        b.pause(now);
        assert_eq!(b.until(), Some(now + ACCEPT_PAUSE_MIN));
    }
}
