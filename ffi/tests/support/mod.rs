//! Shared by the C ABI's tests: where the static library and the header are, and which
//! backends can run here.
#![allow(dead_code, unreachable_pub)]

use std::ffi::CString;
use std::path::PathBuf;

use ringbtl_ffi::*;

/// How a test says it cannot run here (the library's one helper).
#[path = "../../../tests/common/skip.rs"]
pub mod skip;

/// `ffi/include/ringbtl.h`.
pub fn header() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include/ringbtl.h")
}

/// The static library cargo built for this test run: beside the test executable (in
/// `target/<profile>/deps/`), where the same rustc invocation that made the test's rlib
/// put it.
pub fn staticlib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let lib = deps.join("libringbtl_ffi.a");
    assert!(
        lib.exists(),
        "{} missing: the crate-type list in ffi/Cargo.toml must keep staticlib",
        lib.display()
    );
    lib
}

/// Libraries the Rust standard library in the static library needs (Linux, glibc).
pub const SYSTEM_LIBS: &[&str] = &[
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

/// The backends compiled in whose transports can be created here, through the C ABI.
/// One that cannot run is reported, and fails the test under `RINGBTL_REQUIRE_ALL=1`.
pub fn backends() -> Vec<&'static str> {
    let mut out = Vec::new();
    let compiled: &[&'static str] = &[
        #[cfg(feature = "uring")]
        "uring",
        #[cfg(feature = "epoll")]
        "epoll",
    ];
    for &b in compiled {
        match create(0, b) {
            Ok(t) => {
                // SAFETY: `t` is a live handle from `ringbtl_create`, destroyed once.
                unsafe { ringbtl_destroy(t, 0) };
                out.push(b);
            }
            Err(e) => skip::skip(format_args!("backend {b} unavailable here: {e}")),
        }
    }
    out
}

/// A transport for process `id` on the given backend, made through the C ABI.
pub fn create(id: u32, backend: &str) -> Result<*mut Ringbtl, String> {
    create_with(id, &[("RINGBTL_BACKEND", backend)])
}

/// A transport for process `id` with the given settings, made through the C ABI.
pub fn create_with(id: u32, settings: &[(&str, &str)]) -> Result<*mut Ringbtl, String> {
    let mut cfg: *mut RingbtlConfig = std::ptr::null_mut();
    // SAFETY: `cfg` is writable; the configuration is consumed by `ringbtl_create` below
    // or freed on the error path.
    unsafe {
        assert_eq!(ringbtl_config_new(id, &mut cfg), RINGBTL_OK);
        for (k, v) in settings {
            let (k, v) = (CString::new(*k).unwrap(), CString::new(*v).unwrap());
            if ringbtl_config_set(cfg, k.as_ptr(), v.as_ptr()) != RINGBTL_OK {
                ringbtl_config_free(cfg);
                return Err(last_error());
            }
        }
        let mut t: *mut Ringbtl = std::ptr::null_mut();
        match ringbtl_create(cfg, &mut t) {
            RINGBTL_OK => Ok(t),
            _ => Err(last_error()),
        }
    }
}

/// This thread's last error message.
pub fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by the library, valid until the next failing
    // call on this thread; copied at once.
    unsafe { std::ffi::CStr::from_ptr(ringbtl_last_error()) }
        .to_string_lossy()
        .into_owned()
}
