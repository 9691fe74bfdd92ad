//! Runs across ranks started by a launcher (`mpirun`, `mpiexec.hydra`, `srun`, or the
//! env + root form `RINGBTL_RANK` / `RINGBTL_SIZE` / `RINGBTL_ROOT`), or by the benchmark
//! itself (`alltoall --np N`).
//!
//! Every rank creates its transport (interface selection, unless `RINGBTL_LISTEN` says
//! where to listen), exchanges `tcp://` URI lists through the [`Modex`] the environment
//! provides, adds every peer, and opens every connection with one small message to each
//! peer: the wire-up time runs from start-up to the moment every connection is up. A
//! barrier (gather to rank 0, release from it, over the transport) separates the phases.
//!
//! - `latency`: ranks `i` and `i + N/2` ping-pong (as `osu_multi_lat`); rank 0 prints the
//!   average one-way latency over the pairs, the smallest and largest pair's, and the
//!   pairs' medians (p50) averaged.
//! - `alltoall`: every rank sends one checked message per size (and round) to every other
//!   rank: source, sequence number and a pattern that depends on both; every receiver
//!   checks length, content, order and that nothing is missing or duplicated; every
//!   sender, that each of its sends completed exactly once.
//!
//! A rank whose peers had links beyond their first connection (`RINGBTL_LINKS`, or
//! several interfaces on shared subnets) prints its link counters on stderr when its run
//! ends, also when it fails: `# rank R links: joined J, lost L, failovers F, stalls S`
//! ([`Stats`](ringbtl::Stats)' `links_joined`, `links_lost`, `failovers`, `stalls`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringbtl::wireup::env::{node_cpus, oversubscribed, oversubscription};
use ringbtl::wireup::{parse_uri_list, Modex, Rendezvous, Wireup};
use ringbtl::{BackendKind, Config, PeerId, ProgressMode, Tag, Transport};

use crate::cli::{AlltoallArgs, BackendArg, LatencyArgs, RunArgs};
use crate::flow::{self, Deferred};
use crate::report::Recorder;

/// Connection set-up messages.
const TAG_HELLO: Tag = Tag(60);
/// Barrier arrivals (to rank 0) and releases (from rank 0): payload = epoch.
const TAG_BARRIER: Tag = Tag(61);
/// Checked all-to-all data.
const TAG_DATA: Tag = Tag(62);
/// Latency ping-pong.
const TAG_PING: Tag = Tag(63);
/// Results gathered at rank 0.
const TAG_REPORT: Tag = Tag(64);
/// `bw` / `rate` across ranks: a streamed message (the receiver acknowledges each window).
const TAG_STREAM: Tag = Tag(65);
/// `bw` / `rate` across ranks: the acknowledgement of one window.
const TAG_WINDOW_ACK: Tag = Tag(66);
/// The cookie bit of the all-to-all's data sends (their sequence number below it), so
/// that their completions are told from those of barriers and reports.
const DATA_COOKIE: u64 = 1 << 63;
/// Time given to `Transport::shutdown`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// What the launcher (or the self-launch) provides.
pub(crate) enum Launch {
    /// `Wireup::from_env` found a multi-rank job.
    Launched(Box<Wireup>),
    /// This process starts the other ranks: it is rank 0, serving the rendezvous.
    SelfLaunched {
        modex: Rendezvous,
        children: Vec<Child>,
    },
}

/// When wire-up began: the first call of [`launched`] or [`self_launch`], before the
/// launcher's library is initialized.
static START: OnceLock<Instant> = OnceLock::new();

/// Reads the wire-up environment: `Some` when this process is one rank of several.
pub(crate) fn launched() -> Result<Option<Box<Wireup>>, String> {
    START.get_or_init(Instant::now);
    let w = Wireup::from_env().map_err(|e| e.to_string())?;
    Ok((w.info().size > 1).then(|| Box::new(w)))
}

/// Starts ranks 1..np of a self-launched job on this host: each gets the env + root
/// variables and the same command line. The job runs on the address `RINGBTL_LISTEN`
/// names (`[::1]:0`: the IPv6 loopback), else on 127.0.0.1: rank 0 listens there and
/// serves the rendezvous on it, every other rank listens there on a port of its own.
pub(crate) fn self_launch(np: u32, timeout: Duration) -> Result<Launch, String> {
    START.get_or_init(Instant::now);
    let ip = std::env::var("RINGBTL_LISTEN")
        .ok()
        .and_then(|v| v.trim().parse::<SocketAddr>().ok())
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
    let listener = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| format!("rendezvous root on {ip}: {e}"))?;
    let root = listener
        .local_addr()
        .map_err(|e| format!("rendezvous root: {e}"))?;
    let token = Config::new(PeerId(0)).core.token;
    // The job key: the one configured, or a fresh one handed to the children.
    let key = match ringbtl::wireup::env_job_key(|k| std::env::var(k).ok()) {
        Ok(Some(k)) => k,
        Ok(None) => ringbtl::auth::JobKey::generate().map_err(|e| e.to_string())?,
        Err(e) => return Err(e.to_string()),
    };
    let modex = Rendezvous::root(listener, np, token, timeout).with_key(key.clone());
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let mut children = Vec::new();
    for r in 1..np {
        let child = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env("RINGBTL_RANK", r.to_string())
            .env("RINGBTL_SIZE", np.to_string())
            .env("RINGBTL_LOCAL_RANK", r.to_string())
            .env("RINGBTL_LOCAL_SIZE", np.to_string())
            .env("RINGBTL_ROOT", root.to_string())
            .env("RINGBTL_WIREUP", "env")
            .env("RINGBTL_LISTEN", SocketAddr::new(ip, 0).to_string())
            .env("RINGBTL_JOB_KEY", key.to_hex())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                kill_all(&mut children);
                return Err(format!("starting rank {r}: {e}"));
            }
        }
    }
    Ok(Launch::SelfLaunched { modex, children })
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Waits for the self-launched ranks; any that fails or outlives `timeout` is an error.
fn reap(children: &mut Vec<Child>, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut failed = Vec::new();
    for (i, c) in children.iter_mut().enumerate() {
        let r = i + 1;
        loop {
            match c.try_wait() {
                Ok(Some(st)) if st.success() => break,
                Ok(Some(st)) => {
                    failed.push(format!("rank {r} exited with {st}"));
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) => {
                    let _ = c.kill();
                    let _ = c.wait();
                    failed.push(format!("rank {r} did not exit in time (killed)"));
                    break;
                }
                Err(e) => {
                    failed.push(format!("rank {r}: {e}"));
                    break;
                }
            }
        }
    }
    children.clear();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Options shared by the multi-rank runs.
pub(crate) struct JobOpts {
    pub(crate) backend: Option<BackendKind>,
    pub(crate) mode: Option<ProgressMode>,
    pub(crate) timeout: Duration,
    /// Wire-up with both ranks of each pair dialing (see [`Job::connect_all`]).
    pub(crate) simultaneous: bool,
}

impl JobOpts {
    /// The options of a two-rank benchmark (`latency`, `bw`, `rate`) run across ranks.
    fn of(run: &RunArgs) -> Result<Self, String> {
        Ok(Self {
            backend: backend_of(run.backend)?,
            mode: run.mode,
            timeout: Duration::from_secs(run.timeout),
            simultaneous: false,
        })
    }
}

/// State the handlers share with the loops.
#[derive(Default)]
struct Shared {
    hellos: u32,
    /// Connection hellos seen per source rank.
    hellos_from: Vec<bool>,
    /// Answer the hello of a lower rank from its handler, on the connection it dialed
    /// (set by [`Job::connect_all`]).
    answer_hellos: bool,
    /// Barrier arrivals at rank 0 per epoch, releases seen elsewhere (highest epoch).
    arrivals: BTreeMap<u32, u32>,
    released: Option<u32>,
    completed: u64,
    /// Sends that completed with an error (a failed peer fails each pending send once).
    failed_sends: u64,
    pongs: u64,
    /// The echoing rank's answer in the ping-pong, built once per size.
    pong: [Bytes; 1],
    failure: Option<String>,
    /// Alltoall: next expected sequence number per source, messages and bytes checked.
    next_seq: Vec<u32>,
    checked: u64,
    bytes: u64,
    reports: Vec<(u32, Vec<u8>)>,
    /// Alltoall: the size of each sequence number.
    plan: Vec<usize>,
    /// Alltoall: the ranks this one exchanges with (every other, or its halo
    /// neighbours).
    targets: Vec<u32>,
    /// Alltoall: completions of each data send (index: peer * messages + sequence
    /// number), which must be exactly one, and their sum.
    data_done: Vec<u8>,
    data_completed: u64,
    /// Streams: messages received, the window the receiver acknowledges, acks received.
    streamed: u64,
    stream_window: u64,
    window_acks: u64,
    /// Replies that met a full send queue, sent by `progress_until`.
    deferred: Deferred,
}

impl Shared {
    fn fail(&mut self, why: String) {
        self.failure.get_or_insert(why);
    }
}

/// One rank of a job: its transport, its place, its exchange.
pub(crate) struct Job {
    tr: Transport,
    rank: u32,
    size: u32,
    mode: ProgressMode,
    st: Rc<RefCell<Shared>>,
    modex: Box<dyn Modex>,
    children: Vec<Child>,
    epoch: u32,
    timeout: Duration,
    /// Wire-up with both ranks of each pair dialing (see [`Job::connect_all`]).
    simultaneous: bool,
    /// From the start of wire-up (before the launcher's library is initialized) to every
    /// connection up.
    pub(crate) wireup: Duration,
    /// The part of `wireup` after the address exchange: from the first message to every
    /// peer until every connection is up (what an MPI program's first exchange with every
    /// rank costs with lazy connections).
    pub(crate) connect: Duration,
    /// How the rank found its peers (`PMIx`, `PMI`, `env + root`...).
    pub(crate) how: String,
    /// Why the progress mode is what it is.
    pub(crate) mode_note: String,
    /// The link counters were printed (see [`Job::report_links`]).
    links_reported: bool,
    /// IPv4 and IPv6 addresses in every rank's published list, together.
    published: (usize, usize),
}

impl Job {
    /// Wire-up: transport, address exchange, peers, every connection opened.
    pub(crate) fn start(launch: Launch, opts: &JobOpts) -> Result<Self, String> {
        let t0 = *START.get_or_init(Instant::now);
        let (modex, children, how, local_size, loopback): (Box<dyn Modex>, _, String, _, _) =
            match launch {
                Launch::Launched(w) => {
                    let how = format!("{} ({})", w.kind(), w.info().source);
                    let ls = w.info().local_size;
                    (w, Vec::new(), how, ls, false)
                }
                Launch::SelfLaunched { modex, children } => {
                    let n = modex.size();
                    let how = "env + root (self-launched on loopback)".into();
                    (Box::new(modex), children, how, Some(n), true)
                }
            };
        let mut job = Self::build(modex, children, how, local_size, loopback, opts)
            .map_err(|e| format!("rank {}: {e}", rank_of_env()))?;
        let t1 = Instant::now();
        job.connect_all()?;
        job.connect = t1.elapsed();
        job.wireup = t0.elapsed();
        Ok(job)
    }

    fn build(
        mut modex: Box<dyn Modex>,
        mut children: Vec<Child>,
        how: String,
        local_size: Option<u32>,
        loopback: bool,
        opts: &JobOpts,
    ) -> Result<Self, String> {
        let (rank, size) = (modex.rank(), modex.size());
        let run = || -> Result<(Transport, ProgressMode, String), String> {
            let mut base = Config::new(PeerId(rank));
            // Interface selection unless RINGBTL_LISTEN says where; a self-launched job
            // stays on loopback, as its other ranks do.
            if !loopback {
                base.wireup.listen = None;
            }
            let mut cfg = base.from_env().map_err(|e| e.to_string())?;
            if let Some(b) = opts.backend {
                cfg.socket.backend = b;
            }
            let cpus = node_cpus();
            let over = oversubscription(|k| std::env::var(k).ok())
                .map(|o| o.to_string())
                .or_else(|| {
                    local_size
                        .filter(|&n| oversubscribed(n, cpus))
                        .map(|n| format!("{n} ranks on this node for {cpus} CPU(s)"))
                });
            let mode_explicit =
                opts.mode.is_some() || std::env::var_os("RINGBTL_PROGRESS").is_some();
            let (mode, note) = match (opts.mode, &over) {
                (Some(m), _) => (m, "--mode".to_owned()),
                (None, Some(o)) if !mode_explicit => {
                    (ProgressMode::Block, format!("oversubscribed: {o}"))
                }
                (None, _) => match cfg.progress {
                    p @ ProgressMode::Poll => (p, "default".to_owned()),
                    p => (p, "RINGBTL_PROGRESS".to_owned()),
                },
            };
            cfg.progress = mode;
            let tr = Transport::new(cfg).map_err(|e| format!("creating the transport: {e}"))?;
            Ok((tr, mode, note))
        };
        let (mut tr, mode, mode_note) = match run() {
            Ok(x) => x,
            Err(e) => {
                kill_all(&mut children);
                let _ = modex.finalize();
                return Err(e);
            }
        };
        let table = match modex.exchange(&tr.uris()) {
            Ok(t) => t,
            Err(e) => {
                kill_all(&mut children);
                return Err(format!("address exchange: {e}"));
            }
        };
        let published = table
            .iter()
            .filter_map(|u| parse_uri_list(u).ok())
            .flatten()
            .fold((0, 0), |(v4, v6), a| match a {
                SocketAddr::V4(_) => (v4 + 1, v6),
                SocketAddr::V6(_) => (v4, v6 + 1),
            });
        // The launcher's (or the rendezvous') job key, before any handshake.
        if let Some(k) = modex.job_key() {
            tr.set_job_key(k);
        }
        for (r, uris) in table.iter().enumerate() {
            if r as u32 != rank {
                tr.add_peer_uris(PeerId(r as u32), uris)
                    .map_err(|e| format!("adding rank {r}: {e}"))?;
            }
        }
        let st: Rc<RefCell<Shared>> = Rc::default();
        st.borrow_mut().next_seq = vec![0; size as usize];
        st.borrow_mut().hellos_from = vec![false; size as usize];
        install_handlers(&mut tr, rank, &st)?;
        Ok(Self {
            tr,
            rank,
            size,
            mode,
            st,
            modex,
            children,
            epoch: 0,
            timeout: opts.timeout,
            simultaneous: opts.simultaneous,
            wireup: Duration::ZERO,
            connect: Duration::ZERO,
            how,
            mode_note,
            links_reported: false,
            published,
        })
    }

    pub(crate) fn rank(&self) -> u32 {
        self.rank
    }

    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    pub(crate) fn mode(&self) -> ProgressMode {
        self.mode
    }

    pub(crate) fn backend(&self) -> &'static str {
        self.tr.backend_name()
    }

    pub(crate) fn uris(&self) -> String {
        self.tr.uris()
    }

    /// One small message to every peer, and one from each: every connection is up (in
    /// both directions) when it returns.
    ///
    /// Each pair connects once: a rank sends first to the ranks above it (it dials them),
    /// and answers each rank below it once that rank's message has come (from the
    /// message's handler), on the connection that rank dialed. Were both to send at once, both would dial, and one
    /// dial of every pair would be refused as a simultaneous connect: the transport
    /// settles that too, at twice the connections and handshakes (`--simultaneous` asks
    /// for it).
    fn connect_all(&mut self) -> Result<(), String> {
        let (me, others) = (self.rank, self.size - 1);
        let hello = [Bytes::from(self.rank.to_be_bytes().to_vec())];
        let deadline = Instant::now() + self.timeout;
        let all_at_once = self.simultaneous;
        self.st.borrow_mut().answer_hellos = !all_at_once;
        for p in self.peers().filter(|&p| all_at_once || p > me) {
            self.tr
                .send(PeerId(p), TAG_HELLO, &hello, 0)
                .map_err(|e| format!("hello to rank {p}: {e}"))?;
        }
        let r = self.progress_until(deadline, "connecting to every rank", |s| {
            s.hellos >= others && s.completed >= u64::from(others) && s.deferred.is_empty()
        });
        self.st.borrow_mut().answer_hellos = false;
        r
    }

    fn peers(&self) -> impl Iterator<Item = u32> {
        let (me, n) = (self.rank, self.size);
        // Start after our own rank so that not every rank dials rank 0 first.
        (1..n).map(move |i| (me + i) % n)
    }

    /// Progresses until `done` holds; fails on a handler's failure or past `deadline`.
    fn progress_until(
        &mut self,
        deadline: Instant,
        what: &str,
        mut done: impl FnMut(&Shared) -> bool,
    ) -> Result<(), String> {
        let mut spins = 0u32;
        loop {
            if !self.st.borrow().deferred.is_empty() {
                let sent = self.st.borrow_mut().deferred.flush(&mut self.tr);
                sent.map_err(|e| format!("rank {}: deferred reply: {e}", self.rank))?;
            }
            {
                if let Some(f) = self.failure() {
                    return Err(f);
                }
                let s = self.st.borrow();
                if done(&s) {
                    return Ok(());
                }
            }
            match self.mode {
                ProgressMode::Poll => {
                    self.tr.progress().map_err(|e| format!("progress: {e}"))?;
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(1024) && Instant::now() >= deadline {
                        return Err(self.late(what));
                    }
                }
                ProgressMode::Block | ProgressMode::SpinThenBlock(_) => {
                    // The configured policy (spin, then wait in the kernel) until the
                    // condition or a failure, then the checks above again.
                    let st = &self.st;
                    // While replies wait for room, wake up every tick to send them.
                    let waiting = !st.borrow().deferred.is_empty();
                    let until = match waiting {
                        true => deadline.min(Instant::now() + Duration::from_millis(1)),
                        false => deadline,
                    };
                    let reached = self
                        .tr
                        .wait_until(until, |_| {
                            let s = st.borrow();
                            s.failure.is_some() || (!waiting && done(&s))
                        })
                        .map_err(|e| format!("wait: {e}"))?;
                    if !reached && Instant::now() >= deadline {
                        return Err(self.late(what));
                    }
                }
            }
        }
    }

    /// The first failure a handler or callback recorded, with the number of sends that
    /// completed with an error.
    fn failure(&self) -> Option<String> {
        let s = self.st.borrow();
        let f = s.failure.as_ref()?;
        Some(match s.failed_sends {
            0 => format!("rank {}: {f}", self.rank),
            n => format!("rank {}: {f} ({n} pending send(s) failed)", self.rank),
        })
    }

    fn late(&self, what: &str) -> String {
        let s = self.st.borrow();
        format!(
            "rank {}: timed out {what} after {:?} ({} hellos, {} sends completed, {} messages \
             checked)",
            self.rank, self.timeout, s.hellos, s.completed, s.checked
        )
    }

    /// All ranks arrive at rank 0, which releases them.
    pub(crate) fn barrier(&mut self) -> Result<(), String> {
        self.epoch += 1;
        let e = self.epoch;
        let msg = [Bytes::from(e.to_be_bytes().to_vec())];
        let deadline = Instant::now() + self.timeout;
        if self.rank == 0 {
            let n = self.size - 1;
            self.progress_until(deadline, "in a barrier", |s| {
                s.arrivals.get(&e).copied().unwrap_or(0) >= n
            })?;
            self.st.borrow_mut().arrivals.remove(&e);
            for p in 1..self.size {
                self.tr
                    .send(PeerId(p), TAG_BARRIER, &msg, 0)
                    .map_err(|err| format!("barrier release to rank {p}: {err}"))?;
            }
        } else {
            self.tr
                .send(PeerId(0), TAG_BARRIER, &msg, 0)
                .map_err(|err| format!("barrier arrival: {err}"))?;
            self.progress_until(deadline, "in a barrier", |s| {
                s.released.is_some_and(|r| r >= e)
            })?;
        }
        Ok(())
    }

    /// Sends `data` to rank 0 (rank 0 keeps its own); rank 0 returns every rank's.
    pub(crate) fn gather(&mut self, data: Vec<u8>) -> Result<Vec<Vec<u8>>, String> {
        if self.rank != 0 {
            self.tr
                .send(PeerId(0), TAG_REPORT, &[Bytes::from(data)], 0)
                .map_err(|e| format!("report to rank 0: {e}"))?;
            return Ok(Vec::new());
        }
        let n = self.size as usize - 1;
        let deadline = Instant::now() + self.timeout;
        self.progress_until(deadline, "gathering results", |s| s.reports.len() >= n)?;
        let mut got = std::mem::take(&mut self.st.borrow_mut().reports);
        got.push((0, data));
        got.sort_by_key(|(r, _)| *r);
        Ok(got.into_iter().map(|(_, d)| d).collect())
    }

    /// All-to-all: one checked message of each size (per round) to every other rank, or
    /// with `neighbours` (a halo exchange) to the ranks `rank +- 1 ..= neighbours / 2`
    /// around the ring, after a barrier. Returns the messages and bytes this rank
    /// received and checked.
    pub(crate) fn alltoall(
        &mut self,
        sizes: &[usize],
        rounds: u32,
        neighbours: Option<u32>,
    ) -> Result<(u64, u64), String> {
        let targets = match neighbours {
            None => self.peers().collect(),
            Some(k) => halo(self.rank, self.size, k),
        };
        {
            let mut s = self.st.borrow_mut();
            s.plan = sizes
                .iter()
                .flat_map(|&s| std::iter::repeat_n(s, rounds as usize))
                .collect();
            s.data_done = vec![0; self.size as usize * s.plan.len()];
            s.data_completed = 0;
            s.targets = targets;
        }
        // Every rank knows the plan before anyone sends.
        self.barrier()?;
        let peers = self.st.borrow().targets.clone();
        let deadline = Instant::now() + self.timeout;
        // Data sends accepted, per peer (sequence numbers 0..accepted).
        let mut accepted = vec![0u32; self.size as usize];
        let sent = self.alltoall_sends(sizes, rounds, &peers, deadline, &mut accepted);
        let seq_end = match sent {
            Ok(seq_end) => seq_end,
            Err(why) => return Err(self.settle_sends(why, &accepted)),
        };
        self.check_sends_once()?;
        let s = self.st.borrow();
        // Every rank exchanged with delivered every sequence number exactly once, in
        // order, and no other rank sent anything.
        for (r, &n) in s.next_seq.iter().enumerate() {
            let want = if s.targets.contains(&(r as u32)) {
                seq_end
            } else {
                0
            };
            if r as u32 != self.rank && n != want {
                return Err(format!(
                    "rank {}: received {n} of {want} messages from rank {r}",
                    self.rank
                ));
            }
        }
        Ok((s.checked, s.bytes))
    }

    /// The all-to-all's sends, then the wait for their completions and for every
    /// message to arrive. Returns the number of messages sent to each peer.
    fn alltoall_sends(
        &mut self,
        sizes: &[usize],
        rounds: u32,
        peers: &[u32],
        deadline: Instant,
        accepted: &mut [u32],
    ) -> Result<u32, String> {
        let mut seq = 0u32;
        for &size in sizes {
            for _ in 0..rounds {
                for &p in peers {
                    let msg = Bytes::from(pattern(self.rank, p, seq, size));
                    // A refused send follows a failure: report its cause.
                    flow::send(
                        &mut self.tr,
                        PeerId(p),
                        TAG_DATA,
                        &[msg],
                        DATA_COOKIE | u64::from(seq),
                        deadline,
                    )
                    .map_err(|e| self.failure().unwrap_or(e))?;
                    accepted[p as usize] += 1;
                }
                seq += 1;
                // Let the transport drain between messages so large ones do not pile up.
                self.tr.progress().map_err(|e| format!("progress: {e}"))?;
            }
        }
        let total = u64::from(seq) * peers.len() as u64;
        self.progress_until(deadline, "in the all-to-all", |s| {
            s.data_completed >= total && s.checked >= total
        })?;
        Ok(seq)
    }

    /// After a failed all-to-all: waits (at most 5 s) until every accepted data
    /// send has completed, and adds to `why` whether each did so exactly once (a failed
    /// peer must fail each pending send once).
    fn settle_sends(&mut self, why: String, accepted: &[u32]) -> String {
        const SETTLE: Duration = Duration::from_secs(5);
        let want: u64 = accepted.iter().map(|&a| u64::from(a)).sum();
        let st = self.st.clone();
        let settled = self
            .tr
            .wait_until(Instant::now() + SETTLE, |_| {
                st.borrow().data_completed >= want
            })
            .unwrap_or(false);
        let s = self.st.borrow();
        let n = s.plan.len();
        let wrong = s.targets.iter().find_map(|&p| {
            let done = &s.data_done[p as usize * n..(p as usize + 1) * n];
            let a = accepted[p as usize] as usize;
            done.iter()
                .enumerate()
                .find(|&(q, &d)| d != u8::from(q < a))
                .map(|(q, &d)| (p, q, d))
        });
        match (settled, wrong) {
            (true, None) => {
                format!("{why}; each of the {want} accepted sends completed exactly once")
            }
            (_, Some((p, q, d))) => {
                format!("{why}; the send of message {q} to rank {p} completed {d} times")
            }
            (false, None) => format!(
                "{why}; {} of the {want} accepted sends completed within {SETTLE:?}",
                s.data_completed
            ),
        }
    }

    /// Every data send of the all-to-all completed exactly once (so far).
    pub(crate) fn check_sends_once(&self) -> Result<(), String> {
        let s = self.st.borrow();
        let n = s.plan.len();
        for &p in &s.targets {
            let done = &s.data_done[p as usize * n..(p as usize + 1) * n];
            if let Some(seq) = done.iter().position(|&d| d != 1) {
                return Err(format!(
                    "rank {}: the send of message {seq} to rank {p} completed {} times",
                    self.rank, done[seq]
                ));
            }
        }
        Ok(())
    }

    /// Latency between ranks `i` and `i + N/2`, after a barrier: `warmup + iters` round
    /// trips of `size` bytes; returns this rank's recorder when it is a sender (`i < N/2`).
    pub(crate) fn pingpong(
        &mut self,
        size: usize,
        warmup: u64,
        iters: u64,
    ) -> Result<Option<Recorder>, String> {
        let half = self.size / 2;
        let seg = [Bytes::from(vec![0xa5u8; size])];
        // Counted before the barrier: the first ping may arrive while it completes.
        let (p0, c0) = {
            let mut s = self.st.borrow_mut();
            s.pong = [Bytes::from(vec![0x5au8; size])];
            (s.pongs, s.completed)
        };
        self.barrier()?;
        let deadline = Instant::now() + self.timeout;
        if self.rank < half {
            let peer = PeerId(self.rank + half);
            let mut rec = Recorder::new();
            for i in 0..warmup + iters {
                let t0 = Instant::now();
                flow::send(&mut self.tr, peer, TAG_PING, &seg, i, deadline)?;
                self.progress_until(deadline, "in the ping-pong", |s| s.pongs > p0 + i)?;
                if i >= warmup {
                    rec.record(t0.elapsed());
                }
            }
            Ok(Some(rec))
        } else if self.rank < 2 * half {
            let n = warmup + iters;
            // The handler echoes each ping.
            self.progress_until(deadline, "in the ping-pong", |s| {
                s.pongs >= p0 + n && s.completed >= c0 + n
            })?;
            Ok(None)
        } else {
            Ok(None)
        }
    }

    /// Streaming across pairs `i <-> i + N/2` (osu_bw / osu_mbw_mr): after a barrier,
    /// every rank `i < N/2` sends `warmup + loops` windows of `window` messages of `size`
    /// bytes to `i + N/2`, which acknowledges each window. Returns a sender's timing of the
    /// `loops` measured windows, `None` elsewhere.
    pub(crate) fn stream(
        &mut self,
        size: usize,
        window: u64,
        warmup: u64,
        loops: u64,
    ) -> Result<Option<crate::stream::PairTiming>, String> {
        let half = self.size / 2;
        let seg = [Bytes::from(vec![0x5au8; size])];
        let (r0, a0) = {
            let mut s = self.st.borrow_mut();
            s.stream_window = window;
            (s.streamed, s.window_acks)
        };
        self.barrier()?;
        // Each window has the whole timeout: a stream over a slow link may take longer
        // than the timeout in all (22 windows of 64 x 4 MiB at 100 MB/s take 59 s), and
        // only a window that does not end is a stall.
        if self.rank < half {
            let peer = PeerId(self.rank + half);
            let mut t0 = Instant::now();
            for w in 0..warmup + loops {
                if w == warmup {
                    t0 = Instant::now();
                }
                let deadline = Instant::now() + self.timeout;
                for _ in 0..window {
                    flow::send(&mut self.tr, peer, TAG_STREAM, &seg, 0, deadline)?;
                }
                self.progress_until(deadline, "waiting for a window's ack", |s| {
                    s.window_acks > a0 + w
                })?;
            }
            Ok(Some(crate::stream::PairTiming::windows(
                window, loops, size, t0,
            )))
        } else if self.rank < 2 * half {
            // The handler acknowledges every full window.
            for w in 1..=warmup + loops {
                let deadline = Instant::now() + self.timeout;
                self.progress_until(deadline, "receiving the stream", |s| {
                    s.streamed >= r0 + w * window
                })?;
            }
            Ok(None)
        } else {
            Ok(None)
        }
    }

    /// Prints this rank's link counters on stderr, once, when its peers had links:
    /// `# rank R links: joined J, lost L, failovers F, stalls S`. Nothing when no link
    /// beyond a first connection was ever open.
    fn report_links(&mut self) {
        if std::mem::replace(&mut self.links_reported, true) {
            return;
        }
        let s = self.tr.stats();
        if s.links_joined + s.links_lost + s.failovers == 0 {
            return;
        }
        eprintln!(
            "# rank {} links: joined {}, lost {}, failovers {}, stalls {}, frames read on links {}",
            self.rank, s.links_joined, s.links_lost, s.failovers, s.stalls, s.run_frames_in
        );
    }

    /// Final barrier, shutdown, end of the exchange; the self-launcher reaps its ranks.
    pub(crate) fn finish(mut self) -> Result<(), String> {
        let r = self.barrier();
        // Before the shutdown, which closes the links.
        self.report_links();
        let shut = self
            .tr
            .shutdown(SHUTDOWN_TIMEOUT)
            .map_err(|e| format!("shutdown: {e}"));
        let fin = self.modex.finalize().map_err(|e| e.to_string());
        let reaped = if self.children.is_empty() {
            Ok(())
        } else {
            reap(&mut self.children, self.timeout)
        };
        r.and(shut).and(fin).and(reaped)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A run that failed reports its links too.
        self.report_links();
        kill_all(&mut self.children);
    }
}

fn rank_of_env() -> String {
    [
        "RINGBTL_RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok())
    .unwrap_or_else(|| "0".into())
}

/// The payload `src` sends `dst` as message `seq`: `src` and `seq` (big-endian) when
/// there is room, then bytes that depend on all three and on the offset.
pub(crate) fn pattern(src: u32, dst: u32, seq: u32, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let salt = src.wrapping_mul(0x9e37_79b9) ^ dst.wrapping_mul(0x85eb_ca6b) ^ seq;
    for (i, b) in v.iter_mut().enumerate() {
        *b = (salt.wrapping_add(i as u32).wrapping_mul(2_654_435_761) >> 24) as u8;
    }
    if size >= 8 {
        v[..4].copy_from_slice(&src.to_be_bytes());
        v[4..8].copy_from_slice(&seq.to_be_bytes());
    }
    v
}

/// Checks a received message against [`pattern`]; the sequence number is the next one
/// expected from `src`.
fn check(src: u32, dst: u32, seq: u32, payload: &[u8], size: Option<usize>) -> Result<(), String> {
    let Some(size) = size else {
        return Err(format!("message {seq} from rank {src} was never sent"));
    };
    if payload.len() != size {
        return Err(format!(
            "message {seq} from rank {src}: {} bytes, expected {size}",
            payload.len()
        ));
    }
    if payload.len() >= 8 {
        let s = u32::from_be_bytes(payload[..4].try_into().expect("4 bytes"));
        let q = u32::from_be_bytes(payload[4..8].try_into().expect("4 bytes"));
        if s != src || q != seq {
            return Err(format!(
                "message {seq} from rank {src} says it is message {q} from rank {s} \
                 (lost, duplicated or reordered)"
            ));
        }
    }
    let want = pattern(src, dst, seq, size);
    if let Some(i) = payload.iter().zip(&want).position(|(a, b)| a != b) {
        return Err(format!(
            "message {seq} from rank {src}: byte {i} is {:#04x}, expected {:#04x}",
            payload[i], want[i]
        ));
    }
    Ok(())
}

fn install_handlers(tr: &mut Transport, rank: u32, st: &Rc<RefCell<Shared>>) -> Result<(), String> {
    let reg = |e: ringbtl::Error| format!("registering a handler: {e}");
    let s = st.clone();
    tr.register(TAG_HELLO, move |t: &mut Transport, am| {
        let mut s = s.borrow_mut();
        s.hellos += 1;
        let first = match s.hellos_from.get_mut(am.src.0 as usize) {
            Some(h) => !std::mem::replace(h, true),
            None => false,
        };
        // Answered right here, so that the answer leaves with what this pass sends on
        // the connection (the ACCEPT of a connection adopted in this pass).
        if first && s.answer_hellos && am.src.0 < rank {
            let hello = [Bytes::from(rank.to_be_bytes().to_vec())];
            if let Err(e) = s.deferred.send(t, am.src, TAG_HELLO, &hello, 0) {
                s.fail(format!("hello to {}: {e}", am.src));
            }
        }
    })
    .map_err(reg)?;
    let s = st.clone();
    tr.register(TAG_BARRIER, move |_, am| {
        let mut s = s.borrow_mut();
        let Ok(b) = <[u8; 4]>::try_from(am.payload) else {
            s.fail(format!("bad barrier message from {}", am.src));
            return;
        };
        let e = u32::from_be_bytes(b);
        if rank == 0 {
            *s.arrivals.entry(e).or_insert(0) += 1;
        } else {
            s.released = Some(s.released.map_or(e, |r| r.max(e)));
        }
    })
    .map_err(reg)?;
    let s = st.clone();
    tr.register(TAG_DATA, move |_, am| {
        let mut s = s.borrow_mut();
        let src = am.src.0;
        let Some(&seq) = s.next_seq.get(src as usize) else {
            s.fail(format!("data from unknown {}", am.src));
            return;
        };
        let res = check(
            src,
            rank,
            seq,
            am.payload,
            s.plan.get(seq as usize).copied(),
        );
        match res {
            Ok(()) => {
                s.next_seq[src as usize] += 1;
                s.checked += 1;
                s.bytes += am.payload.len() as u64;
            }
            Err(e) => s.fail(e),
        }
    })
    .map_err(reg)?;
    let s = st.clone();
    tr.register(TAG_PING, move |t: &mut Transport, am| {
        s.borrow_mut().pongs += 1;
        // The lower half of the ranks sends pings; the upper half echoes them.
        if am.src.0 < rank {
            let mut s = s.borrow_mut();
            // As osu_multi_lat, the answer leaves from the echoing rank's own buffer of
            // the same size (no copy of the ping).
            if am.payload.len() != s.pong[0].len() {
                let why = format!(
                    "a {}-byte ping from {}, expected {}",
                    am.payload.len(),
                    am.src,
                    s.pong[0].len()
                );
                s.fail(why);
                return;
            }
            let seg = s.pong.clone();
            if let Err(e) = s.deferred.send(t, am.src, TAG_PING, &seg, 0) {
                s.fail(format!("reply to {}: {e}", am.src));
            }
        }
    })
    .map_err(reg)?;
    let s = st.clone();
    tr.register(TAG_STREAM, move |t: &mut Transport, am| {
        let ack = {
            let mut s = s.borrow_mut();
            s.streamed += 1;
            s.stream_window > 0 && s.streamed.is_multiple_of(s.stream_window)
        };
        if ack {
            let ack = [Bytes::from_static(&[0; 4])];
            let mut s = s.borrow_mut();
            if let Err(e) = s.deferred.send(t, am.src, TAG_WINDOW_ACK, &ack, 0) {
                s.fail(format!("window ack to {}: {e}", am.src));
            }
        }
    })
    .map_err(reg)?;
    let s = st.clone();
    tr.register(TAG_WINDOW_ACK, move |_, _| s.borrow_mut().window_acks += 1)
        .map_err(reg)?;
    let s = st.clone();
    tr.register(TAG_REPORT, move |_, am| {
        s.borrow_mut().reports.push((am.src.0, am.payload.to_vec()));
    })
    .map_err(reg)?;
    let s = st.clone();
    tr.on_complete(move |c| {
        let mut s = s.borrow_mut();
        if c.cookie & DATA_COOKIE != 0 {
            let i = c.peer.0 as usize * s.plan.len() + (c.cookie & !DATA_COOKIE) as usize;
            if let Some(d) = s.data_done.get_mut(i) {
                *d = d.saturating_add(1);
            }
            s.data_completed += 1;
        }
        match c.result {
            Ok(()) => s.completed += 1,
            Err(e) => {
                s.failed_sends += 1;
                s.fail(format!("send to {} failed: {e}", c.peer));
            }
        }
    });
    let s = st.clone();
    tr.on_error(move |peer, why| s.borrow_mut().fail(format!("{peer} failed: {why}")));
    Ok(())
}

/// Prints a line on rank 0's stdout.
pub(crate) fn say(job: &Job, line: &str) {
    if job.rank() == 0 {
        let out = &mut std::io::stdout();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

fn backend_of(arg: Option<BackendArg>) -> Result<Option<BackendKind>, String> {
    Ok(match arg {
        None => None,
        Some(BackendArg::Auto) => Some(BackendKind::Auto),
        Some(BackendArg::Uring) => Some(BackendKind::Uring),
        Some(BackendArg::Epoll) => Some(BackendKind::Epoll),
        Some(BackendArg::Both) => {
            return Err("--backend both is for the self-launched latency run only".into())
        }
    })
}

fn header(job: &Job, what: &str) {
    say(
        job,
        &format!(
            "# ringbtl-bench {what}: {} ranks, wire-up {}, backend {}, progress {} ({})",
            job.size(),
            job.how,
            job.backend(),
            job.mode(),
            job.mode_note
        ),
    );
    say(job, &format!("# rank 0 listens at {}", job.uris()));
    let (v4, v6) = job.published;
    say(
        job,
        &format!("# addresses published by all ranks: {v4} IPv4, {v6} IPv6"),
    );
}

/// `ringbtl-bench latency` under a launcher: pairs (i, i + N/2), rank 0 prints the
/// average one-way latency over the pairs, and the fastest and slowest pair.
pub(crate) fn run_latency(w: Box<Wireup>, args: &LatencyArgs) -> Result<(), String> {
    let opts = JobOpts::of(&args.run)?;
    let mut job = Job::start(Launch::Launched(w), &opts)?;
    header(
        &job,
        "latency across ranks (pairs i <-> i + N/2, as osu_multi_lat)",
    );
    say(
        &job,
        &format!(
            "# wire-up time (start to all connected): {:.3} ms on rank 0",
            ms(job.wireup)
        ),
    );
    if job.size() < 2 {
        return Err("latency across ranks needs at least 2 ranks".into());
    }
    say(
        &job,
        &format!(
            "{:<12}{:>18}{:>18}{:>18}{:>18}",
            "# Size", "Avg Latency(us)", "Min pair(us)", "Max pair(us)", "P50 Latency(us)"
        ),
    );
    for size in args.sizes() {
        let (warmup, iters) = args.counts(size);
        let rec = job.pingpong(size, warmup, iters)?;
        // Each measuring rank contributes its pair's average and median one-way latency.
        let mine = rec.map_or(Vec::new(), |r| {
            let st = r.finish(warmup);
            [st.avg, st.p50]
                .iter()
                .flat_map(|x| x.to_be_bytes())
                .collect()
        });
        let all = job.gather(mine)?;
        if job.rank() == 0 {
            let pairs: Vec<(f64, f64)> = all.iter().filter_map(|d| pair_stats(d)).collect();
            let n = pairs.len().max(1) as f64;
            let mean = pairs.iter().map(|p| p.0).sum::<f64>() / n;
            let lo = pairs.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
            let hi = pairs.iter().map(|p| p.0).fold(0.0, f64::max);
            let p50 = pairs.iter().map(|p| p.1).sum::<f64>() / n;
            say(
                &job,
                &format!("{size:<12}{mean:>18.2}{lo:>18.2}{hi:>18.2}{p50:>18.2}"),
            );
        }
    }
    job.finish()
}

/// A measuring rank's gathered `(average, p50)` in microseconds; `None` for the empty
/// contribution of a rank that only answers.
fn pair_stats(d: &[u8]) -> Option<(f64, f64)> {
    let (a, p) = d.split_first_chunk::<8>()?;
    Some((
        f64::from_be_bytes(*a),
        f64::from_be_bytes(p.try_into().ok()?),
    ))
}

/// `ringbtl-bench alltoall`: under a launcher, or self-launched with `--np`.
pub(crate) fn run_alltoall(args: &AlltoallArgs) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout);
    let launch = match launched()? {
        Some(w) => Launch::Launched(w),
        None if args.np < 2 => {
            return Err("alltoall needs at least 2 ranks (--np, or a launcher)".into())
        }
        None => self_launch(args.np, timeout)?,
    };
    let opts = JobOpts {
        backend: backend_of(args.backend)?,
        mode: args.mode,
        timeout,
        simultaneous: args.simultaneous,
    };
    let mut job = Job::start(launch, &opts)?;
    let sizes = args.sizes();
    header(&job, "alltoall");
    say(
        &job,
        &format!(
            "# every rank sends {} checked message(s) of each size ({}) to {}",
            args.rounds,
            sizes
                .iter()
                .map(|s| format!("{s} B"))
                .collect::<Vec<_>>()
                .join(", "),
            match args.neighbours {
                None => "every other rank".to_string(),
                Some(k) => format!("its halo: the ranks within {} on each side", k / 2),
            }
        ),
    );
    let t0 = Instant::now();
    let (checked, bytes) = job.alltoall(&sizes, args.rounds, args.neighbours)?;
    job.barrier()?;
    // No send completed a second time since.
    job.check_sends_once()?;
    let exchange = t0.elapsed();
    let mut rep = Vec::with_capacity(40);
    for v in [
        job.wireup.as_nanos() as u64,
        exchange.as_nanos() as u64,
        checked,
        bytes,
        job.connect.as_nanos() as u64,
    ] {
        rep.extend_from_slice(&v.to_be_bytes());
    }
    let all = job.gather(rep)?;
    if job.rank() == 0 {
        let cols: Vec<[u64; 5]> = all
            .iter()
            .filter(|d| d.len() == 40)
            .map(|d| {
                let f = |i: usize| u64::from_be_bytes(d[i * 8..i * 8 + 8].try_into().expect("8"));
                [f(0), f(1), f(2), f(3), f(4)]
            })
            .collect();
        let max = |i: usize| cols.iter().map(|c| c[i]).max().unwrap_or(0);
        let sum = |i: usize| cols.iter().map(|c| c[i]).sum::<u64>();
        let n = u64::from(job.size());
        let partners: u64 = (0..job.size())
            .map(|r| match args.neighbours {
                None => n - 1,
                Some(k) => halo(r, job.size(), k).len() as u64,
            })
            .sum();
        let expect = partners * sizes.len() as u64 * u64::from(args.rounds);
        say(
            &job,
            &format!(
                "wire-up time (start to all connected): {:.3} ms (slowest rank), {:.3} ms (rank 0)",
                max(0) as f64 / 1e6,
                ms(job.wireup)
            ),
        );
        say(
            &job,
            &format!(
                "connect time (addresses known to all connected): {:.3} ms (slowest rank)",
                max(4) as f64 / 1e6
            ),
        );
        say(
            &job,
            &format!(
                "exchange time: {:.3} ms (slowest rank); {} of {expect} messages, {} bytes checked; \
                 {:.1} MB/s received per rank over the slowest rank's time",
                max(1) as f64 / 1e6,
                sum(2),
                sum(3),
                sum(3) as f64 / n as f64 / (max(1).max(1) as f64 / 1e9) / 1e6
            ),
        );
        if sum(2) != expect || cols.len() as u64 != n {
            return Err(format!(
                "{} of {expect} messages checked ({} of {n} ranks reported)",
                sum(2),
                cols.len()
            ));
        }
        say(&job, "all messages received and checked: OK");
    }
    job.finish()
}

/// The halo of `rank` among `size` ranks in a ring: the ranks `rank +- d` for `d` in
/// `1..=neighbours / 2`, each once, without `rank` itself (fewer when the ring is small).
fn halo(rank: u32, size: u32, neighbours: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for d in 1..=neighbours / 2 {
        for r in [(rank + d) % size, (rank + size - d % size) % size] {
            if r != rank && !v.contains(&r) {
                v.push(r);
            }
        }
    }
    v
}

/// `ringbtl-bench bw` / `rate` under a launcher: pairs `i <-> i + N/2`, summed over the
/// pairs as osu_mbw_mr does; rank 0 prints the table.
pub(crate) fn run_stream(
    w: Box<Wireup>,
    bench: crate::stream::Bench,
    args: &crate::stream::StreamArgs,
) -> Result<(), String> {
    use crate::report::json_lines;
    use crate::stream::{PairTiming, StreamInfo, StreamRow, Throughput};
    if args.baseline {
        return Err("--baseline is for the self-launched run (one process pair)".into());
    }
    let opts = JobOpts::of(&args.run)?;
    let mut job = Job::start(Launch::Launched(w), &opts)?;
    if job.size() < 2 {
        return Err(format!(
            "{} across ranks needs at least 2 ranks",
            bench.name()
        ));
    }
    let info = StreamInfo {
        bench,
        mode: job.mode().to_string(),
        kernel: crate::kernel_release(),
        pinned: false,
        window: args.window,
        pairs: (job.size() / 2) as usize,
        rings: vec![job.backend().to_string()],
        baseline: false,
    };
    if !args.run.json {
        header(
            &job,
            &format!("{} across ranks (pairs i <-> i + N/2)", bench.name()),
        );
        let counts = format!("OSU loop counts, window {}", args.window);
        let h = match bench {
            crate::stream::Bench::Bw => crate::bw::header(&info, &counts),
            crate::stream::Bench::Rate => crate::rate::header(&info, &counts),
        };
        say(&job, &h);
    }
    for size in args.sizes() {
        let (warmup, loops) = args.counts(size);
        let mine = job.stream(size, args.window, warmup, loops)?;
        let data = mine.map_or(Vec::new(), |t| {
            let mut v = t.msgs.to_be_bytes().to_vec();
            v.extend_from_slice(&t.bytes.to_be_bytes());
            v.extend_from_slice(&t.secs.to_be_bytes());
            v
        });
        let all = job.gather(data)?;
        if job.rank() == 0 {
            let pairs: Vec<PairTiming> = all
                .iter()
                .filter(|d| d.len() == 24)
                .map(|d| PairTiming {
                    msgs: u64::from_be_bytes(d[0..8].try_into().expect("8 bytes")),
                    bytes: u64::from_be_bytes(d[8..16].try_into().expect("8 bytes")),
                    secs: f64::from_be_bytes(d[16..24].try_into().expect("8 bytes")),
                })
                .collect();
            let row = StreamRow {
                size,
                rings: vec![Throughput::from_pairs(loops, warmup, &pairs)],
                base: None,
            };
            if args.run.json {
                for l in json_lines(&info.json(), &row) {
                    say(&job, &l);
                }
            } else {
                let line = match bench {
                    crate::stream::Bench::Bw => crate::bw::row(&info, &row),
                    crate::stream::Bench::Rate => crate::rate::row(&info, &row),
                };
                say(&job, &line);
            }
        }
    }
    job.finish()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
