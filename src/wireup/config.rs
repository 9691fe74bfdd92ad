//! Wire-up settings: where to listen, which interfaces to publish, and how to exchange
//! addresses, with their table (see [`param`](crate::param)). Validated here, by the
//! layer that uses them.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use super::ifaces::{IfMatch, IfSelection};
use super::{WireupKind, DEFAULT_TIMEOUT};
use crate::error::Error;
use crate::param::{Access, Kind, Param, Params, Unit};

/// Wire-up settings of a transport (the `wireup` part of [`Config`](crate::Config)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireupConfig {
    /// Address to listen on (`127.0.0.1:0` by default: loopback, ephemeral port;
    /// `RINGBTL_LISTEN=ip:port`). `None` (`RINGBTL_LISTEN=auto`): select the local
    /// interfaces ([`if_include`](Self::if_include) / [`if_exclude`](Self::if_exclude)),
    /// listen on the wildcard address of each family they need, on [`ports`](Self::ports)
    /// or an ephemeral port, and publish the selected addresses with that port
    /// ([`Transport::uris`](crate::Transport::uris)).
    pub listen: Option<SocketAddr>,
    /// Interfaces to use, by name or subnet (`RINGBTL_IF_INCLUDE=eth1,10.1.0.0/16`);
    /// only with `listen: None`. Exclusive with `if_exclude`.
    pub if_include: Vec<IfMatch>,
    /// Interfaces not to use (`RINGBTL_IF_EXCLUDE`); the default rule then applies to the
    /// rest (see [`IfSelection`]). Exclusive with `if_include`.
    pub if_exclude: Vec<IfMatch>,
    /// Listen port range `(lo, hi)`, inclusive, with `listen: None` (`RINGBTL_PORT=40000`
    /// or `40000-40099`); `None`: an ephemeral port.
    pub ports: Option<(u16, u16)>,
    /// The address exchange (`RINGBTL_WIREUP=pmix|pmi|env|local`); `None`: chosen from
    /// the launcher's environment (see [`Wireup`](super::Wireup)).
    pub exchange: Option<WireupKind>,
    /// `host:port` of the env + root rendezvous, where rank 0 listens (`RINGBTL_ROOT`).
    pub root: Option<String>,
    /// The PMIx client library to open, a file name or a path (`RINGBTL_PMIX_LIB`);
    /// `None`: `libpmix.so.2`, else `libpmix.so` (see [`pmix`](super::pmix)).
    pub pmix_lib: Option<String>,
    /// Time limit of the address exchange (`RINGBTL_WIREUP_TIMEOUT_MS`, ms, 10..=3600000).
    pub timeout: Duration,
    /// Connections to a peer per pair of a local and a peer interface that share a subnet
    /// (`RINGBTL_LINKS`, 1..=8, as Open MPI's `btl_tcp_links`); an endpoint has at most
    /// [`MAX_LINKS`](crate::wire::MAX_LINKS) in all (see
    /// [`link_plan`](crate::wireup::link_plan)).
    pub links: u32,
}

impl Default for WireupConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            if_include: Vec::new(),
            if_exclude: Vec::new(),
            ports: None,
            exchange: None,
            root: None,
            pmix_lib: None,
            timeout: DEFAULT_TIMEOUT,
            links: 1,
        }
    }
}

/// The variables of the address exchange, read by [`Wireup::from_vars`](super::Wireup)
/// on its own.
pub(crate) const EXCHANGE_VARS: [&str; 4] = [
    "RINGBTL_WIREUP",
    "RINGBTL_ROOT",
    "RINGBTL_PMIX_LIB",
    "RINGBTL_WIREUP_TIMEOUT_MS",
];

impl WireupConfig {
    /// Checks every setting against its row of the table, then the relations between
    /// them.
    pub fn validate(&self) -> Result<(), String> {
        self.check_params()?;
        if !self.if_include.is_empty() && !self.if_exclude.is_empty() {
            return Err(
                "if_include and if_exclude are both set (RINGBTL_IF_INCLUDE / \
                 RINGBTL_IF_EXCLUDE); give only one"
                    .into(),
            );
        }
        Ok(())
    }

    /// The interface selection of [`if_include`](Self::if_include) /
    /// [`if_exclude`](Self::if_exclude).
    pub fn if_selection(&self) -> Result<IfSelection, Error> {
        IfSelection::from_lists(&self.if_include, &self.if_exclude)
    }

    /// Applies the exchange's variables ([`EXCHANGE_VARS`]) read through `get`.
    pub(crate) fn exchange_from_vars(
        mut self,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, Error> {
        let only = |k: &str| {
            EXCHANGE_VARS
                .contains(&crate::param::current_name(k))
                .then(|| get(k))
                .flatten()
        };
        self.apply_vars(&only, &mut |_| {}).map_err(Error::Config)?;
        Ok(self)
    }
}

impl Params for WireupConfig {
    const LAYER: &'static str = "wireup";

    fn params() -> &'static [Param<Self>] {
        &WIREUP_PARAMS
    }
}

fn list(l: &[IfMatch]) -> String {
    l.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_list(v: &str) -> Result<Vec<IfMatch>, String> {
    if v.trim().is_empty() {
        return Ok(Vec::new());
    }
    v.split(',')
        .map(|item| {
            IfMatch::from_str(item).map_err(|e| match e {
                Error::Config(m) => m,
                other => other.to_string(),
            })
        })
        .collect()
}

/// Parses `RINGBTL_PORT`: a port (`40000`) or an inclusive range (`40000-40099`); blank
/// for none (an ephemeral port).
fn parse_ports(v: &str) -> Result<Option<(u16, u16)>, String> {
    let t = v.trim();
    if t.is_empty() {
        return Ok(None);
    }
    let bad = || "expected a port or a range lo-hi, within 1..=65535".to_string();
    let port = |t: &str| t.trim().parse::<u16>().map_err(|_| bad());
    Ok(Some(match t.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => (port(t)?, port(t)?),
    }))
}

static WIREUP_PARAMS: [Param<WireupConfig>; 9] = [
    Param {
        name: "listen",
        var: "RINGBTL_LISTEN",
        kind: Kind::Text("ip:port, or auto"),
        meaning: "listen address; `auto`: the selected interfaces, wildcard listen, \
                  addresses published by `Transport::uris`",
        site: "nodes that must listen on one given address",
        access: Access::Text {
            get: |c| match c.listen {
                Some(a) => a.to_string(),
                None => "auto".into(),
            },
            parse: |c, v| {
                c.listen = match v.trim() {
                    "auto" => None,
                    t => Some(SocketAddr::from_str(t).map_err(|e| {
                        format!("expected ip:port (e.g. 127.0.0.1:0) or auto: {e}")
                    })?),
                };
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "if_include",
        var: "RINGBTL_IF_INCLUDE",
        kind: Kind::Text("interface names or subnets, comma-separated"),
        meaning: "interfaces to use with `RINGBTL_LISTEN=auto` (`eth1,10.1.0.0/16`; \
                  `fd00::/64` for IPv6 only); unset: physical interfaces, else loopback; \
                  not with `RINGBTL_IF_EXCLUDE`",
        site: "nodes with several networks: which ones carry the job",
        access: Access::Text {
            get: |c| list(&c.if_include),
            parse: |c, v| {
                c.if_include = parse_list(v)?;
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "if_exclude",
        var: "RINGBTL_IF_EXCLUDE",
        kind: Kind::Text("interface names or subnets, comma-separated"),
        meaning: "interfaces not to use; the default rule applies to the rest",
        site: "nodes with several networks: which ones must not carry the job",
        access: Access::Text {
            get: |c| list(&c.if_exclude),
            parse: |c, v| {
                c.if_exclude = parse_list(v)?;
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "links",
        var: "RINGBTL_LINKS",
        kind: Kind::Int {
            lo: 1,
            hi: 8,
            unit: Unit::Count,
        },
        meaning: "connections to a peer per pair of interfaces on one subnet (8 in all at most)",
        site: "nodes with several NICs on the job's networks, or NICs one TCP flow cannot fill",
        access: Access::Num {
            get: |c| Some(c.links.into()),
            put: |c, v| c.links = v.unwrap_or(1) as u32,
        },
    },
    Param {
        name: "ports",
        var: "RINGBTL_PORT",
        kind: Kind::Text("port or range lo-hi, in 1..=65535"),
        meaning: "listen port or range with `RINGBTL_LISTEN=auto`; unset: ephemeral",
        site: "firewalled clusters with an open port range",
        access: Access::Text {
            get: |c| match c.ports {
                None => String::new(),
                Some((lo, hi)) if lo == hi => lo.to_string(),
                Some((lo, hi)) => format!("{lo}-{hi}"),
            },
            parse: |c, v| {
                c.ports = parse_ports(v)?;
                Ok(())
            },
            check: |c| match c.ports {
                Some((lo, hi)) if lo == 0 || lo > hi => {
                    Err("expected a port or a range lo-hi, with 1 <= lo <= hi <= 65535".into())
                }
                _ => Ok(()),
            },
        },
    },
    Param {
        name: "exchange",
        var: "RINGBTL_WIREUP",
        kind: Kind::Text("pmix, pmi, env, local"),
        meaning: "address exchange; unset: from the launcher's environment",
        site: "launches whose environment suggests the wrong exchange",
        access: Access::Text {
            get: |c| c.exchange.map(|k| k.as_str()).unwrap_or("").into(),
            parse: |c, v| {
                c.exchange = match v.trim() {
                    "" => None,
                    t => Some(WireupKind::from_name(t).ok_or(WireupKind::ACCEPTED)?),
                };
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "root",
        var: "RINGBTL_ROOT",
        kind: Kind::Text("host:port"),
        meaning: "address of the env + root rendezvous (rank 0 listens there)",
        site: "env + root launches: where rank 0 listens",
        access: Access::Text {
            get: |c| c.root.clone().unwrap_or_default(),
            parse: |c, v| {
                let t = v.trim();
                c.root = (!t.is_empty()).then(|| t.to_owned());
                Ok(())
            },
            check: |c| match &c.root {
                Some(r)
                    if !r
                        .rsplit_once(':')
                        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
                {
                    Err("expected host:port".into())
                }
                _ => Ok(()),
            },
        },
    },
    Param {
        name: "pmix_lib",
        var: "RINGBTL_PMIX_LIB",
        kind: Kind::Text("file name or path"),
        meaning: "PMIx client library opened when PMIx is the exchange; unset: \
                  `libpmix.so.2`, else `libpmix.so`",
        site: "sites whose PMIx library is not where the loader finds it",
        access: Access::Text {
            get: |c| c.pmix_lib.clone().unwrap_or_default(),
            parse: |c, v| {
                let t = v.trim();
                c.pmix_lib = (!t.is_empty()).then(|| t.to_owned());
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "timeout",
        var: "RINGBTL_WIREUP_TIMEOUT_MS",
        kind: Kind::Int {
            lo: 10,
            hi: 3_600_000,
            unit: Unit::Millis,
        },
        meaning: "address exchange time limit",
        site: "large jobs or slow launchers",
        access: Access::Num {
            get: |c| Some(u64::try_from(c.timeout.as_millis()).unwrap_or(u64::MAX)),
            put: |c, v| c.timeout = Duration::from_millis(v.unwrap_or(0)),
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wireup::{Modex, Wireup};

    #[test]
    fn the_exchange_follows_the_settings_not_the_variables() {
        let env = |k: &str| match k {
            "RINGBTL_WIREUP" => Some("env".to_string()),
            "RINGBTL_ROOT" => Some("nowhere".to_string()),
            _ => None,
        };
        let cfg = WireupConfig {
            exchange: Some(WireupKind::Local),
            timeout: Duration::from_millis(1500),
            ..WireupConfig::default()
        };
        let w = Wireup::from_config(&cfg, env).unwrap();
        assert_eq!(w.kind(), WireupKind::Local);
        assert_eq!((w.rank(), w.size()), (0, 1));
        assert_eq!(w.timeout(), Duration::from_millis(1500));
        // The same variables, read by from_vars, are refused (RINGBTL_ROOT is no
        // host:port).
        let e = Wireup::from_vars(env).unwrap_err().to_string();
        assert!(e.contains("RINGBTL_ROOT=\"nowhere\""), "{e}");
        // A setting out of range in code is refused as from the environment.
        let bad = WireupConfig {
            timeout: Duration::from_millis(5),
            ..cfg
        };
        let e = Wireup::from_config(&bad, |_| None).unwrap_err().to_string();
        assert!(e.contains("timeout = 5 (RINGBTL_WIREUP_TIMEOUT_MS)"), "{e}");
    }

    #[test]
    fn ports_and_lists_read_back() {
        let mut c = WireupConfig::default();
        for (var, text, shown) in [
            ("RINGBTL_PORT", " 7000 ", "7000"),
            ("RINGBTL_PORT", "40000-40099", "40000-40099"),
            (
                "RINGBTL_IF_INCLUDE",
                "eth*, 10.1.0.0/16",
                "eth*,10.1.0.0/16",
            ),
            ("RINGBTL_LISTEN", "[::1]:9", "[::1]:9"),
        ] {
            let p = WireupConfig::param(var).unwrap();
            p.set(&mut c, text).unwrap();
            assert_eq!(p.get(&c), shown, "{var}");
        }
        assert_eq!(c.ports, Some((40000, 40099)));
        let e = WireupConfig::param("RINGBTL_PORT")
            .unwrap()
            .set(&mut c, "9-8")
            .unwrap_err();
        assert!(e.starts_with("RINGBTL_PORT=\"9-8\": expected"), "{e}");
        assert_eq!(c.ports, Some((40000, 40099)), "unchanged");
    }
}
