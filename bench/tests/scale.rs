//! Wire-up at scale on one node: `ringbtl-bench alltoall` under Open MPI's `mpirun` with
//! 64 and 128 ranks on this (small) machine, the default settings (PMIx found at run
//! time, block progress since the node is oversubscribed), every pair connected and every
//! message checked. On a 2-CPU node, 128 ranks dial 127 peers each at once while most of
//! them wait for a CPU: handshakes outlive their deadlines, simultaneous connects abound.
//! Without `mpirun` the tests say SKIPPED (and fail under `RINGBTL_REQUIRE_ALL=1`).
//! Every job stays on loopback.

// The library's test helpers (one copy, shared with its own tests).
#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::process::run_bounded;

const BIN: &str = env!("CARGO_BIN_EXE_ringbtl-bench");
/// A job that has not finished by then is killed and fails the test.
const LIMIT: Duration = Duration::from_secs(240);
/// The job's own limit for each phase (`--timeout`), below [`LIMIT`].
const JOB_TIMEOUT: &str = "120";

/// One Open MPI job at a time: concurrent `mpirun`s race creating their session
/// directory, and two 128-rank jobs would only slow each other down.
static MPIRUN: Mutex<()> = Mutex::new(());

/// Whether Open MPI's `mpirun` is installed; otherwise the test is skipped.
fn have_mpirun() -> bool {
    let found = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"));
    if !found {
        common::skip("mpirun (Open MPI) is not installed");
    }
    found
}

/// A session directory of our own for `mpirun`, removed on drop.
struct TmpDir(PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `ringbtl-bench alltoall` with `args` under `mpirun -np np`; returns whether it
/// succeeded, its stdout and its stderr.
fn alltoall(np: u32, args: &[&str]) -> (bool, String, String) {
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = format!("ringbtl-scale-{}-{n}", std::process::id());
    let tmp = TmpDir(std::env::temp_dir().join(dir));
    std::fs::create_dir_all(&tmp.0).unwrap();
    let mut c = Command::new("mpirun");
    c.env("TMPDIR", &tmp.0)
        .args(["--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "oob_tcp_if_include", "lo"])
        .args(["--mca", "btl_tcp_if_include", "lo"])
        .args(["-np", &np.to_string()])
        .args(["-x", "RINGBTL_IF_INCLUDE=lo"])
        .args([BIN, "alltoall", "--sizes", "8", "--timeout", JOB_TIMEOUT])
        .args(args);
    let r = run_bounded(&mut c, LIMIT);
    (r.ok, r.stdout, r.stderr)
}

/// The job succeeded with `np` ranks in block mode, every message checked, on loopback
/// (`backend`: the one the header must name, if any).
fn check(np: u32, (ok, out, err): &(bool, String, String), backend: Option<&str>) {
    assert!(ok, "{np}-rank job failed: stdout: {out}\nstderr: {err}");
    let n = u64::from(np);
    let expect = n * (n - 1);
    for needle in [
        format!(
            "{np} ranks, wire-up pmix (PMIx), backend {}",
            backend.unwrap_or("")
        ),
        ", progress block (oversubscribed".to_owned(),
        format!("{expect} of {expect} messages"),
        "all messages received and checked: OK".to_owned(),
        "wire-up time (start to all connected)".to_owned(),
    ] {
        assert!(
            out.contains(&needle),
            "no {needle:?} in: {out}\nstderr: {err}"
        );
    }
    let line = out
        .lines()
        .find(|l| l.starts_with("# rank 0 listens at "))
        .unwrap_or_else(|| panic!("no address line in {out}"));
    for uri in line["# rank 0 listens at ".len()..].split(';') {
        let lo = uri.starts_with("tcp://127.") || uri.starts_with("tcp://[::1]:");
        assert!(lo, "{uri} is not a loopback address: {line}");
    }
}

/// The job of the report: 128 ranks, default settings.
#[test]
fn mpirun_128_ranks_alltoall() {
    if !have_mpirun() {
        return;
    }
    check(128, &alltoall(128, &[]), None);
}

/// 64 ranks whose wire-up has both ranks of every pair dial at once: one dial of each
/// pair is refused as a simultaneous connect, many while their dialer is not scheduled.
#[test]
fn mpirun_64_ranks_simultaneous_connects() {
    if !have_mpirun() {
        return;
    }
    check(64, &alltoall(64, &["--simultaneous"]), None);
}

/// 64 ranks on the epoll backend, simultaneous connects too (in builds that have it).
#[cfg(feature = "epoll")]
#[test]
fn mpirun_64_ranks_alltoall_epoll() {
    if !have_mpirun() {
        return;
    }
    let run = alltoall(64, &["--backend", "epoll", "--simultaneous"]);
    check(64, &run, Some("epoll"));
}
