//! Socket set-up shared by the backends (socket2), and small syscall helpers.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{IntoRawFd, RawFd};

use socket2::{Domain, Protocol, Socket, Type};

use super::SockOpts;

/// Applies the configured options to a connected or accepted socket.
pub(crate) fn apply_opts(sock: &Socket, opts: &SockOpts) -> io::Result<()> {
    sock.set_tcp_nodelay(opts.nodelay)?;
    if let Some(n) = opts.sndbuf {
        sock.set_send_buffer_size(n)?;
    }
    if let Some(n) = opts.rcvbuf {
        sock.set_recv_buffer_size(n)?;
    }
    Ok(())
}

/// A non-blocking, close-on-exec TCP socket for `addr`'s family, options applied,
/// bound to `bind` when given. Returns the raw fd, now owned by the caller.
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
    apply_opts(&sock, opts)?;
    if let Some(b) = bind {
        sock.bind(&b.into())?;
    }
    Ok(sock.into_raw_fd())
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

/// Applies the configured options to a socket the caller owns as a raw fd, without
/// taking ownership of it (the fd stays open).
pub(crate) fn apply_opts_fd(fd: RawFd, opts: &SockOpts) -> io::Result<()> {
    // SAFETY: the caller owns `fd` and keeps it open for the duration of this call; the
    // borrow ends before we return, and `SockRef` never closes the descriptor.
    let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    apply_opts(&socket2::SockRef::from(&bfd), opts)
}

/// The peer address of a connected socket given as a raw fd (`getpeername(2)`).
pub(crate) fn peer_addr_fd(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: as in `apply_opts_fd`: the caller keeps `fd` open during the call and the
    // borrow does not outlive it.
    let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    socket2::SockRef::from(&bfd)
        .peer_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("peer has no inet address"))
}

/// Closes a raw fd the caller owns and will not use again (`close(2)`; errors ignored,
/// as after `close` the descriptor is gone either way).
pub(crate) fn close_fd(fd: RawFd) {
    if fd >= 0 {
        // SAFETY: the caller transfers its ownership of `fd` here and never uses it again,
        // so wrapping it in an `OwnedFd` that is dropped at once closes it exactly once.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
}
