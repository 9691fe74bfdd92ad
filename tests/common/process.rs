//! Running a program to completion under a time limit, its output captured.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How a bounded run ended.
pub struct Ran {
    /// Exit status 0.
    pub ok: bool,
    /// The exit status, as the OS describes it.
    pub status: String,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` (stdin closed, stdout and stderr captured by threads of their own, so that
/// a chatty child never blocks on a full pipe) until it exits; a run still going after
/// `limit` is killed and panics with what it printed.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Ran {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {limit:?}; stdout: {}; stderr: {}",
                out.join().unwrap(),
                err.join().unwrap()
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    Ran {
        ok: status.success(),
        status: status.to_string(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}
