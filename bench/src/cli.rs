//! Command line: clap derive, size lists, OSU iteration defaults.

use clap::{Args, Parser, Subcommand, ValueEnum};
use ringbtl::{BackendKind, Config, PeerId, ProgressMode, Transport};

use crate::plain::BaseOpts;
use crate::stream::StreamArgs;

/// Largest message the benchmark accepts (buffers are allocated up front).
pub(crate) const MAX_SIZE: usize = 1 << 30;
/// OSU's `LARGE_MESSAGE_SIZE`: above it the default iteration counts drop.
pub(crate) const LARGE_MESSAGE_SIZE: usize = 8192;

#[derive(Parser, Debug)]
#[command(
    name = "ringbtl-bench",
    version,
    about = "OSU-style benchmarks for ringbtl, the io_uring TCP byte-transfer layer",
    long_about = "OSU-style benchmarks for ringbtl, the io_uring TCP byte-transfer layer.\n\n\
        Run alone, the benchmark starts its own peer process (rank 1) on loopback; with no \
        subcommand it runs `latency`.",
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    /// Print every RINGBTL_* variable with its value and where the value came from
    /// (default, environment, or code: this command line's --mode / --backend), then
    /// exit. The output can be sourced by a shell.
    #[arg(long, global = true)]
    pub(crate) print_config: bool,

    #[command(subcommand)]
    pub(crate) command: Option<Cmd>,
    #[command(flatten)]
    pub(crate) latency: LatencyArgs,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// Ping-pong latency, one-way = round trip / 2 (the default).
    Latency(LatencyArgs),
    /// Streaming bandwidth (osu_bw): windows of non-blocking sends, each acknowledged.
    Bw(StreamArgs),
    /// Message rate and bandwidth per size (osu_mbw_mr), summed over the rank pairs.
    Rate(StreamArgs),
    /// Every rank sends checked messages to every other rank; prints wire-up and
    /// exchange times (under mpirun / mpiexec / srun / RINGBTL_ROOT, or with --np).
    Alltoall(AlltoallArgs),
}

/// Options of `ringbtl-bench alltoall`.
#[derive(Args, Debug, Clone)]
pub(crate) struct AlltoallArgs {
    /// Ranks to start on this host when not run under a launcher.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=1024))]
    pub(crate) np: u32,

    /// Message sizes (as for latency). [default: 8,64K,1M]
    #[arg(long, value_name = "LIST|MIN:MAX", value_parser = parse_sizes)]
    pub(crate) sizes: Option<SizeList>,

    /// A halo exchange instead: each rank sends to and receives from its N ring
    /// neighbours only (N even: the N/2 ranks on each side), all at once.
    #[arg(long, value_name = "N", value_parser = parse_neighbours)]
    pub(crate) neighbours: Option<u32>,

    /// Messages of each size from every rank to every other rank.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) rounds: u32,

    /// poll, block, spin or spin:USECS [default: RINGBTL_PROGRESS, else block when the
    /// node is oversubscribed, else poll]
    #[arg(long, value_name = "poll|block|spin[:USECS]", value_parser = parse_mode)]
    pub(crate) mode: Option<ProgressMode>,

    /// Backend [default: RINGBTL_BACKEND, else auto]
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub(crate) backend: Option<BackendArg>,

    /// Give up after this many seconds in any phase (each window of a stream is a phase).
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) timeout: u64,

    /// Wire-up: every rank sends to every other at once, so that both ranks of each pair
    /// dial and one dial is refused as a simultaneous connect (default: the lower rank
    /// of each pair dials, the higher answers on that connection).
    #[arg(long)]
    pub(crate) simultaneous: bool,
}

impl AlltoallArgs {
    /// Sizes to run, in order.
    pub(crate) fn sizes(&self) -> Vec<usize> {
        match &self.sizes {
            Some(s) => s.0.clone(),
            None => vec![8, 64 << 10, 1 << 20],
        }
    }
}

/// `--fresh`: the arena of `size`-byte messages that the iterations cycle through holds
/// this many, 64 MiB worth and at least 8.
pub(crate) fn fresh_slots(size: usize) -> usize {
    ((64 << 20) / size.max(1)).max(8)
}

/// How each iteration of `latency` moves its messages.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pattern {
    /// `--exchange`: both ranks send at once.
    pub(crate) exchange: bool,
    /// `--fresh`: every iteration sends from another slice of an arena
    /// ([`fresh_slots`]).
    pub(crate) fresh: bool,
}

impl LatencyArgs {
    /// The pattern `--exchange` and `--fresh` choose.
    pub(crate) fn pattern(&self) -> Pattern {
        Pattern {
            exchange: self.exchange,
            fresh: self.fresh,
        }
    }

    /// How the baseline socket moves messages (`--baseline-no-lowat`, `--baseline-framed`).
    pub(crate) fn base_opts(&self) -> BaseOpts {
        BaseOpts {
            lowat: !self.baseline_no_lowat,
            framed: self.baseline_framed,
        }
    }
}

/// `--neighbours`: an even count from 2.
fn parse_neighbours(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if n >= 2 && n % 2 == 0 && n <= 1024 => Ok(n),
        _ => Err(format!("{v:?}: an even number of neighbours, 2 to 1024")),
    }
}

/// Options of `ringbtl-bench latency`.
#[derive(Args, Debug, Clone)]
pub(crate) struct LatencyArgs {
    #[command(flatten)]
    pub(crate) counts: SizeArgs,

    #[command(flatten)]
    pub(crate) run: RunArgs,

    /// Also run a plain-socket ping-pong (TCP_NODELAY, same mode, sizes, process pair and
    /// cores) and print the ratio ringbtl / baseline.
    #[arg(long)]
    pub(crate) baseline: bool,

    /// Run only the plain-socket ping-pong (no ringbtl transport is created).
    #[arg(long, conflicts_with_all = ["baseline", "backend"])]
    pub(crate) baseline_only: bool,

    /// Exchange instead of ping-pong: in each iteration both ranks send a message at once
    /// and wait for the other's (a halo exchange, as `MPI_Sendrecv`); the columns are the
    /// time per exchange, not half of it. With the benchmark's own peer (not under a
    /// launcher); `--baseline` exchanges over a plain socket the same way.
    #[arg(long)]
    pub(crate) exchange: bool,

    /// Send from fresh buffers: each iteration's message is another slice of an arena of
    /// 64 MiB (at least 8 messages), as `ringbtl_patterns -f` does under MPI, so that no
    /// payload is sent again while it is cache-hot. The plain-socket baseline also
    /// receives into the arena's slices; ringbtl receives into buffers of its own either
    /// way. Default: every iteration sends the same buffer.
    #[arg(long)]
    pub(crate) fresh: bool,

    /// Block-mode baseline without SO_RCVLOWAT (woken per arriving segment instead of
    /// once per message).
    #[arg(long)]
    pub(crate) baseline_no_lowat: bool,

    /// The baseline moves ringbtl's frame, not only the payload: each plain message is
    /// the payload behind a header of ringbtl's length (8 bytes), sent in one call, so that
    /// both series put the same bytes on the wire per message. Separates ringbtl's own
    /// cost from the kernel's for its framing (a payload of a multiple of the page size
    /// fills its pages exactly; with a header it spills into one more).
    #[arg(long)]
    pub(crate) baseline_framed: bool,

    /// Interleave the series: run each size's iterations in N rounds, every series (each
    /// backend, the baseline) taking its share in turn, each round after a warm-up of its
    /// own (the first with the whole warm-up, the others with 1/N of it); the statistics
    /// pool a series' rounds. A machine whose speed changes during the run then slows
    /// every series alike, which keeps the ratios. With the benchmark's own peer.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub(crate) rounds: u64,

    /// Require a launcher (mpirun, mpiexec, srun, RINGBTL_ROOT): fail instead of starting
    /// a peer when none is found. Under a launcher this is automatic.
    #[arg(long, hide = true)]
    pub(crate) mpi: bool,
}

/// Options every two-rank benchmark (`latency`, `bw`, `rate`) takes: the message sizes
/// and how many times each is run, measured and not. A count is of round trips for
/// `latency` and of windows for `bw` and `rate`; each command has its own defaults
/// ([`counts`](Self::counts)), which its help states.
#[derive(Args, Debug, Clone)]
pub(crate) struct SizeArgs {
    /// Message sizes: a list (`0,8,64K,1M`) or a doubling range (`1:4M`).
    /// Suffixes K, M, G are binary (KiB, MiB, GiB). [default: 1:4M]
    #[arg(long, value_name = "LIST|MIN:MAX", value_parser = parse_sizes)]
    pub(crate) sizes: Option<SizeList>,

    /// Measured iterations per size [default: 10000 up to 8 KiB, 1000 above (OSU)].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub(crate) iters: Option<u64>,

    /// Warm-up iterations per size, not measured [default: 100 up to 8 KiB, 10 above].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub(crate) warmup: Option<u64>,

    /// Divide the default iteration and warm-up counts by 10 (smoke runs).
    #[arg(long)]
    pub(crate) quick: bool,
}

impl SizeArgs {
    /// Sizes to run, in order: `--sizes`, else 1 B .. 4 MiB doubling.
    pub(crate) fn sizes(&self) -> Vec<usize> {
        sizes_or_default(self.sizes.as_ref())
    }

    /// (warm-up, measured) counts for `size`, given the command's defaults up to
    /// [`LARGE_MESSAGE_SIZE`] and above it (see [`counts`]).
    pub(crate) fn counts(&self, size: usize, defaults: [(u64, u64); 2]) -> (u64, u64) {
        counts(size, defaults, self.quick, self.warmup, self.iters)
    }
}

/// Options every two-rank benchmark (`latency`, `bw`, `rate`) takes: how to progress,
/// which transports, pinning, output format, time limit, and the hidden rank-1 marker.
#[derive(Args, Debug, Clone)]
pub(crate) struct RunArgs {
    /// poll: spin on non-blocking progress (HPC default); block: wait in the kernel;
    /// spin or spin:USECS: spin USECS (50) after the last event, then wait in the kernel.
    /// [default: RINGBTL_PROGRESS, else poll]
    #[arg(long, value_name = "poll|block|spin[:USECS]", value_parser = parse_mode)]
    pub(crate) mode: Option<ProgressMode>,

    /// Backend; `both` runs uring then epoll for each size and prints them side by side.
    /// [default: RINGBTL_BACKEND, else auto]
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub(crate) backend: Option<BackendArg>,

    /// Pin rank 0 to CPU 0 and rank 1 to CPU 1.
    #[arg(long)]
    pub(crate) pin: bool,

    /// One JSON object per line (per backend and size) instead of the OSU table.
    #[arg(long)]
    pub(crate) json: bool,

    /// Give up on a size (and abort the run) after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) timeout: u64,

    /// Start the peer (rank 1) through this command, words separated by spaces, which must
    /// end by running its arguments in the same process (`exec`), as `ip netns exec NS`,
    /// `taskset -c 1` and `env VAR=VALUE` do: e.g. `--peer-cmd "ip netns exec h1 env
    /// RINGBTL_LISTEN=10.0.0.2:0"` puts it on another (namespace) host, with the
    /// RINGBTL_LISTEN of this process naming this side's address; the plain-socket
    /// baseline then listens on that address too.
    #[arg(long, value_name = "CMD")]
    pub(crate) peer_cmd: Option<String>,

    /// Internal: run as rank 1 under the rank-0 process with this pid.
    #[arg(long, hide = true, value_name = "PARENT_PID")]
    pub(crate) internal_peer: Option<u32>,
}

impl RunArgs {
    /// The mode: `--mode`, else `RINGBTL_PROGRESS`, else poll.
    pub(crate) fn mode(&self) -> Result<ProgressMode, String> {
        match self.mode {
            Some(m) => Ok(m),
            None => Ok(env_config()?.progress),
        }
    }

    /// The transports to create, in run order: `--backend`, else `RINGBTL_BACKEND`, else
    /// auto.
    pub(crate) fn backends(&self) -> Result<Vec<BackendKind>, String> {
        Ok(match self.backend {
            Some(BackendArg::Auto) => vec![BackendKind::Auto],
            Some(BackendArg::Uring) => vec![BackendKind::Uring],
            Some(BackendArg::Epoll) => vec![BackendKind::Epoll],
            Some(BackendArg::Both) => vec![BackendKind::Uring, BackendKind::Epoll],
            None => vec![env_config()?.socket.backend],
        })
    }
}

/// The defaults `RINGBTL_*` environment variables give.
pub(crate) fn env_config() -> Result<Config, String> {
    Config::new(PeerId(0)).from_env().map_err(|e| e.to_string())
}

/// Rank `rank`'s transport: the configuration from the environment, with `backend` and
/// `mode`.
pub(crate) fn transport(
    rank: u32,
    backend: BackendKind,
    mode: ProgressMode,
) -> Result<Transport, String> {
    let mut cfg = Config::new(PeerId(rank))
        .from_env()
        .map_err(|e| e.to_string())?;
    cfg.socket.backend = backend;
    cfg.progress = mode;
    if cfg.core.job_key.is_none() && cfg.core.job_key_file.is_none() {
        // The two processes of a self-started run share a key: drawn by rank 0, handed
        // to rank 1 in its environment (see `PeerProc::spawn`).
        cfg.core.job_key = Some(run_key()?);
    }
    Transport::new(cfg).map_err(|e| format!("creating the transport: {e}"))
}

/// The job key of a self-started two-process run: rank 0 draws it once; rank 1 was given
/// it in `RINGBTL_JOB_KEY`.
pub(crate) fn run_key() -> Result<ringbtl::auth::JobKey, String> {
    static KEY: std::sync::OnceLock<ringbtl::auth::JobKey> = std::sync::OnceLock::new();
    if let Some(k) = KEY.get() {
        return Ok(k.clone());
    }
    let k = ringbtl::auth::JobKey::generate().map_err(|e| e.to_string())?;
    Ok(KEY.get_or_init(|| k).clone())
}

/// The iteration counts for a header: `N (warm-up W)`, or, when `sizes` has sizes on
/// both sides of [`LARGE_MESSAGE_SIZE`] and the counts differ, the counts up to it and
/// above it.
pub(crate) fn describe_counts(sizes: &[usize], counts: impl Fn(usize) -> (u64, u64)) -> String {
    let small = counts(0);
    let large = counts(LARGE_MESSAGE_SIZE + 1);
    let has_small = sizes.iter().any(|&s| s <= LARGE_MESSAGE_SIZE);
    let has_large = sizes.iter().any(|&s| s > LARGE_MESSAGE_SIZE);
    let one = |(w, n): (u64, u64)| format!("{n} (warm-up {w})");
    if has_small && has_large && small != large {
        format!(
            "{} up to {LARGE_MESSAGE_SIZE} bytes, {} above",
            one(small),
            one(large)
        )
    } else if has_large {
        one(large)
    } else {
        one(small)
    }
}

/// `sizes`, else 1 B .. 4 MiB doubling (OSU's range).
pub(crate) fn sizes_or_default(sizes: Option<&SizeList>) -> Vec<usize> {
    match sizes {
        Some(s) => s.0.clone(),
        None => doubling(1, 4 << 20),
    }
}

/// (warm-up, measured) counts for `size`: `warmup` and `iters` where given, else the
/// defaults (warm-up, measured) up to [`LARGE_MESSAGE_SIZE`] (`defaults[0]`) or above it
/// (`defaults[1]`), a tenth of them with `quick` (at least one measured).
pub(crate) fn counts(
    size: usize,
    defaults: [(u64, u64); 2],
    quick: bool,
    warmup: Option<u64>,
    iters: Option<u64>,
) -> (u64, u64) {
    let (w, n) = defaults[usize::from(size > LARGE_MESSAGE_SIZE)];
    let div = if quick { 10 } else { 1 };
    (warmup.unwrap_or(w / div), iters.unwrap_or((n / div).max(1)))
}

/// `--print-config`: the configuration a rank of this command line starts from (the
/// environment's, then `--mode` and a single `--backend`), one parameter per line as
/// `VARIABLE=value`, after a comment that names the setting, what it does, its type and
/// range, its default and where the value came from.
pub(crate) fn print_config(cli: &Cli) -> Result<(), String> {
    let (mode, backend) = match &cli.command {
        None => (cli.latency.run.mode, cli.latency.run.backend),
        Some(Cmd::Latency(a)) => (a.run.mode, a.run.backend),
        Some(Cmd::Bw(a) | Cmd::Rate(a)) => (a.run.mode, a.run.backend),
        Some(Cmd::Alltoall(a)) => (a.mode, a.backend),
    };
    let mut cfg = env_config()?;
    if let Some(m) = mode {
        cfg.progress = m;
    }
    match backend {
        Some(BackendArg::Auto) => cfg.socket.backend = BackendKind::Auto,
        Some(BackendArg::Uring) => cfg.socket.backend = BackendKind::Uring,
        Some(BackendArg::Epoll) => cfg.socket.backend = BackendKind::Epoll,
        Some(BackendArg::Both) | None => {}
    }
    let mut out = format!(
        "# ringbtl {} configuration: VARIABLE=value  # origin (default, environment or \
         code), setting, type and range, default when the value is not\n",
        env!("CARGO_PKG_VERSION")
    );
    if backend == Some(BackendArg::Both) {
        out += "# --backend both: the series run with RINGBTL_BACKEND=uring, then epoll\n";
    }
    let settings = cfg.settings();
    let assign = |s: &ringbtl::Setting| format!("{}={}", s.var, s.value);
    let width = settings.iter().map(|s| assign(s).len()).max().unwrap_or(0);
    let name = |s: &ringbtl::Setting| format!("{}.{}", s.layer, s.name);
    let swidth = settings.iter().map(|s| name(s).len()).max().unwrap_or(0);
    for s in &settings {
        let setting = name(s);
        let default = match (&s.origin, s.default.as_str()) {
            (ringbtl::Origin::Default, _) => String::new(),
            (_, "") => " (default unset)".to_owned(),
            (_, d) => format!(" (default {d})"),
        };
        out += &format!(
            "{:width$}  # {:<11}  {setting:swidth$}  {}{default}\n",
            assign(s),
            s.origin.to_string(),
            s.kind,
        );
    }
    use std::io::Write;
    std::io::stdout()
        .write_all(out.as_bytes())
        .map_err(|e| format!("--print-config: {e}"))
}

/// Parses `--mode` (the syntax of `RINGBTL_PROGRESS`).
pub(crate) fn parse_mode(s: &str) -> Result<ProgressMode, String> {
    s.parse()
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendArg {
    Auto,
    Uring,
    Epoll,
    Both,
}

/// A parsed `--sizes` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SizeList(pub(crate) Vec<usize>);

impl LatencyArgs {
    /// The transports to create, in run order: none with `--baseline-only`, else as
    /// [`RunArgs::backends`].
    pub(crate) fn backends(&self) -> Result<Vec<BackendKind>, String> {
        if self.baseline_only {
            return Ok(Vec::new());
        }
        self.run.backends()
    }

    /// Sizes to run, in order.
    pub(crate) fn sizes(&self) -> Vec<usize> {
        self.counts.sizes()
    }

    /// (warm-up, measured iterations) for `size`.
    pub(crate) fn counts(&self, size: usize) -> (u64, u64) {
        self.counts.counts(size, [(100, 10_000), (10, 1_000)])
    }
}

fn doubling(lo: usize, hi: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut x = lo;
    if x == 0 {
        v.push(0);
        x = 1;
    }
    while x <= hi {
        v.push(x);
        x *= 2;
    }
    v
}

/// Parses `64`, `64K`, `64KiB`, `1M`, `1g` (binary multiples).
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, mult) = match body.as_bytes().last() {
        Some(b'k') => (&body[..body.len() - 1], 1usize << 10),
        Some(b'm') => (&body[..body.len() - 1], 1 << 20),
        Some(b'g') => (&body[..body.len() - 1], 1 << 30),
        _ => (body, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{t:?} is not a size (examples: 0, 8, 64K, 1M, 4MiB)"
        ));
    }
    let n = digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n <= MAX_SIZE)
        .ok_or_else(|| format!("{t:?} is larger than the maximum of 1G"))?;
    Ok(n)
}

/// Parses a `--sizes` value: `A,B,C` or `MIN:MAX` (doubling from MIN; 0 then 1, 2, 4...).
pub(crate) fn parse_sizes(s: &str) -> Result<SizeList, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty size list".into());
    }
    let v = if let Some((a, b)) = s.split_once(':') {
        let (lo, hi) = (parse_size(a)?, parse_size(b)?);
        if lo > hi {
            return Err(format!("range {s:?}: {lo} is above {hi}"));
        }
        doubling(lo, hi)
    } else {
        s.split(',')
            .map(parse_size)
            .collect::<Result<Vec<_>, _>>()?
    };
    if v.len() > 256 {
        return Err(format!("{} sizes; at most 256", v.len()));
    }
    Ok(SizeList(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_sizes("1,8,64K,1M").unwrap().0, [1, 8, 65536, 1 << 20]);
        assert_eq!(parse_sizes("0:4").unwrap().0, [0, 1, 2, 4]);
        assert_eq!(parse_sizes("1:4M").unwrap().0.len(), 23);
        assert_eq!(parse_sizes("3:20").unwrap().0, [3, 6, 12]);
        assert_eq!(parse_sizes("4KiB,2mb").unwrap().0, [4096, 2 << 20]);
        for bad in ["", "x", "1,,2", "8:4", "2G", "-1", "1.5K", "K"] {
            assert!(parse_sizes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn osu_counts() {
        let cli = Cli::try_parse_from(["b"]).unwrap();
        let a = cli.latency;
        assert_eq!(a.counts(8192), (100, 10_000));
        assert_eq!(a.counts(8193), (10, 1_000));
        assert_eq!(a.sizes().first(), Some(&1));
        assert_eq!(a.sizes().last(), Some(&(4 << 20)));
        let q = Cli::try_parse_from(["b", "--quick", "--iters", "7"]).unwrap();
        assert_eq!(q.latency.counts(8), (10, 7));
        assert_eq!(q.latency.counts(1 << 20), (1, 7));
    }

    #[test]
    fn subcommand_is_optional() {
        let a = Cli::try_parse_from(["b", "--pin"]).unwrap();
        assert!(a.command.is_none() && a.latency.run.pin);
        let b = Cli::try_parse_from(["b", "latency", "--pin", "--backend", "both"]).unwrap();
        assert!(matches!(b.command, Some(Cmd::Latency(ref l)) if l.run.pin));
        assert!(Cli::try_parse_from(["b", "--baseline-only", "--baseline"]).is_err());
        let c = Cli::try_parse_from(["b", "alltoall", "--np", "8", "--sizes", "8,1M"]).unwrap();
        assert!(matches!(c.command, Some(Cmd::Alltoall(ref a))
            if a.np == 8 && a.sizes() == [8, 1 << 20] && a.rounds == 1));
        let d = Cli::try_parse_from(["b", "alltoall"]).unwrap();
        assert!(
            matches!(d.command, Some(Cmd::Alltoall(ref a)) if a.sizes() == [8, 65536, 1 << 20])
        );
        assert!(Cli::try_parse_from(["b", "alltoall", "--np", "1"]).is_err());
        assert!(Cli::try_parse_from(["b", "--mode", "sometimes"]).is_err());
        assert!(Cli::try_parse_from(["b", "--mode", "spin:x"]).is_err());
        let s = Cli::try_parse_from(["b", "--mode", "spin:20"]).unwrap();
        assert_eq!(
            s.latency.run.mode,
            Some(ProgressMode::SpinThenBlock(
                std::time::Duration::from_micros(20)
            ))
        );
    }
}
