//! Choosing which of a peer's published addresses to connect to, and from where.
//!
//! Given this rank's selected interfaces and a peer's address list, [`order_peer_addrs`]
//! returns the addresses in the order to try them, each with the local address to bind
//! the connecting socket to. As in the Open MPI TCP BTL, a peer address on the same subnet
//! as one of our selected interfaces comes first and the socket is bound to our address on
//! that subnet, so the peer sees the source it expects and traffic stays on the chosen
//! network. Pure code: no I/O.

use std::net::{IpAddr, SocketAddr};

use super::ifaces::Interface;

/// One candidate connection to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The peer address to connect to.
    pub remote: SocketAddr,
    /// Local address to `bind(2)` the connecting socket to (port 0) before connecting;
    /// `None` lets the kernel choose the source from its routing table.
    pub bind: Option<IpAddr>,
    /// True when `remote` is on the same subnet as the bound local interface.
    pub same_subnet: bool,
}

/// Orders `peer`'s addresses for connecting from a rank whose selected interfaces are
/// `local`.
///
/// 1. Addresses on the subnet of a selected local interface, in the peer's order, bound to
///    our address on that subnet (the longest matching prefix when several match).
/// 2. Other addresses of a family we have a selected, non-loopback address of, in the
///    peer's order, unbound: they are reached through a router, and the routing table
///    knows the right source better than we do.
///
/// Left out: duplicates; loopback addresses unless one of our selected interfaces is a
/// loopback on the same subnet (a peer's `127.0.0.1` seen from another host is this host);
/// addresses of a family for which we selected no address (the connect could only leave
/// through an interface the selection excluded).
pub fn order_peer_addrs(local: &[Interface], peer: &[SocketAddr]) -> Vec<Route> {
    let mut near = Vec::new();
    let mut far = Vec::new();
    for (i, &remote) in peer.iter().enumerate() {
        if peer[..i].contains(&remote) {
            continue;
        }
        let ip = remote.ip();
        let best = local
            .iter()
            .filter(|l| l.subnet().contains(ip))
            .max_by_key(|l| l.prefix_len);
        if let Some(l) = best {
            near.push(Route {
                remote,
                bind: Some(l.addr),
                same_subnet: true,
            });
            continue;
        }
        if ip.is_loopback() {
            continue;
        }
        let routable = local
            .iter()
            .any(|l| !l.flags.loopback && l.addr.is_ipv4() == ip.is_ipv4());
        if routable {
            far.push(Route {
                remote,
                bind: None,
                same_subnet: false,
            });
        }
    }
    near.extend(far);
    near
}

/// The connections an endpoint opens to a peer, from its [`order_peer_addrs`] routes:
/// `per_pair` connections for each pair of a local and a peer interface on one subnet
/// (the routes bound to a local address), of the family of the first route; when no
/// route is on a local subnet, `per_pair` over the first (routed) route. At most
/// [`MAX_LINKS`](crate::wire::MAX_LINKS) in all. The first is the endpoint's first
/// connection, the rest its links (see [`Core::set_link_routes`](crate::proto::core::Core::set_link_routes)).
pub fn link_plan(routes: &[Route], per_pair: usize) -> Vec<Route> {
    let Some(first) = routes.first() else {
        return Vec::new();
    };
    let v4 = first.remote.is_ipv4();
    let near: Vec<&Route> = routes
        .iter()
        .filter(|r| r.same_subnet && r.remote.is_ipv4() == v4)
        .collect();
    let pairs = if near.is_empty() { vec![first] } else { near };
    pairs
        .into_iter()
        .flat_map(|r| std::iter::repeat_n(*r, per_pair.max(1)))
        .take(crate::wire::MAX_LINKS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wireup::ifaces::tests::iface;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn same_subnet_first_and_bound() {
        let local = [iface("eth0", "10.1.0.5", 16), iface("eth1", "10.2.0.5", 16)];
        let peer = [sa("192.168.1.9:7"), sa("10.2.0.9:7"), sa("10.1.0.9:7")];
        let r = order_peer_addrs(&local, &peer);
        assert_eq!(
            r,
            [
                Route {
                    remote: sa("10.2.0.9:7"),
                    bind: ip("10.2.0.5"),
                    same_subnet: true
                },
                Route {
                    remote: sa("10.1.0.9:7"),
                    bind: ip("10.1.0.5"),
                    same_subnet: true
                },
                Route {
                    remote: sa("192.168.1.9:7"),
                    bind: None,
                    same_subnet: false
                },
            ]
        );
    }

    #[test]
    fn longest_prefix_wins() {
        let local = [iface("eth0", "10.0.0.5", 8), iface("eth1", "10.1.0.5", 16)];
        let r = order_peer_addrs(&local, &[sa("10.1.3.3:7"), sa("10.9.0.1:7")]);
        assert_eq!(r[0].bind, ip("10.1.0.5"));
        assert_eq!(r[1].bind, ip("10.0.0.5"));
        assert!(r.iter().all(|r| r.same_subnet));
    }

    #[test]
    fn ipv6_and_mixed_families() {
        let local = [iface("eth0", "10.1.0.5", 16), iface("eth0", "fd00::5", 64)];
        let peer = [sa("[fd01::9]:7"), sa("[fd00::9]:7"), sa("10.3.0.9:7")];
        let r = order_peer_addrs(&local, &peer);
        assert_eq!(r[0].remote, sa("[fd00::9]:7"));
        assert_eq!(r[0].bind, ip("fd00::5"));
        assert_eq!(r[1].remote, sa("[fd01::9]:7"));
        assert_eq!(r[2].remote, sa("10.3.0.9:7"));
        // Without a selected IPv6 address, IPv6 peer addresses are not tried.
        let r = order_peer_addrs(&local[..1], &peer);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].remote, sa("10.3.0.9:7"));
    }

    #[test]
    fn loopback_only_between_loopbacks() {
        let lo = [iface("lo", "127.0.0.1", 8)];
        let r = order_peer_addrs(&lo, &[sa("127.0.0.1:9"), sa("10.1.0.9:9")]);
        assert_eq!(
            r,
            [Route {
                remote: sa("127.0.0.1:9"),
                bind: ip("127.0.0.1"),
                same_subnet: true
            }]
        );
        let eth = [iface("eth0", "10.1.0.5", 16)];
        let r = order_peer_addrs(&eth, &[sa("127.0.0.1:9"), sa("[::1]:9")]);
        assert!(r.is_empty(), "{r:?}");
    }

    #[test]
    fn duplicates_and_empty_inputs() {
        let local = [iface("eth0", "10.1.0.5", 16)];
        let r = order_peer_addrs(&local, &[sa("10.1.0.9:7"), sa("10.1.0.9:7")]);
        assert_eq!(r.len(), 1);
        assert!(order_peer_addrs(&local, &[]).is_empty());
        assert!(order_peer_addrs(&[], &[sa("10.1.0.9:7")]).is_empty());
    }

    #[test]
    fn the_link_plan_pairs_interfaces_on_one_subnet() {
        let local = [
            iface("ra", "10.231.1.10", 24),
            iface("rb", "10.231.2.10", 24),
        ];
        let peer = [
            sa("10.231.1.11:5000"),
            sa("10.231.2.11:5000"),
            sa("192.168.9.1:5000"),
            sa("[fd00::11]:5000"),
        ];
        let routes = order_peer_addrs(&local, &peer);
        let plan = link_plan(&routes, 1);
        let got: Vec<_> = plan.iter().map(|r| (r.remote, r.bind)).collect();
        assert_eq!(
            got,
            [
                (sa("10.231.1.11:5000"), ip("10.231.1.10")),
                (sa("10.231.2.11:5000"), ip("10.231.2.10")),
            ],
            "one link per interface pair on a shared subnet; routed and other-family \
             addresses are no pairs"
        );
        // `per_pair` connections each, the first pair first.
        let plan = link_plan(&routes, 3);
        assert_eq!(plan.len(), 6);
        assert!(plan[..3].iter().all(|r| r.remote == sa("10.231.1.11:5000")));
        assert!(plan[3..].iter().all(|r| r.remote == sa("10.231.2.11:5000")));
        // Never more than an endpoint holds.
        assert_eq!(link_plan(&routes, 8).len(), crate::wire::MAX_LINKS);
    }

    #[test]
    fn a_routed_peer_gets_its_links_over_the_first_route() {
        let local = [iface("eth0", "10.1.0.5", 16)];
        let routes = order_peer_addrs(&local, &[sa("10.9.0.7:4000"), sa("10.8.0.7:4000")]);
        let plan = link_plan(&routes, 2);
        let got: Vec<_> = plan.iter().map(|r| (r.remote, r.bind)).collect();
        assert_eq!(
            got,
            [(sa("10.9.0.7:4000"), None), (sa("10.9.0.7:4000"), None)]
        );
        assert!(link_plan(&[], 2).is_empty());
    }
}
