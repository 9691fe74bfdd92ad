//! Status codes, their texts, the per-thread last-error message, the mapping of the
//! library's errors onto the codes, and the panic guard every exported function runs in.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ringbtl::{Error, FailReason, SendError};

/// Success.
pub const RINGBTL_OK: c_int = 0;
/// Bad argument (null pointer, ...).
pub const RINGBTL_ERR_INVALID: c_int = -1;
/// Bad setting: the message names it.
pub const RINGBTL_ERR_CONFIG: c_int = -2;
/// A system call failed (errno in the message).
pub const RINGBTL_ERR_IO: c_int = -3;
/// The peer failed earlier, or the connection was lost.
pub const RINGBTL_ERR_UNREACHABLE: c_int = -4;
/// No such peer was added.
pub const RINGBTL_ERR_UNKNOWN_PEER: c_int = -5;
/// Above the maximum frame size.
pub const RINGBTL_ERR_TOO_LARGE: c_int = -6;
/// More segments than `ringbtl_max_segments()`.
pub const RINGBTL_ERR_TOO_MANY_SEGMENTS: c_int = -7;
/// Shutting down or shut down.
pub const RINGBTL_ERR_SHUTDOWN: c_int = -8;
/// The tag has a callback already.
pub const RINGBTL_ERR_TAG_IN_USE: c_int = -9;
/// `ringbtl_send`: more than `RINGBTL_MAX_QUEUED_BYTES` would wait for that peer (it
/// reads slower than we send). The send was not accepted (no completion follows): make
/// progress, then send it again.
pub const RINGBTL_ERR_WOULD_BLOCK: c_int = -10;
/// A wait ran out of time.
pub const RINGBTL_ERR_TIMEOUT: c_int = -11;
/// No compiled-in backend can run here.
pub const RINGBTL_ERR_NO_BACKEND: c_int = -12;
/// Completion status: the peer closed cleanly (FIN) before the send went out.
pub const RINGBTL_ERR_PEER_CLOSED: c_int = -13;
/// Completion status: the peer broke the protocol.
pub const RINGBTL_ERR_PROTOCOL: c_int = -14;
/// `ringbtl_deregister_region`: a put is being received into the region; it stays
/// registered (progress, then try again).
pub const RINGBTL_ERR_BUSY: c_int = -15;
/// A Rust panic was caught at the boundary.
pub const RINGBTL_ERR_INTERNAL: c_int = -99;

/// Longest last-error message kept, in bytes (longer ones are cut at a character).
const LAST_ERROR_MAX: usize = 2047;

thread_local! {
    /// The last error message, NUL-terminated, in one buffer per thread whose address
    /// never changes: a pointer the caller kept too long shows a newer message, never
    /// freed memory.
    static LAST_ERROR: RefCell<[u8; LAST_ERROR_MAX + 1]> =
        const { RefCell::new([0; LAST_ERROR_MAX + 1]) };
}

/// Text of a status code: a static string, never NULL.
#[no_mangle]
pub extern "C" fn ringbtl_strerror(status: c_int) -> *const c_char {
    strerror(status).as_ptr()
}

/// The message of the last failed call on this thread, `""` when none. Valid until the
/// next failing call on this thread replaces it.
#[no_mangle]
pub extern "C" fn ringbtl_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|l| l.as_ptr().cast::<c_char>().cast_const())
        .unwrap_or(c"".as_ptr())
}

/// The static text of `status`.
pub(crate) fn strerror(status: c_int) -> &'static CStr {
    match status {
        RINGBTL_OK => c"success",
        RINGBTL_ERR_INVALID => c"invalid argument",
        RINGBTL_ERR_CONFIG => c"bad configuration setting",
        RINGBTL_ERR_IO => c"system call failed",
        RINGBTL_ERR_UNREACHABLE => c"peer unreachable",
        RINGBTL_ERR_UNKNOWN_PEER => c"unknown peer",
        RINGBTL_ERR_TOO_LARGE => c"message larger than the maximum frame size",
        RINGBTL_ERR_TOO_MANY_SEGMENTS => c"too many segments",
        RINGBTL_ERR_SHUTDOWN => c"transport shut down",
        RINGBTL_ERR_TAG_IN_USE => c"tag already registered",
        RINGBTL_ERR_WOULD_BLOCK => c"send queue full",
        RINGBTL_ERR_TIMEOUT => c"timed out",
        RINGBTL_ERR_NO_BACKEND => c"no usable backend",
        RINGBTL_ERR_PEER_CLOSED => c"peer closed the connection",
        RINGBTL_ERR_PROTOCOL => c"peer broke the protocol",
        RINGBTL_ERR_BUSY => c"region in use",
        RINGBTL_ERR_INTERNAL => c"internal error (panic caught)",
        _ => c"unknown status code",
    }
}

/// Records `msg` as this thread's last error and returns `code`.
pub(crate) fn fail(code: c_int, msg: impl std::fmt::Display) -> c_int {
    let text = msg.to_string();
    let mut n = text.len().min(LAST_ERROR_MAX);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    let _ = LAST_ERROR.try_with(|l| {
        let mut buf = l.borrow_mut();
        for (d, &s) in buf.iter_mut().zip(&text.as_bytes()[..n]) {
            // A NUL inside would end the C string early.
            *d = if s == 0 { b'?' } else { s };
        }
        buf[n] = 0;
    });
    code
}

/// Records the library error `e` and returns its code.
pub(crate) fn fail_with(e: &Error) -> c_int {
    fail(error_code(e), e)
}

/// The code of a library error.
pub(crate) fn error_code(e: &Error) -> c_int {
    match e {
        Error::Io { .. } | Error::Probe(_) => RINGBTL_ERR_IO,
        Error::Send(s) => send_code(s),
        Error::NoBackend(_) => RINGBTL_ERR_NO_BACKEND,
        Error::Config(_) => RINGBTL_ERR_CONFIG,
        Error::TagInUse(_) => RINGBTL_ERR_TAG_IN_USE,
        // Address lists and interface selection: a bad argument or setting.
        Error::Wireup(_) => RINGBTL_ERR_CONFIG,
        Error::Reentrant(_) => RINGBTL_ERR_INVALID,
        Error::Timeout(_) => RINGBTL_ERR_TIMEOUT,
        _ => RINGBTL_ERR_INVALID,
    }
}

/// The code of a refused send.
pub(crate) fn send_code(e: &SendError) -> c_int {
    match e {
        SendError::Unreachable(_) => RINGBTL_ERR_UNREACHABLE,
        SendError::UnknownPeer(_) => RINGBTL_ERR_UNKNOWN_PEER,
        SendError::TooManySegments { .. } => RINGBTL_ERR_TOO_MANY_SEGMENTS,
        SendError::TooLarge { .. } => RINGBTL_ERR_TOO_LARGE,
        SendError::ShuttingDown => RINGBTL_ERR_SHUTDOWN,
        SendError::WouldBlock(_) => RINGBTL_ERR_WOULD_BLOCK,
        _ => RINGBTL_ERR_INVALID,
    }
}

/// The status a failed send completes with, or a failed peer is reported with.
pub(crate) fn fail_code(r: &FailReason) -> c_int {
    match r {
        FailReason::ConnectFailed { .. }
        | FailReason::ConnectionLost { .. }
        | FailReason::Unreachable(_) => RINGBTL_ERR_UNREACHABLE,
        FailReason::Protocol { .. } => RINGBTL_ERR_PROTOCOL,
        FailReason::PeerClosed(_) => RINGBTL_ERR_PEER_CLOSED,
        FailReason::Shutdown => RINGBTL_ERR_SHUTDOWN,
        _ => RINGBTL_ERR_UNREACHABLE,
    }
}

/// Runs `f`, turning a panic into `on_panic` (and RINGBTL_ERR_INTERNAL as the last error),
/// so that no unwinding crosses into C.
#[inline]
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown payload".into());
            fail(RINGBTL_ERR_INTERNAL, format!("panic in ringbtl: {what}"));
            on_panic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_own_text() {
        let codes = [
            RINGBTL_OK,
            RINGBTL_ERR_INVALID,
            RINGBTL_ERR_CONFIG,
            RINGBTL_ERR_IO,
            RINGBTL_ERR_UNREACHABLE,
            RINGBTL_ERR_UNKNOWN_PEER,
            RINGBTL_ERR_TOO_LARGE,
            RINGBTL_ERR_TOO_MANY_SEGMENTS,
            RINGBTL_ERR_SHUTDOWN,
            RINGBTL_ERR_TAG_IN_USE,
            RINGBTL_ERR_WOULD_BLOCK,
            RINGBTL_ERR_TIMEOUT,
            RINGBTL_ERR_NO_BACKEND,
            RINGBTL_ERR_PEER_CLOSED,
            RINGBTL_ERR_PROTOCOL,
            RINGBTL_ERR_BUSY,
            RINGBTL_ERR_INTERNAL,
        ];
        let texts: std::collections::HashSet<_> = codes.iter().map(|&c| strerror(c)).collect();
        assert_eq!(texts.len(), codes.len());
        assert!(!texts.contains(strerror(12345)));
    }

    #[test]
    fn long_messages_are_cut_at_a_character() {
        let long = "é".repeat(LAST_ERROR_MAX);
        assert_eq!(fail(RINGBTL_ERR_CONFIG, &long), RINGBTL_ERR_CONFIG);
        // SAFETY: this thread's last-error buffer, NUL-terminated.
        let msg = unsafe { CStr::from_ptr(ringbtl_last_error()) };
        let msg = msg.to_str().expect("whole characters");
        assert!(msg.len() <= LAST_ERROR_MAX && msg.len() >= LAST_ERROR_MAX - 1);
        fail(RINGBTL_ERR_CONFIG, "a\0b");
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(ringbtl_last_error()) };
        assert_eq!(msg.to_str().unwrap(), "a?b");
    }

    #[test]
    fn a_panic_becomes_internal_with_a_message() {
        let r = guard(RINGBTL_ERR_INTERNAL, || -> c_int { panic!("boom") });
        assert_eq!(r, RINGBTL_ERR_INTERNAL);
        // SAFETY: the pointer is this thread's last-error string, valid until the next
        // failing call on this thread.
        let msg = unsafe { CStr::from_ptr(ringbtl_last_error()) };
        assert!(msg.to_str().unwrap().contains("boom"), "{msg:?}");
    }
}
