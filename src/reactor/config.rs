//! The reactor's settings: backend choice, socket options, send pieces, zero-copy and the
//! provided-buffer ring, with their table (see [`param`](crate::param)). Validated here,
//! by the layer that applies them.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use super::op::Chunks;
use super::BackendKind;
use crate::param::{parse_int, Access, Kind, Param, Params, Unit};

/// Socket-level settings of a transport (the `socket` part of
/// [`Config`](crate::Config)).
///
/// The fields hidden from the documentation are built-in choices, not settings: the code
/// decides them from what it can see of a connection (its peer on loopback or not, its
/// congestion control pacing or not), and docs/design/pacing.md says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketConfig {
    /// Backend choice (`RINGBTL_BACKEND=auto|uring|epoll`).
    pub backend: BackendKind,
    /// `TCP_NODELAY` on every connection.
    /// Not a setting: the built-in choice (on), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub nodelay: bool,
    /// SO_SNDBUF, kernel autotuning when `None` (`RINGBTL_SNDBUF`, 0 = autotune).
    pub sndbuf: Option<usize>,
    /// SO_RCVBUF, kernel autotuning when `None` (`RINGBTL_RCVBUF`, 0 = autotune).
    pub rcvbuf: Option<usize>,
    /// TCP congestion control of the connections (`RINGBTL_TCP_CONGESTION`): see
    /// [`Congestion`].
    pub tcp_congestion: Congestion,
    /// Most bytes handed to the kernel by one send call on every connection, copied and
    /// lent alike (`None`: no limit). A larger batch leaves in several consecutive calls
    /// on the same connection; the bytes on the wire are the same. Like every chunk, it
    /// is rounded down to whole segments of the connection. When set, `paced_send_chunk`
    /// and `paced_copy_chunk` give no limit of their own.
    /// Not a setting: the built-in choice (no limit), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub send_chunk: Option<usize>,
    /// Most bytes of lent pages one send call hands to the kernel on a connection to
    /// another host whose congestion control paces its sending (BBR), when
    /// [`send_chunk`](Self::send_chunk) is not set (`None`: no limit).
    /// Not a setting: the built-in choice (no limit), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub paced_send_chunk: Option<usize>,
    /// On connections whose congestion control paces its sending (BBR), when
    /// [`send_chunk`](Self::send_chunk) is not set: the most bytes one call copies into
    /// the socket, and the payloads of a stream (messages queued behind each other) are
    /// copied rather than lent; those that find their peer idle are lent as elsewhere,
    /// towards loopback peers only up to one trip through the lending pipe
    /// ([`CoreConfig::splice_max`](crate::CoreConfig::splice_max)). `None`: copied bytes
    /// go in the calls of lent ones, and streams are lent. Every chunk is rounded down to
    /// whole segments of its connection (`TCP_MAXSEG`, at least one), so that no call
    /// leaves a short segment on the wire.
    /// Not a setting: the built-in choice (64 KiB), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub paced_copy_chunk: Option<usize>,
    /// On connections whose congestion control paces (BBR), a large message that finds
    /// its peer idle is copied up to
    /// [`CoreConfig::splice_idle`](crate::CoreConfig::splice_idle), and once it has left
    /// the socket acknowledges the answer at once (`TCP_QUICKACK`), so that BBR samples
    /// the path's speed rather than its own pacing.
    /// Not a setting: the built-in choice (off: the copy it needs costs more than it gains where memory bandwidth is shared), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub paced_quick_ack: bool,
    /// On connections to other hosts whose congestion control paces (BBR), the socket's
    /// receive low-water mark (`SO_RCVLOWAT`) is raised to this many bytes while more
    /// than that many of a large record are still to come, and lowered back to the
    /// default before the rest, so that the kernel acknowledges data as it arrives. The
    /// io_uring backend's read of such a record stops that many bytes short of its end,
    /// the rest read after the mark is lowered, so that no wait can outlast the record.
    /// `None`: the kernel's default.
    /// Not a setting: the built-in choice (256 KiB), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub paced_rcvlowat: Option<usize>,
    /// `TCP_USER_TIMEOUT` on every connection (`RINGBTL_TCP_USER_TIMEOUT_MS`, 0 = the
    /// kernel's default): how long sent data may stay unacknowledged before the kernel
    /// aborts the connection with `ETIMEDOUT`, which fails the endpoint and its pending
    /// sends. Without it a dead peer holding unacknowledged data is noticed only after
    /// the full retransmission schedule (`tcp_retries2`, about 15 minutes). With
    /// keepalive on, it also ends the probing of an idle connection: the kernel gives up
    /// at the first unanswered probe once this long has passed without an answer.
    /// A live peer that stops reading (zero window) answers the kernel's window probes,
    /// which do not count against the timeout since Linux 5.11; on older kernels such a
    /// peer is dropped as well, so raise the timeout (or set 0) where a rank may compute
    /// for a long time without making progress.
    pub tcp_user_timeout: Option<Duration>,
    /// TCP keepalive on every connection (`RINGBTL_KEEPALIVE=idle_s,intvl_s,cnt`, `0` =
    /// off): finds a dead peer on a connection with nothing in flight.
    pub keepalive: Option<Keepalive>,
    /// Zero-copy sends (io_uring `SENDMSG_ZC`, Linux 6.1+) for gathered sends of at
    /// least this many bytes (`RINGBTL_ZEROCOPY`, bytes, `0` = off; default off). The
    /// kernel pins the caller's pages instead of copying them and the send completes
    /// when its notification says the NIC is done with them. Pays only for large
    /// payloads on a real NIC; never on loopback, where the kernel copies anyway, so
    /// loopback peers keep plain sends. The epoll backend ignores it.
    pub zerocopy_min: Option<usize>,
    /// Zero-copy sends to loopback peers too, where the kernel copies and notifies later:
    /// only the tests of the path want it.
    /// Not a setting: the built-in choice (off), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub zerocopy_loopback: bool,
    /// Multishot receive on a ring of provided buffers shared by every connection
    /// (`RINGBTL_RECV_MULTISHOT=0|1`, default off). io_uring backend only, Linux 6.0+;
    /// the epoll backend ignores it, and io_uring falls back to single-shot receives
    /// (with a warning) when the ring cannot be set up.
    ///
    /// Off, each connection has its own receive cache (`RINGBTL_RECV_CACHE`, 64 KiB by
    /// default) and a poll-mode fast path that reads spun connections directly. On,
    /// receive memory is the shared ring and frames are parsed in place in it; the
    /// per-connection cache then only holds frames cut between two buffers. Turn it on
    /// for many peers per process (hundreds of connections, where per-connection caches
    /// add up) or many mostly idle connections; leave it off for the lowest latency with
    /// a few peers, since the direct `recv` fast path is not used and payloads larger
    /// than one buffer are copied once out of the ring. See docs/design/receive.md.
    pub recv_multishot: bool,
    /// Number of provided buffers in the multishot ring (a power of two in 1..=32768).
    /// Not a setting: the built-in choice (256), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub recv_ring_bufs: u32,
    /// Bytes per provided buffer (1 KiB..=1 MiB).
    /// Not a setting: the built-in choice (16 KiB), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub recv_ring_buf_size: usize,
    /// The transport is entered from more than one thread, one call at a time (the
    /// caller holds a lock around every call): the io_uring backend then builds its
    /// ring without `SINGLE_ISSUER` and `DEFER_TASKRUN`, which bind a ring to the thread
    /// that created it, and without `COOP_TASKRUN`, under which the completions of
    /// operations a thread submitted wait until that thread enters the kernel again
    /// (a thread that computes would hold them back from the one that progresses).
    /// Not a setting: the program's structure (Open MPI's `MPI_THREAD_MULTIPLE`, a
    /// progress thread), which the code using the transport knows; the C ABI's
    /// `ringbtl_config_threads`. Off by default.
    pub threads: bool,
}

impl Default for SocketConfig {
    fn default() -> Self {
        Self {
            backend: BackendKind::Auto,
            nodelay: true,
            sndbuf: None,
            rcvbuf: None,
            tcp_congestion: Congestion::Auto,
            send_chunk: None,
            paced_send_chunk: None,
            paced_copy_chunk: Some(64 * 1024),
            paced_quick_ack: false,
            paced_rcvlowat: Some(256 * 1024),
            tcp_user_timeout: Some(Duration::from_secs(30)),
            keepalive: Some(Keepalive::DEFAULT),
            zerocopy_min: None,
            zerocopy_loopback: false,
            recv_multishot: false,
            recv_ring_bufs: 256,
            recv_ring_buf_size: 16 * 1024,
            threads: false,
        }
    }
}

impl SocketConfig {
    /// Checks every setting against its row of the table.
    pub fn validate(&self) -> Result<(), String> {
        self.check_params()?;
        self.check_built_in()
    }

    /// The built-in choices (the fields without a variable) keep within what the
    /// backends handle; code that varies them gets an error, never a misbehaving socket.
    fn check_built_in(&self) -> Result<(), String> {
        const GIB: usize = 1 << 30;
        let chunk = |name: &str, v: Option<usize>, hi: usize| match v {
            Some(n) if !(4096..=hi).contains(&n) => {
                Err(format!("{name} = {n}: expected 4096..={hi}, or none"))
            }
            _ => Ok(()),
        };
        chunk("send_chunk", self.send_chunk, GIB)?;
        chunk("paced_send_chunk", self.paced_send_chunk, GIB)?;
        chunk("paced_copy_chunk", self.paced_copy_chunk, GIB)?;
        chunk("paced_rcvlowat", self.paced_rcvlowat, 64 << 20)?;
        if !self.recv_ring_bufs.is_power_of_two() || self.recv_ring_bufs > 32768 {
            return Err(format!(
                "recv_ring_bufs = {}: expected a power of two in 1..=32768",
                self.recv_ring_bufs
            ));
        }
        if !(1 << 10..=1 << 20).contains(&self.recv_ring_buf_size) {
            return Err(format!(
                "recv_ring_buf_size = {}: expected 1024..=1048576",
                self.recv_ring_buf_size
            ));
        }
        Ok(())
    }

    /// The options every connected or accepted socket gets.
    pub(crate) fn sock_opts(&self) -> SockOpts {
        SockOpts {
            nodelay: self.nodelay,
            sndbuf: self.sndbuf,
            rcvbuf: self.rcvbuf,
            user_timeout: self.tcp_user_timeout,
            keepalive: self.keepalive,
            send_chunk: self.send_chunk,
            paced_send_chunk: self.paced_send_chunk,
            paced_copy_chunk: self.paced_copy_chunk,
            paced_quick_ack: self.paced_quick_ack,
            paced_rcvlowat: self.paced_rcvlowat,
            rcvlowat_loopback: false,
            system_paces: paces(&system_congestion()),
            congestion: self.tcp_congestion.clone(),
            zerocopy_min: self.zerocopy_min,
            zerocopy_loopback: self.zerocopy_loopback,
            threads: self.threads,
        }
    }
}

const GIB: u64 = 1 << 30;

fn usize_opt(v: Option<usize>) -> Option<u64> {
    v.map(|n| n as u64)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Params for SocketConfig {
    const LAYER: &'static str = "socket";

    fn params() -> &'static [Param<Self>] {
        &SOCKET_PARAMS
    }
}

static SOCKET_PARAMS: [Param<SocketConfig>; 8] = [
    Param {
        name: "backend",
        var: "RINGBTL_BACKEND",
        kind: Kind::Text("auto, uring, epoll"),
        meaning: "backend; auto probes io_uring and falls back to epoll",
        site: "kernels or containers that forbid io_uring, and backend comparisons",
        access: Access::Text {
            get: |c| c.backend.to_string(),
            parse: |c, v| {
                c.backend = v.parse()?;
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "sndbuf",
        var: "RINGBTL_SNDBUF",
        kind: Kind::IntOrOff {
            lo: 1,
            hi: GIB,
            unit: Unit::Bytes,
            off: "kernel autotuning",
        },
        meaning: "`SO_SNDBUF`",
        site: "long, fast paths where autotuning's ceiling is too low (as `btl_tcp_sndbuf`)",
        access: Access::Num {
            get: |c| usize_opt(c.sndbuf),
            put: |c, v| c.sndbuf = v.map(|n| n as usize),
        },
    },
    Param {
        name: "rcvbuf",
        var: "RINGBTL_RCVBUF",
        kind: Kind::IntOrOff {
            lo: 1,
            hi: GIB,
            unit: Unit::Bytes,
            off: "kernel autotuning",
        },
        meaning: "`SO_RCVBUF`",
        site: "long, fast paths where autotuning's ceiling is too low (as `btl_tcp_rcvbuf`)",
        access: Access::Num {
            get: |c| usize_opt(c.rcvbuf),
            put: |c, v| c.rcvbuf = v.map(|n| n as usize),
        },
    },
    Param {
        name: "tcp_congestion",
        var: "RINGBTL_TCP_CONGESTION",
        kind: Kind::Text("auto, system, or an algorithm name"),
        meaning: "TCP congestion control: `auto` (`reno` towards loopback peers, the \
                  system's algorithm elsewhere), `system`, or an algorithm of \
                  `net.ipv4.tcp_available_congestion_control` for every connection",
        site: "fabrics whose congestion control is chosen for them",
        access: Access::Text {
            get: |c| c.tcp_congestion.to_string(),
            parse: |c, v| {
                c.tcp_congestion = v.parse()?;
                Ok(())
            },
            check: |c| c.tcp_congestion.check(),
        },
    },
    Param {
        name: "tcp_user_timeout",
        var: "RINGBTL_TCP_USER_TIMEOUT_MS",
        kind: Kind::IntOrOff {
            lo: 1,
            hi: i32::MAX as u64,
            unit: Unit::Millis,
            off: "kernel default (about 15 min)",
        },
        meaning: "`TCP_USER_TIMEOUT`: unacknowledged data older than this aborts the \
                  connection (`ETIMEDOUT`), failing its endpoint and pending sends",
        site: "how soon a dead peer fails the job, against long computations",
        access: Access::Num {
            get: |c| c.tcp_user_timeout.map(millis),
            put: |c, v| c.tcp_user_timeout = v.map(Duration::from_millis),
        },
    },
    Param {
        name: "keepalive",
        var: "RINGBTL_KEEPALIVE",
        kind: Kind::Text("idle_s,intvl_s,cnt; 0 = off"),
        meaning: "TCP keepalive (finds a dead peer on an idle connection)",
        site: "how soon an idle dead peer is found; firewalls that drop idle connections",
        access: Access::Text {
            get: |c| match &c.keepalive {
                Some(k) => k.to_string(),
                None => "0".into(),
            },
            parse: |c, v| {
                c.keepalive = Keepalive::parse_text(v)?;
                Ok(())
            },
            check: |c| c.keepalive.as_ref().map_or(Ok(()), Keepalive::check),
        },
    },
    Param {
        name: "zerocopy_min",
        var: "RINGBTL_ZEROCOPY",
        kind: Kind::IntOrOff {
            lo: 1,
            hi: GIB,
            unit: Unit::Bytes,
            off: "off",
        },
        meaning: "io_uring only: `SENDMSG_ZC` for gathered sends of at least this many \
                  bytes; never to loopback peers",
        site: "real NICs where pinning pays; the break-even depends on the NIC",
        access: Access::Num {
            get: |c| usize_opt(c.zerocopy_min),
            put: |c, v| c.zerocopy_min = v.map(|n| n as usize),
        },
    },
    Param {
        name: "recv_multishot",
        var: "RINGBTL_RECV_MULTISHOT",
        kind: Kind::Bool,
        meaning: "io_uring only: multishot receive on a shared ring of provided buffers",
        site: "processes with hundreds of peers, trading latency against memory",
        access: Access::Num {
            get: |c| Some(c.recv_multishot.into()),
            put: |c, v| c.recv_multishot = v == Some(1),
        },
    },
];

impl FromStr for BackendKind {
    type Err = String;

    /// `auto`, `uring` (or `io_uring`), `epoll`.
    fn from_str(v: &str) -> Result<Self, String> {
        match v.trim() {
            "auto" => Ok(BackendKind::Auto),
            "uring" | "io_uring" => Ok(BackendKind::Uring),
            "epoll" => Ok(BackendKind::Epoll),
            _ => Err("accepted values are auto, uring, epoll".into()),
        }
    }
}

impl fmt::Display for BackendKind {
    /// The text [`FromStr`] accepts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Auto => "auto",
            BackendKind::Uring => "uring",
            BackendKind::Epoll => "epoll",
        })
    }
}

/// Socket options applied to every connected or accepted socket.
#[derive(Debug, Clone, Default)]
pub(crate) struct SockOpts {
    /// TCP_NODELAY.
    pub(crate) nodelay: bool,
    /// SO_SNDBUF when set (else kernel autotuning).
    pub(crate) sndbuf: Option<usize>,
    /// SO_RCVBUF when set (else kernel autotuning).
    pub(crate) rcvbuf: Option<usize>,
    /// TCP_USER_TIMEOUT when set (else the kernel's retransmission limit).
    pub(crate) user_timeout: Option<Duration>,
    /// SO_KEEPALIVE with TCP_KEEPIDLE / TCP_KEEPINTVL / TCP_KEEPCNT when set.
    pub(crate) keepalive: Option<Keepalive>,
    /// TCP congestion control (`TCP_CONGESTION`), by peer (see `Congestion`).
    pub(crate) congestion: Congestion,
    /// Most bytes one send call hands to the kernel (`None`: no limit).
    pub(crate) send_chunk: Option<usize>,
    /// The same on connections to other hosts whose congestion control paces, when
    /// `send_chunk` is `None`.
    pub(crate) paced_send_chunk: Option<usize>,
    /// `SocketConfig::paced_copy_chunk`.
    pub(crate) paced_copy_chunk: Option<usize>,
    /// `SocketConfig::paced_quick_ack`.
    pub(crate) paced_quick_ack: bool,
    /// `SocketConfig::paced_rcvlowat`.
    pub(crate) paced_rcvlowat: Option<usize>,
    /// The mark towards loopback peers too (no setting: the backends' conformance cases,
    /// which run on loopback, check the mechanism with it).
    pub(crate) rcvlowat_loopback: bool,
    /// The system's default congestion control (of this network namespace) paces.
    pub(crate) system_paces: bool,
    /// Zero-copy sends (io_uring `SENDMSG_ZC`) for batches of at least this many bytes;
    /// `None` = never. The epoll backend ignores it.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) zerocopy_min: Option<usize>,
    /// Allow zero-copy on loopback peers too, where the kernel copies anyway (tests).
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) zerocopy_loopback: bool,
    /// `SocketConfig::threads`: the io_uring ring is built for any thread.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub(crate) threads: bool,
}

/// TCP congestion control of ringbtl's connections (`TCP_CONGESTION`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Congestion {
    /// `reno` on connections to loopback peers, the system's algorithm elsewhere. On
    /// loopback there is no congestion to control, and a pacing, probing algorithm such
    /// as BBR (some distributions' default) only slows the stream; `reno` is the one
    /// any unprivileged process may choose. (`RINGBTL_TCP_CONGESTION=auto`, the default.)
    #[default]
    Auto,
    /// The system's `net.ipv4.tcp_congestion_control` everywhere (`system`).
    System,
    /// This algorithm on every connection, checked when the transport starts (one of
    /// `net.ipv4.tcp_available_congestion_control`; unprivileged processes are limited
    /// to `net.ipv4.tcp_allowed_congestion_control`).
    Use(String),
}

impl Congestion {
    /// The algorithm to set on a connection to `peer`, `None` to keep the system's.
    pub fn for_peer(&self, peer: &SocketAddr) -> Option<&str> {
        match self {
            Congestion::Use(name) => Some(name),
            Congestion::Auto if peer.ip().is_loopback() => Some("reno"),
            Congestion::Auto | Congestion::System => None,
        }
    }

    /// An algorithm name must fit `TCP_CA_NAME_MAX` (15 bytes and the NUL), in ASCII.
    fn check(&self) -> Result<(), String> {
        match self {
            Congestion::Use(n)
                if n.is_empty()
                    || n.len() >= 16
                    || !n.is_ascii()
                    || n == "auto"
                    || n == "system" =>
            {
                Err("expected auto, system, or an algorithm name from \
                     net.ipv4.tcp_available_congestion_control (at most 15 characters)"
                    .into())
            }
            _ => Ok(()),
        }
    }
}

impl FromStr for Congestion {
    type Err = String;

    /// `auto`, `system`, or an algorithm name.
    fn from_str(v: &str) -> Result<Self, String> {
        let c = match v.trim() {
            "auto" => Congestion::Auto,
            "system" => Congestion::System,
            name => Congestion::Use(name.to_string()),
        };
        c.check().map(|()| c)
    }
}

impl fmt::Display for Congestion {
    /// The text [`FromStr`] accepts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Congestion::Auto => f.write_str("auto"),
            Congestion::System => f.write_str("system"),
            Congestion::Use(n) => f.write_str(n),
        }
    }
}

/// TCP keepalive parameters (`TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT`).
///
/// Without a user timeout, a connection idle for `idle` is probed every `interval` and
/// aborted with `ETIMEDOUT` after `count` unanswered probes: a dead peer is found in
/// `idle + interval * count`. With [`SocketConfig::tcp_user_timeout`] set, the kernel
/// ends the probing by that timeout instead of by the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (whole seconds, 1..=32767).
    pub idle: Duration,
    /// Time between probes (whole seconds, 1..=32767).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped (1..=127).
    pub count: u32,
}

impl Keepalive {
    /// UCX's choice for its TCP transport: first probe after 10 s idle, then every 2 s,
    /// 5 probes.
    pub const DEFAULT: Self = Self {
        idle: Duration::from_secs(10),
        interval: Duration::from_secs(2),
        count: 5,
    };

    /// Largest idle time and interval the kernel accepts, in seconds
    /// (`MAX_TCP_KEEPIDLE`, `MAX_TCP_KEEPINTVL`).
    const MAX_SECS: u64 = 32767;
    /// Largest probe count the kernel accepts (`MAX_TCP_KEEPCNT`).
    const MAX_COUNT: u32 = 127;

    /// Parses `idle_s,intvl_s,cnt`, or `0` for no keepalive (`None`); `name` is the
    /// variable quoted in errors.
    pub fn parse(name: &str, v: &str) -> Result<Option<Self>, String> {
        Self::parse_text(v).map_err(|why| format!("{name}={v:?}: {why}"))
    }

    fn parse_text(v: &str) -> Result<Option<Self>, String> {
        let t = v.trim();
        if t == "0" {
            return Ok(None);
        }
        let parts: Vec<&str> = t.split(',').collect();
        let [idle, intvl, cnt] = parts[..] else {
            return Err("expected idle_s,intvl_s,cnt (e.g. 10,2,5) or 0 for off".into());
        };
        let num =
            |what: &str, x: &str, hi: u64| {
                parse_int(x).filter(|n| (1..=hi).contains(n)).ok_or_else(|| {
                format!("{what} must be an integer in 1..={hi} (idle_s,intvl_s,cnt, or 0 for off)")
            })
            };
        Ok(Some(Self {
            idle: Duration::from_secs(num("idle_s", idle, Self::MAX_SECS)?),
            interval: Duration::from_secs(num("intvl_s", intvl, Self::MAX_SECS)?),
            count: num("cnt", cnt, Self::MAX_COUNT.into())? as u32,
        }))
    }

    fn check(&self) -> Result<(), String> {
        let secs = 1..=Self::MAX_SECS;
        let whole = |d: Duration| d.subsec_nanos() == 0 && secs.contains(&d.as_secs());
        if !whole(self.idle)
            || !whole(self.interval)
            || !(1..=Self::MAX_COUNT).contains(&self.count)
        {
            return Err(format!(
                "expected idle and interval in whole seconds, 1..={}, and a count in 1..={}",
                Self::MAX_SECS,
                Self::MAX_COUNT
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Keepalive {
    /// `idle_s,intvl_s,cnt`, as [`Keepalive::parse`] reads it (sub-second parts, which
    /// the check refuses, are shown as fractions).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: Duration| match d.subsec_nanos() {
            0 => d.as_secs().to_string(),
            _ => format!("{}", d.as_secs_f64()),
        };
        write!(f, "{},{},{}", s(self.idle), s(self.interval), self.count)
    }
}

impl SockOpts {
    /// Most bytes one send call hands to the kernel on a connection to `peer`, copied
    /// and lent: `send_chunk` for both when set; else, where the connection's congestion
    /// control (the configured one for this peer, or the system's) paces its sending,
    /// `paced_send_chunk` (when set) towards other hosts, else no limit, and
    /// for copied bytes at most `paced_copy_chunk`; no limit elsewhere.
    pub(crate) fn send_chunks_for(&self, peer: &SocketAddr) -> Chunks {
        if let Some(n) = self.send_chunk {
            return Chunks {
                copy: n,
                splice: n,
                lead: 0,
            };
        }
        if !self.paced_for(peer) {
            return Chunks::WHOLE;
        }
        let splice = match self.paced_send_chunk {
            Some(n) if !peer.ip().is_loopback() => n,
            _ => usize::MAX,
        };
        let copy = self.paced_copy_chunk.map_or(splice, |n| n.min(splice));
        // Towards other hosts a short message's remainder goes first (see `next_call`),
        // for messages whose rest the receive low-water mark does not cover (with the
        // mark off, for messages of one call and a remainder); towards loopback peers it
        // does not, where it gained nothing (docs/design/pacing.md).
        let lead = if peer.ip().is_loopback() || copy == usize::MAX {
            0
        } else {
            self.paced_rcvlowat.map_or(copy, |m| m.max(copy))
        };
        Chunks { copy, splice, lead }
    }

    /// The receive low-water mark of large records on a connection to `peer`
    /// ([`SocketConfig::paced_rcvlowat`]): set, towards other hosts where the
    /// connection's congestion control paces. Not towards loopback peers, where the ACKs
    /// sent at once cost the receiving core the sender's ACK processing too (the kernel
    /// runs it there) and gain nothing.
    pub(crate) fn rcvlowat_for(&self, peer: &SocketAddr) -> Option<usize> {
        self.paced_rcvlowat.filter(|_| {
            (self.rcvlowat_loopback || !peer.ip().is_loopback()) && self.paced_for(peer)
        })
    }

    /// Whether a connection to `peer` runs a congestion control that paces its sending
    /// (the one configured for this peer, or the system's).
    pub(crate) fn paced_for(&self, peer: &SocketAddr) -> bool {
        match self.congestion.for_peer(peer) {
            Some(name) => paces(name),
            None => self.system_paces,
        }
    }
}

/// Whether the congestion control `name` paces its sending (BBR and its versions).
fn paces(name: &str) -> bool {
    name.starts_with("bbr")
}

/// The system's default congestion control in this network namespace (empty if unknown).
fn system_congestion() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The send chunks follow the connection's congestion control and its peer: where it
    /// paces (bbr, configured or the system's), the copy chunk for copied bytes and no
    /// lent streams, lent pages in the paced chunk (when set) towards other hosts and
    /// whole towards loopback peers; towards other hosts the remainder of a message of up
    /// to a call first, or, with the receive low-water mark, of one whose whole calls fit
    /// in the mark; whole batches and lent streams where it does not pace; an explicit
    /// `send_chunk` for both on every connection (remainders last); and what the defaults
    /// give.
    #[test]
    fn send_chunks_follow_the_congestion_control() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let lo6: SocketAddr = "[::1]:1".parse().unwrap();
        let remote: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let opts =
            |congestion: Congestion, system_paces: bool, send_chunk: Option<usize>| SockOpts {
                congestion,
                system_paces,
                send_chunk,
                paced_send_chunk: Some(256 << 10),
                paced_copy_chunk: Some(64 << 10),
                ..SockOpts::default()
            };
        let chunks = |copy: usize, splice: usize, lead: usize| Chunks { copy, splice, lead };
        let paced_remote = chunks(64 << 10, 256 << 10, 64 << 10);
        let paced_local = chunks(64 << 10, usize::MAX, 0);
        let bbr = Congestion::Use("bbr".into());
        let reno = Congestion::Use("reno".into());
        let o = opts(bbr.clone(), false, None);
        assert_eq!(o.send_chunks_for(&remote), paced_remote);
        assert_eq!(o.send_chunks_for(&lo), paced_local);
        assert_eq!(o.send_chunks_for(&lo6), paced_local);
        let o = opts(reno, true, None);
        for peer in [&remote, &lo] {
            assert_eq!(o.send_chunks_for(peer), Chunks::WHOLE, "{peer}");
        }
        // Auto: reno towards loopback, the system's algorithm towards other hosts.
        let o = opts(Congestion::Auto, true, None);
        assert_eq!(o.send_chunks_for(&lo), Chunks::WHOLE);
        assert_eq!(o.send_chunks_for(&remote), paced_remote);
        let o = opts(Congestion::Auto, false, None);
        assert_eq!(o.send_chunks_for(&remote), Chunks::WHOLE);
        let o = opts(Congestion::System, true, None);
        assert_eq!(o.send_chunks_for(&lo), paced_local);
        assert_eq!(o.send_chunks_for(&remote), paced_remote);
        // An explicit chunk applies everywhere, to both.
        let o = opts(bbr.clone(), false, Some(1 << 20));
        assert_eq!(o.send_chunks_for(&lo), chunks(1 << 20, 1 << 20, 0));
        assert_eq!(o.send_chunks_for(&remote), chunks(1 << 20, 1 << 20, 0));
        // The copy chunk off: copied bytes go as lent ones, streams are lent.
        let mut o = opts(bbr.clone(), false, None);
        o.paced_copy_chunk = None;
        assert_eq!(
            o.send_chunks_for(&remote),
            chunks(256 << 10, 256 << 10, 256 << 10)
        );
        assert_eq!(o.send_chunks_for(&lo), Chunks::WHOLE);
        // The paced chunk off: lent pages whole towards other hosts too.
        let mut o = opts(bbr.clone(), false, None);
        o.paced_send_chunk = None;
        assert_eq!(
            o.send_chunks_for(&remote),
            chunks(64 << 10, usize::MAX, 64 << 10)
        );
        // Both off: no chunks, no remainder first.
        o.paced_copy_chunk = None;
        assert_eq!(o.send_chunks_for(&remote), Chunks::WHOLE);
        // The receive low-water mark: remainders first up to its size towards other
        // hosts (at least a call's).
        let mut o = opts(bbr.clone(), false, None);
        o.paced_rcvlowat = Some(256 << 10);
        assert_eq!(
            o.send_chunks_for(&remote),
            chunks(64 << 10, 256 << 10, 256 << 10)
        );
        assert_eq!(o.send_chunks_for(&lo), paced_local);
        o.paced_rcvlowat = Some(16 << 10);
        assert_eq!(o.send_chunks_for(&remote), paced_remote);
        // The defaults: under bbr, copied bytes in 64 KiB calls and lent pages whole
        // towards every peer, remainders first towards other hosts within the 256 KiB
        // mark; under reno, whole batches.
        let config = SocketConfig {
            tcp_congestion: bbr,
            ..SocketConfig::default()
        };
        let o = config.sock_opts();
        assert_eq!(o.send_chunks_for(&lo), paced_local);
        assert_eq!(
            o.send_chunks_for(&remote),
            chunks(64 << 10, usize::MAX, 256 << 10)
        );
        let config = SocketConfig {
            tcp_congestion: Congestion::Use("reno".into()),
            ..SocketConfig::default()
        };
        assert_eq!(config.sock_opts().send_chunks_for(&remote), Chunks::WHOLE);
        assert!(paces("bbr") && paces("bbr2") && !paces("cubic") && !paces("reno"));
    }

    /// The receive low-water mark of large records: by default 256 KiB towards other
    /// hosts where the connection's congestion control paces; never towards loopback
    /// peers, never under reno, nor when the setting is off.
    #[test]
    fn the_low_water_mark_follows_the_congestion_control() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let remote: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let opts = |congestion: Congestion, system_paces: bool| SockOpts {
            system_paces,
            ..SocketConfig {
                tcp_congestion: congestion,
                ..SocketConfig::default()
            }
            .sock_opts()
        };
        let bbr = opts(Congestion::Use("bbr".into()), false);
        assert_eq!(bbr.rcvlowat_for(&lo), None);
        assert_eq!(bbr.rcvlowat_for(&remote), Some(256 << 10));
        let auto = opts(Congestion::Auto, true);
        assert_eq!(auto.rcvlowat_for(&lo), None, "reno towards loopback");
        assert_eq!(auto.rcvlowat_for(&remote), Some(256 << 10));
        let reno = opts(Congestion::Use("reno".into()), true);
        assert_eq!(reno.rcvlowat_for(&remote), None);
        let off = SockOpts {
            paced_rcvlowat: None,
            ..opts(Congestion::Use("bbr".into()), true)
        };
        assert_eq!(off.rcvlowat_for(&remote), None);
        let set = SockOpts {
            paced_rcvlowat: Some(64 << 10),
            ..opts(Congestion::System, true)
        };
        assert_eq!(set.rcvlowat_for(&remote), Some(64 << 10));
        assert_eq!(set.rcvlowat_for(&lo), None);
    }
}
