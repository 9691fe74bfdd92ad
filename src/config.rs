//! Configuration: every parameter is a field settable in code, and every one can be
//! overridden from the environment (`RINGBTL_*`, MCA-style) with [`Config::from_env`],
//! or set by its variable's name with [`Config::set`].
//!
//! [`Config`] composes the settings of each layer, each declared and validated by the
//! layer that owns it, with its table of parameters (see [`param`](crate::param)):
//!
//! | part | struct | owner |
//! |---|---|---|
//! | `core` | [`CoreConfig`]: token, receive cache, frames, batching, connect and handshake limits | the protocol core (`proto/config.rs`) |
//! | `socket` | [`SocketConfig`]: backend, socket options, send pieces, zero-copy, provided-buffer ring | the reactor (`reactor/config.rs`) |
//! | `wireup` | [`WireupConfig`]: listen address, interfaces, ports, address exchange | wire-up (`wireup/config.rs`) |
//! | (own) | [`ProgressMode`] | the transport (here) |
//!
//! Values set in code and values parsed from text meet the same checks: a bad value is
//! rejected with an error that names the setting, its variable and the accepted range.
//! [`Config::settings`] lists every parameter with its value and where the value came
//! from (default, environment or code), as `ompi_info --param` and `ucx_info -c` do;
//! `ringbtl-bench --print-config` prints that list, and the README's configuration
//! table is [`markdown_table`].

use std::str::FromStr;
use std::time::Duration;

use crate::error::Error;
use crate::param::{Access, Kind, Origin, Param, Params};
use crate::wire::PeerId;
use crate::wireup::ifaces::IfSelection;

pub use crate::proto::config::CoreConfig;
pub use crate::reactor::config::{Congestion, Keepalive, SocketConfig};
pub use crate::wireup::config::WireupConfig;

/// How [`Transport::wait_until`](crate::Transport::wait_until) and the benchmark wait
/// for events. Every backend behaves the same: the choice is made above the reactor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Spin on non-blocking progress (lowest latency; burns the core).
    Poll,
    /// Wait in the kernel (for oversubscribed nodes).
    Block,
    /// Spin on non-blocking progress for this long after the last event, then wait in the
    /// kernel: latency close to `Poll` while messages keep coming, the core given back
    /// when they stop (what oversubscribed nodes need).
    SpinThenBlock(Duration),
}

impl ProgressMode {
    /// Spin time of a bare `spin`: 50 us, longer than a blocking wait's cross-core wake-up
    /// costs, so that spinning first keeps the total within twice the best choice made in
    /// hindsight (the rent-or-buy argument) while a small-message round trip in poll mode
    /// fits many times.
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
    /// Longest spin accepted from text (`spin:USECS`): one second.
    pub const MAX_SPIN: Duration = Duration::from_secs(1);
}

impl std::fmt::Display for ProgressMode {
    /// The same text [`FromStr`] accepts: `poll`, `block`, `spin:USECS`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgressMode::Poll => f.write_str("poll"),
            ProgressMode::Block => f.write_str("block"),
            ProgressMode::SpinThenBlock(d) => write!(f, "spin:{}", d.as_micros()),
        }
    }
}

impl FromStr for ProgressMode {
    type Err = String;

    /// `poll`, `block`, `spin` (spin [`DEFAULT_SPIN`](Self::DEFAULT_SPIN), then block) or
    /// `spin:USECS` with USECS in 0..=1000000 (`spin:0` blocks at once, like `block`).
    fn from_str(v: &str) -> Result<Self, Self::Err> {
        let t = v.trim();
        match t {
            "poll" => return Ok(ProgressMode::Poll),
            "block" => return Ok(ProgressMode::Block),
            "spin" => return Ok(ProgressMode::SpinThenBlock(Self::DEFAULT_SPIN)),
            _ => {}
        }
        let bad = || {
            format!(
                "{t:?}: accepted values are poll, block, spin, spin:USECS (0..={})",
                Self::MAX_SPIN.as_micros()
            )
        };
        let us = t
            .strip_prefix("spin:")
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u64>().ok())
            .filter(|&us| u128::from(us) <= Self::MAX_SPIN.as_micros())
            .ok_or_else(bad)?;
        Ok(ProgressMode::SpinThenBlock(Duration::from_micros(us)))
    }
}

/// Transport configuration: the settings of each layer, and the transport's own.
#[derive(Debug, Clone)]
pub struct Config {
    /// The protocol core's settings: process id, job token, receive cache, frames,
    /// batching, connect and handshake limits.
    pub core: CoreConfig,
    /// The reactor's settings: backend, socket options, send pieces, zero-copy, the
    /// provided-buffer ring.
    pub socket: SocketConfig,
    /// Wire-up settings: listen address, interfaces, ports, address exchange.
    pub wireup: WireupConfig,
    /// Progress mode used by the benchmark and by
    /// [`Transport::wait_until`](crate::Transport::wait_until)
    /// (`RINGBTL_PROGRESS=poll|block|spin[:USECS]`, poll by default).
    /// [`from_env`](Self::from_env) makes it `Block` when the launcher says this node
    /// runs more of the job's ranks than it has CPUs (see
    /// [`oversubscription`](crate::wireup::env::oversubscription)), unless
    /// `RINGBTL_PROGRESS` is set.
    pub progress: ProgressMode,
    /// Variables applied from the environment, with the value they gave (as text).
    env_values: Vec<(&'static str, String)>,
}

/// One parameter as [`Config::settings`] reports it: a line of
/// `ringbtl-bench --print-config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The layer that owns it (`core`, `socket`, `wireup`, `transport`).
    pub layer: &'static str,
    /// The field in that layer's settings struct.
    pub name: &'static str,
    /// The environment variable.
    pub var: &'static str,
    /// Type and accepted range.
    pub kind: String,
    /// The default, as text the variable accepts (empty: unset).
    pub default: String,
    /// The value, as text the variable accepts (empty: unset).
    pub value: String,
    /// Where the value came from.
    pub origin: Origin,
    /// What the setting does.
    pub meaning: &'static str,
    /// Who sets it, and why.
    pub site: &'static str,
}

impl Config {
    /// Defaults for process `pid`.
    pub fn new(pid: PeerId) -> Self {
        Self {
            core: CoreConfig::new(pid),
            socket: SocketConfig::default(),
            wireup: WireupConfig::default(),
            progress: ProgressMode::Poll,
            env_values: Vec::new(),
        }
    }

    /// This process's id (the rank), as set in [`CoreConfig::pid`].
    pub fn pid(&self) -> PeerId {
        self.core.pid
    }

    /// Applies `RINGBTL_*` overrides from the process environment.
    pub fn from_env(self) -> Result<Self, Error> {
        self.with_vars(|k| std::env::var(k).ok())
    }

    /// Applies overrides from `get` (the environment, or a map in tests): every variable
    /// of every layer's table with a non-blank value, then [`validate`](Self::validate).
    /// An interface list from the environment replaces the one set in code.
    pub fn with_vars(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let mut applied = Vec::new();
        if let Some(o) = crate::wireup::env::oversubscription(&get) {
            // Spinning ranks on an oversubscribed node starve each other: wait in the
            // kernel unless told otherwise (RINGBTL_PROGRESS below).
            tracing::debug!("{o}: progress mode defaults to block");
            self.progress = ProgressMode::Block;
            applied.push("RINGBTL_PROGRESS");
        }
        let mut note = |v| applied.push(v);
        let get: &dyn Fn(&str) -> Option<String> = &get;
        self.core
            .apply_vars(get, &mut note)
            .map_err(Error::Config)?;
        self.socket
            .apply_vars(get, &mut note)
            .map_err(Error::Config)?;
        self.wireup
            .apply_vars(get, &mut note)
            .map_err(Error::Config)?;
        self.apply_vars(get, &mut note).map_err(Error::Config)?;
        static RETIRED_SAID: std::sync::Once = std::sync::Once::new();
        let retired = crate::param::retired_notes(get);
        if !retired.is_empty() {
            RETIRED_SAID.call_once(|| retired.iter().for_each(|n| eprintln!("{n}")));
        }
        let env_sets = |v: &str| applied.contains(&v);
        match (
            env_sets("RINGBTL_IF_INCLUDE"),
            env_sets("RINGBTL_IF_EXCLUDE"),
        ) {
            (true, false) => self.wireup.if_exclude.clear(),
            (false, true) => self.wireup.if_include.clear(),
            _ => {}
        }
        for var in applied {
            let value = self.value(var).unwrap_or_default();
            self.env_values.retain(|(v, _)| *v != var);
            self.env_values.push((var, value));
        }
        self.validate()?;
        Ok(self)
    }

    /// Sets the parameter of variable `var` (`"RINGBTL_MAX_FRAME"`) from text, with the
    /// parsing and checks of the environment; on error nothing changes. The relations
    /// between parameters (`RINGBTL_INLINE` at most `RINGBTL_COALESCE_BYTES`, not both
    /// interface lists) are checked by [`validate`](Self::validate), when the transport
    /// starts, so that parameters can be set in any order.
    pub fn set(&mut self, var: &str, value: &str) -> Result<(), Error> {
        fn try_set<C: Params>(c: &mut C, var: &str, v: &str) -> Option<Result<(), String>> {
            C::param(var).map(|p| p.set(c, v))
        }
        let r = try_set(&mut self.core, var, value)
            .or_else(|| try_set(&mut self.socket, var, value))
            .or_else(|| try_set(&mut self.wireup, var, value))
            .or_else(|| try_set(self, var, value))
            .ok_or_else(|| {
                Error::Config(format!(
                    "{var}: no such parameter (`ringbtl-bench --print-config` lists them)"
                ))
            })?;
        r.map_err(Error::Config)?;
        self.env_values.retain(|(v, _)| *v != var);
        Ok(())
    }

    /// The value of the parameter of variable `var`, as text the variable accepts
    /// (`None`: no such parameter).
    pub fn value(&self, var: &str) -> Option<String> {
        fn get<C: Params>(c: &C, var: &str) -> Option<String> {
            C::param(var).map(|p| p.get(c))
        }
        get(&self.core, var)
            .or_else(|| get(&self.socket, var))
            .or_else(|| get(&self.wireup, var))
            .or_else(|| get(self, var))
    }

    /// Every parameter of every layer, in table order, with its value and where the
    /// value came from: an environment variable that gave the value now held, else
    /// the default when the value is the default's, else code.
    pub fn settings(&self) -> Vec<Setting> {
        fn rows<C: Params>(
            cur: &C,
            def: &C,
            env: &[(&'static str, String)],
            out: &mut Vec<Setting>,
        ) {
            for p in C::params() {
                let (value, default) = (p.get(cur), p.get(def));
                let origin = if env.iter().any(|(v, t)| *v == p.var && *t == value) {
                    Origin::Env
                } else if value == default {
                    Origin::Default
                } else {
                    Origin::Code
                };
                out.push(Setting {
                    layer: C::LAYER,
                    name: p.name,
                    var: p.var,
                    kind: p.kind.to_string(),
                    default,
                    value,
                    origin,
                    meaning: p.meaning,
                    site: p.site,
                });
            }
        }
        let def = Config::new(self.core.pid);
        let mut out = Vec::new();
        rows(&self.core, &def.core, &self.env_values, &mut out);
        rows(&self.socket, &def.socket, &self.env_values, &mut out);
        rows(&self.wireup, &def.wireup, &self.env_values, &mut out);
        rows(self, &def, &self.env_values, &mut out);
        out
    }

    /// Checks every parameter against its row of the table (the same checks as for
    /// values parsed from text), each layer by its own rules, then the relations
    /// between parameters. [`Transport::new`](crate::Transport::new) calls it.
    pub fn validate(&self) -> Result<(), Error> {
        self.core
            .validate()
            .and_then(|()| self.socket.validate())
            .and_then(|()| self.wireup.validate())
            .and_then(|()| self.check_params())
            .map_err(Error::Config)
    }

    /// The interface selection of [`WireupConfig::if_include`] /
    /// [`WireupConfig::if_exclude`].
    pub fn if_selection(&self) -> Result<IfSelection, Error> {
        self.wireup.if_selection()
    }
}

impl Params for Config {
    const LAYER: &'static str = "transport";

    fn params() -> &'static [Param<Self>] {
        &TRANSPORT_PARAMS
    }
}

static TRANSPORT_PARAMS: [Param<Config>; 1] = [Param {
    name: "progress",
    var: "RINGBTL_PROGRESS",
    kind: Kind::Text("poll, block, spin, spin:USECS (0..=1000000)"),
    meaning: "how `Transport::wait_until` and the benchmark wait: `poll` (spin), \
              `block` (wait in the kernel), `spin[:USECS]` (spin that long after the last \
              event, then wait); `block` by default when the node runs more ranks than it \
              has CPUs",
    site: "oversubscribed nodes (`block`, `spin`) against dedicated cores (`poll`)",
    access: Access::Text {
        get: |c| c.progress.to_string(),
        parse: |c, v| {
            c.progress = v.parse().map_err(|_| {
                format!(
                    "accepted values are poll, block, spin, spin:USECS (0..={})",
                    ProgressMode::MAX_SPIN.as_micros()
                )
            })?;
            Ok(())
        },
        check: |c| match c.progress {
            ProgressMode::SpinThenBlock(d) if d > ProgressMode::MAX_SPIN => Err(format!(
                "expected a spin time of at most {} us",
                ProgressMode::MAX_SPIN.as_micros()
            )),
            _ => Ok(()),
        },
    },
}];

/// The README's configuration table: one line per parameter of every layer (variable,
/// setting, type and range, default, meaning), in Markdown. A test checks that the
/// README holds exactly this text.
pub fn markdown_table() -> String {
    let cell = |t: &str| match t {
        "" => "unset".to_string(),
        t => format!("`{t}`"),
    };
    let mut s = String::from(
        "| variable | setting | type and range | default | meaning | who sets it |\n\
         |---|---|---|---|---|---|\n",
    );
    for p in Config::new(PeerId(0)).settings() {
        s += &format!(
            "| `{}` | `{}.{}` | {} | {} | {} | {} |\n",
            p.var,
            p.layer,
            p.name,
            p.kind,
            cell(&p.default),
            p.meaning,
            p.site
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reactor::BackendKind;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<Config, Error> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::new(PeerId(0)).with_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn overrides_apply() {
        let c = with(&[
            ("RINGBTL_RECV_CACHE", "128k"),
            ("RINGBTL_BACKEND", "epoll"),
            ("RINGBTL_SNDBUF", "0x10000"),
            ("RINGBTL_CONNECT_RETRIES", "3"),
            ("RINGBTL_RECV_MULTISHOT", "1"),
            ("RINGBTL_TCP_CONGESTION", "cubic"),
            ("RINGBTL_MAX_HALF_OPEN", "100"),
        ])
        .unwrap();
        assert_eq!(c.socket.tcp_congestion, Congestion::Use("cubic".into()));
        let sys = with(&[("RINGBTL_TCP_CONGESTION", "system")]).unwrap();
        assert_eq!(sys.socket.tcp_congestion, Congestion::System);
        assert_eq!(with(&[]).unwrap().socket.tcp_congestion, Congestion::Auto);
        assert!(c.socket.recv_multishot);
        assert_eq!(c.core.recv_cache, 128 * 1024);
        assert_eq!(c.socket.backend, BackendKind::Epoll);
        assert_eq!(c.socket.sndbuf, Some(65536));
        assert_eq!(c.core.connect_retries, 3);
        // One source may hold a quarter of the strangers.
        assert_eq!(
            (c.core.max_half_open, c.core.max_half_open_per_source),
            (100, 25)
        );
        let d = with(&[]).unwrap();
        assert_eq!(
            (d.core.max_half_open, d.core.max_half_open_per_source),
            (1024, 256)
        );
    }

    /// The variables that are no longer settings change nothing and each gets a line
    /// saying what decides now; the renamed wire-up timeout is read under its old name
    /// too, the new name winning when both are set.
    #[test]
    fn retired_variables_change_nothing_and_renamed_ones_still_work() {
        let set: Vec<(&str, &str)> = crate::param::RETIRED
            .iter()
            .map(|(var, _)| (*var, "0"))
            .collect();
        let c = with(&set).unwrap();
        let d = with(&[]).unwrap();
        assert_eq!(c.core, d.core);
        assert_eq!(c.socket, d.socket);
        let m: HashMap<&str, &str> = set.iter().copied().collect();
        let notes = crate::param::retired_notes(&|k| m.get(k).map(|v| v.to_string()));
        assert_eq!(notes.len(), crate::param::RETIRED.len());
        for (var, _) in crate::param::RETIRED {
            assert!(
                notes
                    .iter()
                    .any(|n| n.contains(var) && n.contains("no longer read")),
                "{var}: {notes:?}"
            );
            assert!(c.value(var).is_none(), "{var} is still a setting");
        }
        let old = with(&[("RINGBTL_WIREUP_TIMEOUT", "1500")]).unwrap();
        assert_eq!(old.wireup.timeout, Duration::from_millis(1500));
        let both = with(&[
            ("RINGBTL_WIREUP_TIMEOUT", "1500"),
            ("RINGBTL_WIREUP_TIMEOUT_MS", "2500"),
        ])
        .unwrap();
        assert_eq!(both.wireup.timeout, Duration::from_millis(2500));
        assert_eq!(
            crate::wireup::timeout_from_vars(
                |k| (k == "RINGBTL_WIREUP_TIMEOUT").then(|| "700".to_string())
            )
            .unwrap(),
            Duration::from_millis(700)
        );
        // A user sees at most 31 settings.
        assert!(d.settings().len() <= 31, "{} settings", d.settings().len());
    }

    #[test]
    fn progress_modes_parse() {
        let us = Duration::from_micros;
        for (v, want) in [
            ("poll", ProgressMode::Poll),
            (" block ", ProgressMode::Block),
            (
                "spin",
                ProgressMode::SpinThenBlock(ProgressMode::DEFAULT_SPIN),
            ),
            ("spin:20", ProgressMode::SpinThenBlock(us(20))),
            ("spin:0", ProgressMode::SpinThenBlock(us(0))),
            ("spin:1000000", ProgressMode::SpinThenBlock(us(1_000_000))),
        ] {
            assert_eq!(v.parse::<ProgressMode>(), Ok(want), "{v:?}");
            let c = with(&[("RINGBTL_PROGRESS", v)]).unwrap();
            assert_eq!(c.progress, want, "{v:?}");
            // Display writes what FromStr reads back.
            assert_eq!(want.to_string().parse::<ProgressMode>(), Ok(want));
        }
        assert_eq!(ProgressMode::DEFAULT_SPIN, us(50));
        assert_eq!(with(&[]).unwrap().progress, ProgressMode::Poll);
        for bad in [
            "",
            "spin:",
            "spin:-1",
            "spin:1.5",
            "spin:1000001",
            "spin:20us",
            "spin20",
            "Poll",
            "spin:99999999999999999999",
        ] {
            let e = bad.parse::<ProgressMode>().unwrap_err();
            assert!(e.contains("spin:USECS"), "{bad:?}: {e}");
        }
        let e = with(&[("RINGBTL_PROGRESS", "spin:x")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("RINGBTL_PROGRESS") && e.contains("spin:USECS"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("RINGBTL_RECV_CACHE", "12"),
            ("RINGBTL_RECV_CACHE", "lots"),
            ("RINGBTL_BACKEND", "kqueue"),
            ("RINGBTL_MAX_FRAME", "99999999999"),
            ("RINGBTL_LISTEN", "nowhere"),
            ("RINGBTL_PROGRESS", "sometimes"),
            ("RINGBTL_PORT", "0"),
            ("RINGBTL_PORT", "70000"),
            ("RINGBTL_PORT", "5000-4000"),
            ("RINGBTL_PORT", "1-2-3"),
            ("RINGBTL_PORT", "http"),
            ("RINGBTL_IF_INCLUDE", "10.0.0.0/99"),
            ("RINGBTL_RECV_MULTISHOT", "yes"),
            ("RINGBTL_TCP_CONGESTION", "a-name-far-too-long"),
            ("RINGBTL_ZEROCOPY", "2g"),
            ("RINGBTL_WIREUP_TIMEOUT_MS", "5"),
            ("RINGBTL_MAX_HALF_OPEN", "0"),
        ] {
            let e = with(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e} should name {k}");
        }
    }

    #[test]
    fn wireup_settings() {
        let c = with(&[
            ("RINGBTL_IF_INCLUDE", "lo,10.1.0.0/16"),
            ("RINGBTL_PORT", "40000-40099"),
            ("RINGBTL_LISTEN", "auto"),
        ])
        .unwrap();
        assert_eq!(c.wireup.listen, None);
        assert_eq!(c.wireup.ports, Some((40000, 40099)));
        assert_eq!(c.wireup.if_include.len(), 2);
        assert!(c.wireup.if_exclude.is_empty());
        assert!(matches!(c.if_selection().unwrap(), IfSelection::Include(_)));
        let c = with(&[("RINGBTL_IF_EXCLUDE", "docker0"), ("RINGBTL_PORT", "7")]).unwrap();
        assert_eq!(c.wireup.ports, Some((7, 7)));
        assert_eq!(c.wireup.if_exclude.len(), 1);
        assert_eq!(c.wireup.listen, Config::new(PeerId(0)).wireup.listen);
        let e = with(&[("RINGBTL_IF_INCLUDE", "lo"), ("RINGBTL_IF_EXCLUDE", "eth0")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("RINGBTL_IF_INCLUDE") && e.contains("RINGBTL_IF_EXCLUDE"),
            "{e}"
        );
        let mut c = Config::new(PeerId(0));
        c.wireup.if_include = vec!["lo".parse().unwrap()];
        c.wireup.if_exclude = vec!["eth0".parse().unwrap()];
        assert!(c.validate().is_err());
        c.wireup.if_exclude.clear();
        c.wireup.ports = Some((9, 8));
        assert!(c.validate().is_err());
    }

    #[test]
    fn dead_peer_detection_settings() {
        let d = with(&[]).unwrap();
        assert_eq!(d.socket.tcp_user_timeout, Some(Duration::from_secs(30)));
        assert_eq!(d.socket.keepalive, Some(Keepalive::DEFAULT));
        assert_eq!(
            Keepalive::DEFAULT,
            Keepalive {
                idle: Duration::from_secs(10),
                interval: Duration::from_secs(2),
                count: 5
            }
        );
        let c = with(&[
            ("RINGBTL_TCP_USER_TIMEOUT_MS", "2000"),
            ("RINGBTL_KEEPALIVE", " 1, 1 ,3 "),
        ])
        .unwrap();
        assert_eq!(c.socket.tcp_user_timeout, Some(Duration::from_secs(2)));
        assert_eq!(
            c.socket.keepalive,
            Some(Keepalive {
                idle: Duration::from_secs(1),
                interval: Duration::from_secs(1),
                count: 3
            })
        );
        let off = with(&[
            ("RINGBTL_TCP_USER_TIMEOUT_MS", "0"),
            ("RINGBTL_KEEPALIVE", "0"),
        ])
        .unwrap();
        assert_eq!(off.socket.tcp_user_timeout, None);
        assert_eq!(off.socket.keepalive, None);
        // An empty value leaves the default, as for every variable.
        assert_eq!(
            with(&[("RINGBTL_KEEPALIVE", "")]).unwrap().socket.keepalive,
            Some(Keepalive::DEFAULT)
        );
    }

    #[test]
    fn bad_dead_peer_detection_settings_are_refused() {
        for (k, v, part) in [
            ("RINGBTL_TCP_USER_TIMEOUT_MS", "-1", ""),
            ("RINGBTL_TCP_USER_TIMEOUT_MS", "3000000000", ""),
            ("RINGBTL_TCP_USER_TIMEOUT_MS", "soon", ""),
            ("RINGBTL_KEEPALIVE", "10,2", "idle_s,intvl_s,cnt"),
            ("RINGBTL_KEEPALIVE", "10,2,5,1", "idle_s,intvl_s,cnt"),
            ("RINGBTL_KEEPALIVE", "on", "idle_s,intvl_s,cnt"),
            ("RINGBTL_KEEPALIVE", "0,2,5", "idle_s"),
            ("RINGBTL_KEEPALIVE", "10,40000,5", "intvl_s"),
            ("RINGBTL_KEEPALIVE", "10,2,0", "cnt"),
            ("RINGBTL_KEEPALIVE", "10,2,128", "cnt"),
            ("RINGBTL_KEEPALIVE", "10,,5", "intvl_s"),
        ] {
            let e = with(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(part), "{k}={v}: {e}");
        }
        let mut c = Config::new(PeerId(0));
        c.socket.keepalive = Some(Keepalive {
            interval: Duration::from_millis(1500),
            ..Keepalive::DEFAULT
        });
        assert!(c.validate().is_err(), "sub-second keepalive interval");
        c.socket.keepalive = None;
        c.socket.tcp_user_timeout = Some(Duration::ZERO);
        assert!(c.validate().is_err(), "zero user timeout");
        c.socket.tcp_user_timeout = Some(Duration::from_millis(1));
        c.validate().unwrap();
    }

    #[test]
    fn oversubscribed_nodes_default_to_block() {
        let many = (4 * crate::wireup::env::node_cpus()).to_string();
        let c = with(&[("OMPI_COMM_WORLD_LOCAL_SIZE", &many)]).unwrap();
        assert_eq!(c.progress, ProgressMode::Block);
        let c = with(&[
            ("OMPI_COMM_WORLD_LOCAL_SIZE", &many),
            ("RINGBTL_PROGRESS", "poll"),
        ])
        .unwrap();
        assert_eq!(c.progress, ProgressMode::Poll);
        assert_eq!(with(&[]).unwrap().progress, ProgressMode::Poll);
    }

    #[test]
    fn a_value_set_in_code_meets_the_checks_of_the_environment() {
        let mut c = Config::new(PeerId(0));
        c.core.max_half_open = 0;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("max_half_open")
                && e.contains("RINGBTL_MAX_HALF_OPEN")
                && e.contains("1..=1000000"),
            "{e}"
        );
        let from_env = with(&[("RINGBTL_MAX_HALF_OPEN", "0")])
            .unwrap_err()
            .to_string();
        assert!(
            from_env.contains("RINGBTL_MAX_HALF_OPEN") && from_env.contains("1..=1000000"),
            "{from_env}"
        );
        // Out of every row's range in code, refused by validate() naming the setting.
        type Case = (&'static str, &'static str, fn(&mut Config));
        let cases: [Case; 7] = [
            ("max_frame", "RINGBTL_MAX_FRAME", |c| c.core.max_frame = 10),
            ("handshake_timeout", "RINGBTL_HANDSHAKE_TIMEOUT_MS", |c| {
                c.core.handshake_timeout = Duration::from_secs(3600)
            }),
            ("sndbuf", "RINGBTL_SNDBUF", |c| c.socket.sndbuf = Some(0)),
            ("zerocopy_min", "RINGBTL_ZEROCOPY", |c| {
                c.socket.zerocopy_min = Some(2 << 30)
            }),
            ("tcp_congestion", "RINGBTL_TCP_CONGESTION", |c| {
                c.socket.tcp_congestion = Congestion::Use(String::new())
            }),
            ("timeout", "RINGBTL_WIREUP_TIMEOUT_MS", |c| {
                c.wireup.timeout = Duration::from_millis(1)
            }),
            ("progress", "RINGBTL_PROGRESS", |c| {
                c.progress = ProgressMode::SpinThenBlock(Duration::from_secs(2))
            }),
        ];
        for (name, var, f) in cases {
            let mut c = Config::new(PeerId(0));
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains(&format!("{name} = ")) && e.contains(&format!("({var}): expected")),
                "{name}: {e}"
            );
        }
        // The built-in choices too, though no variable sets them.
        type BuiltIn = (&'static str, fn(&mut Config));
        let built_in: [BuiltIn; 5] = [
            ("retry_delay", |c| c.core.retry_delay = Duration::ZERO),
            ("inline_limit", |c| c.core.inline_limit = 1 << 20),
            ("max_iov", |c| c.core.max_iov = 4),
            ("send_chunk", |c| c.socket.send_chunk = Some(100)),
            ("recv_ring_bufs", |c| c.socket.recv_ring_bufs = 100),
        ];
        for (name, f) in built_in {
            let mut c = Config::new(PeerId(0));
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains(&format!("{name} = ")) && e.contains("expected"),
                "{e}"
            );
        }
    }

    #[test]
    fn set_by_variable_name() {
        let mut c = Config::new(PeerId(3));
        c.set("RINGBTL_MAX_FRAME", "1048576").unwrap();
        assert_eq!(c.core.max_frame, 1 << 20);
        c.set("RINGBTL_BACKEND", "epoll").unwrap();
        c.set("RINGBTL_KEEPALIVE", "0").unwrap();
        c.set("RINGBTL_LISTEN", "auto").unwrap();
        c.set("RINGBTL_PROGRESS", "spin:20").unwrap();
        c.set("RINGBTL_WIREUP", "pmi").unwrap();
        assert_eq!(c.socket.backend, BackendKind::Epoll);
        assert_eq!(c.socket.keepalive, None);
        assert_eq!(c.wireup.listen, None);
        assert_eq!(c.wireup.exchange, Some(crate::wireup::WireupKind::Pmi));
        assert_eq!(
            c.progress,
            ProgressMode::SpinThenBlock(Duration::from_micros(20))
        );
        assert_eq!(c.value("RINGBTL_MAX_FRAME").as_deref(), Some("1m"));
        let before = format!("{c:?}");
        for (var, v) in [
            ("RINGBTL_MAX_HALF_OPEN", "0"),
            ("RINGBTL_MAX_FRAME", "huge"),
            ("RINGBTL_RECV_CACHE", "1"),
            ("RINGBTL_PORT", "0"),
            ("RINGBTL_KEEPALIVE", "1,2"),
        ] {
            let e = c.set(var, v).unwrap_err().to_string();
            assert!(e.contains(var), "{e}");
        }
        let e = c.set("RINGBTL_NO_SUCH", "1").unwrap_err().to_string();
        assert!(
            e.contains("RINGBTL_NO_SUCH") && e.contains("no such"),
            "{e}"
        );
        assert_eq!(format!("{c:?}"), before, "a refused value changes nothing");
        assert_eq!(c.core.pid, PeerId(3));
        c.validate().unwrap();
    }

    #[test]
    fn every_value_reads_back_as_it_is_shown() {
        let mut c = with(&[
            ("RINGBTL_IF_INCLUDE", "lo,10.1.0.0/16"),
            ("RINGBTL_PORT", "40000-40099"),
            ("RINGBTL_KEEPALIVE", "3,4,5"),
            ("RINGBTL_ZEROCOPY", "12288"),
            ("RINGBTL_ROOT", "rank0.example:7000"),
        ])
        .unwrap();
        c.socket.tcp_congestion = Congestion::Use("cubic".into());
        for s in c.settings() {
            let mut d = Config::new(PeerId(0));
            d.set(s.var, &s.value)
                .unwrap_or_else(|e| panic!("{}={:?}: {e}", s.var, s.value));
            assert_eq!(d.value(s.var).unwrap(), s.value, "{}", s.var);
        }
    }

    #[test]
    fn settings_say_where_each_value_came_from() {
        let mut c = with(&[("RINGBTL_MAX_FRAME", "2m"), ("RINGBTL_RECV_MULTISHOT", "1")]).unwrap();
        c.socket.sndbuf = Some(1 << 20);
        c.set("RINGBTL_RECV_MULTISHOT", "0").unwrap();
        c.set("RINGBTL_CONNECT_RETRIES", "9").unwrap();
        let all = c.settings();
        let get = |var: &str| all.iter().find(|s| s.var == var).unwrap().clone();
        assert_eq!(get("RINGBTL_MAX_FRAME").origin, Origin::Env);
        assert_eq!(get("RINGBTL_MAX_FRAME").value, "2m");
        assert_eq!(get("RINGBTL_MAX_FRAME").default, "64m");
        assert_eq!(get("RINGBTL_SNDBUF").origin, Origin::Code);
        assert_eq!(get("RINGBTL_CONNECT_RETRIES").origin, Origin::Code);
        // Set back to its default in code: the default again.
        assert_eq!(get("RINGBTL_RECV_MULTISHOT").origin, Origin::Default);
        assert_eq!(get("RINGBTL_RECV_CACHE").origin, Origin::Default);
        assert_eq!(get("RINGBTL_RECV_CACHE").layer, "core");
        assert_eq!(get("RINGBTL_BACKEND").layer, "socket");
        assert_eq!(get("RINGBTL_PORT").layer, "wireup");
        assert_eq!(get("RINGBTL_PROGRESS").layer, "transport");
        // A field assigned after from_env no longer counts as the environment's.
        let mut c = with(&[("RINGBTL_MAX_FRAME", "2m")]).unwrap();
        c.core.max_frame = 4 << 20;
        let s = c.settings();
        let f = s.iter().find(|s| s.var == "RINGBTL_MAX_FRAME").unwrap();
        assert_eq!((f.origin, f.value.as_str()), (Origin::Code, "4m"));
        // The launcher's oversubscription counts as the environment.
        let many = (4 * crate::wireup::env::node_cpus()).to_string();
        let c = with(&[("OMPI_COMM_WORLD_LOCAL_SIZE", &many)]).unwrap();
        let s = c.settings();
        let p = s.iter().find(|s| s.var == "RINGBTL_PROGRESS").unwrap();
        assert_eq!((p.origin, p.value.as_str()), (Origin::Env, "block"));
        // Every variable appears once.
        let mut vars: Vec<_> = all.iter().map(|s| s.var).collect();
        vars.sort_unstable();
        vars.dedup();
        assert_eq!(vars.len(), all.len());
    }

    #[test]
    fn readme_table_is_the_parameter_table() {
        let readme = include_str!("../README.md");
        let (start, end) = ("<!-- config-table -->\n", "<!-- /config-table -->");
        let table = readme
            .split_once(start)
            .and_then(|(_, rest)| rest.split_once(end))
            .map(|(t, _)| t)
            .expect("README.md has a configuration table between config-table markers");
        let want = markdown_table();
        assert!(
            table == want,
            "README.md's configuration table differs from the parameter tables; \
             replace it with:\n{want}"
        );
    }
}
