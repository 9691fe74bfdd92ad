//! `ringbtl-bench`: OSU-style benchmarks for ringbtl.
//!
//! `ringbtl-bench` (or `ringbtl-bench latency`) run alone starts its own peer: rank 0
//! re-executes itself as rank 1 with a hidden `--internal-peer` argument and drives it
//! through the child's stdin / stdout (one line per command, see [`control`]). Both ranks
//! create their transports on loopback, exchange addresses over that channel, then run
//! one phase per (size, series) in lockstep: rank 0 announces the phase, rank 1 confirms it
//! is ready, rank 0 measures, rank 1 reports that it served every message.
//!
//! The child dies with its parent (`PR_SET_PDEATHSIG`, and it exits on stdin EOF); the
//! parent kills the child on every error path and waits for it with a timeout.
//!
//! Under a launcher (`mpirun`, `mpiexec.hydra`, `srun`, or `RINGBTL_RANK` / `RINGBTL_SIZE`
//! / `RINGBTL_ROOT`) nothing is started: every rank runs its part (see [`ranks`]), and
//! `alltoall` runs that way too, or self-launched with `--np N`.
#![deny(unsafe_code)]

mod bw;
mod cli;
mod control;
mod flow;
mod plain;
mod ranks;
mod rate;
mod report;
mod ring;
mod stream;
mod sys;

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use ringbtl::ProgressMode;

use cli::{Cli, Cmd, LatencyArgs};
use control::{BenchTransport, PeerProc, Rank1};
use plain::Plain;
use report::{Recorder, Row, RunInfo, Table};
use ring::Ring;

/// The error of an option for the benchmark's own peer under a launcher (`{}`: the option).
pub(crate) const OWN_PEER_ONLY: &str =
    "{} runs with the benchmark's own peer, not under a launcher";

/// CPUs of rank 0 and rank 1 with `--pin`.
const CPUS: [usize; 2] = [0, 1];
/// Time allowed for start-up steps and for the peer to exit.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Time given to `Transport::shutdown`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_config {
        return finish(cli::print_config(&cli));
    }
    let args = match cli.command {
        Some(Cmd::Latency(a)) => a,
        Some(Cmd::Alltoall(a)) => return finish(ranks::run_alltoall(&a)),
        Some(Cmd::Bw(a)) => return stream::main(stream::Bench::Bw, &a),
        Some(Cmd::Rate(a)) => return stream::main(stream::Bench::Rate, &a),
        None => cli.latency,
    };
    let res = if let Some(ppid) = args.run.internal_peer {
        match control::Child::open(ppid) {
            Ok(mut ctl) => {
                let r = run_rank1(&args, &mut ctl);
                if let Err(e) = &r {
                    // The parent prints it; stderr only if the channel is gone.
                    if ctl.send(&format!("ERR {}", e.replace('\n', " "))).is_err() {
                        eprintln!("ringbtl-bench (rank 1): error: {e}");
                    }
                    return ExitCode::FAILURE;
                }
                return ExitCode::SUCCESS;
            }
            Err(e) => Err(e),
        }
    } else if args.baseline_framed && !(args.baseline || args.baseline_only) {
        Err(
            "--baseline-framed: frames the plain-socket baseline; add --baseline or \
             --baseline-only"
                .to_string(),
        )
    } else {
        match ranks::launched() {
            Ok(Some(_)) if args.exchange => Err(OWN_PEER_ONLY.replace("{}", "--exchange")),
            Ok(Some(_)) if args.fresh => Err(OWN_PEER_ONLY.replace("{}", "--fresh")),
            Ok(Some(_)) if args.rounds > 1 => Err(OWN_PEER_ONLY.replace("{}", "--rounds")),
            Ok(Some(_)) if args.run.peer_cmd.is_some() => {
                Err(OWN_PEER_ONLY.replace("{}", "--peer-cmd"))
            }
            Ok(Some(w)) => ranks::run_latency(w, &args),
            Ok(None) if args.mpi => Err("--mpi: no launcher environment found (mpirun, \
                 mpiexec, srun, or RINGBTL_RANK / RINGBTL_SIZE / RINGBTL_ROOT)"
                .to_string()),
            Ok(None) => run_rank0(&args),
            Err(e) => Err(e),
        }
    };
    finish(res)
}

fn finish(res: Result<(), String>) -> ExitCode {
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("ringbtl-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn pin(rank: usize) -> Result<(), String> {
    let cpu = CPUS[rank];
    sys::pin_to_cpu(cpu).map_err(|e| {
        let n = std::thread::available_parallelism().map_or(0, |n| n.get());
        format!("--pin: cannot run rank {rank} on CPU {cpu} ({e}); this process may use {n} CPU(s), --pin needs CPUs 0 and 1")
    })
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// A phase: one size of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Series {
    /// The ringbtl transport at this index.
    Ring(usize),
    /// The plain-socket baseline.
    Socket,
}

fn run_rank0(args: &LatencyArgs) -> Result<(), String> {
    let mode = args.run.mode()?;
    let kinds = args.backends()?;
    let with_socket = args.baseline || args.baseline_only;
    let sizes = args.sizes();
    let phase_timeout = Duration::from_secs(args.run.timeout);
    if args.run.pin {
        // Before the peer starts: it inherits CPU 0, then moves itself to CPU 1.
        pin(0)?;
    }

    let mut rings = Vec::new();
    for &k in &kinds {
        rings.push(Ring::new(0, k, mode, args.pattern())?);
    }
    // The baseline listens where the first transport does; without one (--baseline-only),
    // at the address RINGBTL_LISTEN names, as parsed for a transport (another host's peer
    // connects there).
    let first = match rings.first() {
        Some(r) => Some(r.local_addr()),
        None => cli::env_config()?.wireup.listen,
    };
    let listener = control::baseline_listener(with_socket, first)?;

    let mut peer = PeerProc::spawn(args.run.peer_cmd.as_deref())?;
    // Rank 1 announces its transports: `ADDR <index> <ip:port> <backend>`, then `READY`.
    peer.exchange(&mut rings, listener.as_ref())?;
    let mut plain = match &listener {
        Some(l) => Some(Plain::accept(
            l,
            SETUP_TIMEOUT,
            phase_timeout,
            args.base_opts(),
            args.pattern(),
        )?),
        None => None,
    };
    drop(listener);

    let mut series: Vec<Series> = (0..rings.len()).map(Series::Ring).collect();
    if with_socket {
        series.push(Series::Socket);
    }
    // One untimed exchange per series: connections are up before anything is measured.
    for &s in &series {
        phase(
            &mut peer,
            &mut rings,
            &mut plain,
            s,
            (0, 0, 1),
            mode,
            phase_timeout,
            &mut Recorder::new(),
        )
        .map_err(|e| format!("first exchange: {e}"))?;
    }
    let rounds = args.rounds;

    let info = RunInfo {
        rounds,
        mode: mode.to_string(),
        kernel: kernel_release(),
        pinned: args.run.pin,
        exchange: args.exchange,
        fresh: args.fresh,
        rings: rings.iter().map(|r| r.backend_name().to_string()).collect(),
        baseline: with_socket,
        framed: args.baseline_framed,
        baseline_how: match (mode, args.baseline_no_lowat) {
            (ProgressMode::Poll, _) if args.exchange => {
                "TCP_NODELAY, send and recv in one loop, spun with MSG_DONTWAIT"
            }
            (_, _) if args.exchange => {
                "TCP_NODELAY, send and recv in one loop, MSG_DONTWAIT, poll(2) when neither moves"
            }
            (ProgressMode::Poll, _) => "TCP_NODELAY, send/recv spun with MSG_DONTWAIT",
            (ProgressMode::Block | ProgressMode::SpinThenBlock(_), false) => {
                "TCP_NODELAY, blocking send, recv MSG_WAITALL + SO_RCVLOWAT"
            }
            (ProgressMode::Block | ProgressMode::SpinThenBlock(_), true) => {
                "TCP_NODELAY, blocking send, recv MSG_WAITALL"
            }
        },
    };
    let table = Table::new(&info);
    let out = &mut std::io::stdout();
    let counts = cli::describe_counts(&sizes, |s| args.counts(s));
    if !args.run.json {
        let _ = writeln!(out, "{}", table.header(&counts));
        let _ = out.flush();
    }
    let mut rows = Vec::new();
    let mut result = Ok(());
    'sizes: for &size in &sizes {
        let (warmup, iters) = args.counts(size);
        // Round r: the whole warm-up first, 1/rounds of it later; 1/rounds of the
        // iterations (the remainder spread over the first rounds).
        let share = |r: u64| {
            let w = if r == 0 { warmup } else { warmup / rounds };
            (w, iters / rounds + u64::from(r < iters % rounds))
        };
        let mut recs: Vec<Recorder> = series.iter().map(|_| Recorder::new()).collect();
        for r in 0..rounds {
            let (w, n) = share(r);
            if n == 0 {
                break;
            }
            for (&s, rec) in series.iter().zip(&mut recs) {
                let counts = (size, w, n);
                if let Err(e) = phase(
                    &mut peer,
                    &mut rings,
                    &mut plain,
                    s,
                    counts,
                    mode,
                    phase_timeout,
                    rec,
                ) {
                    result = Err(format!("size {size}: {e}"));
                    break 'sizes;
                }
            }
        }
        let warmed: u64 = (0..rounds.min(iters)).map(|r| share(r).0).sum();
        let mut row = Row {
            size,
            rings: Vec::new(),
            base: None,
        };
        for (&s, rec) in series.iter().zip(&recs) {
            match s {
                Series::Socket => row.base = Some(rec.finish(warmed)),
                Series::Ring(_) => row.rings.push(rec.finish(warmed)),
            }
        }
        if args.run.json {
            for l in report::json_lines(&info.json(), &row) {
                let _ = writeln!(out, "{l}");
            }
        } else {
            let _ = writeln!(out, "{}", table.row(&row));
        }
        let _ = out.flush();
        rows.push(row);
    }
    if !args.run.json && !rows.is_empty() {
        let _ = write!(out, "{}", table.percentiles(&rows));
        let _ = out.flush();
    }
    result?;

    peer.end_run(&mut rings, |r| r.shutdown())
}

/// Runs one phase (one round of one size of one series; `(size, warmup, iters)`) on rank
/// 0, rank 1 in lockstep: announce it, wait until rank 1 is ready, measure into `rec`,
/// wait until rank 1 has served every message.
#[allow(clippy::too_many_arguments)]
fn phase(
    peer: &mut PeerProc,
    rings: &mut [Ring],
    plain: &mut Option<Plain>,
    s: Series,
    (size, warmup, iters): (usize, u64, u64),
    mode: ProgressMode,
    timeout: Duration,
    rec: &mut Recorder,
) -> Result<(), String> {
    let which = match s {
        Series::Ring(i) => format!("ring {i}"),
        Series::Socket => "socket".into(),
    };
    peer.send(&format!("RUN {which} {size} {}", warmup + iters))?;
    peer.expect_exact("OK", SETUP_TIMEOUT)?;
    let deadline = Instant::now() + timeout;
    let measured = match s {
        Series::Ring(i) => rings[i].ping(size, warmup, iters, deadline, rec),
        Series::Socket => match plain {
            Some(p) => p.ping(size, warmup, iters, mode, deadline, rec),
            None => Err("internal: no baseline socket".into()),
        },
    };
    let label = match s {
        Series::Ring(i) => rings[i].backend_name(),
        Series::Socket => "baseline",
    };
    peer.end_phase(label, measured, timeout)
}

fn run_rank1(args: &LatencyArgs, ctl: &mut control::Child) -> Result<(), String> {
    let mode = args.run.mode()?;
    let kinds = args.backends()?;
    let phase_timeout = Duration::from_secs(args.run.timeout);
    if args.run.pin {
        pin(1)?;
    }
    let mut r1 = Rank1::start(ctl, &kinds, |k| Ring::new(1, k, mode, args.pattern()))?;
    let mut plain: Option<Plain> = None;
    while let Some(line) = r1.next(ctl)? {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["BASE", addr] => {
                plain = Some(Plain::connect(
                    parse(addr, &line)?,
                    phase_timeout,
                    args.base_opts(),
                    args.pattern(),
                )?);
            }
            ["RUN", kind, rest @ ..] => {
                let (which, size, count) = match (*kind, rest) {
                    ("ring", [i, size, count]) => (Some(parse::<usize>(i, &line)?), size, count),
                    ("socket", [size, count]) => (None, size, count),
                    _ => return Err(format!("bad command {line:?}")),
                };
                let size: usize = parse(size, &line)?;
                let count: u64 = parse(count, &line)?;
                ctl.send("OK")?;
                let deadline = Instant::now() + phase_timeout;
                match which {
                    Some(i) => r1.ring(i)?.pong(size, count, deadline)?,
                    None => plain
                        .as_mut()
                        .ok_or("no baseline socket")?
                        .pong(size, count, mode, deadline)?,
                }
                ctl.send("DONE")?;
            }
            _ => return Err(format!("bad command {line:?}")),
        }
    }
    Ok(())
}

fn parse<T: std::str::FromStr>(v: &str, line: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    v.parse()
        .map_err(|e| format!("bad value {v:?} in {line:?}: {e}"))
}
