//! `tcp://` address lists, the form in which a rank publishes where it listens.
//!
//! A list is one or more URIs joined by `;`:
//! `tcp://10.1.0.5:40123;tcp://[fd00::5]:40123`. Each URI is `tcp://` followed by a
//! numeric IPv4 address or a bracketed IPv6 address, `:`, and a decimal port in
//! `1..=65535`. Parsing is strict, because these strings travel between hosts and a
//! silently mangled address shows up much later as an unexplained connect timeout:
//! no host names, no whitespace, no empty items (so no trailing `;`), no IPv6 zone ids,
//! no unspecified (`0.0.0.0`, `::`) or multicast addresses, no port 0. Every error quotes
//! the offending URI. Pure code: no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use crate::error::Error;

/// The only scheme understood.
pub const SCHEME: &str = "tcp://";

/// Separator between the URIs of a list.
pub const SEPARATOR: char = ';';

/// Most URIs accepted in one list (a guard against absurd input, far above any host's
/// interface count).
pub const MAX_URIS: usize = 64;

/// Parses one `tcp://host:port` URI.
pub fn parse_uri(uri: &str) -> Result<SocketAddr, Error> {
    let bad = |why: &str| Error::Wireup(format!("bad address {uri:?}: {why}"));
    let rest = uri
        .strip_prefix(SCHEME)
        .ok_or_else(|| bad("expected it to start with tcp://"))?;
    let (ip, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, port) = v6
            .split_once("]:")
            .ok_or_else(|| bad("expected [ipv6]:port"))?;
        if host.contains('%') {
            return Err(bad("IPv6 zone ids are not supported"));
        }
        let a = Ipv6Addr::from_str(host).map_err(|_| bad("not an IPv6 address"))?;
        (IpAddr::V6(a), port)
    } else {
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("expected host:port"))?;
        if host.contains(':') {
            return Err(bad("IPv6 addresses must be in brackets: tcp://[addr]:port"));
        }
        let a = Ipv4Addr::from_str(host).map_err(|_| bad("not a numeric IPv4 address"))?;
        (IpAddr::V4(a), port)
    };
    if ip.is_unspecified() {
        return Err(bad("the unspecified address cannot be connected to"));
    }
    if ip.is_multicast() || ip == IpAddr::V4(Ipv4Addr::BROADCAST) {
        return Err(bad("not a unicast address"));
    }
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("port is not a decimal number"));
    }
    let port: u32 = port
        .parse()
        .map_err(|_| bad("port is not a decimal number"))?;
    if !(1..=65535).contains(&port) {
        return Err(bad("port outside 1..=65535"));
    }
    Ok(SocketAddr::new(ip, port as u16))
}

/// Parses a `;`-separated list of at least one and at most [`MAX_URIS`] URIs.
pub fn parse_uri_list(list: &str) -> Result<Vec<SocketAddr>, Error> {
    if list.is_empty() {
        return Err(Error::Wireup("empty address list".into()));
    }
    let mut out = Vec::new();
    for (i, item) in list.split(SEPARATOR).enumerate() {
        if item.is_empty() {
            return Err(Error::Wireup(format!(
                "bad address list {list:?}: item {} is empty",
                i + 1
            )));
        }
        if out.len() == MAX_URIS {
            return Err(Error::Wireup(format!(
                "address list longer than {MAX_URIS} entries: {:?}...",
                truncate(list, 80)
            )));
        }
        out.push(parse_uri(item)?);
    }
    Ok(out)
}

/// Formats one address as a URI (`tcp://10.1.0.5:40123`, `tcp://[fd00::5]:40123`).
/// An IPv6 scope id is dropped: it has no meaning on another host.
pub fn format_uri(addr: &SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("{SCHEME}{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("{SCHEME}[{}]:{}", a.ip(), a.port()),
    }
}

/// Formats a list of addresses, joined by `;`.
pub fn format_uri_list(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(format_uri)
        .collect::<Vec<_>>()
        .join(&SEPARATOR.to_string())
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_v4_and_v6() {
        assert_eq!(
            parse_uri("tcp://10.1.0.5:40123").unwrap(),
            sa("10.1.0.5:40123")
        );
        assert_eq!(
            parse_uri("tcp://[fd00::5]:40123").unwrap(),
            sa("[fd00::5]:40123")
        );
        assert_eq!(parse_uri("tcp://[::1]:1").unwrap(), sa("[::1]:1"));
        assert_eq!(
            parse_uri("tcp://127.0.0.1:65535").unwrap(),
            sa("127.0.0.1:65535")
        );
        assert_eq!(
            parse_uri("tcp://[::ffff:10.0.0.1]:80").unwrap(),
            sa("[::ffff:10.0.0.1]:80")
        );
    }

    #[test]
    fn list_round_trips() {
        let s = "tcp://10.1.0.5:40123;tcp://[fd00::5]:40123";
        let v = parse_uri_list(s).unwrap();
        assert_eq!(v, [sa("10.1.0.5:40123"), sa("[fd00::5]:40123")]);
        assert_eq!(format_uri_list(&v), s);
        assert_eq!(
            parse_uri_list("tcp://1.2.3.4:5").unwrap(),
            [sa("1.2.3.4:5")]
        );
        assert_eq!(format_uri_list(&[]), "");
    }

    #[test]
    fn format_drops_scope_and_uses_brackets() {
        let a = SocketAddr::V6(std::net::SocketAddrV6::new(
            "fe80::1".parse().unwrap(),
            7,
            0,
            3,
        ));
        assert_eq!(format_uri(&a), "tcp://[fe80::1]:7");
        assert_eq!(format_uri(&sa("1.2.3.4:80")), "tcp://1.2.3.4:80");
    }

    #[test]
    fn bad_uris_are_quoted() {
        for bad in [
            "",
            "tcp://",
            "udp://10.1.0.5:1",
            "TCP://10.1.0.5:1",
            "10.1.0.5:1",
            "tcp://10.1.0.5",
            "tcp://10.1.0.5:",
            "tcp://10.1.0.5:0",
            "tcp://10.1.0.5:65536",
            "tcp://10.1.0.5:99999999999",
            "tcp://10.1.0.5:+80",
            "tcp://10.1.0.5:-1",
            "tcp://10.1.0.5:8o",
            "tcp://10.1.0.5: 80",
            "tcp:// 10.1.0.5:80",
            "tcp://10.1.0.5:80 ",
            "tcp://10.1.0:80",
            "tcp://010.1.0.5:80",
            "tcp://node1:80",
            "tcp://fd00::5:80",
            "tcp://[fd00::5]",
            "tcp://[fd00::5]80",
            "tcp://[fd00::5:80",
            "tcp://[fe80::1%eth0]:80",
            "tcp://[10.1.0.5]:80",
            "tcp://0.0.0.0:80",
            "tcp://[::]:80",
            "tcp://224.0.0.1:80",
            "tcp://255.255.255.255:80",
            "tcp://[ff02::1]:80",
        ] {
            let e = parse_uri(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{bad:?}")),
                "error {e:?} should quote {bad:?}"
            );
        }
    }

    #[test]
    fn bad_lists() {
        for (list, quoted) in [
            ("", "empty address list"),
            ("tcp://1.2.3.4:5;", "item 2 is empty"),
            (";tcp://1.2.3.4:5", "item 1 is empty"),
            ("tcp://1.2.3.4:5;;tcp://1.2.3.4:6", "item 2 is empty"),
            ("tcp://1.2.3.4:5; tcp://1.2.3.4:6", "\" tcp://1.2.3.4:6\""),
            ("tcp://1.2.3.4:5;tcp://1.2.3.4:0", "\"tcp://1.2.3.4:0\""),
            (
                "tcp://1.2.3.4:5,tcp://1.2.3.4:6",
                "\"tcp://1.2.3.4:5,tcp://1.2.3.4:6\"",
            ),
        ] {
            let e = parse_uri_list(list).unwrap_err().to_string();
            assert!(e.contains(quoted), "error {e:?} should contain {quoted:?}");
        }
        let long = vec!["tcp://1.2.3.4:5"; MAX_URIS + 1].join(";");
        assert!(parse_uri_list(&long)
            .unwrap_err()
            .to_string()
            .contains("longer than"));
        let max = vec!["tcp://1.2.3.4:5"; MAX_URIS].join(";");
        assert_eq!(parse_uri_list(&max).unwrap().len(), MAX_URIS);
    }
}
