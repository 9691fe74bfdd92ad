//! Socket set-up shared by the backends (socket2), and small syscall helpers.

use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, IntoRawFd, RawFd};

use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};
use socket2::{Domain, Protocol, Socket, Type};

use super::config::Congestion;
use super::SockOpts;

/// Applies the configured options to a socket connected (or connecting) to `peer`.
pub(crate) fn apply_opts(sock: &Socket, opts: &SockOpts, peer: &SocketAddr) -> io::Result<()> {
    sock.set_tcp_nodelay(opts.nodelay)?;
    if let Some(name) = opts.congestion.for_peer(peer) {
        match sock.set_tcp_congestion(name.as_bytes()) {
            Ok(()) => {}
            Err(e) if matches!(opts.congestion, Congestion::Use(_)) => return Err(e),
            // Best effort (`reno` is always built in and allowed): a failure only
            // leaves the system's choice.
            Err(e) => tracing::debug!("TCP_CONGESTION {name} towards {peer}: {e}"),
        }
    }
    if let Some(n) = opts.sndbuf {
        sock.set_send_buffer_size(n)?;
    }
    if let Some(n) = opts.rcvbuf {
        sock.set_recv_buffer_size(n)?;
    }
    // Dead-peer detection: unacknowledged data is given up on after the user timeout,
    // an idle connection is probed; either way the kernel ends the connection with
    // ETIMEDOUT, which fails the endpoint.
    if opts.user_timeout.is_some() {
        sock.set_tcp_user_timeout(opts.user_timeout)?;
    }
    if let Some(k) = &opts.keepalive {
        sock.set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(k.idle)
                .with_interval(k.interval)
                .with_retries(k.count),
        )?;
    }
    Ok(())
}

/// Whether this process may use the TCP congestion control `name` (tried on a fresh,
/// unconnected socket).
pub(crate) fn check_congestion(name: &str) -> io::Result<()> {
    let sock = Socket::new(Domain::IPV4, Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    sock.set_tcp_congestion(name.as_bytes())
}

/// A non-blocking, close-on-exec TCP socket for `addr`'s family, options applied,
/// bound to `bind` when given. Returns the raw fd, now owned by the caller.
///
/// The bind asks for `IP_BIND_ADDRESS_NO_PORT`: the source port is chosen by the connect,
/// per destination, instead of by the bind. A plain bind to port 0 must find a port free
/// for *every* destination, and its search walks the whole port range past every socket
/// bound to that address, TIME_WAIT ones included: a rank of a 128-rank job on one node
/// spent tens of seconds inside `bind` during wire-up, its peers' handshakes timing out.
pub(crate) fn stream_socket(
    addr: &SocketAddr,
    bind: Option<SocketAddr>,
    opts: &SockOpts,
) -> io::Result<RawFd> {
    let sock = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    apply_opts(&sock, opts, addr)?;
    if let Some(b) = bind {
        bind_address_no_port(&sock);
        sock.bind(&b.into())?;
    }
    Ok(sock.into_raw_fd())
}

/// Sets `IP_BIND_ADDRESS_NO_PORT` (Linux 4.2; for IPv6 sockets too). Best effort: where
/// the kernel lacks it, the bind chooses the port as before.
fn bind_address_no_port(sock: &Socket) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: `sock` is an open socket for the duration of the call; the option value
    // points to a live `c_int` whose size is passed with it.
    let _ = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// A non-blocking listening socket on `addr` (SO_REUSEADDR, backlog SOMAXCONN).
/// Returns the fd (owned by the caller) and the bound address.
pub(crate) fn listener(addr: SocketAddr) -> io::Result<(RawFd, SocketAddr)> {
    let sock = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.bind(&addr.into())?;
    sock.listen(libc::SOMAXCONN)?;
    let local = sock
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("listener has no inet address"))?;
    Ok((sock.into_raw_fd(), local))
}

#[cfg(feature = "uring")]
/// Applies the configured options to a socket the caller owns as a raw fd, without
/// taking ownership of it (the fd stays open).
pub(crate) fn apply_opts_fd(fd: RawFd, opts: &SockOpts, peer: &SocketAddr) -> io::Result<()> {
    // SAFETY: the caller owns `fd` and keeps it open for the duration of this call; the
    // borrow ends before we return, and `SockRef` never closes the descriptor.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    apply_opts(&socket2::SockRef::from(&bfd), opts, peer)
}

/// The pending error of the socket on `fd` (`SO_ERROR`, which reading clears): how a
/// non-blocking connect ended once the socket polls writable.
pub(crate) fn socket_error(fd: RawFd) -> io::Result<()> {
    // SAFETY: the caller keeps `fd` open for the duration of this call; the borrow ends
    // before we return, and `SockRef` never closes the descriptor.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    match socket2::SockRef::from(&bfd).take_error()? {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// `ETIMEDOUT` (the OS code) when the connection on `fd` was aborted by
/// its retransmission or keepalive timer (`TCP_USER_TIMEOUT`, `tcp_retries2`, keepalive
/// count), else `None` (open, closed by a FIN, or reset).
///
/// The kernel reports such an abort once, to the first operation that looks at the
/// socket's error. An io_uring `SendMsg` that had already moved part of its data
/// reports that byte count instead and the error is lost, so the receive that follows
/// sees a plain end of stream. The socket still tells the story: it is `TCP_CLOSE`
/// (a peer's FIN leaves it in `CLOSE_WAIT`) and its timer had retried without an answer.
pub(crate) fn timeout_abort(fd: RawFd) -> Option<io::Error> {
    /// `TCP_CLOSE` in the kernel's `tcp_states.h`.
    const TCP_STATE_CLOSE: u8 = 7;
    // SAFETY: tcp_info is plain old data (integers only), so all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a writable tcp_info of `len` bytes; the kernel writes at most
    // `len` bytes and updates `len`. The caller keeps `fd` open during the call.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 || info.tcpi_state != TCP_STATE_CLOSE {
        return None;
    }
    let (retrans, probes) = (info.tcpi_retransmits, info.tcpi_probes);
    if retrans == 0 && probes == 0 {
        return None;
    }
    // The OS code itself: the transport keeps only the code of a connection's error
    // (an error without one would read as EIO).
    Some(io::Error::from_raw_os_error(libc::ETIMEDOUT))
}

/// How many times in a row the kernel's timer for the connection on `fd` fired without
/// an acknowledgement: the larger of `tcpi_retransmits` (retransmission timeouts, with
/// segments in flight) and `tcpi_probes` (zero-window probes, or the probes the kernel
/// sends when its queued data could not leave at all, as when the route to the peer went
/// away with an interface); `None` when `TCP_INFO` fails. Any acknowledgement resets
/// both, so a peer that reads slowly, whose kernel answers every probe, shows at most 1.
pub(crate) fn unanswered_timeouts(fd: RawFd) -> Option<u8> {
    // SAFETY: tcp_info is plain old data (integers only), so all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a writable tcp_info of `len` bytes; the kernel writes at most
    // `len` bytes and updates `len`. The caller keeps `fd` open during the call.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(info.tcpi_retransmits.max(info.tcpi_probes))
}

#[cfg(feature = "uring")]
/// The peer address of a connected socket given as a raw fd (`getpeername(2)`).
pub(crate) fn peer_addr_fd(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: as in `apply_opts_fd`: the caller keeps `fd` open during the call and the
    // borrow does not outlive it.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    socket2::SockRef::from(&bfd)
        .peer_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("peer has no inet address"))
}

/// Sets `TCP_QUICKACK` on `fd`: the kernel acknowledges at once what it holds
/// unacknowledged and leaves its "pingpong" mode of delayed ACKs, until that mode comes back
/// (it does when the socket sends soon after receiving, as a ping-pong's reply does).
pub(crate) fn quick_ack(fd: RawFd) -> io::Result<()> {
    // SAFETY: the caller keeps `fd` open for the duration of the call, and the borrow
    // ends with it.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    socket2::SockRef::from(&bfd).set_tcp_quickack(true)
}

/// Sets `SO_RCVLOWAT` on `fd` to `bytes` (at least 1).
pub(crate) fn set_rcvlowat(fd: RawFd, bytes: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes.max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: `v` lives on this frame for the call and the length given is its size; the
    // caller keeps `fd` open for the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The receive low-water mark of `fd` (`SO_RCVLOWAT`).
#[cfg(test)]
pub(crate) fn rcvlowat(fd: RawFd) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` live on this frame for the call, `len` holds the size of `v`;
    // the caller keeps `fd` open for the call.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw mut v).cast(),
            &raw mut len,
        )
    };
    if r == 0 {
        Ok(usize::try_from(v).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The connection's maximum segment size (`TCP_MAXSEG`: the payload bytes of a full
/// segment, options taken off), or `None` when the kernel does not say.
pub(crate) fn tcp_mss(fd: RawFd) -> Option<usize> {
    // SAFETY: the caller keeps `fd` open for the duration of the call, and the borrow
    // ends with it.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mss = socket2::SockRef::from(&bfd).tcp_mss().ok()?;
    usize::try_from(mss).ok().filter(|&m| m > 0)
}

/// Sets `SO_LINGER` to on, 0 s: the next close discards what the socket still holds to
/// send and resets the connection. Best effort (a failure leaves the graceful close).
pub(crate) fn linger_zero(fd: RawFd) {
    // SAFETY: the caller keeps `fd` open for the duration of the call, and the borrow
    // ends with it.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let _ = socket2::SockRef::from(&bfd).set_linger(Some(std::time::Duration::ZERO));
}

#[cfg(feature = "uring")]
/// Closes a raw fd the caller owns and will not use again (`close(2)`; errors ignored,
/// as after `close` the descriptor is gone either way).
pub(crate) fn close_fd(fd: RawFd) {
    if fd >= 0 {
        // SAFETY: the caller transfers its ownership of `fd` here and never uses it again,
        // so wrapping it in an `OwnedFd` that is dropped at once closes it exactly once.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
}

#[cfg(feature = "uring")]
/// A new non-blocking `eventfd` (close-on-exec), counter 0.
pub(crate) fn eventfd() -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd takes no pointer; a non-negative return is a new descriptor.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

#[cfg(feature = "uring")]
/// Resets a non-blocking `eventfd` to 0 (one read takes the whole counter; `EAGAIN` when
/// it is 0 already).
pub(crate) fn drain_eventfd(fd: BorrowedFd<'_>) {
    use std::os::fd::AsRawFd;
    let mut v = 0u64;
    // SAFETY: `v` is 8 writable bytes, as eventfd's read requires; the descriptor is kept
    // open by the borrow.
    let _ = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

// ----- the data path's system calls -------------------------------------------------------
//
// The C library's `send` and `recv` are cancellation points: in a process with more than
// one thread (an MPI process has its runtime's threads), glibc switches the thread's
// asynchronous cancellation on before the system call and off after it, work added to
// every call, and a busy-polling rank makes such a call on every pass. The transport never relies on cancellation (a thread cancelled inside a
// progress call would leave the transport's state half updated), so the data path's
// `send` and `recv` go through rustix: the `syscall` instruction inline, the error a value
// (no `errno`), whatever the process's threads. A batch of several pieces still goes out
// with the C library's `sendmsg` (one call per batch, not per pass).

/// `send(2)` of `len` bytes at `buf`, not a cancellation point (see above).
///
/// # Safety
/// `fd` must be open, and `buf` valid for reads of `len` bytes, for the call; the kernel
/// keeps no pointer.
#[inline]
pub(crate) unsafe fn send(fd: RawFd, buf: *const u8, len: usize, flags: SendFlags) -> Sys<usize> {
    // SAFETY: the caller guarantees `fd` and `buf` for the call.
    let (fd, buf) = unsafe {
        (
            BorrowedFd::borrow_raw(fd),
            std::slice::from_raw_parts(buf, len),
        )
    };
    rustix::net::send(fd, buf, flags)
}

/// `recv(2)` into the `len` bytes at `buf`, not a cancellation point (see above).
///
/// # Safety
/// `fd` must be open, and `buf` valid for writes of `len` bytes, for the call; the kernel
/// keeps no pointer.
#[inline]
pub(crate) unsafe fn recv(fd: RawFd, buf: *mut u8, len: usize, flags: RecvFlags) -> Sys<usize> {
    // SAFETY: the caller guarantees `fd` and `buf` (written only) for the call.
    let (fd, buf) = unsafe {
        let buf = std::slice::from_raw_parts_mut(buf.cast::<MaybeUninit<u8>>(), len);
        (BorrowedFd::borrow_raw(fd), buf)
    };
    // The second length is the one the kernel returned: the bytes written (no `TRUNC`).
    rustix::net::recv(fd, buf, flags).map(|(_, n)| n)
}

/// A data-path call's result: the error as rustix's [`Errno`] (turned into an
/// [`io::Error`] only when it ends an operation).
pub(crate) type Sys<T> = Result<T, Errno>;

/// The error of the C library call that just returned -1 (`errno`), as an [`Errno`].
#[inline]
pub(crate) fn last_errno() -> Errno {
    Errno::from_raw_os_error(
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

/// Calls a `libc` function and maps its `-1` return to [`io::Error::last_os_error`].
///
/// Expands to an `unsafe` call: the caller writes the `// SAFETY:` comment at the use site
/// and the macro only removes the errno boilerplate.
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        #[allow(unused_unsafe, clippy::undocumented_unsafe_blocks)]
        let res = unsafe { libc::$fn($($arg),*) };
        if res == -1 {
            Err(::std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}
#[cfg(feature = "epoll")]
pub(crate) use syscall;

#[cfg(feature = "epoll")]
/// Accepts one pending connection with `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`, so the new
/// socket needs no further `fcntl`. Returns the owned socket and the peer's address.
pub(crate) fn accept(listener: BorrowedFd<'_>) -> io::Result<(std::os::fd::OwnedFd, SocketAddr)> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use socket2::SockAddr;

    let fd = listener.as_raw_fd();
    // SAFETY: `try_init` hands us a zeroed `sockaddr_storage` and its length; accept4
    // writes at most `*len` bytes there and updates `*len`, which is the contract
    // `try_init` requires of the closure.
    let (raw, addr) = unsafe {
        SockAddr::try_init(|storage, len| {
            syscall!(accept4(
                fd,
                storage.cast(),
                len,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC
            ))
        })
    }?;
    // SAFETY: accept4 succeeded, so `raw` is a new descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
    let peer = addr
        .as_socket()
        .ok_or_else(|| io::Error::other("accepted socket has no inet address"))?;
    Ok((owned, peer))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, once per process: a transport of
/// many peers needs a descriptor per connection, and 1,024 is a common soft default.
/// Said in debug tracing; a failure is only traced (the limit stays as it was).
pub(crate) fn raise_nofile_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
        if let Err(e) = syscall!(getrlimit(libc::RLIMIT_NOFILE, &mut lim)) {
            tracing::debug!("RLIMIT_NOFILE: getrlimit failed: {e}");
            return;
        }
        if lim.rlim_cur >= lim.rlim_max {
            tracing::debug!(
                "RLIMIT_NOFILE: soft limit {} is the hard limit",
                lim.rlim_cur
            );
            return;
        }
        let old = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit read by the kernel during the call.
        match syscall!(setrlimit(libc::RLIMIT_NOFILE, &lim)) {
            Ok(_) => tracing::debug!(
                "RLIMIT_NOFILE: soft limit raised from {old} to the hard limit {}",
                lim.rlim_max
            ),
            Err(e) => tracing::debug!("RLIMIT_NOFILE: raising the soft limit {old} failed: {e}"),
        }
    });
}

/// The process's soft limit on open descriptors (`RLIMIT_NOFILE`), `None` when unknown
/// or unlimited.
pub(crate) fn nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    syscall!(getrlimit(libc::RLIMIT_NOFILE, &mut lim)).ok()?;
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::reactor::config::Keepalive;

    fn tcp() -> Socket {
        Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket")
    }

    #[test]
    fn dead_peer_detection_options_reach_the_socket() {
        let opts = SockOpts {
            nodelay: true,
            user_timeout: Some(Duration::from_millis(2500)),
            keepalive: Some(Keepalive {
                idle: Duration::from_secs(7),
                interval: Duration::from_secs(3),
                count: 4,
            }),
            ..SockOpts::default()
        };
        let s = tcp();
        apply_opts(&s, &opts, &REMOTE).unwrap();
        assert_eq!(
            s.tcp_user_timeout().unwrap(),
            Some(Duration::from_millis(2500))
        );
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(7));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(3));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 4);
    }

    #[cfg(feature = "uring")]
    #[test]
    fn open_and_finished_connections_are_not_timeouts() {
        use std::io::Read;
        use std::net::{TcpListener, TcpStream};
        use std::os::fd::AsRawFd;

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        assert!(timeout_abort(a.as_raw_fd()).is_none(), "established");
        drop(b);
        // The peer's FIN leaves `a` in CLOSE_WAIT: an end of stream, not an abort.
        let mut buf = [0u8; 1];
        assert_eq!((&a).read(&mut buf).unwrap(), 0);
        assert!(timeout_abort(a.as_raw_fd()).is_none(), "closed by the peer");
        assert!(timeout_abort(l.as_raw_fd()).is_none(), "listener");
    }

    #[test]
    fn unset_options_leave_the_kernel_defaults() {
        let s = tcp();
        apply_opts(&s, &SockOpts::default(), &REMOTE).unwrap();
        assert_eq!(s.tcp_user_timeout().unwrap(), None);
        assert!(!s.keepalive().unwrap());
        assert_eq!(congestion(&s), system_congestion());
    }

    /// A non-loopback peer (TEST-NET-3; nothing is sent to it).
    const REMOTE: SocketAddr = SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, 7)),
        9,
    );

    fn congestion(s: &Socket) -> String {
        let name = s.tcp_congestion().unwrap();
        String::from_utf8_lossy(&name)
            .trim_end_matches('\0')
            .to_string()
    }

    fn system_congestion() -> String {
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .unwrap()
            .trim()
            .to_string()
    }

    /// `Auto` picks reno towards loopback peers only; `System` never changes the
    /// system's choice; `Use` sets the named algorithm or fails.
    #[test]
    fn congestion_control_by_peer() {
        let lo: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let lo6: SocketAddr = "[::1]:9".parse().unwrap();
        let with = |c: Congestion| SockOpts {
            congestion: c,
            ..SockOpts::default()
        };
        let s = tcp();
        apply_opts(&s, &with(Congestion::Auto), &lo).unwrap();
        assert_eq!(congestion(&s), "reno");
        let s = tcp();
        apply_opts(&s, &with(Congestion::Auto), &lo6).unwrap();
        assert_eq!(congestion(&s), "reno");
        let s = tcp();
        apply_opts(&s, &with(Congestion::Auto), &REMOTE).unwrap();
        assert_eq!(congestion(&s), system_congestion());
        let s = tcp();
        apply_opts(&s, &with(Congestion::System), &lo).unwrap();
        assert_eq!(congestion(&s), system_congestion());
        let s = tcp();
        apply_opts(&s, &with(Congestion::Use("reno".into())), &REMOTE).unwrap();
        assert_eq!(congestion(&s), "reno");
        let s = tcp();
        let e = apply_opts(&s, &with(Congestion::Use("no-such-cc".into())), &lo).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    }
}
