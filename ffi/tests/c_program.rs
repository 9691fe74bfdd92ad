//! The C ABI from C: `tests/c/abi_test.c` and `tests/c/threads_test.c` compiled with
//! `-Wall -Wextra -Werror -std=c11` against the header, linked with the static library,
//! and run once per backend (the first once more with io_uring's multishot receive).

mod support;

use std::path::Path;
use std::process::Command;

/// Compiles `src` into `out` against the header and the static library, with `extra`
/// compiler flags; false when the compiler refused (only asked with extra flags).
fn compile(src: &Path, out: &Path, extra: &[&str]) -> bool {
    let include = support::header();
    let include = include.parent().expect("include directory");
    let status = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-std=c11", "-pedantic", "-g"])
        .args(extra)
        .arg("-I")
        .arg(include)
        .arg(src)
        .arg(support::staticlib())
        .args(support::SYSTEM_LIBS)
        .arg("-o")
        .arg(out)
        .status()
        .expect("run cc (a C compiler is needed for the C ABI's tests)");
    assert!(
        status.success() || !extra.is_empty(),
        "cc failed for {}",
        src.display()
    );
    status.success()
}

/// Runs the C test program `exe` on backend `b` (`RINGBTL_RECV_MULTISHOT` set to
/// `multishot`), prints its output and checks that it succeeded; returns its stdout.
fn exec(exe: &Path, b: &str, multishot: &str, what: &str) -> String {
    let out = Command::new(exe)
        .env("RINGBTL_BACKEND", b)
        .env("RINGBTL_RECV_MULTISHOT", multishot)
        // Leaks are not checked: a transport whose drain times out leaks, by design,
        // buffers the kernel may still hold.
        .env("ASAN_OPTIONS", "detect_leaks=0")
        .output()
        .expect("run the C test program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- {what}: backend {b}, multishot receive {multishot}\n{stdout}{stderr}");
    assert!(
        out.status.success(),
        "C test program ({what}) failed on backend {b}: {}\n{stdout}{stderr}",
        out.status
    );
    stdout
}

/// Runs the C test program `exe` on backend `b` and checks its report.
fn run(exe: &Path, b: &str, multishot: &str, what: &str) {
    let stdout = exec(exe, b, multishot, what);
    assert!(stdout.contains(&format!("({b})")), "ran on {b}: {stdout}");
    assert!(
        stdout.contains("ok: puts placed in a registered region"),
        "{stdout}"
    );
    assert!(stdout.contains("ok: destroyed"), "{stdout}");
}

#[test]
fn c_program_passes_on_every_backend() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/abi_test.c");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ringbtl_abi_test");
    compile(&src, &exe, &[]);
    let backends = support::backends();
    assert!(!backends.is_empty(), "no backend can run here");
    for &b in &backends {
        run(&exe, b, "0", "plain");
    }
    if backends.contains(&"uring") {
        // io_uring's multishot receive on provided buffers parses frames in place.
        run(&exe, "uring", "1", "plain");
    }
}

/// Under AddressSanitizer, which checks every read of the program's memory made from
/// user space, the library's included: the copies of small segments, and the buffers the
/// epoll backend's `sendmsg` reads (the interceptor checks each iovec). A read of a buffer
/// the program freed at its completion would fail the run.
#[test]
fn c_program_passes_under_address_sanitizer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/abi_test.c");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ringbtl_abi_test_asan");
    if !compile(
        &src,
        &exe,
        &["-fsanitize=address", "-fno-omit-frame-pointer"],
    ) {
        support::skip::skip("cc cannot build with -fsanitize=address here");
        return;
    }
    for b in support::backends() {
        run(&exe, b, "0", "AddressSanitizer");
    }
}

/// Runs the threaded C test program `exe` on backend `b` and checks its report.
fn run_threads(exe: &Path, b: &str, what: &str) {
    let stdout = exec(exe, b, "0", what);
    assert!(
        stdout.contains(&format!("threads_test: OK ({b})")),
        "ran on {b}: {stdout}"
    );
    for round in 0..2 {
        assert!(
            stdout.contains(&format!("ok: round {round}: 4 threads")),
            "{stdout}"
        );
    }
}

/// `tests/c/threads_test.c`: transports made with `ringbtl_config_threads` and driven by
/// four threads that did not make them, one call at a time, on every backend (on
/// io_uring a ring bound to its creator, `SINGLE_ISSUER`, would refuse their
/// submissions).
#[test]
fn c_threads_program_passes_on_every_backend() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/threads_test.c");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ringbtl_threads_test");
    compile(&src, &exe, &["-pthread"]);
    let backends = support::backends();
    assert!(!backends.is_empty(), "no backend can run here");
    for &b in &backends {
        run_threads(&exe, b, "threads");
    }
}

/// The same under ThreadSanitizer: the program's own memory (its counters, its buffers
/// written before a send and freed in the completion that another thread may run) is
/// checked for unordered accesses between threads. The library is not instrumented: its
/// own accesses are ordered by the locks the program holds around every call.
#[test]
fn c_threads_program_passes_under_thread_sanitizer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/threads_test.c");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ringbtl_threads_test_tsan");
    if !compile(&src, &exe, &["-pthread", "-fsanitize=thread"]) {
        support::skip::skip("cc cannot build with -fsanitize=thread here");
        return;
    }
    for b in support::backends() {
        run_threads(&exe, b, "ThreadSanitizer");
    }
}
