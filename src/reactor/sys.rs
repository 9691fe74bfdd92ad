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
