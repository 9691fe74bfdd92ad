//! Local interface discovery and selection.
//!
//! [`discover`] lists every IPv4 and IPv6 address of the host with `getifaddrs(3)`;
//! [`IfSelection`] then picks the addresses a rank listens on and publishes, by interface
//! name or by CIDR subnet, the way the Open MPI TCP components' `if_include` /
//! `if_exclude` parameters do. [`Cidr`] is the pure subnet type both sides share.
//!
//! This file holds the only `unsafe` code of the wire-up layer: the `getifaddrs` walk.

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::error::Error;

/// Name prefixes of virtual bridges and container links left out by default: their
/// addresses are host-local (every Docker host has `172.17.0.1` on `docker0`), so a
/// peer on another host that connects to them reaches the wrong machine or nothing.
pub const VIRTUAL_PREFIXES: &[&str] = &["docker", "virbr", "veth", "br-"];

/// One address of one local interface (an interface with two addresses appears twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Kernel interface name (`eth0`, `ib0`, `lo`).
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// Length of the network prefix (from the netmask).
    pub prefix_len: u8,
    /// Interface flags.
    pub flags: IfFlags,
    /// IPv6 scope id (the interface index for link-local addresses), 0 otherwise.
    pub scope_id: u32,
}

/// The interface flags wire-up cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IfFlags {
    /// `IFF_UP`: administratively up.
    pub up: bool,
    /// `IFF_RUNNING`: the link has carrier.
    pub running: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

impl Interface {
    /// The subnet this address belongs to.
    pub fn subnet(&self) -> Cidr {
        Cidr::new(self.addr, self.prefix_len)
    }

    /// True for interfaces named like a virtual bridge or container link
    /// ([`VIRTUAL_PREFIXES`]).
    pub fn is_virtual(&self) -> bool {
        VIRTUAL_PREFIXES.iter().any(|p| self.name.starts_with(p))
    }

    /// True for IPv6 link-local addresses (`fe80::/10`), which are unusable without a
    /// scope and therefore never published.
    pub fn is_link_local_v6(&self) -> bool {
        matches!(self.addr, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80)
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.name, self.addr, self.prefix_len)
    }
}

/// An IP subnet such as `10.1.0.0/16` or `fd00::/8`.
///
/// The stored address is the network address: host bits are cleared on construction, so
/// `10.1.2.3/16` and `10.1.0.0/16` are the same subnet (as `if_include=10.1.2.3/16` means
/// in Open MPI).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix_len: u8,
}

impl Cidr {
    /// The subnet of `addr` with a `prefix_len`-bit prefix (clamped to 32 or 128).
    pub fn new(addr: IpAddr, prefix_len: u8) -> Self {
        let (network, prefix_len) = match addr {
            IpAddr::V4(a) => {
                let p = prefix_len.min(32);
                let bits = u32::from(a) & mask_u32(p);
                (IpAddr::V4(Ipv4Addr::from(bits)), p)
            }
            IpAddr::V6(a) => {
                let p = prefix_len.min(128);
                let bits = u128::from(a) & mask_u128(p);
                (IpAddr::V6(Ipv6Addr::from(bits)), p)
            }
        };
        Self {
            network,
            prefix_len,
        }
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// True when `addr` lies inside this subnet. Addresses of the other family never do.
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.network, addr) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                u32::from(a) & mask_u32(self.prefix_len) == u32::from(n)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                u128::from(a) & mask_u128(self.prefix_len) == u128::from(n)
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = Error;

    /// Parses `addr/len`; the length must be present and fit the family.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::Config(format!("bad subnet {s:?}: {why}"));
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| bad("expected address/prefix-length, e.g. 10.1.0.0/16"))?;
        let addr = IpAddr::from_str(addr).map_err(|_| bad("not an IPv4 or IPv6 address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("prefix length is not a number"));
        }
        let len: u8 = len
            .parse()
            .map_err(|_| bad("prefix length is not a number"))?;
        if len > max {
            return Err(bad(&format!("prefix length above {max}")));
        }
        Ok(Self::new(addr, len))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

/// One item of an include or exclude list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// An interface name; a trailing `*` matches every name with that prefix (`eth*`).
    Name(String),
    /// Every address inside a subnet.
    Subnet(Cidr),
}

impl IfMatch {
    /// True when `iface` is matched.
    pub fn matches(&self, iface: &Interface) -> bool {
        match self {
            Self::Name(n) => match n.strip_suffix('*') {
                Some(prefix) => iface.name.starts_with(prefix),
                None => iface.name == *n,
            },
            Self::Subnet(c) => c.contains(iface.addr),
        }
    }
}

impl FromStr for IfMatch {
    type Err = Error;

    /// An item containing `/` is a subnet, anything else an interface name.
    fn from_str(s: &str) -> Result<Self, Error> {
        let s = s.trim();
        if s.is_empty() {
            return Err(Error::Config("empty interface or subnet in list".into()));
        }
        if s.contains('/') {
            return Cidr::from_str(s).map(Self::Subnet);
        }
        let body = s.strip_suffix('*').unwrap_or(s);
        if body.is_empty()
            || !body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        {
            return Err(Error::Config(format!("bad interface name {s:?}")));
        }
        Ok(Self::Name(s.to_owned()))
    }
}

impl fmt::Display for IfMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(n) => f.write_str(n),
            Self::Subnet(c) => c.fmt(f),
        }
    }
}

/// Which local addresses a rank uses (`RINGBTL_IF_INCLUDE` / `RINGBTL_IF_EXCLUDE`).
///
/// Rules, applied by [`IfSelection::select`]:
/// - interfaces that are down, and IPv6 link-local addresses, are never used;
/// - [`Include`](Self::Include): exactly the addresses matched by the list; a list that
///   matches no usable address is an error naming the interfaces that exist;
/// - [`Exclude`](Self::Exclude): the matched addresses are removed, then the default rule
///   applies to the rest;
/// - default rule: physical interfaces if there is any; otherwise loopback (a single-host
///   job); otherwise virtual bridges. Loopback is never mixed with other addresses, since
///   `127.0.0.1` published by two hosts names two different machines.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum IfSelection {
    /// The default rule only.
    #[default]
    Default,
    /// Only these interfaces or subnets.
    Include(Vec<IfMatch>),
    /// Everything but these, then the default rule.
    Exclude(Vec<IfMatch>),
}

impl IfSelection {
    /// Builds a selection from optional include and exclude lists (for example from
    /// configuration fields); giving both is an error.
    pub fn from_lists(include: &[IfMatch], exclude: &[IfMatch]) -> Result<Self, Error> {
        match (include.is_empty(), exclude.is_empty()) {
            (false, false) => Err(Error::Config(
                "interface include and exclude lists are both set; give only one".into(),
            )),
            (false, true) => Ok(Self::Include(include.to_vec())),
            (true, false) => Ok(Self::Exclude(exclude.to_vec())),
            (true, true) => Ok(Self::Default),
        }
    }

    /// Applies the selection to the host's addresses (see the type docs for the rules).
    /// The result keeps the order of `all`.
    pub fn select(&self, all: &[Interface]) -> Result<Vec<Interface>, Error> {
        let usable = |i: &&Interface| i.flags.up && !i.is_link_local_v6();
        let picked: Vec<Interface> = match self {
            Self::Include(list) => {
                let v: Vec<Interface> = all
                    .iter()
                    .filter(usable)
                    .filter(|i| list.iter().any(|m| m.matches(i)))
                    .cloned()
                    .collect();
                if v.is_empty() {
                    return Err(Error::Wireup(format!(
                        "RINGBTL_IF_INCLUDE={} matches no usable interface; this host has: {}",
                        join(list),
                        describe(all)
                    )));
                }
                return Ok(v);
            }
            Self::Exclude(list) => all
                .iter()
                .filter(usable)
                .filter(|i| !list.iter().any(|m| m.matches(i)))
                .cloned()
                .collect(),
            Self::Default => all.iter().filter(usable).cloned().collect(),
        };
        let physical: Vec<Interface> = picked
            .iter()
            .filter(|i| !i.flags.loopback && !i.is_virtual())
            .cloned()
            .collect();
        if !physical.is_empty() {
            return Ok(physical);
        }
        let loopback: Vec<Interface> = picked
            .iter()
            .filter(|i| i.flags.loopback)
            .cloned()
            .collect();
        if !loopback.is_empty() {
            return Ok(loopback);
        }
        if !picked.is_empty() {
            return Ok(picked);
        }
        Err(Error::Wireup(format!(
            "no usable interface left after {}; this host has: {}",
            match self {
                Self::Exclude(list) => format!("RINGBTL_IF_EXCLUDE={}", join(list)),
                _ => "the default selection".to_owned(),
            },
            describe(all)
        )))
    }
}

/// Lists every address of every local interface (IPv4 and IPv6) with `getifaddrs(3)`.
pub fn discover() -> Result<Vec<Interface>, Error> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the kernel-built list is ours
    // until the matching `freeifaddrs` below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::io("getifaddrs", io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list returned by getifaddrs, which stays
        // allocated until `freeifaddrs(head)`; we only read it.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_name` is a non-null, NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `ifa_addr` is non-null and points to at least a `sockaddr` header.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let (addr, scope_id) = match family {
            libc::AF_INET => {
                // SAFETY: the family says this is a `sockaddr_in`; read_unaligned copies it
                // without assuming alignment.
                let sin = unsafe { ifa.ifa_addr.cast::<libc::sockaddr_in>().read_unaligned() };
                (
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))),
                    0,
                )
            }
            libc::AF_INET6 => {
                // SAFETY: the family says this is a `sockaddr_in6`.
                let sin6 = unsafe { ifa.ifa_addr.cast::<libc::sockaddr_in6>().read_unaligned() };
                (
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)),
                    sin6.sin6_scope_id,
                )
            }
            _ => continue,
        };
        let prefix_len = if ifa.ifa_netmask.is_null() {
            if addr.is_ipv4() {
                32
            } else {
                128
            }
        } else if family == libc::AF_INET {
            // SAFETY: the netmask of an AF_INET entry is a `sockaddr_in`.
            let m = unsafe { ifa.ifa_netmask.cast::<libc::sockaddr_in>().read_unaligned() };
            u32::from_be(m.sin_addr.s_addr).count_ones() as u8
        } else {
            // SAFETY: the netmask of an AF_INET6 entry is a `sockaddr_in6`.
            let m = unsafe {
                ifa.ifa_netmask
                    .cast::<libc::sockaddr_in6>()
                    .read_unaligned()
            };
            u128::from_be_bytes(m.sin6_addr.s6_addr).count_ones() as u8
        };
        let fl = ifa.ifa_flags;
        out.push(Interface {
            name,
            addr,
            prefix_len,
            flags: IfFlags {
                up: fl & libc::IFF_UP as u32 != 0,
                running: fl & libc::IFF_RUNNING as u32 != 0,
                loopback: fl & libc::IFF_LOOPBACK as u32 != 0,
            },
            scope_id,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed exactly once; no
    // reference into the list outlives this point (names were copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Discovers the local interfaces and applies `selection`.
pub fn select_local(selection: &IfSelection) -> Result<Vec<Interface>, Error> {
    selection.select(&discover()?)
}

fn join(list: &[IfMatch]) -> String {
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn describe(all: &[Interface]) -> String {
    if all.is_empty() {
        return "no interfaces".to_owned();
    }
    all.iter()
        .map(|i| {
            let state = if i.flags.up { "" } else { " (down)" };
            format!("{i}{state}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn mask_u32(prefix_len: u8) -> u32 {
    match prefix_len {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

fn mask_u128(prefix_len: u8) -> u128 {
    match prefix_len {
        0 => 0,
        p => u128::MAX << (128 - u32::from(p.min(128))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn iface(name: &str, addr: &str, prefix_len: u8) -> Interface {
        Interface {
            name: name.to_owned(),
            addr: addr.parse().unwrap(),
            prefix_len,
            flags: IfFlags {
                up: true,
                running: true,
                loopback: name == "lo",
            },
            scope_id: 0,
        }
    }

    fn host() -> Vec<Interface> {
        vec![
            iface("lo", "127.0.0.1", 8),
            iface("lo", "::1", 128),
            iface("eth0", "10.1.0.5", 16),
            iface("eth0", "fe80::1", 64),
            iface("eth1", "10.2.0.5", 16),
            iface("eth1", "fd00::5", 64),
            iface("docker0", "172.17.0.1", 16),
            iface("virbr0", "192.168.122.1", 24),
        ]
    }

    fn names(v: &[Interface]) -> Vec<String> {
        v.iter().map(|i| format!("{}={}", i.name, i.addr)).collect()
    }

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_contains() {
        let c = cidr("10.1.0.0/16");
        assert!(c.contains("10.1.255.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let v6 = cidr("fd00::/8");
        assert!(v6.contains("fd12:3456::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        assert!(!v6.contains("10.1.0.1".parse().unwrap()));
        assert!(cidr("0.0.0.0/0").contains("8.8.8.8".parse().unwrap()));
        assert!(cidr("::/0").contains("2001:db8::1".parse().unwrap()));
        let host = cidr("10.1.0.5/32");
        assert!(host.contains("10.1.0.5".parse().unwrap()));
        assert!(!host.contains("10.1.0.6".parse().unwrap()));
    }

    #[test]
    fn cidr_masks_host_bits_and_prints() {
        assert_eq!(cidr("10.1.2.3/16"), cidr("10.1.0.0/16"));
        assert_eq!(cidr("10.1.2.3/16").to_string(), "10.1.0.0/16");
        assert_eq!(cidr("fd00::5/8").to_string(), "fd00::/8");
        assert_eq!(
            cidr("10.1.2.3/0").network(),
            "0.0.0.0".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn cidr_rejects_garbage() {
        for s in [
            "10.1.0.0",
            "10.1.0.0/",
            "10.1.0.0/33",
            "fd00::/129",
            "10.1.0/16",
            "eth0/16",
            "10.1.0.0/+8",
            "10.1.0.0/1234",
            "/8",
        ] {
            let e = Cidr::from_str(s).unwrap_err().to_string();
            assert!(e.contains(s), "{e} should quote {s}");
        }
    }

    #[test]
    fn default_drops_loopback_bridges_and_link_local() {
        let sel = IfSelection::Default.select(&host()).unwrap();
        assert_eq!(
            names(&sel),
            ["eth0=10.1.0.5", "eth1=10.2.0.5", "eth1=fd00::5"]
        );
    }

    #[test]
    fn default_falls_back_to_loopback_then_bridges() {
        let only_lo = vec![
            iface("lo", "127.0.0.1", 8),
            iface("docker0", "172.17.0.1", 16),
        ];
        let sel = IfSelection::Default.select(&only_lo).unwrap();
        assert_eq!(names(&sel), ["lo=127.0.0.1"]);
        let only_bridge = vec![iface("virbr0", "192.168.122.1", 24)];
        let sel = IfSelection::Default.select(&only_bridge).unwrap();
        assert_eq!(names(&sel), ["virbr0=192.168.122.1"]);
    }

    #[test]
    fn down_interfaces_are_skipped() {
        let mut all = host();
        all[2].flags.up = false; // eth0 10.1.0.5
        let sel = IfSelection::Default.select(&all).unwrap();
        assert_eq!(names(&sel), ["eth1=10.2.0.5", "eth1=fd00::5"]);
    }

    /// The selection the settings table makes of `get`'s variables (the one parser of
    /// `RINGBTL_IF_INCLUDE` / `RINGBTL_IF_EXCLUDE`).
    fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<IfSelection, Error> {
        use crate::param::Params;
        let mut c = crate::wireup::config::WireupConfig::default();
        c.apply_vars(&get, &mut |_| {}).map_err(Error::Config)?;
        c.validate().map_err(Error::Config)?;
        c.if_selection()
    }

    #[test]
    fn include_by_name_glob_and_subnet() {
        let inc =
            |s: &str| from_vars(|k| (k == "RINGBTL_IF_INCLUDE").then(|| s.to_owned())).unwrap();
        assert_eq!(
            names(&inc("eth0").select(&host()).unwrap()),
            ["eth0=10.1.0.5"]
        );
        assert_eq!(
            names(&inc("eth*").select(&host()).unwrap()),
            ["eth0=10.1.0.5", "eth1=10.2.0.5", "eth1=fd00::5"]
        );
        assert_eq!(
            names(&inc("10.2.0.0/16, fd00::/8").select(&host()).unwrap()),
            ["eth1=10.2.0.5", "eth1=fd00::5"]
        );
        // An explicit include may name loopback or a bridge.
        assert_eq!(
            names(&inc("lo").select(&host()).unwrap()),
            ["lo=127.0.0.1", "lo=::1"]
        );
    }

    #[test]
    fn include_matching_nothing_names_what_exists() {
        let sel = IfSelection::Include(vec![IfMatch::Name("ib0".into())]);
        let e = sel.select(&host()).unwrap_err().to_string();
        assert!(e.contains("ib0"), "{e}");
        assert!(
            e.contains("eth0 10.1.0.5/16") && e.contains("docker0"),
            "{e}"
        );
        let sel = IfSelection::Include(vec![IfMatch::Subnet(cidr("10.9.0.0/16"))]);
        let e = sel.select(&host()).unwrap_err().to_string();
        assert!(e.contains("10.9.0.0/16") && e.contains("eth1"), "{e}");
    }

    #[test]
    fn exclude_then_default_rule() {
        let sel = IfSelection::Exclude(vec![IfMatch::Subnet(cidr("10.1.0.0/16"))]);
        assert_eq!(
            names(&sel.select(&host()).unwrap()),
            ["eth1=10.2.0.5", "eth1=fd00::5"]
        );
        // Excluding every physical interface falls back to loopback, never mixes it in.
        let sel = IfSelection::Exclude(vec![IfMatch::Name("eth*".into())]);
        assert_eq!(
            names(&sel.select(&host()).unwrap()),
            ["lo=127.0.0.1", "lo=::1"]
        );
        let sel = IfSelection::Exclude(vec![
            IfMatch::Subnet(cidr("0.0.0.0/0")),
            IfMatch::Subnet(cidr("::/0")),
        ]);
        let e = sel.select(&host()).unwrap_err().to_string();
        assert!(e.contains("RINGBTL_IF_EXCLUDE=0.0.0.0/0,::/0"), "{e}");
    }

    #[test]
    fn both_lists_is_an_error() {
        let e = from_vars(|k| match k {
            "RINGBTL_IF_INCLUDE" => Some("eth0".into()),
            "RINGBTL_IF_EXCLUDE" => Some("eth1".into()),
            _ => None,
        })
        .unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let m = IfMatch::Name("eth0".into());
        assert!(
            IfSelection::from_lists(std::slice::from_ref(&m), std::slice::from_ref(&m)).is_err()
        );
        assert_eq!(
            IfSelection::from_lists(&[], &[]).unwrap(),
            IfSelection::Default
        );
    }

    #[test]
    fn bad_list_items_name_the_variable() {
        for v in ["eth0,,eth1", "10.0.0.0/40", "eth 0", "*"] {
            let e = from_vars(|k| (k == "RINGBTL_IF_EXCLUDE").then(|| v.to_owned()))
                .unwrap_err()
                .to_string();
            assert!(e.contains("RINGBTL_IF_EXCLUDE"), "{e}");
        }
    }

    #[test]
    fn discover_finds_loopback() {
        let all = discover().unwrap();
        let lo = all
            .iter()
            .find(|i| i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("127.0.0.1 on this host");
        assert!(lo.flags.loopback && lo.flags.up);
        assert_eq!(lo.prefix_len, 8);
        assert!(!IfSelection::Default.select(&all).unwrap().is_empty());
    }
}
