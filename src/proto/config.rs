//! The protocol core's settings: what the engine needs to know, with their table (see
//! [`param`](crate::param)), validated by the core. No I/O here.

use std::path::PathBuf;
use std::time::Duration;

use crate::auth::{AuthMode, JobKey};
use crate::param::{Access, Kind, Param, Params, Unit};
use crate::wire::{PeerId, DEFAULT_TOKEN};

/// Engine parameters (the `core` part of [`Config`](crate::Config)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreConfig {
    /// Our process id (job-unique: the rank).
    pub pid: PeerId,
    /// Job token: both sides of a connection must agree (`RINGBTL_JOB_TOKEN`). A
    /// job-separation id: it is covered by the handshake's MACs, never sent.
    pub token: u64,
    /// The job key both sides of a connection prove they hold (`RINGBTL_JOB_KEY`, 64 hex
    /// digits; never displayed). `None`: the transport takes it from
    /// [`job_key_file`](Self::job_key_file), or later from the launcher
    /// ([`Transport::set_job_key`](crate::Transport::set_job_key)); without any, the
    /// handshake runs with the public key and authenticates nothing.
    pub job_key: Option<JobKey>,
    /// A file holding the job key (`RINGBTL_JOB_KEY_FILE`): a regular file of the user's,
    /// mode 0600 or stricter, read when the transport starts.
    pub job_key_file: Option<PathBuf>,
    /// What to do without a job key (`RINGBTL_AUTH=auto|off|required`).
    pub auth: AuthMode,
    /// Receive cache per connection in bytes (`RINGBTL_RECV_CACHE`, 4 KiB..=64 MiB).
    pub recv_cache: usize,
    /// Largest payload accepted in one frame (`RINGBTL_MAX_FRAME`, 1 KiB..=4 GiB-1).
    pub max_frame: u32,
    /// Payloads up to this many bytes are copied next to their header so that many small
    /// messages leave in one contiguous iovec (at most [`coalesce_bytes`](Self::coalesce_bytes)).
    /// Not a setting: the built-in choice (1 KiB), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub inline_limit: usize,
    /// Byte budget of one gathered send when coalescing queued frames.
    /// Not a setting: the built-in choice (256 KiB), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub coalesce_bytes: usize,
    /// Most iovecs in one gathered send (8..=1024, `IOV_MAX`).
    /// Not a setting: the built-in choice (256), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub max_iov: usize,
    /// Connect attempts before a peer is declared unreachable (`RINGBTL_CONNECT_RETRIES`).
    pub connect_retries: u32,
    /// Delay before the first connect retry; doubles each time, within
    /// [`connect_timeout`](Self::connect_timeout).
    /// Not a setting: the built-in choice (20 ms), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub retry_delay: Duration,
    /// Time allowed for a connection's handshake (`RINGBTL_HANDSHAKE_TIMEOUT_MS`).
    pub handshake_timeout: Duration,
    /// Most incoming connections still in their handshake ("strangers") at once; a
    /// newcomer beyond it is admitted and the oldest stranger is closed instead, so a
    /// flood of idle connections cannot lock a legitimate peer out
    /// (`RINGBTL_MAX_HALF_OPEN`, 1..=1,000,000). The transport lowers it to half of the
    /// process's descriptor limit (`RLIMIT_NOFILE`) where that is smaller.
    pub max_half_open: usize,
    /// Most strangers from one source address at once; a newcomer beyond it closes the
    /// oldest stranger of the same source, so one source cannot evict the others'.
    /// Not a setting: the built-in choice (a quarter of
    /// [`max_half_open`](Self::max_half_open), at least 1), with no variable; public so
    /// that the crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub max_half_open_per_source: usize,
    /// Time an accepted connection has to send its first bytes; after that, the rest of
    /// the handshake has until [`handshake_timeout`](Self::handshake_timeout) from the
    /// accept (`RINGBTL_FIRST_BYTES_MS`).
    pub first_bytes_timeout: Duration,
    /// Time a dialer keeps retrying a connection refused, reset or closed during its
    /// handshake (with a doubling delay from [`retry_delay`](Self::retry_delay)); no
    /// attempt starts after it (`RINGBTL_CONNECT_TIMEOUT_MS`).
    pub connect_timeout: Duration,
    /// A frame whose bytes stop arriving for this long fails its connection
    /// (`RINGBTL_FRAME_STALL_MS`).
    pub frame_stall: Duration,
    /// Bytes (headers and payloads) queued for one peer and not yet handed to the
    /// kernel past which [`Core::send`](crate::proto::core::Core::send) returns
    /// [`SendError::WouldBlock`](crate::error::SendError::WouldBlock); a message is
    /// always accepted when nothing is queued (`RINGBTL_MAX_QUEUED_BYTES`).
    pub max_queued_bytes: u64,
    /// A SEND or PUT whose payload is at least this long lends its pages to the kernel
    /// instead of being copied into the socket (`vmsplice` + `splice`), and completes once
    /// the peer answers with an ACK; `None`: every payload is copied. See
    /// docs/design/large-messages.md.
    /// Not a setting: the built-in choice (128 KiB), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub splice_min: Option<usize>,
    /// A payload longer than this that has other messages queued behind it or lent pages
    /// of its peer ahead of it (a stream's) is not lent whatever
    /// [`splice_min`](Self::splice_min) says: the kernel copies it from the caller's
    /// buffers, and its send completes once the socket took it; `None`: no bound. Lending
    /// moves at most a pipe's capacity per `vmsplice`, so a longer payload waits for the
    /// socket to drain the pipe before its next step. A payload that finds its peer idle
    /// (see [`splice_idle`](Self::splice_idle)) is lent above the bound too. See
    /// docs/design/large-messages.md.
    /// Not a setting: the built-in choice (the lending pipe's capacity, 1 MiB), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub splice_max: Option<usize>,
    /// On the connections the driver names ([`IdleCopy`](crate::proto::core::IdleCopy)):
    /// a payload of [`IDLE_COPY_MIN`] up to this many bytes (with
    /// [`IdleCopy::Paced`](crate::proto::core::IdleCopy) any lent one up to this many and
    /// at most [`IDLE_COPY_PACED_MAX`]) that finds its peer idle (the first frame of its
    /// batch, nothing queued behind it, no lent pages of this peer unacknowledged) is
    /// copied into the socket even when [`splice_min`](Self::splice_min) would lend it;
    /// `None`: lend such payloads too. The transport names the connections whose
    /// congestion control paces, towards other hosts. See docs/design/pacing.md.
    /// Not a setting: the built-in choice (1 MiB), with no variable; public so that the
    /// crate's tests and measurements can vary it.
    #[doc(hidden)]
    pub splice_idle: Option<usize>,
    /// The transport lends pages only while its backend measures a lent byte cheaper to
    /// send than a copied one ([`Core::set_lend_judged`](crate::proto::core::Core::set_lend_judged));
    /// `false`: lending follows [`splice_min`](Self::splice_min) and the connection's
    /// rules alone. See docs/design/large-messages.md.
    /// Not a setting: the built-in choice (judged), with no variable; public so that the
    /// crate's tests of the lending rules can take the machine's verdict out.
    #[doc(hidden)]
    pub splice_judged: bool,
    /// Receives run as one multishot receive per connection on buffers the driver
    /// provides ([`Action::ArmProvided`](crate::proto::core::Action::ArmProvided)),
    /// instead of one [`Action::Receive`](crate::proto::core::Action::Receive) per read.
    /// Not a parameter of its own: the transport sets it when the socket layer's
    /// multishot receive (`RINGBTL_RECV_MULTISHOT`) could be set up, whatever it holds in
    /// [`Config`](crate::Config).
    pub multishot: bool,
}

impl CoreConfig {
    /// Defaults for process `pid`.
    pub fn new(pid: PeerId) -> Self {
        Self {
            pid,
            token: DEFAULT_TOKEN,
            job_key: None,
            job_key_file: None,
            auth: AuthMode::Auto,
            recv_cache: 64 * 1024,
            max_frame: 64 * 1024 * 1024,
            inline_limit: 1024,
            coalesce_bytes: 256 * 1024,
            max_iov: 256,
            connect_retries: 5,
            retry_delay: Duration::from_millis(20),
            handshake_timeout: Duration::from_secs(5),
            max_half_open: 1024,
            max_half_open_per_source: 256,
            first_bytes_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(30),
            frame_stall: Duration::from_secs(60),
            max_queued_bytes: 256 * MIB,
            splice_min: Some(DEFAULT_SPLICE_MIN),
            splice_max: Some(DEFAULT_SPLICE_MAX),
            splice_idle: Some(DEFAULT_SPLICE_IDLE),
            splice_judged: true,
            multishot: false,
        }
    }

    /// Checks every setting against its row of the table, then the relations between
    /// them.
    pub fn validate(&self) -> Result<(), String> {
        self.check_params()?;
        self.check_built_in()
    }

    /// The built-in choices (the fields without a variable) keep within what the engine
    /// handles; code that varies them gets an error, never a misbehaving engine.
    fn check_built_in(&self) -> Result<(), String> {
        let within = |name: &str, v: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} = {v}: expected {lo}..={hi}"))
            }
        };
        within("coalesce_bytes", self.coalesce_bytes, 4 << 10, 64 << 20)?;
        within(
            "inline_limit",
            self.inline_limit,
            0,
            self.coalesce_bytes.min(64 << 10),
        )?;
        within("max_iov", self.max_iov, 8, 1024)?;
        within(
            "max_half_open_per_source",
            self.max_half_open_per_source,
            1,
            usize::MAX,
        )?;
        within(
            "retry_delay",
            self.retry_delay.as_millis() as usize,
            1,
            60_000,
        )?;
        for (name, v) in [
            ("splice_min", self.splice_min),
            ("splice_max", self.splice_max),
            ("splice_idle", self.splice_idle),
        ] {
            if let Some(v) = v {
                within(name, v, 4 << 10, 1 << 32)?;
            }
        }
        Ok(())
    }
}

impl Default for CoreConfig {
    /// Defaults for process 0.
    fn default() -> Self {
        Self::new(PeerId(0))
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Default of [`CoreConfig::splice_min`].
pub const DEFAULT_SPLICE_MIN: usize = 128 * 1024;
/// Default of [`CoreConfig::splice_max`]: the lending pipe's capacity.
pub const DEFAULT_SPLICE_MAX: usize = 1 << 20;
/// Default of [`CoreConfig::splice_idle`].
pub const DEFAULT_SPLICE_IDLE: usize = 1 << 20;
/// The smallest payload [`CoreConfig::splice_idle`] copies but on the connections of
/// [`IdleCopy::Paced`](crate::proto::core::IdleCopy) (which copy every lent one up to
/// their bound): below it lending and copying a ping-pong's message cost the same (see
/// docs/design/pacing.md).
pub const IDLE_COPY_MIN: usize = 256 * 1024;
/// The largest payload [`CoreConfig::splice_idle`] copies on a connection whose congestion
/// control paces its sending (BBR, [`IdleCopy::Paced`](crate::proto::core::IdleCopy)):
/// above it a lent payload arrives sooner than a copied one (see docs/design/pacing.md).
pub const IDLE_COPY_PACED_MAX: usize = 512 * 1024;

fn millis(d: Duration) -> Option<u64> {
    Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Params for CoreConfig {
    const LAYER: &'static str = "core";

    fn params() -> &'static [Param<Self>] {
        &CORE_PARAMS
    }
}

static CORE_PARAMS: [Param<CoreConfig>; 13] = [
    Param {
        name: "token",
        var: "RINGBTL_JOB_TOKEN",
        kind: Kind::Int {
            lo: 0,
            hi: u64::MAX,
            unit: Unit::Hex,
        },
        meaning: "job token both ends of a connection must share",
        site: "launchers without a key store, to keep jobs that share nodes apart",
        access: Access::Num {
            get: |c| Some(c.token),
            put: |c, v| c.token = v.unwrap_or(0),
        },
    },
    Param {
        name: "job_key",
        var: "RINGBTL_JOB_KEY",
        kind: Kind::Secret("64 hex digits (32 bytes)"),
        meaning: "job key that authenticates every connection (shown as `<set>`); under \
                  PMIx and PMI the launcher provides one",
        site: "env + root launches: the job's secret (PMIx and PMI provide one)",
        access: Access::Text {
            get: |c| c.job_key.as_ref().map_or(String::new(), |_| "<set>".into()),
            parse: |c, v| {
                c.job_key = match v.trim() {
                    "" => None,
                    t => Some(JobKey::from_hex(t)?),
                };
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "job_key_file",
        var: "RINGBTL_JOB_KEY_FILE",
        kind: Kind::Text("path of a file of mode 0600 holding the key"),
        meaning: "file holding the job key (when `RINGBTL_JOB_KEY` is unset)",
        site: "env + root launches where other users can read the environment",
        access: Access::Text {
            get: |c| {
                c.job_key_file
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string())
            },
            parse: |c, v| {
                c.job_key_file = match v.trim() {
                    "" => None,
                    t => Some(PathBuf::from(t)),
                };
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "auth",
        var: "RINGBTL_AUTH",
        kind: Kind::Text("auto, off, required"),
        meaning: "without a job key: `auto` says once on stderr that connections are \
                  unauthenticated, `off` keeps quiet, `required` refuses to start",
        site: "sites that must refuse unauthenticated jobs, or closed clusters that need no key",
        access: Access::Text {
            get: |c| c.auth.to_string(),
            parse: |c, v| {
                c.auth = AuthMode::parse(v)
                    .ok_or_else(|| format!("accepted values are {}", AuthMode::ACCEPTED))?;
                Ok(())
            },
            check: |_| Ok(()),
        },
    },
    Param {
        name: "recv_cache",
        var: "RINGBTL_RECV_CACHE",
        kind: Kind::Int {
            lo: 4 * KIB,
            hi: 64 * MIB,
            unit: Unit::Bytes,
        },
        meaning: "receive cache per connection",
        site: "processes with many peers, trading memory against reads",
        access: Access::Num {
            get: |c| Some(c.recv_cache as u64),
            put: |c, v| c.recv_cache = v.unwrap_or(0) as usize,
        },
    },
    Param {
        name: "max_frame",
        var: "RINGBTL_MAX_FRAME",
        kind: Kind::Int {
            lo: KIB,
            hi: u32::MAX as u64,
            unit: Unit::Bytes,
        },
        meaning: "largest message accepted",
        site:
            "applications that send larger messages (the Open MPI component follows its send size)",
        access: Access::Num {
            get: |c| Some(c.max_frame.into()),
            put: |c, v| c.max_frame = v.unwrap_or(0) as u32,
        },
    },
    Param {
        name: "connect_retries",
        var: "RINGBTL_CONNECT_RETRIES",
        kind: Kind::Int {
            lo: 1,
            hi: 1000,
            unit: Unit::Count,
        },
        meaning: "connect attempts before a peer is unreachable",
        site: "clusters whose nodes start or accept slowly",
        access: Access::Num {
            get: |c| Some(c.connect_retries.into()),
            put: |c, v| c.connect_retries = v.unwrap_or(0) as u32,
        },
    },
    Param {
        name: "handshake_timeout",
        var: "RINGBTL_HANDSHAKE_TIMEOUT_MS",
        kind: Kind::Int {
            lo: 10,
            hi: 600_000,
            unit: Unit::Millis,
        },
        meaning: "handshake time limit",
        site: "slow or oversubscribed nodes",
        access: Access::Num {
            get: |c| millis(c.handshake_timeout),
            put: |c, v| c.handshake_timeout = Duration::from_millis(v.unwrap_or(0)),
        },
    },
    Param {
        name: "max_half_open",
        var: "RINGBTL_MAX_HALF_OPEN",
        kind: Kind::Int {
            lo: 1,
            hi: 1_000_000,
            unit: Unit::Count,
        },
        meaning: "incoming connections still in their handshake at once (at most half \
                  the descriptor limit); a newcomer beyond it closes the oldest of them",
        site: "nodes shared with untrusted users, sized to the job's peers",
        access: Access::Num {
            get: |c| Some(c.max_half_open as u64),
            put: |c, v| {
                c.max_half_open = v.unwrap_or(0) as usize;
                c.max_half_open_per_source = (c.max_half_open / 4).max(1);
            },
        },
    },
    Param {
        name: "first_bytes_timeout",
        var: "RINGBTL_FIRST_BYTES_MS",
        kind: Kind::Int {
            lo: 10,
            hi: 600_000,
            unit: Unit::Millis,
        },
        meaning: "time an accepted connection has to send its first bytes",
        site: "high-latency networks, or nodes that must shed idle strangers sooner",
        access: Access::Num {
            get: |c| millis(c.first_bytes_timeout),
            put: |c, v| c.first_bytes_timeout = Duration::from_millis(v.unwrap_or(0)),
        },
    },
    Param {
        name: "connect_timeout",
        var: "RINGBTL_CONNECT_TIMEOUT_MS",
        kind: Kind::Int {
            lo: 10,
            hi: 3_600_000,
            unit: Unit::Millis,
        },
        meaning: "time a dialer retries a connection refused, reset or closed during its \
                  handshake",
        site: "jobs whose ranks start far apart in time",
        access: Access::Num {
            get: |c| millis(c.connect_timeout),
            put: |c, v| c.connect_timeout = Duration::from_millis(v.unwrap_or(0)),
        },
    },
    Param {
        name: "frame_stall",
        var: "RINGBTL_FRAME_STALL_MS",
        kind: Kind::Int {
            lo: 10,
            hi: 3_600_000,
            unit: Unit::Millis,
        },
        meaning: "a frame whose bytes stop arriving this long fails its connection",
        site: "networks with long stalls (failover), or to find a hung peer sooner",
        access: Access::Num {
            get: |c| millis(c.frame_stall),
            put: |c, v| c.frame_stall = Duration::from_millis(v.unwrap_or(0)),
        },
    },
    Param {
        name: "max_queued_bytes",
        var: "RINGBTL_MAX_QUEUED_BYTES",
        kind: Kind::Int {
            lo: 64 * KIB,
            hi: 1 << 40,
            unit: Unit::Bytes,
        },
        meaning: "bytes queued for one peer past which a send returns would-block",
        site: "memory per process against the size of bursts",
        access: Access::Num {
            get: |c| Some(c.max_queued_bytes),
            put: |c, v| c.max_queued_bytes = v.unwrap_or(0),
        },
    },
];
