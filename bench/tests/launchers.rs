//! `ringbtl-bench alltoall` (and `latency`) under the launchers HPC sites use, all with
//! the default build (no cargo feature): Open MPI's `mpirun` (PMIx, the system's libpmix
//! opened at run time; also the env + root rendezvous, and a missing libpmix), Slurm's
//! `srun --mpi=pmix` and `srun --mpi=pmi2`, MPICH's `mpiexec.hydra` (PMI-1 over
//! `PMI_FD`), the env + root form started by hand, and the benchmark's own `--np` (over
//! IPv4, and over IPv6 with `RINGBTL_LISTEN=[::1]:0`). Every job stays on loopback
//! (`RINGBTL_IF_INCLUDE=lo`, and the launchers' own traffic restricted to `lo`).
//!
//! A launcher that is not installed, or a Slurm that is not running, skips its tests with
//! the reason (and fails them under `RINGBTL_REQUIRE_ALL=1`). Debian: openmpi-bin, mpich,
//! slurm-wlm, munge, libpmix-dev; `tools/slurm-up.sh` (as root) starts a single-node
//! Slurm whose configuration these tests find in `$SLURM_CONF` or
//! `${RINGBTL_SLURM_DIR:-/tmp/ringbtl-slurm}/slurm.conf`.

// The library's test helpers (one copy, shared with its own tests).
#[path = "../../tests/common/mod.rs"]
mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use common::process::{run_bounded, Ran as Run};

const BIN: &str = env!("CARGO_BIN_EXE_ringbtl-bench");
/// A job that has not finished by then is killed and fails the test.
const LIMIT: Duration = Duration::from_secs(120);

/// Runs `cmd` to completion or kills it after [`LIMIT`].
fn run(mut cmd: Command) -> Run {
    run_bounded(&mut cmd, LIMIT)
}

/// Whether `prog --version` runs and mentions `needle`; otherwise the test is skipped
/// with the reason.
fn launcher(prog: &str, needle: &str) -> bool {
    let found = Command::new(prog)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).contains(needle)
                || String::from_utf8_lossy(&o.stderr).contains(needle)
        })
        .unwrap_or(false);
    if !found {
        common::skip(format_args!("{prog} ({needle}) is not installed"));
    }
    found
}

/// A port for a rendezvous root that binds now, taken below the kernel's ephemeral range
/// (`ip_local_port_range`, 32768 and up by default): a port the kernel hands out (to a
/// `bind(0)` or to any outgoing connection on this machine) could be taken again between
/// this check and rank 0's bind; one below that range is taken only by an explicit bind.
fn free_port() -> u16 {
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919);
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + start.wrapping_add(n.wrapping_mul(97)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {LOW} and {}", LOW + SPAN);
}

/// The job succeeded, every message was checked, and every published address is a
/// loopback one.
fn check_alltoall(r: &Run, ranks: u32, wireup: &str) {
    assert!(
        r.ok,
        "job failed ({}): stdout: {}\nstderr: {}",
        r.status, r.stdout, r.stderr
    );
    let n = u64::from(ranks);
    let expect = n * (n - 1) * 3;
    for needle in [
        format!("{ranks} ranks, wire-up {wireup}"),
        format!("{expect} of {expect} messages"),
        "all messages received and checked: OK".to_owned(),
        "wire-up time (start to all connected)".to_owned(),
    ] {
        assert!(r.stdout.contains(&needle), "no {needle:?} in: {}", r.stdout);
    }
    check_loopback(r);
}

fn check_loopback(r: &Run) {
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("# rank 0 listens at "))
        .unwrap_or_else(|| panic!("no address line in {}", r.stdout));
    for uri in line["# rank 0 listens at ".len()..].split(';') {
        let ok = uri.starts_with("tcp://127.") || uri.starts_with("tcp://[::1]:");
        assert!(ok, "{uri} is not a loopback address: {line}");
    }
}

/// One Open MPI job at a time: concurrent `mpirun`s race creating their session
/// directory.
static MPIRUN: Mutex<()> = Mutex::new(());

/// A session directory of our own for `mpirun` (removed on drop), so that jobs of other
/// users of this machine cannot collide with ours.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "ringbtl-launchers-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `mpirun` arguments that keep Open MPI's own traffic on loopback and allow 4 ranks
/// on a 2-CPU machine (also as root, as in CI containers). The ranks exchange addresses
/// through Open MPI's PMIx server.
fn mpirun(np: u32, tmp: &TmpDir) -> Command {
    let mut c = Command::new("mpirun");
    c.env("TMPDIR", &tmp.0);
    c.args(["--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "oob_tcp_if_include", "lo"])
        .args(["--mca", "btl_tcp_if_include", "lo"])
        .args(["-np", &np.to_string()])
        .args(["-x", "RINGBTL_IF_INCLUDE=lo"]);
    c
}

fn hydra(np: u32) -> Command {
    let mut c = Command::new("mpiexec.hydra");
    c.args(["-iface", "lo", "-n", &np.to_string()])
        .args(["-genv", "RINGBTL_IF_INCLUDE", "lo"]);
    c
}

#[test]
fn mpirun_alltoall() {
    if !launcher("mpirun", "Open MPI") {
        return;
    }
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TmpDir::new();
    let mut c = mpirun(4, &tmp);
    c.args([BIN, "alltoall", "--timeout", "60"]);
    let r = run(c);
    check_alltoall(&r, 4, "pmix (PMIx)");
    // The job key came from PMIx, with no configuration.
    assert!(!r.stderr.contains("UNAUTHENTICATED"), "{}", r.stderr);
}

/// Under `mpirun`, `RINGBTL_WIREUP=env` with a root chooses the rendezvous hosted by
/// rank 0 over PMIx.
#[test]
fn mpirun_env_and_root_alltoall() {
    if !launcher("mpirun", "Open MPI") {
        return;
    }
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TmpDir::new();
    let mut c = mpirun(4, &tmp);
    c.args(["-x", "RINGBTL_WIREUP=env"])
        .args(["-x", &format!("RINGBTL_ROOT=127.0.0.1:{}", free_port())]);
    c.args([BIN, "alltoall", "--timeout", "60"]);
    let r = run(c);
    check_alltoall(&r, 4, "env (Open MPI)");
    // No key configured in the env + root form: said once per process, loudly.
    assert!(r.stderr.contains("UNAUTHENTICATED"), "{}", r.stderr);
}

/// A launcher that offers PMIx where the client library cannot be opened (pointed at a
/// file that does not exist): every rank stops at once with an error that says so and
/// how to get around it, no hang.
#[test]
fn mpirun_without_libpmix_says_so() {
    if !launcher("mpirun", "Open MPI") {
        return;
    }
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TmpDir::new();
    let mut c = mpirun(2, &tmp);
    c.args(["-x", "RINGBTL_PMIX_LIB=/nonexistent/libpmix.so.2"]);
    c.args([BIN, "alltoall", "--timeout", "60"]);
    let r = run(c);
    assert!(!r.ok, "the job should fail: {}", r.stdout);
    for needle in [
        "offers PMIx but its client library could not be loaded",
        "/nonexistent/libpmix.so.2",
        "RINGBTL_ROOT",
    ] {
        assert!(r.stderr.contains(needle), "no {needle:?} in: {}", r.stderr);
    }
}

/// The configuration of the Slurm started by `tools/slurm-up.sh`, if one answers;
/// otherwise the test is skipped with the reason.
fn slurm() -> Option<PathBuf> {
    let conf = match std::env::var_os("SLURM_CONF") {
        Some(c) => PathBuf::from(c),
        None => Path::new(
            &std::env::var_os("RINGBTL_SLURM_DIR").unwrap_or_else(|| "/tmp/ringbtl-slurm".into()),
        )
        .join("slurm.conf"),
    };
    if Command::new("srun").arg("--help").output().is_err() {
        common::skip("srun (Slurm) is not installed");
        return None;
    }
    if !conf.exists() {
        common::skip(format_args!(
            "no Slurm configuration at {} (start a single-node Slurm with tools/slurm-up.sh, \
             as root)",
            conf.display()
        ));
        return None;
    }
    let ping = Command::new("scontrol")
        .arg("ping")
        .env("SLURM_CONF", &conf)
        .output();
    match ping {
        Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("UP") => {
            Some(conf)
        }
        other => {
            common::skip(format_args!(
                "slurmctld of {} does not answer (tools/slurm-up.sh starts it): {other:?}",
                conf.display()
            ));
            None
        }
    }
}

/// One Slurm job at a time: the node has few CPUs, and a job waiting for another's
/// would count against its time limit.
static SRUN: Mutex<()> = Mutex::new(());

/// `srun -O -n np --mpi=mpi`: oversubscribed on the single node, every rank on loopback.
fn srun(conf: &Path, np: u32, mpi: &str) -> Command {
    let mut c = Command::new("srun");
    c.env("SLURM_CONF", conf)
        .args(["-O", "-n", &np.to_string(), "-t", "2"])
        .arg(format!("--mpi={mpi}"))
        .arg("--export=ALL,RINGBTL_IF_INCLUDE=lo");
    c
}

#[test]
fn srun_pmix_alltoall() {
    let Some(conf) = slurm() else { return };
    let _one = SRUN.lock().unwrap_or_else(|e| e.into_inner());
    let list = Command::new("srun")
        .env("SLURM_CONF", &conf)
        .arg("--mpi=list")
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout) + String::from_utf8_lossy(&list.stderr);
    if !list.contains("pmix") {
        common::skip(format_args!(
            "Slurm has no PMIx plugin (srun --mpi=list: {list}; Debian: \
             slurm-wlm-basic-plugins and libpmix-dev)"
        ));
        return;
    }
    let mut c = srun(&conf, 4, "pmix");
    c.args([BIN, "alltoall", "--timeout", "60"]);
    check_alltoall(&run(c), 4, "pmix (PMIx)");
}

#[test]
fn srun_pmi2_alltoall() {
    let Some(conf) = slurm() else { return };
    let _one = SRUN.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = srun(&conf, 4, "pmi2");
    c.args([BIN, "alltoall", "--timeout", "60"]);
    check_alltoall(&run(c), 4, "pmi (PMI)");
}

#[test]
fn mpirun_latency_pairs() {
    if !launcher("mpirun", "Open MPI") {
        return;
    }
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TmpDir::new();
    let mut c = mpirun(4, &tmp);
    c.args([
        BIN, "latency", "--sizes", "8,4K", "--iters", "200", "--warmup", "10",
    ]);
    let r = run(c);
    assert!(r.ok, "{}: {}\n{}", r.status, r.stdout, r.stderr);
    assert!(r.stdout.contains("pairs i <-> i + N/2"), "{}", r.stdout);
    let rows: Vec<&str> = r.stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 2, "{}", r.stdout);
    for row in rows {
        let v: Vec<f64> = row.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(v.len(), 5, "{row}");
        assert!(v[1] > 0.0 && v[2] <= v[1] && v[1] <= v[3], "{row}");
        // The pairs' mean median: positive, and a median is not far above the largest mean.
        assert!(v[4] > 0.0 && v[4] <= 2.0 * v[3], "{row}");
    }
    check_loopback(&r);
}

/// `rate` under mpirun with 4 ranks: 2 pairs (i <-> i + 2), summed as osu_mbw_mr.
#[test]
fn mpirun_rate_pairs() {
    if !launcher("mpirun", "Open MPI") {
        return;
    }
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TmpDir::new();
    let mut c = mpirun(4, &tmp);
    c.args([BIN, "rate", "--quick", "--sizes", "8,64K", "--json"]);
    let r = run(c);
    assert!(r.ok, "{}: {}\n{}", r.status, r.stdout, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    for l in lines {
        assert!(l.contains("\"bench\":\"rate\""), "{l}");
        assert!(l.contains("\"pairs\":2"), "{l}");
        let rate: f64 = l
            .split("\"msg_s\":")
            .nth(1)
            .and_then(|x| x.split([',', '}']).next())
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("no msg_s in {l}"));
        assert!(rate > 0.0, "{l}");
    }
}

#[test]
fn hydra_alltoall() {
    if !launcher("mpiexec.hydra", "HYDRA") {
        return;
    }
    let mut c = hydra(4);
    c.args([BIN, "alltoall", "--timeout", "60"]);
    let r = run(c);
    check_alltoall(&r, 4, "pmi (PMI)");
    // The job key came from PMI, with no configuration.
    assert!(!r.stderr.contains("UNAUTHENTICATED"), "{}", r.stderr);
}

#[test]
fn hydra_latency() {
    if !launcher("mpiexec.hydra", "HYDRA") {
        return;
    }
    let mut c = hydra(2);
    c.args([
        BIN, "latency", "--sizes", "8", "--iters", "200", "--warmup", "10",
    ]);
    let r = run(c);
    assert!(r.ok, "{}: {}\n{}", r.status, r.stdout, r.stderr);
    assert!(r.stdout.contains("2 ranks, wire-up pmi"), "{}", r.stdout);
}

#[test]
fn env_and_root_alltoall() {
    let n = 4u32;
    let root = format!("127.0.0.1:{}", free_port());
    let ranks: Vec<_> = (0..n)
        .map(|r| {
            let root = root.clone();
            thread::spawn(move || {
                let mut c = Command::new(BIN);
                c.args(["alltoall", "--timeout", "60"])
                    .env("RINGBTL_RANK", r.to_string())
                    .env("RINGBTL_SIZE", n.to_string())
                    .env("RINGBTL_ROOT", root)
                    .env("RINGBTL_IF_INCLUDE", "lo");
                run(c)
            })
        })
        .collect();
    let runs: Vec<Run> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    for (r, run) in runs.iter().enumerate() {
        assert!(run.ok, "rank {r} failed ({}): {}", run.status, run.stderr);
    }
    check_alltoall(&runs[0], n, "env (ringbtl)");
}

#[test]
fn self_launched_alltoall() {
    let mut c = Command::new(BIN);
    c.args([
        "alltoall",
        "--np",
        "3",
        "--sizes",
        "0,1,8,100K",
        "--rounds",
        "2",
    ]);
    let r = run(c);
    assert!(r.ok, "{}: {}\n{}", r.status, r.stdout, r.stderr);
    assert!(r.stdout.contains("48 of 48 messages"), "{}", r.stdout);
    check_loopback(&r);
}

/// `RINGBTL_LISTEN=[::1]:0` runs a self-launched job on the IPv6 loopback: rank 0
/// publishes `tcp://[::1]:port`, every rank's list holds one IPv6 address and no IPv4 one
/// (the other ranks listen where rank 0 does, the rendezvous too), and every message of
/// sizes that are no powers of two is checked. Skipped where `[::1]` cannot be bound.
#[test]
fn self_launched_alltoall_over_ipv6_loopback() {
    if !common::ipv6::usable() {
        return;
    }
    let mut c = Command::new(BIN);
    c.args(["alltoall", "--np", "3", "--sizes", "7,65000,3000001"])
        .env("RINGBTL_LISTEN", "[::1]:0");
    let r = run(c);
    assert!(r.ok, "{}: {}\n{}", r.status, r.stdout, r.stderr);
    for needle in [
        "# rank 0 listens at tcp://[::1]:",
        "# addresses published by all ranks: 0 IPv4, 3 IPv6",
        "18 of 18 messages",
        "all messages received and checked: OK",
    ] {
        assert!(r.stdout.contains(needle), "no {needle:?} in: {}", r.stdout);
    }
}

#[test]
fn a_missing_rank_fails_with_its_number() {
    // Rank 1 of 2 never starts: rank 0 gives up at the end of the wire-up timeout.
    let mut c = Command::new(BIN);
    c.args(["alltoall", "--timeout", "5"])
        .env("RINGBTL_RANK", "0")
        .env("RINGBTL_SIZE", "2")
        .env("RINGBTL_ROOT", format!("127.0.0.1:{}", free_port()))
        .env("RINGBTL_WIREUP_TIMEOUT_MS", "500")
        .env("RINGBTL_IF_INCLUDE", "lo");
    let r = run(c);
    assert!(!r.ok, "{}", r.stdout);
    assert!(r.stderr.contains("missing ranks 1"), "{}", r.stderr);
}
