//! The streaming benchmarks `bw` (osu_bw) and `rate` (osu_mbw_mr): each rank pair runs
//! `warm-up + loops` windows; a window is `--window` (64) non-blocking sends from the
//! sender, and one 4-byte acknowledgement from the receiver once it has the whole window.
//! The sender's clock runs from the first measured window to the last acknowledgement.
//!
//! - MB/s = size x window x loops / 10^6 / seconds (OSU's MB, 10^6 bytes);
//! - messages/s = window x loops / seconds;
//! - with several pairs (`rate`), both are sums over the pairs of each pair's own figure,
//!   as osu_mbw_mr adds the per-sender bandwidths.
//!
//! Run alone, the benchmark is one pair (rank 0 sends, rank 1 receives), over the same
//! control channel as `latency`: `RUN ring <i> <size> <window> <loops>` or
//! `RUN socket <size> <window> <loops>`, answered by `OK` when rank 1 is ready and `DONE`
//! when it has received every window and every acknowledgement has left.
//!
//! With 2N ranks from a launcher, osu_mbw_mr's pairing applies: rank `r < N` sends to
//! rank `r + N`. Each pair is a [`Streamer`] made with its own and its partner's id;
//! every sender runs [`Streamer::send_windows`] after a common barrier and the
//! [`PairTiming`]s, gathered on rank 0, give the row through [`Throughput::from_pairs`].

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use ringbtl::{BackendKind, PeerId, ProgressMode, Tag, Transport};

use crate::cli::{describe_counts, parse_size, RunArgs, SizeArgs};
use crate::control::{self, BenchTransport, PeerProc, Rank1};
use crate::flow::{self, Deferred};
use crate::report::{json_lines, json_num, ratio, Field, JsonRun, JsonSeries, Row};
use crate::{bw, rate, Series, SETUP_TIMEOUT, SHUTDOWN_TIMEOUT};

/// Data messages, sender to receiver.
pub(crate) const DATA: Tag = Tag(43);
/// The acknowledgement of a window, receiver to sender.
pub(crate) const ACK: Tag = Tag(44);
/// Bytes of an acknowledgement (osu_bw's).
pub(crate) const ACK_BYTES: usize = 4;
/// osu_bw's and osu_mbw_mr's window.
pub(crate) const DEFAULT_WINDOW: u64 = 64;
/// At most this many pre-warm windows per series (small largest sizes).
const PREWARM_MAX_WINDOWS: u64 = 200;

/// Which streaming benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bench {
    Bw,
    Rate,
}

impl Bench {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Bench::Bw => "bw",
            Bench::Rate => "rate",
        }
    }
}

/// Options of `ringbtl-bench bw` and `ringbtl-bench rate`.
#[derive(Args, Debug, Clone)]
#[command(
    mut_arg("iters", |a| a.help("Measured windows per size [default: 100 up to 8 KiB, 20 above (OSU)]")),
    mut_arg("warmup", |a| a.help("Warm-up windows per size, not measured [default: 10 up to 8 KiB, 2 above]")),
    mut_arg("quick", |a| a.help("Divide the default loop and warm-up counts by 10 (at least one measured window)")),
)]
pub(crate) struct StreamArgs {
    #[command(flatten)]
    pub(crate) counts: SizeArgs,

    /// Messages per window (each window is acknowledged once).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WINDOW,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) window: u64,

    /// Before the first size, stream about this many bytes of the largest size on each
    /// series (ringbtl backends, baseline), unmeasured; 0 = off. A fresh process and
    /// connection stream large messages markedly slower for their first gigabytes on
    /// these machines, which would otherwise fall on whichever series runs first.
    /// [default: 2G, 200M with --quick]
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub(crate) prewarm: Option<usize>,

    #[command(flatten)]
    pub(crate) run: RunArgs,

    /// Also stream with plain sockets between the same processes and cores, and print
    /// the ratio ringbtl / baseline. bw: blocking socket, one writev per window; rate:
    /// non-blocking socket spun, one send per message.
    #[arg(long)]
    pub(crate) baseline: bool,
}

impl StreamArgs {
    /// Sizes to run, in order (1 B .. 4 MiB by default; OSU's bandwidth tests start at 1).
    pub(crate) fn sizes(&self) -> Vec<usize> {
        self.counts.sizes()
    }

    /// (warm-up, measured) windows for `size`: osu_bw's 10/100 up to 8 KiB, 2/20 above.
    pub(crate) fn counts(&self, size: usize) -> (u64, u64) {
        self.counts.counts(size, [(10, 100), (2, 20)])
    }

    /// Untimed windows of `size` bytes per series before the first size (`--prewarm`).
    fn prewarm_windows(&self, size: usize) -> u64 {
        let bytes = self.prewarm.unwrap_or(if self.counts.quick {
            200 << 20
        } else {
            2 << 30
        });
        if bytes == 0 {
            return 0;
        }
        let per_window = (size.max(1) as u64).saturating_mul(self.window);
        (bytes as u64)
            .div_ceil(per_window)
            .clamp(1, PREWARM_MAX_WINDOWS)
    }
}

/// The entry point of both subcommands, rank 0 or (hidden argument) rank 1.
pub(crate) fn main(bench: Bench, args: &StreamArgs) -> ExitCode {
    let res = match args.run.internal_peer {
        Some(ppid) => match control::Child::open(ppid) {
            Ok(mut ctl) => {
                let r = run_receiver(bench, args, &mut ctl);
                if let Err(e) = &r {
                    if ctl.send(&format!("ERR {}", e.replace('\n', " "))).is_err() {
                        eprintln!("ringbtl-bench (rank 1): error: {e}");
                    }
                }
                return if r.is_ok() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                };
            }
            Err(e) => Err(e),
        },
        None => match crate::ranks::launched() {
            Ok(Some(_)) if args.run.peer_cmd.is_some() => {
                Err(crate::OWN_PEER_ONLY.replace("{}", "--peer-cmd"))
            }
            // Under a launcher (or RINGBTL_RANK / RINGBTL_SIZE / RINGBTL_ROOT): pairs of ranks.
            Ok(Some(w)) => crate::ranks::run_stream(w, bench, args),
            Ok(None) => run_sender(bench, args),
            Err(e) => Err(e),
        },
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("ringbtl-bench {}: error: {e}", bench.name());
            ExitCode::FAILURE
        }
    }
}

// ----- measurements ----------------------------------------------------------------------

/// What one sender measured in one phase.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PairTiming {
    /// Messages timed (window x loops).
    pub(crate) msgs: u64,
    /// Payload bytes timed.
    pub(crate) bytes: u64,
    /// From the first measured window to the last acknowledgement.
    pub(crate) secs: f64,
}

impl PairTiming {
    /// Runs `warmup + loops` windows of `window` messages of `size` bytes, window `i`
    /// by `one(i)`, and times the last `loops` of them.
    pub(crate) fn run_windows(
        window: u64,
        size: usize,
        warmup: u64,
        loops: u64,
        mut one: impl FnMut(u64) -> Result<(), String>,
    ) -> Result<Self, String> {
        let mut t0 = Instant::now();
        for i in 0..warmup + loops {
            if i == warmup {
                t0 = Instant::now();
            }
            one(i)?;
        }
        Ok(Self::windows(window, loops, size, t0))
    }

    /// `loops` windows of `window` messages of `size` bytes, timed from `t0` to now.
    pub(crate) fn windows(window: u64, loops: u64, size: usize, t0: Instant) -> Self {
        let msgs = window * loops;
        Self {
            msgs,
            bytes: msgs * size as u64,
            secs: t0.elapsed().as_secs_f64(),
        }
    }
}

/// One series at one size, summed over the pairs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Throughput {
    pub(crate) pairs: usize,
    pub(crate) loops: u64,
    pub(crate) warmup: u64,
    /// Megabytes (10^6 bytes) per second.
    pub(crate) mb_s: f64,
    /// Messages per second.
    pub(crate) msg_s: f64,
}

impl Throughput {
    /// osu_mbw_mr's aggregate: the sum of each pair's own bandwidth and rate.
    pub(crate) fn from_pairs(loops: u64, warmup: u64, pairs: &[PairTiming]) -> Self {
        let per = |f: fn(&PairTiming) -> f64| -> f64 {
            pairs
                .iter()
                .filter(|p| p.secs > 0.0)
                .map(|p| f(p) / p.secs)
                .sum()
        };
        Self {
            pairs: pairs.len(),
            loops,
            warmup,
            mb_s: per(|p| p.bytes as f64) / 1e6,
            msg_s: per(|p| p.msgs as f64),
        }
    }
}

/// One size's results: one entry per ringbtl series, then the baseline if any.
pub(crate) type StreamRow = Row<Throughput>;

/// What the header says.
pub(crate) struct StreamInfo {
    pub(crate) bench: Bench,
    pub(crate) mode: String,
    pub(crate) kernel: String,
    pub(crate) pinned: bool,
    pub(crate) window: u64,
    pub(crate) pairs: usize,
    pub(crate) rings: Vec<String>,
    pub(crate) baseline: bool,
}

/// A column of a throughput table: its heading with one series (OSU's) and its value.
pub(crate) struct Metric {
    pub(crate) osu: &'static str,
    pub(crate) short: &'static str,
    pub(crate) get: fn(&Throughput) -> f64,
}

/// Width of a value column (OSU's `FIELD_WIDTH`).
const W: usize = 20;
/// Width of a ratio column.
const RW: usize = 12;

/// The column header line: OSU's exact one for a single series, else one column per
/// series and metric, then the ratios (first metric): each backend / the baseline, and
/// each later backend / the first.
pub(crate) fn columns(info: &StreamInfo, metrics: &[Metric]) -> String {
    let mut s = format!("{:<10}", "# Size");
    if info.rings.len() == 1 && !info.baseline {
        for m in metrics {
            s.push_str(&format!("{:>W$}", m.osu));
        }
        return s;
    }
    let mut names: Vec<&str> = info.rings.iter().map(String::as_str).collect();
    if info.baseline {
        names.push("baseline");
    }
    for n in &names {
        for m in metrics {
            s.push_str(&format!("{:>W$}", format!("{n} {}", m.short)));
        }
    }
    if info.baseline {
        for r in &info.rings {
            s.push_str(&format!("{:>RW$}", format!("{r}/base")));
        }
    }
    if let [a, rest @ ..] = info.rings.as_slice() {
        for b in rest {
            s.push_str(&format!("{:>RW$}", format!("{b}/{a}")));
        }
    }
    s
}

/// One table row, aligned under [`columns`].
pub(crate) fn cells(info: &StreamInfo, row: &StreamRow, metrics: &[Metric]) -> String {
    let mut s = format!("{:<10}", row.size);
    let mut all: Vec<&Throughput> = row.rings.iter().collect();
    all.extend(row.base.iter());
    for t in &all {
        for m in metrics {
            s.push_str(&format!("{:>W$.2}", (m.get)(t)));
        }
    }
    let first = metrics[0].get;
    if let (Some(b), true) = (row.base.as_ref(), info.baseline) {
        for t in &row.rings {
            s.push_str(&format!("{:>RW$.2}", ratio(first(t), first(b))));
        }
    }
    if let [a, rest @ ..] = row.rings.as_slice() {
        for t in rest {
            s.push_str(&format!("{:>RW$.2}", ratio(first(t), first(a))));
        }
    }
    s
}

/// The header lines common to both benchmarks.
pub(crate) fn common_header(info: &StreamInfo, title: &str, counts: &str) -> String {
    let pinned = if info.pinned { "cpu0/cpu1" } else { "no" };
    format!(
        "# {title}\n\
         # backend: {}  mode: {}  kernel: {}  pinned: {pinned}\n\
         # [ pairs: {} ] [ window size: {} ]; each window acknowledged by a {ACK_BYTES}-byte \
         message; loops: {counts}; MB = 10^6 bytes",
        info.rings.join(", "),
        info.mode,
        info.kernel,
        info.pairs,
        info.window,
    )
}

impl JsonSeries for Throughput {
    fn fields(&self) -> Vec<Field> {
        vec![
            ("pairs".into(), self.pairs.to_string()),
            ("iters".into(), self.loops.to_string()),
            ("warmup".into(), self.warmup.to_string()),
            ("mb_s".into(), json_num(self.mb_s)),
            ("msg_s".into(), json_num(self.msg_s)),
        ]
    }

    fn vs_baseline(&self, b: &Self) -> Vec<Field> {
        vec![
            ("baseline_mb_s".into(), json_num(b.mb_s)),
            ("baseline_msg_s".into(), json_num(b.msg_s)),
            ("ratio".into(), json_num(ratio(self.mb_s, b.mb_s))),
        ]
    }

    fn vs_first(&self, f: &Self, first: &str) -> Vec<Field> {
        vec![
            (format!("{first}_mb_s"), json_num(f.mb_s)),
            (
                format!("ratio_vs_{first}"),
                json_num(ratio(self.mb_s, f.mb_s)),
            ),
        ]
    }
}

impl StreamInfo {
    /// The run as its JSON lines describe it.
    pub(crate) fn json(&self) -> JsonRun<'_> {
        JsonRun {
            bench: self.bench.name(),
            mode: &self.mode,
            pinned: self.pinned,
            kernel: &self.kernel,
            rings: &self.rings,
            run_fields: vec![("window".into(), self.window.to_string())],
        }
    }
}

// ----- the ringbtl side ------------------------------------------------------------------

/// State shared between a [`Streamer`]'s callbacks and its loops.
#[derive(Default)]
struct Shared {
    /// DATA messages received (cumulative).
    received: Cell<u64>,
    /// DATA messages received in the current window (receiver).
    in_window: Cell<u64>,
    /// Acknowledgements received (cumulative, sender).
    acks: Cell<u64>,
    /// Sends completed successfully (cumulative).
    completed: Cell<u64>,
    /// Messages per window in the current phase.
    window: Cell<u64>,
    /// Length every DATA message must have in the current phase.
    expect: Cell<usize>,
    /// First failure a callback saw; ends the run.
    failure: RefCell<Option<String>>,
    /// Acknowledgements that met a full send queue, sent by the waits.
    deferred: RefCell<Deferred>,
}

impl Shared {
    fn fail(&self, why: impl FnOnce() -> String) {
        self.failure.borrow_mut().get_or_insert_with(why);
    }
}

/// One transport of one rank of a pair.
pub(crate) struct Streamer {
    tr: Transport,
    rank: u32,
    peer: PeerId,
    sh: Rc<Shared>,
}

impl Streamer {
    /// Creates the transport of `rank`, paired with `peer` (the sender of a pair runs
    /// [`send_windows`](Self::send_windows), the receiver [`serve`](Self::serve)), and
    /// registers the handlers.
    pub(crate) fn new(
        rank: u32,
        peer: u32,
        backend: BackendKind,
        mode: ProgressMode,
    ) -> Result<Self, String> {
        let mut tr = crate::cli::transport(rank, backend, mode)?;
        let sh: Rc<Shared> = Rc::default();
        let ack = [Bytes::from_static(&[0x41; ACK_BYTES])];
        let s = sh.clone();
        tr.register(DATA, move |t: &mut Transport, am| {
            if am.payload.len() != s.expect.get() {
                s.fail(|| {
                    format!(
                        "received {} bytes from {}, expected {}",
                        am.payload.len(),
                        am.src,
                        s.expect.get()
                    )
                });
                return;
            }
            s.received.set(s.received.get() + 1);
            let n = s.in_window.get() + 1;
            if n < s.window.get() {
                s.in_window.set(n);
                return;
            }
            s.in_window.set(0);
            let sent = s
                .deferred
                .borrow_mut()
                .send(t, am.src, ACK, &ack, s.received.get());
            if let Err(e) = sent {
                s.fail(|| format!("acknowledgement to {}: {e}", am.src));
            }
        })
        .map_err(|e| format!("registering tag {}: {e}", DATA.0))?;
        let s = sh.clone();
        tr.register(ACK, move |_: &mut Transport, am| {
            if am.payload.len() == ACK_BYTES {
                s.acks.set(s.acks.get() + 1);
            } else {
                s.fail(|| format!("a {}-byte acknowledgement", am.payload.len()));
            }
        })
        .map_err(|e| format!("registering tag {}: {e}", ACK.0))?;
        let s = sh.clone();
        tr.on_complete(move |c| match c.result {
            Ok(()) => s.completed.set(s.completed.get() + 1),
            Err(e) => s.fail(|| format!("send to {} failed: {e}", c.peer)),
        });
        let s = sh.clone();
        tr.on_error(move |peer, why| s.fail(|| format!("{peer} failed: {why}")));
        Ok(Self {
            tr,
            rank,
            peer: PeerId(peer),
            sh,
        })
    }

    /// Progress (in the transport's mode) until `acks`, `received` and `completed` reach
    /// the targets; a callback's failure or the deadline ends it with an error.
    fn wait_for(
        &mut self,
        acks: u64,
        received: u64,
        completed: u64,
        deadline: Instant,
    ) -> Result<(), String> {
        let sh = &self.sh;
        let met = flow::wait_until(&mut self.tr, &sh.deferred, deadline, || {
            (sh.acks.get() >= acks
                && sh.received.get() >= received
                && sh.completed.get() >= completed)
                || sh.failure.borrow().is_some()
        })?;
        if let Some(f) = sh.failure.borrow().as_ref() {
            return Err(f.clone());
        }
        if !met {
            return Err(format!(
                "timed out (rank {}: {} messages and {} acknowledgements received, {} sends \
                 completed)",
                self.rank,
                sh.received.get(),
                sh.acks.get(),
                sh.completed.get()
            ));
        }
        Ok(())
    }

    /// Sender: `warmup + loops` windows of `window` messages of `size` bytes.
    pub(crate) fn send_windows(
        &mut self,
        size: usize,
        window: u64,
        warmup: u64,
        loops: u64,
        deadline: Instant,
    ) -> Result<PairTiming, String> {
        let seg = [Bytes::from(vec![0xa5u8; size])];
        let acks0 = self.sh.acks.get();
        let done0 = self.sh.completed.get();
        let mut cookie = 0u64;
        PairTiming::run_windows(window, size, warmup, loops, |i| {
            for _ in 0..window {
                flow::send(&mut self.tr, self.peer, DATA, &seg, cookie, deadline)?;
                cookie += 1;
            }
            // As osu_bw: every send of the window has completed and the ack is in.
            self.wait_for(acks0 + i + 1, 0, done0 + cookie, deadline)
        })
    }

    /// Receiver, first half: expect `size`-byte messages in windows of `window`.
    fn arm(&mut self, size: usize, window: u64) {
        self.sh.expect.set(size);
        self.sh.window.set(window);
        self.sh.in_window.set(0);
    }

    /// Receiver, second half: every message of `loops` windows is in and every
    /// acknowledgement has left.
    fn serve(
        &mut self,
        window: u64,
        loops: u64,
        rx0: u64,
        done0: u64,
        deadline: Instant,
    ) -> Result<(), String> {
        self.wait_for(0, rx0 + window * loops, done0 + loops, deadline)
    }
}

impl BenchTransport for Streamer {
    fn local_addr(&self) -> SocketAddr {
        self.tr.local_addr()
    }

    fn backend_name(&self) -> &'static str {
        self.tr.backend_name()
    }

    fn add_peer(&mut self, addr: SocketAddr) -> Result<(), String> {
        self.tr
            .add_peer(self.peer, vec![addr])
            .map_err(|e| format!("adding {} at {addr}: {e}", self.peer))
    }

    fn shutdown(&mut self) -> Result<(), String> {
        self.tr
            .shutdown(SHUTDOWN_TIMEOUT)
            .map_err(|e| format!("shutdown: {e}"))
    }
}

// ----- the plain-socket side -------------------------------------------------------------

/// The baseline's connected socket and buffers (sized for the current phase).
pub(crate) struct PlainStream {
    pub(crate) sock: TcpStream,
    pub(crate) buf: Vec<u8>,
}

/// SO_RCVTIMEO / SO_SNDTIMEO of the blocking baseline: bounds each call so the loops
/// check their deadline at least once a second.
pub(crate) const SOCKET_SLICE: Duration = Duration::from_secs(1);

impl PlainStream {
    fn setup(sock: TcpStream) -> Result<Self, String> {
        sock.set_nodelay(true)
            .and_then(|()| sock.set_read_timeout(Some(SOCKET_SLICE)))
            .and_then(|()| sock.set_write_timeout(Some(SOCKET_SLICE)))
            .map_err(|e| format!("baseline socket: {e}"))?;
        crate::sys::congestion_like_ringbtl(&sock)?;
        Ok(Self {
            sock,
            buf: Vec::new(),
        })
    }

    fn accept(l: &TcpListener) -> Result<Self, String> {
        Self::setup(control::accept_baseline(l, SETUP_TIMEOUT)?)
    }

    fn connect(addr: SocketAddr) -> Result<Self, String> {
        Self::setup(control::connect_baseline(addr, SETUP_TIMEOUT)?)
    }

    /// The start of either side of a baseline phase: makes the payload buffer `n` bytes
    /// long (at least [`ACK_BYTES`]) and the socket blocking or not, and hands out both.
    pub(crate) fn prepare(
        &mut self,
        n: usize,
        nonblocking: bool,
    ) -> Result<(&mut TcpStream, &mut Vec<u8>), String> {
        self.buf.clear();
        self.buf.resize(n.max(ACK_BYTES), 0x5a);
        self.sock
            .set_nonblocking(nonblocking)
            .map_err(|e| format!("baseline socket: {e}"))?;
        Ok((&mut self.sock, &mut self.buf))
    }
}

/// EAGAIN, a socket time-out or EINTR: retry unless the deadline has passed.
pub(crate) fn retry(e: std::io::Error, op: &str, deadline: Instant) -> Result<(), String> {
    use std::io::ErrorKind::{Interrupted, TimedOut, WouldBlock};
    match e.kind() {
        WouldBlock | TimedOut | Interrupted => {
            if Instant::now() >= deadline {
                Err(format!("baseline {op} timed out"))
            } else {
                Ok(())
            }
        }
        _ => Err(format!("baseline {op}: {e}")),
    }
}

// ----- the two ranks ---------------------------------------------------------------------

fn run_sender(bench: Bench, args: &StreamArgs) -> Result<(), String> {
    let mode = args.run.mode()?;
    let kinds = args.run.backends()?;
    let sizes = args.sizes();
    let phase_timeout = Duration::from_secs(args.run.timeout);
    if args.run.pin {
        crate::pin(0)?;
    }
    let mut rings = Vec::new();
    for &k in &kinds {
        rings.push(Streamer::new(0, 1, k, mode)?);
    }
    let first = rings.first().map(Streamer::local_addr);
    let listener = control::baseline_listener(args.baseline, first)?;
    let mut peer = PeerProc::spawn(args.run.peer_cmd.as_deref())?;
    peer.exchange(&mut rings, listener.as_ref())?;
    let mut plain = match &listener {
        Some(l) => Some(PlainStream::accept(l)?),
        None => None,
    };
    drop(listener);

    let mut series: Vec<Series> = (0..rings.len()).map(Series::Ring).collect();
    if plain.is_some() {
        series.push(Series::Socket);
    }
    // One untimed window per series: connections are up before anything is measured.
    // Then the untimed pre-warm stream (`--prewarm`) at the largest size.
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let prewarm = args.prewarm_windows(largest);
    for &s in &series {
        for (what, size, window, windows) in [
            ("first exchange", 1, 1, 1),
            ("pre-warm", largest, args.window, prewarm),
        ] {
            if windows == 0 {
                continue;
            }
            phase(
                bench,
                &mut peer,
                &mut rings,
                &mut plain,
                s,
                size,
                window,
                windows - 1,
                1,
                phase_timeout,
            )
            .map_err(|e| format!("{what}: {e}"))?;
        }
    }

    let info = StreamInfo {
        bench,
        mode: mode.to_string(),
        kernel: crate::kernel_release(),
        pinned: args.run.pin,
        window: args.window,
        pairs: 1,
        rings: rings.iter().map(|r| r.backend_name().to_string()).collect(),
        baseline: plain.is_some(),
    };
    let out = &mut std::io::stdout();
    if !args.run.json {
        let counts = describe_counts(&sizes, |s| args.counts(s));
        let header = match bench {
            Bench::Bw => bw::header(&info, &counts),
            Bench::Rate => rate::header(&info, &counts),
        };
        let _ = writeln!(out, "{header}");
        let _ = out.flush();
    }
    let mut result = Ok(());
    'sizes: for &size in &sizes {
        let (warmup, loops) = args.counts(size);
        let mut row = StreamRow {
            size,
            rings: Vec::new(),
            base: None,
        };
        for &s in &series {
            match phase(
                bench,
                &mut peer,
                &mut rings,
                &mut plain,
                s,
                size,
                args.window,
                warmup,
                loops,
                phase_timeout,
            ) {
                Ok(t) => {
                    let t = Throughput::from_pairs(loops, warmup, &[t]);
                    match s {
                        Series::Socket => row.base = Some(t),
                        Series::Ring(_) => row.rings.push(t),
                    }
                }
                Err(e) => {
                    result = Err(format!("size {size}: {e}"));
                    break 'sizes;
                }
            }
        }
        if args.run.json {
            for l in json_lines(&info.json(), &row) {
                let _ = writeln!(out, "{l}");
            }
        } else {
            let line = match bench {
                Bench::Bw => bw::row(&info, &row),
                Bench::Rate => rate::row(&info, &row),
            };
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
    }
    result?;

    peer.end_run(&mut rings, |r| r.shutdown())
}

/// One phase on the sender, the receiver in lockstep: announce, wait until it is ready,
/// measure, wait until it has received everything.
#[allow(clippy::too_many_arguments)]
fn phase(
    bench: Bench,
    peer: &mut PeerProc,
    rings: &mut [Streamer],
    plain: &mut Option<PlainStream>,
    s: Series,
    size: usize,
    window: u64,
    warmup: u64,
    loops: u64,
    timeout: Duration,
) -> Result<PairTiming, String> {
    let (which, label) = match s {
        Series::Ring(i) => (format!("ring {i}"), rings[i].backend_name()),
        Series::Socket => ("socket".to_string(), "baseline"),
    };
    peer.send(&format!("RUN {which} {size} {window} {}", warmup + loops))?;
    peer.expect_exact("OK", SETUP_TIMEOUT)?;
    let deadline = Instant::now() + timeout;
    let measured = match (s, plain.as_mut()) {
        (Series::Ring(i), _) => rings[i].send_windows(size, window, warmup, loops, deadline),
        (Series::Socket, Some(p)) => match bench {
            Bench::Bw => bw::plain_send(p, size, window, warmup, loops, deadline),
            Bench::Rate => rate::plain_send(p, size, window, warmup, loops, deadline),
        },
        (Series::Socket, None) => Err("internal: no baseline socket".into()),
    };
    peer.end_phase(label, measured, timeout)
}

fn run_receiver(bench: Bench, args: &StreamArgs, ctl: &mut control::Child) -> Result<(), String> {
    let mode = args.run.mode()?;
    let kinds = args.run.backends()?;
    let phase_timeout = Duration::from_secs(args.run.timeout);
    if args.run.pin {
        crate::pin(1)?;
    }
    let mut r1 = Rank1::start(ctl, &kinds, |k| Streamer::new(1, 0, k, mode))?;
    let mut plain: Option<PlainStream> = None;
    while let Some(line) = r1.next(ctl)? {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["BASE", addr] => plain = Some(PlainStream::connect(crate::parse(addr, &line)?)?),
            ["RUN", kind, rest @ ..] => {
                let (which, nums) = match (*kind, rest) {
                    ("ring", [i, nums @ ..]) => (Some(crate::parse::<usize>(i, &line)?), nums),
                    ("socket", nums) => (None, nums),
                    _ => return Err(format!("bad command {line:?}")),
                };
                let [size, window, loops] = nums else {
                    return Err(format!("bad command {line:?}"));
                };
                let size: usize = crate::parse(size, &line)?;
                let window: u64 = crate::parse(window, &line)?;
                let loops: u64 = crate::parse(loops, &line)?;
                match which {
                    Some(i) => {
                        let r = r1.ring(i)?;
                        r.arm(size, window);
                        let (rx0, done0) = (r.sh.received.get(), r.sh.completed.get());
                        ctl.send("OK")?;
                        let deadline = Instant::now() + phase_timeout;
                        r.serve(window, loops, rx0, done0, deadline)?;
                    }
                    None => {
                        let p = plain.as_mut().ok_or("no baseline socket")?;
                        ctl.send("OK")?;
                        let deadline = Instant::now() + phase_timeout;
                        match bench {
                            Bench::Bw => bw::plain_recv(p, size, window, loops, deadline)?,
                            Bench::Rate => rate::plain_recv(p, size, window, loops, deadline)?,
                        }
                    }
                }
                ctl.send("DONE")?;
            }
            _ => return Err(format!("bad command {line:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Cmd};
    use clap::Parser;
    use ringbtl::ProgressMode;

    fn args(v: &[&str]) -> StreamArgs {
        match Cli::try_parse_from(v).unwrap().command {
            Some(Cmd::Bw(a) | Cmd::Rate(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn osu_bw_counts() {
        let a = args(&["b", "bw"]);
        assert_eq!(a.counts(8192), (10, 100));
        assert_eq!(a.counts(8193), (2, 20));
        assert_eq!(a.window, 64);
        assert_eq!(a.sizes().first(), Some(&1));
        assert_eq!(a.sizes().last(), Some(&(4 << 20)));
        let q = args(&["b", "rate", "--quick", "--window", "8"]);
        assert_eq!(q.counts(8), (1, 10));
        assert_eq!(q.counts(1 << 20), (0, 2));
        assert_eq!(q.window, 8);
        assert!(Cli::try_parse_from(["b", "bw", "--window", "0"]).is_err());
        let m = args(&["b", "rate", "--mode", "spin:20"]);
        assert_eq!(
            m.run.mode,
            Some(ProgressMode::SpinThenBlock(Duration::from_micros(20)))
        );
    }

    #[test]
    fn prewarm_volume() {
        let a = args(&["b", "bw"]);
        // 2 GiB of 64-message windows of 1 MiB; 4 MiB; tiny messages capped.
        assert_eq!(a.prewarm_windows(1 << 20), 32);
        assert_eq!(a.prewarm_windows(4 << 20), 8);
        assert_eq!(a.prewarm_windows(8), PREWARM_MAX_WINDOWS);
        assert_eq!(args(&["b", "bw", "--quick"]).prewarm_windows(1 << 20), 4);
        assert_eq!(args(&["b", "rate", "--prewarm", "0"]).prewarm_windows(8), 0);
        assert_eq!(
            args(&["b", "bw", "--prewarm", "100M"]).prewarm_windows(1 << 20),
            2
        );
    }

    #[test]
    fn pairs_add_up() {
        let p = PairTiming {
            msgs: 6400,
            bytes: 6400 * 8,
            secs: 0.001,
        };
        let one = Throughput::from_pairs(100, 10, &[p]);
        assert!((one.msg_s - 6.4e6).abs() < 1e-3);
        assert!((one.mb_s - 51.2).abs() < 1e-9);
        let two = Throughput::from_pairs(100, 10, &[p, PairTiming { secs: 0.002, ..p }]);
        assert_eq!(two.pairs, 2);
        assert!((two.msg_s - 9.6e6).abs() < 1e-3);
    }

    #[test]
    fn json_keys() {
        let info = StreamInfo {
            bench: Bench::Rate,
            mode: "spin:20".into(),
            kernel: "6.18".into(),
            pinned: true,
            window: 64,
            pairs: 1,
            rings: vec!["uring".into(), "epoll".into()],
            baseline: true,
        };
        let t = Throughput {
            pairs: 1,
            loops: 100,
            warmup: 10,
            mb_s: 40.0,
            msg_s: 5e6,
        };
        let row = StreamRow {
            size: 8,
            rings: vec![t, Throughput { mb_s: 20.0, ..t }],
            base: Some(Throughput { mb_s: 10.0, ..t }),
        };
        let l = json_lines(&info.json(), &row);
        assert_eq!(l.len(), 2);
        assert!(l[0].starts_with("{\"bench\":\"rate\",\"backend\":\"uring\",\"mode\":\"spin:20\""));
        assert!(l[0].contains("\"ratio\":4.000"), "{}", l[0]);
        assert!(l[1].contains("\"ratio_vs_uring\":0.500"), "{}", l[1]);
    }
}
