//! The C ABI from C: `tests/c/abi_test.c` compiled with `-Wall -Wextra -Werror -std=c11`
//! against the header, linked with the static library, and run once per backend.

mod support;

use std::path::Path;
use std::process::Command;

/// Compiles `src` into `out` against the header and the static library.
fn compile(src: &Path, out: &Path) {
    let include = support::header();
    let include = include.parent().expect("include directory");
    let status = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-std=c11", "-pedantic", "-g"])
        .arg("-I")
        .arg(include)
        .arg(src)
        .arg(support::staticlib())
        .args(support::SYSTEM_LIBS)
        .arg("-o")
        .arg(out)
        .status()
        .expect("run cc (a C compiler is needed for the C ABI's tests)");
    assert!(status.success(), "cc failed for {}", src.display());
}

#[test]
fn c_program_passes_on_every_backend() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/abi_test.c");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ringbtl_abi_test");
    compile(&src, &exe);
    let backends = support::backends();
    assert!(!backends.is_empty(), "no backend can run here");
    for b in backends {
        let out = Command::new(&exe)
            .env("RINGBTL_BACKEND", b)
            .output()
            .expect("run the C test program");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("--- backend {b}\n{stdout}{stderr}");
        assert!(
            out.status.success(),
            "C test program failed on backend {b}: {}\n{stdout}{stderr}",
            out.status
        );
        assert!(stdout.contains(&format!("({b})")), "ran on {b}: {stdout}");
        assert!(stdout.contains("ok: destroyed"), "{stdout}");
    }
}
