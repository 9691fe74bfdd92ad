//! Configuration: every parameter is a field settable in code, and most can be
//! overridden from the environment (`RINGBTL_*`, MCA-style) with [`Config::from_env`].
//! A bad value is rejected with an error that names the variable and the accepted range.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use crate::error::Error;
use crate::reactor::BackendKind;
use crate::wire::PeerId;

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
    /// Address to listen on (`127.0.0.1:0` by default: loopback, ephemeral port).
    pub listen: Option<SocketAddr>,
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
    /// Progress mode used by the benchmark and by [`Transport::wait_until`](crate::Transport::wait_until)
    /// (`RINGBTL_PROGRESS=poll|block|spin[:USECS]`, poll by default).
    pub progress: ProgressMode,
}

impl Config {
    /// Defaults for process `pid`.
    pub fn new(pid: PeerId) -> Self {
        Self {
            pid,
            token: 0x5249_4e47_4254_4c00,
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            backend: BackendKind::Auto,
            recv_cache: 64 * 1024,
            max_frame: 64 * 1024 * 1024,
            inline_limit: 1024,
            coalesce_bytes: 256 * 1024,
            max_iov: 256,
            nodelay: true,
            sndbuf: None,
            rcvbuf: None,
            connect_retries: 5,
            retry_delay: Duration::from_millis(20),
            handshake_timeout: Duration::from_secs(5),
            progress: ProgressMode::Poll,
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
        if let Some(v) = var("RINGBTL_LISTEN") {
            self.listen = Some(SocketAddr::from_str(v.trim()).map_err(|e| {
                Error::Config(format!(
                    "RINGBTL_LISTEN={v:?}: expected ip:port (e.g. 127.0.0.1:0): {e}"
                ))
            })?);
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
        if !(8..=1024).contains(&self.max_iov) {
            return Err(Error::Config(format!(
                "max_iov = {} outside 8..=1024",
                self.max_iov
            )));
        }
        if self.connect_retries == 0 {
            return Err(Error::Config("connect_retries must be at least 1".into()));
        }
        Ok(())
    }
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
        ])
        .unwrap();
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
        ] {
            let e = with(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e} should name {k}");
        }
    }
}
