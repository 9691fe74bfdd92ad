//! Configuration: every parameter is a field settable in code, and most can be
//! overridden from the environment (`RINGBTL_*`, MCA-style) with [`Config::from_env`].
//! A bad value is rejected with an error that names the variable and the accepted range.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use crate::error::Error;
use crate::reactor::BackendKind;
use crate::wire::PeerId;
use crate::wireup::ifaces::{IfMatch, IfSelection};

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
    /// Spin time of a bare `spin`: 50 us. A blocking wait costs 36-39 us one-way here (a
    /// cross-core wake-up is 17-35 us of it); spinning at least that long before blocking
    /// keeps the total within twice the best choice made in hindsight (the rent-or-buy
    /// argument), and a small-message round trip in poll mode (6-7 us) fits many times.
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

/// Transport configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// This process's job-unique id (rank).
    pub pid: PeerId,
    /// Job token: both sides of a connection must agree (`RINGBTL_JOB_TOKEN`).
    pub token: u64,
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
    /// Backend choice (`RINGBTL_BACKEND=auto|uring|epoll`).
    pub backend: BackendKind,
    /// Receive cache per connection in bytes (`RINGBTL_RECV_CACHE`, 4 KiB..=64 MiB).
    pub recv_cache: usize,
    /// Largest payload accepted in one frame (`RINGBTL_MAX_FRAME`, 1 KiB..=4 GiB-1).
    pub max_frame: u32,
    /// Payloads up to this many bytes are copied next to their header so that many small
    /// messages leave in one contiguous iovec (`RINGBTL_INLINE`, 0..=64 KiB).
    pub inline_limit: usize,
    /// Byte budget of one gathered send when coalescing queued frames
    /// (`RINGBTL_COALESCE_BYTES`, 4 KiB..=64 MiB).
    pub coalesce_bytes: usize,
    /// Most iovecs in one gathered send (`RINGBTL_MAX_IOV`, 8..=1024, IOV_MAX).
    pub max_iov: usize,
    /// Most bytes handed to the kernel by one send call (`RINGBTL_SEND_CHUNK`,
    /// 4 KiB..=1 GiB, 0 = no limit). A larger batch (a large payload, or many coalesced
    /// frames) leaves in several consecutive calls on the same connection; the bytes on
    /// the wire are the same. Off by default: it paid on loopback only under a pacing
    /// congestion control (BBR), see "Large messages" in the README.
    pub send_chunk: Option<usize>,
    /// TCP congestion control of the connections (`RINGBTL_TCP_CONGESTION`): see
    /// [`Congestion`].
    pub tcp_congestion: Congestion,
    /// TCP_NODELAY (`RINGBTL_NODELAY`, 0/1).
    pub nodelay: bool,
    /// SO_SNDBUF, kernel autotuning when `None` (`RINGBTL_SNDBUF`, 0 = autotune).
    pub sndbuf: Option<usize>,
    /// SO_RCVBUF, kernel autotuning when `None` (`RINGBTL_RCVBUF`, 0 = autotune).
    pub rcvbuf: Option<usize>,
    /// Connect attempts before a peer is declared unreachable (`RINGBTL_CONNECT_RETRIES`).
    pub connect_retries: u32,
    /// Delay before the first retry; doubles each time (`RINGBTL_RETRY_DELAY_MS`).
    pub retry_delay: Duration,
    /// Time allowed for a connection's handshake (`RINGBTL_HANDSHAKE_TIMEOUT_MS`).
    pub handshake_timeout: Duration,
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
    /// payloads on a real NIC (the kernel's measurements put the break-even around
    /// 10-16 KiB); never on loopback, where the kernel copies anyway, so loopback peers
    /// keep plain sends. The epoll backend ignores it.
    pub zerocopy_min: Option<usize>,
    /// Use zero-copy sends on loopback peers too (`RINGBTL_ZEROCOPY_LOOPBACK=0|1`): only
    /// for testing the path, since the kernel then copies and notifies later.
    pub zerocopy_loopback: bool,
    /// Most incoming connections still in their handshake at once; more are closed at
    /// once (`RINGBTL_MAX_HALF_OPEN`, 1..=1,000,000).
    pub max_half_open: usize,
    /// Multishot receive on a ring of provided buffers shared by every connection
    /// (`RINGBTL_RECV_MULTISHOT=0|1`, default off). io_uring backend only, Linux 6.0+;
    /// the epoll backend ignores it, and io_uring falls back to single-shot receives
    /// (with a warning) when the ring cannot be set up.
    ///
    /// Off, each connection has its own [`recv_cache`](Self::recv_cache) (64 KiB by
    /// default) and a poll-mode fast path that reads spun connections directly. On,
    /// receive memory is the shared ring ([`recv_ring_bufs`](Self::recv_ring_bufs) x
    /// [`recv_ring_buf_size`](Self::recv_ring_buf_size)) and frames are parsed in place
    /// in it; the per-connection cache then only holds frames cut between two buffers and
    /// is touched only then. Turn it on for many peers per process (hundreds of
    /// connections, where per-connection caches add up) or many mostly idle connections;
    /// leave it off for the lowest latency with a few peers, since the direct `recv`
    /// fast path is not used and payloads larger than one buffer are copied once out of
    /// the ring.
    pub recv_multishot: bool,
    /// Number of provided buffers in the ring (`RINGBTL_RECV_RING_BUFS`, a power of two
    /// in 1..=32768, default 256).
    pub recv_ring_bufs: u32,
    /// Bytes per provided buffer (`RINGBTL_RECV_RING_BUF_SIZE`, 1 KiB..=1 MiB, default
    /// 16 KiB).
    pub recv_ring_buf_size: usize,
    /// Progress mode used by the benchmark and by
    /// [`Transport::wait_until`](crate::Transport::wait_until)
    /// (`RINGBTL_PROGRESS=poll|block|spin[:USECS]`, poll by default).
    /// [`from_env`](Self::from_env) makes it `Block` when the launcher says this node
    /// runs more of the job's ranks than it has CPUs (see
    /// [`oversubscription`](crate::wireup::env::oversubscription)), unless
    /// `RINGBTL_PROGRESS` is set.
    pub progress: ProgressMode,
}

impl Config {
    /// Defaults for process `pid`.
    pub fn new(pid: PeerId) -> Self {
        Self {
            pid,
            token: 0x5249_4e47_4254_4c00,
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            if_include: Vec::new(),
            if_exclude: Vec::new(),
            ports: None,
            backend: BackendKind::Auto,
            recv_cache: 64 * 1024,
            max_frame: 64 * 1024 * 1024,
            inline_limit: 1024,
            coalesce_bytes: 256 * 1024,
            send_chunk: None,
            tcp_congestion: Congestion::Auto,
            max_iov: 256,
            nodelay: true,
            sndbuf: None,
            rcvbuf: None,
            connect_retries: 5,
            retry_delay: Duration::from_millis(20),
            handshake_timeout: Duration::from_secs(5),
            tcp_user_timeout: Some(Duration::from_secs(30)),
            keepalive: Some(Keepalive::DEFAULT),
            zerocopy_min: None,
            zerocopy_loopback: false,
            max_half_open: 1024,
            progress: ProgressMode::Poll,
            recv_multishot: false,
            recv_ring_bufs: 256,
            recv_ring_buf_size: 16 * 1024,
        }
    }

    /// Applies `RINGBTL_*` overrides from the process environment.
    pub fn from_env(self) -> Result<Self, Error> {
        self.with_vars(|k| std::env::var(k).ok())
    }

    /// Applies overrides from `get` (the environment, or a map in tests).
    pub fn with_vars(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        if let Some(v) = var("RINGBTL_JOB_TOKEN") {
            self.token = parse_u64("RINGBTL_JOB_TOKEN", &v, 0, u64::MAX)?;
        }
        if let Some(v) = var("RINGBTL_BACKEND") {
            self.backend = match v.trim() {
                "auto" => BackendKind::Auto,
                "uring" | "io_uring" => BackendKind::Uring,
                "epoll" => BackendKind::Epoll,
                other => {
                    return Err(Error::Config(format!(
                        "RINGBTL_BACKEND={other:?}: accepted values are auto, uring, epoll"
                    )))
                }
            };
        }
        match IfSelection::from_vars(&get)? {
            IfSelection::Include(l) => (self.if_include, self.if_exclude) = (l, Vec::new()),
            IfSelection::Exclude(l) => (self.if_include, self.if_exclude) = (Vec::new(), l),
            IfSelection::Default => {}
        }
        if let Some(v) = var("RINGBTL_PORT") {
            self.ports = Some(parse_ports(&v)?);
        }
        if let Some(o) = crate::wireup::env::oversubscription(&get) {
            // Spinning ranks on an oversubscribed node starve each other: wait in the
            // kernel unless told otherwise (RINGBTL_PROGRESS below).
            tracing::debug!("{o}: progress mode defaults to block");
            self.progress = ProgressMode::Block;
        }
        if let Some(v) = var("RINGBTL_PROGRESS") {
            self.progress = v
                .parse()
                .map_err(|e| Error::Config(format!("RINGBTL_PROGRESS={e}")))?;
        }
        let kib = 1024u64;
        if let Some(v) = var("RINGBTL_RECV_CACHE") {
            self.recv_cache =
                parse_u64("RINGBTL_RECV_CACHE", &v, 4 * kib, 64 * kib * kib)? as usize;
        }
        if let Some(v) = var("RINGBTL_MAX_FRAME") {
            self.max_frame = parse_u64("RINGBTL_MAX_FRAME", &v, kib, u32::MAX as u64)? as u32;
        }
        if let Some(v) = var("RINGBTL_INLINE") {
            self.inline_limit = parse_u64("RINGBTL_INLINE", &v, 0, 64 * kib)? as usize;
        }
        if let Some(v) = var("RINGBTL_COALESCE_BYTES") {
            self.coalesce_bytes =
                parse_u64("RINGBTL_COALESCE_BYTES", &v, 4 * kib, 64 * kib * kib)? as usize;
        }
        if let Some(v) = var("RINGBTL_TCP_CONGESTION") {
            self.tcp_congestion = match v.trim() {
                "auto" => Congestion::Auto,
                "system" => Congestion::System,
                name if !name.is_empty() && name.len() < 16 && name.is_ascii() => {
                    Congestion::Use(name.to_string())
                }
                other => {
                    return Err(Error::Config(format!(
                        "RINGBTL_TCP_CONGESTION={other:?}: auto, system, or an algorithm \
                         name from net.ipv4.tcp_available_congestion_control"
                    )))
                }
            };
        }
        if let Some(v) = var("RINGBTL_SEND_CHUNK") {
            let n = parse_u64("RINGBTL_SEND_CHUNK", &v, 0, 1 << 30)? as usize;
            if (1..4096).contains(&n) {
                return Err(Error::Config(format!(
                    "RINGBTL_SEND_CHUNK={n}: 0 (no limit) or 4096..=1073741824 bytes"
                )));
            }
            self.send_chunk = (n > 0).then_some(n);
        }
        if let Some(v) = var("RINGBTL_MAX_IOV") {
            self.max_iov = parse_u64("RINGBTL_MAX_IOV", &v, 8, 1024)? as usize;
        }
        if let Some(v) = var("RINGBTL_NODELAY") {
            self.nodelay = parse_u64("RINGBTL_NODELAY", &v, 0, 1)? == 1;
        }
        if let Some(v) = var("RINGBTL_SNDBUF") {
            let n = parse_u64("RINGBTL_SNDBUF", &v, 0, 1 << 30)? as usize;
            self.sndbuf = (n > 0).then_some(n);
        }
        if let Some(v) = var("RINGBTL_RCVBUF") {
            let n = parse_u64("RINGBTL_RCVBUF", &v, 0, 1 << 30)? as usize;
            self.rcvbuf = (n > 0).then_some(n);
        }
        if let Some(v) = var("RINGBTL_CONNECT_RETRIES") {
            self.connect_retries = parse_u64("RINGBTL_CONNECT_RETRIES", &v, 1, 1000)? as u32;
        }
        if let Some(v) = var("RINGBTL_RETRY_DELAY_MS") {
            self.retry_delay =
                Duration::from_millis(parse_u64("RINGBTL_RETRY_DELAY_MS", &v, 1, 60_000)?);
        }
        if let Some(v) = var("RINGBTL_HANDSHAKE_TIMEOUT_MS") {
            self.handshake_timeout =
                Duration::from_millis(parse_u64("RINGBTL_HANDSHAKE_TIMEOUT_MS", &v, 10, 600_000)?);
        }
        if let Some(v) = var("RINGBTL_TCP_USER_TIMEOUT_MS") {
            let ms = parse_u64("RINGBTL_TCP_USER_TIMEOUT_MS", &v, 0, i32::MAX as u64)?;
            self.tcp_user_timeout = (ms > 0).then(|| Duration::from_millis(ms));
        }
        if let Some(v) = var("RINGBTL_KEEPALIVE") {
            self.keepalive = Keepalive::parse("RINGBTL_KEEPALIVE", &v)?;
        }
        if let Some(v) = var("RINGBTL_ZEROCOPY") {
            let n = parse_u64("RINGBTL_ZEROCOPY", &v, 0, 1 << 30)? as usize;
            self.zerocopy_min = (n > 0).then_some(n);
        }
        if let Some(v) = var("RINGBTL_ZEROCOPY_LOOPBACK") {
            self.zerocopy_loopback = parse_u64("RINGBTL_ZEROCOPY_LOOPBACK", &v, 0, 1)? == 1;
        }
        if let Some(v) = var("RINGBTL_MAX_HALF_OPEN") {
            self.max_half_open = parse_u64("RINGBTL_MAX_HALF_OPEN", &v, 1, 1_000_000)? as usize;
        }
        if let Some(v) = var("RINGBTL_RECV_MULTISHOT") {
            self.recv_multishot = parse_u64("RINGBTL_RECV_MULTISHOT", &v, 0, 1)? == 1;
        }
        if let Some(v) = var("RINGBTL_RECV_RING_BUFS") {
            let n = parse_u64("RINGBTL_RECV_RING_BUFS", &v, 1, 32768)?;
            if !n.is_power_of_two() {
                return Err(Error::Config(format!(
                    "RINGBTL_RECV_RING_BUFS={v:?}: expected a power of two in 1..=32768"
                )));
            }
            self.recv_ring_bufs = n as u32;
        }
        if let Some(v) = var("RINGBTL_RECV_RING_BUF_SIZE") {
            self.recv_ring_buf_size =
                parse_u64("RINGBTL_RECV_RING_BUF_SIZE", &v, kib, kib * kib)? as usize;
        }
        if let Some(v) = var("RINGBTL_LISTEN") {
            self.listen = match v.trim() {
                "auto" => None,
                t => Some(SocketAddr::from_str(t).map_err(|e| {
                    Error::Config(format!(
                        "RINGBTL_LISTEN={v:?}: expected ip:port (e.g. 127.0.0.1:0) or auto: {e}"
                    ))
                })?),
            };
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks the relations between fields.
    pub fn validate(&self) -> Result<(), Error> {
        if self.recv_cache < 4096 {
            return Err(Error::Config(format!(
                "recv_cache = {} is below the minimum of 4096 bytes",
                self.recv_cache
            )));
        }
        if self.inline_limit > self.coalesce_bytes {
            return Err(Error::Config(format!(
                "inline_limit ({}) must not exceed coalesce_bytes ({})",
                self.inline_limit, self.coalesce_bytes
            )));
        }
        if let Some(n) = self.send_chunk.filter(|n| !(4096..=1 << 30).contains(n)) {
            return Err(Error::Config(format!(
                "send_chunk = {n} outside 4096..=1073741824 (None for no limit)"
            )));
        }
        if !(8..=1024).contains(&self.max_iov) {
            return Err(Error::Config(format!(
                "max_iov = {} outside 8..=1024",
                self.max_iov
            )));
        }
        if self.recv_ring_bufs == 0
            || self.recv_ring_bufs > 32768
            || !self.recv_ring_bufs.is_power_of_two()
        {
            return Err(Error::Config(format!(
                "recv_ring_bufs = {} is not a power of two in 1..=32768",
                self.recv_ring_bufs
            )));
        }
        if !(1024..=1 << 20).contains(&self.recv_ring_buf_size) {
            return Err(Error::Config(format!(
                "recv_ring_buf_size = {} outside 1024..=1048576",
                self.recv_ring_buf_size
            )));
        }
        if self.connect_retries == 0 {
            return Err(Error::Config("connect_retries must be at least 1".into()));
        }
        if !self.if_include.is_empty() && !self.if_exclude.is_empty() {
            return Err(Error::Config(
                "if_include and if_exclude are both set (RINGBTL_IF_INCLUDE / \
                 RINGBTL_IF_EXCLUDE); give only one"
                    .into(),
            ));
        }
        if let Some(t) = self.tcp_user_timeout {
            if t.is_zero() || t.as_millis() > i32::MAX as u128 {
                return Err(Error::Config(format!(
                    "tcp_user_timeout = {t:?}: expected 1 ms..={} ms, or None",
                    i32::MAX
                )));
            }
        }
        if let Some(k) = &self.keepalive {
            k.validate()?;
        }
        if let Some((lo, hi)) = self.ports {
            if lo == 0 || lo > hi {
                return Err(Error::Config(format!(
                    "ports = {lo}-{hi}: expected 1 <= lo <= hi <= 65535"
                )));
            }
        }
        Ok(())
    }

    /// The interface selection of [`if_include`](Self::if_include) /
    /// [`if_exclude`](Self::if_exclude).
    pub fn if_selection(&self) -> Result<IfSelection, Error> {
        IfSelection::from_lists(&self.if_include, &self.if_exclude)
    }
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
}

/// TCP keepalive parameters (`TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT`).
///
/// Without a user timeout, a connection idle for `idle` is probed every `interval` and
/// aborted with `ETIMEDOUT` after `count` unanswered probes: a dead peer is found in
/// `idle + interval * count`. With [`Config::tcp_user_timeout`] set, the kernel ends
/// the probing by that timeout instead of by the count.
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
    pub fn parse(name: &str, v: &str) -> Result<Option<Self>, Error> {
        let t = v.trim();
        if t == "0" {
            return Ok(None);
        }
        let parts: Vec<&str> = t.split(',').collect();
        let [idle, intvl, cnt] = parts[..] else {
            return Err(Error::Config(format!(
                "{name}={v:?}: expected idle_s,intvl_s,cnt (e.g. 10,2,5) or 0 for off"
            )));
        };
        let num = |what: &str, x: &str, hi: u64| {
            parse_u64(name, x, 1, hi).map_err(|_| {
                Error::Config(format!(
                    "{name}={v:?}: {what} must be an integer in 1..={hi} \
                     (idle_s,intvl_s,cnt, or 0 for off)"
                ))
            })
        };
        Ok(Some(Self {
            idle: Duration::from_secs(num("idle_s", idle, Self::MAX_SECS)?),
            interval: Duration::from_secs(num("intvl_s", intvl, Self::MAX_SECS)?),
            count: num("cnt", cnt, Self::MAX_COUNT.into())? as u32,
        }))
    }

    fn validate(&self) -> Result<(), Error> {
        let secs = 1..=Self::MAX_SECS;
        let whole = |d: Duration| d.subsec_nanos() == 0 && secs.contains(&d.as_secs());
        if !whole(self.idle)
            || !whole(self.interval)
            || !(1..=Self::MAX_COUNT).contains(&self.count)
        {
            return Err(Error::Config(format!(
                "keepalive = {self:?}: idle and interval must be whole seconds in 1..={}, \
                 count in 1..={}",
                Self::MAX_SECS,
                Self::MAX_COUNT
            )));
        }
        Ok(())
    }
}

/// Parses `RINGBTL_PORT`: a port (`40000`) or an inclusive range (`40000-40099`).
fn parse_ports(v: &str) -> Result<(u16, u16), Error> {
    let bad = || {
        Error::Config(format!(
            "RINGBTL_PORT={v:?}: expected a port or a range lo-hi, within 1..=65535"
        ))
    };
    let port = |t: &str| t.trim().parse::<u16>().ok().filter(|&p| p > 0);
    let (lo, hi) = match v.trim().split_once('-') {
        Some((a, b)) => (port(a).ok_or_else(bad)?, port(b).ok_or_else(bad)?),
        None => {
            let p = port(v).ok_or_else(bad)?;
            (p, p)
        }
    };
    if lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// Parses an integer (decimal, `0x` hex, or with a `k`/`m`/`g` binary suffix) in `lo..=hi`.
pub(crate) fn parse_u64(name: &str, v: &str, lo: u64, hi: u64) -> Result<u64, Error> {
    let t = v.trim().to_ascii_lowercase();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some(b'm') => (&t[..t.len() - 1], 1 << 20),
        Some(b'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (&t[..], 1),
    };
    let n = if let Some(h) = digits.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else {
        digits.parse::<u64>().ok()
    }
    .and_then(|n| n.checked_mul(mult));
    match n {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(Error::Config(format!(
            "{name}={v:?}: expected an integer in {lo}..={hi}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            ("RINGBTL_NODELAY", "0"),
            ("RINGBTL_SNDBUF", "0x10000"),
            ("RINGBTL_CONNECT_RETRIES", "3"),
            ("RINGBTL_RECV_MULTISHOT", "1"),
            ("RINGBTL_RECV_RING_BUFS", "64"),
            ("RINGBTL_RECV_RING_BUF_SIZE", "4k"),
            ("RINGBTL_SEND_CHUNK", "1m"),
            ("RINGBTL_TCP_CONGESTION", "cubic"),
        ])
        .unwrap();
        assert_eq!(c.tcp_congestion, Congestion::Use("cubic".into()));
        let sys = with(&[("RINGBTL_TCP_CONGESTION", "system")]).unwrap();
        assert_eq!(sys.tcp_congestion, Congestion::System);
        assert_eq!(with(&[]).unwrap().tcp_congestion, Congestion::Auto);
        assert_eq!(c.send_chunk, Some(1 << 20));
        assert_eq!(
            with(&[("RINGBTL_SEND_CHUNK", "0")]).unwrap().send_chunk,
            None
        );
        assert!(c.recv_multishot);
        assert_eq!((c.recv_ring_bufs, c.recv_ring_buf_size), (64, 4096));
        assert_eq!(c.recv_cache, 128 * 1024);
        assert_eq!(c.backend, BackendKind::Epoll);
        assert!(!c.nodelay);
        assert_eq!(c.sndbuf, Some(65536));
        assert_eq!(c.connect_retries, 3);
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
            ("RINGBTL_NODELAY", "2"),
            ("RINGBTL_LISTEN", "nowhere"),
            ("RINGBTL_PROGRESS", "sometimes"),
            ("RINGBTL_PORT", "0"),
            ("RINGBTL_PORT", "70000"),
            ("RINGBTL_PORT", "5000-4000"),
            ("RINGBTL_PORT", "1-2-3"),
            ("RINGBTL_PORT", "http"),
            ("RINGBTL_IF_INCLUDE", "10.0.0.0/99"),
            ("RINGBTL_RECV_MULTISHOT", "yes"),
            ("RINGBTL_RECV_RING_BUFS", "100"),
            ("RINGBTL_RECV_RING_BUF_SIZE", "512"),
            ("RINGBTL_SEND_CHUNK", "100"),
            ("RINGBTL_SEND_CHUNK", "2g"),
            ("RINGBTL_TCP_CONGESTION", "a-name-far-too-long"),
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
        assert_eq!(c.listen, None);
        assert_eq!(c.ports, Some((40000, 40099)));
        assert_eq!(c.if_include.len(), 2);
        assert!(c.if_exclude.is_empty());
        assert!(matches!(c.if_selection().unwrap(), IfSelection::Include(_)));
        let c = with(&[("RINGBTL_IF_EXCLUDE", "docker0"), ("RINGBTL_PORT", "7")]).unwrap();
        assert_eq!(c.ports, Some((7, 7)));
        assert_eq!(c.if_exclude.len(), 1);
        assert_eq!(c.listen, Config::new(PeerId(0)).listen);
        let e = with(&[("RINGBTL_IF_INCLUDE", "lo"), ("RINGBTL_IF_EXCLUDE", "eth0")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("RINGBTL_IF_INCLUDE") && e.contains("RINGBTL_IF_EXCLUDE"),
            "{e}"
        );
        let mut c = Config::new(PeerId(0));
        c.if_include = vec!["lo".parse().unwrap()];
        c.if_exclude = vec!["eth0".parse().unwrap()];
        assert!(c.validate().is_err());
        c.if_exclude.clear();
        c.ports = Some((9, 8));
        assert!(c.validate().is_err());
    }

    #[test]
    fn dead_peer_detection_settings() {
        let d = with(&[]).unwrap();
        assert_eq!(d.tcp_user_timeout, Some(Duration::from_secs(30)));
        assert_eq!(d.keepalive, Some(Keepalive::DEFAULT));
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
        assert_eq!(c.tcp_user_timeout, Some(Duration::from_secs(2)));
        assert_eq!(
            c.keepalive,
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
        assert_eq!(off.tcp_user_timeout, None);
        assert_eq!(off.keepalive, None);
        // An empty value leaves the default, as for every variable.
        assert_eq!(
            with(&[("RINGBTL_KEEPALIVE", "")]).unwrap().keepalive,
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
        c.keepalive = Some(Keepalive {
            interval: Duration::from_millis(1500),
            ..Keepalive::DEFAULT
        });
        assert!(c.validate().is_err(), "sub-second keepalive interval");
        c.keepalive = None;
        c.tcp_user_timeout = Some(Duration::ZERO);
        assert!(c.validate().is_err(), "zero user timeout");
        c.tcp_user_timeout = Some(Duration::from_millis(1));
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
}
