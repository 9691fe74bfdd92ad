//! The IPv6 variant of the loopback helpers: transports listening on `[::1]` instead of
//! `127.0.0.1`, and the kernel's table of TCP sockets, which shows the family a
//! connection took.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

use ringbtl::{BackendKind, Config, Transport};

/// The IPv6 loopback address with an ephemeral port: where [`cfg`] listens.
pub const LOOPBACK: SocketAddr = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0);

/// Whether this machine can listen on `[::1]`; otherwise [`skip`](super::skip)s the test
/// with the reason (IPv6 disabled in the kernel, or on the loopback interface).
pub fn usable() -> bool {
    match TcpListener::bind(LOOPBACK) {
        Ok(_) => true,
        Err(e) => {
            super::skip(format_args!(
                "no IPv6 loopback here: listening on [::1]: {e}"
            ));
            false
        }
    }
}

/// Makes a configuration listen on `[::1]:0`.
pub fn listen_on_loopback(c: &mut Config) {
    c.wireup.listen = Some(LOOPBACK);
}

/// [`super::cfg`] listening on `[::1]:0`.
pub fn cfg(pid: u32, kind: BackendKind) -> Config {
    let mut c = super::cfg(pid, kind);
    listen_on_loopback(&mut c);
    c
}

/// [`super::pair_with`] over `[::1]`: two transports that know each other by their IPv6
/// loopback addresses, configs adjusted by `f`.
pub fn pair_with(kind: BackendKind, f: impl Fn(&mut Config)) -> (Transport, Transport) {
    let (a, b) = super::pair_with(kind, |c| {
        listen_on_loopback(c);
        f(c);
    });
    for t in [&a, &b] {
        assert_eq!(
            t.local_addr().ip(),
            Ipv6Addr::LOCALHOST,
            "listening on [::1]"
        );
    }
    (a, b)
}

/// [`pair_with`] with the configurations unchanged.
pub fn pair(kind: BackendKind) -> (Transport, Transport) {
    pair_with(kind, |_| {})
}

/// The established TCP connections of this network namespace with `addr` at one end
/// (local or remote), from `/proc/net/tcp6` for an IPv6 address and `/proc/net/tcp` for
/// an IPv4 one: each end is one socket, so a connection between two local sockets counts
/// twice.
pub fn established(addr: SocketAddr) -> usize {
    let path = match addr {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let table = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local_address rem_address st ...; state 01 is TCP_ESTABLISHED.
            f.len() > 3
                && f[3] == "01"
                && (proc_addr(f[1]) == Some(addr) || proc_addr(f[2]) == Some(addr))
        })
        .count()
}

/// Parses an address of `/proc/net/tcp{,6}`: `0100007F:1F90` or
/// `00000000000000000000000001000000:1F90`, the address as 32-bit words printed in the
/// host's byte order, the port in hex.
pub fn proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for k in (0..ip.len()).step_by(8) {
        let word = u32::from_str_radix(ip.get(k..k + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}
